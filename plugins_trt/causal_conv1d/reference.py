"""Depthwise causal conv1d with a per-sequence window (reference)."""

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None, activation: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """y[t, c] = act(sum_j weight[c, j] · xx[t + j, c] + bias[c]) with xx = [window; x].

    x: [T, C] new inputs; window: [C, K-1] the previous K-1 inputs (zeros for a fresh sequence);
    weight: [C, K]. Returns y [T, C] and the new window [C, K-1] (the last K-1 inputs of xx).
    The same call serves prefill (T = prompt length) and decode (T = 1).
    """
    K = weight.shape[1]
    xx = torch.cat((window.to(x.dtype).T, x), dim=0)  # xx: [K-1+T, C]
    y = F.conv1d(xx.T.unsqueeze(0).float(), weight.float().unsqueeze(1), bias, groups=weight.shape[0])
    y = y[0].T  # y: [T, C]
    if activation:
        y = F.silu(y)
    return y.to(x.dtype), xx[-(K - 1):].T.contiguous()
