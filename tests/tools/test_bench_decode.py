"""tools/bench_decode.py's summary: the issue's keys from the cases that ran, speedups over transformers."""

import pytest

from atlas.tools.bench_decode import summarize


def _run(case, b1_tps, floor):
    return {"case": case, "preset": case.split(":")[0],
            "cases": [{"batch": 1, "tokens_per_s": b1_tps, "floor_fraction": floor},
                      {"batch": 8, "tokens_per_s": 8 * b1_tps, "floor_fraction": floor / 2}]}


def test_summary_keys_and_min_speedup():
    atlas = [_run("llama-3.1-8b:bfloat16", 120.0, 0.8), _run("llama-3.1-8b:nvfp4", 300.0, 0.6),
             _run("qwen3.5-27b:nvfp4", 90.0, 0.55)]
    hf = {"llama-3.1-8b": {"tokens_per_s": 20.0}, "qwen3.5-27b": {"tokens_per_s": 15.0}}
    s = summarize(atlas, hf)
    assert s["bf16_b1_floor_fraction"] == 0.8
    assert s["nvfp4_b1_floor_fraction"] == 0.6
    assert s["hybrid_nvfp4_b1_floor_fraction"] == 0.55
    assert "hybrid_bf16_b1_floor_fraction" not in s  # its case did not run
    assert s["min_speedup_vs_hf"] == 6.0  # 90 / 15 and 120 / 20 both 6; 300 / 20 = 15
    assert s["speedup_vs_hf"]["llama-3.1-8b:nvfp4"] == 15.0


def test_no_peer_no_speedup():
    assert "min_speedup_vs_hf" not in summarize([_run("llama-3.1-8b:fp8", 200.0, 0.7)], {})


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.5-vl"])
def test_the_peer_holds_the_checkpoint_s_tensors(preset):
    """The model the benchmark builds in place (bf16, the text model of a VL preset, tensors copied one at a time)
    has the same config and, rounded to bf16, the same parameters as transformers' own loading of the written
    checkpoint (the engine's parity with that model is tested in tests/build_engine/test_families.py)."""
    import torch

    from atlas.tools.bench_decode import hf_model
    from atlas.tools.compare import load_hf_model

    want = load_hf_model(f"synthetic:{preset}")
    got = hf_model(preset, "cpu")
    assert type(got) is type(want)
    params = dict(got.named_parameters())
    assert set(params) == set(dict(want.named_parameters()))
    for name, p in want.named_parameters():
        assert torch.equal(params[name], p.to(torch.bfloat16)), name
