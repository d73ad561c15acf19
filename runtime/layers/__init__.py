"""Canonical layer types of the reference runtime. Layers compose ops from plugins_trt; they own no
state of their own beyond weights (per-sequence state travels in SequenceState)."""
