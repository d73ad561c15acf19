"""ONNX layer graphs (build_engine.onnx_export) against the reference layers of runtime.layers.

Every graph runs in ONNX Runtime (CPU EP) on random inputs and is compared, batch element by batch
element, with the plain-torch layer given a SequenceState prefilled to the same cache / state contents.
Quantized formats: weights are quantized here (round to nearest, per the storage formulas) and the
reference runs on the dequantized fp32 weights, so both sides see the same W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from atlas.build_engine.onnx_export import OPSET, export_onnx, layer_types, linear_prefixes
from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.plugins_trt.rope.reference import rope_cos_sin, rope_inv_freq
from atlas.runtime.config import ATTENTION, GDN, ModelConfig
from atlas.runtime.layers.decoder import DecoderLayer
from atlas.runtime.layers.mtp import MTPBlock
from atlas.runtime.layout import canonical_shapes
from atlas.runtime.model import Model
from atlas.runtime.state import SequenceState

TOL = 1e-5

# Tiny configs, sizes as in tests/hf_tiny.py; intermediate 192 and vocab 300 give fp8_block partial tiles.
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=192, num_heads=4, num_kv_heads=2,
              max_position_embeddings=512)
CONFIGS = {
    "llama": ModelConfig(
        family="llama", **COMMON, num_layers=2, layer_types=(ATTENTION,) * 2, head_dim=16, rms_norm_eps=1e-5,
        rope_theta=500000.0, rotary_dim=16, attention_bias=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}),
    "qwen3_tied": ModelConfig(
        family="qwen3", **COMMON, num_layers=2, layer_types=(ATTENTION,) * 2, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rotary_dim=32, qk_norm=True, tie_word_embeddings=True),
    "qwen3_next": ModelConfig(
        family="qwen3_next", **COMMON, num_layers=4, layer_types=(GDN, GDN, GDN, ATTENTION), head_dim=32,
        rms_norm_eps=1e-6, norm_offset=1.0, rotary_dim=8, qk_norm=True, attn_output_gate=True,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel=4, mtp_num_layers=1),
}
MIXED = {"qkv_proj": "fp8", "o_proj": "bfloat16", "gate_up_proj": "nvfp4", "down_proj": "fp8_block",
         "in_proj": "nvfp4", "out_proj": "fp8", "fc": "fp8_block", "lm_head": "bfloat16", "embed": "nvfp4"}
"""A different format per projection (each shared by all layers of a type)."""
CASES = {"B2-T5-S3": (2, 5, 3), "B2-T1-S3": (2, 1, 3), "B2-T5-S0": (2, 5, 0)}
"""(batch, new tokens, cached positions): chunk after a prefix, decode, prefill from nothing."""


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ---- quantizing random weights per the storage formulas ----------------------------------------------

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def quantize(fmt: str, w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """W [N, K] fp32 -> (stored tensors by suffix, the fp32 W they dequantize to)."""
    n, k = w.shape
    if fmt == "float32":
        return {"weight": w}, w
    if fmt == "bfloat16":
        q = w.to(torch.bfloat16)
        return {"weight": q}, q.float()
    if fmt == "fp8":
        scale = w.abs().amax(1) / 448
        q = (w / scale[:, None]).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": scale}, q.float() * scale[:, None]
    if fmt == "fp8_block":
        nb, kb = math.ceil(n / 128), math.ceil(k / 128)
        padded = torch.zeros(nb * 128, kb * 128)
        padded[:n, :k] = w
        scale = padded.abs().view(nb, 128, kb, 128).amax((1, 3)) / 448  # [nb, kb]
        tiles = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        q = (w / tiles).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": scale}, q.float() * tiles
    if fmt == "nvfp4":
        blocks = w.view(n, k // 16, 16)
        scale_2 = w.abs().amax(1) / (6 * 448)  # [N]
        block_scale = (blocks.abs().amax(-1) / 6 / scale_2[:, None]).to(torch.float8_e4m3fn)  # [N, K/16]
        x = blocks / (block_scale.float() * scale_2[:, None])[..., None]
        codes = (x.abs()[..., None] - E2M1[:8]).abs().argmin(-1) | ((x < 0).long() << 3)  # nearest code
        dequantized = (E2M1[codes] * block_scale.float()[..., None]).view(n, k) * scale_2[:, None]
        codes = codes.view(n, k).to(torch.uint8)
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # element 2j low nibble, 2j+1 high
        return {"weight": packed, "weight_scale": block_scale, "weight_scale_2": scale_2}, dequantized
    raise ValueError(fmt)


def random_weights(c: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Fresh random fp32 canonical weights; norms around their convention (offset + w ≈ 1)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in canonical_shapes(c).items():
        r = torch.randn(shape, generator=g)
        if name.endswith("gdn.norm.weight"):  # the gated norm always uses a plain weight
            out[name] = 1 + 0.1 * r
        elif "norm" in name:
            out[name] = (1 - c.norm_offset) + 0.1 * r
        elif name.endswith(".bias") or name.endswith("dt_bias"):
            out[name] = 0.1 * r
        elif name.endswith("A_log"):
            out[name] = torch.empty(shape).uniform_(0, 2.5, generator=g)  # decays exp(A_log) in [1, 12]
        elif name.endswith("conv.weight"):
            out[name] = 0.3 * r
        elif name == "embed.weight":
            out[name] = r
        else:  # linear [N, K]
            out[name] = r / math.sqrt(shape[1])
    return out


@dataclass
class Exported:
    """One config exported with one choice of formats, with the weights both sides read."""

    config: ModelConfig
    fragment: dict
    dir: Path
    stored: dict[str, torch.Tensor]
    """Engine tensors by canonical name: linear weights in their format, everything else fp32."""
    reference: dict[str, torch.Tensor]
    """fp32 canonical weights; linear weights are the dequantized stored ones."""
    sessions: dict[str, ort.InferenceSession] = field(default_factory=dict)

    def session(self, layer_type: str) -> ort.InferenceSession:
        if layer_type not in self.sessions:
            path = self.dir / self.fragment[layer_type]["file"]
            self.sessions[layer_type] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return self.sessions[layer_type]

    def run(self, layer_type: str, activations: dict[str, torch.Tensor], layer: int | None = None) -> dict:
        """Run a graph with the given activations / state and the weights of `layer` (decoder types)."""
        entry = self.fragment[layer_type]
        prefix = entry["weight_prefix"].format(i=layer)
        feeds = {}
        for spec in entry["inputs"]:
            name = spec["name"]
            tensor = activations[name] if name in activations else self.stored[prefix + name]
            if spec.get("bytes_of"):  # the stored float8 bytes, reinterpreted
                assert spec["bytes_of"] == ONNX_DTYPE[tensor.dtype], (name, spec, tensor.dtype)
                tensor = tensor.view(torch.uint8)
            assert spec["dtype"] == ONNX_DTYPE[tensor.dtype], (name, spec["dtype"], tensor.dtype)
            feeds[name] = ort_value(tensor)
        names = [o["name"] for o in entry["outputs"]]
        outs = self.session(layer_type).run_with_ort_values(names, feeds)
        return {n: torch.from_numpy(o.numpy()) for n, o in zip(names, outs)}


ONNX_DTYPE = {torch.float32: "float", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8e4m3fn",
              torch.uint8: "uint8", torch.int64: "int64"}


def ort_value(t: torch.Tensor) -> ort.OrtValue:
    """numpy has no bfloat16 / float8: hand ORT the raw bits with the ONNX element type."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            t.view(torch.int16).numpy().view(np.uint16), onnx.TensorProto.BFLOAT16)
    if t.dtype == torch.float8_e4m3fn:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            t.view(torch.uint8).numpy(), onnx.TensorProto.FLOAT8E4M3FN)
    return ort.OrtValue.ortvalue_from_numpy(t.numpy())


