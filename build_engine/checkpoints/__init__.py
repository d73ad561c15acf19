"""Checkpoint readers. Each presents a checkpoint as a Hugging Face config dict plus named tensors
in Hugging Face naming, so that one family mapping serves every source format."""

from atlas.build_engine.checkpoints.base import Checkpoint, open_checkpoint

__all__ = ["Checkpoint", "open_checkpoint"]
