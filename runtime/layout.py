"""Canonical weight names and shapes of a model, derived from its config alone.

The builder checks every tensor it writes against this; the runtime's layers read these names.
"""

from __future__ import annotations

from atlas.runtime.config import ATTENTION, ModelConfig


def _attention(c: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    s = {f"{p}.qkv_proj.weight": (c.qkv_size, c.hidden_size), f"{p}.o_proj.weight": (c.hidden_size, c.q_size)}
    if c.attention_bias:
        s[f"{p}.qkv_proj.bias"] = (c.qkv_size,)
        s[f"{p}.o_proj.bias"] = (c.hidden_size,)
    if c.qk_norm:
        s[f"{p}.q_norm.weight"] = (c.head_dim,)
        s[f"{p}.k_norm.weight"] = (c.head_dim,)
    return s


def _gdn(c: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    hv = c.linear_num_value_heads
    return {
        f"{p}.in_proj.weight": (c.gdn_in_proj_size, c.hidden_size),
        f"{p}.conv.weight": (c.gdn_conv_size, c.linear_conv_kernel),
        f"{p}.A_log": (hv,),
        f"{p}.dt_bias": (hv,),
        f"{p}.norm.weight": (c.linear_value_head_dim,),
        f"{p}.out_proj.weight": (c.hidden_size, c.gdn_value_size),
    }


def _decoder(c: ModelConfig, p: str, kind: str) -> dict[str, tuple[int, ...]]:
    s = {f"{p}.input_norm.weight": (c.hidden_size,), f"{p}.post_norm.weight": (c.hidden_size,)}
    s.update(_attention(c, f"{p}.attn") if kind == ATTENTION else _gdn(c, f"{p}.gdn"))
    s[f"{p}.mlp.gate_up_proj.weight"] = (2 * c.intermediate_size, c.hidden_size)
    s[f"{p}.mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    return s


def canonical_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"embed.weight": (c.vocab_size, c.hidden_size), "norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i, kind in enumerate(c.layer_types):
        shapes.update(_decoder(c, f"layers.{i}", kind))
    for j in range(c.mtp_num_layers):
        shapes.update(_decoder(c, f"mtp.layers.{j}", ATTENTION))
    if c.mtp_num_layers:
        shapes["mtp.fc.weight"] = (c.hidden_size, 2 * c.hidden_size)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            shapes[f"mtp.{n}.weight"] = (c.hidden_size,)
    return shapes
