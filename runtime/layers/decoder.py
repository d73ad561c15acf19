"""Decoder layer = RMSNorm → token mixer (attention | Gated DeltaNet) → residual → RMSNorm → SiLU MLP → residual."""

from __future__ import annotations

import torch

from atlas.plugins_trt.activation.reference import silu_mul
from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.runtime.config import ATTENTION, ModelConfig
from atlas.runtime.layers.attention import Attention
from atlas.runtime.layers.gdn import GatedDeltaNet
from atlas.runtime.layers.linear import Linear
from atlas.runtime.state import AttentionState, GDNState


class MLP:
    def __init__(self, weights: dict[str, torch.Tensor], prefix: str):
        self.gate_up_proj = Linear(weights, f"{prefix}.gate_up_proj")  # rows [gate | up]
        self.down_proj = Linear(weights, f"{prefix}.down_proj")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))


class DecoderLayer:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], prefix: str, kind: str):
        self.c = config
        self.kind = kind
        self.input_norm = weights[f"{prefix}.input_norm.weight"]
        self.post_norm = weights[f"{prefix}.post_norm.weight"]
        if kind == ATTENTION:
            self.mixer = Attention(config, weights, f"{prefix}.attn")
        else:
            self.mixer = GatedDeltaNet(config, weights, f"{prefix}.gdn")
        self.mlp = MLP(weights, f"{prefix}.mlp")

    def __call__(self, x: torch.Tensor, state: AttentionState | GDNState, start: int,
                 cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H] hidden states of positions start..start+T-1 -> [T, H]."""
        c = self.c
        h = rms_norm(x, self.input_norm, c.rms_norm_eps, c.norm_offset)
        if self.kind == ATTENTION:
            h = self.mixer(h, state, start, cos, sin)
        else:
            h = self.mixer(h, state)
        x = x + h
        h = rms_norm(x, self.post_norm, c.rms_norm_eps, c.norm_offset)
        return x + self.mlp(h)
