"""RMSNorm references (fp32 math, output in the input dtype)."""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """y = x / rms(x) · (offset + w), over the last dim.

    x: [..., D]; weight: [D]. offset 0 is the Llama convention, 1 the (1+w) of Qwen3-Next / Qwen3.5.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (offset + weight.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = w · x / rms(x) · silu(gate): the Gated DeltaNet output norm (plain weight, norm before gate).

    x, gate: [..., D]; weight: [D].
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf * F.silu(gate.float())).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's `residual = residual + x; y = rms_norm(residual)` as one step (vLLM's fused_add_rms_norm).

    x: [..., D] (a sublayer's output); residual: [..., D] (the residual stream); weight: [D].
    Returns (y in x's dtype, the new residual in residual's dtype). The sum is rounded to residual's dtype
    before it is normalised, exactly as the eager decoder (runtime/layers/decoder.py) stores and then norms it.
    """
    h = (x.float() + residual.float()).to(residual.dtype)
    return rms_norm(h, weight, eps, offset).to(x.dtype), h
