"""Engines with FP8 / NVFP4 weights: built from float checkpoints, and from pre-quantized ModelOpt ones."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atlas.build_engine.builder import BuildConfig, build
from atlas.build_engine.errors import BuildError
from atlas.build_engine.quantize.quantizer import quantize
from atlas.plugins_trt.quant_linear.reference import dequantize
from atlas.runtime.engine import load_engine
from atlas.runtime.generator import Generator
from hf_tiny import make_checkpoint


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fmt", ["bfloat16", "fp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("family", ["llama_tied", "qwen3_next"])
def test_quantized_engine_is_the_float_model_with_rounded_weights(family, fmt, tiny_checkpoint, tiny_engine,
                                                                  prompt_ids, tmp_path):
    """Each linear of the quantized engine dequantizes to exactly quantize(W) of the float engine's W,
    and the logits move by no more than the format's rounding explains."""
    ref = load_engine(tiny_engine(family))
    built = build(BuildConfig(str(tiny_checkpoint(family)), tmp_path / "q", dtype=fmt,
                              class_dtypes={"lm_head": fmt}, progress=False))
    q = load_engine(built.path)
    formats = dict(built.manifest["weight_formats"])
    assert formats.pop("embed") == "bfloat16"  # a float base, never quantized
    assert formats and all(f == fmt for f in formats.values())
    for prefix in formats:
        w = ref.weights[f"{prefix}.weight"] if f"{prefix}.weight" in ref.weights else ref.weights["embed.weight"]
        qt = quantize(w, fmt)
        expected = dequantize(qt.fmt, qt.weight, qt.weight_scale, qt.weight_scale_2)
        assert torch.equal(q.weights[f"{prefix}.weight"], expected), prefix
    if family == "llama_tied" and fmt != "bfloat16":
        assert not q.config.tie_word_embeddings  # a quantized head is stored apart from the float embedding
        assert q.weights["embed.weight"].dtype == torch.float32
    a = Generator(ref).logits(prompt_ids)
    b = Generator(q).logits(prompt_ids)
    bound = {"bfloat16": 0.01, "fp8": 0.08, "fp8_block": 0.08, "nvfp4": 0.3}[fmt]
    err = rel(b, a)
    print(f"{family} {fmt}: logits rel error vs float32 {err:.4f}")
    assert 0 < err < bound


def test_lm_head_stays_bfloat16_by_default(tiny_checkpoint, tmp_path):
    built = build(BuildConfig(str(tiny_checkpoint("llama")), tmp_path / "q", dtype="nvfp4",
                              class_dtypes={"mlp": "fp8"}, progress=False))
    formats = built.manifest["weight_formats"]
    assert formats["lm_head"] == "bfloat16" and formats["layers.0.mlp.down_proj"] == "fp8"
    assert formats["layers.0.attn.qkv_proj"] == "nvfp4"
    head = load_file(str(built.path / "weights" / "head.safetensors"))
    assert head["lm_head.weight"].dtype == torch.bfloat16
    embed = load_file(str(built.path / "weights" / "embedding.safetensors"))
    assert embed["embed.weight"].dtype == torch.bfloat16  # float base of a quantized model


@pytest.mark.parametrize("classes,fragment", [
    ({"embed": "nvfp4"}, "table lookup"),
    ({"convolution": "fp8"}, "unknown layer class"),
    ({"mlp": "int3"}, "format must be one of"),
])
def test_unsupported_combinations(classes, fragment, tiny_checkpoint, tmp_path):
    with pytest.raises(BuildError, match=fragment):
        build(BuildConfig(str(tiny_checkpoint("llama")), tmp_path / "q", dtype="nvfp4", class_dtypes=classes,
                          progress=False))


def test_nvfp4_needs_in_features_multiple_of_16(tmp_path):
    ckpt = make_checkpoint("llama", tmp_path / "ckpt", hidden_size=72, head_dim=18)
    with pytest.raises(BuildError, match="multiple of 16.*--class-dtype"):
        build(BuildConfig(str(ckpt), tmp_path / "q", dtype="nvfp4", progress=False))


def _modelopt_checkpoint(src, dst, fmt: str):
    """Rewrite a float HF checkpoint in NVIDIA ModelOpt's layout (per-tensor scalar global / FP8 scales)."""
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    algo = {"nvfp4": "NVFP4", "fp8": "FP8"}[fmt]
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": algo, "group_size": 16,
                                     "exclude_modules": ["lm_head"]}
    (dst / "config.json").write_text(json.dumps(config))
    tensors = {}
    originals = {}
    for name, w in load_file(str(src / "model.safetensors")).items():
        if w.dim() == 2 and "proj" in name and name.endswith(".weight"):
            stem = name.removesuffix(".weight")
            if fmt == "nvfp4":
                qt = quantize(w.float(), "nvfp4")
                tensors[name] = qt.weight
                tensors[f"{stem}.weight_scale"] = qt.weight_scale
                tensors[f"{stem}.weight_scale_2"] = qt.weight_scale_2[0].clone()  # one scalar per tensor
                tensors[f"{stem}.input_scale"] = torch.tensor(0.5)
            else:
                scale = w.float().abs().max() / 448
                tensors[name] = (w.float() / scale).to(torch.float8_e4m3fn)
                tensors[f"{stem}.weight_scale"] = scale.reshape(())
                tensors[f"{stem}.input_scale"] = torch.tensor(0.5)
            originals[name] = tensors[name].float() if fmt == "fp8" else None
        else:
            tensors[name] = w
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_prequantized_modelopt_checkpoint(family, fmt, tiny_checkpoint, tmp_path, prompt_ids):
    """A ModelOpt checkpoint builds without re-rounding: the engine's dequantized fused weights equal the
    checkpoint's dequantized parts, fused the float way (qwen3_next's row reorders included)."""
    src = _modelopt_checkpoint(tiny_checkpoint(family), tmp_path / "modelopt", fmt)
    built = build(BuildConfig(str(src), tmp_path / "engine", progress=False))
    assert built.manifest["build"]["dtype"] == fmt
    assert built.unused_tensors == []
    q = load_engine(built.path)

    # The same model dequantized to float in the checkpoint, then built as float32.
    deq = tmp_path / "dequantized"
    deq.mkdir()
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (deq / "config.json").write_text(json.dumps(config))
    raw = load_file(str(src / "model.safetensors"))
    tensors = {}
    for name, t in raw.items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{stem}.weight_scale" in raw:
            if fmt == "nvfp4":
                g = raw[f"{stem}.weight_scale_2"].expand(t.shape[0])
                tensors[name] = dequantize("nvfp4", t, raw[f"{stem}.weight_scale"], g)
            else:
                tensors[name] = t.float() * raw[f"{stem}.weight_scale"]
        elif not name.endswith(("_scale", "_scale_2")):
            tensors[name] = t
    save_file(tensors, str(deq / "model.safetensors"), metadata={"format": "pt"})
    ref = load_engine(build(BuildConfig(str(deq), tmp_path / "ref", dtype="float32", progress=False)).path)
    for prefix, f in built.manifest["weight_formats"].items():
        expected = ref.weights[f"{prefix}.weight"]
        if prefix in ("lm_head", "embed"):  # excluded from quantization: kept as the float base, bfloat16
            assert f == "bfloat16"
            expected = expected.bfloat16().float()
        else:
            assert f == fmt
        assert torch.equal(q.weights[f"{prefix}.weight"], expected), prefix
    a, b = Generator(q).logits(prompt_ids), Generator(ref).logits(prompt_ids)
    assert rel(a, b) < 5e-3  # only the LM head's bfloat16 rounding differs
