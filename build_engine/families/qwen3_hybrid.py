"""Qwen3-Next and Qwen3.5 (dense): Gated DeltaNet layers interleaved with gated full attention.

Conventions mapped here: (1+w) RMSNorms (norm_offset 1) except the GDN output norm; q_proj holding
[q_h | gate_h] per head; partial RoPE (default 0.25); Qwen3-Next's grouped in_proj_qkvz / in_proj_ba
versus Qwen3.5's separate in_proj_qkv / z / b / a; MTP weights under `mtp.`.
"""

from __future__ import annotations

import re

import torch

from atlas.build_engine.errors import UnsupportedModelError
from atlas.build_engine.families.base import Family, WeightPlan, eos_ids, require, rope_params
from atlas.build_engine.families.llama import add_attention, add_embedding_and_head, add_mlp_and_norms
from atlas.runtime.config import ATTENTION, GDN, ModelConfig

HF_LAYER_TYPES = {"linear_attention": GDN, "full_attention": ATTENTION}


class Qwen3HybridFamily(Family):
    model_types = ("qwen3_next", "qwen3_5", "qwen3_5_text")

    def prepare(self, hf: dict) -> dict:
        if hf["model_type"] == "qwen3_5":
            # The released Qwen3.5 checkpoints are vision-language: the LM's fields sit in text_config.
            text = dict(hf.get("text_config") or {})
            text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
            text["model_type"] = "qwen3_5_text"
            return text
        return hf

    def canonical_config(self, hf: dict, generation: dict, names: set[str]) -> ModelConfig:
        model_type = hf["model_type"]
        vocab, hidden, inter, layers, heads = require(
            hf, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        if model_type == "qwen3_next":
            sparse = [i for i in range(layers) if i not in (hf.get("mlp_only_layers") or [])
                      and hf.get("num_experts", 0) > 0 and (i + 1) % hf.get("decoder_sparse_step", 1) == 0]
            if sparse:
                raise UnsupportedModelError(
                    f"this Qwen3-Next checkpoint has Mixture-of-Experts MLPs in {len(sparse)} of {layers} layers; "
                    f"Atlas supports dense MLPs only for now (MoE is planned)."
                )
        if hf.get("attention_bias"):
            raise UnsupportedModelError("attention biases are not supported for Qwen3-Next / Qwen3.5.")
        if hf.get("layer_types"):
            unknown = sorted(set(hf["layer_types"]) - set(HF_LAYER_TYPES))
            if unknown:
                raise UnsupportedModelError(f"layer types {unknown} are not supported (known: {sorted(HF_LAYER_TYPES)}).")
            layer_types = tuple(HF_LAYER_TYPES[t] for t in hf["layer_types"])
        else:
            interval = hf.get("full_attention_interval", 4)
            layer_types = tuple(ATTENTION if (i + 1) % interval == 0 else GDN for i in range(layers))
        head_dim = hf.get("head_dim") or hidden // heads
        theta, partial, scaling = rope_params(hf, default_partial=0.25)
        return ModelConfig(
            family="qwen3_5" if model_type.startswith("qwen3_5") else model_type,
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
            layer_types=layer_types,
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), norm_offset=1.0,
            rope_theta=theta, rotary_dim=int(head_dim * partial), rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=True, attn_output_gate=True,
            linear_num_key_heads=hf.get("linear_num_key_heads", 16),
            linear_num_value_heads=hf.get("linear_num_value_heads", 32),
            linear_key_head_dim=hf.get("linear_key_head_dim", 128),
            linear_value_head_dim=hf.get("linear_value_head_dim", 128),
            linear_conv_kernel=hf.get("linear_conv_kernel_dim", 4),
            mtp_num_layers=self.present_mtp_layers(names),  # the weights, not the config, decide
            bos_token_id=hf.get("bos_token_id", generation.get("bos_token_id")),
            eos_token_ids=eos_ids(hf, generation),
        )

    @staticmethod
    def present_mtp_layers(names: set[str]) -> int:
        """MTP layers whose weights the checkpoint actually holds (save_pretrained drops them)."""
        found = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
        return len(found)

    def weight_plan(self, config: ModelConfig, hf: dict, names: set[str]) -> WeightPlan:
        c = config
        prefix = "model.language_model" if any(n.startswith("model.language_model.") for n in names) else "model"
        plan = WeightPlan()
        add_embedding_and_head(plan, c, prefix)

        def split_gate(w: torch.Tensor):
            # q_proj rows are [q_h | gate_h] per head: [heads, 2, head_dim, H] -> q rows, gate rows
            w = w.view(c.num_heads, 2, c.head_dim, -1)
            return w[:, 0].reshape(c.q_size, -1), w[:, 1].reshape(c.q_size, -1)

        for i, kind in enumerate(c.layer_types):
            group, canon, src = f"layer_{i:03d}", f"layers.{i}", f"{prefix}.layers.{i}"
            if kind == ATTENTION:
                add_attention(plan, group, f"{canon}.attn", f"{src}.self_attn", c, split_gate=split_gate)
            else:
                self._add_gdn(plan, group, f"{canon}.gdn", f"{src}.linear_attn", c, names)
            add_mlp_and_norms(plan, group, canon, src)
        for j in range(c.mtp_num_layers):
            add_attention(plan, "mtp", f"mtp.layers.{j}.attn", f"mtp.layers.{j}.self_attn", c, split_gate=split_gate)
            add_mlp_and_norms(plan, "mtp", f"mtp.layers.{j}", f"mtp.layers.{j}")
        if c.mtp_num_layers:
            for name in ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
                plan.add("mtp", f"mtp.{name}", f"mtp.{name}")
        return plan

    @staticmethod
    def _add_gdn(plan: WeightPlan, group: str, canon: str, src: str, c: ModelConfig, names: set[str]):
        hk, dk, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim
        r = c.linear_num_value_heads // hk
        if f"{src}.in_proj_qkvz.weight" in names:
            def fuse_grouped(t: list[torch.Tensor]) -> torch.Tensor:
                # Qwen3-Next groups rows by key head: [q(dk) k(dk) v(r·dv) z(r·dv)] and [b(r) a(r)] per group.
                qkvz = t[0].view(hk, 2 * dk + 2 * r * dv, -1)
                q, k, v, z = (x.reshape(-1, qkvz.shape[-1]) for x in qkvz.split([dk, dk, r * dv, r * dv], dim=1))
                ba = t[1].view(hk, 2 * r, -1)
                b, a = (x.reshape(-1, ba.shape[-1]) for x in ba.split([r, r], dim=1))
                return torch.cat([q, k, v, z, b, a], dim=0)

            plan.add(group, f"{canon}.in_proj.weight", f"{src}.in_proj_qkvz.weight", f"{src}.in_proj_ba.weight",
                     combine=fuse_grouped)
        else:
            plan.add(group, f"{canon}.in_proj.weight", *(f"{src}.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")))
        plan.add(group, f"{canon}.conv.weight", f"{src}.conv1d.weight", combine=lambda t: t[0].reshape(t[0].shape[0], -1))
        plan.add(group, f"{canon}.A_log", f"{src}.A_log")
        plan.add(group, f"{canon}.dt_bias", f"{src}.dt_bias")
        plan.add(group, f"{canon}.norm.weight", f"{src}.norm.weight")
        plan.add(group, f"{canon}.out_proj.weight", f"{src}.out_proj.weight")
