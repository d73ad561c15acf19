"""Experiment helper (GPU box): the warp-specialized RS GEMM (gluon_ws: a loader partition fills a shared-memory
ring with the packed weights, scales and x by cp.async; the consumer warpgroups decode into wgmma's register A
operand) at GEMV sizes, M 1..16 (wgmma n = BLOCK_M = 8 or 16), beside the GEMV config the benchmark shipped for each
case, on the tiled BITS weights engines run, chained with PDL as engines launch them (CUDA-graph replays over
rotated weight copies).

    python -m atlas.tools.dev.nvfp4_rs_small [--quick]   # $OUT/nvfp4_rs_small.json

Why: the GEMVs at M 8 / 16 on the small layers issue 0.4 instructions a scheduler-cycle with 2-3 warps a scheduler,
half their stalls waiting on their own global loads (NOTES.md, 2026-12-04); here no consumer warp loads from
global memory, the bytes in flight cost no consumer registers and the products are one wgmma a block. Against it:
the RS decode's K loop is about 40 sm_90 instructions a word of 8 weights (BLOCK_N 64, BLOCK_K 128) where the
split GEMV's is about 20.
"""
from __future__ import annotations

import sys

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, SPLIT_K, extra): one consumer warpgroup a 64 rows; 128 registers a thread
# (two CTAs an SM and more); PDL: the weights of the ring's first slots copied before waiting for permute_k.
VARIANTS = [(16, 64, 128, 4, 1, {"PDL": True}), (16, 64, 128, 4, 2, {"PDL": True}), (16, 64, 64, 6, 2, {"PDL": True}),
            (16, 64, 128, 4, 4, {"PDL": True}), (16, 128, 128, 4, 2, {"PDL": True}),
            (16, 128, 128, 4, 4, {"PDL": True}), (16, 64, 128, 4, 2, {"XP": True, "DREGS": 96}),
            (16, 64, 128, 4, 1, {"XP": True, "DREGS": 96}), (8, 64, 128, 4, 2, {"PDL": True}),
            (8, 64, 64, 6, 2, {"PDL": True})]
"""sm_90 (CPU compile): 128 registers, no spills, 26-53 KB of shared memory; K loop 238 (BLOCK_K 64) to 325
(BLOCK_K 128) instructions with 8 HGMMA."""


def configs(m: int, n: int, k: int) -> list[dict]:
    """The RS variants that fit the shape (BLOCK_N | N, whole even block counts per split) at M."""
    from atlas.plugins_trt.quant_linear import gluon_ws as W
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    base = {**GM.CONFIGS_nvfp4_ws_rs[0], "TILED": True, "BITS": True, "MAXNREG": 128}
    out = [{**base, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": bn // 16, "SPLIT_K": sp,
            **extra} for bm, bn, bk, st, sp, extra in VARIANTS if m <= bm]
    return [c for c in out if n % c["BLOCK_N"] == 0 and W.supports(c, k)]


def launch(x, cfg, qt):
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    return GM.launch_nvfp4_gemm(x, *qt, cfg)


def main(quick: bool = False) -> None:
    from atlas.tools.dev.variants import gemv_sweep

    gemv_sweep("nvfp4_rs_small.json", configs, "rs", quick, launch=launch, ms=(1, 8, 16))


if __name__ == "__main__":
    main("--quick" in sys.argv)
