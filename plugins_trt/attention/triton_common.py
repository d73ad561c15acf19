"""What the paged attention kernels (triton_decode.py, triton_prefill.py) share: the gather of a K/V tile through
the block table, the clamp of a context length, the online-softmax step, and the launchers' input checks.

The cache layout is runtime/kv_cache.py's: k_cache, v_cache [num_blocks, block_size, Hkv, D] contiguous, token t
of a sequence at slot block_tables[b, t // block_size] · block_size + t % block_size, float8_e4m3fn read as
stored · scale. The kernels work in log2 units: scores are scaled by sm_scale · log2(e) (and k_scale for FP8)
so that the softmax uses exp2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)

KV_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float8_e4m3fn: "*fp8e4nv"}
"""Cache dtypes the kernels read -> their Triton pointer type (for AOT signatures)."""
Q_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
"""q / gate / out dtypes."""


@triton.jit
def clamped_context(context_lens, b, max_blocks, BS: tl.constexpr):
    """context_lens[b] within [0, max_blocks · BS]: padding (<= 0) reads nothing, and no length reads past the
    sequence's block-table row."""
    ctx = tl.load(context_lens + b)
    return tl.minimum(tl.maximum(ctx, 0), max_blocks * BS)


@triton.jit
def kv_row_offsets(block_table_row, tok, valid, kh, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    """int64 element offsets [BLOCK_N] of the K/V rows of kv head kh for token positions `tok` [BLOCK_N] of one
    sequence, through its block-table row. Tokens where `valid` is False read block 0 (masked loads follow);
    valid may be None when every token is valid. D and BS are constexprs, so every row offset is a known multiple
    of D and the D-wide row loads vectorise."""
    if valid is None:
        blk = tl.load(block_table_row + tok // BS)
    else:
        blk = tl.load(block_table_row + tok // BS, mask=valid, other=0)
    blk = blk.to(tl.int64)
    return ((blk * BS + tok % BS) * HKV + kh) * D


@triton.jit
def softmax_step(s, v, m_i, l_i, acc, DOT_F32: tl.constexpr):
    """One online-softmax step over a tile of keys.

    s: fp32 [M, N] scores in log2 units (-inf where masked); v: [N, D] values (the dot operand dtype);
    m_i, l_i: fp32 [M] running max and sum; acc: fp32 [M, D]. A row whose scores are all -inf so far keeps
    m = -inf, l = 0, acc = 0 (the exp2 is taken against 0 instead of -inf, which would give NaN).
    """
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee" if DOT_F32 else "tf32")
    return m_new, l_i, acc


@triton.jit
def load_scales(k_scale, v_scale, sm_scale, IS_FP8: tl.constexpr):
    """(score scale in log2 units, value scale): sm_scale · log2(e) · k_scale and v_scale for an FP8 cache
    (stored · scale is the value: the scales factor out of the dots), sm_scale · log2(e) and 1 otherwise."""
    qk_scale = sm_scale * LOG2E
    vs = 1.0
    if IS_FP8:
        qk_scale = qk_scale * tl.load(k_scale)
        vs = tl.load(v_scale)
    return qk_scale, vs


# ---------------------------------------------------------------------------------------------- launchers

def dot_in_fp32(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether the kernels' dots take fp32 operands (exact 'ieee' products) rather than q's dtype.

    An FP8 cache or one of q's dtype is converted to q's dtype exactly (e4m3 fits in bf16 and fp16), so the
    dots run in q's dtype; fp32 q, or a half-precision cache of the other half type than q, takes fp32."""
    return q_dtype == torch.float32 or (kv_dtype != torch.float8_e4m3fn and kv_dtype != q_dtype)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                block_tables: torch.Tensor, context_lens: torch.Tensor, num_q_heads: int, head_dim: int,
                batch: int) -> None:
    """The launchers' checks of the cache arguments against runtime/kv_cache.py's layout (shapes only: no
    device read, so a launch can be captured in a CUDA graph)."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, Hkv, D] of one dtype, got "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (runtime/kv_cache.py layout)")
    if k_cache.dtype not in KV_TYPES:
        raise ValueError(f"KV cache dtype {k_cache.dtype} not supported; expected one of {list(KV_TYPES)}")
    _, bs, hkv, d = k_cache.shape
    if bs < 1 or bs & (bs - 1):
        raise ValueError(f"block_size must be a power of two, got {bs}")
    if d != head_dim or d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 equal in q and the cache, got q {head_dim}, "
                         f"cache {d}")
    if num_q_heads % hkv:
        raise ValueError(f"{num_q_heads} query heads is not a multiple of the cache's {hkv} kv heads (GQA)")
    if k_cache.dtype == torch.float8_e4m3fn and not (
            k_scale.dtype == v_scale.dtype == torch.float32 and k_scale.numel() == v_scale.numel() == 1):
        raise ValueError("an FP8 cache needs k_scale and v_scale as 1-element fp32 tensors (LayerKV.k_scale)")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] < batch \
            or block_tables.stride(1) != 1:
        raise ValueError(f"block_tables must be int32 [B, max_blocks_per_seq] with unit column stride for "
                         f"{batch} sequences, got {block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.shape != (batch,) or \
            (batch > 1 and context_lens.stride(0) != 1):  # read at context_lens + b
        raise ValueError(f"context_lens must be contiguous int32 [{batch}], got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)} strides {context_lens.stride()}")


def check_rows(t: torch.Tensor, name: str, rows: int, heads: int, head_dim: int, dtypes=Q_TYPES) -> None:
    """t must be [rows, heads, head_dim] with unit stride along head_dim (token and head strides are free:
    q and the gate may be views into a projection's output)."""
    if t.shape != (rows, heads, head_dim) or t.stride(2) != 1:
        raise ValueError(f"{name} must be [{rows}, {heads}, {head_dim}] with unit last stride, got "
                         f"{tuple(t.shape)} strides {t.stride()}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} dtype {t.dtype} not supported; expected one of {list(dtypes)}")


def default_block_n(head_dim: int) -> int:
    """Keys per tile: 64, or 32 for head_dim 256 (a [64, 256] K and V tile pair would crowd the registers)."""
    return 32 if head_dim > 128 else 64


def aot_signature(fn, types: dict[str, str], constexprs: dict, num_warps: int, num_stages: int):
    """An AotSignature (atlas.plugins_trt.quant_linear.triton_gemv) for one of the attention kernels: every
    pointer 16-byte aligned, ints never assumed aligned, no grid formula (the grids depend on the batch)."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    return aot_signature_of(fn, types, constexprs, num_warps, num_stages)
