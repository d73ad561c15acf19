"""Hugging Face checkpoint directories: config.json plus one or sharded safetensors files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from atlas.build_engine.checkpoints.base import Checkpoint
from atlas.build_engine.errors import CheckpointError

# Files copied verbatim into the engine when the checkpoint has a fast tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the checkpoint is corrupt, re-download it.") from None


class HFCheckpoint(Checkpoint):
    """A directory as written by `save_pretrained`: config.json, *.safetensors, tokenizer files."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.source = str(self.path)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise CheckpointError(
                f"{self.path} has no config.json, so it is not a Hugging Face checkpoint directory."
            )
        self.config = _read_json(config_path)
        self._weight_map = self._index_weights()
        self._handles: dict[Path, object] = {}

    def _index_weights(self) -> dict[str, Path]:
        """tensor name -> safetensors file holding it."""
        index_path = self.path / "model.safetensors.index.json"
        if index_path.is_file():
            weight_map = _read_json(index_path).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path} has no 'weight_map'; the checkpoint is corrupt.")
            files = {name: self.path / f for name, f in weight_map.items()}
            for f in sorted(set(files.values())):
                if not f.is_file():
                    raise CheckpointError(
                        f"shard {f.name} listed in {index_path.name} is missing from {self.path}; "
                        f"the download is incomplete."
                    )
            return files
        shards = sorted(self.path.glob("*.safetensors"))
        if not shards:
            if any(self.path.glob("*.bin")) or any(self.path.glob("*.pt")):
                raise CheckpointError(
                    f"{self.path} holds PyTorch pickle weights; Atlas reads safetensors only. Convert with "
                    f"transformers: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out_dir)."
                )
            raise CheckpointError(f"{self.path} has no *.safetensors weights.")
        files = {}
        for shard in shards:
            for name in self._open(shard).keys():
                files[name] = shard
        return files

    def _open(self, file: Path):
        handle = self._handles.get(file) if hasattr(self, "_handles") else None
        if handle is None:
            try:
                handle = safe_open(str(file), framework="pt")
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(
                    f"cannot read {file}: {e}. The file is truncated or corrupt; re-download the checkpoint."
                ) from None
            if hasattr(self, "_handles"):
                self._handles[file] = handle
        return handle

    def tensor_names(self) -> list[str]:
        return list(self._weight_map)

    def get(self, name: str) -> torch.Tensor:
        file = self._weight_map.get(name)
        if file is None:
            raise self.missing(name)
        handle = self._open(file)
        try:
            return handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"cannot read tensor '{name}' from {file}: {e}. The file is truncated or corrupt; "
                f"re-download the checkpoint."
            ) from None

    def export_tokenizer(self, dest: Path) -> bool:
        if (self.path / "tokenizer.json").is_file():
            for name in TOKENIZER_FILES:
                if (self.path / name).is_file():
                    shutil.copy(self.path / name, dest / name)
            return True
        if (self.path / "tokenizer.model").is_file() or (self.path / "vocab.json").is_file():
            # A slow (sentencepiece / BPE-files) tokenizer: let transformers convert it to tokenizer.json.
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(self.path)).save_pretrained(str(dest))
            return True
        return False

    def generation_config(self) -> dict:
        path = self.path / "generation_config.json"
        return _read_json(path) if path.is_file() else {}
