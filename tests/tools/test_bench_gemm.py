"""tools/bench_gemm.py's summary over recorded rows (no GPU): the issue's keys, and the read ceiling when recorded."""

import pytest

pytest.importorskip("triton")


def _row(shape, m, t_nv, t_fp8, bw, ceiling=None):
    row = {"shape": shape, "M": m, "nvfp4": {"speedup_vs_cublas": t_nv, "bw_fraction": bw},
           "fp8": {"speedup_vs_cublas": t_fp8, "bw_fraction": bw + 0.1}}
    if ceiling is not None:
        for f in ("nvfp4", "fp8"):
            row[f]["read_ceiling_bw_fraction"] = ceiling
    return row


def test_summary_keys_and_minima():
    from atlas.tools.bench_gemm import summarize

    rows = [_row("qwen3.5-27b.gate_up", 1, 2.1, 2.0, 0.5, 0.8), _row("qwen3.5-27b.down", 1, 2.3, 1.9, 0.45, 0.7),
            _row("llama-3.1-8b.qkv", 1, 1.6, 1.5, 0.3, 0.55), _row("llama-3.1-8b.qkv", 256, 0.5, 1.1, 0.1),
            _row("llama-3.1-8b.down", 2048, 0.45, 1.3, 0.1), _row("llama-3.1-8b.down", 64, 0.2, 0.3, 0.1)]
    s = summarize(rows)
    assert s["nvfp4_m1_speedup"] == 2.1 and s["fp8_m1_speedup"] == 1.9  # the 27B MLP shapes only
    assert s["min_gemv_bw_fraction"] == 0.3 and s["min_gemv_read_ceiling_bw_fraction"] == 0.55
    assert s["fp8_m256_speedup"] == 1.1 and s["nvfp4_m256_speedup"] == 0.45  # the goal's M >= 256, not M 64
    assert "min_gemv_read_ceiling_bw_fraction" not in summarize([{**r, "nvfp4": {k: v for k, v in r["nvfp4"].items()
                                                                                 if "ceiling" not in k},
                                                                  "fp8": {k: v for k, v in r["fp8"].items()
                                                                          if "ceiling" not in k}} for r in rows])
