"""The reference model: embedding, decoder layers by the layer plan, final norm, LM head.

Plain torch, fp32 on the CPU. It is the ground truth the GPU path is tested against, and the CPU
runtime. Family-agnostic: everything it needs is in the canonical config and weight names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.plugins_trt.rope.reference import rope_cos_sin, rope_inv_freq
from atlas.runtime.config import ModelConfig
from atlas.runtime.layers.decoder import DecoderLayer
from atlas.runtime.layers.mtp import MTPBlock
from atlas.runtime.state import SequenceState


@dataclass
class ForwardOutput:
    logits: torch.Tensor
    """[T, vocab] fp32 logits of every input position."""
    hidden: torch.Tensor
    """[T, H] final-normed hidden states (the MTP block's input)."""


class Model:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]):
        self.config = config
        self.embed = weights["embed.weight"]  # [V, H]
        self.layers = [DecoderLayer(config, weights, f"layers.{i}", kind)
                       for i, kind in enumerate(config.layer_types)]
        self.norm = weights["norm.weight"]
        self.lm_head = self.embed if config.tie_word_embeddings else weights["lm_head.weight"]  # [V, H]
        self.mtp = MTPBlock(config, weights) if config.mtp_num_layers else None
        self.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, config.rope_scaling)

    def new_state(self, capacity: int) -> SequenceState:
        return SequenceState.new(self.config, capacity, self.embed.dtype)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, state: SequenceState) -> ForwardOutput:
        """Run T new tokens of one sequence, appending them to `state`.

        token_ids: [T] int64. Works for a whole prompt (prefill), one token (decode), or any chunk.
        """
        c = self.config
        T = token_ids.shape[0]
        start = state.length
        if start + T > state.capacity:
            raise ValueError(f"sequence of {start + T} tokens exceeds the state capacity {state.capacity}")
        cos, sin = rope_cos_sin(torch.arange(start, start + T), self.inv_freq)
        x = self.embed[token_ids]
        for layer, layer_state in zip(self.layers, state.layers):
            x = layer(x, layer_state, start, cos, sin)
        state.length = start + T
        hidden = rms_norm(x, self.norm, c.rms_norm_eps, c.norm_offset)
        logits = torch.nn.functional.linear(hidden, self.lm_head).float()
        return ForwardOutput(logits=logits, hidden=hidden)
