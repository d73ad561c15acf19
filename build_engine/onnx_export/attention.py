"""Full-attention token mixer as a graph (mirrors runtime.layers.attention.Attention).

fused qkv projection [q | gate? | k | v] -> QK-norm? -> (partial, neox) RoPE at absolute positions ->
append K/V to the cache -> causal GQA softmax attention over cache + new rows -> output gate? -> o_proj.
"""

from __future__ import annotations

import onnx_ir as ir

from atlas.build_engine.onnx_export import ops
from atlas.build_engine.onnx_export.graphs import FLOAT, LayerGraph
from atlas.plugins_trt.rope.reference import rope_inv_freq
from atlas.runtime.config import ModelConfig


def rope_cos_sin(g: LayerGraph, c: ModelConfig, positions: ir.Value) -> tuple[ir.Value, ir.Value]:
    """cos, sin [B, T, 1, rotary_dim] for positions [B, T] int64 (reference: rope_cos_sin).

    The inverse frequencies (with the config's rope scaling) are a baked constant.
    """
    op = g.op
    inv_freq = rope_inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling).numpy()  # [R/2]
    freqs = op.Mul(op.Unsqueeze(op.Cast(positions, to=FLOAT), [-1]), g.constant(inv_freq, "rope_inv_freq"))
    emb = op.Concat(freqs, freqs, axis=-1)  # [B, T, R]
    return op.Unsqueeze(op.Cos(emb), [2]), op.Unsqueeze(op.Sin(emb), [2])


def apply_rope(g: LayerGraph, x: ir.Value, cos: ir.Value, sin: ir.Value, rotary_dim: int,
               head_dim: int) -> ir.Value:
    """Rotate the first rotary_dim dims of each head, pass the rest (reference: apply_rope). x: [B, T, H, D]."""
    op = g.op
    x_rot, x_pass = ops.split(g, x, [rotary_dim, head_dim - rotary_dim])
    x1, x2 = ops.split(g, x_rot, [rotary_dim // 2, rotary_dim // 2])
    rotated = op.Concat(op.Neg(x2), x1, axis=-1)
    out = op.Add(op.Mul(x_rot, cos), op.Mul(rotated, sin))
    return out if x_pass is None else op.Concat(out, x_pass, axis=-1)


def attention(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value, positions: ir.Value,
              k_cache: ir.Value, v_cache: ir.Value, prefix: str) -> tuple[ir.Value, ir.Value, ir.Value]:
    """x: [B, T, H] (normed) at positions [B, T]; k_cache, v_cache: [B, S_past, Hkv, D].

    Returns the mixer output [B, T, H] and the caches with the new rows appended, [B, S, Hkv, D] with
    S = S_past + T. Cache row s holds position s, so query position p sees rows 0..p (every sequence of the
    batch has the same S_past; padding a shorter one would need a per-row length mask instead).
    """
    op = g.op
    hq, hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
    group = hq // hkv
    qkv = ops.linear(g, x, f"{prefix}.qkv_proj", formats[f"{prefix}.qkv_proj"], c.qkv_size, c.hidden_size,
                     bias=c.attention_bias)
    q, gate, k, v = ops.split(g, qkv, [c.q_size, c.q_size if c.attn_output_gate else 0, c.kv_size, c.kv_size])
    q = ops.heads(g, q, hq, d)  # [B, T, Hq, D]
    k = ops.heads(g, k, hkv, d)  # [B, T, Hkv, D]
    v = ops.heads(g, v, hkv, d)
    if c.qk_norm:
        q = ops.rms_norm(g, q, g.weight(f"{prefix}.q_norm.weight", (d,)), c.rms_norm_eps, c.norm_offset)
        k = ops.rms_norm(g, k, g.weight(f"{prefix}.k_norm.weight", (d,)), c.rms_norm_eps, c.norm_offset)
    cos, sin = rope_cos_sin(g, c, positions)
    q = apply_rope(g, q, cos, sin, c.rotary_dim, d)
    k = apply_rope(g, k, cos, sin, c.rotary_dim, d)
    k_all = op.Concat(k_cache, k, axis=1)  # [B, S, Hkv, D]
    v_all = op.Concat(v_cache, v, axis=1)

    # GQA without copying K/V: query head h = kv_head·group + j, so [B, T, Hq, D] -> [B, Hkv, group, T, D]
    # and MatMul broadcasts K/V [B, Hkv, 1, ·, ·] over the group dim.
    q5 = op.Transpose(op.Reshape(q, [0, 0, hkv, group, d]), perm=[0, 2, 3, 1, 4])  # [B, Hkv, group, T, D]
    k5 = op.Unsqueeze(op.Transpose(k_all, perm=[0, 2, 3, 1]), [2])  # [B, Hkv, 1, D, S]
    v5 = op.Unsqueeze(op.Transpose(v_all, perm=[0, 2, 1, 3]), [2])  # [B, Hkv, 1, S, D]
    scores = op.Mul(op.MatMul(q5, k5), d**-0.5)  # [B, Hkv, group, T, S]

    # causal: key row s is visible to the query at position p iff s <= p
    key_pos = op.Range(0, op.Squeeze(op.Shape(k_all, start=1, end=2), [0]), 1)  # [S]
    hidden_keys = op.Greater(key_pos, op.Unsqueeze(positions, [-1]))  # [B, T, S]
    scores = op.Where(op.Unsqueeze(hidden_keys, [1, 2]), float("-inf"), scores)
    probs = op.Softmax(scores, axis=-1)
    o = op.MatMul(probs, v5)  # [B, Hkv, group, T, D]
    o = op.Reshape(op.Transpose(o, perm=[0, 3, 1, 2, 4]), [0, 0, c.q_size])  # [B, T, Hq·D]
    if c.attn_output_gate:
        o = op.Mul(o, op.Sigmoid(gate))
    out = ops.linear(g, o, f"{prefix}.o_proj", formats[f"{prefix}.o_proj"], c.hidden_size, c.q_size,
                     bias=c.attention_bias)
    return out, k_all, v_all
