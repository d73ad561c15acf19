"""Shared by the kernel experiment helpers (tools/dev/nvfp4_gluon_gemv.py, nvfp4_wgmma_gemm.py): check every config
against a reference, time the correct ones as CUDA-graph replays over rotated weight copies."""
from __future__ import annotations


def nvfp4_weight(n: int, k: int):
    """(generator, rotated nvfp4 weight copies [N, K] (enough to defeat L2), fp32 dequantized reference [N, K],
    bytes a copy) of fresh random weights seeded by the shape, on the GPU."""
    import torch

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.tools.bench.timing import copies_for
    from atlas.tools.bench_gemm import to_cuda

    g = torch.Generator(device="cuda").manual_seed(n + k)
    q = to_cuda(quantize(torch.randn(n, k, device="cuda", generator=g) * 0.02, "nvfp4"))
    wref = dequantize("nvfp4", q.weight, q.weight_scale, q.weight_scale_2)
    nbytes = n * k // 2 + n * k // 16 + n * 4
    return g, [q] + [to_cuda(q) for _ in range(copies_for(nbytes) - 1)], wref, nbytes


def nvfp4_tiled_weight(n: int, k: int, bits: bool = False):
    """(generator, tiled words, tiled scales, weight_scale_2, fp32 dequantized reference [N, K]) of fresh random
    weights seeded by the shape, on the GPU, in the order GPU engines run them (layout.gpu_order: tiled, and with
    bits each word's bits in NVFP4_BITS order, as a "BITS" config reads them)."""
    import torch

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.plugins_trt.quant_linear.layout import gpu_order
    from atlas.plugins_trt.quant_linear.reference import dequantize

    g = torch.Generator(device="cuda").manual_seed(n + k)
    q = quantize(torch.randn(n, k, device="cuda", generator=g) * 0.02, "nvfp4")  # the quantizer answers on the CPU
    w, ws, ws2 = (t.cuda() for t in (q.weight, q.weight_scale, q.weight_scale_2))
    ref = dequantize("nvfp4", w, ws, ws2)
    return (g, *gpu_order(w, ws, bits), ws2, ref)


def nvfp4_tiled_copies(n: int, k: int, bits: bool = True):
    """(generator, [(words, scales, weight_scale_2)] copies enough to rotate past L2, fp32 reference, weight bytes):
    nvfp4_tiled_weight's weights, for timing GEMVs in a chain over rotated copies."""
    from atlas.tools.bench.timing import copies_for

    g, w, ws, ws2, ref = nvfp4_tiled_weight(n, k, bits)
    nbytes = n * k // 2 + n * k // 16 + n * 4
    return g, [(w, ws, ws2)] + [(w.clone(), ws.clone(), ws2) for _ in range(copies_for(nbytes) - 1)], ref, nbytes


def m256_case(n: int, k: int, m: int) -> dict:
    """A GEMM case as the M >= 64 sweeps time it beside cuBLAS: NVFP4 weight copies in the tiled order (copies), x,
    the fp32 reference (ref), cuBLAS's random bf16 weights (w16, as bench_gemm's cuBLAS side, rotated) and a bf16
    output buffer (out)."""
    import torch

    from atlas.tools.bench.timing import copies_for

    g, copies, ref_w, _ = nvfp4_tiled_copies(n, k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    return {"copies": copies, "x": x, "ref": x.float() @ ref_w.T,
            "w16": [w] + [w.clone() for _ in range(copies_for(n * k * 2) - 1)],
            "out": torch.empty(m, n, device="cuda", dtype=torch.bfloat16)}


def write_rows(file_name: str, rows: list[dict]) -> None:
    """{"device", "rows"} as $OUT/file_name (a dev sweep's result file)."""
    import json
    import os
    from pathlib import Path

    import torch

    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / file_name).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
                                     + "\n")


def check_and_time(configs: list[dict], run, ref, copies: list, bound: float = 1e-2) -> tuple[list[dict], dict | None]:
    """run(cfg, weights) -> output. Each config's relative error against ref (on copies[0]); the ones under bound
    are timed (median microseconds, graph replays over `copies`). Returns (one record a config, the fastest)."""
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel

    records = []
    for cfg in configs:
        rec = dict(cfg)
        try:
            rec["rel_error"] = rel(run(cfg, copies[0]), ref)
            if rec["rel_error"] < bound:
                rec["us"] = graph_time([lambda qt=qt, cfg=cfg: run(cfg, qt) for qt in copies], repeats=20) * 1e6
        except Exception as e:  # noqa: BLE001 — record and go on
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        records.append(rec)
    ok = [r for r in records if "us" in r]
    return records, (min(ok, key=lambda r: r["us"]) if ok else None)


