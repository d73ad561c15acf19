"""`atlas-run bench`: the bytes a decode step must read (the floor), the CLI's errors, and (GPU) a small run."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from atlas.runtime.bench import state_bytes, weight_bytes
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
    from atlas.runtime.bench import bench
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
