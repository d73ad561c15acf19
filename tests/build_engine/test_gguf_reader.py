"""GGUFCheckpoint against what transformers makes of the same GGUF file (CPU)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from atlas.build_engine.checkpoints import builtin
from atlas.build_engine.checkpoints.gguf_reader import GGUFCheckpoint
from atlas.build_engine.errors import CheckpointError, UnsupportedModelError

TEXT = "Hello, how are you?"


@pytest.fixture(scope="module")
def gguf_path():
    try:
        return builtin.resolve("smollm2-135m-instruct")
    except CheckpointError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def ckpt(gguf_path):
    return GGUFCheckpoint(gguf_path)


@pytest.fixture(scope="module")
def hf_state(gguf_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.config, model.state_dict()


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.mark.slow
def test_config(ckpt, hf_state):
    cfg = ckpt.config
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 30
    assert cfg["hidden_size"] == 576
    assert cfg["num_attention_heads"] == 9
    assert cfg["num_key_value_heads"] == 3
    assert cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True
    assert cfg["torch_dtype"] == "float32"
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    hf_cfg = hf_state[0]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert cfg[key] == getattr(hf_cfg, key), key
    assert cfg["rms_norm_eps"] == pytest.approx(hf_cfg.rms_norm_eps, rel=1e-6)
    assert ckpt.generation_config() == {"bos_token_id": 1, "eos_token_id": 2}


@pytest.mark.slow
def test_every_tensor_equals_transformers(ckpt, hf_state):
    state = hf_state[1]
    names = ckpt.tensor_names()
    assert len(names) == 272
    assert "lm_head.weight" not in names  # tied
    assert set(state) == set(names) | {"lm_head.weight"}
    for name in names:
        ours = ckpt.get(name)
        ref = state[name]
        assert ours.dtype == torch.float32, name
        assert ours.shape == ref.shape, name
        assert torch.equal(ours, ref), name


def test_q_k_permutation_is_undone(ckpt, gguf_path):
    # the raw (GGUF-layout) rows differ from ours for q/k only
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    raw = {t.name: t for t in reader.tensors}
    for gname, hf in (("blk.0.attn_q.weight", "q_proj"), ("blk.0.attn_k.weight", "k_proj"), ("blk.0.attn_v.weight", "v_proj")):
        t = raw[gname]
        plain = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy())
        ours = ckpt.get(f"model.layers.0.self_attn.{hf}.weight")
        assert torch.equal(plain, ours) == (hf == "v_proj")


def test_missing_tensor(ckpt):
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        ckpt.get("lm_head.weight")


@pytest.mark.slow
def test_export_tokenizer(ckpt, hf_tokenizer, tmp_path):
    import tokenizers

    assert ckpt.export_tokenizer(tmp_path) is True
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for add in (True, False):
        assert tok.encode(TEXT, add_special_tokens=add).ids == hf_tokenizer.encode(TEXT, add_special_tokens=add)
    ids = tok.encode(TEXT).ids
    assert ids and ids[0] != 1  # this GGUF says add_bos_token=False, and transformers keeps that

    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert isinstance(cfg.get("chat_template"), str) and "im_start" in cfg["chat_template"]
    assert cfg["chat_template"] == hf_tokenizer.chat_template
    assert cfg["bos_token"] == "<|im_start|>"
    assert cfg["eos_token"] == "<|im_end|>"  # from tokenizer.ggml.eos_token_id=2


def test_truncated_file(gguf_path, tmp_path):
    bad = tmp_path / "truncated.gguf"
    with open(gguf_path, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(CheckpointError, match=r"truncated\.gguf.*(corrupt|truncated)"):
        GGUFCheckpoint(bad)


def test_truncated_in_tensor_data(gguf_path, tmp_path):
    bad = tmp_path / "short.gguf"
    size = gguf_path.stat().st_size
    with open(gguf_path, "rb") as f:
        bad.write_bytes(f.read(size - 4096))
    with pytest.raises(CheckpointError, match=r"short\.gguf.*(corrupt|truncated)"):
        GGUFCheckpoint(bad)


def test_random_bytes(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(os.urandom(64 * 1024))
    with pytest.raises(CheckpointError, match=r"x\.gguf.*(corrupt|truncated)") as info:
        GGUFCheckpoint(bad)
    assert "Traceback" not in str(info.value)


# ------------------------------------------------------------------ synthetic files, other archs


def _write_tiny(path, arch, with_bias=False):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    rng = np.random.default_rng(0)
    shapes = {  # numpy (= torch) shapes
        "token_embd.weight": (32, 8),
        "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,),
        "blk.0.attn_q.weight": (8, 8),
        "blk.0.attn_k.weight": (4, 8),
        "blk.0.attn_v.weight": (4, 8),
        "blk.0.attn_output.weight": (8, 8),
        "blk.0.ffn_norm.weight": (8,),
        "blk.0.ffn_gate.weight": (16, 8),
        "blk.0.ffn_up.weight": (16, 8),
        "blk.0.ffn_down.weight": (8, 16),
    }
    if with_bias:
        shapes.update({"blk.0.attn_q.bias": (8,), "blk.0.attn_k.bias": (4,), "blk.0.attn_v.bias": (4,)})
    arrays = {}
    for name, shape in shapes.items():
        arrays[name] = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, arrays[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_qwen2_synthetic(tmp_path):
    path = tmp_path / "tiny-qwen2.gguf"
    arrays = _write_tiny(path, "qwen2", with_bias=True)
    ck = GGUFCheckpoint(path)
    assert ck.config["model_type"] == "qwen2"
    assert ck.config["architectures"] == ["Qwen2ForCausalLM"]
    assert ck.config["vocab_size"] == 32 and ck.config["tie_word_embeddings"] is True
    assert "model.layers.0.self_attn.q_proj.bias" in ck.tensor_names()
    # qwen2 GGUFs are not permuted
    assert torch.equal(ck.get("model.layers.0.self_attn.q_proj.weight"), torch.from_numpy(arrays["blk.0.attn_q.weight"]))
    assert torch.equal(ck.get("model.layers.0.self_attn.k_proj.bias"), torch.from_numpy(arrays["blk.0.attn_k.bias"]))
    assert ck.get("model.layers.0.mlp.down_proj.weight").shape == (8, 16)
    assert ck.export_tokenizer(tmp_path / "tok") is False  # no tokenizer in this file


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "tiny-gptneox.gguf"
    _write_tiny(path, "gptneox")
    with pytest.raises(UnsupportedModelError, match=r"gptneox.*llama, qwen2, qwen3"):
        GGUFCheckpoint(path)
