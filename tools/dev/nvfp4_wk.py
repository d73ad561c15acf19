"""Experiment helper (GPU box): the Gluon NVFP4 GEMV with a program's K range dealt over groups of its warps (`WK`
configs, gluon_gemv.nvfp4_gemv_wk_kernel: one launch, no split-K reduction) beside the config the benchmark shipped
for each case, on the tiled BITS weights engines run, chained with PDL as engines launch them (CUDA-graph replays
over rotated weight copies).

    python -m atlas.tools.dev.nvfp4_wk [--quick]   # $OUT/nvfp4_wk.json

Why: on the small layers the split GEMV's second launch (the split-K reduction) costs 0.7-1.6 us of 7.5-9.3
(tools/results/nvfp4_fold.json, shipped_noreduce), and folding the reduction in through a counter (FOLD) cost more
than it saved. With the K split inside a program the sum is a shared-memory round trip of 2-4 KB, and 16-row
programs still give the 8B qkv 384 of them.
"""
from __future__ import annotations

import sys

# (BLOCK_N, BLOCK_K, num_warps, WK, SPLIT_K, PRE) by MP (8: M 1..8, 16: M 9..16); BLOCK_N WK == 16 num_warps
VARIANTS = {8: [(16, 256, 4, 4, 1, 4), (16, 256, 4, 4, 1, 2), (16, 128, 4, 4, 1, 4), (32, 256, 4, 2, 1, 4),
                (16, 256, 8, 8, 1, 2), (32, 256, 8, 4, 1, 4), (32, 256, 8, 4, 1, 2), (64, 256, 8, 2, 1, 4),
                (16, 256, 4, 4, 2, 4), (32, 256, 8, 4, 2, 2)],
            16: [(16, 256, 4, 4, 1, 2), (16, 128, 4, 4, 1, 4), (32, 128, 8, 4, 1, 4), (16, 256, 8, 8, 1, 2),
                 (32, 256, 8, 4, 1, 2), (16, 128, 4, 4, 2, 4), (32, 128, 4, 2, 1, 4)]}
"""sm_90 (CPU compile, 8B qkv, tests/tools/test_nvfp4_wk.py): 96-166 registers, no spills, 2-4 KB of shared memory
(the groups' sum)."""


def configs(m: int, n: int, k: int) -> list[dict]:
    """The WK variants that fit the shape (BLOCK_N | N, BLOCK_K | K) at bucket M."""
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    bm = gemv.gemv_bucket(m)
    return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": nw, "num_stages": 1,
             "GLUON": True, "PIPE": 1, "TILED": True, "BITS": True, "WK": wk, "PRE": pre}
            for bn, bk, nw, wk, split, pre in VARIANTS[8 if bm <= 8 else 16] if n % bn == 0 and k % bk == 0]


def main(quick: bool = False) -> None:
    from atlas.tools.dev.variants import gemv_sweep

    gemv_sweep("nvfp4_wk.json", configs, "wk", quick)


if __name__ == "__main__":
    main("--quick" in sys.argv)
