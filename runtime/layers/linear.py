"""Linear projection over canonical weights (the reference: a plain matmul in the compute dtype)."""

import torch


class Linear:
    def __init__(self, weights: dict[str, torch.Tensor], prefix: str):
        self.weight = weights[f"{prefix}.weight"]  # [out, in]
        self.bias = weights.get(f"{prefix}.bias")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)
