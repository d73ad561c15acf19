"""Experiment helper (GPU box): what the x permutation costs the NVFP4 GEMM at M = 256, where the benchmark's NVFP4
goal misses (8B qkv: 0.755x cuBLAS). The shipped M = 256 config (gemm_h100.json / gemm.json) launched as the build
launches it (permute_k, then the kernel as its programmatic dependent) beside the same kernel given x already in the
k order (what a kernel before the linear could write for free), and cuBLAS BF16, replays interleaved
(timing.paired_graph_times), over rotated weight copies; both outputs checked against the fp32 reference. cuBLAS
multiplies random bf16 weights as bench_gemm's does (the first committed run, nvfp4_rs_noperm_h100.json, used bf16
copies of the dequantized NVFP4 weight: 25.8 us on 8B qkv against the benchmark's 24.6).

    python -m atlas.tools.dev.nvfp4_rs_noperm   # $OUT/nvfp4_rs_noperm.json
"""
from __future__ import annotations

import json
from pathlib import Path

SHAPES = ("llama-3.1-8b.qkv", "llama-3.1-8b.down", "qwen3.5-27b.down", "qwen3.5-27b.gate_up")


def main(m: int = 256) -> list[dict]:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_ws as W
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.plugins_trt.quant_linear.gluon_gemm import permute_k
    from atlas.tools.bench.timing import paired_graph_times
    from atlas.tools.bench_gemm import SHAPES as ALL, rel
    from atlas.tools.dev.variants import m256_case, shipped_results, write_rows

    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in json.loads(Path(shipped_results()).read_text())
               ["cases"]}
    rows, permuting = [], W.x_operand
    for name in SHAPES:
        n, k = ALL[name]
        cfg = shipped[(name, m)]
        row = {"shape": name, "M": m, "config": cfg}
        if not cfg.get("WS"):
            rows.append({**row, "skipped": "not a warp-specialized config"})
            continue
        case = m256_case(n, k, m)
        copies, x, ref, w16, out = (case[key] for key in ("copies", "x", "ref", "w16", "out"))
        xk = permute_k(x, cfg["BLOCK_K"])

        def given(qt):
            return GM.launch_nvfp4_gemm(x, *qt, cfg, out=out)

        def ordered(qt):  # the same launch handed x already in the k order: no permute_k launch
            W.x_operand = lambda x_in, config, buf=None: x_in  # noqa: E731
            try:
                return GM.launch_nvfp4_gemm(xk, *qt, cfg, out=out)
            finally:
                W.x_operand = permuting

        row["rel_error_shipped"] = rel(given(copies[0]), ref)
        row["rel_error_ordered"] = rel(ordered(copies[0]), ref)
        t_cublas, t_shipped, t_ordered = paired_graph_times(
            [[lambda ww=ww: torch.matmul(x, ww.T, out=out) for ww in w16], [lambda qt=qt: given(qt) for qt in copies],
             [lambda qt=qt: ordered(qt) for qt in copies]], repeats=30)
        row.update({"cublas_us": t_cublas * 1e6, "shipped_us": t_shipped * 1e6, "x_in_k_order_us": t_ordered * 1e6,
                    "speedup_shipped": t_cublas / t_shipped, "speedup_x_in_k_order": t_cublas / t_ordered})
        rows.append(row)
        print(f"{name:22s} M={m} cublas {t_cublas * 1e6:7.1f} us  shipped {t_shipped * 1e6:7.1f} "
              f"(x{t_cublas / t_shipped:.3f})  x in k order {t_ordered * 1e6:7.1f} (x{t_cublas / t_ordered:.3f})  "
              f"errors {row['rel_error_shipped']:.4f} {row['rel_error_ordered']:.4f}", flush=True)
    write_rows("nvfp4_rs_noperm.json", rows)
    return rows


if __name__ == "__main__":
    main()
