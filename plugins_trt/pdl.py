"""Programmatic dependent launch (sm_90) for the step's small kernels, as the GEMVs have it (quant_linear/NOTES.md:
median 0.95 us a launch saved in a chain of dependent kernels).

A kernel compiled with PDL = True starts with `pdl_enter`: griddepcontrol.launch_dependents (the next kernel of the
stream, if launched with the programmatic-serialization attribute, may start now), then griddepcontrol.wait (every
earlier kernel of the stream has finished and its writes are visible). Nothing is read or written before the
wait, so a PDL kernel computes what it computes launched plainly; only its launch and ramp-up overlap the kernel
before it. The launch path (atlas.plugins_trt.launch, runtime/kernels.py) launches an instance whose PDL constexpr is
true with the attribute. The interpreter has no grids to overlap and cannot run the instructions: under
TRITON_INTERPRET=1 the launch path compiles PDL off.

PDL = WAIT_FIRST (2), the engines' default since 2026-12-07 (seventh session), takes the two the other way round:
wait, then let the next kernel launch. The first order (LAUNCH_FIRST) lets a chain of small kernels launch each
other before any of them runs, so the grids after a GEMV (the norm, the next GEMV with its prefetched weights, ...)
may take SM slots while it runs: the H100 profile of the 27B nvfp4 engine had its persistent stream-K gate_up GEMV
(264 programs, two an SM, sized to run at once) at 70 us a launch inside the step against 43 us for the best GEMV of
that shape alone (gemm_h100.json). With WAIT_FIRST a small kernel lets the next one launch only once its
predecessor is done. Measured A/B on one H100 (tools/results/decode_h100.json, cases '<case>' against
'<case>+pdl-launch-first'; `bash tools/gpu_check.sh pdlab`): batch 1 / 8 tok/s, 27B nvfp4 95.6 -> 98.8 /
648 -> 661, 8B nvfp4 335.8 -> 336.1 / 1639 -> 1747; the gain is in the mma GEMVs and the norms, the stream-K
gate_up's 70 us did not change (runtime/NOTES.md). The GEMVs themselves always launch first (their prefetch of
weights before the wait is the point of PDL for them). `atlas-build --pdl-launch-first` builds the first order.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from atlas.plugins_trt.pdl_order import LAUNCH_FIRST, WAIT_FIRST  # noqa: F401 (the PDL constexpr's values)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL == 2:  # WAIT_FIRST
        gdc_wait()
        gdc_launch_dependents()
    elif PDL:
        gdc_launch_dependents()
        gdc_wait()
