"""Fused Gated DeltaNet decode (T = 1) for a batch: conv update + gating + L2 norm + delta rule
(+ optional gated RMSNorm) in one launch of `gdn_recurrent_kernel`, state and conv window updated
in place in their slots.

Bytes per layer and sequence (the floor): the state read once and written once (HV·DK·DV·4·2 bytes
in fp32: 6.3 MB for HV 48, D 128), plus the conv window, weights and the token's inputs (~100 KB).
"""

from __future__ import annotations

import torch

from atlas.plugins_trt.gated_delta_net.triton_recurrent import launch_recurrent, rows


def launch_gdn_decode(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_weight: torch.Tensor,
                      A_log: torch.Tensor, dt_bias: torch.Tensor, window: torch.Tensor, state: torch.Tensor,
                      slots: torch.Tensor, num_k_heads: int, conv_bias: torch.Tensor | None = None,
                      z: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                      norm_eps: float = 1e-6, out: torch.Tensor | None = None, BV: int | None = None,
                      num_warps: int | None = None, aot=None, pdl: bool = False) -> torch.Tensor:
    """One decode step for B sequences.

    mixed_qkv: [B, C] raw in_proj rows [q | k | v] before the conv (any row stride);
    a, b: [B, HV] raw gate inputs (views into the in_proj output are fine; one row stride);
    conv_weight [C, KW]; A_log, dt_bias [HV]; window [num_slots, C, KW-1]; state [num_slots, HV, DK, DV]
    (fp32, or bf16); slots int32 [B] (distinct; negative = padding, skipped).
    z [B, HV·DV] and norm_weight [DV]: if given, returns norm_weight · rmsnorm(o) · silu(z) instead of o.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    No host-device synchronisation: capturable in a CUDA graph with static inputs (runtime/cuda_ops.py).
    Returns o [B, HV, DV] in mixed_qkv's dtype.
    """
    B, C = mixed_qkv.shape
    _, HV, DK, DV = state.shape
    o = torch.empty((B, HV, DV), dtype=mixed_qkv.dtype, device=mixed_qkv.device) if out is None else out
    launch_recurrent(rows(mixed_qkv, "mixed_qkv", C), rows(a, "a", HV), rows(b, "b", HV), conv_weight, conv_bias,
                     A_log, dt_bias, window, state, slots, num_k_heads=num_k_heads, T=1, o=o.view(B, HV * DV),
                     z=rows(z, "z", HV * DV) if z is not None else None, norm_weight=norm_weight,
                     norm_eps=norm_eps, in_place=True, BV=BV, num_warps=num_warps, aot=aot, pdl=pdl)
    return o
