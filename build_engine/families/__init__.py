"""Model families Atlas can build, keyed by the HF config's model_type."""

from __future__ import annotations

from atlas.build_engine.errors import UnsupportedModelError
from atlas.build_engine.families.base import Family
from atlas.build_engine.families.llama import LlamaFamily
from atlas.build_engine.families.qwen3_hybrid import Qwen3HybridFamily

FAMILIES: dict[str, Family] = {}
for _family in (LlamaFamily(), Qwen3HybridFamily()):
    for _t in _family.model_types:
        FAMILIES[_t] = _family

# Known families that need a feature Atlas lacks, so the error can say which.
MOE_MODEL_TYPES = ("qwen3_moe", "qwen3_5_moe", "qwen3_5_moe_text", "qwen2_moe", "mixtral", "deepseek_v3", "gpt_oss")


def family_for(hf_config: dict) -> Family:
    model_type = hf_config.get("model_type")
    supported = ", ".join(sorted(FAMILIES))
    if model_type in MOE_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type '{model_type}' is a Mixture-of-Experts model; Atlas supports dense MLPs only for now. "
            f"Supported families: {supported}."
        )
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model family '{model_type}' is not supported. Supported families (config.json model_type): {supported}."
        )
    return FAMILIES[model_type]
