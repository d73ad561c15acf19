"""Weight-only quantized GEMV for small M (1..16): y[M, N] = x[M, K] @ W[N, K].T (+ bias) (+ residual).

Formats (engine storage, see reference.py):
  nvfp4  weight u8 [N, K/2] (element 2j in the low nibble), weight_scale e4m3 [N, K/16], weight_scale_2 f32 [N]
  fp8    weight e4m3 [N, K], weight_scale f32 [N]
x and y are bf16; accumulation is fp32.

Design (memory-bound: the floor is the weight bytes over bandwidth):
  * One program owns BLOCK_N output rows and a K slice (SPLIT_K programs along grid dim 1), and walks K in
    BLOCK_K steps. Weights are loaded as int32 words, four per thread (16-byte loads), coalesced along K.
  * BLOCK_M == 1 (the decode step): CUDA-core path. Each word is decoded with three integer ops per element
    (shift, arithmetic shift, mask) straight into fp32 bit patterns, no conversion instructions:
      E2M1 nibble s.e1e0.m -> fp32 bits s<<31 | e1e0m<<22  = value * 2^-126 (exact; code 1 is the denormal 2^-127)
      E4M3 byte   s.eeee.mmm -> fp32 bits s<<31 | eeeemmm<<20 = value * 2^-120 (exact, e4m3 subnormals too)
    Activations are unpacked from bf16 pairs and pre-scaled by 2^100 (exact for |x| < 2^28), so every product
    stays a normal fp32 number; the exponent offsets are undone in the epilogue. Products accumulate with FMA
    chains per word; the nvfp4 block scale multiplies each word's partial sum (once per 8 elements).
    The x slice each thread needs is loaded with the weights' own layout (no shared-memory exchange).
  * nvfp4, BLOCK_M in 2..16: tensor-core path. Weights are dequantized in registers to bf16 (exactly
    E2M1 * block scale * 2^-8, in the dot-operand layout straight from shared memory) and fed to tl.dot with
    the x tile padded to 16 rows (mma m16n8k16); the per-row scale is applied to the fp32 accumulator.
  * fp8, TC configs (any bucket): split-position tensor-core path. The reduction runs in split order: dot t sums
    byte t of every int32 word against x_t[m, j] = x[m, 4j + t] (a register split of the x tile), so a weight
    word never has to be rearranged. Byte t of two words becomes one bf16x2 (E4M3 * 2^-120, exact) in three PTX
    instructions; that op has one input and one output, so Triton decodes in the dot-operand layout straight
    from shared memory. x is pre-scaled by 2^60 to keep the fp32 products normal; no conversion instructions.
  * SPLIT_K > 1: each split writes its fp32 partial (per-row scales applied) to a workspace
    [SPLIT_K, M, N]; splitk_reduce_kernel sums the splits in a fixed order (deterministic, no atomics, no
    memset), adds bias and residual and casts to bf16. With SPLIT_K == 1 the GEMV writes bf16 itself.
  * PDL (programmatic dependent launch, sm_90): with the constexpr on and the kernel launched with the
    programmatic-serialization attribute (`pdl=True` in the launchers, "PDL" in an engine's constexprs), each
    program first lets the next launch start (griddepcontrol.launch_dependents) and waits for the previous
    grid's writes (griddepcontrol.wait) before it reads x, the partials or the residual. The next kernel's
    programs then take the SMs this one leaves, so the launch gap and ramp-up of back-to-back kernels overlap
    (the decode step is a chain of them). Reads of the weights only (the Gluon GEMV's first block) may come
    before the wait: nothing before it in the stream writes them.

Every kernel takes pointers, i32 ints and constexprs only, so that the build stage can compile it ahead of time
(triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32))). The
signature_<kernel> helpers return exactly that; launch_<kernel> runs the same kernel through Triton's JIT.
Contract shared by all kernels here: every pointer is 16-byte aligned, rows are contiguous along K, and
K % 16 == 0. The ints given to signature_* (K, N, strides) are specialisations: a kernel compiled for them runs
only on those values (M stays a run-time argument). TILED (nvfp4, a config's "TILED"): the weight and its block
scales in layout.py's order of 128 x 128 tiles instead of row-major (N, K and BLOCK_K multiples of 128, check_tiled);
the blocks of a K step are then a few contiguous runs, the row strides are unused.
"""

from __future__ import annotations

import inspect
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
from atlas.plugins_trt.quant_linear.layout import TILE_K, can_tile
from atlas.plugins_trt.rms_norm.triton_norm import add_residual, launch_rms_norm, norm_config, rms_norm_values
from atlas.plugins_trt.pdl import pdl_enter

# ---- bit patterns (int32 constants spelt signed, as Triton wants them) ------------------------------------
_E2M1_MASK = tl.constexpr(0x81C00000 - (1 << 32))  # sign bit 31 + E2M1 exponent/mantissa at fp32 bits 24..22
_E2M1_SIGN = tl.constexpr(0x80000000 - (1 << 32))  # the sign bit alone
_E4M3_MASK = tl.constexpr(0x87F00000 - (1 << 32))  # sign bit 31 + E4M3 exponent/mantissa at fp32 bits 26..20
_HI16 = tl.constexpr(0xFFFF0000 - (1 << 32))
_X_UP = tl.constexpr(2.0 ** 100)  # activation pre-scale (exact while |x| < 2^28)
_NVFP4_FMA_DOWN = tl.constexpr(2.0 ** 26)  # 2^126 (E2M1 bits) - 2^100 (x pre-scale)
_FP8_FMA_DOWN = tl.constexpr(2.0 ** 20)  # 2^120 (E4M3 bits) - 2^100
_S_UP = tl.constexpr(2.0 ** 118)  # DOT path: E2M1 bits * scale * 2^118 = value * scale * 2^-8 (no overflow)
_NVFP4_DOT_DOWN = tl.constexpr(2.0 ** 8)

_X_TC_UP = tl.constexpr(2.0 ** 60)  # fp8 TC path: E4M3 bits (value * 2^-120) times x * 2^60 stays fp32-normal
# Inline PTX cannot run in Triton's interpreter; there the split-position decode takes the fp32 bit-pattern route,
# which gives the same bf16 values. Fixed when this module is imported (TRITON_INTERPRET must be set before).
_PTX = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
# prmt selectors: byte 1 = a.byte_i, byte 2 = the sign of a.byte_i replicated, byte 3 = b.byte_i (i = 0..3)
_PAIR_SEL = ("0x4800", "0x5910", "0x6A20", "0x7B30")


def _e4m3_pair_asm(i: int) -> str:
    """PTX for two int32 words a, b (pack = 2) -> bf16x2 of byte i of each as E4M3 * 2^-120, exactly: after the
    prmt an arithmetic shift by 4 puts a.byte_i's sign on bit 15 and b.byte_i's on bit 31, the 7 exponent and
    mantissa bits of each on bits 10..4 and 26..20 (subnormals become bf16 subnormals)."""
    return f"{{ .reg .b32 p; prmt.b32 p, $1, $2, {_PAIR_SEL[i]}; shr.s32 p, p, 4; and.b32 $0, p, 0x87F087F0; }}"


_E4M3_PAIR_0, _E4M3_PAIR_1, _E4M3_PAIR_2, _E4M3_PAIR_3 = (tl.constexpr(_e4m3_pair_asm(i)) for i in range(4))


def _nvfp4_word_asm() -> str:
    """PTX for one int32 word w (8 E2M1 nibbles, element 8c + t in nibble t) and a bf16 S -> 8 bf16, element t =
    E2M1(nibble t) * S * 2^-126, exactly (S = block scale * 2^118 keeps it in [2^-18, 10.5]). For byte i, q = w << 4
    holds its low nibble as a high nibble; prmt(q, w) puts element 2i in the low half and 2i + 1 in the high half,
    each with its sign replicated above, so one arithmetic shift and one mask give the bf16x2 of E2M1 * 2^-126,
    and one bf16x2 multiply applies the scale: 4 instructions a pair, 2.25 an element with the shift and the
    scale pair."""
    body = ["{ .reg .b32 q, p, s2;", "shl.b32 q, $8, 4;", "mov.b32 s2, {$9, $9};"]
    for i in range(4):
        body.append(f"prmt.b32 p, q, $8, {_PAIR_SEL[i]}; shr.s32 p, p, 6; and.b32 p, p, 0x81C081C0; "
                    f"mul.rn.bf16x2 p, p, s2; mov.b32 {{${2 * i}, ${2 * i + 1}}}, p;")
    return " ".join(body + ["}"])


_NVFP4_WORD = tl.constexpr(_nvfp4_word_asm())

MMA_M = tl.constexpr(16)  # the x tile of the tensor-core path is padded to this many rows
M_BUCKETS = (1, 2, 4, 8, 16)


# ---- decode helpers (shared with triton_gemm) ---------------------------------------------------------------

