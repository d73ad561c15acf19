"""Chunked prefill, stage 1, sliced form (the default): the same outputs as `triton_chunk_wy.chunk_wy_kernel` (w, u,
G and the q / k inverse norms of every chunk), with the key and value tiles taken BK columns at a time.

The held form keeps four [16, DK] key tiles live through the block solve (255 registers with spills on sm_90);
here the raw key products k_i · k_j of the 10 lower [16, 16] blocks and the squared key norms are summed over
column slices, and w, u are made slice by slice after the solve, as flash-linear-attention's kkt / solve kernel
does. On the H200 (tools/results/gdn.json, gdn_stages_32768.json) it is the fastest stage-1 form in every
prefill case: 1610 us at 2 warps against 2105 for the held form (Qwen3.5-27B, one sequence of 32768 tokens).
"""

import triton
import triton.language as tl

from atlas.plugins_trt.gated_delta_net.triton_chunk_wy import (_chunk_of, _dot, _load_rows, _solve_blocks,
                                                               _store_rows, _sub_block_gates)


@triton.jit
def _kkt_scale(s_raw, si, sj, Gi, Gj, valid_i, valid_j, DIAG: tl.constexpr):
    """_kkt from the raw key products s_raw = k_i · k_j (fp32 [BC, BC])."""
    o = tl.arange(0, s_raw.shape[0])
    m = valid_i[:, None] & valid_j[None, :]
    if DIAG:
        m = m & (o[:, None] > o[None, :])
    decay = tl.exp2(tl.minimum(Gi[:, None] - Gj[None, :], 0.0))
    return tl.where(m, s_raw * decay * si[:, None] * sj[None, :], 0.0)


@triton.jit
def _kt(x, y, DOT_PREC: tl.constexpr):
    return tl.dot(x, tl.trans(y), input_precision=DOT_PREC)


@triton.jit
def _rows_times_x(r0, r1, r2, r3, x00, x11, x22, x33, x10, x20, x21, x30, x31, x32, DOT_PREC: tl.constexpr):
    """The four row blocks of X · R for X's blocks (input dtype) and R's row blocks r0..r3 [BC, BD]."""
    y0 = _dot(x00, r0, DOT_PREC)
    y1 = _dot(x10, r0, DOT_PREC) + _dot(x11, r1, DOT_PREC)
    y2 = _dot(x20, r0, DOT_PREC) + _dot(x21, r1, DOT_PREC) + _dot(x22, r2, DOT_PREC)
    y3 = _dot(x30, r0, DOT_PREC) + _dot(x31, r1, DOT_PREC) + _dot(x32, r2, DOT_PREC) + _dot(x33, r3, DOT_PREC)
    return y0, y1, y2, y3


@triton.jit
def _x_times_rows(src, stride_src, col0, dst, stride_dst, D: tl.constexpr, BK: tl.constexpr, R0, R1, R2, R3,
                  m0, m1, m2, m3, f0, f1, f2, f3, x00, x11, x22, x33, x10, x20, x21, x30, x31, x32,
                  DOT_PREC: tl.constexpr):
    """dst rows <- X · (f ⊙ src rows), BK of the D columns at a time: the right-hand side src[rows, col0 : col0 + D]
    scaled per row by f (rounded to the input dtype, as the held form does), X by its blocks."""
    dt = src.dtype.element_ty
    for col in range(0, D, BK):
        c0 = (_load_rows(src, R0, stride_src, col0 + col, m0, BK).to(tl.float32) * f0[:, None]).to(dt)
        c1 = (_load_rows(src, R1, stride_src, col0 + col, m1, BK).to(tl.float32) * f1[:, None]).to(dt)
        c2 = (_load_rows(src, R2, stride_src, col0 + col, m2, BK).to(tl.float32) * f2[:, None]).to(dt)
        c3 = (_load_rows(src, R3, stride_src, col0 + col, m3, BK).to(tl.float32) * f3[:, None]).to(dt)
        y0, y1, y2, y3 = _rows_times_x(c0, c1, c2, c3, x00, x11, x22, x33, x10, x20, x21, x30, x31, x32, DOT_PREC)
        out = dst + col + tl.arange(0, BK)[None, :]
        _store_rows(out, R0, stride_dst, m0, y0)
        _store_rows(out, R1, stride_dst, m1, y1)
        _store_rows(out, R2, stride_dst, m2, y2)
        _store_rows(out, R3, stride_dst, m3, y3)


