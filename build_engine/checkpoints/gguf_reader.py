"""Read a GGUF file (llama.cpp's format) as if it were a Hugging Face checkpoint.

The `gguf` package parses and dequantizes; this module only renames tensors to their HF names,
undoes llama.cpp's rotary row permutation of q/k (as transformers does when it loads a GGUF), and
builds an HF config.json-style dict from the GGUF metadata. Tensors are dequantized to float32 one
at a time, when asked for; the file itself stays memory-mapped by the reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from atlas.build_engine.checkpoints.base import Checkpoint
from atlas.build_engine.errors import CheckpointError, UnsupportedModelError

# GGUF architecture -> (HF model_type, HF architectures entry)
_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# per-block GGUF tensor stem -> HF module path inside model.layers.N
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",  # qwen3
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")


class GGUFCheckpoint(Checkpoint):
    """A GGUF file presented with an HF config and HF tensor names (float32, dequantized lazily)."""

    def __init__(self, path: Path):
        import gguf

        self.path = Path(path)
        self.source = str(self.path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file {self.path} does not exist.")
        try:
            self._reader = gguf.GGUFReader(self.path)
            tensors = list(self._reader.tensors)
        except Exception as exc:  # the reader raises ValueError/IndexError/... on bad bytes
            raise CheckpointError(
                f"{self.path} is not a readable GGUF file: it is corrupt or truncated "
                f"({type(exc).__name__}: {exc}). Re-download or re-export it."
            ) from exc
        size = self.path.stat().st_size
        for t in tensors:
            if int(t.data_offset) + int(t.n_bytes) > size:
                raise CheckpointError(
                    f"{self.path} is truncated: tensor '{t.name}' ends at byte "
                    f"{int(t.data_offset) + int(t.n_bytes)} but the file has {size} bytes. "
                    f"Re-download or re-export it."
                )

        self.architecture = str(self._meta("general.architecture", ""))
        if self.architecture not in _ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.path} has GGUF architecture '{self.architecture or '(none)'}', which Atlas "
                f"does not support yet. Supported GGUF architectures: {', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        if self._meta(f"{self.architecture}.expert_count", 0):
            raise UnsupportedModelError(
                f"{self.path} is a mixture-of-experts model ({self.architecture} with experts); "
                f"Atlas does not support MoE models yet."
            )

        self._tensors = {}  # HF name -> gguf ReaderTensor
        for t in tensors:
            self._tensors[self._hf_name(t.name)] = t
        self.config = self._build_config()

    # ----------------------------------------------------------------------------------- metadata

    def _meta(self, key: str, default=None):
        field = self._reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def _arch(self, key: str, default=None):
        return self._meta(f"{self.architecture}.{key}", default)

    def _token_id(self, kind: str):
        value = self._meta(f"tokenizer.ggml.{kind}_token_id")
        return None if value is None else int(value)

    def _num_tokens(self) -> int | None:
        field = self._reader.fields.get("tokenizer.ggml.tokens")
        return None if field is None else len(field.data)

    def _build_config(self) -> dict:
        model_type, hf_arch = _ARCHITECTURES[self.architecture]
        hidden = int(self._arch("embedding_length"))
        heads = int(self._arch("attention.head_count"))
        kv_heads = self._arch("attention.head_count_kv", heads)
        if isinstance(kv_heads, list):  # per-layer kv head counts (hybrid models)
            raise UnsupportedModelError(f"{self.path} has per-layer attention head counts; Atlas does not support that.")
        embed = self._tensors.get("model.embed_tokens.weight")
        vocab = self._num_tokens() or self._arch("vocab_size")
        if embed is not None and (vocab is None or int(vocab) != int(embed.shape[-1])):
            vocab = int(embed.shape[-1])  # the tensors are what the engine is built from

        config = {
            "model_type": model_type,
            "architectures": [hf_arch],
            "hidden_size": hidden,
            "intermediate_size": int(self._arch("feed_forward_length")),
            "num_hidden_layers": int(self._arch("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(kv_heads),
            "hidden_act": "silu",
            "rms_norm_eps": _f32(self._arch("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": _f32(self._arch("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._arch("context_length", 2048)),
            "vocab_size": int(vocab),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "torch_dtype": "float32",
        }
        head_dim = self._arch("attention.key_length")
        if head_dim is None and self.architecture == "llama":
            head_dim = self._arch("rope.dimension_count")  # what transformers maps for llama
        if head_dim is not None:
            config["head_dim"] = int(head_dim)
        if self.architecture in ("llama", "qwen3"):
            config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in self._tensors
        if self.architecture == "llama":
            config["mlp_bias"] = False

        rope_type = self._arch("rope.scaling.type")
        if rope_type not in (None, "", "none"):
            scaling = {"rope_type": str(rope_type), "type": str(rope_type)}
            factor = self._arch("rope.scaling.factor")
            if factor is not None:
                scaling["factor"] = float(factor)
            original = self._arch("rope.scaling.original_context_length")
            if original is not None:
                scaling["original_max_position_embeddings"] = int(original)
            attn_factor = self._arch("rope.scaling.attn_factor")
            if attn_factor is not None:
                scaling["attention_factor"] = float(attn_factor)
            config["rope_scaling"] = scaling

        for kind in ("bos", "eos"):
            token_id = self._token_id(kind)
            if token_id is not None:
                config[f"{kind}_token_id"] = token_id
        return config

    # ------------------------------------------------------------------------------------ tensors

    def _hf_name(self, gguf_name: str) -> str:
        if gguf_name in _GLOBAL_TENSORS:
            return _GLOBAL_TENSORS[gguf_name]
        m = _BLOCK_RE.fullmatch(gguf_name)
        if m and m.group(2) in _BLOCK_TENSORS:
            return f"model.layers.{m.group(1)}.{_BLOCK_TENSORS[m.group(2)]}.{m.group(3)}"
        if gguf_name == "rope_freqs.weight":
            raise UnsupportedModelError(
                f"{self.path} carries per-dimension rope frequency factors (rope_freqs, Llama 3.1-style "
                f"rope scaling); Atlas cannot read those from GGUF yet. Use the Hugging Face checkpoint."
            )
        raise UnsupportedModelError(
            f"{self.path} has tensor '{gguf_name}', which Atlas does not know for GGUF architecture "
            f"'{self.architecture}'."
        )

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str) -> torch.Tensor:
        import gguf

        tensor = self._tensors.get(name)
        if tensor is None:
            raise self.missing(name)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest-first
        try:
            weights = gguf.dequantize(tensor.data, tensor.tensor_type)
            weights = np.asarray(weights, dtype=np.float32).reshape(shape)
        except Exception as exc:
            raise CheckpointError(
                f"tensor '{name}' ({tensor.name}, {tensor.tensor_type.name}) in {self.path} cannot be "
                f"read: the file is corrupt or truncated ({type(exc).__name__}: {exc})."
            ) from exc
        if self.architecture == "llama":
            if ".attn_q." in tensor.name:
                weights = _reverse_permute(weights, self.config["num_attention_heads"])
            elif ".attn_k." in tensor.name:
                weights = _reverse_permute(weights, self.config["num_key_value_heads"])
        return torch.from_numpy(np.array(weights, dtype=np.float32, copy=True))

    # ---------------------------------------------------------------------------------- tokenizer

    def export_tokenizer(self, dest: Path) -> bool:
        if self._reader.fields.get("tokenizer.ggml.tokens") is None:
            return False
        import transformers

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
        except Exception as exc:
            raise CheckpointError(
                f"the tokenizer in {self.path} cannot be converted ({type(exc).__name__}: {exc})."
            ) from exc
        tokenizer.save_pretrained(str(dest))

        config_path = dest / "tokenizer_config.json"
        tok_config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        template = self._meta("tokenizer.chat_template")
        if template is None and (dest / "chat_template.jinja").is_file():
            template = (dest / "chat_template.jinja").read_text(encoding="utf-8")
        if template is not None:
            tok_config["chat_template"] = str(template)
        # transformers' GGUF llama converter takes the EOS token from the BOS id; the GGUF metadata
        # is authoritative for which tokens these are.
        tokens = self._reader.fields["tokenizer.ggml.tokens"]
        for kind in ("bos", "eos"):
            token_id = self._token_id(kind)
            if token_id is not None and 0 <= token_id < len(tokens.data):
                tok_config[f"{kind}_token"] = str(tokens.contents(token_id))
                tok_config[f"{kind}_token_id"] = token_id
            else:
                tok_config.setdefault(f"{kind}_token", getattr(tokenizer, f"{kind}_token", None))
        config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return True

    def generation_config(self) -> dict:
        out = {}
        for kind in ("bos", "eos"):
            token_id = self._token_id(kind)
            if token_id is not None:
                out[f"{kind}_token_id"] = token_id
        return out


def _f32(value) -> float:
    """A float32 metadata value as the decimal it was written from (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _reverse_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (transformers' LlamaTensorProcessor._reverse_permute_weights)."""
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)
