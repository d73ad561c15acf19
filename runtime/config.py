"""The canonical model config: the one description of a model the runtime understands.

The build stage maps each family's Hugging Face config onto this; the engine's manifest stores it;
the runtime builds layers from it and nothing else. Field names follow the math, not any one family.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

ATTENTION = "attention"  # full (softmax) attention with a KV cache
GDN = "gdn"  # Gated DeltaNet: causal conv1d + gated delta-rule recurrence
MIXER_TYPES = (ATTENTION, GDN)


@dataclass(frozen=True)
class ModelConfig:
    family: str
    """Source family (llama, qwen3, qwen3_next, qwen3_5); informational, the runtime never branches on it."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    """Token mixer of each decoder layer, one of MIXER_TYPES. Every layer has a dense SiLU-gated MLP."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    norm_offset: float = 0.0
    """RMSNorm weight convention: y = x̂·(offset + w). 0 for Llama/Qwen3, 1 for Qwen3-Next/Qwen3.5's (1+w).
    Applies to every RMSNorm except the GDN output's gated norm, which always uses a plain weight."""
    rope_theta: float = 10000.0
    rotary_dim: int = 0
    """Leading dims of each head rotated by RoPE (neox style); head_dim·partial_rotary_factor."""
    rope_scaling: dict | None = None
    """None, or {"rope_type": "llama3" | "linear", ...} with that type's parameters, as in HF configs."""
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """q/k/v and o projections carry biases (Llama's attention_bias)."""
    qk_norm: bool = False
    """RMSNorm over head_dim on q and k before RoPE (Qwen3, Qwen3-Next, Qwen3.5)."""
    attn_output_gate: bool = False
    """Attention output multiplied by sigmoid(gate), gate projected beside q (Qwen3-Next, Qwen3.5)."""
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    mtp_num_layers: int = 0
    """Multi-token-prediction draft layers kept in the engine (Qwen3-Next / Qwen3.5 `mtp.*`)."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        def need(cond: bool, what: str):
            if not cond:
                raise ValueError(f"invalid model config: {what}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            need(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        need(len(self.layer_types) == self.num_layers,
             f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = sorted(set(self.layer_types) - set(MIXER_TYPES))
        need(not bad, f"unknown layer types {bad}; known: {MIXER_TYPES}")
        need(self.num_heads % self.num_kv_heads == 0,
             f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        need(0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0,
             f"rotary_dim {self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]")
        need(self.norm_offset in (0.0, 1.0), f"norm_offset must be 0 or 1, got {self.norm_offset}")
        if GDN in self.layer_types:
            for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                         "linear_value_head_dim", "linear_conv_kernel"):
                need(getattr(self, name) > 0, f"{name} must be positive for Gated DeltaNet layers")
            need(self.linear_num_value_heads % self.linear_num_key_heads == 0,
                 "linear_num_value_heads must be a multiple of linear_num_key_heads")

    # Derived sizes, named once so layers and the build agree on fused layouts.
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        """Rows of the fused attention input projection: [q | gate? | k | v]."""
        return self.q_size * (2 if self.attn_output_gate else 1) + 2 * self.kv_size

    @property
    def gdn_key_size(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_size(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_conv_size(self) -> int:
        """Channels of the causal conv: [q_all | k_all | v_all]."""
        return 2 * self.gdn_key_size + self.gdn_value_size

    @property
    def gdn_in_proj_size(self) -> int:
        """Rows of the fused GDN input projection: [q | k | v | z | b | a]."""
        return self.gdn_conv_size + self.gdn_value_size + 2 * self.linear_num_value_heads

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown model config fields {unknown}")
        d = dict(d)
        d["layer_types"] = tuple(d["layer_types"])
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)
