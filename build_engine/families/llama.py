"""Llama (SmolLM2 included) and Qwen3 (Llama + QK-norm): dense decoders with full attention."""

from __future__ import annotations

import torch

from atlas.build_engine.errors import UnsupportedModelError
from atlas.build_engine.families.base import Family, WeightPlan, eos_ids, require, rope_params
from atlas.runtime.config import ATTENTION, ModelConfig


def add_attention(plan: WeightPlan, group: str, canon: str, hf: str, config: ModelConfig, split_gate=None):
    """Fused [q | gate? | k | v] projection, o_proj and QK-norms of one attention layer.

    split_gate(q_proj_weight) -> (q_rows, gate_rows) for checkpoints whose q_proj interleaves the gate.
    """
    names = [f"{hf}.q_proj.weight", f"{hf}.k_proj.weight", f"{hf}.v_proj.weight"]
    if split_gate is None:
        plan.add(group, f"{canon}.qkv_proj.weight", *names)
    else:
        plan.add(group, f"{canon}.qkv_proj.weight", *names,
                 combine=lambda t: torch.cat([*split_gate(t[0]), t[1], t[2]], dim=0))
    plan.add(group, f"{canon}.o_proj.weight", f"{hf}.o_proj.weight")
    if config.attention_bias:
        plan.add(group, f"{canon}.qkv_proj.bias", f"{hf}.q_proj.bias", f"{hf}.k_proj.bias", f"{hf}.v_proj.bias")
        plan.add(group, f"{canon}.o_proj.bias", f"{hf}.o_proj.bias")
    if config.qk_norm:
        plan.add(group, f"{canon}.q_norm.weight", f"{hf}.q_norm.weight")
        plan.add(group, f"{canon}.k_norm.weight", f"{hf}.k_norm.weight")


def add_mlp_and_norms(plan: WeightPlan, group: str, canon: str, hf: str):
    plan.add(group, f"{canon}.input_norm.weight", f"{hf}.input_layernorm.weight")
    plan.add(group, f"{canon}.post_norm.weight", f"{hf}.post_attention_layernorm.weight")
    plan.add(group, f"{canon}.mlp.gate_up_proj.weight", f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight")
    plan.add(group, f"{canon}.mlp.down_proj.weight", f"{hf}.mlp.down_proj.weight")


def add_embedding_and_head(plan: WeightPlan, config: ModelConfig, prefix: str = "model"):
    plan.add("embedding", "embed.weight", f"{prefix}.embed_tokens.weight")
    plan.add("head", "norm.weight", f"{prefix}.norm.weight")
    if not config.tie_word_embeddings:
        plan.add("head", "lm_head.weight", "lm_head.weight")


class LlamaFamily(Family):
    model_types = ("llama", "qwen3")

    def canonical_config(self, hf: dict, generation: dict, names: set[str]) -> ModelConfig:
        model_type = hf["model_type"]
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act '{hf['hidden_act']}' is not supported; Atlas runs SiLU MLPs.")
        if hf.get("mlp_bias"):
            raise UnsupportedModelError("MLP biases (mlp_bias: true) are not supported.")
        if model_type == "qwen3" and hf.get("use_sliding_window"):
            raise UnsupportedModelError("sliding-window attention (use_sliding_window: true) is not supported.")
        vocab, hidden, inter, layers, heads = require(
            hf, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        head_dim = hf.get("head_dim") or hidden // heads
        theta, partial, scaling = rope_params(hf)
        return ModelConfig(
            family=model_type,
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
            layer_types=(ATTENTION,) * layers,
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rotary_dim=int(head_dim * partial), rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            bos_token_id=hf.get("bos_token_id", generation.get("bos_token_id")),
            eos_token_ids=eos_ids(hf, generation),
        )

    def weight_plan(self, config: ModelConfig, hf: dict, names: set[str]) -> WeightPlan:
        plan = WeightPlan()
        add_embedding_and_head(plan, config)
        for i in range(config.num_layers):
            group = f"layer_{i:03d}"
            add_attention(plan, group, f"layers.{i}.attn", f"model.layers.{i}.self_attn", config)
            add_mlp_and_norms(plan, group, f"layers.{i}", f"model.layers.{i}")
        return plan
