"""GEMV / GEMM benchmark on the GPU: Atlas's NVFP4 and FP8 kernels beside cuBLAS BF16, same shapes, same run.

    python -m atlas.tools.bench_gemm [--out tools/results/gemm.json] [--configs-per-bucket 6]

Shapes: Llama-3.1-8B (qkv 4096->6144, gate_up 4096->28672, down 14336->4096, lm_head 4096->128256) and
Qwen3.5-27B (gate_up 5120->34816, down 17408->5120); M in {1, 2, 4, 8, 16, 64, 256, 2048}.
Each case: the candidate configs are timed and the fastest kept (the same search atlas-build runs), its
output is checked against the fp32 reference on the same inputs, and every figure is the median of
CUDA-graph replays, rotating over enough weight copies that each replay reads device memory, not L2. The reported
figures of a case (cuBLAS and the two winners) are taken together, their replays interleaved, so that a comparison
is never between a cool GPU and one that has run the search for a minute.
Bandwidth = bytes the kernel must read and write / time, against the copy bandwidth measured in this run.
NVFP4 weights run in the order an engine gives them on the GPU: tiled (plugins_trt/quant_linear/layout.py) where N
and K are whole 128 x 128 tiles, which all six shapes are.
GEMVs are launched as an engine launches them, with programmatic dependent launch (--no-pdl: plainly): in the
graph of back-to-back GEMVs each one's launch and ramp-up overlap the one before (the decode step is such a
chain); the winner's plain time is recorded beside it (seconds_without_pdl).
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from pathlib import Path

import click
import torch

from atlas.build_engine.linear_kernels import (CANDIDATES_PER_BUCKET, gemv_candidates, is_tiled,
                                               nvfp4_gemv_candidates, tiled_configs)
from atlas.build_engine.quantize.quantizer import quantize
from atlas.plugins_trt.quant_linear import triton_gemm as gemm
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.plugins_trt.quant_linear.layout import gpu_order
from atlas.plugins_trt.quant_linear.reference import dequantize
from atlas.tools.bench.read import read_ceiling
from atlas.tools.bench.timing import (copies_for, copy_bandwidth, device_info, graph_time,
                                     paired_graph_times)

SHAPES = {  # name -> (N, K)
    "llama-3.1-8b.qkv": (6144, 4096),
    "llama-3.1-8b.gate_up": (28672, 4096),
    "llama-3.1-8b.down": (4096, 14336),
    "llama-3.1-8b.lm_head": (128256, 4096),
    "qwen3.5-27b.gate_up": (34816, 5120),
    "qwen3.5-27b.down": (5120, 17408),
}
MS = (1, 2, 4, 8, 16, 64, 256, 2048)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def best_of(make_calls, candidates, check) -> tuple[dict, float, float, list]:
    """Time each candidate (graph replays); return the fastest config, its search time, its error, all timings."""
    timings, best = [], None
    for cfg in candidates:
        try:
            err = check(cfg)
            t = graph_time(make_calls(cfg), repeats=10)
        except Exception as e:  # a config that does not fit the chip is skipped, and said so
            timings.append({"config": cfg, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        timings.append({"config": cfg, "seconds": t, "rel_error": err})
        if best is None or t < best[1]:
            best = (cfg, t, err)
    if best is None:
        raise RuntimeError(f"no candidate ran: {timings}")
    return (*best, timings)


def to_cuda(q):
    """A copy of QTensor q with its tensors on the GPU (a fresh copy each call)."""
    return dataclasses.replace(q, **{f: getattr(q, f).to("cuda", copy=True)
                                     for f in ("weight", "weight_scale", "weight_scale_2") if getattr(q, f) is not None})


def bench_shape(name: str, n: int, k: int, bandwidth: float, most: int, pdl: bool = True) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    q4 = to_cuda(quantize(w.float(), "nvfp4"))  # the quantizer works on the CPU
    q8 = to_cuda(quantize(w.float(), "fp8"))
    w4_ref = dequantize("nvfp4", q4.weight, q4.weight_scale, q4.weight_scale_2)  # fp32 [N, K]
    w8_ref = dequantize("fp8", q8.weight, q8.weight_scale)
    tiled = is_tiled("nvfp4", n, k)
    if tiled:  # as an engine's CudaLinear holds it: tiled, words in NVFP4_BITS order (tiled_configs), kernels for it
        w4, s4 = gpu_order(q4.weight, q4.weight_scale, bits=True)
        q4 = dataclasses.replace(q4, weight=w4, weight_scale=s4)
    bytes_w = {"bf16": n * k * 2, "nvfp4": n * k // 2 + n * k // 16 + n * 4, "fp8": n * k + n * 4}
    copies = {f: copies_for(b) for f, b in bytes_w.items()}
    bf16_w = [w] + [w.clone() for _ in range(copies["bf16"] - 1)]
    q4s = [q4] + [to_cuda(q4) for _ in range(copies["nvfp4"] - 1)]
    q8s = [q8] + [to_cuda(q8) for _ in range(copies["fp8"] - 1)]
    rows = []
    ceiling = {f: read_ceiling(bytes_w[f], bandwidth) for f in ("nvfp4", "fp8")}  # same bytes, only read
    for m in MS:
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        io = m * k * 2 + m * n * 2
        ref4 = x.float() @ w4_ref.T
        ref8 = x.float() @ w8_ref.T
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cublas_calls = [lambda ww=ww: torch.matmul(x, ww.T, out=out) for ww in bf16_w]
        row = {"shape": name, "N": n, "K": k, "M": m}
        if m <= 16:
            def run4(cfg, qt, pdl=pdl):
                return gemv.launch_nvfp4_gemv(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, out=out,
                                              pdl=pdl)

            def run8(cfg, qt, pdl=pdl):
                return gemv.launch_fp8_gemv(x, qt.weight, qt.weight_scale, cfg, out=out, pdl=pdl)

            cands4 = nvfp4_gemv_candidates(gemv.gemv_bucket(m), n, k, most)
            cands8 = gemv_candidates(gemv.CONFIGS_fp8_gemv, gemv.gemv_bucket(m), n, most)
            kind = "gemv"
        else:
            def run4(cfg, qt):
                return gemm.launch_nvfp4_gemm(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, out=out)

            def run8(cfg, qt):
                return gemm.w8a8_linear(x, qt.weight, qt.weight_scale, cfg, out=out)

            sms = torch.cuda.get_device_properties(0).multi_processor_count
            cands4, cands8 = gemm.gemm_candidates("nvfp4", n, k, sms), gemm.gemm_candidates("fp8", n, k)
            cands4 = tiled_configs(cands4) if tiled else cands4
            kind = "gemm (W4A16)", "gemm (W8A8)"
        winners = {}
        for fmt, run, cands, qts, ref in (("nvfp4", run4, cands4, q4s, ref4), ("fp8", run8, cands8, q8s, ref8)):
            def check(cfg):
                out.fill_(float("nan"))
                err = rel(run(cfg, qts[0]), ref)
                if not err < (5e-2 if (fmt == "fp8" and m > 16) else 1e-2):  # W8A8 also rounds activations
                    raise AssertionError(f"rel error {err:.3e} vs the fp32 reference")
                return err

            winners[fmt] = best_of(lambda c: [lambda qt=qt: run(c, qt) for qt in qts], cands, check)
        # the reported figures: cuBLAS and both winners timed together, their replays interleaved (same clocks)
        t_cublas, *t_final = paired_graph_times(
            [cublas_calls] + [[lambda qt=qt, c=winners[f][0], run=run: run(c, qt) for qt in qts]
                              for f, run, qts in (("nvfp4", run4, q4s), ("fp8", run8, q8s))], repeats=30)
        row["cublas_bf16"] = {"seconds": t_cublas, "bytes": bytes_w["bf16"] + io,
                              "bw_fraction": (bytes_w["bf16"] + io) / t_cublas / bandwidth,
                              "tflops": 2 * m * n * k / t_cublas / 1e12}
        for fmt, run, qts, t in (("nvfp4", run4, q4s, t_final[0]), ("fp8", run8, q8s, t_final[1])):
            cfg, t_search, err, timings = winners[fmt]
            b = bytes_w[fmt] + io
            label = kind if isinstance(kind, str) else kind[fmt == "fp8"]
            label = "dequant + cuBLAS" if cfg.get("DEQUANT") else "wgmma (Gluon)" if cfg.get("WGMMA") else label
            label = "wgmma stream-K (Gluon)" if cfg.get("SK") else label
            label = "wgmma warp-specialized (Gluon)" if cfg.get("WS") else label
            label = "wgmma warp-specialized stream-K (Gluon)" if cfg.get("WS") and cfg.get("SK") else label
            row[fmt] = {"kernel": label, "config": cfg,
                        "seconds": t, "seconds_in_search": t_search, "bytes": b, "bw_fraction": b / t / bandwidth,
                        "speedup_vs_cublas": t_cublas / t, "tflops": 2 * m * n * k / t / 1e12,
                        "rel_error": err, "candidates": timings}
            if m <= 16:
                row[fmt]["read_ceiling_bw_fraction"] = ceiling[fmt]
                row[fmt]["pdl"] = pdl
                if pdl:  # the same winner launched plainly, each GEMV's launch and ramp-up exposed
                    t0 = graph_time([lambda qt=qt: run(cfg, qt, pdl=False) for qt in qts], repeats=30)
                    row[fmt]["seconds_without_pdl"] = t0
                    row[fmt]["bw_fraction_without_pdl"] = b / t0 / bandwidth
        rows.append(row)
        print(f"{name:22s} M={m:5d}  cublas {t_cublas * 1e6:8.1f} us ({row['cublas_bf16']['bw_fraction']:.2f})  "
              f"nvfp4 {row['nvfp4']['seconds'] * 1e6:8.1f} us ({row['nvfp4']['bw_fraction']:.2f}, "
              f"x{row['nvfp4']['speedup_vs_cublas']:.2f})  fp8 {row['fp8']['seconds'] * 1e6:8.1f} us "
              f"({row['fp8']['bw_fraction']:.2f}, x{row['fp8']['speedup_vs_cublas']:.2f})", flush=True)
    del bf16_w, q4s, q8s
    torch.cuda.empty_cache()
    return rows


def summarize(rows: list[dict]) -> dict:
    mlp27 = [r for r in rows if r["shape"].startswith("qwen3.5-27b") and r["M"] == 1]
    m256 = [r for r in rows if r["M"] >= 256]  # the goal: "M >= 256"
    gemvs = [r[f]["bw_fraction"] for r in rows if r["M"] <= 16 for f in ("nvfp4", "fp8")]
    ceilings = [r[f]["read_ceiling_bw_fraction"] for r in rows if r["M"] <= 16 for f in ("nvfp4", "fp8")
                if "read_ceiling_bw_fraction" in r[f]]
    extra = {"min_gemv_read_ceiling_bw_fraction": min(ceilings)} if ceilings else {}
    return {**extra,
        "nvfp4_m1_speedup": min(r["nvfp4"]["speedup_vs_cublas"] for r in mlp27),
        "fp8_m1_speedup": min(r["fp8"]["speedup_vs_cublas"] for r in mlp27),
        "min_gemv_bw_fraction": min(gemvs),
        "fp8_m256_speedup": min(r["fp8"]["speedup_vs_cublas"] for r in m256),
        "nvfp4_m256_speedup": min(r["nvfp4"]["speedup_vs_cublas"] for r in m256),
        "how": "speedups are cuBLAS BF16 time / Atlas time; M=1 over the two Qwen3.5-27B MLP shapes (min); "
               "the m256 keys: min over all shapes at M >= 256 (256 and 2048); "
               "GEMV bandwidth min over every shape, M 1..16 and format; "
               "read ceiling: a kernel that only reads the same bytes, chained with PDL and every load before the wait "
               "(tools/bench/read.py), the smallest over those cases; "
               "every reported time is a median of graph replays interleaved with cuBLAS's and the other format's "
               "winner (tools/bench/timing.paired_graph_times), the search's own timing being seconds_in_search; "
               "GEMVs launched as the engine launches them (pdl: programmatic dependent launch, each GEMV's "
               "launch and ramp-up overlapping the kernel before it in the graph; seconds_without_pdl: plain)",
    }


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("tools/results/gemm.json"), show_default=True)
@click.option("--configs-per-bucket", default=CANDIDATES_PER_BUCKET, show_default=True,
              help="GEMV candidates tried per case (the build's number).")
@click.option("--shapes", default=",".join(SHAPES), show_default=True)
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="Launch the GEMVs with programmatic dependent launch, as engines do (the winner is also timed "
                   "without).")
def main(out, configs_per_bucket, shapes, pdl):
    t0 = time.time()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # cuBLAS's default fast path
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows, names = [], shapes.split(",")
    for name in names:
        rows.extend(bench_shape(name, *SHAPES[name], bandwidth, configs_per_bucket, pdl))
        report = {"device": device_info(), "copy_bandwidth_bytes_per_s": bandwidth, "cases": rows,
                  "summary": summarize(rows) if len(names) == len(SHAPES) and name == names[-1] else None,
                  "seconds": time.time() - t0}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")  # after every shape: a cut-short run keeps its rows
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
