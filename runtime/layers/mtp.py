"""Multi-token-prediction draft block (Qwen3-Next / Qwen3.5 `mtp.*`).

x = fc(cat[norm_e(embed(tok_{t+1})), norm_h(h_t)]); x = decoder_layer(x); logits = lm_head(norm(x)),
where h_t is the target's final-normed hidden state at position t. Later draft steps feed the block's
own normed output and the previous draft token, one position further, reusing the same layer.
"""

from __future__ import annotations

import torch

from atlas.plugins_trt.rms_norm.reference import rms_norm
from atlas.runtime.config import ATTENTION, ModelConfig
from atlas.runtime.layers.decoder import DecoderLayer
from atlas.runtime.layers.linear import Linear
from atlas.runtime.state import AttentionState


class MTPBlock:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], prefix: str = "mtp"):
        self.c = config
        self.fc = Linear(weights, f"{prefix}.fc")  # [H, 2H]
        self.norm_embedding = weights[f"{prefix}.pre_fc_norm_embedding.weight"]
        self.norm_hidden = weights[f"{prefix}.pre_fc_norm_hidden.weight"]
        self.norm = weights[f"{prefix}.norm.weight"]
        self.layers = [DecoderLayer(config, weights, f"{prefix}.layers.{i}", ATTENTION)
                       for i in range(config.mtp_num_layers)]

    def __call__(self, next_embeds: torch.Tensor, hidden: torch.Tensor, states: list[AttentionState],
                 start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """next_embeds: [T, H] embeddings of tokens t+1; hidden: [T, H] normed hidden states at t.

        Returns the block's normed output [T, H] (feed it to the LM head for draft logits).
        """
        c = self.c
        e = rms_norm(next_embeds, self.norm_embedding, c.rms_norm_eps, c.norm_offset)
        h = rms_norm(hidden, self.norm_hidden, c.rms_norm_eps, c.norm_offset)
        x = self.fc(torch.cat((e, h), dim=-1))
        for layer, state in zip(self.layers, states):
            x = layer(x, state, start, cos, sin)
        return rms_norm(x, self.norm, c.rms_norm_eps, c.norm_offset)