def formats_for(c: ModelConfig, fmt: str) -> dict[str, str]:
    """Every linear prefix (and the embedding table) in `fmt`, or per projection for "mixed"."""
    prefixes = linear_prefixes(c) + ([] if c.tie_word_embeddings else ["embed"])
    if fmt != "mixed":
        return {p: fmt for p in prefixes}
    return {p: MIXED[p.rsplit(".", 1)[-1]] for p in prefixes}


_EXPORTED: dict[tuple[str, str], Exported] = {}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    def get(config_name: str, fmt: str) -> Exported:
        key = (config_name, fmt)
        if key not in _EXPORTED:
            c = CONFIGS[config_name]
            formats = formats_for(c, fmt)
            out = tmp_path_factory.mktemp(f"onnx-{config_name}-{fmt}")
            fragment = export_onnx(c, out, formats)
            weights = random_weights(c, seed=len(_EXPORTED))
            stored, reference = {}, dict(weights)
            for prefix, f in formats.items():
                tensors, reference[f"{prefix}.weight"] = quantize(f, weights[f"{prefix}.weight"])
                stored.update({f"{prefix}.{suffix}": t for suffix, t in tensors.items()})
            stored = {**weights, **stored}
            _EXPORTED[key] = Exported(c, fragment, out, stored, reference)
        return _EXPORTED[key]

    return get


