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

import json
import os
import sys

SHAPES = {"qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408),
          "llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.gate_up": (28672, 4096),
          "llama-3.1-8b.down": (4096, 14336), "llama-3.1-8b.lm_head": (128256, 4096)}
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
    from atlas.tools.bench.timing import copies_for, graph_time
    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    ms = [int(v) for v in (sys.argv[sys.argv.index("--m") + 1].split(",") if "--m" in sys.argv else ["256", "64"])]
    shipped = {(c["shape"], c["M"]): c for c in json.load(open("tools/results/gemm.json"))["cases"]}
    k128 = "--k128" in sys.argv
    only = sys.argv[sys.argv.index("--shapes") + 1].split(",") if "--shapes" in sys.argv else list(SHAPES)
    if set(only) - set(SHAPES):
        raise SystemExit(f"--shapes: unknown {sorted(set(only) - set(SHAPES))}; known: {', '.join(SHAPES)}")
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        if name not in only:
            continue
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bits=True)
        nbytes = n * k // 2 + n * k // 16
        copies = [(w, ws)] + [(w.clone(), ws.clone()) for _ in range(copies_for(nbytes) - 1)]
        wbf = ref_w.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            row = {"shape": name, "N": n, "K": k, "M": m,
                   "cublas_us": graph_time([lambda: x @ wbf.T], repeats=20) * 1e6, "variants": []}
            c0 = shipped.get((name, m))
            cfgs = []
            if c0 is not None and c0["nvfp4"]["config"].get("WGMMA"):
                cfgs.append(("shipped", gm.launch_nvfp4_gemm_wgmma, c0["nvfp4"]["config"]))
            plain = {k: v for k, v in variants(True)[0].items() if k not in ("SK", "DP", "FIX")}
            if not (k128 or "--occ" in sys.argv):
                cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma, plain))  # the SK tile on the plain grid
                cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma, {**plain, "STAGES": 5}))  # one block deeper
                # one warpgroup a CTA, two CTAs an SM (105 KB of shared memory, 249 registers): independent CTAs
                cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma,
                             {**plain, "BLOCK_N": 64, "STAGES": 3, "num_warps": 4}))
            counters = torch.zeros(8192, dtype=torch.int32, device="cuda")  # FIX's, zero again after each launch

            def sk(x, a, b, ws2, cfg, reduce=True, counters=counters):
                return gm.launch_nvfp4_gemm_wgmma_sk(x, a, b, ws2, cfg, counters=counters, reduce=reduce)

            if "--occ" in sys.argv:
                cfgs += [("plain", gm.launch_nvfp4_gemm_wgmma,
                          {**plain, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w})
                         for bm, bn, bk, st, w in OCC_TILES]
            else:
                cfgs += [("sk", sk, c) for c in variants("--quick" in sys.argv, k128)]
            for kind, launch, cfg in cfgs:
                rec = {"kind": kind, "config": cfg}
                try:
                    y1 = launch(x, w, ws, ws2, cfg)
                    y2 = launch(x, w, ws, ws2, cfg)
                    torch.cuda.synchronize()
                    rec["rel_error"] = rel(y1, ref)
                    rec["deterministic"] = bool(torch.equal(y1, y2))
                    if rec["rel_error"] < 1e-2:
                        rec["us"] = graph_time([lambda a=a, b=b, cfg=cfg, launch=launch: launch(x, a, b, ws2, cfg)
                                                for a, b in copies], repeats=20) * 1e6
                        if kind == "sk":
                            rec["dp_tiles"] = gm.sk_dp_tiles(cfg, m, n)
                            rec["counters_zero"] = int(counters.abs().sum()) == 0
                        if kind == "sk" and not cfg.get("FIX"):  # the persistent kernel alone (no reduction launch)
                            rec["kernel_us"] = graph_time([lambda a=a, b=b, cfg=cfg: sk(x, a, b, ws2, cfg, False)
                                                           for a, b in copies], repeats=20) * 1e6
                except Exception as e:  # noqa: BLE001 — record and go on
                    rec["error"] = f"{type(e).__name__}: {e}"[:400]
                row["variants"].append(rec)
                tag = (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} G{cfg.get('SK', '-')} DP{cfg.get('DP', '-')}"
                       f"{' FIX' if cfg.get('FIX') else ''}"
                       if kind == "sk" else f"{kind} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} w{cfg['num_warps']}")
                print(f"{name:22s} M={m:4d} {tag:22s} "
                      + (f"{rec['us']:8.1f} us  x{row['cublas_us'] / rec['us']:.2f} cuBLAS" if "us" in rec else "")
                      + (f"  kernel {rec['kernel_us']:7.1f} us" if "kernel_us" in rec else "")
                      + f"  err {rec.get('rel_error', float('nan')):.4f} det {rec.get('deterministic')}"
                      + (f"  {rec['error'][:200]}" if "error" in rec else ""), flush=True)
            ok = [r for r in row["variants"] if "us" in r]
            row["best"] = min(ok, key=lambda r: r["us"]) if ok else None
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_wgmma_sk.json", "w"), indent=1)
        del copies


if __name__ == "__main__":
    main()
