"""Token embedding gather in Triton: out[t] = table[ids[t]] (reference.embedding).

An id outside [0, V) writes a zero row: padding tokens of a fixed-size (CUDA-graph) batch never read out of
bounds, and nothing is checked on the host. The kernel takes pointers, ints and constexprs only (compiled ahead
of time); `launch_embedding` launches it through atlas.plugins_trt.launch (JIT, or the engine's cubins with `aot=`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter


@triton.jit
def embedding_kernel(
    ids,                            # int32 / int64 [T]
    table, stride_table,            # [V, H] (unit column stride)
    out, stride_out,                # [T, H]
    V, H,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (T, cdiv(H, BLOCK))."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tok = tl.load(ids + t).to(tl.int64)
    valid = (tok >= 0) & (tok < V)
    mask = h < H
    row = tl.load(table + tok * stride_table + h, mask=mask & valid, other=0.0)
    tl.store(out + t.to(tl.int64) * stride_out + h, row.to(out.dtype.element_ty), mask=mask)


def launch_embedding(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor | None = None, BLOCK: int = 1024,
                     num_warps: int = 4, aot=None, pdl: bool = False) -> torch.Tensor:
    """Rows of table [V, H] (bf16 / fp16 / fp32) for ids int32 / int64 [T] -> out [T, H].

    out: [T, H] with unit column stride, default a new tensor in the table's dtype.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out.
    """
    V, H = table.shape
    T = ids.shape[0]
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or (T > 1 and ids.stride(0) != 1) \
            or table.stride(1) != 1:  # ids are read at ids + t
        raise ValueError(f"embedding: expected contiguous ids int32/int64 [T] and a table [V, H] with unit column "
                         f"stride; got ids {ids.dtype} {tuple(ids.shape)} strides {ids.stride()}, table strides "
                         f"{table.stride()}")
    out = torch.empty((T, H), dtype=table.dtype, device=table.device) if out is None else out
    if out.shape != (T, H) or out.stride(1) != 1:
        raise ValueError(f"out: expected [{T}, {H}] with unit column stride, got {tuple(out.shape)}")
    if T == 0:
        return out
    BLOCK = min(BLOCK, triton.next_power_of_2(H))
    # table and out may be views with strided rows
    launch(embedding_kernel, (T, triton.cdiv(H, BLOCK)), (ids, table, table.stride(0), out, out.stride(0), V, H),
           dict(BLOCK=BLOCK, PDL=pdl), num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=("table", "out"))
    return out
