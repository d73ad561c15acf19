"""What a model family tells the builder: its canonical config, and where each canonical weight comes from.

Weight fusions are declared here once, as data: a canonical tensor is a list of HF tensors and the
function that combines them (by default, concatenation along the output dim).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from atlas.build_engine.errors import UnsupportedModelError
from atlas.plugins_trt.rope.reference import SUPPORTED_ROPE_TYPES
from atlas.runtime.config import ModelConfig


def concat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)


@dataclass(frozen=True)
class WeightSource:
    """A canonical tensor = combine([checkpoint[name] for name in hf_names])."""

    hf_names: tuple[str, ...]
    combine: Callable[[list[torch.Tensor]], torch.Tensor] = concat


@dataclass
class WeightPlan:
    """Canonical weights grouped by engine file: the builder reads, converts and writes one group at a time,
    so memory stays bounded by the largest group (one decoder layer, or the embedding)."""

    groups: dict[str, dict[str, WeightSource]] = field(default_factory=dict)

    def add(self, group: str, canonical: str, *hf_names: str, combine=concat):
        self.groups.setdefault(group, {})[canonical] = WeightSource(tuple(hf_names), combine)


class Family:
    """One HF model family. Subclasses set `model_types` and implement the two mappings."""

    model_types: tuple[str, ...] = ()

    def canonical_config(self, hf: dict, generation: dict, names: set[str]) -> ModelConfig:
        """hf: the prepared config dict; generation: generation_config.json; names: the checkpoint's tensors."""
        raise NotImplementedError

    def weight_plan(self, config: ModelConfig, hf: dict, names: set[str]) -> WeightPlan:
        raise NotImplementedError

    def prepare(self, hf: dict) -> dict:
        """The config dict holding the language model's fields (e.g. a VLM's text_config)."""
        return hf


# ---- helpers shared by the families -------------------------------------------------------------

def rope_params(hf: dict, default_partial: float = 1.0) -> tuple[float, float, dict | None]:
    """(rope_theta, partial_rotary_factor, scaling) from either config style.

    transformers >= 5 writes `rope_parameters` {rope_theta, rope_type, partial_rotary_factor, ...};
    older configs have top-level rope_theta / partial_rotary_factor and a `rope_scaling` dict.
    """
    params = dict(hf.get("rope_parameters") or {})
    params.update(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    partial = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", default_partial)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE scaling type '{rope_type}' is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})."
        )
    scaling = None
    if rope_type != "default":
        keys = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
        scaling = {"rope_type": rope_type, **{k: params[k] for k in keys[rope_type]}}
    return theta, partial, scaling


def eos_ids(hf: dict, generation: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (hf.get("eos_token_id"), generation.get("eos_token_id")):
        for i in source if isinstance(source, list) else [source]:
            if i is not None and i not in ids:
                ids.append(int(i))
    return tuple(ids)


def require(hf: dict, *keys: str) -> list:
    missing = [k for k in keys if k not in hf]
    if missing:
        raise UnsupportedModelError(f"config.json lacks {', '.join(missing)}; the checkpoint's config is incomplete.")
    return [hf[k] for k in keys]
