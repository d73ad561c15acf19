"""RMSNorm in Triton: plain, fused with the residual add, and gated (the Gated DeltaNet output norm).

One program normalises one vector of N values held whole in registers (BLOCK = next power of two >= N, up to
8192: the hidden sizes of the decoder norms), fp32 math, io in the tensors' dtypes:

    plain:     y = x̂ · (offset + w)                      x̂ = x / sqrt(mean(x²) + eps)
    residual:  h = x + residual  (stored in residual's dtype, the new residual stream);  y = ĥ · (offset + w)
    gated:     y = x̂ · w · silu(gate)                    (offset 0: the GDN norm has a plain weight)

The residual form is vLLM's fused_add_rms_norm: the sum is rounded to the residual's dtype before it is
normalised, as the eager decoder stores it (reference.fused_add_rms_norm). Every program reads its whole
vector before it writes, so `out` may alias x and `residual_out` may alias residual (in place).

Kernels take pointers, ints, one fp32 and constexprs only, so they compile ahead of time; `launch_*` launch them
through atlas.plugins_trt.launch (JIT, or the engine's cubins with `aot=`). No launch reads a device value on the
host: they are safe inside CUDA graph capture, and run on meta tensors when the build records them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter

MAX_N = 8192
"""Largest vector one program normalises (registers: 8192 fp32 over 16 warps is 16 values a thread)."""


@triton.jit
def add_residual(xv, residual, residual_out, mask):
    """h = xv + residual, rounded to residual_out's dtype and stored there (the new residual stream); returns h
    as stored, in fp32 (the norm reads that). residual, residual_out: pointer blocks of xv's shape."""
    h = (xv + tl.load(residual, mask=mask, other=0.0).to(tl.float32)).to(residual_out.dtype.element_ty)
    tl.store(residual_out, h, mask=mask)
    return h.to(tl.float32)


