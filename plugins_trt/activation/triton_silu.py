"""SiLU-gated MLP activation in Triton: silu(gate) · up over the fused [gate | up] projection rows.

    out[t, i] = silu(gate_up[t, i]) · gate_up[t, I + i]          i = 0 .. I-1

fp32 math; silu(gate) is rounded to the io dtype before the product, as reference.silu_mul does in bf16 / fp16
(F.silu returns the input dtype) and vLLM's silu_and_mul does, so the kernel matches the eager MLP to the bit.
The kernel takes pointers, ints and constexprs only (compiled ahead of time); `launch_silu_mul` launches it
through atlas.plugins_trt.launch (JIT, or the engine's cubins with `aot=`), free of host reads of device values
(safe inside CUDA graph capture, and runs on meta tensors when the build records it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter


@triton.jit
def silu_mul_kernel(
    gate_up, stride_in,             # [T, 2I] rows [gate | up] (unit column stride)
    out, stride_out,                # [T, I]
    I,                              # intermediate size
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (T, cdiv(I, BLOCK))."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = i < I
    row = gate_up + t * stride_in
    g = tl.load(row + i, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(row + I + i, mask=mask, other=0.0).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(gate_up.dtype.element_ty).to(tl.float32)
    tl.store(out + t * stride_out + i, (act * u).to(out.dtype.element_ty), mask=mask)


def launch_silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None, BLOCK: int = 1024,
                    num_warps: int = 4, aot=None, pdl: bool = False) -> torch.Tensor:
    """silu(gate) · up for gate_up [T, 2I] (bf16 / fp16 / fp32, rows may be strided, unit column stride).

    out: [T, I] (unit column stride), default a new tensor in gate_up's dtype.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out.
    """
    T, two_i = gate_up.shape
    if two_i % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"gate_up: expected [T, 2I] with unit column stride, got {tuple(gate_up.shape)} "
                         f"strides {gate_up.stride()}")
    I = two_i // 2
    out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    if out.shape != (T, I) or out.stride(1) != 1:
        raise ValueError(f"out: expected [{T}, {I}] with unit column stride, got {tuple(out.shape)}")
    if T == 0:
        return out
    BLOCK = min(BLOCK, triton.next_power_of_2(I))
    # both may be views with strided rows
    launch(silu_mul_kernel, (T, triton.cdiv(I, BLOCK)), (gate_up, gate_up.stride(0), out, out.stride(0), I),
           dict(BLOCK=BLOCK, PDL=pdl), num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=("gate_up", "out"))
    return out
