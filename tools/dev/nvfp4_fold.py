"""Experiment helper (GPU box): where a small layer's NVFP4 GEMV time goes, and the split GEMV with its split-K
reduction folded into the kernel ("FOLD", gluon_gemv._fold_out) beside the two-launch form.

    python -m atlas.tools.dev.nvfp4_fold    # $OUT/nvfp4_fold.json

For each case (six shapes, M 1..16) and the config tools/results/gemm.json shipped, on BITS-ordered tiled weights,
chained with PDL as engines launch them:
  * shipped: the GEMV (and its reduction when SPLIT_K > 1) over rotated weight copies (what gemm.json times);
  * shipped_l2: the same launches over one weight copy (L2-resident when it fits the 50 MB L2): what is left when
    the bytes come from L2, i.e. the kernel's own issue and latency bound;
  * shipped_noreduce: the split GEMV alone, its reduction left out (the reduction's share of the time);
  * then the fastest split configs gemm.json timed for the case (up to TOP of them), each plain and FOLD.
Every variant is checked against the fp32 reference; FOLD for determinism and for its counters (zero after).
"""
from __future__ import annotations

import json
import os

TOP = 4
"""Split configs a case takes from gemm.json's candidates (fastest first), each timed plain and FOLD."""


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.quant_linear.layout import bits_nvfp4
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.nvfp4_streamk import SHAPES, _setup, _tiled_weights

    out_dir, shipped, sms, bw, res = _setup()
    cands = {(c["shape"], c["M"]): c["nvfp4"].get("candidates", []) for c in
             json.load(open("tools/results/gemm.json"))["cases"]}
    reduce = gemv.launch_splitk_reduce
    for name, (n, k) in SHAPES.items():
        g, tiled, wref, nbytes = _tiled_weights(n, k)
        ws_ = [(bits_nvfp4(w), s, s2) for w, s, s2 in tiled]
        del tiled
        for m in ((1, 16) if "lm_head" in name else (1, 4, 8, 16)):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            cfg0 = dict(shipped[(name, m)])
            row["shipped_config"] = cfg0

            def timed(key, cfg, weights, check=True):
                try:
                    if check:
                        y1 = gemv.launch_nvfp4_gemv(x, *weights[0], cfg, pdl=True)
                        y2 = gemv.launch_nvfp4_gemv(x, *weights[0], cfg, pdl=True)
                        torch.cuda.synchronize()
                        row[key + "_rel_error"] = rel(y1, ref)
                        row[key + "_deterministic"] = bool(torch.equal(y1, y2))
                        if row[key + "_rel_error"] > 1e-2 or not row[key + "_deterministic"]:
                            return
                    row[key + "_us"] = graph_time([lambda w=w: gemv.launch_nvfp4_gemv(x, *w, cfg, pdl=True)
                                                   for w in weights], repeats=20) * 1e6
                    if cfg.get("FOLD") or cfg.get("STREAMK"):
                        tiles = -(-n // cfg["BLOCK_N"])
                        row[key + "_counters_zero"] = int(gemv.counters(x.device, tiles).abs().sum()) == 0
                except Exception as e:  # noqa: BLE001 — record and go on
                    row[key + "_error"] = f"{type(e).__name__}: {e}"[:300]

            timed("shipped", cfg0, ws_)
            timed("shipped_l2", cfg0, [ws_[0]] * len(ws_), check=False)
            if cfg0.get("SPLIT_K", 1) > 1 and not cfg0.get("STREAMK"):
                gemv.launch_splitk_reduce = lambda *a, **kw: None
                try:
                    timed("shipped_noreduce", cfg0, ws_, check=False)
                finally:
                    gemv.launch_splitk_reduce = reduce
            split = [c["config"] for c in sorted(cands[(name, m)], key=lambda c: c.get("seconds", 1e9))
                     if c["config"].get("GLUON") and c["config"].get("SPLIT_K", 1) > 1 and "seconds" in c][:TOP]
            row["split_configs"] = split
            for i, cfg in enumerate(split):
                timed(f"split{i}", cfg, ws_)
                timed(f"fold{i}", {**cfg, "FOLD": True}, ws_)
            frac = (lambda us: row["bytes"] / (us * 1e-6) / bw)
            print(f"{name:22s} M={m:2d} " + "  ".join(
                f"{kk[:-3]} {row[kk]:6.1f} ({frac(row[kk]):.2f})" for kk in row if kk.endswith("_us")) + "  " + " ".join(
                f"{kk}: {row[kk][:80]}" for kk in row if kk.endswith("_error") and "rel" not in kk)
                + ("  NONDET/COUNTERS " + str([kk for kk in row if (kk.endswith("_deterministic") or kk.endswith(
                    "_counters_zero")) and not row[kk]]) if any((kk.endswith("_deterministic") or kk.endswith(
                        "_counters_zero")) and not row[kk] for kk in row) else ""), flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_fold.json", "w"), indent=1)
        del ws_, wref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