@triton.jit
def chunk_wy_sliced_kernel(
    q, stride_q, k, stride_k, v, stride_v, a, b, stride_ab, A_log, dt_bias, cu_seqlens, chunks,
    w, u, G, RQ, RK,      # outputs, as for chunk_wy_kernel
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,  # chunk (64) and sub-block (16): BT == 4 * BC
    BK: tl.constexpr,                    # width of the key / value column slices (divides DK and DV)
    DOT_PREC: tl.constexpr,
    INV: tl.constexpr = False,           # diagonal blocks of X by inv_unit_lower (untimed)
):
    """Stage 1 (same outputs as chunk_wy_kernel) with the key and value tiles taken BK columns at a time: the
    products k_i · k_j and the key norms are summed over the slices, and w, u are made slice by slice, so no
    [BC, DK] tile is held through the solve (fla's kkt / solve kernel keeps the same few registers). Grid (NT, HV)."""
    tl.static_assert(BT == 4 * BC, "the block solve is written for four sub-blocks")
    tl.static_assert(DK % BK == 0 and DV % BK == 0)
    h = tl.program_id(1)
    r0, L, kh, neg_A, dtb = _chunk_of(chunks, cu_seqlens, A_log, dt_bias, HK, HV, BT)
    dt = k.dtype.element_ty
    R0, R1, R2, R3, m0, m1, m2, m3, be0, be1, be2, be3, G0, G1, G2, G3 = _sub_block_gates(
        a, b, stride_ab, G, r0, L, h, neg_A, dtb, HV, BC)

    # Raw key products of the 10 lower blocks and the squared key norms, summed over BK-wide column slices.
    zb = tl.zeros([BC, BC], dtype=tl.float32)
    S00, S11, S22, S33, S10, S20, S21, S30, S31, S32 = zb, zb, zb, zb, zb, zb, zb, zb, zb, zb
    zr = tl.zeros([BC], dtype=tl.float32)
    n0, n1, n2, n3 = zr, zr, zr, zr
    for col in range(kh * DK, kh * DK + DK, BK):
        k0 = _load_rows(k, R0, stride_k, col, m0, BK)
        k1 = _load_rows(k, R1, stride_k, col, m1, BK)
        k2 = _load_rows(k, R2, stride_k, col, m2, BK)
        k3 = _load_rows(k, R3, stride_k, col, m3, BK)
        n0 += tl.sum(k0.to(tl.float32) * k0.to(tl.float32), axis=1)
        n1 += tl.sum(k1.to(tl.float32) * k1.to(tl.float32), axis=1)
        n2 += tl.sum(k2.to(tl.float32) * k2.to(tl.float32), axis=1)
        n3 += tl.sum(k3.to(tl.float32) * k3.to(tl.float32), axis=1)
        S00 += _kt(k0, k0, DOT_PREC)
        S11 += _kt(k1, k1, DOT_PREC)
        S22 += _kt(k2, k2, DOT_PREC)
        S33 += _kt(k3, k3, DOT_PREC)
        S10 += _kt(k1, k0, DOT_PREC)
        S20 += _kt(k2, k0, DOT_PREC)
        S21 += _kt(k2, k1, DOT_PREC)
        S30 += _kt(k3, k0, DOT_PREC)
        S31 += _kt(k3, k1, DOT_PREC)
        S32 += _kt(k3, k2, DOT_PREC)
    rk0, rk1, rk2, rk3 = tl.rsqrt(n0 + 1e-6), tl.rsqrt(n1 + 1e-6), tl.rsqrt(n2 + 1e-6), tl.rsqrt(n3 + 1e-6)
    if h % (HV // HK) == 0:  # one value head per key head writes the norms stage 2 uses
        tl.store(RK + R0 * HK + kh, rk0, mask=m0)
        tl.store(RK + R1 * HK + kh, rk1, mask=m1)
        tl.store(RK + R2 * HK + kh, rk2, mask=m2)
        tl.store(RK + R3 * HK + kh, rk3, mask=m3)
        p0, p1, p2, p3 = zr, zr, zr, zr
        for col in range(kh * DK, kh * DK + DK, BK):
            q0 = _load_rows(q, R0, stride_q, col, m0, BK).to(tl.float32)
            q1 = _load_rows(q, R1, stride_q, col, m1, BK).to(tl.float32)
            q2 = _load_rows(q, R2, stride_q, col, m2, BK).to(tl.float32)
            q3 = _load_rows(q, R3, stride_q, col, m3, BK).to(tl.float32)
            p0 += tl.sum(q0 * q0, axis=1)
            p1 += tl.sum(q1 * q1, axis=1)
            p2 += tl.sum(q2 * q2, axis=1)
            p3 += tl.sum(q3 * q3, axis=1)
        scale = 1.0 / tl.sqrt(DK * 1.0)
        tl.store(RQ + R0 * HK + kh, tl.rsqrt(p0 + 1e-6) * scale, mask=m0)
        tl.store(RQ + R1 * HK + kh, tl.rsqrt(p1 + 1e-6) * scale, mask=m1)
        tl.store(RQ + R2 * HK + kh, tl.rsqrt(p2 + 1e-6) * scale, mask=m2)
        tl.store(RQ + R3 * HK + kh, tl.rsqrt(p3 + 1e-6) * scale, mask=m3)

    s0, s1, s2, s3 = be0 * rk0, be1 * rk1, be2 * rk2, be3 * rk3
    A00 = _kkt_scale(S00, s0, rk0, G0, G0, m0, m0, True)
    A11 = _kkt_scale(S11, s1, rk1, G1, G1, m1, m1, True)
    A22 = _kkt_scale(S22, s2, rk2, G2, G2, m2, m2, True)
    A33 = _kkt_scale(S33, s3, rk3, G3, G3, m3, m3, True)
    A10 = _kkt_scale(S10, s1, rk0, G1, G0, m1, m0, False)
    A20 = _kkt_scale(S20, s2, rk0, G2, G0, m2, m0, False)
    A21 = _kkt_scale(S21, s2, rk1, G2, G1, m2, m1, False)
    A30 = _kkt_scale(S30, s3, rk0, G3, G0, m3, m0, False)
    A31 = _kkt_scale(S31, s3, rk1, G3, G1, m3, m1, False)
    A32 = _kkt_scale(S32, s3, rk2, G3, G2, m3, m2, False)
    X00, X11, X22, X33, X10, X20, X21, X30, X31, X32 = _solve_blocks(A00, A11, A22, A33, A10, A20, A21, A30, A31,
                                                                      A32, BC, INV)
    x00, x11, x22, x33 = X00.to(dt), X11.to(dt), X22.to(dt), X33.to(dt)
    x10, x20, x21, x30, x31, x32 = X10.to(dt), X20.to(dt), X21.to(dt), X30.to(dt), X31.to(dt), X32.to(dt)

    # w = X · (beta·exp(G)·k̂) and u = X · (beta·v), BK columns at a time.
    f0, f1, f2, f3 = s0 * tl.exp2(G0), s1 * tl.exp2(G1), s2 * tl.exp2(G2), s3 * tl.exp2(G3)
    _x_times_rows(k, stride_k, kh * DK, w + h * DK, HV * DK, DK, BK, R0, R1, R2, R3, m0, m1, m2, m3, f0, f1, f2, f3,
                  x00, x11, x22, x33, x10, x20, x21, x30, x31, x32, DOT_PREC)
    _x_times_rows(v, stride_v, h * DV, u + h * DV, HV * DV, DV, BK, R0, R1, R2, R3, m0, m1, m2, m3, be0, be1, be2,
                  be3, x00, x11, x22, x33, x10, x20, x21, x30, x31, x32, DOT_PREC)
