"""One kernel per attention layer step between the qkv projection and attention: QK-norm, RoPE, KV-cache write.

Input: the fused projection rows qkv [T, q_size (+ q_size gate) + 2·kv_size], laid out [q | gate? | k | v]
(runtime/layers/attention.py; the gate, Qwen3-Next / Qwen3.5's output gate, is a block of q_size right after q and
stays where it is for the attention epilogue). Per token t and head:

    x  = rms_norm(x, w_q or w_k, eps, offset)      if QK-norm (over head_dim, rounded to qkv's dtype like the eager
                                                    layer's rms_norm), offset 0: x̂·w, offset 1: x̂·(1+w)
    x[:R] = x[:R]·cos + rotate_half(x[:R])·sin     neox style on the first R = rotary_dim dims, the rest pass
    q -> q_out [T, Hq, D];  k, v -> the paged cache at slot_mapping[t] (negative: not written)

with cos, sin of angle = float(position) · inv_freq[j] (j = d mod R/2), exactly the fp32 product of
reference.rope_cos_sin. The cache follows runtime/kv_cache.py: [num_blocks, block_size, Hkv, D], row `slot` of
its [-1, Hkv, D] view; an FP8 (float8_e4m3fn) cache stores e4m3(clamp(x / scale, ±448)) with its fp32 scale
(quantize_kv; the division is IEEE-rounded like torch's).

Why inv_freq and not a precomputed cos/sin cache [max_pos, rotary_dim]: no table to build and keep on the GPU
(64 MiB of fp32 cos+sin for 262k positions at rotary_dim 64), no out-of-range read for a position past the
table, and the same angle the reference computes. tl.cos / tl.sin lower to libdevice's __nv_cosf / __nv_sinf,
which reduce large angles accurately (angle = position for inv_freq[0] = 1: past ~1e5 radians they take a slow
path with a 32-byte stack buffer, still full fp32 accuracy). The price is two libdevice calls per rotated value,
negligible in a kernel that moves a few KiB per token.

Grid (T, Hq + Hkv): one program per (token, head); program Hq + j handles both k and v of kv head j.
The kernel takes pointers, ints, one fp32 and constexprs only (compiled ahead of time); `launch_qkv_rope`
launches it through atlas.plugins_trt.launch (JIT, or the engine's cubins with `aot=`), free of host reads of
device values (safe inside CUDA graph capture, and runs on meta tensors when the build records it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter

FP8_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn (runtime/kv_cache.py FP8_MAX)


@triton.jit
def normed_rotated(src, w, d, dmask, partner, is_rot, cos, sin_signed, eps,
                    D: tl.constexpr, QK_NORM: tl.constexpr, NORM_OFFSET: tl.constexpr):
    """One head's D values at `src`, QK-normed (with weight w) and rotated, fp32 [BLOCK_D].

    The rotation needs each value's partner in the other half (d ± R/2), loaded a second time (same cache
    lines) rather than shuffled between threads.
    """
    x = tl.load(src + d, mask=dmask, other=0.0).to(tl.float32)
    xp = tl.load(src + partner, mask=is_rot, other=0.0).to(tl.float32)
    if QK_NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        wd = tl.load(w + d, mask=dmask, other=0.0).to(tl.float32)
        wp = tl.load(w + partner, mask=is_rot, other=0.0).to(tl.float32)
        # rounded to the activation dtype, as the eager layer's rms_norm returns it
        x = (x * rstd * (NORM_OFFSET + wd)).to(src.dtype.element_ty).to(tl.float32)
        xp = (xp * rstd * (NORM_OFFSET + wp)).to(src.dtype.element_ty).to(tl.float32)
    return tl.where(is_rot, x * cos + xp * sin_signed, x)


@triton.jit
def rope_factors(positions, t, inv_freq, d, R: tl.constexpr):
    """What rotating dims d of token t's heads needs: (is_rot, partner, cos, sin_signed), each shaped like d.
    is_rot: d < R; partner: d's partner in the other half (d ± R/2); cos, sin_signed of the angle
    float(positions[t]) · inv_freq[d mod R/2], the sine negated in the lower half (rotate_half: [-x2, x1])."""
    HALF: tl.constexpr = R // 2
    is_rot = d < R
    lower = d < HALF
    partner = tl.where(lower, d + HALF, d - HALF)
    angle = tl.load(positions + t).to(tl.float32) * tl.load(inv_freq + tl.where(lower, d, d - HALF), mask=is_rot,
                                                            other=0.0)
    return is_rot, partner, tl.cos(angle), tl.where(lower, -tl.sin(angle), tl.sin(angle))


@triton.jit
def quantized_kv(cache, scale, x):
    """fp32 values x as a cache row of the cache's dtype holds them (kv_cache.quantize_kv)."""
    if cache.dtype.element_ty == tl.float8e4nv:
        x = tl.minimum(tl.maximum(tl.div_rn(x, tl.load(scale)), -FP8_MAX), FP8_MAX)
    return x.to(cache.dtype.element_ty)