@triton.jit
def rms_norm_values(xv, weight, mask, N, eps, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    """x̂ · (OFFSET + w) in fp32 of one vector xv fp32 [BLOCK] (zero past N); weight: [N]."""
    rstd = tl.rsqrt(tl.sum(xv * xv, axis=0) / N + eps)
    w = tl.load(weight + tl.arange(0, BLOCK), mask=mask, other=0.0).to(tl.float32)
    return xv * rstd * (OFFSET + w)


@triton.jit
def rms_norm_kernel(
    x, stride_x,                    # [M, G·N] (unit column stride; rows stride_x elements apart)
    residual, stride_r,             # [M, N] read if HAS_RESIDUAL
    residual_out, stride_ro,        # [M, N] written if HAS_RESIDUAL (may alias residual)
    gate, stride_g,                 # [M, G·N] read if HAS_GATE
    weight,                         # [N]
    y, stride_y,                    # [M, G·N] (may alias x)
    N,                              # values per normalised vector
    eps,                            # fp32
    OFFSET: tl.constexpr,           # 0: x̂·w (Llama), 1: x̂·(1+w) (Qwen3-Next / Qwen3.5)
    HAS_RESIDUAL: tl.constexpr,
    HAS_GATE: tl.constexpr,
    BLOCK: tl.constexpr,            # power of two >= N
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (M, G): program (m, g) normalises the N values at columns g·N .. g·N+N-1 of row m
    (G = 1 for the decoder norms, G = heads for the gated per-head norm)."""
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * N + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < N
    xv = tl.load(x + m * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        xv = add_residual(xv, residual + m * stride_r + col, residual_out + m * stride_ro + col, mask)
    out = rms_norm_values(xv, weight, mask, N, eps, OFFSET, BLOCK)
    if HAS_GATE:
        gv = tl.load(gate + m * stride_g + col, mask=mask, other=0.0).to(tl.float32)
        out = out * (gv * tl.sigmoid(gv))
    tl.store(y + m * stride_y + col, out.to(y.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------- launchers


def norm_config(N: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for vectors of N values: about 16 values a thread, 1 to 16 warps."""
    if N > MAX_N:
        raise ValueError(f"RMSNorm over {N} values: one program holds at most {MAX_N}; "
                         f"hidden sizes past that need a looped kernel")
    block = triton.next_power_of_2(N)
    return block, min(max(block // 512, 1), 16)


# Every vector operand may be a view with strided rows (a column slice of a projection output); only the weight
# is read from the start of its own allocation. (A strided row's offset is a run-time int, so an aligned base
# would not make its loads wider anyway.)
_VIEWS = ("x", "residual", "residual_out", "gate", "y")


def _rows(name: str, t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t as a [rows, cols] view with unit column stride; never a copy (an output must be written in place)."""
    try:
        t2 = t.view(rows, cols)
    except RuntimeError:
        t2 = None
    if t2 is None or t2.stride(1) != 1:
        raise ValueError(f"{name}: expected {rows} rows of {cols} contiguous values (rows may be strided), got "
                         f"shape {tuple(t.shape)} strides {t.stride()}")
    return t2


def launch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0,
                    residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                    residual_out: torch.Tensor | None = None, aot=None, pdl: bool = False) -> torch.Tensor:
    """y = rms_norm(x) or, with `residual`, residual_out = x + residual; y = rms_norm(residual_out).

    x: [..., N] bf16 / fp16 / fp32 (rows may be strided, unit column stride), N <= 8192;
    weight: [N] (any float dtype, read as fp32); offset: 0 or 1 (y = x̂·(offset + w));
    residual: [..., N] or None; residual_out: [..., N] in residual's dtype, default residual itself (in place);
    out: [..., N], default a new tensor in x's dtype (may be x itself).
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out. Math in fp32; the new residual is rounded to its dtype before it is normalised.
    """
    N = x.shape[-1]
    if offset not in (0.0, 1.0):
        raise ValueError(f"offset must be 0 or 1, got {offset}")
    if weight.shape != (N,):
        raise ValueError(f"weight: expected [{N}], got {tuple(weight.shape)}")
    M = x.numel() // N
    x2 = _rows("x", x, M, N)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    y2 = _rows("out", out, M, N)
    if residual is None:
        r2 = ro2 = x2  # not read
    else:
        r2 = _rows("residual", residual, M, N)
        ro2 = r2 if residual_out is None else _rows("residual_out", residual_out, M, N)
    if M == 0:
        return out
    block, warps = norm_config(N)
    launch(rms_norm_kernel, (M, 1),
           (x2, x2.stride(0), r2, r2.stride(0), ro2, ro2.stride(0), x2, 0, weight, y2, y2.stride(0), N, float(eps)),
           dict(OFFSET=int(offset), HAS_RESIDUAL=residual is not None, HAS_GATE=False, BLOCK=block, PDL=pdl),
           warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=_VIEWS)
    return out


def launch_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                          out: torch.Tensor | None = None, aot=None, pdl: bool = False) -> torch.Tensor:
    """y = w · rms_norm(x) · silu(gate) over each head (reference.gated_rms_norm).

    x: [M, G·N] or [M, G, N] (one row per token, G heads of N values; rows may be strided);
    gate: the same shape (e.g. a column slice of the fused GDN input projection: its own row stride);
    weight: [N] (plain weight, no offset). out: x's shape, default a new tensor in x's dtype.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out.
    """
    N = weight.shape[0]
    M = x.shape[0]
    cols = x.shape[1] * (x.shape[2] if x.dim() == 3 else 1)
    if cols % N or gate.shape != x.shape:
        raise ValueError(f"gated norm: x {tuple(x.shape)} must hold whole heads of {N} and match gate "
                         f"{tuple(gate.shape)}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    x2, g2, y2 = (_rows(name, t, M, cols) for name, t in (("x", x), ("gate", gate), ("out", out)))
    if M == 0:
        return out
    block, warps = norm_config(N)
    launch(rms_norm_kernel, (M, cols // N),
           (x2, x2.stride(0), x2, 0, x2, 0, g2, g2.stride(0), weight, y2, y2.stride(0), N, float(eps)),
           dict(OFFSET=0, HAS_RESIDUAL=False, HAS_GATE=True, BLOCK=block, PDL=pdl),
           warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=_VIEWS)
    return out
