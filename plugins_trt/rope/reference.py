"""Rotary position embedding references (neox / rotate-half style, optionally partial)."""

from __future__ import annotations

import math

import torch

from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.runtime.kv_cache import LayerKV, write_kv

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2] (fp32), with the scaling rules of the HF configs.

    scaling: None / {"rope_type": "default"}; {"rope_type": "linear", "factor": f};
    {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"} (Llama 3.1's smoothed interpolation).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are interpolated by `factor`, short ones kept, the band between smoothed.
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_type '{rope_type}'; supported: {SUPPORTED_ROPE_TYPES}")


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] (fp32) for integer positions [T]; halves repeated (neox layout)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dims of each head; the rest pass through.

    x: [T, H, D]; cos, sin: [T, rotary_dim].
    """
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x_rot * cos + rotated * sin
    return torch.cat((out, x_pass), dim=-1)


def qkv_rope_kv_write(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layer: LayerKV,
                      slot_mapping: torch.Tensor, num_heads: int, has_gate: bool = False,
                      q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 1e-6,
                      norm_offset: float = 0.0) -> torch.Tensor:
    """An attention layer's step between the qkv projection and attention (reference of triton_rope.py).

    qkv: [T, q_size (+ q_size gate) + 2·kv_size], rows [q | gate? | k | v] (runtime/layers/attention.py);
    positions: int [T]; inv_freq: fp32 [rotary_dim / 2] (rope_inv_freq); layer: the paged cache of
    runtime/kv_cache.py, [num_blocks, block_size, Hkv, D] (Hkv and D are read from it); slot_mapping: int32 [T],
    negative = not written. q_norm, k_norm: [D] or None (QK-norm, y = x̂·(norm_offset + w), over head_dim).

    q and k are QK-normed (rounded to qkv's dtype, as rms_norm returns), rotated on their first rotary_dim dims;
    k and v are written into the cache (quantize_kv: FP8 caches store e4m3(clamp(x / scale, ±448))).
    Returns q [T, Hq, D] (fp32 for bf16 / fp16 qkv: apply_rope computes in fp32). The gate stays in qkv.
    """
    T = qkv.shape[0]
    Hkv, D = layer.k.shape[2], layer.k.shape[3]
    q_size, kv_size = num_heads * D, Hkv * D
    gate_size = q_size if has_gate else 0
    q, _, k, v = qkv.split([q_size, gate_size, kv_size, kv_size], dim=-1)
    q, k, v = q.reshape(T, num_heads, D), k.reshape(T, Hkv, D), v.reshape(T, Hkv, D)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps, norm_offset)
        k = rms_norm(k, k_norm, eps, norm_offset)
    cos, sin = rope_cos_sin(positions, inv_freq)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv(layer, k, v, slot_mapping)
    return q
