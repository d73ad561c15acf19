"""Experiment helper (GPU box): the block-diagonal M = 1 GEMV (plugins_trt/quant_linear/gluon_diag.py, "DIAG") beside
the config tools/results/gemm.json shipped, on the same BITS-ordered tiled weights, chained with PDL as engines
launch them.

    python -m atlas.tools.dev.nvfp4_diag    # $OUT/nvfp4_diag.json

Every variant is checked against the fp32 reference, then timed as CUDA-graph replays over rotated weight copies.
"""
from __future__ import annotations

import json

VARIANTS = [dict(BLOCK_N=bn, SPLIT_K=sk, PRE=pre, num_warps=nw)
            for bn, nw in ((64, 4), (128, 4), (256, 4), (256, 8)) for sk in (1, 2, 4, 8, 16) for pre in (0, 4)]
"""BLOCK_N, SPLIT_K, PRE (weights of that many blocks before the PDL wait), warps; BLOCK_K is 128."""


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.quant_linear.layout import bits_nvfp4
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.nvfp4_streamk import SHAPES, _setup, _tiled_weights

    out_dir, shipped, sms, bw, res = _setup()
    for name, (n, k) in SHAPES.items():
        g, tiled, wref, nbytes = _tiled_weights(n, k)
        ws_ = [(bits_nvfp4(w), s, s2) for w, s, s2 in tiled]
        del tiled
        x = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
        ref = x.float() @ wref.T
        row = {"shape": name, "N": n, "K": k, "M": 1, "bytes": nbytes + k * 2 + n * 2, "variants": []}
        cfg0 = dict(shipped[(name, 1)])
        row["shipped"] = cfg0
        row["shipped_rel_error"] = rel(gemv.launch_nvfp4_gemv(x, *ws_[0], cfg0, pdl=True), ref)
        row["shipped_us"] = graph_time([lambda w=w: gemv.launch_nvfp4_gemv(x, *w, cfg0, pdl=True) for w in ws_],
                                       repeats=20) * 1e6
        for v in VARIANTS:
            nb = k // 128
            if -(-nb // v["SPLIT_K"]) < max(1, v["PRE"]) or (n // v["BLOCK_N"]) * v["SPLIT_K"] < sms:
                continue
            cfg = {"BLOCK_M": 1, "BLOCK_K": 128, "num_stages": 1, "GLUON": True, "PIPE": 1, "TILED": True,
                   "BITS": True, "DIAG": True, **v}
            if not cfg["PRE"]:
                del cfg["PRE"]
            rec = dict(cfg)
            try:
                rec["rel_error"] = rel(gemv.launch_nvfp4_gemv(x, *ws_[0], cfg, pdl=True), ref)
                if rec["rel_error"] < 1e-2:
                    rec["us"] = graph_time([lambda w=w, c=cfg: gemv.launch_nvfp4_gemv(x, *w, c, pdl=True)
                                            for w in ws_], repeats=20) * 1e6
            except Exception as e:  # noqa: BLE001 — record and go on
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            row["variants"].append(rec)
        ok = [r for r in row["variants"] if "us" in r]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        row["best"] = best
        frac = (lambda us: row["bytes"] / (us * 1e-6) / bw)
        bad = [(r.get("rel_error"), r.get("error", "")[:100]) for r in row["variants"] if "us" not in r]
        print(f"{name:22s} M= 1 shipped {row['shipped_us']:7.1f} us (bw {frac(row['shipped_us']):.2f})  DIAG best "
              f"{best['us'] if best else 0:7.1f} us (bw {frac(best['us']) if best else 0:.2f}) "
              f"{ {q: best.get(q) for q in ('BLOCK_N', 'SPLIT_K', 'PRE', 'num_warps')} if best else ''} "
              f"errors {sorted({round(r['rel_error'], 4) for r in ok})} failed {bad[:3]}", flush=True)
        for r in sorted(ok, key=lambda r: r["us"])[:5]:
            print(f"    {r['us']:7.1f} us  BN {r['BLOCK_N']} SPLIT {r['SPLIT_K']} PRE {r.get('PRE', 0)} "
                  f"warps {r['num_warps']}", flush=True)
        res["rows"].append(row)
        json.dump(res, open(f"{out_dir}/nvfp4_diag.json", "w"), indent=1)
        del ws_, wref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