def positions(B: int, T: int, S_past: int) -> torch.Tensor:
    return (S_past + torch.arange(T)).expand(B, T).contiguous()


# ---- structure -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_graphs_pass_the_full_checker_and_take_weights_as_inputs(exported, config_name):
    e = exported(config_name, "mixed")
    c = e.config
    assert list(e.fragment) == layer_types(c)
    assert ("decoder_gdn" in e.fragment) == (GDN in c.layer_types)
    assert ("mtp" in e.fragment) == bool(c.mtp_num_layers)
    for layer_type, entry in e.fragment.items():
        model = onnx.load(e.dir / entry["file"])
        onnx.checker.check_model(model, full_check=True)
        assert entry["opset"] == OPSET and entry["custom_ops"] == []
        assert {o.domain for o in model.opset_import} == {""}
        assert all(n.domain == "" for n in model.graph.node)
        assert len(model.graph.initializer) == 0  # every weight is an input
        assert [i.name for i in model.graph.input] == [s["name"] for s in entry["inputs"]]
        assert [o.name for o in model.graph.output] == [s["name"] for s in entry["outputs"]]
        loops = [n.op_type for n in model.graph.node if n.op_type in ("Scan", "Loop")]
        assert loops == (["Scan"] if layer_type == "decoder_gdn" else [])


