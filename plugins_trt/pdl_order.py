"""The values of RunnerOptions.pdl and of the PDL constexpr (plugins_trt/pdl.py explains both orders), without
importing triton, so that the CLIs and the options can name them."""

LAUNCH_FIRST = True
"""Let the next kernel launch, then wait for the kernel before (the GEMVs' order; the small kernels' before
2026-12-07)."""
WAIT_FIRST = 2
"""Wait for the kernel before, then let the next one launch: the small kernels' default."""
