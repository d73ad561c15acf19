"""Activation references."""

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up for the fused [gate | up] projection output. gate_up: [..., 2I] -> [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
