"""Experiment helper (GPU box): the persistent stream-K form of the Gluon wgmma NVFP4 GEMM
(gluon_gemm.nvfp4_gemm_wgmma_sk_kernel + triton_gemv.sk_reduce_kernel, "SK" configs) beside the config gemm.json
shipped and cuBLAS BF16, on the benchmark's six shapes at M 256 (the nvfp4_m256 goal) and M 64, tiled + BITS weights
as GPU engines run them. Every variant is checked against the fp32 reference and for run-to-run bit equality.

    python -m atlas.tools.dev.nvfp4_wgmma_sk      # $OUT/nvfp4_wgmma_sk.json
    [--m 256,64]  [--quick]: fewer variants  [--k128]: BLOCK_K 128 stream-K tiles (the shipped plain tile of the
    8B shapes) beside the shipped SK config, no plain probes  [--shapes a,b]: only those shapes
    [--occ]: plain (non-persistent) tiles small enough for 2-5 CTAs an SM (OCC_TILES) instead of stream-K
"""
from __future__ import annotations

import sys

TILES = {  # (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps)
    "256x128": (256, 128, 64, 4, 8), "128x128": (128, 128, 64, 5, 8), "128x64": (128, 64, 64, 4, 4),
    "256x64": (256, 64, 64, 4, 4), "256x128s5": (256, 128, 64, 5, 8),
    "128x128k128": (128, 128, 128, 4, 8), "128x128k128s3": (128, 128, 128, 3, 8), "128x64k128": (128, 64, 128, 4, 4),
    "64x128k128": (64, 128, 128, 5, 8)}


OCC_TILES = [  # (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps): sm_90 registers / shared memory -> CTAs an SM
    (64, 64, 128, 3, 4),  # 155 / 63 KB -> 3 (8B qkv M 256: 384 tiles on 396 slots)
    (64, 64, 128, 4, 4),  # 155 / 84 KB -> 2
    (64, 64, 64, 4, 4),  # 96 / 42 KB -> 5
    (64, 64, 64, 6, 4),  # 96 / 63 KB -> 3
    (32, 64, 128, 4, 4),  # 127 / 51 KB -> 4
    (128, 64, 128, 3, 4),  # 194 / 112 KB -> 2
]


def variants(quick: bool, k128: bool = False) -> list[dict]:
    """SK configs: (tile, programs, DP mode, FIX: the parts summed inside the kernel instead of a second launch)."""
    plan = [("256x128", 132, 1, False), ("256x128", 132, 1, True), ("256x128", 132, 0, True),
            ("256x128", 132, 2, True), ("128x128", 132, 1, True), ("128x64", 264, 1, True), ("256x64", 132, 1, True),
            ("256x128s5", 132, 1, True)]
    if quick:
        plan = plan[:3]
    if k128:  # the 8B shapes' plain winner (128 x 128 x 128) on the persistent grid, and its neighbours
        plan = [("256x128", 132, 1, False), ("128x128k128", 132, 1, False), ("128x128k128", 132, 1, True),
                ("128x128k128s3", 132, 1, False), ("128x64k128", 132, 1, False), ("64x128k128", 132, 1, False)]
    out = []
    for tile, g, dp, fix in plan:
        bm, bn, bk, st, w = TILES[tile]
        out.append({"WGMMA": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w,
                    "num_stages": 1, "W_SMEM": True, "TILED": True, "BITS": True, "SK": g, "DP": dp,
                    **({"FIX": True} if fix else {})})
    return out


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_gemm as gm
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.tools.dev.variants import nvfp4_gemm_sweep

    k128 = "--k128" in sys.argv
    occ = "--occ" in sys.argv
    counters = torch.zeros(8192, dtype=torch.int32, device="cuda")  # FIX's, zero again after each launch

    def sk(x, a, b, ws2, cfg, reduce=True):
        return gm.launch_nvfp4_gemm_wgmma_sk(x, a, b, ws2, cfg, counters=counters, reduce=reduce)

    def variants_for(name, m, case):
        cfgs = []
        if case is not None:  # whichever way gemm.json shipped (the dispatcher launches any)
            cfgs.append(("shipped", GM.launch_nvfp4_gemm, case["nvfp4"]["config"]))
        plain = {k: v for k, v in variants(True)[0].items() if k not in ("SK", "DP", "FIX")}
        if not (k128 or occ):
            cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma, plain))  # the SK tile on the plain grid
            cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma, {**plain, "STAGES": 5}))  # one block deeper
            # one warpgroup a CTA, two CTAs an SM (105 KB of shared memory, 249 registers): independent CTAs
            cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma, {**plain, "BLOCK_N": 64, "STAGES": 3, "num_warps": 4}))
        if occ:
            return cfgs + [("plain", gm.launch_nvfp4_gemm_wgmma,
                            {**plain, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w})
                           for bm, bn, bk, st, w in OCC_TILES]
        return cfgs + [("sk", sk, c) for c in variants("--quick" in sys.argv, k128)]

    def extra(rec, kind, cfg, timing, m, n):
        if kind != "sk":
            return
        rec["dp_tiles"] = gm.sk_dp_tiles(cfg, m, n)
        rec["counters_zero"] = int(counters.abs().sum()) == 0
        if not cfg.get("FIX"):  # the persistent kernel alone (no reduction launch)
            rec["kernel_us"] = timing(lambda x, a, b, ws2: sk(x, a, b, ws2, cfg, False))

    def tag(kind, cfg):
        if kind == "sk":
            return (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} G{cfg.get('SK', '-')} "
                    f"DP{cfg.get('DP', '-')}{' FIX' if cfg.get('FIX') else ''}")
        return f"{kind} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} w{cfg['num_warps']}"

    nvfp4_gemm_sweep("nvfp4_wgmma_sk.json", variants_for, tag, "256,64", extra)


if __name__ == "__main__":
    main()
