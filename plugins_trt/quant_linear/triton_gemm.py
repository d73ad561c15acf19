"""Quantized GEMM for larger M (64..2048+): y[M, N] = x[M, K] @ W[N, K].T (+ bias) (+ residual), bf16 out.

  nvfp4_gemm_kernel         W4A16: the packed tile is loaded as int32 words, dequantized in registers to bf16
                            (exactly E2M1 * block scale * 2^-8, triton_gemv.nvfp4_tile_bf16's PTX decode) and multiplied
                            with the bf16 activation tile by tl.dot (wgmma on sm_90, fp32 accumulate); the
                            epilogue applies 2^8 * weight_scale_2[n].
  quantize_rows_fp8_kernel  per-token (row) activation quantization: scale[m] = amax|x[m]| / 448,
                            x_q = e4m3(x / scale) with round-to-nearest-even (saturating).
  nvfp4_dequant_kernel      nvfp4 rows -> bf16 (for nvfp4_dequant_linear: dequantize a chunk of rows, cuBLAS it; large M).
  fp8_gemm_kernel           W8A8 on the FP8 tensor cores: tl.dot on e4m3 operands, epilogue
                            acc * x_scale[m] * w_scale[n]. Note that this quantizes activations, so it is not the
                            weight-only quant_linear reference: per-token e4m3 rounding costs ~2-3% relative error.

Standard tiling: BLOCK_M x BLOCK_N output tile per program, K walked in BLOCK_K steps with Triton's software
pipelining (num_stages), GROUP_M swizzle of program ids for L2 reuse of the weight tiles. Rows past M or N are
clamped for the loads (no masks in the main loop) and masked at the store; a K tail (K % BLOCK_K != 0, K % 16 == 0)
runs one masked step. Same contract as triton_gemv: 16-byte aligned pointers, rows contiguous along K, plain
@triton.jit kernels (pointers, i32, constexprs) with AOT signatures from signature_<kernel>. The nvfp4 kernels take a
TILED constexpr, as nvfp4_gemv_kernel: the weight in layout.tile_nvfp4's order (N, K, BLOCK_K multiples of 128).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from atlas.plugins_trt.quant_linear.layout import NVFP4_BITS, TILE_N
from atlas.plugins_trt.quant_linear.triton_gemv import (
    AotSignature, _epilogue_store, _nvfp4_dot_step, _nvfp4_row_ptrs, aot_signature, check_tiled, e2m1_bits_f32,
    e2m1_nibble_f32,
    nvfp4_tile_bf16)

_NVFP4_DOT_DOWN = tl.constexpr(2.0 ** 8)
(_BA0, _BB0), (_BA1, _BB1), (_BA2, _BB2), (_BA3, _BB3) = ((tl.constexpr(a), tl.constexpr(b)) for a, b in NVFP4_BITS)
_S_PACK_UP = tl.constexpr(2.0 ** 100)  # nvfp4_dequant_kernel, PACK: E2M1 * 2^-126 * scale * 2^100 is exact
_S_PACK_DOWN = tl.constexpr(2.0 ** 26)
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each column of weight tiles while it is in L2."""
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=["M"])
def nvfp4_gemm_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                      M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, TILED: tl.constexpr = False):
    """NVFP4 W4A16 GEMM. Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), 1, 1).

    x_ptr    *bf16     [M, K], row stride stride_xm
    w_ptr    *u8       [N, K/2] packed E2M1 (element 2j low nibble), row stride stride_wn (bytes)
    ws_ptr   *fp8e4nv  [N, K/16] block scales, row stride stride_sn
    ws2_ptr  *fp32     [N]
    bias_ptr *bf16     [N] (HAS_BIAS);  res_ptr *bf16 [M, N], row stride stride_rm (HAS_RESIDUAL)
    out_ptr  *bf16     [M, N], row stride stride_om
    M, N, K  i32       K % 16 == 0;  BLOCK_M >= 16, BLOCK_K >= 32, powers of 2.
    TILED    w_ptr / ws_ptr in the tiled order (layout.tile_nvfp4; stride_wn, stride_sn unused): N % 128 == 0,
             K % 128 == 0, BLOCK_K % 128 == 0.
    """
    tl.static_assert(BLOCK_K % 32 == 0)
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1)
    rows_n = tl.minimum(offs_n, N - 1)
    x_rows = x_ptr + rows_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    w_rows, s_rows = _nvfp4_row_ptrs(w_ptr, ws_ptr, rows_n, K, stride_wn, stride_sn, BLOCK_K, TILED)
    row_ok = offs_m >= 0  # rows are clamped, every load is in bounds
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for b in range(0, K // BLOCK_K):
        acc = _nvfp4_dot_step(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K, False, True, TILED)
    if K % BLOCK_K != 0:
        acc = _nvfp4_dot_step(acc, w_rows, s_rows, x_rows, row_ok, K // BLOCK_K, K, BLOCK_K, True, True, TILED)
    y = acc * (tl.load(ws2_ptr + rows_n) * _NVFP4_DOT_DOWN)[None, :]
    _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@triton.jit
def _bf16_pair(lo, hi):
    """Two fp32 tensors -> int32 holding RN_bf16(lo) in the low and RN_bf16(hi) in the high half."""
    lo16 = lo.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi16 = hi.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    return lo16 | (hi16 << 16)


@triton.jit
def _nibble_f32(w, T: tl.constexpr, BITS: tl.constexpr):
    """E2M1 * 2^-126 of nibble T of each word, ModelOpt's bit order or (BITS) layout.NVFP4_BITS'."""
    if not BITS:
        return e2m1_nibble_f32(w, T)
    if T // 2 == 0:
        return e2m1_bits_f32(w, T, _BA0, _BB0)
    elif T // 2 == 1:
        return e2m1_bits_f32(w, T, _BA1, _BB1)
    elif T // 2 == 2:
        return e2m1_bits_f32(w, T, _BA2, _BB2)
    else:
        return e2m1_bits_f32(w, T, _BA3, _BB3)


@triton.jit
def nvfp4_dequant_kernel(w_ptr, ws_ptr, ws2_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_on,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACK: tl.constexpr = False,
                         EVEN_K: tl.constexpr = False, TILED: tl.constexpr = False, BITS: tl.constexpr = False):
    """Rows [0, N) of an nvfp4 weight to bf16: out[n, k] = RN_bf16(E2M1 * block scale * weight_scale_2[n]).
    Grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K), 1); the pointers may start at any 16-row offset of the weight.

    w_ptr *u8 [N, K/2], ws_ptr *fp8e4nv [N, K/16], ws2_ptr *fp32 [N], out_ptr *bf16 [N, K] (row stride stride_on).
    E2M1 * block scale is exact in fp32 and bf16; the one rounding is the weight_scale_2 product (then bf16).
    PACK: decode in the words' own layout and store each word's 8 values as 4 bf16 pairs (16 bytes, no
    shared-memory exchange); otherwise the tile goes through nvfp4_tile_bf16 and a join / reshape.
    EVEN_K (K % BLOCK_K == 0): no masks along K, so the weight words load 16 bytes at a time.
    TILED: w_ptr / ws_ptr in the tiled order (layout.tile_nvfp4; strides unused), starting at a multiple of 128 rows
    (a 128-row group of tiles is contiguous; N the slice's rows, K the full K), N, K, BLOCK_K multiples of 128.
    BITS (PACK only): each word's bits in layout.NVFP4_BITS order (layout.bits_nvfp4).
    """
    tl.static_assert(PACK or not BITS)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    KW: tl.constexpr = BLOCK_K // 8
    KG: tl.constexpr = BLOCK_K // 16
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    offs_j = pid_k * KW + tl.arange(0, KW)
    offs_g = pid_k * KG + tl.max_contiguous(tl.arange(0, KG), 2)
    if TILED:  # block pid_k starts BLOCK_K / 128 tiles (2048 words, 1024 scales) after the one before
        w_rows, s_rows = _nvfp4_row_ptrs(w_ptr, ws_ptr, rows, K, stride_wn, stride_sn, BLOCK_K, True)
        w_rows += pid_k * ((BLOCK_K // 128) * 2048)
        s_rows += pid_k * ((BLOCK_K // 128) * 1024)
    else:
        w_rows = (w_ptr + rows[:, None] * stride_wn).to(tl.pointer_type(tl.int32)) + offs_j[None, :]
        s_rows = ws_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * stride_sn + offs_g[None, :]
    if EVEN_K:
        w = tl.load(w_rows)
        sg = tl.load(s_rows)
    else:
        w = tl.load(w_rows, mask=(offs_j < K // 8)[None, :], other=0)
        sg = tl.load(s_rows, mask=(offs_g < K // 16)[None, :], other=0)
    sg = sg.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    row_ok = (offs_n < N)[:, None]
    if PACK:
        # e2m1_nibble_f32 = E2M1 * 2^-126; times scale * 2^100 stays exact (at most 6 significant bits, above fp32's
        # denormal floor); times weight_scale_2 * 2^26 is the one rounding.
        sw = tl.reshape(tl.join(sg, sg), [BLOCK_N, KW]) * _S_PACK_UP
        s2 = (tl.load(ws2_ptr + rows) * _S_PACK_DOWN)[:, None]
        p0 = _bf16_pair(_nibble_f32(w, 0, BITS) * sw * s2, _nibble_f32(w, 1, BITS) * sw * s2)
        p1 = _bf16_pair(_nibble_f32(w, 2, BITS) * sw * s2, _nibble_f32(w, 3, BITS) * sw * s2)
        p2 = _bf16_pair(_nibble_f32(w, 4, BITS) * sw * s2, _nibble_f32(w, 5, BITS) * sw * s2)
        p3 = _bf16_pair(_nibble_f32(w, 6, BITS) * sw * s2, _nibble_f32(w, 7, BITS) * sw * s2)
        # join adds a last axis, the outer join fastest: [.., j, i] holds pair 2j + i
        pairs = tl.reshape(tl.join(tl.join(p0, p2), tl.join(p1, p3)), [BLOCK_N, 4 * KW])
        offs_p = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        out32 = out_ptr.to(tl.pointer_type(tl.int32)) + offs_n[:, None] * (stride_on // 2) + offs_p[None, :]
        if EVEN_K:
            tl.store(out32, pairs, mask=row_ok)
        else:
            tl.store(out32, pairs, mask=row_ok & (offs_p < K // 2)[None, :])
    else:
        wt = nvfp4_tile_bf16(w, sg)  # E2M1 * scale * 2^-8, exact
        y = wt.to(tl.float32) * (tl.load(ws2_ptr + rows) * _NVFP4_DOT_DOWN)[:, None]
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + offs_n[:, None] * stride_on + offs_k[None, :], y.to(tl.bfloat16),
                 mask=row_ok & (offs_k < K)[None, :])


@triton.jit(do_not_specialize=["M"])
def quantize_rows_fp8_kernel(x_ptr, xq_ptr, xs_ptr, M, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr):
    """Per-row E4M3 quantization. Grid (M, 1, 1); one program per row, two passes over the row (the second hits L2).

    x_ptr  *bf16     [M, K], row stride stride_xm
    xq_ptr *fp8e4nv  [M, K], row stride stride_qm:  x_q = RNE_e4m3(clamp(x * 448 / amax, -448, 448))
    xs_ptr *fp32     [M]:                           x_scale = amax / 448 (1/448 for an all-zero row)
    """
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK_K)
    x_row = x_ptr + m * stride_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_row + k + offs, mask=k + offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    row_max = tl.max(amax, axis=0)
    row_max = tl.where(row_max > 0, row_max, 1.0)
    # correctly rounded divisions (div_rn), so that x_q is exactly RNE(x * RN(448 / amax)) on any device
    inv = tl.math.div_rn(tl.full([], 448.0, tl.float32), row_max)
    tl.store(xs_ptr + m, tl.math.div_rn(row_max, tl.full([], 448.0, tl.float32)))
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_row + k + offs, mask=k + offs < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x * inv, -FP8_MAX), FP8_MAX)
        tl.store(xq_ptr + m * stride_qm + k + offs, q.to(tl.float8e4nv), mask=k + offs < K)


@triton.jit
def _fp8_gemm_step(acc, x_rows, w_rows, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    if MASKED:
        kmask = (b * BLOCK_K + tl.arange(0, BLOCK_K)) < K
        x = tl.load(x_rows + b * BLOCK_K, mask=kmask[None, :], other=0.0)
        w = tl.load(w_rows + b * BLOCK_K, mask=kmask[None, :], other=0.0)
    else:
        x = tl.load(x_rows + b * BLOCK_K)
        w = tl.load(w_rows + b * BLOCK_K)
    return tl.dot(x, tl.trans(w), acc)


@triton.jit(do_not_specialize=["M"])
def fp8_gemm_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, res_ptr, out_ptr,
                    M, N, K, stride_xm, stride_wn, stride_rm, stride_om,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """FP8 W8A8 GEMM. Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), 1, 1).

    xq_ptr   *fp8e4nv  [M, K] quantized activations, row stride stride_xm;  xs_ptr *fp32 [M] their row scales
    w_ptr    *fp8e4nv  [N, K], row stride stride_wn;                         ws_ptr *fp32 [N] weight row scales
    bias_ptr *bf16     [N] (HAS_BIAS);  res_ptr *bf16 [M, N], row stride stride_rm (HAS_RESIDUAL)
    out_ptr  *bf16     [M, N], row stride stride_om
    M, N, K  i32       K % 16 == 0;  BLOCK_M >= 16, BLOCK_K >= 32.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1)
    rows_n = tl.minimum(offs_n, N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = xq_ptr + rows_m[:, None] * stride_xm + offs_k[None, :]
    w_rows = w_ptr + rows_n[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for b in range(0, K // BLOCK_K):
        acc = _fp8_gemm_step(acc, x_rows, w_rows, b, K, BLOCK_K, False)
    if K % BLOCK_K != 0:
        acc = _fp8_gemm_step(acc, x_rows, w_rows, K // BLOCK_K, K, BLOCK_K, True)
    y = acc * tl.load(xs_ptr + rows_m)[:, None] * tl.load(ws_ptr + rows_n)[None, :]
    _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


# ---- configs (H200: 132 SMs, ~790 TFLOP/s bf16 measured, ~2x that in fp8) ------------------------------------

CONFIGS_nvfp4_gemm = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s}
    for bm, bn, bk, w, s in [
        (64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (64, 256, 64, 8, 3),
        (128, 64, 128, 4, 3), (128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3), (256, 128, 128, 8, 2),  # BLOCK_M 256: each weight tile dequantized once at M = 256
    ]
]
CONFIGS_nvfp4_dequant = [
    {"DEQUANT": True, "PACK": pack, "BLOCK_N": 32, "BLOCK_K": 256, "CHUNK": chunk, "num_warps": 4, "num_stages": 1}
    for pack, chunk in ((True, 1 << 26), (False, 1 << 26), (True, 1 << 25), (False, 1 << 25), (True, 1 << 24))
]  # CHUNK: weight elements dequantized per cuBLAS call, 32 / 64 / 128 MB of bf16
"""nvfp4 at large M, the other way: nvfp4_dequant_kernel writes CHUNK elements' worth of rows as bf16 into a
workspace and cuBLAS multiplies them (nvfp4_dequant_linear). Costs 2.56 bytes a weight element of traffic
(~110 us for the 27B gate_up), so it pays where the GEMM is MMA-bound: M of a few hundred and up. H200
(tools/results/nvfp4_dequant.json): the kernel runs at 0.75 of the copy bandwidth (PACK, 32 x 256, 4 warps; wider
tiles are slower), and larger chunks pay at M 2048 (fewer, wider cuBLAS calls): 27B gate_up 1120.7 / 1088.8 /
1045.7 us at 2^24 / 2^25 / 2^26 elements (0.82 / 0.84 / 0.87x cuBLAS), 8B down 0.84 / 0.86 / 0.88x."""
CONFIGS_nvfp4_gemm += CONFIGS_nvfp4_dequant
CONFIGS_nvfp4_wgmma = [
    {"WGMMA": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w, "num_stages": 1,
     "W_SMEM": True}
    for bm, bn, bk, st, w in [(256, 64, 64, 4, 4), (128, 64, 64, 4, 4), (128, 64, 128, 4, 4), (64, 64, 128, 5, 4),
                              (256, 128, 64, 4, 8), (128, 128, 64, 5, 8), (128, 128, 128, 4, 8), (64, 128, 128, 5, 8),
                              (128, 256, 64, 4, 8), (64, 256, 64, 4, 8),
                              (64, 64, 128, 3, 4)]  # 3 CTAs an SM (155 registers, 63 KB): 8B qkv M 256 39.4 -> 37.4
] + [
    {"WGMMA": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w, "num_stages": 1,
     "W_SMEM": True, "SPLIT_K": sk}
    for bm, bn, bk, st, w, sk in [(128, 64, 64, 4, 4, 2), (256, 64, 64, 4, 4, 2), (128, 64, 64, 4, 4, 4),
                                  (128, 128, 128, 4, 8, 2)]
]
"""nvfp4 at M >= 64 through gluon_gemm.nvfp4_gemm_wgmma_kernel (wgmma, the decoded weights as its register operand;
K % (2 BLOCK_K) == 0 only: gemm_candidates drops it elsewhere), the weights through the shared-memory ring
(W_SMEM): faster than the register prefetch in all 12 cases timed (tools/results/nvfp4_wgmma_gemm_smem.json against
nvfp4_wgmma_gemm.json: 27B gate_up M 256 205.3 against 226.6 us, M 64 91.1 against 126.2). The last two (256 weight
rows a CTA, untimed) are there for the L2 traffic of x: every CTA reads its token tile's whole x, so x crosses L2
N / BLOCK_N times (27B gate_up M 256: 1.43 GB at BLOCK_N 64, 0.36 GB at 256: ~140 against ~35 us at ~10 TB/s).
Measured since (tools/results/gemm.json, nvfp4_wgmma_gemm_m256.json): both are slower (27B gate_up M 256 312 and
399 us against 204 at 128 x 64), so the x traffic is not what bounds the kernel.
SPLIT_K (fp32 partials + the split-K reduction): the shapes with few tiles leave SMs idle (27B down at M 256: 80 tiles
of 64 x 256 on 132 SMs; ncu: 0.61 waves, one warpgroup an SM issuing 0.2 a cycle,
tools/results/ncu_nvfp4_qwen3.5-27b.down_256.txt). Commit 61d7aa0 split only the 128 x 256 8-warp tile (365 -> 204 us
at 27B down, still slower than the best unsplit 160) and was taken out; these split the best unsplit tiles: 128 x 64
x 64 at SPLIT_K 4 takes 27B down M 256 from 160.3 (the best unsplit tile) to 124.3 us in one run
(tools/results/gemm.json)."""
CONFIGS_nvfp4_wgmma_sk = [
    {"WGMMA": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "STAGES": st, "num_warps": w, "num_stages": 1,
     "W_SMEM": True, "SK_PER_SM": per_sm, "DP": dp, **({"FIX": True} if fix else {})}
    for bm, bn, st, w, per_sm, dp, fix in [(256, 128, 4, 8, 1, 1, False)]
]
"""The wgmma kernel on a persistent grid (gluon_gemm.nvfp4_gemm_wgmma_sk_kernel): SK_PER_SM programs an SM
(gemm_candidates turns it into "SK", the program count of the chip), whole waves of tiles data-parallel and the rest
shared by stream-K (DP mode 1), the shared tiles summed by a second launch (sk_reduce_kernel; FIX, the sum inside the
kernel, was 2-14% slower on five shapes and 2% faster on the 8B lm_head). H100
(tools/results/nvfp4_wgmma_sk_h100.json, M 256, the shipped config timed in the same run): 27B gate_up 195.4 -> 174.3
us, 27B down 128.4 -> 112.3; level or slower on the 8B shapes, so it is one more candidate for the tuner. Engine path
(AOT kernels through CudaLinear, both reduction forms): tests/runtime/test_linear_tiled.py -k "wgmma_streamk or
sk_engine", 10 passed on that H100 (tools/results/pytest_sk_gpu_h100.log)."""
CONFIGS_nvfp4_ws = [
    {"WS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "STAGES": st, "num_warps": w, "num_stages": 1, "DW": 4,
     "SPLIT_K": sk, **({"NAT": True} if nat else {})}
    for bm, bn, st, w, sk, nat in [(128, 128, 4, 8, 1, True), (256, 64, 3, 4, 1, True), (256, 128, 3, 8, 1, True),
                                   (128, 128, 4, 8, 2, False)]
]
"""nvfp4 at M >= 64 through gluon_ws.nvfp4_gemm_ws_kernel (warp-specialized: a decoder partition fills a shared-memory
ring with decoded weights and x, the consumer warpgroups issue the shared-memory wgmma; K % (BLOCK_K SPLIT_K) == 0).
NAT: the weights decoded in natural k order, x as given (no permute_k gather). Not among the build's candidates:
correct on an H100 (every variant within 0.0017 of the reference and run-to-run identical,
tools/results/nvfp4_wgmma_ws_check_h100.log), but slower than the shipped configs at M 256
(tools/results/nvfp4_wgmma_ws_h100.json, same run): 8B qkv 40.6 us at best (256 x 64 NAT) against 39.6 shipped and
37.4 for the 64 x 64 x 128 tile, 27B gate_up 212.2 (256 x 128 NAT) against 194.7, 27B down 172.3 against 125.2
(the shipped 128 x 64 at SPLIT_K 4). It enters a build only where a test monkeypatches CONFIGS_nvfp4_gemm (ws_engine in
tests/runtime/test_linear_tiled.py)."""
CONFIGS_nvfp4_ws_rs = [
    {"WS": True, "RS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": 4, "num_warps": w,
     "num_stages": 1, "DW": 4, "DREGS": 64, "SPLIT_K": 1, "TA": True}
    for bm, bn, bk, w in [(128, 128, 128, 8), (256, 64, 64, 4), (256, 128, 64, 8)]
]
CONFIGS_nvfp4_ws_rs += [{**CONFIGS_nvfp4_ws_rs[0], "SPLIT_K": 2}]
CONFIGS_nvfp4_ws_rs += [{**CONFIGS_nvfp4_ws_rs[i], "PDL": True} for i in (0, 1)]
"""PDL (the last two): launched as programmatic dependents of permute_k_kernel, the loader's first ring slots of
weights copied before its wait for the permuted x. H100 (tools/results/nvfp4_wgmma_ws_pdl_h100.json, M 256, same
run): 8B qkv 33.3 -> 31.6 us at 128 x 128 x 128 and 34.2 -> 32.0 at 256 x 64 x 64; within 1-2% elsewhere, 2-10% slower
on the 8B lm_head (several waves of tiles), so candidates beside the plain launches."""
CONFIGS_nvfp4_ws_rs_sk = [{**{k: v for k, v in CONFIGS_nvfp4_ws_rs[i].items() if k != "SPLIT_K"},
                           "SK_PER_SM": 1, "DP": 1} for i in (0, 2)]
CONFIGS_nvfp4_ws_ks = [
    {"WS": True, "RS": True, "KS": 2, "BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 64, "STAGES": 4, "num_warps": 4,
     "num_stages": 1, "DW": 4, "DREGS": 56, "KREGS": 224, "SPLIT_K": sk}
    for bm, sk in [(256, 1), (128, 1), (256, 2)]
]
"""The warp-specialized GEMM with the decode in the consumers (gluon_ws, RS: the register A operand as
gluon_gemm, the packed blocks and x copied into the ring by a loader partition of four warps, no CTA barrier a block;
K % (2 BLOCK_K SPLIT_K) == 0). H100 (tools/results/nvfp4_wgmma_ws_rs_h100.json, M 256, same run): 8B qkv 36.7 us
(128 x 128 x 128) against 39.7 shipped, 8B lm_head 419.2 (256 x 128) against 437.4, 27B gate_up 194.2 against 196.4,
27B down 133.4 against 127.7 (shipped split-K 4); gemm_h100.json picked RS in three of six M 256 cases. Build
candidates (the decoder-partition WS configs above are not).
CONFIGS_nvfp4_ws_ks: RS with two one-warpgroup consumer partitions on the even and odd blocks of a 64-row tile (KS 2,
K % (4 BLOCK_K SPLIT_K) == 0): correct, 1.5-2x slower than RS on the same H100 (nvfp4_wgmma_ws_ks_h100.json: the two
consumers hold all four ring slots), so GPU-tested (ws_engine) but not a candidate.
TA (every consumer thread releases its slots itself, no partition barrier before the release) on all of them: as
fast or faster on every shape timed (tools/results/nvfp4_wgmma_ws_ta_h100.json, same run: 8B qkv 36.5 -> 36.1 us,
8B down 110.6 -> 106.8, 27B gate_up 194.6 -> 189.1, RS-SK 8B down 78.7 -> 77.0).
The fourth RS config splits K in two (fp32 partials + the split-K reduction): 8B down at M 256 72.5 us against 108.8
unsplit and 80.2 shipped (tools/results/nvfp4_wgmma_ws_rsnext_h100.json, H100, same run).
CONFIGS_nvfp4_ws_rs_sk: RS on the persistent stream-K grid (gluon_ws.nvfp4_gemm_rs_sk_kernel, one program an SM,
whole waves of tiles data-parallel, the rest by stream-K, the shared tiles summed by sk_reduce_kernel). H100
(tools/results/nvfp4_wgmma_ws_rssk_h100.json, M 256, same run): 27B gate_up 168.6 us against 194.2 (RS) and 194.7
(shipped), 27B down 106.7 against 125.3 (shipped split-K 4), 8B down 76.5 against 80.1; slower on 8B qkv (43.5
against 35.8 RS)."""
CONFIGS_nvfp4_ws_rs_sk_fix = [{**c, "FIX": True, "PDL": True} for c in CONFIGS_nvfp4_ws_rs_sk]
"""RS-SK with FIX (the shared tiles summed inside, no reduction launch) and PDL: correct and GPU-tested through
CudaLinear (sk_engine), not a build candidate: the benchmark picked it nowhere on the H100 (gemm_h100.json,
2026-12-06), its sums cost ~10 us at 132 programs on 8B qkv (NOTES, sixth session)."""
CONFIGS_nvfp4_ws_xp = [{**CONFIGS_nvfp4_ws_rs[0], "XP": True, "DREGS": 96},
                       {**CONFIGS_nvfp4_ws_rs[2], "XP": True, "DREGS": 152}]
"""RS with XP: x as given, put in the decode's k order by the loader's 4-byte copies (no permute_k launch; the loader
needs 96-152 registers). Correct, but slower than RS on every shape but 8B qkv, where it is level (H100,
tools/results/nvfp4_wgmma_ws_rsnext_h100.json): GPU-tested (ws_engine), not a candidate."""
CONFIGS_nvfp4_ws += CONFIGS_nvfp4_ws_rs + CONFIGS_nvfp4_ws_ks + CONFIGS_nvfp4_ws_xp
CONFIGS_nvfp4_gemm += CONFIGS_nvfp4_wgmma + CONFIGS_nvfp4_wgmma_sk + CONFIGS_nvfp4_ws_rs + CONFIGS_nvfp4_ws_rs_sk
"""Candidates for nvfp4 at M >= 64: nvfp4_gemm_kernel tiles, the dequantize + cuBLAS configs ("DEQUANT"), the Gluon
wgmma kernel ("WGMMA"), its persistent stream-K form ("SK"), the warp-specialized RS form ("WS" + "RS") and RS on the
stream-K grid ("WS" + "RS" + "SK")."""
CONFIGS_fp8_gemm = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s}
    for bm, bn, bk, w, s in [
        (64, 64, 128, 4, 4), (64, 128, 128, 4, 4), (64, 256, 128, 8, 3), (128, 64, 128, 4, 4),
        (128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (128, 256, 64, 8, 4),
    ]
]
CONFIGS_fp8_scaled_mm = [{"CUBLAS": True}]
"""The W8A8 GEMM through cuBLASLt instead (torch._scaled_mm, row-wise scales): quantize_rows_fp8_kernel, then the
library's FP8 GEMM with x_scale[m] and w_scale[n] applied in its epilogue (needs N and K multiples of 16)."""
CONFIGS_fp8_gemm += CONFIGS_fp8_scaled_mm
"""Candidates for fp8 at M >= 64: fp8_gemm_kernel tiles, then cuBLASLt ("CUBLAS")."""
CONFIGS_quantize_rows_fp8 = [{"BLOCK_K": bk, "num_warps": w, "num_stages": 1}
                             for bk, w in ((1024, 4), (2048, 4), (4096, 8))]
"""Candidates for quantize_rows_fp8_kernel (memory-bound, one row a program)."""


def gemm_candidates(fmt: str, N: int, K: int, sm_count: int = 132) -> list[dict]:
    """The M >= 64 configs that can serve an [N, K] weight: cuBLASLt's FP8 GEMM takes N and K multiples of 16
    only, the wgmma kernel K multiples of 2 BLOCK_K, the warp-specialized one of BLOCK_K SPLIT_K; a persistent config
    gets its program count for sm_count SMs."""
    from atlas.plugins_trt.quant_linear import gluon_ws
    from atlas.plugins_trt.quant_linear.gluon_gemm import supports

    configs = CONFIGS_nvfp4_gemm if fmt == "nvfp4" else CONFIGS_fp8_gemm
    out = [c for c in configs if not (c.get("CUBLAS") and (N % 16 or K % 16))
           and not (c.get("WGMMA") and not supports(c, K)) and not (c.get("WS") and not gluon_ws.supports(c, K))]
    return [{**{k: v for k, v in c.items() if k != "SK_PER_SM"}, "SK": c["SK_PER_SM"] * sm_count}
            if "SK_PER_SM" in c else c for c in out]


def grid_gemm(config: dict, M: int, N: int) -> tuple[int, int, int]:
    """Launch grid of nvfp4_gemm_kernel / fp8_gemm_kernel."""
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]), 1, 1)


def dequant_rows(config: dict, K: int) -> int:
    """Weight rows a DEQUANT config dequantizes per cuBLAS call: CHUNK / K, a multiple of 16 (at least 16); of 128
    (at least 128) for a TILED config, whose chunks must start on a 128-row group of tiles."""
    step = TILE_N if config.get("TILED") else 16
    return max(step, config["CHUNK"] // K // step * step)


def grid_nvfp4_dequant(config: dict, rows: int, K: int) -> tuple[int, int, int]:
    return (triton.cdiv(rows, config["BLOCK_N"]), triton.cdiv(K, config["BLOCK_K"]), 1)


def grid_quantize_rows_fp8(config: dict, M: int) -> tuple[int, int, int]:
    return (M, 1, 1)


@triton.jit(do_not_specialize=["M"])
def permute_k_kernel(x_ptr, idx_ptr, out_ptr, M, K, stride_xm, stride_om, BK: tl.constexpr, ROWS: tl.constexpr,
                     COLS: tl.constexpr, PDL: tl.constexpr = False):
    """out[m, kb + j] = x[m, kb + idx[j]] for every BK block kb (idx: int32 [BK], gluon_gemm.block_index: the wgmma
    kernels' k order): ROWS rows by COLS columns (whole BK blocks, permute_cols) a program, grid (cdiv(M, ROWS),
    cdiv(K, COLS), 1). The loads gather inside a block's 2 BK bytes of a row, whose sectors the program reads whole;
    the stores are contiguous. torch.index_select, its way before, took 2.8-3.6x a copy at M 256 on an H100
    (tools/results/permute_k_h100.log); this kernel 1.5-1.8x less (permute_k_kernel_h100.log). PDL (CUDA launches):
    programmatic dependent launch both ways: it lets the GEMM after it start (a "PDL" GEMM config streams its first
    weight blocks meanwhile) and waits for the kernel before it, which wrote x, before reading or writing anything."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    src = cols // BK * BK + tl.load(idx_ptr + cols % BK)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + src[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :], x, mask=mask)


@triton.jit(do_not_specialize=["M"])
def permute_k_words_kernel(x_ptr, out_ptr, M, K, stride_xm, stride_om, BK: tl.constexpr, ROWS: tl.constexpr,
                           COLS: tl.constexpr, PDL: tl.constexpr = False):
    """permute_k_kernel's output (same tiles, grid and PDL) without its index table; strides even. In 32-bit words
    (bf16 pairs: the order's lowest bit s0 is the same on both sides) gluon_gemm.k_phys is a transpose: a block's
    BK / 2 words read as [4, BK / 8] (physical word (BK / 8) i + q) are written as [BK / 8, 4] (logical word i + 4 q),
    so loads and stores are both contiguous (sm_90: 16-byte loads and stores, the transpose through 2 KB of shared
    memory, 32 registers), where permute_k_kernel gathers 2-byte elements (1.7-1.9x a copy on an H100,
    tools/results/permute_k_kernel_h100.log; 1.4-3.5x on an H200, where this kernel takes 0.7-1.2x the copy,
    permute_k_words_h200.log). The permutation engines launch (signature_permute_k) and
    gluon_gemm.permute_k's; tools/dev/permute_k.py times it beside the gather and a copy."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    Q: tl.constexpr = BK // 8
    NB: tl.constexpr = COLS // BK
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    words = tl.program_id(1) * (COLS // 2) + tl.arange(0, COLS // 2)
    mask = (rows[:, None] < M) & (words[None, :] < K // 2)  # whole blocks: the same mask in both orders
    src = x_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None].to(tl.int64) * (stride_xm // 2) + words[None, :]
    w = tl.load(src, mask=mask)
    w = tl.reshape(tl.permute(tl.reshape(w, (ROWS, NB, 4, Q)), (0, 1, 3, 2)), (ROWS, COLS // 2))
    dst = out_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None].to(tl.int64) * (stride_om // 2) + words[None, :]
    tl.store(dst, w, mask=mask)


PERMUTE_CONFIG = {"ROWS": 8, "COLS": 512, "num_warps": 4, "num_stages": 1}
"""permute_k_kernel's tile: 8 rows x 512 columns (8 KB of x), four warps."""
PERMUTE_GRID = ("cdiv(M, ROWS)", "cdiv(K, COLS)", "1")


def permutes_x(config: dict) -> bool:
    """Whether an M >= 64 nvfp4 config reads x in the decode's k order (permute_k_kernel first): the Gluon wgmma
    kernels, and the warp-specialized ones but NAT (natural order) and XP (the loader permutes)."""
    return bool(config.get("WGMMA") or (config.get("WS") and not (config.get("NAT") or config.get("XP"))))


def permute_cols(BK: int) -> int:
    """permute_k_kernel's COLS for blocks of BK (a whole number of blocks)."""
    return max(PERMUTE_CONFIG["COLS"], BK) // BK * BK


def grid_permute_k(BK: int, M: int, K: int) -> tuple[int, int, int]:
    return (triton.cdiv(M, PERMUTE_CONFIG["ROWS"]), triton.cdiv(K, permute_cols(BK)), 1)

# ---- AOT signatures -------------------------------------------------------------------------------------------

GEMM_GRID = ("cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)", "1", "1")


def nvfp4_gemm_params(N: int, K: int, out: str = "*bf16", **own: str) -> tuple[dict, dict]:
    """(types, values fixed at build) of the run-time parameters every nvfp4 GEMM kernel shares (nvfp4_gemm_kernel,
    the Gluon wgmma, warp-specialized and stream-K ones) for a contiguous [N, K] weight; out: out_ptr's type; own:
    a kernel's further parameters and their types (aot_signature orders them by the kernel's own parameter list)."""
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": out, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_sn": "i32", "stride_rm": "i32", "stride_om": "i32", **own}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K // 2, "stride_sn": K // 16, "stride_rm": N, "stride_om": N}
    return types, ints


def _gemm_constexprs(config: dict, has_bias: bool, has_residual: bool) -> dict:
    cx = {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
          "GROUP_M": config["GROUP_M"], "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual}
    if config.get("TILED"):  # nvfp4_gemm_kernel's tiled weight order (layout.py); left out otherwise
        cx["TILED"] = True
    return cx


def signature_nvfp4_gemm(config: dict, N: int, K: int, has_bias: bool = False,
                         has_residual: bool = False) -> AotSignature:
    """AotSignature of nvfp4_gemm_kernel for a contiguous [N, K] weight (M stays a run-time argument); a "TILED"
    config reads it in layout.tile_nvfp4's order."""
    check_tiled(config, N, K)
    types, ints = nvfp4_gemm_params(N, K)
    return aot_signature(nvfp4_gemm_kernel, types, ints, _gemm_constexprs(config, has_bias, has_residual), config,
                         GEMM_GRID)


def signature_nvfp4_dequant(config: dict, N: int, K: int) -> AotSignature:
    """AotSignature of nvfp4_dequant_kernel for chunks of a contiguous [N, K] weight (N stays a run-time argument:
    the last chunk is shorter; chunks start at multiples of 16 rows, so N keeps its divisibility; of 128 rows with
    "TILED", the weight in layout.tile_nvfp4's order)."""
    check_tiled(config, N, K)
    types = {"w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "out_ptr": "*bf16", "N": "i32", "K": "i32",
             "stride_wn": "i32", "stride_sn": "i32", "stride_on": "i32"}
    ints = {"N": N, "K": K, "stride_wn": K // 2, "stride_sn": K // 16, "stride_on": K}
    return aot_signature(nvfp4_dequant_kernel, types, ints, _dequant_constexprs(config, K), config,
                         ("cdiv(N, BLOCK_N)", "cdiv(K, BLOCK_K)", "1"))


def _dequant_constexprs(config: dict, K: int) -> dict:
    cx = {"BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"], "PACK": config.get("PACK", False),
          "EVEN_K": K % config["BLOCK_K"] == 0}
    if config.get("TILED"):  # the tiled weight order (layout.py); left out otherwise
        cx["TILED"] = True
    if config.get("BITS"):  # the words' bits in layout.NVFP4_BITS order
        cx["BITS"] = True
    return cx


def signature_fp8_gemm(config: dict, N: int, K: int, has_bias: bool = False,
                       has_residual: bool = False) -> AotSignature:
    """AotSignature of fp8_gemm_kernel for a contiguous [N, K] weight and [M, K] quantized activations."""
    types = {"xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_rm": "i32", "stride_om": "i32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K, "stride_rm": N, "stride_om": N}
    return aot_signature(fp8_gemm_kernel, types, ints, _gemm_constexprs(config, has_bias, has_residual), config,
                         GEMM_GRID)


def signature_permute_k(BK: int, K: int, pdl: bool = True, words: bool = True):
    """AotSignature of the x permutation for contiguous [M, K] activations (M a run-time argument):
    permute_k_words_kernel, or with words=False permute_k_kernel (the gather with its index table, which engines
    built before the words kernel carry); pdl: compiled for programmatic dependent launch (the runtime launches it
    with the attribute)."""
    types = {"x_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "K": "i32", "stride_xm": "i32", "stride_om": "i32"}
    if not words:
        types = {"x_ptr": "*bf16", "idx_ptr": "*i32", **types}
    cx = {"BK": BK, "ROWS": PERMUTE_CONFIG["ROWS"], "COLS": permute_cols(BK), "PDL": pdl}
    return aot_signature(permute_k_words_kernel if words else permute_k_kernel, types,
                         {"K": K, "stride_xm": K, "stride_om": K}, cx, PERMUTE_CONFIG, PERMUTE_GRID)


def signature_quantize_rows_fp8(config: dict, K: int) -> AotSignature:
    """AotSignature of quantize_rows_fp8_kernel for contiguous [M, K] activations."""
    types = {"x_ptr": "*bf16", "xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "M": "i32", "K": "i32",
             "stride_xm": "i32", "stride_qm": "i32"}
    return aot_signature(quantize_rows_fp8_kernel, types, {"K": K, "stride_xm": K, "stride_qm": K},
                         {"BLOCK_K": config["BLOCK_K"]}, config, ("M", "1", "1"))


# ---- JIT launchers (tests, autotuning) ------------------------------------------------------------------------

def _check(x: torch.Tensor, dtype: torch.dtype, K: int, what: str):
    if x.dim() != 2 or x.dtype != dtype or x.shape[1] != K or x.stride(1) != 1:
        raise ValueError(f"{what} must be {dtype} [M, {K}] with contiguous rows, got {x.dtype} {list(x.shape)}.")
    if K % 16:
        raise ValueError(f"K = {K} is not a multiple of 16; keep this weight in bfloat16.")


def _epilogue_args(out, bias, residual):
    res = residual if residual is not None else out
    return (bias if bias is not None else out), res, res.stride(0)


def launch_nvfp4_dequant(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                         out: torch.Tensor, config: dict) -> torch.Tensor:
    """out bf16 [n, K] = the nvfp4 rows given (weight u8 [n, K/2], weight_scale [n, K/16], weight_scale_2 [n]).
    A "TILED" config: weight and weight_scale in layout.tile_nvfp4's order, or rows [n0, n0 + n) of such a weight
    with n0 and n multiples of 128."""
    n, K = weight.shape[0], weight.shape[1] * 2
    check_tiled(config, n, K, weight, weight_scale)
    nvfp4_dequant_kernel[grid_nvfp4_dequant(config, n, K)](
        weight, weight_scale, weight_scale_2, out, n, K, weight.stride(0), weight_scale.stride(0), out.stride(0),
        **_dequant_constexprs(config, K), num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def dequant_matmul(x: torch.Tensor, w_bf16: torch.Tensor, bias: torch.Tensor | None,
                   residual: torch.Tensor | None, out: torch.Tensor) -> None:
    """out [M, n] (a column slice is fine) = x @ w_bf16.T (+ bias) (+ residual) by cuBLAS; bias/residual sliced."""
    if residual is not None:
        extra = residual if bias is None else residual + bias
        torch.addmm(extra, x, w_bf16.T, out=out)
    elif bias is not None:
        torch.addmm(bias, x, w_bf16.T, out=out)
    else:
        torch.mm(x, w_bf16.T, out=out)


def nvfp4_dequant_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                         residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         workspace: torch.Tensor | None = None) -> torch.Tensor:
    """The DEQUANT way of the nvfp4 linear: per chunk of dequant_rows(config, K) rows, nvfp4_dequant_kernel into a
    bf16 workspace [rows, K], then cuBLAS into that chunk's output columns. With "TILED" (weight in
    layout.tile_nvfp4's order) the chunks are whole 128-row groups of tiles."""
    N, K = weight.shape[0], weight.shape[1] * 2
    _check(x, torch.bfloat16, K, "x")
    check_tiled(config, N, K, weight, weight_scale)
    out = torch.empty(x.shape[0], N, dtype=torch.bfloat16, device=x.device) if out is None else out
    if x.shape[0] == 0:
        return out
    rows = dequant_rows(config, K)
    if workspace is None:
        workspace = torch.empty(min(rows, N), K, dtype=torch.bfloat16, device=x.device)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        wc = launch_nvfp4_dequant(weight[n0:n1], weight_scale[n0:n1], weight_scale_2[n0:n1],
                                  workspace[: n1 - n0], config)
        dequant_matmul(x, wc, None if bias is None else bias[n0:n1],
                       None if residual is None else residual[:, n0:n1], out[:, n0:n1])
    return out


def launch_nvfp4_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                      residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N]; x bf16 [M, K]; W in nvfp4 storage (u8 [N, K/2], ...).
    A DEQUANT config runs nvfp4_dequant_linear instead of nvfp4_gemm_kernel, a WGMMA config the Gluon kernel, a WS
    config the warp-specialized one (an "SK" config of either: its persistent stream-K form).
    A "TILED" config takes W in layout.tile_nvfp4's order."""
    if config.get("DEQUANT"):
        return nvfp4_dequant_linear(x, weight, weight_scale, weight_scale_2, config, bias, residual, out)
    if config.get("WGMMA") and config.get("SK"):
        from atlas.plugins_trt.quant_linear.gluon_gemm import launch_nvfp4_gemm_wgmma_sk
        return launch_nvfp4_gemm_wgmma_sk(x, weight, weight_scale, weight_scale_2, config, bias, residual, out)
    if config.get("WS") and config.get("SK"):
        from atlas.plugins_trt.quant_linear.gluon_ws import launch_nvfp4_gemm_rs_sk
        return launch_nvfp4_gemm_rs_sk(x, weight, weight_scale, weight_scale_2, config, bias, residual, out)
    if config.get("WGMMA"):
        from atlas.plugins_trt.quant_linear.gluon_gemm import launch_nvfp4_gemm_wgmma
        return launch_nvfp4_gemm_wgmma(x, weight, weight_scale, weight_scale_2, config, bias, residual, out)
    if config.get("WS"):
        from atlas.plugins_trt.quant_linear.gluon_ws import launch_nvfp4_gemm_ws
        return launch_nvfp4_gemm_ws(x, weight, weight_scale, weight_scale_2, config, bias, residual, out)
    N, K = weight.shape[0], weight.shape[1] * 2
    _check(x, torch.bfloat16, K, "x")
    check_tiled(config, N, K, weight, weight_scale)
    M = x.shape[0]
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device) if out is None else out
    if M == 0:
        return out
    bias_t, res_t, stride_rm = _epilogue_args(out, bias, residual)
    nvfp4_gemm_kernel[grid_gemm(config, M, N)](
        x, weight, weight_scale, weight_scale_2, bias_t, res_t, out, M, N, K, x.stride(0), weight.stride(0),
        weight_scale.stride(0), stride_rm, out.stride(0), **_gemm_constexprs(config, bias is not None,
                                                                             residual is not None),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def launch_quantize_rows_fp8(x: torch.Tensor, config: dict, out: tuple[torch.Tensor, torch.Tensor] | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, K] -> (x_q e4m3 [M, K], x_scale f32 [M]) with x ≈ x_q * x_scale[:, None]; out: both to write."""
    M, K = x.shape
    _check(x, torch.bfloat16, K, "x")
    if out is None:
        out = (torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device),
               torch.empty(M, dtype=torch.float32, device=x.device))
    xq, xs = out
    if M == 0:
        return xq, xs
    quantize_rows_fp8_kernel[grid_quantize_rows_fp8(config, M)](
        x, xq, xs, M, K, x.stride(0), xq.stride(0), BLOCK_K=config["BLOCK_K"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return xq, xs


def launch_fp8_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    config: dict, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """y = (x_q * x_scale) @ (W * weight_scale).T (+ bias) (+ residual), bf16 [M, N]."""
    N, K = weight.shape
    _check(x_q, torch.float8_e4m3fn, K, "x_q")
    M = x_q.shape[0]
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x_q.device) if out is None else out
    if M == 0:
        return out
    bias_t, res_t, stride_rm = _epilogue_args(out, bias, residual)
    fp8_gemm_kernel[grid_gemm(config, M, N)](
        x_q, x_scale, weight, weight_scale, bias_t, res_t, out, M, N, K, x_q.stride(0), weight.stride(0),
        stride_rm, out.stride(0), **_gemm_constexprs(config, bias is not None, residual is not None),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def scaled_mm_fp8(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """y = (x_q * x_scale) @ (W * weight_scale).T (+ bias) (+ residual), bf16, by cuBLASLt (torch._scaled_mm with
    row-wise scales; W [N, K] row-major is the column-major operand it wants)."""
    N, K = weight.shape
    if N % 16 or K % 16:
        raise ValueError(f"the cuBLASLt FP8 GEMM needs N and K multiples of 16, got {N}x{K}; use fp8_gemm_kernel.")
    if out is None:
        out = torch.empty(x_q.shape[0], N, dtype=torch.bfloat16, device=x_q.device)
    torch._scaled_mm(x_q, weight.t(), scale_a=x_scale[:, None], scale_b=weight_scale[None, :], bias=bias,
                     out_dtype=torch.bfloat16, out=out)
    if residual is not None:  # a second rounding; the runtime's linears pass no residual
        out += residual
    return out


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, gemm_config: dict,
                quant_config: dict = CONFIGS_quantize_rows_fp8[0], bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The FP8 W8A8 linear: quantize_rows_fp8_kernel, then fp8_gemm_kernel (or cuBLASLt for a "CUBLAS" config)."""
    x_q, x_scale = launch_quantize_rows_fp8(x, quant_config)
    if gemm_config.get("CUBLAS"):
        return scaled_mm_fp8(x_q, x_scale, weight, weight_scale, bias, residual, out)
    return launch_fp8_gemm(x_q, x_scale, weight, weight_scale, gemm_config, bias, residual, out)
