"""atlas-compare --reference onnx: every layer type's ONNX graph against Atlas's execution, via Polygraphy."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from atlas.build_engine.builder import BuildConfig, build
from atlas.tools.compare import main as compare_cli
from atlas.tools.compare_onnx import compare_onnx


def check_all_pass(engine_dir, expected_types):
    results = compare_onnx(engine_dir)
    for r in results:
        print(f"{r.layer_type:18s} {r.output:20s} max abs {r.max_abs_error:.2e} rel {r.rel_error:.2e}")
    assert {r.layer_type for r in results} == set(expected_types)
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert all(r.rel_error < 1e-5 for r in results)
    return results


def test_default_engine(smollm2_engine):
    check_all_pass(smollm2_engine, ["embedding", "decoder_attention", "lm_head"])


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_tiny_hybrid_engines(family, tiny_engine):
    check_all_pass(tiny_engine(family), ["embedding", "decoder_attention", "decoder_gdn", "lm_head"])


@pytest.mark.parametrize("dtype,classes", [
    ("bfloat16", {}), ("fp8", {}), ("fp8_block", {}), ("nvfp4", {}), ("nvfp4", {"lm_head": "nvfp4", "mlp": "fp8"}),
], ids=["bf16", "fp8", "fp8_block", "nvfp4", "mixed"])
def test_quantized_hybrid_with_mtp(dtype, classes, tmp_path):
    built = build(BuildConfig("synthetic:tiny-qwen3.5-vl@2", tmp_path / "e", dtype=dtype, class_dtypes=classes,
                              progress=False))
    check_all_pass(built.path, ["embedding", "decoder_attention", "decoder_gdn", "lm_head", "mtp"])


def test_a_mismatch_fails(tiny_engine):
    """With zero tolerance the rounding differences between ORT and torch must show as failures."""
    results = compare_onnx(tiny_engine("qwen3_next"), atol=0.0, rtol=0.0)
    assert not all(r.passed for r in results)


def test_cli_json_and_polygraphy_run(tiny_engine, tmp_path):
    engine = tiny_engine("llama")
    inputs = tmp_path / "inputs"
    result = CliRunner().invoke(compare_cli, [str(engine), "--reference", "onnx", "--json", "--save-inputs", str(inputs)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["passed"] and {o["layer_type"] for o in report["outputs"]} == {"embedding", "decoder_attention", "lm_head"}
    # The README's stand-alone Polygraphy command on one graph, with the saved inputs.
    polygraphy = shutil.which("polygraphy", path=str(Path(sys.executable).parent))
    outputs = tmp_path / "outputs.json"
    run = subprocess.run([polygraphy, "run", str(engine / "onnx" / "decoder_attention.onnx"), "--onnxrt",
                          "--load-inputs", str(inputs / "decoder_attention_inputs.json"),
                          "--save-outputs", str(outputs)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    from polygraphy.json import load_json

    saved = load_json(str(outputs))
    assert "hidden_out" in saved[0][1][0]


def test_engine_without_onnx(tiny_checkpoint, tmp_path):
    built = build(BuildConfig(str(tiny_checkpoint("llama")), tmp_path / "e", onnx=False, progress=False))
    result = CliRunner().invoke(compare_cli, [str(built.path), "--reference", "onnx"])
    assert result.exit_code != 0 and "no ONNX graphs" in result.output and "Traceback" not in result.output
