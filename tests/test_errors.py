"""Bad input gets a clear error naming the problem and what to do: never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from atlas.build_engine.cli import main as build_cli
from atlas.runtime.cli import main as run_cli


def run(cli, args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result


def expect_error(cli, args, *fragments):
    result = run(cli, args)
    assert result.exit_code != 0, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output
    return result


@pytest.fixture
def llama_copy(tiny_checkpoint, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama"), dst)
    return dst


def test_truncated_safetensors(llama_copy, tmp_path):
    f = llama_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    expect_error(build_cli, [llama_copy, "-o", tmp_path / "e"], "truncated or corrupt", "re-download")


def test_corrupt_safetensors(llama_copy, tmp_path):
    (llama_copy / "model.safetensors").write_bytes(torch.randint(0, 255, (4096,), dtype=torch.uint8).numpy().tobytes())
    expect_error(build_cli, [llama_copy, "-o", tmp_path / "e"], "model.safetensors")


def test_missing_tensor(llama_copy, tmp_path):
    f = llama_copy / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(f), metadata={"format": "pt"})
    expect_error(build_cli, [llama_copy, "-o", tmp_path / "e"], "model.layers.2.mlp.up_proj.weight", "missing")


def test_shape_mismatch(llama_copy, tmp_path):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    expect_error(build_cli, [llama_copy, "-o", tmp_path / "e"], "disagree")


@pytest.mark.parametrize("model_type,fragment", [("gpt2", "not supported"), ("qwen3_moe", "Mixture-of-Experts")])
def test_unsupported_family(llama_copy, tmp_path, model_type, fragment):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg["model_type"] = model_type
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    result = expect_error(build_cli, [llama_copy, "-o", tmp_path / "e"], fragment)
    assert "llama" in result.output and "qwen3_next" in result.output  # names what is supported


def test_qwen3_next_moe_is_refused(tiny_checkpoint, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("qwen3_next"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(num_experts=8, mlp_only_layers=[])
    (dst / "config.json").write_text(json.dumps(cfg))
    expect_error(build_cli, [dst, "-o", tmp_path / "e"], "Mixture-of-Experts")


def test_no_checkpoint(tmp_path):
    expect_error(build_cli, [tmp_path / "nothing-here", "-o", tmp_path / "e"], "no checkpoint", "built-in")


def test_pdl_order_without_pdl(tmp_path):
    expect_error(build_cli, ["--no-pdl", "--pdl-launch-first", "-o", tmp_path / "e"], "--pdl-launch-first", "--no-pdl")
    assert not (tmp_path / "e").exists()


def test_attention_split_not_positive(tmp_path):
    expect_error(build_cli, ["--attn-split-tokens", "0", "-o", tmp_path / "e"], "--attn-split-tokens", "positive")
    assert not (tmp_path / "e").exists()


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    expect_error(build_cli, [bad, "-o", tmp_path / "e"], "bad.gguf")


def test_existing_output_needs_overwrite(tiny_checkpoint, tmp_path):
    out = tmp_path / "e"
    assert run(build_cli, [tiny_checkpoint("llama"), "-o", out, "--quiet"]).exit_code == 0
    expect_error(build_cli, [tiny_checkpoint("llama"), "-o", out], "--overwrite")
    assert run(build_cli, [tiny_checkpoint("llama"), "-o", out, "--quiet", "--overwrite"]).exit_code == 0


def test_max_seq_len_beyond_model(tiny_checkpoint, tmp_path):
    expect_error(build_cli, [tiny_checkpoint("llama"), "-o", tmp_path / "e", "--max-seq-len", 100000],
                 "max_position_embeddings")


# ---- engines ---------------------------------------------------------------------------------

@pytest.fixture
def engine_copy(tiny_engine, tmp_path):
    dst = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), dst)
    return dst


def logits_args(engine, ids="1,2,3", out=None):
    return ["logits", engine, "--token-ids", ids, "--output", out or engine.parent / "out.npy"]


def test_engine_from_another_format_version(engine_copy):
    manifest = json.loads((engine_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (engine_copy / "manifest.json").write_text(json.dumps(manifest))
    expect_error(run_cli, logits_args(engine_copy), "format version 99", "atlas-build")


def test_engine_for_another_device(engine_copy):
    manifest = json.loads((engine_copy / "manifest.json").read_text())
    manifest["target"]["device"] = "cuda"
    (engine_copy / "manifest.json").write_text(json.dumps(manifest))
    expect_error(run_cli, logits_args(engine_copy), "built for target 'cuda'")


def test_engine_with_corrupt_weights(engine_copy):
    f = engine_copy / "weights" / "layer_001.safetensors"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))
    expect_error(run_cli, logits_args(engine_copy), "layer_001.safetensors", "SHA-256")


def test_engine_with_truncated_or_missing_file(engine_copy):
    f = engine_copy / "weights" / "head.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    expect_error(run_cli, logits_args(engine_copy), "head.safetensors", "truncated")
    f.unlink()
    expect_error(run_cli, logits_args(engine_copy), "head.safetensors", "missing")


def test_not_an_engine(tmp_path):
    expect_error(run_cli, logits_args(tmp_path), "not an Atlas engine")
    expect_error(run_cli, logits_args(tmp_path / "nope"), "no engine directory")


def test_prompt_longer_than_engine(tiny_checkpoint, tmp_path):
    out = tmp_path / "short"
    assert run(build_cli, [tiny_checkpoint("llama"), "-o", out, "--max-seq-len", 16, "--quiet"]).exit_code == 0
    ids = ",".join(str(i) for i in range(20))
    expect_error(run_cli, logits_args(out, ids), "20 tokens", "at most 16", "--max-seq-len")


def test_token_ids_outside_vocab(engine_copy):
    expect_error(run_cli, logits_args(engine_copy, "1,2,100000"), "outside the vocabulary")
    expect_error(run_cli, logits_args(engine_copy, "1,x"), "comma-separated integers")


def test_generate_without_tokenizer(engine_copy):
    expect_error(run_cli, ["generate", engine_copy, "--prompt", "hi"], "no tokenizer", "--token-ids")


@pytest.mark.parametrize("option,value,fragment", [
    ("--temperature", "-1", "temperature"),
    ("--temperature", "nan", "temperature"),
    ("--top-p", "0", "top_p"),
    ("--top-p", "1.5", "top_p"),
    ("--top-k", "-2", "top_k"),
    ("--max-tokens", "0", "max_tokens"),
])
def test_invalid_sampling_parameters(engine_copy, option, value, fragment):
    expect_error(run_cli, ["generate", engine_copy, "--prompt", "hi", option, value], fragment)


def test_failed_build_leaves_nothing_and_keeps_the_old_engine(tiny_checkpoint, llama_copy, tmp_path):
    out = tmp_path / "e"
    assert run(build_cli, [tiny_checkpoint("llama"), "-o", out, "--quiet"]).exit_code == 0
    before = (out / "manifest.json").read_text()
    f = llama_copy / "model.safetensors"
    tensors = load_file(str(f))
    del tensors["model.layers.3.mlp.down_proj.weight"]  # fails late, after most files are written
    save_file(tensors, str(f), metadata={"format": "pt"})
    expect_error(build_cli, [llama_copy, "-o", out, "--overwrite", "--quiet"], "missing")
    assert (out / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["e", "ckpt"])  # no scratch directory left
