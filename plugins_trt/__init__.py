"""Ops ("plugins"): one folder each, holding the plain-torch reference (the ground truth for tests and
the CPU runtime) and, as they arrive, the Triton kernel and the ONNX form."""
