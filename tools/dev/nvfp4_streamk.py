"""Experiment helper (GPU box): the stream-K NVFP4 GEMV (plugins_trt/quant_linear/gluon_streamk.py) beside the GEMV
config gemm.json shipped for the same case, both on tiled weights, chained with PDL as engines launch them.

    python -m atlas.tools.dev.nvfp4_streamk [--quick]   # $OUT/nvfp4_streamk.json
    python -m atlas.tools.dev.nvfp4_streamk --bits      # $OUT/nvfp4_bits.json: the shipped GEMV config and the
                                                        #   stream-K 256 x 128 ring, each with words in
                                                        #   layout.NVFP4_BITS order (BITS) beside the plain order

Each variant is checked against the fp32 reference (relative error), for determinism (two runs bit-identical) and
for its counters (zero again after the runs), then timed as CUDA-graph replays over rotated weight copies.
"""
from __future__ import annotations

import json
import os
import sys

SHAPES = {"llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.gate_up": (28672, 4096), "llama-3.1-8b.down": (4096, 14336),
          "qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408),
          "llama-3.1-8b.lm_head": (128256, 4096)}
VARIANTS = [dict(BLOCK_N=bn, BLOCK_K=bk, RING=ring, STREAMK=sm, num_warps=nw) for bn, bk, ring, sm, nw in (
    (256, 128, 4, 2, 4), (128, 128, 0, 2, 4), (128, 128, 4, 2, 4), (128, 128, 6, 3, 4),  # STREAMK_TILES
    # 8 warps: ncu puts 4-warp programs at 11% occupancy with half the cycles of no eligible warp
    (256, 128, 4, 2, 8), (256, 128, 3, 2, 8), (256, 128, 2, 3, 8), (128, 128, 4, 3, 8), (128, 128, 4, 4, 8),
    (256, 256, 3, 2, 8))]
"""(BLOCK_N, BLOCK_K, RING slots (0: the register form), programs an SM, warps)."""
REGCAPS = (72, 96, 112, 128)
"""--regcap: register caps (MAXNREG) tried on the shipped configs (72 and 128 measured in nvfp4_bits_regcap.json)."""


def _setup():
    """(output folder, gemm.json's NVFP4 config by (shape, M), SM count, copy bandwidth, the result record)."""
    import torch

    from atlas.tools.bench.timing import copy_bandwidth

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in
               json.load(open("tools/results/gemm.json"))["cases"]}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    return out_dir, shipped, sms, bw, {"copy_bandwidth": bw, "sm_count": sms, "rows": []}


def _tiled_weights(n: int, k: int):
    """(generator, rotated copies of a fresh NVFP4 weight as (words, scales, weight_scale_2) in the tiled order,
    fp32 reference [N, K], bytes a copy)."""
    from atlas.plugins_trt.quant_linear.layout import tile_nvfp4
    from atlas.tools.dev.variants import nvfp4_weight

    g, qs, wref, nbytes = nvfp4_weight(n, k)
    return g, [tile_nvfp4(q.weight, q.weight_scale) + (q.weight_scale_2,) for q in qs], wref, nbytes


