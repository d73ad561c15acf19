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
