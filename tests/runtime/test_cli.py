"""The CLIs end to end: build, logits, generate (streaming), compare, and their help texts."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from atlas.build_engine.cli import main as build_cli
from atlas.runtime.cli import main as run_cli
from atlas.runtime.generator import Generator
from atlas.tools.compare import main as compare_cli


def invoke(cli, *args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.parametrize("cli,args", [(build_cli, []), (run_cli, ["generate"]), (run_cli, ["logits"]),
                                      (compare_cli, [])])
def test_help_has_examples(cli, args):
    result = invoke(cli, *args, "--help")
    assert result.exit_code == 0
    assert "Examples" in result.output or "Example" in result.output


def test_build_summary_names_next_command(tiny_checkpoint, tmp_path):
    out = tmp_path / "engine"
    result = invoke(build_cli, tiny_checkpoint("qwen3_5"), "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert f"Built engine {out}" in result.output
    assert "atlas-run logits" in result.output  # no tokenizer in this checkpoint
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["family"] == "qwen3_5"
    assert set(manifest["files"]) >= set(manifest["weights"])


def test_logits_file(tiny_engine, tmp_path):
    out = tmp_path / "logits.npy"
    result = invoke(run_cli, "logits", tiny_engine("qwen3_next"), "--token-ids", "5, 6,7,8", "--output", out)
    assert result.exit_code == 0, result.output
    values = np.load(out)
    assert values.shape == (4, 384) and values.dtype == np.float32
    expected = Generator.load(tiny_engine("qwen3_next")).logits([5, 6, 7, 8]).numpy()
    np.testing.assert_array_equal(values, expected)


def test_compare_cli(tiny_engine, tiny_checkpoint):
    result = invoke(compare_cli, tiny_engine("qwen3"), "--checkpoint", tiny_checkpoint("qwen3"),
                    "--token-ids", "1,2,3,4,5,6,7,8", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["greedy_match"] and report["rel_error"] < 1e-4 and report["decode_steps"] == 16


@pytest.mark.slow
def test_generate_streams_the_answer(smollm2_engine):
    result = invoke(run_cli, "generate", smollm2_engine, "--prompt", "What is the capital of France?",
                    "--max-tokens", "24")
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output
    assert "tok/s" in result.output  # the rate line (stderr, mixed into output by the runner)


@pytest.mark.slow
def test_eager_prefill_is_accepted_and_changes_nothing_on_the_cpu(smollm2_engine):
    args = ["generate", smollm2_engine, "--prompt", "What is the capital of France?", "--max-tokens", "8"]
    plain, eager = invoke(run_cli, *args), invoke(run_cli, *args, "--eager-prefill")
    assert plain.exit_code == eager.exit_code == 0, eager.output
    assert plain.stdout.strip() and plain.stdout == eager.stdout


@pytest.mark.slow
def test_sampling_is_seeded(smollm2_engine):
    args = ["generate", smollm2_engine, "--prompt", "Once upon a time", "--no-chat", "--max-tokens", "12",
            "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50"]
    first = invoke(run_cli, *args, "--seed", "3").stdout
    again = invoke(run_cli, *args, "--seed", "3").stdout
    assert first == again and first.strip()
