"""nvfp4_dequant_kernel alone, on the GPU: tiles x warps x PACK, tiled weights, against the copy bandwidth; then the
whole DEQUANT way (dequantize a chunk, cuBLAS it) at M 2048 for the fastest tiles and two chunk sizes.

    python -m atlas.tools.dev.nvfp4_dequant     # GPU box; writes $OUT/nvfp4_dequant.json

Bytes a weight element: 0.5 (E2M1) + 1/16 (scale) read, 2 (bf16) written. The DEQUANT way's M 2048 cases of
tools/results/gemm.json (0.71-0.90x cuBLAS) spend 15-25% of their time here.
"""

from __future__ import annotations

import json
import os


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.tools.bench.timing import copy_bandwidth, graph_time
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    bw = copy_bandwidth()
    res = {"copy_bandwidth": bw, "dequant": [], "linear": []}
    for name, (n, k) in {"qwen3.5-27b.gate_up": (34816, 5120), "llama-3.1-8b.down": (4096, 14336)}.items():
        g, w, ws, ws2, ref = nvfp4_tiled_weight(n, k)
        rows = 8192 if n > 8192 else n  # one chunk of rows, as nvfp4_dequant_linear dequantizes it
        work = torch.empty(rows, k, device="cuda", dtype=torch.bfloat16)
        nbytes = rows * k * (0.5 + 1 / 16 + 2)
        for bn in (32, 64, 128):
            for bk in (256, 512):
                for pack in (False, True):
                    for nw in (4, 8):
                        cfg = {"DEQUANT": True, "PACK": pack, "BLOCK_N": bn, "BLOCK_K": bk, "CHUNK": 1 << 25,
                               "num_warps": nw, "num_stages": 1, "TILED": True}
                        rec = {"shape": name, **cfg}
                        try:
                            work.fill_(float("nan"))
                            gemm.launch_nvfp4_dequant(w[:rows], ws[:rows], ws2[:rows], work, cfg)
                            rec["exact"] = bool(torch.equal(work, ref[:rows].to(torch.bfloat16)))
                            rec["rel_error"] = float((work.float() - ref[:rows]).norm() / ref[:rows].norm())
                            t = graph_time([lambda: gemm.launch_nvfp4_dequant(w[:rows], ws[:rows], ws2[:rows], work,
                                                                              cfg)], repeats=20)
                            rec.update(us=t * 1e6, bw_fraction=nbytes / t / bw)
                        except Exception as e:  # noqa: BLE001 — a tile the chip refuses is recorded
                            rec["error"] = f"{type(e).__name__}: {e}"[:200]
                        res["dequant"].append(rec)
                        print(f"{name} dequant BN {bn:3d} BK {bk} PACK {int(pack)} w{nw}: "
                              f"{rec.get('us', 0):7.1f} us bw {rec.get('bw_fraction', 0):.2f} exact {rec.get('exact')} "
                              f"rel {rec.get('rel_error', -1):.1e}"
                              f" {rec.get('error', '')}", flush=True)
        ok = sorted((r for r in res["dequant"] if r["shape"] == name and r.get("rel_error", 1) < 4e-3 and "us" in r),
                    key=lambda r: r["us"])
        x = torch.randn(2048, k, device="cuda", generator=g).to(torch.bfloat16)
        out = torch.empty(2048, n, device="cuda", dtype=torch.bfloat16)
        wb = ref.to(torch.bfloat16)
        t_cublas = graph_time([lambda: torch.matmul(x, wb.T, out=out)], repeats=20)
        yref = x.float() @ ref.T
        for r in ok[:3]:
            for chunk in (1 << 24, 1 << 25, 1 << 26):
                cfg = {key: r[key] for key in ("DEQUANT", "PACK", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages",
                                               "TILED")} | {"CHUNK": chunk}
                y = gemm.nvfp4_dequant_linear(x, w, ws, ws2, cfg, out=out)
                err = float((y.float() - yref).norm() / yref.norm())
                t = graph_time([lambda: gemm.nvfp4_dequant_linear(x, w, ws, ws2, cfg, out=out)], repeats=10)
                res["linear"].append({"shape": name, "M": 2048, **cfg, "us": t * 1e6, "cublas_us": t_cublas * 1e6,
                                      "speedup_vs_cublas": t_cublas / t, "rel_error": err})
                print(f"{name} M 2048 DEQUANT BN {cfg['BLOCK_N']} BK {cfg['BLOCK_K']} PACK {int(cfg['PACK'])} "
                      f"w{cfg['num_warps']} CHUNK 2^{chunk.bit_length() - 1}: {t * 1e6:8.1f} us, cuBLAS "
                      f"{t_cublas * 1e6:8.1f} (x{t_cublas / t:.2f}), rel error {err:.1e}", flush=True)
        json.dump(res, open(f"{out_dir}/nvfp4_dequant.json", "w"), indent=1)


if __name__ == "__main__":
    main()
