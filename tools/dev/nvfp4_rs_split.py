"""Experiment helper (GPU box): RS tiles that decode each weight once at M = 256, beside the shipped config.

The shipped M = 256 NVFP4 GEMM on 8B qkv (RS 128 x 128 x 128, gemm.json) covers the 256 tokens with two CTAs a row
tile, so every weight is decoded twice, and the decode is what bounds these kernels (NOTES, fifth session). RS 256 x
128 x 64 covers all 256 tokens in one CTA; at SPLIT_K 2 it still has 96 CTAs (one wave) on 8B qkv, each decoding half
of its rows' K once, at the cost of fp32 partials and the split-K reduction. Both compile for sm_90 within 168
registers and 146 KB of shared memory (tests/tools/test_nvfp4_rs_split.py). Timed as the build launches them (x
permutation, then the kernel, PDL where the config says so), replays interleaved with cuBLAS BF16 on random bf16
weights and with each other (timing.paired_graph_times), over rotated weight copies; every output checked against the
fp32 reference.

    python -m atlas.tools.dev.nvfp4_rs_split   # $OUT/nvfp4_rs_split.json
"""
from __future__ import annotations

import json
from pathlib import Path

SHAPES = ("llama-3.1-8b.qkv", "qwen3.5-27b.down", "llama-3.1-8b.down", "qwen3.5-27b.gate_up")


def variants() -> dict[str, dict]:
    """The configs timed beside the shipped one: RS 256 x 128 x 64 at SPLIT_K 2, with and without PDL."""
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    wide = GM.CONFIGS_nvfp4_ws_rs[2]  # RS 256 x 128 x 64, 8 warps
    return {"rs256x128_sk2": {**wide, "SPLIT_K": 2}, "rs256x128_sk2_pdl": {**wide, "SPLIT_K": 2, "PDL": True}}


def main(m: int = 256) -> list[dict]:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_ws as W
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.tools.bench.timing import paired_graph_times
    from atlas.tools.bench_gemm import SHAPES as ALL, rel
    from atlas.tools.dev.variants import m256_case, shipped_results, write_rows

    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in json.loads(Path(shipped_results()).read_text())
               ["cases"]}
    rows = []
    for name in SHAPES:
        n, k = ALL[name]
        configs = {"shipped": shipped[(name, m)],
                   **{v: {**c, "TILED": True, "BITS": True} for v, c in variants().items() if W.supports(c, k)}}
        case = m256_case(n, k, m)
        x, out = case["x"], case["out"]
        row = {"shape": name, "M": m, "configs": configs,
               "rel_error": {v: rel(GM.launch_nvfp4_gemm(x, *case["copies"][0], c, out=out), case["ref"])
                             for v, c in configs.items()}}
        times = paired_graph_times(
            [[lambda ww=ww: torch.matmul(x, ww.T, out=out) for ww in case["w16"]]]
            + [[lambda qt=qt, c=c: GM.launch_nvfp4_gemm(x, *qt, c, out=out) for qt in case["copies"]]
               for c in configs.values()], repeats=30)
        row["cublas_us"] = times[0] * 1e6
        row["us"] = {v: t * 1e6 for v, t in zip(configs, times[1:])}
        row["speedup"] = {v: times[0] / t for v, t in zip(configs, times[1:])}
        rows.append(row)
        print(f"{name:22s} M={m} cublas {row['cublas_us']:7.1f} us  "
              + "  ".join(f"{v} {t:7.1f} (x{row['speedup'][v]:.3f}, err {row['rel_error'][v]:.4f})"
                          for v, t in row["us"].items()), flush=True)
    write_rows("nvfp4_rs_split.json", rows)
    return rows


if __name__ == "__main__":
    main()
