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


def sweep_start(fmt: str) -> tuple[str, dict, float, dict]:
    """What the GEMV sweeps beside the shipped configs start from: ($OUT, created; {(shape, M): the config
    tools/results/gemm.json shipped for fmt}; the copy bandwidth measured now; the result dict with the device)."""
    import json
    import os

    from atlas.tools.bench.timing import copy_bandwidth, device_info

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c[fmt]["config"] for c in json.load(open("tools/results/gemm.json"))["cases"]}
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
