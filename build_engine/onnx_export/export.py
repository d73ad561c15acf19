"""export_onnx: one ONNX graph per layer type the config uses, and its manifest fragment.

Graph contract (every graph; float32 compute; B, T, S_past dynamic, S = S_past + T):
  - Weights are graph inputs named by their canonical name with the layer's `layers.{i}.` removed
    (decoder graphs: "input_norm.weight", "attn.qkv_proj.weight", "attn.qkv_proj.weight_scale", ...),
    and by their full canonical name in the single-instance graphs (embedding, lm_head, mtp). A linear
    weight comes as the tensors of its storage format (dequant.py); every other parameter (norms,
    biases, conv taps, A_log, dt_bias) is a float32 input.
  - Config constants (eps, head counts, norm offset, rotary dim, inverse frequencies) are baked in.
  - Per-sequence state goes in as inputs and comes back updated as outputs (see layers.py).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from atlas.build_engine.onnx_export import dequant
from atlas.build_engine.onnx_export.graphs import IR_VERSION, OPSET
from atlas.build_engine.onnx_export.layers import BUILDERS
from atlas.runtime.config import ATTENTION, GDN, ModelConfig
from atlas.runtime.layout import canonical_shapes

LAYER_TYPES = tuple(BUILDERS)
DECODER_TYPES = {ATTENTION: "decoder_attention", GDN: "decoder_gdn"}

_COMMON = {
    "rms_norm": "ReduceMean, Add, Sqrt, Reciprocal, Mul",
    "linear": "dequantize, Transpose, MatMul (+ Add bias)",
}
_ATTENTION = {
    "rope": "Cast, Mul (baked inv_freq), Cos, Sin, Split, Neg, Concat",
    "attention": "Concat (KV append), MatMul, Range/Greater/Where (causal mask), Softmax, MatMul",
    "silu": "Sigmoid, Mul",
}
_GDN = {
    "causal_conv1d": "Concat (window), Conv(group=C), Slice (new window), SiLU as Sigmoid*Mul",
    "gated_delta_rule": "Scan over T (body: Mul, MatMul, Sub, Add)",
    "gdn_gating": "Exp, Neg, Softplus, Sigmoid",
    "l2norm": "ReduceSum, Add, Sqrt, Reciprocal, Mul",
}
DECOMPOSED = {
    "embedding": {"embedding": "Gather rows, then dequantize only those",
                  "float8 tensors": "taken as uint8 bytes (bytes_of), Gather rows, Gather(E4M3 table[256])"},
    "decoder_attention": {**_COMMON, **_ATTENTION},
    "decoder_gdn": {**_COMMON, **_GDN, "silu": "Sigmoid, Mul"},
    "lm_head": dict(_COMMON),
    "mtp": {**_COMMON, **_ATTENTION},
}
"""Which reference ops each graph writes out in standard ONNX ops (no graph uses a custom op)."""


def _is_linear(name: str) -> bool:
    module = name.removesuffix(".weight").rsplit(".", 1)[-1]
    return name.endswith(".weight") and (module.endswith("_proj") or module in ("lm_head", "fc"))


def linear_prefixes(config: ModelConfig) -> list[str]:
    """The canonical prefixes export_onnx needs a storage format for: every weight a graph multiplies by
    ("layers.0.attn.qkv_proj", "lm_head", "mtp.fc", ...), with "embed" when the embeddings are tied."""
    prefixes = [name.removesuffix(".weight") for name in canonical_shapes(config) if _is_linear(name)]
    return prefixes + (["embed"] if config.tie_word_embeddings else [])


def layer_types(config: ModelConfig) -> list[str]:
    """The layer types the config uses, in execution order."""
    used = {DECODER_TYPES[kind] for kind in config.layer_types}
    return (["embedding"] + [t for t in ("decoder_attention", "decoder_gdn") if t in used] + ["lm_head"]
            + (["mtp"] if config.mtp_num_layers else []))


def graph_formats(config: ModelConfig, weight_formats: dict[str, str]) -> dict[str, dict[str, str]]:
    """Layer type -> {graph-local linear prefix -> storage format}, checked.

    Raises ValueError for a missing, unknown or unusable entry, and when two layers of one type store
    the same projection in different formats (one graph serves every layer of its type).
    """
    shapes = canonical_shapes(config)
    required = linear_prefixes(config)
    missing = [p for p in required if p not in weight_formats]
    if missing:
        raise ValueError(f"weight_formats has no storage format for {missing}; it needs one for every linear "
                         f"prefix of the model (see linear_prefixes(config))")
    unknown = sorted(set(weight_formats) - set(required) - {"embed"})
    if unknown:
        raise ValueError(f"weight_formats names {unknown}, which are not linear weights of this model; "
                         f"expected keys: {required + ['embed']}")
    for prefix, fmt in weight_formats.items():
        dequant.check_format(fmt, prefix, shapes[f"{prefix}.weight"][1])

    out: dict[str, dict[str, str]] = {"embedding": {"embed": weight_formats.get("embed", "float32")}}
    for kind, type_name in DECODER_TYPES.items():
        layers = [i for i, t in enumerate(config.layer_types) if t == kind]
        seen: dict[str, dict[str, list[int]]] = {}  # local prefix -> format -> layers
        for i in layers:
            for prefix in required:
                if prefix.startswith(f"layers.{i}."):
                    local = prefix.removeprefix(f"layers.{i}.")
                    seen.setdefault(local, {}).setdefault(weight_formats[prefix], []).append(i)
        for local, by_format in seen.items():
            if len(by_format) > 1:
                raise ValueError(
                    f"the {type_name} layers store '{local}' in different formats ({by_format}, format -> layers); "
                    f"one graph serves every layer of a type, so all its layers must share one format per "
                    f"projection: quantize them alike")
        if layers:
            out[type_name] = {local: next(iter(by_format)) for local, by_format in seen.items()}
    head = "embed" if config.tie_word_embeddings else "lm_head"
    out["lm_head"] = {head: weight_formats[head]}
    if config.mtp_num_layers:
        out["mtp"] = {p: weight_formats[p] for p in required if p.startswith("mtp.")} | {head: weight_formats[head]}
    return out


def export_onnx(config: ModelConfig, out_dir: Path, weight_formats: dict[str, str]) -> dict:
    """Write out_dir/<layer_type>.onnx for every layer type the config uses; return the manifest fragment.

    weight_formats: canonical linear prefix ("layers.0.attn.qkv_proj", "lm_head", ...) -> storage format,
    one of dequant.FORMATS (optionally "embed" too; it defaults to float32 when the embeddings are untied).
    Returns {layer_type: {"file", "inputs", "outputs", "opset", "ir_version", "custom_ops", "decomposed",
    "weight_formats", "weight_prefix", "layers"}} with inputs/outputs as [{"name", "dtype", "shape"}] in the
    graph's order (dims: ints, or the names of dynamic dims).
    """
    formats = graph_formats(config, weight_formats)  # first: a bad request writes nothing
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fragment = {}
    for layer_type in layer_types(config):
        g = BUILDERS[layer_type](config, formats[layer_type])
        proto = g.to_proto()
        file = f"{layer_type}.onnx"
        onnx.save(proto, out_dir / file)
        decoder_kind = {v: k for k, v in DECODER_TYPES.items()}.get(layer_type)
        used = sorted(set(formats[layer_type].values()))
        fragment[layer_type] = {
            "file": file,
            "inputs": [s.to_dict() for s in g.inputs()],
            "outputs": [s.to_dict() for s in g.outputs()],
            "opset": OPSET,
            "ir_version": IR_VERSION,
            "custom_ops": [],
            "decomposed": DECOMPOSED[layer_type] | {f"dequant_{f}": dequant.DECOMPOSITION[f] for f in used},
            "weight_formats": formats[layer_type],
            "weight_prefix": "layers.{i}." if decoder_kind else "",
            "layers": [i for i, t in enumerate(config.layer_types) if t == decoder_kind] if decoder_kind else [],
        }
    return fragment
