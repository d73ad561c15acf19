"""Config presets for `atlas.tools.synthetic`: HF config.json contents, tiny (tests) and real-shape.

Each preset is exactly what a config.json of that model family holds and is readable by
transformers' AutoConfig. The real-shape presets reproduce the published configs as far as known;
fields we are not sure about are marked "unsure" in a comment.
"""

from __future__ import annotations


def _hybrid_layer_types(num_layers: int, interval: int = 4) -> list[str]:
    """Every `interval`-th layer is full attention, the rest Gated DeltaNet (as full_attention_interval)."""
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


# --- tiny presets: hidden 64, 4 layers, vocab 512, 4 heads / 2 kv heads ---------------------------

_TINY_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
    "torch_dtype": "float32",
}

# Hybrid (Gated DeltaNet + gated full attention) tiny shapes: 3 linear + 1 full layer, head_dim 32
# with a quarter of it rotary (8 dims), 2 key / 4 value linear heads of dim 16, conv kernel 4, 1 MTP layer.
_TINY_HYBRID = {
    **_TINY_COMMON,
    "head_dim": 32,
    "full_attention_interval": 4,
    "layer_types": _hybrid_layer_types(4),
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
}

TINY_PRESETS: dict[str, dict] = {
    "tiny-llama": {
        **_TINY_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "head_dim": 16,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        "tie_word_embeddings": False,
    },
    # Tied embeddings like the small real Qwen3 models (0.6B-4B), so the tied path is exercised.
    "tiny-qwen3": {
        **_TINY_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 4,
        "tie_word_embeddings": True,
    },
    # Qwen3-Next made dense: every layer in mlp_only_layers and num_experts 0, so transformers builds
    # Qwen3NextMLP everywhere. Legacy top-level rope keys, as the real Qwen3-Next config.json has them.
    "tiny-qwen3-next": {
        **_TINY_HYBRID,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "rope_scaling": None,
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0, 1, 2, 3],
        "moe_intermediate_size": 0,
        "shared_expert_intermediate_size": 0,
        "norm_topk_prob": True,
    },
    # Text-only Qwen3.5 (read by Qwen3_5ForCausalLM): weights named model.*, not model.language_model.*.
    "tiny-qwen3.5": {
        **_TINY_HYBRID,
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "attn_output_gate": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],  # sums to rotary_dim / 2 = 4
            "mrope_interleaved": True,
        },
    },
}

# The real Qwen3.5 layout (model_type qwen3_5, nested text_config, weights under model.language_model.*)
# at tiny shapes, so the real-checkpoint naming is tested end to end without 27B of weights.
TINY_PRESETS["tiny-qwen3.5-vl"] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {k: v for k, v in TINY_PRESETS["tiny-qwen3.5"].items() if k != "architectures"},
}


# Every linear of whole 128 x 128 tiles (qkv 256 x 128, o 128 x 128, gate_up 512 x 128, down 128 x 256, lm_head
# 512 x 128), so GPU engines of it run the tiled NVFP4 order (plugins_trt/quant_linear/layout.py).
TINY_PRESETS["tiny-llama-wide"] = {
    **TINY_PRESETS["tiny-llama"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "head_dim": 32,
}

# The hybrid at widths of whole 128-column tiles (hidden 128), with the two projections Qwen3.5 has off the 128-row
# tiles: the GDN in_proj (N = 2 x 32 + 2 x 64 + 2 x 4 = 200, as the 27B's 16480) and the gated attention's qkv (one KV
# head: N = 256 + 64 = 320). GPU engines of it run those two padded to whole tiles (build_engine/linear_kernels.py).
TINY_PRESETS["tiny-qwen3.5-wide"] = {
    **TINY_PRESETS["tiny-qwen3.5"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_key_value_heads": 1,
}


# --- real-shape presets ----------------------------------------------------------------------------

REAL_PRESETS: dict[str, dict] = {
    # meta-llama/Llama-3.1-8B(-Instruct) config.json. eos: the Instruct list; the base model has 128001.
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    },
    # Qwen/Qwen3-8B config.json.
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    # Qwen/Qwen3.5-27B config.json, text part. vision_config is left out: there are no vision weights,
    # and transformers fills a default one in (AutoModelForCausalLM builds Qwen3_5ForCausalLM from
    # text_config and drops the language_model prefix). Unsure: the token ids (text eos 248044 =
    # <|endoftext|>, image/video/vision ids) and "mamba_ssm_dtype", taken from secondary copies.
    "qwen3.5-27b": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_output_gate": True,
            "bos_token_id": None,
            "eos_token_id": 248044,
            "dtype": "bfloat16",
            "full_attention_interval": 4,
            "layer_types": _hybrid_layer_types(64),
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "initializer_range": 0.02,
            "intermediate_size": 17408,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 48,
            "linear_value_head_dim": 128,
            "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
            "mlp_only_layers": [],
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "num_attention_heads": 24,
            "num_hidden_layers": 64,
            "num_key_value_heads": 4,
            "pad_token_id": None,
            "partial_rotary_factor": 0.25,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {
                "mrope_interleaved": True,
                "mrope_section": [11, 11, 10],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000,
                "rope_type": "default",
            },
            "tie_word_embeddings": False,
            "use_cache": True,
            "vocab_size": 248320,
        },
    },
}

PRESETS: dict[str, dict] = {**TINY_PRESETS, **REAL_PRESETS}

# generation_config.json content where it differs from the config's bos/eos (real checkpoints ship
# a longer eos list there). Unsure for qwen3.5-27b: the <|im_end|> id 248046 comes from copies.
GENERATION: dict[str, dict] = {
    "llama-3.1-8b": {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
    "qwen3-8b": {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643},
    "qwen3.5-27b": {"eos_token_id": [248046, 248044], "pad_token_id": 248044},
}
