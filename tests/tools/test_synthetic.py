"""Synthetic checkpoints: transformers loads the tiny presets with no missing keys and runs them sanely."""

import json

import pytest
import torch
from safetensors import safe_open

from atlas.build_engine.errors import CheckpointError
from atlas.tools.synthetic import (
    PRESETS,
    SyntheticCheckpoint,
    parameter_count,
    tensor_specs,
    write_checkpoint,
)
from atlas.tools.synthetic_presets import TINY_PRESETS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("preset", sorted(TINY_PRESETS))
def test_tiny_preset_loads_in_transformers(preset, tmp_path):
    out = write_checkpoint(preset, tmp_path / preset, progress=False)
    # AutoConfig reads the config.json as is.
    config = transformers.AutoConfig.from_pretrained(out)
    assert config.model_type == PRESETS[preset]["model_type"]

    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"], info["missing_keys"]
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"]), info["unexpected_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]

    # What transformers loaded is what the synthetic checkpoint generates (modulo the composite prefix).
    ckpt = SyntheticCheckpoint(preset)
    state = model.state_dict()
    for name in ckpt.tensor_names():
        if name.startswith("mtp."):
            continue
        key = name.replace("model.language_model.", "model.")
        torch.testing.assert_close(state[key], ckpt.get(name), rtol=0, atol=0, msg=name)

    ids = torch.tensor([[1, 17, 300, 42, 5, 511, 8, 99]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], PRESETS[preset].get("vocab_size", 512))
    assert torch.isfinite(logits).all()
    std = logits.std().item()
    print(f"{preset}: logits std {std:.3f}")
    assert 0.05 < std < 20.0
    # Positions differ: the model mixes context rather than being a per-token function only.
    assert not torch.allclose(logits[0, 1], logits[0, 2])


def test_hybrid_presets_have_mtp_and_dense_layers():
    for preset in ("tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-vl"):
        specs = tensor_specs(PRESETS[preset])
        assert specs["mtp.fc.weight"][0] == (64, 128)
        assert "mtp.layers.0.self_attn.q_proj.weight" in specs
        assert "mtp.layers.0.mlp.gate_proj.weight" in specs
        assert not any(".experts." in n for n in specs)
    specs = tensor_specs(PRESETS["tiny-qwen3-next"])
    assert specs["model.layers.0.linear_attn.in_proj_qkvz.weight"][0] == (2 * 32 + 2 * 64, 64)
    assert specs["model.layers.0.linear_attn.conv1d.weight"][0] == (2 * 32 + 64, 1, 4)
    assert specs["model.layers.3.self_attn.q_proj.weight"][0] == (2 * 4 * 32, 64)
    specs = tensor_specs(PRESETS["tiny-qwen3.5-vl"])
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv.weight" in specs
    assert "lm_head.weight" in specs and "mtp.norm.weight" in specs


def test_get_is_deterministic_and_matches_written(tmp_path):
    a, b = SyntheticCheckpoint("tiny-qwen3.5"), SyntheticCheckpoint("tiny-qwen3.5@1")
    names = a.tensor_names()
    assert a.source == "synthetic:tiny-qwen3.5" and b.source == "synthetic:tiny-qwen3.5@1"
    for name in names:
        assert torch.equal(a.get(name), a.get(name)), name
    for name in ("model.embed_tokens.weight", "model.layers.0.linear_attn.A_log", "mtp.fc.weight"):
        assert not torch.equal(a.get(name), b.get(name)), name
    # Order does not matter: a fresh checkpoint asked in reverse order gives the same tensors.
    fresh = SyntheticCheckpoint("tiny-qwen3.5")
    for name in reversed(names):
        assert torch.equal(fresh.get(name), a.get(name)), name

    # Several shards: the index lists every tensor, the shards hold exactly what get() generates.
    out = write_checkpoint("tiny-qwen3.5@1", tmp_path, shard_bytes=200_000, progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(names)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    total = 0
    for file in files:
        with safe_open(out / file, "pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                assert index["weight_map"][name] == file
                assert torch.equal(tensor, b.get(name)), name
                total += tensor.numel() * tensor.element_size()
    assert index["metadata"]["total_size"] == total
    assert json.loads((out / "config.json").read_text()) == PRESETS["tiny-qwen3.5"]


def test_value_conventions():
    ckpt = SyntheticCheckpoint("tiny-qwen3-next")
    assert torch.equal(ckpt.get("model.layers.0.linear_attn.norm.weight"), torch.ones(16))  # gated: x*w
    offset = ckpt.get("model.layers.0.input_layernorm.weight")  # (1+w) convention: near zero
    assert offset.abs().max() < 0.5 and offset.abs().max() > 0
    a = ckpt.get("model.layers.0.linear_attn.A_log").exp()
    assert ((a >= 1) & (a <= 16)).all()
    assert torch.equal(SyntheticCheckpoint("tiny-llama").get("model.norm.weight"), torch.ones(64))
    assert ckpt.get("model.embed_tokens.weight").dtype == torch.float32


def test_real_shape_parameter_counts():
    counts = {p: parameter_count(PRESETS[p]) for p in ("llama-3.1-8b", "qwen3-8b", "qwen3.5-27b")}
    print(counts)
    assert 8.02e9 < counts["llama-3.1-8b"] < 8.04e9  # 8,030,261,248
    assert 8.1e9 < counts["qwen3-8b"] < 8.3e9
    assert 26e9 < counts["qwen3.5-27b"] < 28e9  # text + MTP, no vision tower
    specs = tensor_specs(PRESETS["qwen3.5-27b"])
    assert specs["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"][0] == (2 * 2048 + 6144, 5120)
    assert specs["model.language_model.layers.3.self_attn.q_proj.weight"][0] == (2 * 24 * 256, 5120)
    assert specs["lm_head.weight"][0] == (248320, 5120)
    assert SyntheticCheckpoint("llama-3.1-8b").dtype == torch.bfloat16


def test_unknown_names_raise():
    with pytest.raises(CheckpointError, match="tiny-llama"):
        SyntheticCheckpoint("no-such-model")
    with pytest.raises(CheckpointError):
        write_checkpoint("no-such-model", "/nonexistent")
    with pytest.raises(CheckpointError, match="missing"):
        SyntheticCheckpoint("tiny-llama").get("model.layers.99.mlp.up_proj.weight")


def test_draw_device_suffix():
    """'/cpu' draws as the plain spec does and is kept in the source; '/cuda' without a GPU is a clear error."""
    plain, drawn = SyntheticCheckpoint("tiny-llama@2"), SyntheticCheckpoint("tiny-llama@2/cpu")
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(plain.get(name), drawn.get(name))
    assert drawn.source == "synthetic:tiny-llama@2/cpu" and plain.source == "synthetic:tiny-llama@2"
    with pytest.raises(CheckpointError, match="drawing device"):
        SyntheticCheckpoint("tiny-llama/tpu")
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError, match="lacks"):
            SyntheticCheckpoint("tiny-llama/cuda")


@pytest.mark.gpu
def test_cuda_drawn_values_reach_the_cpu():
    """'/cuda' draws on the GPU and returns on the checkpoint's device: the same values either way."""
    name = "model.layers.0.mlp.up_proj.weight"
    on_cpu = SyntheticCheckpoint("tiny-llama/cuda").get(name)
    on_gpu = SyntheticCheckpoint("tiny-llama/cuda", device="cuda").get(name)
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, on_gpu.cpu())
