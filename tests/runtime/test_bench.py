"""`atlas-run bench`: the bytes a decode step must read (the floor), the CLI's errors, and (GPU) a small run."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from atlas.runtime.bench import kernel_table, profile_text, state_bytes, weight_bytes
from atlas.runtime.cli import main as run_cli
from atlas.runtime.config import GDN, ModelConfig


def _config(**kw):
    base = dict(family="t", vocab_size=100, hidden_size=8, intermediate_size=16, num_layers=2,
                layer_types=("attention", "attention"), num_heads=4, num_kv_heads=2, head_dim=2, rms_norm_eps=1e-6,
                rotary_dim=2)
    return ModelConfig(**{**base, **kw})


def test_weight_bytes_read_the_embedding_rows_or_the_tied_head():
    w = {"embed.weight": torch.empty(100, 8, dtype=torch.bfloat16), "x.weight": torch.empty(10, 8, dtype=torch.uint8)}
    assert weight_bytes(w, _config(), batch=3) == 80 + 3 * 8 * 2
    assert weight_bytes(w, _config(tie_word_embeddings=True), batch=3) == 80 + 100 * 8 * 2


def test_state_bytes_count_kv_at_the_context_and_gdn_state_both_ways():
    c = _config()
    assert state_bytes(c, batch=2, context=10, kv_element_size=1) == 2 * (2 * 2 * 10 * 2 * 2 * 1)
    h = _config(layer_types=(GDN, "attention"), linear_num_key_heads=1, linear_num_value_heads=2,
                linear_key_head_dim=4, linear_value_head_dim=4, linear_conv_kernel=4)
    assert state_bytes(h, batch=1, context=10, kv_element_size=2) == 1 * 2 * 10 * 2 * 2 * 2 + 2 * 4 * 2 * 4 * 4


def test_kernel_table_sums_each_kernel_a_step():
    """Two steps of a cuBLAS GEMV (C++ signature, cut at its arguments), a Triton norm launched twice a step (the
    second under programmatic dependent launch: started while the GEMV runs) and a copy: per-step launches and
    microseconds (each kernel's own share of the timeline, and its resident time), largest first, and the idle
    share of the wall time."""
    gemv = "void cutlass::Kernel2<cutlass_80_gemv_bf16>(Params, int)"
    copy = "Memcpy HtoD (Pinned -> Device)"
    events = [  # (name, start us, end us), listed out of order as a profiler may
        (gemv, 0.0, 12.5), ("rms_norm_kernel", 13.0, 14.25), (copy, 19.5, 20.0),
        ("rms_norm_kernel", 10.0, 16.0),  # launched early, finishes 1.75 after the first norm
        ("rms_norm_kernel", 20.0, 21.5), (gemv, 22.0, 35.5),
        ("rms_norm_kernel", 30.0, 37.0),  # resident 7, its own share 1.5
        (copy, 38.0, 38.5)]
    t = kernel_table(events, steps=2, wall_s=40e-6)
    assert [r["name"] for r in t["kernels"]] == ["cutlass::Kernel2<cutlass_80_gemv_bf16>", "rms_norm_kernel",
                                                 "Memcpy HtoD"]
    assert [r["launches"] for r in t["kernels"]] == [1, 2, 1]
    assert [r["us"] for r in t["kernels"]] == pytest.approx([13.0, 3.0, 0.5])
    assert [r["resident_us"] for r in t["kernels"]] == pytest.approx([13.0, 7.875, 0.5])
    assert t["step_us"] == pytest.approx(20.0) and t["kernel_us"] == pytest.approx(16.5)
    assert t["idle_fraction"] == pytest.approx(1 - 16.5 / 20)
    text = profile_text({"batch": 1, **t}, rows=2)
    assert "rms_norm_kernel" in text and "Memcpy" not in text and "(1 more kernels)" in text and "17.5%" in text


def test_bench_refuses_a_cpu_engine(tiny_engine):
    result = CliRunner().invoke(run_cli, ["bench", str(tiny_engine("llama"))])
    assert result.exit_code != 0
    assert "rebuild it with atlas-build --device cuda" in result.output
    assert "Traceback" not in result.output


def test_bench_checks_its_arguments(tiny_engine):
    result = CliRunner().invoke(run_cli, ["bench", str(tiny_engine("llama")), "--batch-sizes", "1,x"])
    assert result.exit_code != 0 and "comma-separated integers" in result.output


@pytest.mark.gpu
def test_bench_runs_on_a_small_engine(tmp_path):
    from atlas.build_engine.builder import BuildConfig, build
    from atlas.runtime.bench import bench, kernel_profile, prefill_profile
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner

    out = build(BuildConfig("synthetic:tiny-llama", tmp_path / "e", device="cuda", autotune=False, onnx=False,
                            max_batch=4, max_seq_len=256, progress=False)).path
    runner = ModelRunner(load_cuda_engine(out), num_blocks=128)
    runner.capture()
    result = bench(runner, [1, 4], prompt_len=40, gen_len=16, repeats=2)
    assert [c["batch"] for c in result["cases"]] == [1, 4]
    for c in result["cases"]:
        assert c["tpot_s"] > 0 and c["ttft_s"] > 0 and 0 < c["floor_fraction"] < 1.5
        assert c["tokens_per_s"] == pytest.approx(c["batch"] / c["tpot_s"], rel=0.5)
    assert runner.blocks.num_free == runner.blocks.num_blocks  # every sequence freed
    p = kernel_profile(runner, 1, prompt_len=40, steps=8)  # the kernels inside the graph replays are seen
    names = " ".join(r["name"] for r in p["kernels"])
    assert "paged_decode" in names and "rms_norm" in names and "argmax" in names
    norm = next(r for r in p["kernels"] if "rms_norm" in r["name"])
    assert norm["launches"] >= runner.c.num_layers  # a step's launches, not the profile's
    assert 0 < p["kernel_us"] <= p["step_us"] and 0 <= p["idle_fraction"] < 1
    # by grid, from the Chrome trace: the kernels again, each shape apart (the copies have no grid)
    assert p["by_grid"] and all(len(r["grid"]) == 3 for r in p["by_grid"])
    assert sum(r["launches"] for r in p["by_grid"]) <= sum(r["launches"] for r in p["kernels"])
    assert runner.blocks.num_free == runner.blocks.num_blocks
    # a prefill's spread (from its graph, and eager: capture() took the prefill graphs) and its launches: every
    # layer's norm, its prefill attention
    p = prefill_profile(runner, prompt_len=40, repeats=3)
    assert len(p["ttft_ms"]) == 3 and all(t > 0 for t in p["ttft_ms"]) and p["steps"] == 1
    assert len(p["eager_ttft_ms"]) == 3 and all(t > 0 for t in p["eager_ttft_ms"]) and runner.prefill_graphs
    print(f"tiny-llama 40-token prefill: TTFT ms {p['ttft_ms']} from graphs, {p['eager_ttft_ms']} eager")
    norm = next(r for r in p["kernels"] if "rms_norm" in r["name"])
    assert norm["launches"] >= runner.c.num_layers and 0 < p["kernel_us"] <= p["step_us"]
    assert runner.blocks.num_free == runner.blocks.num_blocks


def test_profile_text_names_a_failed_profile():
    assert profile_text({"batch": 1, "error": "RuntimeError: CUPTI_ERROR"}) == \
        "no kernel profile at batch 1: RuntimeError: CUPTI_ERROR"


def test_kernel_table_by_grid_tells_shapes_of_one_kernel_apart():
    """Events with grids (trace_kernels from a profiler's Chrome trace): the same kernel at two grids (two linears'
    shapes) gets a row each in by_grid, the by-name table sums them; copies (no grid) stay out of by_grid."""
    from atlas.runtime.bench import trace_kernels

    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "nvfp4_gemv_wk_kernel", "ts": 0.0, "dur": 40.0,
         "args": {"grid": [2176, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "nvfp4_gemv_wk_kernel", "ts": 40.0, "dur": 10.0,
         "args": {"grid": [384, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 50.0, "dur": 1.0, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 0.0, "dur": 5.0},  # not a GPU activity
        {"ph": "X", "cat": "kernel", "name": "nvfp4_gemv_wk_kernel", "ts": 60.0, "dur": 38.0,
         "args": {"grid": [2176, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "nvfp4_gemv_wk_kernel", "ts": 98.0, "dur": 12.0,
         "args": {"grid": [384, 1, 1]}}]}
    events = trace_kernels(trace)
    assert len(events) == 5 and events[2][3] is None
    t = kernel_table(events, steps=2, wall_s=120e-6)
    assert t["kernels"][0] == pytest.approx({"name": "nvfp4_gemv_wk_kernel", "launches": 2.0, "us": 50.0,
                                             "resident_us": 50.0})
    assert [(r["grid"], r["launches"], r["us"]) for r in t["by_grid"]] == [([2176, 1, 1], 1.0, 39.0),
                                                                           ([384, 1, 1], 1.0, 11.0)]
    assert "[2176, 1, 1]" in profile_text({"batch": 1, **t})
    assert "by_grid" not in kernel_table([(n, a, b) for n, a, b, _ in events], steps=2, wall_s=120e-6)
