"""Full attention token mixer: fused qkv projection, optional QK-norm and output gate, (partial) RoPE."""

from __future__ import annotations

import torch

from atlas.plugins_trt.attention.reference import attention_with_cache
from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.plugins_trt.rope.reference import apply_rope
from atlas.runtime.config import ModelConfig
from atlas.runtime.layers.linear import Linear
from atlas.runtime.state import AttentionState


class Attention:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], prefix: str):
        self.c = config
        self.qkv_proj = Linear(weights, f"{prefix}.qkv_proj")  # rows [q | gate? | k | v]
        self.o_proj = Linear(weights, f"{prefix}.o_proj")
        self.q_norm = weights.get(f"{prefix}.q_norm.weight")
        self.k_norm = weights.get(f"{prefix}.k_norm.weight")
        gate = config.q_size if config.attn_output_gate else 0
        self.split = [config.q_size, gate, config.kv_size, config.kv_size]

    def __call__(self, x: torch.Tensor, state: AttentionState, start: int, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H] for positions start..start+T-1; writes K/V rows into `state`; returns [T, H]."""
        c = self.c
        T = x.shape[0]
        q, gate, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(T, c.num_heads, c.head_dim)
        k = k.view(T, c.num_kv_heads, c.head_dim)
        v = v.view(T, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, self.q_norm, c.rms_norm_eps, c.norm_offset)
            k = rms_norm(k, self.k_norm, c.rms_norm_eps, c.norm_offset)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        state.k[start:start + T] = k
        state.v[start:start + T] = v
        o = attention_with_cache(q, state.k, state.v, start, c.head_dim**-0.5).reshape(T, c.q_size)
        if c.attn_output_gate:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)
