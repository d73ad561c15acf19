"""Whole layer-type graphs: decoder layers (attention | Gated DeltaNet mixer), embedding, final norm +
LM head, and the MTP draft block. Each builder returns a LayerGraph whose interface is the contract
of export_onnx (see export.py); `formats` maps each linear prefix of the graph to its storage format.

Dynamic dims: B (batch), T (new tokens), S_past (cached positions), S = S_past + T.
"""

from __future__ import annotations

from typing import Callable

import onnx_ir as ir

from atlas.build_engine.onnx_export import dequant, ops
from atlas.build_engine.onnx_export.attention import attention
from atlas.build_engine.onnx_export.gdn import gated_delta_net
from atlas.build_engine.onnx_export.graphs import FLOAT, INT64, LayerGraph
from atlas.runtime.config import ModelConfig


def _mlp(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value, prefix: str) -> ir.Value:
    """down(silu(gate) · up) with the fused [gate | up] projection (runtime.layers.decoder.MLP)."""
    i, h = c.intermediate_size, c.hidden_size
    gate_up = ops.linear(g, x, f"{prefix}.gate_up_proj", formats[f"{prefix}.gate_up_proj"], 2 * i, h)
    return ops.linear(g, ops.silu_mul(g, gate_up, i), f"{prefix}.down_proj", formats[f"{prefix}.down_proj"], h, i)


