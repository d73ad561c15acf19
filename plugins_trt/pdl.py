"""Programmatic dependent launch (sm_90) for the step's small kernels, as the GEMVs have it (quant_linear/NOTES.md:
median 0.95 us a launch saved in a chain of dependent kernels).

A kernel compiled with PDL = True starts with `pdl_enter`: griddepcontrol.launch_dependents (the next kernel of the
stream, if launched with the programmatic-serialization attribute, may start now), then griddepcontrol.wait (every
earlier kernel of the stream has finished and its writes are visible). Nothing is read or written before the
wait, so a PDL kernel computes what it computes launched plainly; only its launch and ramp-up overlap the kernel
before it. The launch path (atlas.plugins_trt.launch, runtime/kernels.py) launches an instance whose PDL constexpr is
true with the attribute. The interpreter has no grids to overlap and cannot run the instructions: under
TRITON_INTERPRET=1 the launch path compiles PDL off.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