@triton.jit
def _store_kv(cache, scale, dst, x, dmask):
    """Store fp32 values x into a cache row at `dst` the way kv_cache.quantize_kv does for the cache's dtype."""
    tl.store(dst, quantized_kv(cache, scale, x), mask=dmask)


@triton.jit
def qkv_rope_kernel(
    qkv, stride_qkv,                # [T, K_COL + 2·HKV·D] rows [q | gate? | k | v] (unit column stride)
    positions,                      # int32 / int64 [T]
    inv_freq,                       # fp32 [R / 2]
    q_norm, k_norm,                 # [D] each, read if QK_NORM
    q_out, stride_qo,               # [T, HQ, D] (heads contiguous within a row)
    k_cache, v_cache,               # [num_blocks, block_size, HKV, D] contiguous (bf16 / fp16 / fp32 / fp8e4nv)
    k_scale, v_scale,               # fp32 [1], read for FP8 caches
    slot_mapping,                   # int32 [T]; negative = padding, k / v not written
    eps,                            # fp32, QK-norm epsilon
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
    R: tl.constexpr,                # rotary_dim: even, <= D
    K_COL: tl.constexpr,            # first column of k: HQ·D, or 2·HQ·D with the output gate
    BLOCK_D: tl.constexpr,          # power of two >= D
    QK_NORM: tl.constexpr,
    NORM_OFFSET: tl.constexpr,      # 0 or 1
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (T, HQ + HKV)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    is_rot, partner, cos, sin_signed = rope_factors(positions, t, inv_freq, d, R)
    row = qkv + t * stride_qkv
    if h < HQ:
        q = normed_rotated(row + h * D, q_norm, d, dmask, partner, is_rot, cos, sin_signed, eps, D, QK_NORM,
                            NORM_OFFSET)
        tl.store(q_out + t * stride_qo + h * D + d, q.to(q_out.dtype.element_ty), mask=dmask)
    else:
        j = h - HQ
        slot = tl.load(slot_mapping + t).to(tl.int64)
        if slot >= 0:
            k = normed_rotated(row + K_COL + j * D, k_norm, d, dmask, partner, is_rot, cos, sin_signed, eps, D,
                                QK_NORM, NORM_OFFSET)
            dst = slot * (HKV * D) + j * D + d
            _store_kv(k_cache, k_scale, k_cache + dst, k, dmask)
            v = tl.load(row + K_COL + HKV * D + j * D + d, mask=dmask, other=0.0).to(tl.float32)
            _store_kv(v_cache, v_scale, v_cache + dst, v, dmask)


def check_qkv_rope(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int, has_gate: bool,
                   q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, norm_offset: float) -> tuple[int, int]:
    """The checks of launch_qkv_rope's arguments (shapes only: no device read); returns (rotary_dim, K_COL)."""
    T, Hkv, D = qkv.shape[0], k_cache.shape[2], k_cache.shape[3]
    R = 2 * inv_freq.shape[0]
    k_col = num_heads * D * (2 if has_gate else 1)
    if qkv.dim() != 2 or qkv.shape[1] != k_col + 2 * Hkv * D or qkv.stride(1) != 1:
        raise ValueError(f"qkv: expected [T, {k_col + 2 * Hkv * D}] (Hq {num_heads}, gate {has_gate}, Hkv {Hkv}, "
                         f"D {D}) with unit column stride, got {tuple(qkv.shape)} strides {qkv.stride()}")
    if not 0 < R <= D:
        raise ValueError(f"rotary_dim {R} (2 · inv_freq's {inv_freq.shape[0]}) must be in (0, head_dim={D}]")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.dim() != 1 or t.shape[0] < T or (T > 1 and t.stride(0) != 1):  # row t reads element t
            raise ValueError(f"{name}: expected [{T}] with unit stride, got {tuple(t.shape)} strides {t.stride()}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("QK-norm needs both q_norm and k_norm (or neither)")
    if norm_offset not in (0.0, 1.0):
        raise ValueError(f"norm_offset must be 0 or 1, got {norm_offset}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not c.is_contiguous() or c.shape != k_cache.shape:
            raise ValueError(f"{name}: expected a contiguous [num_blocks, block_size, {Hkv}, {D}] cache, got "
                             f"{tuple(c.shape)}")
    return R, k_col


def launch_qkv_rope(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor,
                    num_heads: int, has_gate: bool = False, q_norm: torch.Tensor | None = None,
                    k_norm: torch.Tensor | None = None, eps: float = 1e-6, norm_offset: float = 0.0,
                    out: torch.Tensor | None = None, aot=None, pdl: bool = False) -> torch.Tensor:
    """QK-norm + RoPE of one step's q and k, k and v written into the paged cache (reference.qkv_rope_kv_write).

    qkv: [T, Hq·D·(2 if has_gate else 1) + 2·Hkv·D] bf16 / fp16 / fp32, rows [q | gate? | k | v] (rows may be
      strided, unit column stride);
    positions: int32 (or int64) [T]; inv_freq: fp32 [rotary_dim / 2] (reference.rope_inv_freq; rotary_dim <= D);
    k_cache, v_cache: [num_blocks, block_size, Hkv, D] contiguous, bf16 / fp16 / fp32 / float8_e4m3fn
      (Hkv and D are read from them); k_scale, v_scale: fp32 [1] (read only for FP8 caches);
    slot_mapping: int32 [T], negative = not written;
    q_norm, k_norm: [D] each or both None (no QK-norm); norm_offset: 0 or 1;
    out: [T, Hq, D] (heads contiguous), default a new tensor in qkv's dtype.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out (q, normed and rotated).
    """
    T = qkv.shape[0]
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    R, k_col = check_qkv_rope(qkv, positions, inv_freq, k_cache, v_cache, slot_mapping, num_heads, has_gate, q_norm,
                              k_norm, norm_offset)
    out = torch.empty((T, num_heads, D), dtype=qkv.dtype, device=qkv.device) if out is None else out
    if out.shape != (T, num_heads, D) or out.stride(2) != 1 or out.stride(1) != D:
        raise ValueError(f"out: expected [{T}, {num_heads}, {D}] with contiguous heads, got {tuple(out.shape)} "
                         f"strides {out.stride()}")
    if T == 0:
        return out
    qk_norm = q_norm is not None
    block_d = triton.next_power_of_2(D)
    # without QK-norm the norm weights are not read and inv_freq stands in for them; qkv and out may be views with
    # strided rows
    launch(qkv_rope_kernel, (T, num_heads + Hkv),
           (qkv, qkv.stride(0), positions, inv_freq, q_norm if qk_norm else inv_freq,
            k_norm if qk_norm else inv_freq, out, out.stride(0), k_cache, v_cache, k_scale, v_scale, slot_mapping,
            float(eps)),
           dict(HQ=num_heads, HKV=Hkv, D=D, R=R, K_COL=k_col, BLOCK_D=block_d, QK_NORM=qk_norm,
                NORM_OFFSET=int(norm_offset), PDL=pdl),
           max(1, min(block_d // 128, 4)), JIT_DEFAULT_STAGES, aot=aot, unaligned=("qkv", "q_out"))
    return out