def error_summary(records: list[dict]) -> list[float]:
    """The distinct relative errors (4 decimals) of the records that ran."""
    return sorted({round(r["rel_error"], 4) for r in records if "rel_error" in r})


def shipped_results() -> str:
    """The benchmark result file whose configs a sweep times as "shipped": tools/results/gemm_h100.json on an H100
    (the tuning of that chip), else tools/results/gemm.json (the H200's)."""
    import os

    import torch

    h100 = "tools/results/gemm_h100.json"
    return h100 if "H100" in torch.cuda.get_device_name() and os.path.exists(h100) else "tools/results/gemm.json"


def gemv_sweep(out_file: str, configs, label: str, quick: bool = False, launch=None, ms=(1, 4, 8, 16)) -> dict:
    """The NVFP4 GEMV sweeps beside the shipped configs (nvfp4_staged, nvfp4_wk, nvfp4_rs_small): for the six shapes
    and each M of ms (1 / 16 with quick, and for the lm_head), tiled BITS weights as engines run them, the shipped
    config (the benchmark's pick, shipped_results) and each of configs(M, N, K), checked against the fp32 reference
    and timed as PDL launches in CUDA-graph replays over rotated weight copies; launch(x, cfg, weights) runs the
    variants when they are not GEMV configs (the shipped config always goes through the GEMV launcher). One printed
    line a case (the shipped time, the best variant's and its config), $OUT/out_file rewritten after every row.
    Returns the result."""
    import json

    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.dev.nvfp4_streamk import SHAPES

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "SPLIT_K", "PRE", "STAGE", "STAGES", "WK", "MAXNREG", "XP",
            "PDL")
    for name, (n, k) in SHAPES.items():
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        for m in ((1, 16) if quick or "lm_head" in name else ms):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            shipped_cfg = shipped[(name, m)]

            def run(cfg, qt, x=x, shipped_cfg=shipped_cfg):
                if launch is None or cfg is shipped_cfg:
                    return gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True)
                return launch(x, cfg, qt)

            recs, _ = check_and_time([shipped_cfg] + configs(m, n, k), run, ref, copies)
            row["shipped"], row[label] = recs[0], recs[1:]
            row["best_" + label] = b = min((r for r in recs[1:] if "us" in r), key=lambda r: r["us"], default=None)
            s = row["shipped"]
            frac = (lambda us: row["bytes"] / (us * 1e-6) / bw)
            fails = [(r.get("rel_error"), r.get("error", "")[:120]) for r in recs if "us" not in r]
            print(f"{name:22s} M={m:2d} shipped {s.get('us', 0):7.1f} us (bw {frac(s['us']) if 'us' in s else 0:.2f})"
                  f"  {label} best {b['us'] if b else 0:7.1f} us (bw {frac(b['us']) if b else 0:.2f}) "
                  f"{ {q: b.get(q) for q in keys if q in b} if b else ''} errors {error_summary(recs)} "
                  f"failed {fails[:3]}", flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/{out_file}", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()
    return res


def sweep_start(fmt: str) -> tuple[str, dict, float, dict]:
    """What the GEMV sweeps beside the shipped configs start from: ($OUT, created; {(shape, M): the config
    tools/results/gemm.json shipped for fmt}; the copy bandwidth measured now; the result dict with the device)."""
    import json
    import os

    from atlas.tools.bench.timing import copy_bandwidth, device_info

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c[fmt]["config"] for c in json.load(open(shipped_results()))["cases"]}
    bw = copy_bandwidth()
    return out_dir, shipped, bw, {**device_info(), "copy_bandwidth": bw, "rows": []}


def labelled_row(name: str, n: int, k: int, m: int, total: int, labelled: list[tuple[str, dict]], run, ref,
                 copies: list, bw: float) -> dict:
    """check_and_time over (label, config) pairs; the result row (each run with its label) and one printed line
    with each run's microseconds and fraction of the copy bandwidth bw on `total` bytes."""
    recs, _ = check_and_time([c for _, c in labelled], run, ref, copies)
    row = {"shape": name, "N": n, "K": k, "M": m, "bytes": total,
           "runs": [{"label": lab, **r} for (lab, _), r in zip(labelled, recs)]}
    print(f"{name:22s} M={m:2d} " + "  ".join(
        f"{r['label']}: {r['us']:.1f} us ({total / (r['us'] * 1e-6) / bw:.2f})" if "us" in r
        else f"{r['label']}: failed {r.get('error', '')[:80]}" for r in row["runs"]), flush=True)
    return row