def main(quick: bool = False) -> None:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_streamk as sk
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel

    out_dir, shipped, sms, bw, res = _setup()
    for name, (n, k) in SHAPES.items():
        g, tiled, wref, nbytes = _tiled_weights(n, k)
        for m in ((1, 16) if quick or "lm_head" in name else (1, 4, 8, 16)):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2, "variants": []}
            cfg0 = {q: v for q, v in shipped[(name, m)].items() if q != "BITS"}  # on the plain tiled weights
            row["shipped"] = cfg0
            row["shipped_us"] = graph_time([lambda w=w: gemv.launch_nvfp4_gemv(x, *w, cfg0, pdl=True)
                                            for w in tiled], repeats=20) * 1e6
            for v in VARIANTS:
                cfg = {"BLOCK_M": gemv.gemv_bucket(m), **v, "num_stages": 1, "TILED": True}
                if n % cfg["BLOCK_N"] or k % cfg["BLOCK_K"]:
                    continue
                cfg["PROGRAMS"] = sk.programs_for(cfg, n, k, sms)
                rec = dict(cfg)
                try:
                    cnt = torch.zeros(n // cfg["BLOCK_N"], dtype=torch.int32, device="cuda")
                    part = torch.empty(sk.workspace_shapes(cfg, n)[0], dtype=torch.float32, device="cuda")

                    def run(w, cfg=cfg, cnt=cnt, part=part):
                        return sk.launch_nvfp4_gemv_streamk(x, *w, cfg, cnt, partials=part, pdl=True)

                    y1 = run(tiled[0])
                    y2 = run(tiled[0])
                    torch.cuda.synchronize()
                    rec["rel_error"] = rel(y1, ref)
                    rec["deterministic"] = bool(torch.equal(y1, y2))
                    rec["counters_zero"] = int(cnt.abs().sum()) == 0
                    if rec["rel_error"] < 1e-2 and rec["deterministic"] and rec["counters_zero"]:
                        rec["us"] = graph_time([lambda w=w: run(w) for w in tiled], repeats=20) * 1e6
                        rec["counters_zero_after_graph"] = int(cnt.abs().sum()) == 0
                except Exception as e:  # noqa: BLE001 — record and go on
                    rec["error"] = f"{type(e).__name__}: {e}"[:400]
                row["variants"].append(rec)
            ok = [r for r in row["variants"] if "us" in r]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            row["best"] = best
            frac = (lambda us: row["bytes"] / (us * 1e-6) / bw)
            bad = [(r.get("rel_error"), r.get("deterministic"), r.get("counters_zero"), r.get("error", "")[:80])
                   for r in row["variants"] if "us" not in r]
            print(f"{name:22s} M={m:2d} shipped {row['shipped_us']:7.1f} us (bw {frac(row['shipped_us']):.2f})  "
                  f"stream-K best {best['us'] if best else 0:7.1f} us (bw {frac(best['us']) if best else 0:.2f}) "
                  f"{ {q: best[q] for q in ('BLOCK_N', 'BLOCK_K', 'RING', 'STREAMK', 'num_warps')} if best else ''} "
                  f"errors {sorted({round(r['rel_error'], 4) for r in ok})} failed {bad[:3]}", flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_streamk.json", "w"), indent=1)
        del tiled, wref
        torch.cuda.empty_cache()


def bits(regcap: bool = False) -> None:
    """Each case's shipped GEMV config (gemm.json) and the stream-K 256 x 128 ring, with and without BITS (the same
    weights, words bit-permuted by layout.bits_nvfp4), timed in one run."""
    import torch

    from atlas.plugins_trt.quant_linear import gluon_streamk as sk
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.quant_linear.layout import bits_nvfp4
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel

    out_dir, shipped, sms, bw, res = _setup()
    for name, (n, k) in SHAPES.items():
        g, tiled, wref, nbytes = _tiled_weights(n, k)
        bitsw = [(bits_nvfp4(w), ws, ws2) for w, ws, ws2 in tiled]
        for m in ((1, 16) if "lm_head" in name else (1, 4, 8, 16)):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            sk_cfg = {"BLOCK_M": gemv.gemv_bucket(m), "BLOCK_N": 256, "BLOCK_K": 128, "RING": 4, "STREAMK": 2,
                      "num_warps": 4, "num_stages": 1, "TILED": True}
            sk_cfg["PROGRAMS"] = sk.programs_for(sk_cfg, n, k, sms)
            base = {q: v for q, v in shipped[(name, m)].items() if q not in ("BITS", "MAXNREG")}
            variants = [("shipped", base, False), ("shipped_bits", base, True)]
            if regcap:  # register caps (MAXNREG) on the shipped config, with and without BITS
                variants += [(f"shipped{'_bits' if on else ''}_r{r}", {**base, "MAXNREG": r}, on)
                             for r in REGCAPS for on in (False, True)]
                variants += [(f"streamk_bits_r{r}", {**sk_cfg, "MAXNREG": r}, True) for r in REGCAPS[1:]]
            else:
                variants += [("streamk", sk_cfg, False), ("streamk_bits", sk_cfg, True)]
            for key, cfg, on in variants:
                c = {**cfg, "BITS": True} if on else dict(cfg)
                ws_ = bitsw if on else tiled
                try:
                    row[key + "_rel_error"] = rel(gemv.launch_nvfp4_gemv(x, *ws_[0], c, pdl=True), ref)
                    row[key + "_us"] = graph_time([lambda w=w, c=c: gemv.launch_nvfp4_gemv(x, *w, c, pdl=True)
                                                   for w in ws_], repeats=20) * 1e6
                except Exception as e:  # noqa: BLE001 — record and go on
                    row[key + "_error"] = f"{type(e).__name__}: {e}"[:300]
            frac = (lambda us: row["bytes"] / (us * 1e-6) / bw)
            print(f"{name:22s} M={m:2d} " + "  ".join(
                f"{kk[:-3]} {row[kk]:6.1f} us ({frac(row[kk]):.2f}, err {row[kk[:-3] + '_rel_error']:.4f})"
                for kk in row if kk.endswith("_us")) + "  " + " ".join(
                row[kk][:80] for kk in row if kk.endswith("_error") and "rel" not in kk), flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_bits{'_regcap' if regcap else ''}.json", "w"), indent=1)
        del tiled, bitsw, wref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    bits("--regcap" in sys.argv) if "--bits" in sys.argv else main("--quick" in sys.argv)