def test_fragment_records_formats_and_interface(exported):
    e = exported("qwen3_next", "mixed")
    attn, gdn = e.fragment["decoder_attention"], e.fragment["decoder_gdn"]
    assert attn["layers"] == [3] and gdn["layers"] == [0, 1, 2] and gdn["weight_prefix"] == "layers.{i}."
    assert gdn["weight_formats"] == {"gdn.in_proj": "nvfp4", "gdn.out_proj": "fp8",
                                     "mlp.gate_up_proj": "nvfp4", "mlp.down_proj": "fp8_block"}
    inputs = {s["name"]: s for s in gdn["inputs"]}
    assert inputs["recurrent_state"] == {"name": "recurrent_state", "dtype": "float", "shape": ["B", 4, 16, 16]}
    assert inputs["gdn.in_proj.weight"]["dtype"] == "uint8"
    assert inputs["gdn.in_proj.weight_scale"] == {"name": "gdn.in_proj.weight_scale", "dtype": "float8e4m3fn",
                                                  "shape": [e.config.gdn_in_proj_size, 64 // 16]}
    assert [s["name"] for s in attn["outputs"]] == ["hidden_out", "k_cache_out", "v_cache_out"]
    assert attn["outputs"][1]["shape"] == ["B", "S", 2, 32]
    assert e.fragment["mtp"]["weight_formats"]["lm_head"] == "bfloat16"


def test_bad_weight_formats_are_refused_before_writing(tmp_path):
    c = CONFIGS["qwen3_next"]
    out = tmp_path / "onnx"
    formats = formats_for(c, "float32")
    formats["layers.1.gdn.in_proj"] = "fp8"
    with pytest.raises(ValueError, match="decoder_gdn layers store 'gdn.in_proj' in different formats"):
        export_onnx(c, out, formats)
    with pytest.raises(ValueError, match="no storage format"):
        export_onnx(c, out, {"lm_head": "float32"})
    with pytest.raises(ValueError, match="unknown weight format"):
        export_onnx(c, out, {**formats_for(c, "float32"), "lm_head": "int3"})
    with pytest.raises(ValueError, match="not linear weights"):
        export_onnx(c, out, {**formats_for(c, "float32"), "layers.0.gdn.conv": "fp8"})
    assert not out.exists()


# ---- numerics against the reference layers ---------------------------------------------------------

FORMAT_RUNS = [("llama", "float32"), ("llama", "fp8"), ("qwen3_tied", "float32"), ("qwen3_tied", "nvfp4"),
               ("qwen3_tied", "fp8_block"), ("qwen3_next", "float32"), ("qwen3_next", "bfloat16"),
               ("qwen3_next", "fp8"), ("qwen3_next", "fp8_block"), ("qwen3_next", "nvfp4"),
               ("qwen3_next", "mixed")]


def _kv_state(c: ModelConfig, T: int, S_past: int, g: torch.Generator):
    kv = (2, S_past, c.num_kv_heads, c.head_dim)
    return torch.randn(kv, generator=g), torch.randn(kv, generator=g)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("config_name,fmt", FORMAT_RUNS, ids=[f"{a}-{b}" for a, b in FORMAT_RUNS])
def test_decoder_attention_matches_reference(exported, config_name, fmt, case):
    e = exported(config_name, fmt)
    c = e.config
    B, T, S_past = CASES[case]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, c.hidden_size, generator=g)
    k_cache, v_cache = _kv_state(c, T, S_past, g)
    layer = max(i for i, t in enumerate(c.layer_types) if t == ATTENTION)
    got = e.run("decoder_attention", {"hidden": x, "positions": positions(B, T, S_past), "k_cache": k_cache,
                                      "v_cache": v_cache}, layer)

    ref_layer = DecoderLayer(c, e.reference, f"layers.{layer}", ATTENTION)
    cos, sin = rope_cos_sin(torch.arange(S_past, S_past + T), rope_inv_freq(c.rotary_dim, c.rope_theta,
                                                                             c.rope_scaling))
    for b in range(B):
        state = SequenceState.new(c, S_past + T)
        state.layers[layer].k[:S_past] = k_cache[b]
        state.layers[layer].v[:S_past] = v_cache[b]
        state.length = S_past
        expected = ref_layer(x[b], state.layers[layer], S_past, cos, sin)
        assert rel(got["hidden_out"][b], expected) < TOL
        assert rel(got["k_cache_out"][b], state.layers[layer].k) < TOL
        assert rel(got["v_cache_out"][b], state.layers[layer].v) < TOL


GDN_RUNS = [r for r in FORMAT_RUNS if r[0] == "qwen3_next"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("config_name,fmt", GDN_RUNS, ids=[f"{a}-{b}" for a, b in GDN_RUNS])
def test_decoder_gdn_matches_reference(exported, config_name, fmt, case):
    e = exported(config_name, fmt)
    c = e.config
    B, T, S_past = CASES[case]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, T, c.hidden_size, generator=g)
    fresh = S_past == 0  # a new sequence starts from zero state
    window = torch.zeros(B, c.gdn_conv_size, c.linear_conv_kernel - 1)
    state = torch.zeros(B, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    if not fresh:
        window = torch.randn(window.shape, generator=g)
        state = 0.1 * torch.randn(state.shape, generator=g)
    layer = 1
    got = e.run("decoder_gdn", {"hidden": x, "conv_window": window, "recurrent_state": state}, layer)

    ref_layer = DecoderLayer(c, e.reference, f"layers.{layer}", GDN)
    for b in range(B):
        seq = SequenceState.new(c, S_past + T)
        seq.layers[layer].conv_window = window[b].clone()
        seq.layers[layer].recurrent = state[b].clone()
        expected = ref_layer(x[b], seq.layers[layer], S_past, None, None)
        assert rel(got["hidden_out"][b], expected) < TOL
        assert rel(got["conv_window_out"][b], seq.layers[layer].conv_window) < TOL
        assert rel(got["recurrent_state_out"][b], seq.layers[layer].recurrent) < TOL


@pytest.mark.parametrize("config_name,fmt", FORMAT_RUNS, ids=[f"{a}-{b}" for a, b in FORMAT_RUNS])
def test_embedding_and_lm_head_match_reference(exported, config_name, fmt):
    e = exported(config_name, fmt)
    c = e.config
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, c.vocab_size, (2, 5), generator=g)
    ids[0, 0], ids[1, -1] = 0, c.vocab_size - 1  # first and last rows (a partial fp8_block tile)
    got = e.run("embedding", {"token_ids": ids})["hidden"]
    assert rel(got, e.reference["embed.weight"][ids]) < TOL

    x = torch.randn(2, 5, c.hidden_size, generator=g)
    head = e.reference["embed.weight" if c.tie_word_embeddings else "lm_head.weight"]
    expected = F.linear(rms_norm(x, e.reference["norm.weight"], c.rms_norm_eps, c.norm_offset), head)
    assert rel(e.run("lm_head", {"hidden": x})["logits"], expected) < TOL


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fmt", ["float32", "nvfp4", "mixed"])
def test_mtp_matches_reference(exported, fmt, case):
    e = exported("qwen3_next", fmt)
    c = e.config
    B, T, S_past = CASES[case]
    g = torch.Generator().manual_seed(4)
    embeds = torch.randn(B, T, c.hidden_size, generator=g)
    hidden = torch.randn(B, T, c.hidden_size, generator=g)
    k_cache, v_cache = _kv_state(c, T, S_past, g)
    got = e.run("mtp", {"next_embeds": embeds, "hidden": hidden, "positions": positions(B, T, S_past),
                        "k_cache.0": k_cache, "v_cache.0": v_cache})

    block = MTPBlock(c, e.reference)
    cos, sin = rope_cos_sin(torch.arange(S_past, S_past + T), rope_inv_freq(c.rotary_dim, c.rope_theta,
                                                                             c.rope_scaling))
    for b in range(B):
        state = SequenceState.new(c, S_past + T)
        state.mtp[0].k[:S_past] = k_cache[b]
        state.mtp[0].v[:S_past] = v_cache[b]
        out = block(embeds[b], hidden[b], state.mtp, S_past, cos, sin)
        assert rel(got["hidden_out"][b], out) < TOL
        assert rel(got["logits"][b], F.linear(out, e.reference["lm_head.weight"])) < TOL
        assert rel(got["k_cache_out.0"][b], state.mtp[0].k) < TOL
        assert rel(got["v_cache_out.0"][b], state.mtp[0].v) < TOL


@pytest.mark.parametrize("config_name", ["llama", "qwen3_next"])
def test_graphs_chained_match_the_reference_model(exported, config_name):
    """embedding -> every decoder layer through its type's one graph -> lm_head, prefill then decode,
    against runtime.model.Model.forward on each sequence."""
    e = exported(config_name, "float32")
    c = e.config
    B, T = 2, 6
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, c.vocab_size, (B, T + 1), generator=g)
    model = Model(c, e.reference)

    state = {}
    for i, kind in enumerate(c.layer_types):
        if kind == ATTENTION:
            state[i] = {"k_cache": torch.zeros(B, 0, c.num_kv_heads, c.head_dim),
                        "v_cache": torch.zeros(B, 0, c.num_kv_heads, c.head_dim)}
        else:
            state[i] = {"conv_window": torch.zeros(B, c.gdn_conv_size, c.linear_conv_kernel - 1),
                        "recurrent_state": torch.zeros(B, c.linear_num_value_heads, c.linear_key_head_dim,
                                                       c.linear_value_head_dim)}

    def step(chunk: torch.Tensor, start: int) -> torch.Tensor:
        x = e.run("embedding", {"token_ids": chunk})["hidden"]
        for i, kind in enumerate(c.layer_types):
            if kind == ATTENTION:
                out = e.run("decoder_attention", {"hidden": x, "positions": positions(B, chunk.shape[1], start),
                                                  **state[i]}, i)
                state[i] = {"k_cache": out["k_cache_out"], "v_cache": out["v_cache_out"]}
            else:
                out = e.run("decoder_gdn", {"hidden": x, **state[i]}, i)
                state[i] = {"conv_window": out["conv_window_out"], "recurrent_state": out["recurrent_state_out"]}
            x = out["hidden_out"]
        return e.run("lm_head", {"hidden": x})["logits"]

    prefill, decode = step(ids[:, :T], 0), step(ids[:, T:], T)
    for b in range(B):
        seq = model.new_state(T + 1)
        assert rel(prefill[b], model.forward(ids[b, :T], seq).logits) < TOL
        assert rel(decode[b], model.forward(ids[b, T:], seq).logits) < TOL
