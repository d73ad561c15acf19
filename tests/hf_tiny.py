"""Tiny random-initialised Hugging Face checkpoints made with transformers, one per family."""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
HYBRID = dict(head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})

def _config(name: str, **kwargs):
    import transformers

    return getattr(transformers, name)(**kwargs)


FAMILIES = {
    "llama": lambda: _config("LlamaConfig",
        **COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama_tied": lambda: _config("LlamaConfig", **COMMON, tie_word_embeddings=True),
    "qwen3": lambda: _config("Qwen3Config", **COMMON, head_dim=32, tie_word_embeddings=False),
    "qwen3_next": lambda: _config("Qwen3NextConfig", **COMMON, **HYBRID, num_experts=0, mlp_only_layers=[0, 1, 2, 3]),
    "qwen3_5": lambda: _config("Qwen3_5TextConfig", **COMMON, **HYBRID),
}


def _randomize_norms(model: torch.nn.Module, seed: int) -> None:
    """HF initialises norm weights to exactly 0 or 1 (and biases to 0): draw them so tests see real values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "dt_bias" in name):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def make_checkpoint(family: str, path: Path, seed: int = 0, **overrides) -> Path:
    """Write a tiny random checkpoint of `family` to `path` (config.json + model.safetensors)."""
    import transformers

    torch.manual_seed(seed)
    config = FAMILIES[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_norms(model, seed)
    model.save_pretrained(path)
    return path