def _decoder_layer(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value, prefix: str,
                   mixer: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """RMSNorm -> mixer -> residual -> RMSNorm -> MLP -> residual (runtime.layers.decoder.DecoderLayer).

    x: [B, T, H]; prefix: "" in a decoder graph, "mtp.layers.j." inside the MTP block.
    """
    op, h = g.op, c.hidden_size
    normed = ops.rms_norm(g, x, g.weight(f"{prefix}input_norm.weight", (h,)), c.rms_norm_eps, c.norm_offset)
    x = op.Add(x, mixer(normed))
    normed = ops.rms_norm(g, x, g.weight(f"{prefix}post_norm.weight", (h,)), c.rms_norm_eps, c.norm_offset)
    with g.scope(f"{prefix}mlp"):
        return op.Add(x, _mlp(g, c, formats, normed, f"{prefix}mlp"))


def _attention_layer(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value, positions: ir.Value,
                     suffix: str, prefix: str) -> tuple[ir.Value, ir.Value, ir.Value]:
    """A full-attention decoder layer reading its KV cache from inputs k_cache{suffix} / v_cache{suffix}.

    Returns hidden [B, T, H] and the appended caches [B, S, Hkv, D].
    """
    kv_past = ("B", "S_past", c.num_kv_heads, c.head_dim)
    k_cache = g.input(f"k_cache{suffix}", FLOAT, kv_past)
    v_cache = g.input(f"v_cache{suffix}", FLOAT, kv_past)
    caches: list[ir.Value] = []

    def mixer(h: ir.Value) -> ir.Value:
        with g.scope(f"{prefix}attn"):
            out, k_all, v_all = attention(g, c, formats, h, positions, k_cache, v_cache, f"{prefix}attn")
        caches.extend((k_all, v_all))
        return out

    out = _decoder_layer(g, c, formats, x, prefix, mixer)
    return out, caches[0], caches[1]


def _kv_shape(c: ModelConfig) -> tuple:
    return ("B", "S", c.num_kv_heads, c.head_dim)


def _head(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value) -> ir.Value:
    """logits [B, T, V] = x @ lm_headᵀ, reading `embed.weight...` when the embeddings are tied."""
    prefix = "embed" if c.tie_word_embeddings else "lm_head"
    return ops.linear(g, x, prefix, formats[prefix], c.vocab_size, c.hidden_size)


def decoder_attention(c: ModelConfig, formats: dict[str, str]) -> LayerGraph:
    """hidden [B, T, H], positions [B, T] int64, k_cache / v_cache [B, S_past, Hkv, D] float32
    -> hidden_out [B, T, H], k_cache_out / v_cache_out [B, S, Hkv, D]."""
    g = LayerGraph("decoder_attention")
    x = g.input("hidden", FLOAT, ("B", "T", c.hidden_size))
    positions = g.input("positions", INT64, ("B", "T"))
    out, k_all, v_all = _attention_layer(g, c, formats, x, positions, "", "")
    g.output(out, "hidden_out", ("B", "T", c.hidden_size))
    g.output(k_all, "k_cache_out", _kv_shape(c))
    g.output(v_all, "v_cache_out", _kv_shape(c))
    return g


def decoder_gdn(c: ModelConfig, formats: dict[str, str]) -> LayerGraph:
    """hidden [B, T, H], conv_window [B, C, K-1], recurrent_state [B, Hv, Dk, Dv] float32
    -> hidden_out [B, T, H], conv_window_out [B, C, K-1], recurrent_state_out [B, Hv, Dk, Dv]."""
    g = LayerGraph("decoder_gdn")
    x = g.input("hidden", FLOAT, ("B", "T", c.hidden_size))
    window_shape = ("B", c.gdn_conv_size, c.linear_conv_kernel - 1)
    state_shape = ("B", c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    window = g.input("conv_window", FLOAT, window_shape)
    state = g.input("recurrent_state", FLOAT, state_shape)
    carried: list[ir.Value] = []

    def mixer(h: ir.Value) -> ir.Value:
        with g.scope("gdn"):
            out, new_window, new_state = gated_delta_net(g, c, formats, h, window, state, "gdn")
        carried.extend((new_window, new_state))
        return out

    out = _decoder_layer(g, c, formats, x, "", mixer)
    g.output(out, "hidden_out", ("B", "T", c.hidden_size))
    g.output(carried[0], "conv_window_out", window_shape)
    g.output(carried[1], "recurrent_state_out", state_shape)
    return g


def embedding(c: ModelConfig, formats: dict[str, str]) -> LayerGraph:
    """token_ids [B, T] int64 -> hidden [B, T, H] float32 (rows of `embed.weight`, dequantized).

    float8 tensors of the table come as their raw bytes (uint8 inputs marked bytes_of, see dequant.py).
    """
    g = LayerGraph("embedding")
    ids = g.input("token_ids", INT64, ("B", "T"))
    stored = dequant.declare(g, "embed", formats["embed"], c.vocab_size, c.hidden_size, float8_as_bytes=True)
    g.output(dequant.dequantize_rows(g, formats["embed"], stored, ids, c.hidden_size), "hidden",
             ("B", "T", c.hidden_size))
    return g


def lm_head(c: ModelConfig, formats: dict[str, str]) -> LayerGraph:
    """hidden [B, T, H] (last decoder layer's output) -> logits [B, T, V] = lm_head(norm(hidden))."""
    g = LayerGraph("lm_head")
    x = g.input("hidden", FLOAT, ("B", "T", c.hidden_size))
    x = ops.rms_norm(g, x, g.weight("norm.weight", (c.hidden_size,)), c.rms_norm_eps, c.norm_offset)
    g.output(_head(g, c, formats, x), "logits", ("B", "T", c.vocab_size))
    return g


def mtp(c: ModelConfig, formats: dict[str, str]) -> LayerGraph:
    """The MTP draft block and its LM head (runtime.layers.mtp.MTPBlock, then lm_head without final norm).

    next_embeds [B, T, H] (embeddings of tokens t+1), hidden [B, T, H] (the target's final-normed hidden
    state at t, or the block's own hidden_out on later draft steps), positions [B, T] int64, and per MTP
    layer j: k_cache.j / v_cache.j [B, S_past, Hkv, D]
    -> hidden_out [B, T, H] (the block's normed output), logits [B, T, V], k_cache_out.j / v_cache_out.j.
    """
    g = LayerGraph("mtp")
    h = c.hidden_size
    embeds = g.input("next_embeds", FLOAT, ("B", "T", h))
    hidden = g.input("hidden", FLOAT, ("B", "T", h))
    positions = g.input("positions", INT64, ("B", "T"))
    op = g.op
    e = ops.rms_norm(g, embeds, g.weight("mtp.pre_fc_norm_embedding.weight", (h,)), c.rms_norm_eps, c.norm_offset)
    x = ops.rms_norm(g, hidden, g.weight("mtp.pre_fc_norm_hidden.weight", (h,)), c.rms_norm_eps, c.norm_offset)
    x = ops.linear(g, op.Concat(e, x, axis=-1), "mtp.fc", formats["mtp.fc"], h, 2 * h)
    caches = []
    for j in range(c.mtp_num_layers):
        x, k_all, v_all = _attention_layer(g, c, formats, x, positions, f".{j}", f"mtp.layers.{j}.")
        caches.append((k_all, v_all))
    x = ops.rms_norm(g, x, g.weight("mtp.norm.weight", (h,)), c.rms_norm_eps, c.norm_offset)
    g.output(x, "hidden_out", ("B", "T", h))
    g.output(_head(g, c, formats, x), "logits", ("B", "T", c.vocab_size))
    for j, (k_all, v_all) in enumerate(caches):
        g.output(k_all, f"k_cache_out.{j}", _kv_shape(c))
        g.output(v_all, f"v_cache_out.{j}", _kv_shape(c))
    return g


BUILDERS: dict[str, Callable[[ModelConfig, dict[str, str]], LayerGraph]] = {
    "embedding": embedding,
    "decoder_attention": decoder_attention,
    "decoder_gdn": decoder_gdn,
    "lm_head": lm_head,
    "mtp": mtp,
}
"""Layer type name -> graph builder."""
