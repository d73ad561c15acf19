"""Per-sequence state of the reference runtime: KV cache of attention layers, conv window and
recurrent state of Gated DeltaNet layers, and how many tokens the sequence holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atlas.runtime.config import ATTENTION, GDN, ModelConfig


@dataclass
class AttentionState:
    k: torch.Tensor
    """[capacity, num_kv_heads, head_dim], rows 0..length-1 valid (post-RoPE keys)."""
    v: torch.Tensor
    """[capacity, num_kv_heads, head_dim]."""


@dataclass
class GDNState:
    conv_window: torch.Tensor
    """[conv_channels, kernel - 1]: the last kernel-1 inputs of the causal conv (zeros at start)."""
    recurrent: torch.Tensor
    """[num_value_heads, key_head_dim, value_head_dim] fp32 delta-rule state S."""


@dataclass
class SequenceState:
    """Everything one sequence carries between forward calls.

    Invariant: after a forward over T tokens, `length` grew by T and every layer's state reflects
    exactly tokens 0..length-1, so prefill-then-decode equals one forward over all tokens.
    """

    capacity: int
    layers: list[AttentionState | GDNState]
    """One entry per decoder layer, by the layer plan."""
    mtp: list[AttentionState] = field(default_factory=list)
    """KV caches of the MTP draft block's attention layers (filled by drafting, not by forward)."""
    length: int = 0

    @classmethod
    def new(cls, config: ModelConfig, capacity: int, dtype: torch.dtype = torch.float32) -> "SequenceState":
        shape = (capacity, config.num_kv_heads, config.head_dim)

        def kv() -> AttentionState:
            return AttentionState(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))

        layers: list[AttentionState | GDNState] = []
        for kind in config.layer_types:
            if kind == ATTENTION:
                layers.append(kv())
            elif kind == GDN:
                layers.append(GDNState(
                    torch.zeros(config.gdn_conv_size, config.linear_conv_kernel - 1, dtype=dtype),
                    torch.zeros(config.linear_num_value_heads, config.linear_key_head_dim,
                                config.linear_value_head_dim, dtype=torch.float32),
                ))
        return cls(capacity=capacity, layers=layers, mtp=[kv() for _ in range(config.mtp_num_layers)])