@triton.jit
def e2m1_nibble_f32(w, T: tl.constexpr):
    """int32 words -> fp32 E2M1 value of nibble T (element 8c+T of word c) times 2^-126, exactly."""
    if T == 7:
        a = w >> 6
    else:
        a = (w << (28 - 4 * T)) >> 6  # nibble sign lands on bit 31, the arithmetic shift fills 25..30 with it
    return (a & _E2M1_MASK).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_bits_f32(w, T: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """e2m1_nibble_f32 for words in layout.NVFP4_BITS order: nibble T's pair (T // 2) has shifts (A, B) (its sign A
    bits below bit 31 / 15, its magnitude B bits below 24..22 / 8..6); the high nibble (odd T) sits in the high half."""
    if T % 2 == 0:  # the low half: 16 more
        SA: tl.constexpr = A + 16
        SB: tl.constexpr = B + 16
    else:
        SA: tl.constexpr = A
        SB: tl.constexpr = B
    sign = (w << SA) & _E2M1_SIGN  # SA >= 16 > 0
    if SB >= 0:
        mag = (w << SB) & 0x01C00000
    else:
        mag = (w.to(tl.uint32, bitcast=True) >> -SB).to(tl.int32, bitcast=True) & 0x01C00000
    return (sign | mag).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_byte_f32(w, B: tl.constexpr):
    """int32 words -> fp32 E4M3 value of byte B times 2^-120, exactly (NaN codes decode to finite values)."""
    if B == 3:
        a = w >> 4
    else:
        a = (w << (24 - 8 * B)) >> 4
    return (a & _E4M3_MASK).to(tl.float32, bitcast=True)


@triton.jit
def bf16_pair_f32(xw, HI: tl.constexpr):
    """int32 holding two bf16 (element 2i low half) -> fp32 of one of them, times 2^100."""
    if HI:
        v = (xw & _HI16).to(tl.float32, bitcast=True)
    else:
        v = (xw << 16).to(tl.float32, bitcast=True)
    return v * _X_UP


@triton.jit
def e4m3_byte_bf16(w, ASM: tl.constexpr, B: tl.constexpr):
    """int32 words -> bf16 E4M3 value of byte B times 2^-120, exactly; ASM is _E4M3_PAIR_<B>. The inline PTX takes
    the words two at a time (3 instructions a pair); it is one-input, one-output and pure, so Triton moves the
    dot-operand layout conversion above it, onto the shared-memory load of the words."""
    if _PTX:
        return tl.inline_asm_elementwise(ASM, "=r,r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return e4m3_byte_f32(w, B).to(tl.bfloat16)


@triton.jit
def split4_cols(x, KW: tl.constexpr):
    """x [R, 4 KW] -> 4 tiles [R, KW]: tile t [r, j] = x[r, 4j + t] (element t of word j)."""
    c0, c1 = tl.split(tl.reshape(x, [x.shape[0], KW, 2, 2]))
    x0, x2 = tl.split(c0)
    x1, x3 = tl.split(c1)
    return x0, x1, x2, x3


@triton.jit
def nvfp4_tile_bf16(w, sg, PTX: tl.constexpr = False):
    """Dequantize one tile for tl.dot: words int32 [R, C] + block scales fp32 [R, C/2] -> bf16 [R, 8C].

    Element [r, 8c + t] = E2M1(nibble t of w[r, c]) * sg[r, c // 2] * 2^-8, exact in bf16 (at most 6 significant
    bits, magnitude in [2^-18, 10.5]); the caller multiplies the accumulator by 2^8 * weight_scale_2.
    PTX: decode with _NVFP4_WORD (2.25 instructions an element instead of ~6). Its 8 outputs keep Triton from
    decoding in the dot-operand layout, so the tile goes through shared memory: a win where the tile goes there
    anyway (the wgmma GEMM), a loss in the mma.sync GEMV (27B gate_up at M = 16: 111 us against 74 us).
    """
    R: tl.constexpr = w.shape[0]
    C: tl.constexpr = w.shape[1]
    if PTX and _PTX:
        sw = tl.reshape(tl.join(sg, sg), [R, C])  # the scale of every word (two words a block)
        sw = (sw * _S_UP).to(tl.bfloat16)  # exact: at most 4 significant bits, below 2^127
        e0, e1, e2, e3, e4, e5, e6, e7 = tl.inline_asm_elementwise(
            _NVFP4_WORD, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sw], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        t = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
        return tl.reshape(t, [R, C * 8])
    # nested joins put nibble t = 4a + 2b + c at index [..., a, b, c] (join adds a new last axis)
    even = tl.join(tl.join(e2m1_nibble_f32(w, 0), e2m1_nibble_f32(w, 4)),
                   tl.join(e2m1_nibble_f32(w, 2), e2m1_nibble_f32(w, 6)))
    odd = tl.join(tl.join(e2m1_nibble_f32(w, 1), e2m1_nibble_f32(w, 5)),
                  tl.join(e2m1_nibble_f32(w, 3), e2m1_nibble_f32(w, 7)))
    f = tl.reshape(tl.join(even, odd), [R, C // 2, 16]) * (sg * _S_UP)[:, :, None]
    return tl.reshape(f, [R, C * 8]).to(tl.bfloat16)


@triton.jit
def _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """y fp32 [BM, BN] -> out[m, n] (+ bias[n]) (+ residual[m, n]), cast to out's element type, masked."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_blocks(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's K blocks: full blocks [b_lo, b_full) and whether it also owns the partial tail block."""
    pid_k = tl.program_id(1)
    per_split = ((K + BLOCK_K - 1) // BLOCK_K + SPLIT_K - 1) // SPLIT_K
    b_lo = pid_k * per_split
    b_hi = b_lo + per_split
    n_full = K // BLOCK_K
    b_full = tl.minimum(b_hi, n_full)
    has_tail = (K % BLOCK_K != 0) & (n_full >= b_lo) & (n_full < b_hi)
    return pid_k, b_lo, b_full, has_tail


# ---- nvfp4 ----------------------------------------------------------------------------------------------------

@triton.jit
def _nvfp4_row_ptrs(w_ptr, ws_ptr, rows, K, stride_wn, stride_sn, BLOCK_K: tl.constexpr, TILED: tl.constexpr):
    """Pointers to K block 0 of `rows` [BN] (clamped row indices): int32 words [BN, BLOCK_K/8] and scale bytes
    [BN, BLOCK_K/16]. Row-major: rows strided by stride_wn / stride_sn. TILED (layout.py; N % 128 == K % 128 == 0):
    row_part(n) + col_part(j), block b starting b * BLOCK_K / 128 tiles further (the steps' WSTEP / SSTEP)."""
    if TILED:
        tl.static_assert(BLOCK_K % 128 == 0)
        tiles = (rows // 128) * (K // 128)  # tiles before this row's 128-row group
        j = tl.arange(0, BLOCK_K // 8)
        g = tl.arange(0, BLOCK_K // 16)
        # hints as the row-major pointers have them: words 16-byte loads (runs of 16, 64-byte aligned), scales two
        # a thread to keep the words' layout
        cw = tl.max_contiguous(tl.multiple_of((j // 16) * 2048 + j % 16, 16), 16)
        cs = tl.max_contiguous(tl.multiple_of((g // 8) * 1024 + g % 8, 2), 2)
        w_rows = w_ptr.to(tl.pointer_type(tl.int32)) + (tiles * 2048 + (rows % 128) * 16)[:, None] + cw[None, :]
        s_rows = ws_ptr.to(tl.pointer_type(tl.uint8)) + (tiles * 1024 + (rows % 128) * 8)[:, None] + cs[None, :]
    else:
        w_rows = (w_ptr + rows[:, None] * stride_wn).to(tl.pointer_type(tl.int32)) \
            + tl.arange(0, BLOCK_K // 8)[None, :]
        s_rows = (ws_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * stride_sn
                  + tl.max_contiguous(tl.arange(0, BLOCK_K // 16), 2)[None, :])
    return w_rows, s_rows


@triton.jit
def _nvfp4_fma_step(acc, w_rows, s_rows, x32, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                    TILED: tl.constexpr = False):
    KW: tl.constexpr = BLOCK_K // 8
    KG: tl.constexpr = BLOCK_K // 16
    if TILED:  # a block starts BLOCK_K / 128 tiles (2048 words, 1024 scales) after the one before
        WSTEP: tl.constexpr = (BLOCK_K // 128) * 2048
        SSTEP: tl.constexpr = (BLOCK_K // 128) * 1024
    else:
        WSTEP: tl.constexpr = KW
        SSTEP: tl.constexpr = KG
    offs_j = tl.arange(0, KW)
    offs_g = tl.max_contiguous(tl.arange(0, KG), 2)  # keeps the scale load in the words' layout (2 per thread)
    xj = x32 + b * (BLOCK_K // 2) + offs_j * 4  # x word slot i of weight word j holds elements 8j+2i, 8j+2i+1
    if MASKED:
        wmask = (b * KW + offs_j) < K // 8
        w = tl.load(w_rows + b * WSTEP, mask=wmask[None, :], other=0)
        sg = tl.load(s_rows + b * SSTEP, mask=((b * KG + offs_g) < K // 16)[None, :], other=0)
        x0 = tl.load(xj, mask=wmask, other=0)
        x1 = tl.load(xj + 1, mask=wmask, other=0)
        x2 = tl.load(xj + 2, mask=wmask, other=0)
        x3 = tl.load(xj + 3, mask=wmask, other=0)
    else:
        w = tl.load(w_rows + b * WSTEP)
        sg = tl.load(s_rows + b * SSTEP)
        x0 = tl.load(xj)
        x1 = tl.load(xj + 1)
        x2 = tl.load(xj + 2)
        x3 = tl.load(xj + 3)
    sg = sg.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    sw = tl.reshape(tl.join(sg, sg), [w.shape[0], KW])  # block scale of each word (two words per block)
    # p[n, j] = sum_t E2M1(w[n, j], t) * x[8j + t] * 2^-26, an FMA chain
    p = e2m1_nibble_f32(w, 0) * bf16_pair_f32(x0, False)[None, :]
    p += e2m1_nibble_f32(w, 1) * bf16_pair_f32(x0, True)[None, :]
    p += e2m1_nibble_f32(w, 2) * bf16_pair_f32(x1, False)[None, :]
    p += e2m1_nibble_f32(w, 3) * bf16_pair_f32(x1, True)[None, :]
    p += e2m1_nibble_f32(w, 4) * bf16_pair_f32(x2, False)[None, :]
    p += e2m1_nibble_f32(w, 5) * bf16_pair_f32(x2, True)[None, :]
    p += e2m1_nibble_f32(w, 6) * bf16_pair_f32(x3, False)[None, :]
    p += e2m1_nibble_f32(w, 7) * bf16_pair_f32(x3, True)[None, :]
    return acc + p * sw


@triton.jit
def _nvfp4_dot_step(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                    PTX: tl.constexpr = False, TILED: tl.constexpr = False):
    KW: tl.constexpr = BLOCK_K // 8
    KG: tl.constexpr = BLOCK_K // 16
    if TILED:  # as in _nvfp4_fma_step
        WSTEP: tl.constexpr = (BLOCK_K // 128) * 2048
        SSTEP: tl.constexpr = (BLOCK_K // 128) * 1024
    else:
        WSTEP: tl.constexpr = KW
        SSTEP: tl.constexpr = KG
    offs_j = tl.arange(0, KW)
    offs_g = tl.max_contiguous(tl.arange(0, KG), 2)
    offs_k = tl.arange(0, BLOCK_K)
    if MASKED:
        w = tl.load(w_rows + b * WSTEP, mask=((b * KW + offs_j) < K // 8)[None, :], other=0)
        sg = tl.load(s_rows + b * SSTEP, mask=((b * KG + offs_g) < K // 16)[None, :], other=0)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None] & ((b * BLOCK_K + offs_k) < K)[None, :], other=0.0)
    else:
        w = tl.load(w_rows + b * WSTEP)
        sg = tl.load(s_rows + b * SSTEP)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None], other=0.0)
    wt = nvfp4_tile_bf16(w, sg.to(tl.float8e4nv, bitcast=True).to(tl.float32), PTX)  # [BN, BK]
    return tl.dot(x, tl.trans(wt), acc)


@triton.jit(do_not_specialize=["M"])
def nvfp4_gemv_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                      M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PIPE: tl.constexpr = 1,
                      PDL: tl.constexpr = False, TILED: tl.constexpr = False):
    """NVFP4 W4A16 GEMV. Grid (cdiv(N, BLOCK_N), SPLIT_K, 1); block 32 * num_warps threads.

    x_ptr    *bf16     [M, K], row stride stride_xm (elements)
    w_ptr    *u8       [N, K/2] packed E2M1 (element 2j low nibble), row stride stride_wn (bytes)
    ws_ptr   *fp8e4nv  [N, K/16] block scales, row stride stride_sn (elements)
    ws2_ptr  *fp32     [N] per-row global scale
    bias_ptr *bf16     [N] (read only when HAS_BIAS)
    res_ptr  *bf16     [M, N], row stride stride_rm (read only when HAS_RESIDUAL)
    out_ptr  *bf16     [M, N], row stride stride_om, when SPLIT_K == 1;
             *fp32     [SPLIT_K, M, N] partials (split stride M * stride_om) when SPLIT_K > 1
    M, N, K  i32       1 <= M <= BLOCK_M, K % 16 == 0
    BLOCK_M  1 (CUDA-core path) or 2, 4, 8, 16 (tensor-core path); BLOCK_N, BLOCK_K powers of 2, BLOCK_K >= 32.
    HAS_BIAS / HAS_RESIDUAL only with SPLIT_K == 1 (otherwise splitk_reduce_kernel applies them).
    PDL      programmatic dependent launch (module docstring)
    TILED    w_ptr / ws_ptr in the tiled order (layout.tile_nvfp4; stride_wn, stride_sn unused): N % 128 == 0,
             K % 128 == 0, BLOCK_K % 128 == 0.
    """
    tl.static_assert(BLOCK_K % 32 == 0)
    tl.static_assert(SPLIT_K == 1 or not (HAS_BIAS or HAS_RESIDUAL))
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_k, b_lo, b_full, has_tail = _split_blocks(K, BLOCK_K, SPLIT_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)  # clamped, so that the main loop needs no mask
    w_rows, s_rows = _nvfp4_row_ptrs(w_ptr, ws_ptr, rows, K, stride_wn, stride_sn, BLOCK_K, TILED)
    out_ptr += pid_k * M * stride_om
    if BLOCK_M == 1:
        x32 = x_ptr.to(tl.pointer_type(tl.int32))
        acc = tl.zeros([BLOCK_N, BLOCK_K // 8], dtype=tl.float32)
        for b in tl.range(b_lo, b_full, num_stages=PIPE):
            acc = _nvfp4_fma_step(acc, w_rows, s_rows, x32, b, K, BLOCK_K, False, TILED)
        if has_tail:
            acc = _nvfp4_fma_step(acc, w_rows, s_rows, x32, b_full, K, BLOCK_K, True, TILED)
        y = tl.sum(acc, axis=1) * (tl.load(ws2_ptr + rows) * _NVFP4_FMA_DOWN)
        _epilogue_store(y[None, :], tl.arange(0, 1), offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                        HAS_BIAS, HAS_RESIDUAL)
    else:
        TILE_M: tl.constexpr = 16 if BLOCK_M < 16 else BLOCK_M
        offs_m = tl.arange(0, TILE_M)
        row_ok = offs_m < M
        x_rows = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
        acc = tl.zeros([TILE_M, BLOCK_N], dtype=tl.float32)
        for b in range(b_lo, b_full):
            acc = _nvfp4_dot_step(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K, False, False, TILED)
        if has_tail:
            acc = _nvfp4_dot_step(acc, w_rows, s_rows, x_rows, row_ok, b_full, K, BLOCK_K, True, False, TILED)
        y = acc * (tl.load(ws2_ptr + rows) * _NVFP4_DOT_DOWN)[None, :]
        _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                        HAS_BIAS, HAS_RESIDUAL)


# ---- fp8 ------------------------------------------------------------------------------------------------------

@triton.jit
def _fp8_fma_step(acc, w_rows, x32, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    KW: tl.constexpr = BLOCK_K // 4
    offs_j = tl.arange(0, KW)
    xj = x32 + b * (BLOCK_K // 2) + offs_j * 2  # x word slot i of weight word j holds elements 4j+2i, 4j+2i+1
    if MASKED:
        wmask = (b * KW + offs_j) < K // 4
        w = tl.load(w_rows + b * KW, mask=wmask[None, :], other=0)
        x0 = tl.load(xj, mask=wmask, other=0)
        x1 = tl.load(xj + 1, mask=wmask, other=0)
    else:
        w = tl.load(w_rows + b * KW)
        x0, x1 = _fp8_fma_x(x32, b, BLOCK_K)
    return _fp8_fma_dot(acc, w, x0, x1)


@triton.jit
def _fp8_fma_x(x32, b, BLOCK_K: tl.constexpr):
    """The x words of whole block b for _fp8_fma_dot: slot i of weight word j holds elements 4j+2i, 4j+2i+1."""
    xj = x32 + b * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 4) * 2
    return tl.load(xj), tl.load(xj + 1)


@triton.jit
def _pre_words(ptrs, b_lo, b_full, KW: tl.constexpr, PRE: tl.constexpr):
    """fp8_gemv_kernel's PRE loads: the words of the split's first one or two blocks (zeros past b_full; w1 is w0
    at PRE 1), issued before the PDL wait."""
    w0 = tl.load(ptrs + b_lo * KW, mask=b_lo < b_full, other=0)
    w1 = w0
    if PRE >= 2:
        w1 = tl.load(ptrs + (b_lo + 1) * KW, mask=b_lo + 1 < b_full, other=0)
    return w0, w1


@triton.jit
def _fp8_fma_dot(acc, w, x0, x1):
    """acc[BN, BK / 4] += the four bytes of each weight word times their x pairs (x0, x1: the block's x words)."""
    acc += e4m3_byte_f32(w, 0) * bf16_pair_f32(x0, False)[None, :]
    acc += e4m3_byte_f32(w, 1) * bf16_pair_f32(x0, True)[None, :]
    acc += e4m3_byte_f32(w, 2) * bf16_pair_f32(x1, False)[None, :]
    acc += e4m3_byte_f32(w, 3) * bf16_pair_f32(x1, True)[None, :]
    return acc


@triton.jit
def _fp8_tc_step(acc, w_cols, x_rows, row_ok, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """acc[16, BN] += x[16, BK] @ W[BN, BK].T, reduced in word-split order: dot t sums byte t of every word."""
    KW: tl.constexpr = BLOCK_K // 4
    if MASKED:
        w = tl.load(w_cols + b * KW, mask=((b * KW + tl.arange(0, KW)) < K // 4)[:, None], other=0)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None] & ((b * BLOCK_K + tl.arange(0, BLOCK_K)) < K)[None, :],
                    other=0.0)
    else:
        w = tl.load(w_cols + b * KW)  # int32 [KW, BN]: no transpose between this load and the dots
        x = _fp8_tc_x(x_rows, row_ok, b, BLOCK_K)
    return _fp8_tc_dot(acc, w, x, BLOCK_K)


@triton.jit
def _fp8_tc_x(x_rows, row_ok, b, BLOCK_K: tl.constexpr):
    """x [16, BK] of whole block b (rows past M zero)."""
    return tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None], other=0.0)


@triton.jit
def _fp8_tc_dot(acc, w, x, BLOCK_K: tl.constexpr):
    """acc[16, BN] += x[16, BK] @ W[BN, BK].T for one loaded block (w int32 [BK / 4, BN], x bf16 [16, BK])."""
    KW: tl.constexpr = BLOCK_K // 4
    if _PTX:
        x = x * tl.full([1, 1], _X_TC_UP, tl.bfloat16)  # exact (a power of two), bf16 so it stays one HMUL2 a pair
    else:
        x = (x.to(tl.float32) * _X_TC_UP).to(tl.bfloat16)
    x0, x1, x2, x3 = split4_cols(x, KW)
    acc = tl.dot(x0, e4m3_byte_bf16(w, _E4M3_PAIR_0, 0), acc)
    acc = tl.dot(x1, e4m3_byte_bf16(w, _E4M3_PAIR_1, 1), acc)
    acc = tl.dot(x2, e4m3_byte_bf16(w, _E4M3_PAIR_2, 2), acc)
    acc = tl.dot(x3, e4m3_byte_bf16(w, _E4M3_PAIR_3, 3), acc)
    return acc


@triton.jit(do_not_specialize=["M"])
def fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, bias_ptr, res_ptr, out_ptr,
                    M, N, K, stride_xm, stride_wn, stride_rm, stride_om,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, TC: tl.constexpr, PIPE: tl.constexpr = 1,
                    PDL: tl.constexpr = False, PRE: tl.constexpr = 0):
    """FP8 (E4M3, per-output-channel scale) W8A16 GEMV. Grid (cdiv(N, BLOCK_N), SPLIT_K, 1).

    x_ptr    *bf16     [M, K], row stride stride_xm
    w_ptr    *fp8e4nv  [N, K], row stride stride_wn (bytes = elements)
    ws_ptr   *fp32     [N] per-row scale
    bias_ptr *bf16     [N] (HAS_BIAS);  res_ptr *bf16 [M, N], row stride stride_rm (HAS_RESIDUAL)
    out_ptr  *bf16     [M, N] (SPLIT_K == 1) or *fp32 [SPLIT_K, M, N] partials, row stride stride_om
    M, N, K  i32       1 <= M <= BLOCK_M, K % 16 == 0
    BLOCK_M  1, 2, 4, 8, 16: the M bucket (1 <= M <= BLOCK_M)
    TC       False: CUDA-core FMA path (BLOCK_M == 1, BLOCK_K >= 16); True: tensor-core path for any bucket
             (x padded to 16 rows, BLOCK_K % 64 == 0)
    PRE      0, 1 or 2: the split's first PRE weight blocks loaded before the PDL wait (they do not depend on the
             previous kernel), so they stream while it finishes; their dots run after the wait
    """
    tl.static_assert(BLOCK_K % 16 == 0)
    tl.static_assert(SPLIT_K == 1 or not (HAS_BIAS or HAS_RESIDUAL))
    tl.static_assert(TC or BLOCK_M == 1)
    tl.static_assert(PRE <= 2)
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k, b_lo, b_full, has_tail = _split_blocks(K, BLOCK_K, SPLIT_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    out_ptr += pid_k * M * stride_om
    KW: tl.constexpr = BLOCK_K // 4
    if TC:
        tl.static_assert(BLOCK_K % 64 == 0)
        offs_m = tl.arange(0, MMA_M)
        row_ok = offs_m < M
        w_cols = (w_ptr.to(tl.pointer_type(tl.uint8)) + rows[None, :] * stride_wn).to(tl.pointer_type(tl.int32)) \
            + tl.arange(0, BLOCK_K // 4)[:, None]
        x_rows = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
        if PRE >= 1:
            w0, w1 = _pre_words(w_cols, b_lo, b_full, KW, PRE)
        if PDL:
            gdc_wait()
        acc = tl.zeros([MMA_M, BLOCK_N], dtype=tl.float32)
        for i in tl.static_range(PRE):  # the preloaded blocks' dots, after the wait (x is the previous kernel's)
            if b_lo + i < b_full:
                acc = _fp8_tc_dot(acc, w1 if i else w0, _fp8_tc_x(x_rows, row_ok, b_lo + i, BLOCK_K), BLOCK_K)
        for b in range(b_lo + PRE, b_full):
            acc = _fp8_tc_step(acc, w_cols, x_rows, row_ok, b, K, BLOCK_K, False)
        if has_tail:
            acc = _fp8_tc_step(acc, w_cols, x_rows, row_ok, b_full, K, BLOCK_K, True)
        y = acc * (tl.load(ws_ptr + rows) * _X_TC_UP)[None, :]
        _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                        HAS_BIAS, HAS_RESIDUAL)
    else:
        w_rows = (w_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * stride_wn).to(tl.pointer_type(tl.int32)) \
            + tl.arange(0, BLOCK_K // 4)[None, :]
        x32 = x_ptr.to(tl.pointer_type(tl.int32))
        if PRE >= 1:
            w0, w1 = _pre_words(w_rows, b_lo, b_full, KW, PRE)
        if PDL:
            gdc_wait()
        acc = tl.zeros([BLOCK_N, KW], dtype=tl.float32)
        for i in tl.static_range(PRE):
            if b_lo + i < b_full:
                x0, x1 = _fp8_fma_x(x32, b_lo + i, BLOCK_K)
                acc = _fp8_fma_dot(acc, w1 if i else w0, x0, x1)
        for b in tl.range(b_lo + PRE, b_full, num_stages=PIPE):
            acc = _fp8_fma_step(acc, w_rows, x32, b, K, BLOCK_K, False)
        if has_tail:
            acc = _fp8_fma_step(acc, w_rows, x32, b_full, K, BLOCK_K, True)
        y = tl.sum(acc, axis=1) * (tl.load(ws_ptr + rows) * _FP8_FMA_DOWN)
        _epilogue_store(y[None, :], tl.arange(0, 1), offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                        HAS_BIAS, HAS_RESIDUAL)


# ---- split-K reduction ----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["M"])
def splitk_reduce_kernel(part_ptr, bias_ptr, res_ptr, out_ptr, M, N, stride_rm, stride_om,
                         SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr = False,
                         SILU: tl.constexpr = False):
    """out[m, :] = sum_s part[s, m, :] (+ bias) (+ residual), in split order. Grid (cdiv(N, BLOCK_N), M, 1).

    part_ptr *fp32 [SPLIT_K, M, N] contiguous;  bias_ptr *bf16 [N];  res_ptr *bf16 [M, N] row stride stride_rm
    out_ptr  *bf16 [M, N], row stride stride_om;  M, N i32.
    SILU: the partials are a gate_up projection's, [SPLIT_K, M, 2N] with columns [gate | up], and out[m, n] =
    silu(gate) * up for n < N (activation.triton_silu fused in, no bias or residual): the sums rounded to the
    output type first and silu(gate) before the product, as the reduction then silu_mul_kernel round, so the
    result is theirs to the bit with one launch and one [M, 2N] round trip fewer.
    """
    pdl_enter(PDL)
    m = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    if SILU:
        tl.static_assert(not (HAS_BIAS or HAS_RESIDUAL))
        dt: tl.constexpr = out_ptr.dtype.element_ty
        g = tl.zeros([BLOCK_N], dtype=tl.float32)
        u = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            row = part_ptr + (s * M + m) * (2 * N)
            g += tl.load(row + offs_n, mask=nmask, other=0.0)
            u += tl.load(row + N + offs_n, mask=nmask, other=0.0)
        g = g.to(dt).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
        tl.store(out_ptr + m * stride_om + offs_n, (act * u.to(dt).to(tl.float32)).to(dt), mask=nmask)
    else:
        y = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            y += tl.load(part_ptr + (s * M + m) * N + offs_n, mask=nmask, other=0.0)
        _epilogue_store(y[None, :], m + tl.arange(0, 1), offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm,
                        stride_om, HAS_BIAS, HAS_RESIDUAL)


@triton.jit(do_not_specialize=["M"])
def splitk_reduce_norm_kernel(part_ptr, bias_ptr, res_ptr, w_ptr, out_ptr, M, N, stride_rm, stride_om, eps,
                              SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                              OFFSET: tl.constexpr, PDL: tl.constexpr = False):
    """The split-K reduction of a projection into the residual stream with the decoder's add + RMSNorm fused: y =
    sum_s part[s, m, :] (+ bias), rounded to bf16 as splitk_reduce_kernel stores it; then as
    rms_norm.triton_norm.rms_norm_kernel with a residual: residual[m, :] = y + residual[m, :] (in place, bf16),
    out[m, :] = ĥ · (OFFSET + w). The bits of the reduction then the norm, with one launch and one [M, N] round trip
    fewer. Grid (M, 1, 1): a program holds a whole row (BLOCK_N >= N, norm_config's block and warps).

    part_ptr *fp32 [SPLIT_K, M, N] contiguous;  bias_ptr *bf16 [N];  res_ptr *bf16 [M, N] row stride stride_rm;
    w_ptr *bf16 or *fp32 [N] (the norm's weight);  out_ptr *bf16 [M, N] row stride stride_om;  M, N i32; eps fp32.
    """
    pdl_enter(PDL)
    m = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    y = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        y += tl.load(part_ptr + (s * M + m) * N + offs_n, mask=nmask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
    res = res_ptr + m * stride_rm + offs_n
    h = add_residual(y, res, res, nmask)
    out = rms_norm_values(h, w_ptr, nmask, N, eps, OFFSET, BLOCK_N)
    tl.store(out_ptr + m * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit(do_not_specialize=["M", "DP"])
def sk_reduce_kernel(part_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr, M, N, K, DP, G, stride_rm, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr = False):
    """The stream-K part of gluon_gemm.nvfp4_gemm_wgmma_sk_kernel (without FIX): output tile DP + program_id(0),
    columns program_id(1) * ROWS .. + ROWS of its BLOCK_N: the sum of the raw parts the programs left in part_ptr
    [G, 2, BLOCK_N, BLOCK_M] fp32 (gluon_gemm.sk_store), in program order, times 2^8 weight_scale_2 (+ bias) (+ residual), stored as bf16.
    A tile that one program covered whole was stored by it: nothing to do. Grid (tiles - DP, BLOCK_N / ROWS, 1)."""
    pdl_enter(PDL)
    n_m = tl.cdiv(M, BLOCK_M)
    NP = K // (2 * BLOCK_K)
    T = (tl.cdiv(N, BLOCK_N) * n_m - DP) * NP
    Gs = tl.minimum(G, T)  # the kernel's stream-K programs (every range non-empty)
    u = tl.program_id(0)
    x0 = u * NP  # the tile's block pairs [x0, x0 + NP) in the stream-K range
    c_first = ((x0 + 1) * Gs + T - 1) // T - 1  # the program whose range [c T / Gs, (c + 1) T / Gs) holds pair x0
    c_last = ((x0 + NP) * Gs + T - 1) // T - 1  # ... and pair x0 + NP - 1
    offs_m = tl.arange(0, BLOCK_M)
    t = DP + u
    offs_n = (t // n_m) * BLOCK_N + tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    local = offs_m[:, None] + (tl.program_id(1) * ROWS + tl.arange(0, ROWS))[None, :] * BLOCK_M  # [n, m] parts
    shared = c_first < c_last
    y = tl.load(part_ptr + (c_first * 2 + 1) * (BLOCK_M * BLOCK_N) + local, mask=shared, other=0.0)
    for c in range(c_first + 1, c_last + 1):  # their parts start inside the tile: slot 0
        y += tl.load(part_ptr + (c * 2) * (BLOCK_M * BLOCK_N) + local)
    y *= tl.load(ws2_ptr + tl.minimum(offs_n, N - 1)) * 256.0
    _epilogue_store(y, (t % n_m) * BLOCK_M + offs_m, offs_n, tl.where(shared, M, 0), N, bias_ptr, res_ptr, out_ptr,
                    stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


# ---- configs (H200: 132 SMs, 4.2 TB/s) -----------------------------------------------------------------------

def _gemv_configs(fma_tiles, dot_tiles, tc_tiles=(), gluon_tiles=None) -> list[dict]:
    """(BLOCK_N, BLOCK_K, num_warps) tiles x SPLIT_K 1..8 for every M bucket. fma_tiles serve bucket 1 (a fourth
    entry is PIPE: the K loop's loads go through shared memory with cp.async, that many stages deep), dot_tiles
    buckets 2..16; tc_tiles (num_stages last) give split-position tensor-core configs ("TC": True) for every
    bucket. gluon_tiles: {MP: [(BLOCK_N, BLOCK_K, num_warps, SPLIT_K, PIPE[, constexprs]), ...]} for the Gluon kernel (MP 8 serves
    buckets 1..8, MP 16 bucket 16), in order of preference (gemv_candidates keeps that order)."""
    out = []
    for bm in M_BUCKETS:
        for tile in (fma_tiles if bm == 1 else dot_tiles):
            bn, bk, warps = tile[:3]
            for split in (1, 2, 4, 8):
                c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split,
                     "num_warps": warps, "num_stages": 1 if bm == 1 else 3}
                if len(tile) > 3:  # a cp.async-pipelined CUDA-core loop (PIPE stages)
                    c["PIPE"] = tile[3]
                out.append(c if not tc_tiles else {**c, "TC": False})
        for bn, bk, warps, stages in tc_tiles:
            for split in (1, 2, 4, 8):
                out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split,
                            "num_warps": warps, "num_stages": stages, "TC": True})
        for bn, bk, warps, split, pipe, *extra in (gluon_tiles or {}).get(8 if bm <= 8 else 16, []):
            # gluon_gemv.nvfp4_gemv_mma_kernel, any bucket (K % BLOCK_K == 0); PIPE 2 registers two deep, 3 cp.async;
            # a sixth entry: more constexprs of the kernel (UNROLL, PRE)
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": warps,
                        "num_stages": 1, "GLUON": True, "PIPE": pipe, **(extra[0] if extra else {})})
    return out


# Tiles for H200 (132 SMs). CUDA-core path: 56..164 registers a thread (see NOTES.md), several programs an SM;
# SPLIT_K makes enough programs for N = 4096-class layers. Tensor-core path: cp.async pipelined, 3 stages.
_DOT_TILES = [(32, 256, 4), (64, 128, 4), (64, 256, 4), (128, 128, 4), (128, 256, 8)]
_PIPE_TILES = [(32, 256, 4, 3), (64, 256, 4, 3), (32, 512, 4, 2), (64, 512, 4, 2), (128, 256, 8, 2)]
# Gluon mma.sync tiles by MP, best first (the build's check against the fp32 reference decides whether one is used):
# H200, `python -m atlas.tools.dev.nvfp4_gluon_gemv` (tools/results/nvfp4_gluon_gemv.json, four shapes x M 1 / 4 /
# 16, 26 configs): SPLIT_K 4 wins on every shape, even N = 34816; the cp.async form (PIPE 3) on the 27B down
# projection (K 17408) at M 4 / 16; then `--unroll` (below)
_U2, _PRE2, _PRE4 = {"UNROLL": 2}, {"PRE": 2}, {"PRE": 4}
_U2R, _PRE2R = {"UNROLL": 2, "MAXNREG": 72}, {"PRE": 2, "MAXNREG": 72}
_GLUON_TILES = {8: [(64, 256, 4, 4, 1, _U2R), (64, 256, 4, 4, 1, _U2), (128, 128, 4, 8, 1, _PRE4),
                    (64, 256, 4, 4, 1, _PRE2R), (64, 256, 4, 16, 1, {"MAXNREG": 72}), (64, 256, 4, 4, 1, _PRE2),
                    (64, 256, 4, 16, 1), (128, 256, 4, 8, 1), (64, 256, 4, 8, 1, _PRE2), (64, 256, 4, 4, 1),
                    (64, 256, 4, 4, 1, _PRE4), (64, 256, 4, 8, 1, _U2), (64, 128, 4, 4, 3), (64, 256, 4, 4, 2),
                    (128, 256, 4, 4, 1), (256, 256, 8, 4, 1), (64, 256, 4, 16, 1, _PRE4), (64, 256, 4, 1, 1),
                    (64, 128, 4, 8, 3)],
                16: [(128, 128, 4, 8, 1, _PRE4), (256, 128, 4, 8, 1), (128, 128, 4, 16, 1, _PRE4),
                     (128, 128, 4, 4, 1), (128, 128, 4, 8, 1, _U2), (128, 128, 4, 16, 1), (64, 128, 4, 4, 3),
                     (64, 64, 4, 4, 1), (256, 128, 8, 4, 1), (128, 128, 4, 4, 2), (128, 128, 4, 8, 1),
                     (64, 128, 4, 8, 3)]}
"""In order of preference (gemv_candidates gives the plain Gluon way its first four that fit), from the H200 sweeps.
MAXNREG 72: a register cap (the BITS decode takes 84 registers at BLOCK_N 64 x BLOCK_K 256, 5 programs an SM; 72
fits 7 without spilling): 27B gate_up M 1 36.3 -> 32.5 us with BITS (tools/results/nvfp4_bits_regcap.json). Earlier
(tools/results/nvfp4_gluon_unroll.json, nvfp4_gluon_pre.json): UNROLL 2 at M 1 (27B gate_up 36.4 against 37.4 us),
PRE 2 (the first two weight blocks loaded before the PDL wait) at M 1 (27B gate_up 36.2, 8B qkv 7.8 against 9.0), and
for M 4..16 128 x 128 blocks with PRE 4 in the tiled order (layout.py; its block is one 8 KB tile): 27B gate_up M 8
43.3 against 49.6, M 16 51.2 against 61.1, 8B qkv M 8 8.6 against 12.0 (row-major, those tiles are far slower:
97.5 at 27B gate_up M 16). SPLIT_K 16 for layers with few row tiles and long rows (27B down: 80 tiles of 64 rows,
K 17408)."""
CONFIGS_nvfp4_gemv = _gemv_configs([(32, 256, 4), (64, 256, 4), (32, 512, 4), (64, 512, 4), (128, 256, 8),
                                    (128, 512, 8)] + _PIPE_TILES, _DOT_TILES, gluon_tiles=_GLUON_TILES)
"""Candidates for nvfp4_gemv_kernel; the build keeps those whose BLOCK_M is the bucket and times them."""
# fp8: the split-position tensor-core path serves every bucket (fastest at M >= 2 on the H200, and at M = 1 on some
# shapes, see NOTES.md section 4); bucket 1 also keeps the CUDA-core tiles.
CONFIGS_fp8_gemv = _gemv_configs([(32, 256, 4), (64, 256, 4), (64, 128, 4), (128, 128, 4), (128, 256, 8),
                                   (32, 256, 4, 3), (64, 256, 4, 3), (64, 128, 4, 3), (128, 256, 8, 2)], [],
                                 [(64, 128, 4, 3), (128, 128, 4, 3), (256, 128, 8, 3), (256, 64, 4, 4)])
"""Candidates for fp8_gemv_kernel (BLOCK_K 512 on the CUDA-core path costs 248 registers and an x exchange)."""
CONFIGS_fp8_gemv += [{**c, "PRE": pre} for pre in (1, 2) for c in list(CONFIGS_fp8_gemv)
                     if c["SPLIT_K"] > 1 and c["BLOCK_N"] <= 128 and c.get("PIPE", 1) == 1]
"""PRE 1 / 2: the split's first weight blocks loaded before the PDL wait (gemv_candidates gives them a way of their
own). H100, tools/results/fp8_pre_h100.json (PDL chain, the gemm.json config with and without, PRE 2): 8B qkv M 1
12.2 -> 11.4 us (0.69 -> 0.74 of the copy bandwidth), M 2 13.0 -> 11.7, 8B down M 2 26.9 -> 25.5, 8B lm_head M 1
212 -> 180; slower on the 27B down at M >= 2 (37.7 -> 44.3) and on the gate_up shapes at M >= 2, so a candidate,
not a default."""
CONFIGS_splitk_reduce = [{"BLOCK_N": bn, "num_warps": w, "num_stages": 1} for bn, w in ((512, 4), (1024, 4), (2048, 8))]


def gemv_bucket(m: int) -> int:
    """The smallest M bucket that holds m rows (1, 2, 4, 8, 16)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    raise ValueError(f"GEMV handles M <= {M_BUCKETS[-1]} rows, got M = {m}; use the GEMM kernels for more.")


# ---- AOT signatures -------------------------------------------------------------------------------------------

class AotSignature(NamedTuple):
    """One kernel instance for ahead-of-time compilation: what triton.compile(ASTSource(fn, signature, constexprs,
    attrs), target, options) needs, in the terms of atlas.build_engine.kernels.KernelSpec (see kernel_spec).

    The compiled cubin takes the `params` in order, then Triton 3.6's two scratch pointers."""

    fn: object
    """The @triton.jit function."""
    signature: dict[str, str]
    """Every parameter name, in order -> '*bf16' / '*u8' / '*fp8e4nv' / '*fp32' / 'i32', or 'constexpr'."""
    constexprs: dict[str, int | bool]
    """Constexpr name -> value (from the config and the fused-epilogue flags)."""
    divisible_by_16: tuple[str, ...]
    """Every pointer (16-byte aligned) and every fixed int that is a multiple of 16, as the JIT specialises them;
    without these the weight loads are not vectorised. The runtime checks them at each launch."""
    num_warps: int
    num_stages: int
    grid_formula: tuple[str, str, str]
    """Grid per dimension over the int parameters and constexprs (atlas.runtime.kernels formula syntax)."""
    maxnreg: int | None = None
    """The config's register cap ("MAXNREG"), or None."""

    @property
    def params(self) -> list[tuple[str, str]]:
        """(name, type) of the run-time parameters, in launch order."""
        return [(n, t) for n, t in self.signature.items() if t != "constexpr"]

    @property
    def attrs(self) -> dict[tuple[int, ...], list[list]]:
        """ASTSource attrs: (arg index,) -> [['tt.divisibility', 16]]."""
        index = {n: i for i, n in enumerate(self.signature)}
        return {(index[n],): [["tt.divisibility", 16]] for n in self.divisible_by_16}

    def kernel_spec(self, name: str, grid: tuple[int, ...]):
        """The build stage's KernelSpec for this instance (compile_kernel, write_kernels, autotune take it)."""
        from atlas.build_engine.kernels import KernelSpec

        return KernelSpec(fn=self.fn, name=name, signature=dict(self.signature), constexprs=dict(self.constexprs),
                          num_warps=self.num_warps, num_stages=self.num_stages, grid=tuple(grid),
                          grid_formula=self.grid_formula, divisible_by_16=self.divisible_by_16,
                          maxnreg=self.maxnreg)


def spelled_signature(fn, types: dict[str, str], constexprs: dict) -> tuple[list[str], dict[str, str], dict]:
    """(parameter names, name -> Triton type or 'constexpr', every constexpr's value) of kernel fn: a constexpr
    with a default that `constexprs` leaves out gets the default (AOT spells every constexpr out); a parameter
    neither typed nor a constexpr is an error."""
    names = list(fn.arg_names)
    # the Python function's defaults (every defaulted parameter of these kernels is a constexpr); .fn under
    # Triton's JIT and its interpreter alike
    defaults = {n: p.default for n, p in inspect.signature(getattr(fn, "fn", fn)).parameters.items()
                if p.default is not inspect.Parameter.empty and n not in types and n not in constexprs}
    constexprs = {**constexprs, **defaults}
    missing = [n for n in names if n not in constexprs and n not in types]
    if missing:
        raise ValueError(f"{fn.__name__}: no type for parameter(s) {missing}")
    return names, {n: ("constexpr" if n in constexprs else types[n]) for n in names}, constexprs


def aot_signature(fn, types: dict[str, str], ints: dict[str, int], constexprs: dict, config: dict,
                  grid_formula: tuple[str, str, str]) -> AotSignature:
    """Assemble an AotSignature: types lists the run-time parameters, ints the values fixed at build. A constexpr
    with a default that `constexprs` leaves out gets the default (AOT spells every constexpr out), so that a new
    switch such as TILED enters a config's constexprs only where the config sets it."""
    names, sig, constexprs = spelled_signature(fn, types, constexprs)
    div = tuple(n for n in names if sig[n].startswith("*") or (n in ints and ints[n] % 16 == 0))
    return AotSignature(fn, sig, dict(constexprs), div, config["num_warps"], config["num_stages"], grid_formula,
                        config.get("MAXNREG"))


def ast_source(fn):
    """triton.compiler.ASTSource, or Gluon's for a @gluon.jit function."""
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource
    from triton.compiler import ASTSource
    return ASTSource


def compile_aot(spec: AotSignature, arch: int = 90):
    """Compile one kernel instance for CUDA compute capability `arch` (no GPU needed): a triton CompiledKernel
    whose .asm holds 'ttgir', 'ptx' and 'cubin' and whose .metadata has name, shared (dynamic shared memory
    bytes), num_warps and the scratch sizes. (The build stage uses atlas.build_engine.kernels.compile_kernel on
    spec.kernel_spec(...), which does the same and checks the result against the runtime launcher.)"""
    from triton.backends.compiler import GPUTarget

    src = ast_source(spec.fn)(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs, attrs=spec.attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg:
        options["maxnreg"] = spec.maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _gemv_constexprs(config: dict, has_bias: bool, has_residual: bool, pdl: bool = False) -> dict:
    cx = {"PDL": pdl, "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
          "SPLIT_K": config["SPLIT_K"], "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual}
    if "TC" in config:  # fp8_gemv_kernel's path switch
        cx["TC"] = config["TC"]
    cx["PIPE"] = config.get("PIPE", 1)
    if config.get("TILED"):  # the nvfp4 GEMVs' tiled weight order (layout.py), Triton and Gluon kernels alike
        cx["TILED"] = True
    if config.get("XSMEM"):  # the Gluon GEMV's x through shared memory (gluon_gemv._x_shared)
        cx["XSMEM"] = config["XSMEM"]
    if config.get("UNROLL", 1) > 1:  # the Gluon GEMV's two-blocks-a-step loop
        cx["UNROLL"] = config["UNROLL"]
    if config.get("PRE"):  # the Gluon GEMV's weight blocks loaded before the PDL wait
        cx["PRE"] = config["PRE"]
    if config.get("BITS"):  # the Gluon GEMV's words in layout.NVFP4_BITS order
        cx["BITS"] = True
    if config.get("STAGE"):  # the Gluon GEMV's weight blocks copied into shared memory before the PDL wait
        cx["STAGE"] = config["STAGE"]
    if config.get("WAIT_LATE"):  # a timing probe of the Gluon GEMV (the PDL wait moved to the store), never built
        cx["WAIT_LATE"] = True
    if config.get("XCLAMP"):  # the Gluon GEMV's x rows past M clamped instead of masked
        cx["XCLAMP"] = True
    if config.get("WK"):  # gluon_gemv.nvfp4_gemv_wk_kernel: the K range over WK groups of a program's warps
        cx["WK"] = config["WK"]
    if config.get("LA"):  # the WK GEMV's loop loading a block ahead
        cx["LA"] = config["LA"]
    return cx


GEMV_GRID = ("cdiv(N, BLOCK_N)", "SPLIT_K", "1")


def signature_nvfp4_gemv(config: dict, N: int, K: int, has_bias: bool = False,
                         has_residual: bool = False, pdl: bool = False, silu: bool = False) -> AotSignature:
    """nvfp4_gemv_kernel for a contiguous [N, K] weight; M stays a run-time argument (1 <= M <= BLOCK_M).

    out_ptr is '*bf16' with SPLIT_K == 1, else '*fp32' (the partials; follow with splitk_reduce_kernel).
    pdl: compiled for programmatic dependent launch (the runtime launches it with the attribute).
    A "TILED" config reads the weight in layout.tile_nvfp4's order (check_tiled says which shapes can).
    silu (a WK config, fuses_silu_gemv): a [gate | up] projection whose kernel writes silu(gate) * up, [M, N / 2]."""
    check_tiled(config, N, K)
    if silu and not fuses_silu_gemv(config, N):
        raise ValueError(f"nvfp4 GEMV config {config}: only the WK GEMV of one split fuses SiLU-mul (N = {N}).")
    out = "*bf16" if config["SPLIT_K"] == 1 else "*fp32"
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": out, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_sn": "i32", "stride_rm": "i32", "stride_om": "i32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K // 2, "stride_sn": K // 16, "stride_rm": N,
            "stride_om": N // 2 if silu else N}
    cx = _gemv_constexprs(config, has_bias, has_residual, pdl)
    if silu:
        cx["SILU"] = True
    if config.get("GLUON") and not config.get("WK"):  # the Gluon kernel's experiment switches (AOT wants every
        cx = {"TILED": False, "XSMEM": 0, "UNROLL": 1, "PRE": 0, "STAGE": 0, **cx}  # constexpr spelt out)
    return aot_signature(_nvfp4_gemv_fn(config), types, ints, cx, config, GEMV_GRID)


def fuses_silu_gemv(config: dict, N: int) -> bool:
    """Whether this GEMV config's kernel itself can end a [gate | up] projection of N rows in SiLU-mul (SILU of
    gluon_gemv.nvfp4_gemv_wk_kernel: one split, each program's BLOCK_N / 2 gate rows and their up rows)."""
    return bool(config.get("WK")) and config["SPLIT_K"] == 1 and N % config["BLOCK_N"] == 0 and N % 2 == 0


def fuses_norm_gemv(config: dict, N: int) -> bool:
    """Whether this GEMV config has a form that itself ends a residual projection of N rows in the decoder's add +
    RMSNorm (gluon_gemv.nvfp4_gemv_wk_norm_kernel: the WK GEMV of one split)."""
    return bool(config.get("WK")) and config["SPLIT_K"] == 1 and N % config["BLOCK_N"] == 0


def signature_nvfp4_gemv_wk_norm(config: dict, N: int, K: int, offset: int, pdl: bool = False,
                                 weight_type: str = "*bf16") -> AotSignature:
    """gluon_gemv.nvfp4_gemv_wk_norm_kernel for a WK config on a contiguous [N, K] weight (offset 0: x̂·w,
    1: x̂·(1 + w); weight_type: the norm weight's pointer type); grid (N / BLOCK_N, 1, 1)."""
    from atlas.plugins_trt.quant_linear import gluon_gemv

    check_tiled(config, N, K)
    if not fuses_norm_gemv(config, N):
        raise ValueError(f"nvfp4 GEMV config {config}: only the WK GEMV of one split fuses the add + RMSNorm "
                         f"(N = {N}).")
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "res_ptr": "*bf16",
             "nw_ptr": weight_type, "cnt_ptr": "*i32", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
             "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32", "stride_rm": "i32", "stride_om": "i32",
             "eps": "fp32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K // 2, "stride_sn": K // 16, "stride_rm": N, "stride_om": N}
    return aot_signature(gluon_gemv.nvfp4_gemv_wk_norm_kernel, types, ints,
                         _wk_norm_constexprs(config, offset, pdl, N), config, ("cdiv(N, BLOCK_N)", "1", "1"))


def _wk_norm_constexprs(config: dict, offset: float, pdl: bool, N: int) -> dict:
    """nvfp4_gemv_wk_norm_kernel's constexprs for a WK config and N rows (AOT and JIT alike)."""
    return {"PDL": pdl, "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "TILED": bool(config.get("TILED")), "PRE": config.get("PRE", 0), "BITS": bool(config.get("BITS")),
            "WK": config["WK"], "OFFSET": int(offset), "NP": triton.next_power_of_2(N), "LA": config.get("LA", 0)}


def _check_norm(residual: torch.Tensor, weight: torch.Tensor, offset: float, M: int, N: int) -> None:
    """A fused add + RMSNorm's operands: residual bf16 [M, N] with contiguous rows, weight [N], offset 0 or 1."""
    if offset not in (0.0, 1.0):
        raise ValueError(f"offset must be 0 or 1, got {offset}")
    if (residual.dtype != torch.bfloat16 or tuple(residual.shape) != (M, N) or residual.stride(1) != 1
            or tuple(weight.shape) != (N,)):
        raise ValueError(f"residual must be bf16 [{M}, {N}] with contiguous rows and weight [{N}], got "
                         f"{residual.dtype} {list(residual.shape)} and {list(weight.shape)}.")


def _gemv_out(out: torch.Tensor | None, M: int, N: int, device) -> torch.Tensor:
    """The GEMV's bf16 [M, N] output: the caller's (checked) or a new one."""
    if out is None:
        return torch.empty(M, N, dtype=torch.bfloat16, device=device)
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (M, N) or out.stride(1) != 1:
        raise ValueError(f"out must be bf16 [{M}, {N}] with contiguous rows, got {out.dtype} {list(out.shape)}.")
    return out


_NORM_COUNTERS: dict = {}
"""The fused-norm WK GEMV's counter for JIT launches (tuning, benchmarks, tests), by device: zero between launches."""


def _wk_norm(x: torch.Tensor, tensors: tuple, strides: tuple, N: int, K: int, config: dict, norm: tuple,
             out: torch.Tensor | None, pdl: bool) -> torch.Tensor:
    """nvfp4_gemv_wk_norm_kernel: x @ W.T into the residual stream, then its RMSNorm, one launch (_run_gemv's norm)."""
    from atlas.plugins_trt.quant_linear import gluon_gemv

    residual, weight, eps, offset = norm
    M = x.shape[0]
    _check_norm(residual, weight, offset, M, N)
    out = _gemv_out(out, M, N, x.device)
    if x.device not in _NORM_COUNTERS:
        _NORM_COUNTERS[x.device] = torch.zeros(1, dtype=torch.int32, device=x.device)
    cx = _wk_norm_constexprs(config, offset, pdl, N)
    if pdl:
        cx["launch_pdl"] = True
    gluon_gemv.nvfp4_gemv_wk_norm_kernel[(N // config["BLOCK_N"], 1, 1)](
        x, *tensors, residual, weight, _NORM_COUNTERS[x.device], out, M, N, K, x.stride(0), *strides,
        residual.stride(0), out.stride(0), float(eps), **cx, num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    return out


def _nvfp4_gemv_fn(config: dict):
    """nvfp4_gemv_kernel, or with "GLUON" its Gluon drop-in (gluon_gemv.nvfp4_gemv_mma_kernel, K % BLOCK_K == 0;
    with "WK" too, gluon_gemv.nvfp4_gemv_wk_kernel)."""
    if not config.get("GLUON"):
        return nvfp4_gemv_kernel
    from atlas.plugins_trt.quant_linear import gluon_gemv
    return gluon_gemv.nvfp4_gemv_wk_kernel if config.get("WK") else gluon_gemv.nvfp4_gemv_mma_kernel


def _fp8_path(config: dict) -> dict:
    """config with its "TC" switch; without one, the CUDA-core path for BLOCK_M 1 and tensor cores above."""
    if config.get("TILED"):
        raise ValueError(f"fp8 GEMV config {config}: TILED is an nvfp4 weight order (layout.py), fp8 has none.")
    config = config if "TC" in config else {**config, "TC": config["BLOCK_M"] > 1}
    if not config["TC"] and config["BLOCK_M"] != 1:
        raise ValueError(f"fp8 GEMV config {config}: the CUDA-core path (TC False) serves BLOCK_M 1 only.")
    if config["TC"] and config["BLOCK_K"] % 64:
        raise ValueError(f"fp8 GEMV config {config}: the tensor-core path needs BLOCK_K a multiple of 64.")
    return config


def signature_fp8_gemv(config: dict, N: int, K: int, has_bias: bool = False,
                       has_residual: bool = False, pdl: bool = False) -> AotSignature:
    """fp8_gemv_kernel for a contiguous [N, K] weight (out_ptr typed as for signature_nvfp4_gemv)."""
    config = _fp8_path(config)
    out = "*bf16" if config["SPLIT_K"] == 1 else "*fp32"
    types = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "bias_ptr": "*bf16", "res_ptr": "*bf16",
             "out_ptr": out, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
             "stride_rm": "i32", "stride_om": "i32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K, "stride_rm": N, "stride_om": N}
    return aot_signature(fp8_gemv_kernel, types, ints, _gemv_constexprs(config, has_bias, has_residual, pdl),
                         config, GEMV_GRID)


def signature_splitk_reduce(config: dict, split_k: int, N: int, has_bias: bool = False,
                            has_residual: bool = False, pdl: bool = False, silu: bool = False) -> AotSignature:
    """splitk_reduce_kernel summing `split_k` partials of width N (silu: of width 2N, [gate | up] into silu(gate)
    * up of width N)."""
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16",
             "M": "i32", "N": "i32", "stride_rm": "i32", "stride_om": "i32"}
    cx = {"SPLIT_K": split_k, "BLOCK_N": config["BLOCK_N"], "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual}
    cx["PDL"] = pdl
    if silu:
        cx["SILU"] = True
    return aot_signature(splitk_reduce_kernel, types, {"N": N, "stride_rm": N, "stride_om": N}, cx, config,
                         ("cdiv(N, BLOCK_N)", "M", "1"))


def reduce_norm_config(N: int) -> dict:
    """splitk_reduce_norm_kernel's block and warps for rows of N: rms_norm_kernel's (the same sum, the same bits)."""
    block, warps = norm_config(N)
    return {"BLOCK_N": block, "num_warps": warps, "num_stages": 1}


def signature_splitk_reduce_norm(split_k: int, N: int, offset: int, has_bias: bool = False, pdl: bool = False,
                                 weight_type: str = "*bf16") -> AotSignature:
    """splitk_reduce_norm_kernel summing `split_k` partials of width N into the residual stream, then its RMSNorm
    (offset 0: x̂·w, 1: x̂·(1 + w)); weight_type: the norm weight's pointer type."""
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": weight_type, "out_ptr": "*bf16",
             "M": "i32", "N": "i32", "stride_rm": "i32", "stride_om": "i32", "eps": "fp32"}
    config = reduce_norm_config(N)
    cx = {"SPLIT_K": split_k, "BLOCK_N": config["BLOCK_N"], "HAS_BIAS": has_bias, "OFFSET": int(offset), "PDL": pdl}
    return aot_signature(splitk_reduce_norm_kernel, types, {"N": N, "stride_rm": N, "stride_om": N}, cx, config,
                         ("M", "1", "1"))


def grid_gemv(config: dict, N: int) -> tuple[int, int, int]:
    """Launch grid of nvfp4_gemv_kernel / fp8_gemv_kernel."""
    return (triton.cdiv(N, config["BLOCK_N"]), config["SPLIT_K"], 1)


def grid_splitk_reduce(config: dict, M: int, N: int) -> tuple[int, int, int]:
    return (triton.cdiv(N, config["BLOCK_N"]), M, 1)


def check_tiled(config: dict, N: int, K: int, weight: torch.Tensor | None = None,
                weight_scale: torch.Tensor | None = None) -> None:
    """A "TILED" config (any nvfp4 kernel here): raise ValueError unless the weight makes whole 128 x 128 tiles, the
    K blocks hold whole tiles and the tensors (when given) are contiguous, as tile_nvfp4 leaves them (a row slice
    of one at a multiple of 128 rows is too). No-op for other configs."""
    if not config.get("TILED"):
        return
    if not can_tile(N, K) or config["BLOCK_K"] % TILE_K:
        raise ValueError(f"TILED config {config}: needs N % 128 == 0, K % 128 == 0 and BLOCK_K % 128 == 0, got "
                         f"N = {N}, K = {K}, BLOCK_K = {config['BLOCK_K']}; use a row-major config for this weight.")
    if any(t is not None and not t.is_contiguous() for t in (weight, weight_scale)):
        raise ValueError("TILED: weight and weight_scale must be contiguous (layout.tile_nvfp4's tensors).")


# ---- JIT launchers (tests, autotuning) ------------------------------------------------------------------------

def _check_gemv_inputs(x: torch.Tensor, N: int, K: int, config: dict, bias, residual):
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != K or x.stride(1) != 1:
        raise ValueError(f"x must be bf16 [M, {K}] with contiguous rows, got {x.dtype} {list(x.shape)}.")
    if K % 16:
        raise ValueError(f"K = {K} is not a multiple of 16; keep this weight in bfloat16.")
    M = x.shape[0]
    if not 1 <= M <= config["BLOCK_M"]:
        raise ValueError(f"M = {M} rows do not fit config BLOCK_M = {config['BLOCK_M']}; pick gemv_bucket(M).")
    if bias is not None and (bias.dtype != torch.bfloat16 or tuple(bias.shape) != (N,)):
        raise ValueError(f"bias must be bf16 [{N}], got {bias.dtype} {list(bias.shape)}.")
    if residual is not None and (residual.dtype != torch.bfloat16 or tuple(residual.shape) != (M, N)
                                 or residual.stride(1) != 1):
        raise ValueError(f"residual must be bf16 [{M}, {N}] with contiguous rows, got {list(residual.shape)}.")
    return M


def _run_gemv(kernel, x, tensors, strides, N, K, config, bias, residual, out, workspace, pdl=False, silu=False,
              norm=None, reduce=True):
    """Launch a GEMV (and the split-K reduction when SPLIT_K > 1); returns bf16 [M, N]. pdl: both launched
    with programmatic dependent launch. silu: W is a [gate | up] projection and the result is silu(gate) * up
    [M, N / 2], as the runtime computes it (CudaLinear.fuses_silu, CudaOps.gate_up_silu): in the split-K reduction
    where the config splits, in the WK GEMV itself (fuses_silu_gemv), else the GEMV then silu_mul. norm (residual,
    weight, eps, offset): the projection writes into the residual stream and the result is the decoder's add +
    RMSNorm of it (residual updated in place), as the runtime computes it (CudaLinear.fuses_norm): in the split-K
    reduction where the config splits, after the WK GEMV in its launch (fuses_norm_gemv), else the GEMV then the norm
    kernel. reduce=False: the split-K partials are left in workspace (the caller reduces)."""
    M = x.shape[0]
    split = config["SPLIT_K"]
    if silu:
        _check_silu(N, bias, residual)
    fused = silu and fuses_silu_gemv(config, N)  # SiLU-mul in the GEMV itself (the WK one)
    if silu and split == 1 and not fused:
        return _gemv_silu(_run_gemv(kernel, x, tensors, strides, N, K, config, None, None, None, workspace, pdl),
                          out, pdl)
    if norm is not None:
        if residual is not None:
            raise ValueError("norm: the residual is norm's own (residual, weight, eps, offset)")
        if bias is None and fuses_norm_gemv(config, N):  # the WK GEMV with the norm after it, one launch
            return _wk_norm(x, tensors, strides, N, K, config, norm, out, pdl)
        if split == 1:
            return _gemv_norm(_run_gemv(kernel, x, tensors, strides, N, K, config, bias, None, None, workspace, pdl),
                              norm, out, pdl)
        workspace = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if workspace is None else workspace
        _run_gemv(kernel, x, tensors, strides, N, K, config, None, None, None, workspace, pdl, reduce=False)
        return launch_splitk_reduce_norm(workspace, *norm, out=out, bias=bias, pdl=pdl)
    width = N // 2 if silu else N
    out = _gemv_out(out, M, width, x.device)
    if split > 1 and workspace is None:
        workspace = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    if split > 1 and (workspace.dtype != torch.float32 or tuple(workspace.shape) != (split, M, N)
                      or not workspace.is_contiguous()):
        raise ValueError(f"split-K workspace must be contiguous f32 [{split}, {M}, {N}].")
    cx = _gemv_constexprs(config, bias is not None and split == 1, residual is not None and split == 1, pdl)
    if fused:
        cx["SILU"] = True
    if pdl:
        cx["launch_pdl"] = True
    target = out if split == 1 else workspace
    res = residual if residual is not None else out  # a valid pointer, never read when the flag is off
    if config.get("MAXNREG"):  # a register cap for the compiler (more programs an SM)
        cx["maxnreg"] = config["MAXNREG"]
    kernel[grid_gemv(config, N)](
        x, *tensors, bias if bias is not None else out, res, target, M, N, K, x.stride(0), *strides,
        res.stride(0), target.stride(-2), **cx, num_warps=config["num_warps"], num_stages=config["num_stages"])
    if split > 1 and reduce:
        launch_splitk_reduce(workspace, out, CONFIGS_splitk_reduce[0], bias, residual, pdl=pdl, silu=silu)
    return out


def _check_silu(N: int, bias, residual) -> None:
    if N % 2 or bias is not None or residual is not None:
        raise ValueError(f"silu: a [gate | up] projection of even width without bias or residual, got width {N}")


def _gemv_norm(y: torch.Tensor, norm: tuple, out: torch.Tensor | None, pdl: bool) -> torch.Tensor:
    """The decoder's add + RMSNorm of a projection's output y (a GEMV whose reduction did not fuse it)."""
    residual, weight, eps, offset = norm
    return launch_rms_norm(y, weight, eps, offset, residual=residual, out=out, pdl=pdl)


def _gemv_silu(y: torch.Tensor, out: torch.Tensor | None, pdl: bool) -> torch.Tensor:
    """silu(gate) * up of a [gate | up] GEMV output y [M, 2I] (a GEMV whose reduction did not fuse it)."""
    return launch_silu_mul(y, out=out, pdl=pdl)


_STREAMK_COUNTERS: dict = {}
"""The stream-K GEMV's tile counters for JIT launches (tuning, benchmarks, tests), by (device, row tiles)."""


def launch_nvfp4_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                      residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                      workspace: torch.Tensor | None = None, pdl: bool = False, silu: bool = False,
                      norm: tuple | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N]. x bf16 [M, K] (M <= BLOCK_M); W in nvfp4 storage.

    out: bf16 [M, N] to write (allocated when None); workspace: f32 [SPLIT_K, M, N] for SPLIT_K > 1;
    pdl: programmatic dependent launch (sm_90; the module docstring). A "TILED" config takes weight and weight_scale
    in layout.tile_nvfp4's order. A "STREAMK" config runs gluon_streamk's kernel (no workspace: its partials are
    allocated here, its counters kept per device and size, zero between launches). silu, norm: as _run_gemv's
    (stream-K reduces inside its kernel, so silu_mul or the norm follows it)."""
    N, K = weight.shape[0], weight.shape[1] * 2
    if config.get("STREAMK"):
        from atlas.plugins_trt.quant_linear import gluon_streamk as sk
        key = (x.device, N // config["BLOCK_N"])
        if key not in _STREAMK_COUNTERS:
            _STREAMK_COUNTERS[key] = torch.zeros(key[1], dtype=torch.int32, device=x.device)
        if silu:
            _check_silu(N, bias, residual)
            y = sk.launch_nvfp4_gemv_streamk(x, weight, weight_scale, weight_scale_2, config, _STREAMK_COUNTERS[key],
                                             pdl=pdl)
            return _gemv_silu(y, out, pdl)
        if norm is not None:
            y = sk.launch_nvfp4_gemv_streamk(x, weight, weight_scale, weight_scale_2, config, _STREAMK_COUNTERS[key],
                                             bias, pdl=pdl)
            return _gemv_norm(y, norm, out, pdl)
        return sk.launch_nvfp4_gemv_streamk(x, weight, weight_scale, weight_scale_2, config, _STREAMK_COUNTERS[key],
                                            bias, residual, out, pdl=pdl)
    _check_gemv_inputs(x, N, K, config, bias, residual)
    if weight.stride(1) != 1 or weight_scale.stride(1) != 1:
        raise ValueError("nvfp4 weight and weight_scale rows must be contiguous.")
    if (weight.dtype != torch.uint8 or weight_scale.dtype != torch.float8_e4m3fn
            or tuple(weight_scale.shape) != (N, K // 16) or weight_scale_2.dtype != torch.float32
            or tuple(weight_scale_2.shape) != (N,)):
        raise ValueError("nvfp4 weight must be u8 [N, K/2] with e4m3 weight_scale [N, K/16] and f32 "
                         "weight_scale_2 [N].")
    if config.get("GLUON") and K % config["BLOCK_K"]:
        raise ValueError(f"the Gluon GEMV needs K % BLOCK_K == 0, got K = {K}, BLOCK_K = {config['BLOCK_K']}")
    check_tiled(config, N, K, weight, weight_scale)
    return _run_gemv(_nvfp4_gemv_fn(config), x, (weight, weight_scale, weight_scale_2),
                     (weight.stride(0), weight_scale.stride(0)), N, K, config, bias, residual, out, workspace, pdl,
                     silu, norm)


def launch_fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, config: dict,
                    bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                    pdl: bool = False, silu: bool = False, norm: tuple | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N]. x bf16 [M, K]; W e4m3 [N, K] with f32 weight_scale [N].

    out / workspace / silu / norm as for launch_nvfp4_gemv."""
    N, K = weight.shape
    _check_gemv_inputs(x, N, K, config, bias, residual)
    if weight.stride(1) != 1:
        raise ValueError("fp8 weight rows must be contiguous.")
    if (weight.dtype != torch.float8_e4m3fn or weight_scale.dtype != torch.float32
            or tuple(weight_scale.shape) != (N,)):
        raise ValueError("fp8 weight must be e4m3 [N, K] with f32 weight_scale [N].")
    return _run_gemv(fp8_gemv_kernel, x, (weight, weight_scale), (weight.stride(0),), N, K, _fp8_path(config), bias,
                     residual, out, workspace, pdl, silu, norm)


def launch_splitk_reduce_norm(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                              offset: float = 0.0, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                              pdl: bool = False) -> torch.Tensor:
    """out bf16 [M, N] = rms_norm(residual + (partials.sum(0) (+ bias)) rounded to bf16); residual bf16 [M, N] is
    updated in place (splitk_reduce_norm_kernel); partials fp32 [SPLIT_K, M, N] contiguous; weight [N]."""
    split, M, N = partials.shape
    _check_norm(residual, weight, offset, M, N)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=partials.device) if out is None else out
    config = reduce_norm_config(N)
    cx = {"PDL": True, "launch_pdl": True} if pdl else {}
    splitk_reduce_norm_kernel[(M, 1, 1)](
        partials, bias if bias is not None else out, residual, weight, out, M, N, residual.stride(0), out.stride(0),
        float(eps), SPLIT_K=split, BLOCK_N=config["BLOCK_N"], HAS_BIAS=bias is not None, OFFSET=int(offset),
        num_warps=config["num_warps"], num_stages=config["num_stages"], **cx)
    return out


def launch_splitk_reduce(partials: torch.Tensor, out: torch.Tensor, config: dict,
                         bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                         pdl: bool = False, silu: bool = False) -> torch.Tensor:
    """out bf16 [M, N] = partials.sum(0) (+ bias) (+ residual); partials fp32 [SPLIT_K, M, N] contiguous.
    silu: partials [SPLIT_K, M, 2N] of a [gate | up] projection, out = silu(gate) * up (splitk_reduce_kernel)."""
    split, M, N = partials.shape
    if silu:
        if bias is not None or residual is not None or N % 2:
            raise ValueError(f"silu: [gate | up] partials of even width without bias or residual, got width {N}")
        N //= 2
    res = residual if residual is not None else out
    cx = {"PDL": True, "launch_pdl": True} if pdl else {}
    if silu:
        cx["SILU"] = True
    splitk_reduce_kernel[grid_splitk_reduce(config, M, N)](
        partials, bias if bias is not None else out, res, out, M, N, res.stride(0), out.stride(0),
        SPLIT_K=split, BLOCK_N=config["BLOCK_N"], HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
        num_warps=config["num_warps"], num_stages=config["num_stages"], **cx)
    return out

