"""NVFP4 GEMV for M = 1 in Gluon with the block scales applied once per 8 blocks instead of once per weight pair:
mma.sync against a block-diagonal x ("DIAG" configs; a drop-in for gluon_gemv.nvfp4_gemv_mma_kernel at BLOCK_M 1).

Why: the split GEMV (gluon_gemv) spends about 20 instructions on each int32 word of 8 weights at M = 1: 11 to decode
(layout.NVFP4_BITS order), 4 bf16x2 multiplies by the block scale, one mma, and 3 for the B operand (x padded to 8
columns, 7 of them zero: a masked load and two register zeroings a mma). On the H200 it is compute-bound: it runs
as fast on L2-resident weights as from DRAM (tools/results/nvfp4_fold.json, `shipped_l2`).

Here the 8 columns of the B operand of a block's mma.sync m16n8k16 instructions are the 8 blocks of a 128-k tile
column: B[k, j] = x[k] if k // 16 == j, else 0 (in the mma's permuted k order, `_x_diag`). So column j of the
product holds row n's partial sum over block j alone, unscaled, and one fp32 FMA a (row, block) applies its scale:
y[n, j] += t[n, j] * scale[n, j] (4 a thread for 16 x 128 weights, instead of 64 bf16x2 multiplies). The weights are
decoded without the scale (E2M1 * 2^-126 in bf16, code 1 a subnormal: tensor cores keep it,
tools/results/mma_subnormal.txt), x is pre-scaled by 2^64 (exact in bf16) so that the products stay normal fp32, and
the epilogue sums y's 8 columns and multiplies by weight_scale_2 * 2^62. The block-diagonal x is written into shared
memory once a block by the whole CTA (4 real-contiguous values a thread, two slots, one CTA barrier a block) and read as
the mma's B operand.

Tiled weights with words in layout.NVFP4_BITS order only (TILED, BITS; N % 128 == K % 128 == 0), BLOCK_K 128,
BLOCK_M 1. PRE 2 / 4: that many blocks' weights and scales loaded before the PDL wait. Gluon kernels cannot run in
Triton's interpreter: the GPU tests of tests/runtime/test_linear_tiled.py check it against the reference.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from atlas.plugins_trt.quant_linear.gluon_gemv import (
    _a_pack, _gdc_launch_dependents, _gdc_wait, _row_ptrs, _store_out, mma_layouts)
from atlas.plugins_trt.quant_linear.layout import NVFP4_BITS


def _plain_pair_asm(i: int) -> str:
    """int32 word in NVFP4_BITS order -> the bf16x2 of its pair i as E2M1 * 2^-126 (gluon_gemv._bits_pair_asm without
    the scale multiply)."""
    a, b = NVFP4_BITS[i]
    shift = lambda r, k: f"shl.b32 {r}, $1, {k};" if k > 0 else f"shr.u32 {r}, $1, {-k};" if k < 0 \
        else f"mov.b32 {r}, $1;"  # noqa: E731
    if a == b:
        return "{ .reg .b32 t; " + shift("t", a) + " and.b32 $0, t, 0x81C081C0; }"
    return ("{ .reg .b32 t, u; " + shift("t", a) + " " + shift("u", b) +
            " and.b32 t, t, 0x80008000; and.b32 u, u, 0x01C001C0; or.b32 $0, t, u; }")


R0, R1, R2, R3 = (gl.constexpr(_plain_pair_asm(i)) for i in range(4))
X_UP = gl.constexpr(2.0 ** 64)  # x pre-scale
OUT_UP = gl.constexpr(2.0 ** 54)  # 2^126 / 2^64 / 2^8 (gluon_gemv._store_out multiplies by 2^8 weight_scale_2)
SCALE_X = gl.constexpr("mul.rn.bf16x2 $0, $1, $2;")


@gluon.constexpr_function
def fill_layout(NW):
    """The block-diagonal x as [8 (block j), 8 (k-tile r), 2 (s1), 4 (quarter i), 2 (s0)] (mma k order l = 16 r +
    8 s1 + 2 i + s0, real k = 32 i + 4 r + 2 s1 + s0): a thread holds the 4 (s1, s0) of a (j, r, i), i.e. 4
    contiguous real k."""
    NW = getattr(NW, "value", NW)
    return gl.BlockedLayout([1, 1, 2, 1, 2], [1, 8, 1, 4, 1], [NW, 1, 1, 1, 1], [4, 2, 3, 1, 0])


@gluon.jit
def _plain(wd, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r", [wd], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _x_diag(x_ptr, kb, b_hi, real, blk):
    """Block kb's block-diagonal x (fill_layout's 5-d view of B^T [8, 128] in the mma's k order, gluon_gemv's in-block
    permutation: a k-tile mixes four NVFP4 blocks): row j keeps x[128 kb + real k] * 2^64 where real k // 16 == j
    and is zero elsewhere (all zero past the split)."""
    v = gl.load(x_ptr + kb * 128 + real, mask=blk & (kb < b_hi), other=0.0)
    up = gl.full(v.shape, X_UP, gl.bfloat16, layout=v.type.layout)
    return gl.inline_asm_elementwise(SCALE_X, "=r,r,r", [v, up], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def _diag_block(y, wd, sr, x_s, it, x_next, BN: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr,
                bL: gl.constexpr, mma: gl.constexpr):
    """One 128-k block: store the next block's diagonal x into the other slot, multiply this block's unscaled
    weights by its diagonal x (slot it % 2), add the 8 block sums times their scales into y; a CTA barrier closes
    the block (every warp is past its reads of this slot and its writes of the next)."""
    x_s.index((it + 1) % 2).reshape([8, 8, 2, 4, 2]).store(x_next)
    a = _a_pack(_plain(wd, R0), _plain(wd, R1), _plain(wd, R2), _plain(wd, R3), BN, 128, 4, pL, aL)
    b = x_s.index(it % 2).permute((1, 0)).load(bL)
    t = mma_v2(a, b, gl.zeros([BN, 8], gl.float32, layout=mma))
    y = y + t * sr.to(gl.float32)
    gl.thread_barrier()
    return y


@gluon.jit
def nvfp4_gemv_diag_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                           M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                           SPLIT_K: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                           PIPE: gl.constexpr = 1, PDL: gl.constexpr = False, TILED: gl.constexpr = False,
                           XSMEM: gl.constexpr = 0, UNROLL: gl.constexpr = 1, PRE: gl.constexpr = 0,
                           BITS: gl.constexpr = False):
    """Drop-in for gluon_gemv.nvfp4_gemv_mma_kernel at BLOCK_M 1 (same parameters, grid (cdiv(N, BLOCK_N),
    SPLIT_K, 1) and outputs: bf16 out, or fp32 partials [SPLIT_K, M, N] for splitk_reduce_kernel); TILED, BITS and
    BLOCK_K 128 required; PIPE, XSMEM and UNROLL are not used. PRE 0 / 2 / 4 as in that kernel."""
    gl.static_assert(BLOCK_M == 1)
    gl.static_assert(BLOCK_K == 128)
    gl.static_assert(TILED)
    gl.static_assert(BITS)
    NW: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = BLOCK_N
    mma, aL, bL, wL, sL, pL, xL = mma_layouts(BN, 128, 8, NW)
    fL: gl.constexpr = fill_layout(NW)
    pid, pk = gl.program_id(0), gl.program_id(1)
    nb = K // 128
    per = (nb + SPLIT_K - 1) // SPLIT_K
    b_lo = pk * per
    b_hi = gl.minimum(b_lo + per, nb)
    rows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wL)), N - 1)
    srows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, sL)), N - 1)
    w_rows, _ = _row_ptrs(w_ptr, ws_ptr, rows, srows, gl.arange(0, 16, layout=gl.SliceLayout(0, wL)),
                          gl.arange(0, 8, layout=gl.SliceLayout(0, sL)), K, stride_wn, stride_sn, 128, True)
    # scales straight into the accumulator layout: row n, block j of the tile column (layout.py: 1 KB a tile,
    # 8 bytes a tile row)
    sn = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)), N - 1)
    s_rows = ws_ptr + ((sn // 128) * (K // 128) * 1024 + (sn % 128) * 8)[:, None] \
        + gl.arange(0, 8, layout=gl.SliceLayout(0, mma))[None, :]
    # real k and block membership of each position of the 5-d fill view (dims j, r, s1, i, s0)
    fj = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, fL)))))
    fr = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, fL)))))
    f1 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, fL)))))
    fi = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, fL)))))
    f0 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, fL)))))
    j5 = fj[:, None, None, None, None]
    r5 = fr[None, :, None, None, None]
    i5 = fi[None, None, None, :, None]
    real = 32 * i5 + 4 * r5 + 2 * f1[None, None, :, None, None] + f0[None, None, None, None, :] + 0 * j5
    blk = (2 * i5 + r5 // 4 == j5) & (real >= 0)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [2, 8, 128],
                                    gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0]))
    y = gl.zeros([BN, 8], gl.float32, layout=mma)
    kc = gl.minimum(b_lo, nb - 1)  # an empty split reads block nb - 1 and multiplies it by zeros
    if PDL:
        _gdc_launch_dependents()
    if PRE > 0:  # the first PRE blocks' weights and scales before the PDL wait (nobody's output)
        gl.static_assert(PRE == 2 or PRE == 4)
        w0 = gl.load(w_rows + kc * 2048)
        s0 = gl.load(s_rows + kc * 1024)
        w1 = gl.load(w_rows + gl.minimum(b_lo + 1, nb - 1) * 2048)
        s1 = gl.load(s_rows + gl.minimum(b_lo + 1, nb - 1) * 1024)
        if PRE == 4:
            w2 = gl.load(w_rows + gl.minimum(b_lo + 2, nb - 1) * 2048)
            s2 = gl.load(s_rows + gl.minimum(b_lo + 2, nb - 1) * 1024)
            w3 = gl.load(w_rows + gl.minimum(b_lo + 3, nb - 1) * 2048)
            s3 = gl.load(s_rows + gl.minimum(b_lo + 3, nb - 1) * 1024)
    if PDL:
        _gdc_wait()
    x_s.index(0).reshape([8, 8, 2, 4, 2]).store(_x_diag(x_ptr, b_lo, b_hi, real, blk))
    gl.thread_barrier()
    b_mid = b_lo
    if PRE > 0:
        y = _diag_block(y, w0, s0, x_s, 0, _x_diag(x_ptr, b_lo + 1, b_hi, real, blk), BN, pL, aL, bL, mma)
        y = _diag_block(y, w1, s1, x_s, 1, _x_diag(x_ptr, b_lo + 2, b_hi, real, blk), BN, pL, aL, bL, mma)
        if PRE == 4:
            y = _diag_block(y, w2, s2, x_s, 2, _x_diag(x_ptr, b_lo + 3, b_hi, real, blk), BN, pL, aL, bL, mma)
            y = _diag_block(y, w3, s3, x_s, 3, _x_diag(x_ptr, b_lo + 4, b_hi, real, blk), BN, pL, aL, bL, mma)
        b_mid = gl.minimum(b_lo + PRE, b_hi)
    for kb in range(b_mid, b_hi):
        x_next = _x_diag(x_ptr, kb + 1, b_hi, real, blk)
        y = _diag_block(y, gl.load(w_rows + kb * 2048), gl.load(s_rows + kb * 1024), x_s, kb - b_lo, x_next, BN,
                        pL, aL, bL, mma)
    cm = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    ys = gl.sum(y, axis=1) * OUT_UP
    out = gl.where((cm == 0)[None, :], ys[:, None], 0.0)
    _store_out(out, pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)), cm, pk, M, N, ws2_ptr, bias_ptr,
               res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)
