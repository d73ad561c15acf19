"""Experiment helper (GPU box): the Gluon NVFP4 GEMV with its weight blocks staged in shared memory before the PDL
wait (`STAGE` configs, gluon_gemv._staged) beside the config gemm.json shipped for each case, on the tiled BITS
weights engines run, chained with PDL as engines launch them (CUDA-graph replays over rotated weight copies).

    python -m atlas.tools.dev.nvfp4_staged [--quick]   # $OUT/nvfp4_staged.json

Why: the small layers (8B qkv, 14 MB) lose most of their time outside the weight stream (tools/results/gemm.json:
0.38-0.46 of the copy bandwidth where a read-only kernel reaches 0.99), and with the weights held in registers
(PRE) three programs fill an SM's register file, so the next kernel of a chain cannot start its loads until this
one's programs leave. Staged in shared memory, a program needs 66-130 registers and 37 KB, and two kernels'
programs fit on an SM together.
"""
from __future__ import annotations

import sys

# (BLOCK_N, BLOCK_K, SPLIT_K, STAGE[, MAXNREG]) by MP (8: M 1..8, 16: M 9..16); 4 warps
VARIANTS = {8: [(64, 128, 4, 8), (64, 128, 8, 4), (64, 256, 4, 4), (64, 256, 8, 2), (128, 128, 8, 4),
                (128, 128, 4, 8), (64, 128, 16, 2), (128, 128, 8, 4, 80)],
            16: [(128, 128, 8, 4), (128, 128, 16, 2), (64, 128, 8, 4), (128, 128, 4, 8), (64, 128, 4, 8),
                 (64, 128, 16, 2)]}
"""sm_90 (CPU compile, 8B qkv): 63-110 registers at MP 8 (MAXNREG 80 spills 16 bytes at 128 x 128, 152 at 64 x 256),
118-132 at MP 16 (a cap of 96 spills 232 bytes); 9-74 KB of shared memory."""


def configs(m: int, n: int, k: int) -> list[dict]:
    """The STAGE variants that fit the shape (BLOCK_N | N, BLOCK_K | K) at bucket M."""
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    bm = gemv.gemv_bucket(m)
    out = []
    for bn, bk, split, stage, *cap in VARIANTS[8 if bm <= 8 else 16]:
        if n % bn or k % bk:
            continue
        c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4, "num_stages": 1,
             "GLUON": True, "PIPE": 1, "TILED": True, "BITS": True, "STAGE": stage}
        out.append({**c, "MAXNREG": cap[0]} if cap else c)
    return out


def main(quick: bool = False) -> None:
    from atlas.tools.dev.variants import gemv_sweep

    gemv_sweep("nvfp4_staged.json", configs, "staged", quick)


if __name__ == "__main__":
    main("--quick" in sys.argv)
