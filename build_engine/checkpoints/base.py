"""The contract between checkpoint readers and the family mappings.

A reader exposes a checkpoint the way Hugging Face transformers would see it: `config` is the
content of config.json, tensor names are the names in the HF safetensors files. Readers for other
formats (GGUF, synthetic) translate into that picture, so the family mappings exist once.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path

import torch

from atlas.build_engine.errors import CheckpointError


class Checkpoint(abc.ABC):
    """A model checkpoint: an HF-style config and lazily read, HF-named tensors."""

    #: Human-readable description of where the checkpoint came from (path or name).
    source: str
    #: The checkpoint's config.json content (HF conventions, e.g. "model_type", "hidden_size").
    config: dict

    @abc.abstractmethod
    def tensor_names(self) -> list[str]:
        """Every tensor name in the checkpoint (HF naming)."""

    @abc.abstractmethod
    def get(self, name: str) -> torch.Tensor:
        """Read one tensor in its stored dtype (dequantized to float32 for quantized sources).

        Raises CheckpointError naming the tensor and the checkpoint when it is missing or unreadable.
        """

    def export_tokenizer(self, dest: Path) -> bool:
        """Write tokenizer.json and tokenizer_config.json (with the chat template) into `dest`.

        Returns False when the checkpoint carries no tokenizer.
        """
        return False

    def generation_config(self) -> dict:
        """Generation defaults shipped with the checkpoint (generation_config.json content), if any."""
        return {}

    def missing(self, name: str) -> CheckpointError:
        return CheckpointError(
            f"tensor '{name}' is missing from checkpoint {self.source}. The checkpoint is incomplete "
            f"or belongs to another model; re-download or re-export it."
        )


def open_checkpoint(spec: str | os.PathLike | None) -> Checkpoint:
    """Resolve what the user named: a directory, a .gguf file, `synthetic:<preset>`, or a built-in name.

    None means the embedded default model.
    """
    from atlas.build_engine.checkpoints import builtin

    if spec is None:
        spec = builtin.DEFAULT_MODEL
    spec = str(spec)
    if spec.startswith("synthetic:"):
        from atlas.tools.synthetic import SyntheticCheckpoint

        return SyntheticCheckpoint(spec.removeprefix("synthetic:"))
    path = Path(spec)
    if path.is_dir():
        from atlas.build_engine.checkpoints.hf import HFCheckpoint

        return HFCheckpoint(path)
    if path.is_file() and path.suffix == ".gguf":
        from atlas.build_engine.checkpoints.gguf_reader import GGUFCheckpoint

        return GGUFCheckpoint(path)
    if spec in builtin.BUILTIN_MODELS:
        return open_checkpoint(builtin.resolve(spec))
    if path.exists():
        raise CheckpointError(
            f"{spec} is neither a Hugging Face checkpoint directory nor a .gguf file. "
            f"Point atlas-build at the directory holding config.json, or at the .gguf file."
        )
    names = ", ".join(sorted(builtin.BUILTIN_MODELS))
    raise CheckpointError(
        f"no checkpoint at '{spec}'. Give a Hugging Face directory, a .gguf file, "
        f"'synthetic:<preset>', or a built-in model ({names})."
    )