def nvfp4_gemv_sweep(file_name: str, ms: tuple[int, ...], configs) -> None:
    """A GEMV sweep beside the shipped NVFP4 configs: for each shape of nvfp4_streamk.SHAPES and M in ms, the
    (label, config) pairs configs(shipped config, m, n, k) checked and timed (labelled_row) in the benchmark's PDL
    chain over rotated BITS weight copies; the result file rewritten after each row ($OUT/file_name)."""
    import json

    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.dev.nvfp4_streamk import SHAPES

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    for name, (n, k) in SHAPES.items():
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            res["rows"].append(labelled_row(
                name, n, k, m, nbytes + m * k * 2 + m * n * 2, configs(shipped[(name, m)], m, n, k),
                lambda cfg, qt: gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True), x.float() @ ref_w.T, copies, bw))
            json.dump(res, open(f"{out_dir}/{file_name}", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


def nvfp4_gemm_sweep(out_file: str, variants_for, tag, default_m: str = "256", extra=None) -> dict:
    """The GEMM sweeps beside the shipped configs (nvfp4_wgmma_sk, nvfp4_wgmma_ws). For every shape of --shapes
    (default: the benchmark's, tools/bench_gemm.SHAPES) and M of --m: tiled + BITS weights as GPU engines run them,
    cuBLAS BF16 timed in the same run, then each (kind, launch, config) of variants_for(shape, M, the gemm.json case
    or None), checked against the fp32 reference and for run-to-run equality, and timed (graph replays over rotated
    weight copies) where its error is under 1e-2; extra(record, kind, config, timing, M, N) may add fields
    (timing(fn) times fn(x, words, scales, ws2)). One printed line a variant (tag(kind, config)); $OUT/out_file
    rewritten after every row. Returns the result."""
    import json
    import os
    import sys

    import torch

    from atlas.tools.bench.timing import copies_for, graph_time
    from atlas.tools.bench_gemm import SHAPES, rel

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    ms = [int(v) for v in (sys.argv[sys.argv.index("--m") + 1] if "--m" in sys.argv else default_m).split(",")]
    only = sys.argv[sys.argv.index("--shapes") + 1].split(",") if "--shapes" in sys.argv else list(SHAPES)
    if set(only) - set(SHAPES):
        raise SystemExit(f"--shapes: unknown {sorted(set(only) - set(SHAPES))}; known: {', '.join(SHAPES)}")
    shipped = {(c["shape"], c["M"]): c for c in json.load(open(shipped_results()))["cases"]}
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        if name not in only:
            continue
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bits=True)
        copies = [(w, ws)] + [(w.clone(), ws.clone()) for _ in range(copies_for(n * k // 2 + n * k // 16) - 1)]
        wbf = ref_w.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            row = {"shape": name, "N": n, "K": k, "M": m,
                   "cublas_us": graph_time([lambda: x @ wbf.T], repeats=20) * 1e6, "variants": []}

            def timing(fn):
                return graph_time([lambda a=a, b=b: fn(x, a, b, ws2) for a, b in copies], repeats=20) * 1e6

            for kind, launch, cfg in variants_for(name, m, shipped.get((name, m))):
                rec = {"kind": kind, "config": cfg}
                try:
                    y1 = launch(x, w, ws, ws2, cfg)
                    y2 = launch(x, w, ws, ws2, cfg)
                    torch.cuda.synchronize()
                    rec["rel_error"] = rel(y1, ref)
                    rec["deterministic"] = bool(torch.equal(y1, y2))
                    if rec["rel_error"] < 1e-2:
                        rec["us"] = timing(lambda x_, a, b, s, launch=launch, cfg=cfg: launch(x_, a, b, s, cfg))
                        if extra is not None:
                            extra(rec, kind, cfg, timing, m, n)
                except Exception as e:  # noqa: BLE001 — record and go on
                    rec["error"] = f"{type(e).__name__}: {e}"[:400]
                row["variants"].append(rec)
                print(f"{name:22s} M={m:4d} {tag(kind, cfg):28s} "
                      + (f"{rec['us']:8.1f} us  x{row['cublas_us'] / rec['us']:.2f} cuBLAS" if "us" in rec else "")
                      + (f"  kernel {rec['kernel_us']:7.1f} us" if "kernel_us" in rec else "")
                      + f"  err {rec.get('rel_error', float('nan')):.4f} det {rec.get('deterministic')}"
                      + (f"  {rec['error'][:300]}" if "error" in rec else ""), flush=True)
            ok = [r for r in row["variants"] if "us" in r]
            row["best"] = min(ok, key=lambda r: r["us"]) if ok else None
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/{out_file}", "w"), indent=1)
        copies = None  # the copies' memory back before the next shape (timing() reads the name)
    return res
