"""Gated DeltaNet token mixer (Qwen3-Next / Qwen3.5 linear attention)."""

from __future__ import annotations

import torch

from atlas.plugins_trt.causal_conv1d.reference import causal_conv1d
from atlas.plugins_trt.gated_delta_net.reference import gated_delta_rule, gdn_gating
from atlas.plugins_trt.rms_norm.reference import gated_rms_norm
from atlas.runtime.config import ModelConfig
from atlas.runtime.layers.linear import Linear
from atlas.runtime.state import GDNState


class GatedDeltaNet:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], prefix: str):
        self.c = config
        self.in_proj = Linear(weights, f"{prefix}.in_proj")  # rows [q | k | v | z | b | a]
        self.out_proj = Linear(weights, f"{prefix}.out_proj")
        self.conv_weight = weights[f"{prefix}.conv.weight"]  # [conv_channels, kernel]
        self.A_log = weights[f"{prefix}.A_log"]  # [Hv]
        self.dt_bias = weights[f"{prefix}.dt_bias"]  # [Hv]
        self.norm = weights[f"{prefix}.norm.weight"]  # [Dv]
        hv = config.linear_num_value_heads
        self.split = [config.gdn_conv_size, config.gdn_value_size, hv, hv]

    def __call__(self, x: torch.Tensor, state: GDNState) -> torch.Tensor:
        """x: [T, H]; advances the conv window and recurrent state in `state`; returns [T, H]."""
        c = self.c
        T = x.shape[0]
        qkv, z, b, a = self.in_proj(x).split(self.split, dim=-1)
        qkv, state.conv_window = causal_conv1d(qkv, state.conv_window, self.conv_weight)
        q, k, v = qkv.split([c.gdn_key_size, c.gdn_key_size, c.gdn_value_size], dim=-1)
        q = q.view(T, c.linear_num_key_heads, c.linear_key_head_dim)
        k = k.view(T, c.linear_num_key_heads, c.linear_key_head_dim)
        v = v.view(T, c.linear_num_value_heads, c.linear_value_head_dim)
        g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
        o, state.recurrent = gated_delta_rule(q, k, v, g, beta, state.recurrent)
        z = z.view(T, c.linear_num_value_heads, c.linear_value_head_dim)
        o = gated_rms_norm(o.to(x.dtype), z, self.norm, c.rms_norm_eps)
        return self.out_proj(o.reshape(T, c.gdn_value_size))
