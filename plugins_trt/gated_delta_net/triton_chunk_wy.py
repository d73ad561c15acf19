"""Chunked prefill, stage 1 of 2: the intra-chunk WY factors of the gated delta rule (no state needed).

For one chunk of L <= BT = 64 tokens of one value head, with G_i = sum_{s<=i} g_s (chunk-local
cumulative log decay), k̂ the L2-normalised keys and the strictly lower-triangular

    A[i, j] = beta_i · (k̂_i · k̂_j) · exp(G_i - G_j)      (i > j),

the delta rule inside the chunk is (I + A) Δ = beta·V - (beta·exp(G)·K̂) S0, so with X = (I + A)^{-1}

    w = X · (beta·exp(G)·K̂)  [L, DK],    u = X · (beta·V)  [L, DV],    Δ = u - w·S0

(Δ: each token's state update, S0: the state entering the chunk). This kernel writes w, u, G (in
log2 units, for exp2 in stage 2) and the inverse norms of q and k (stage 2 applies them to products
of the raw bf16 tiles instead of normalising tiles); stage 2 (`triton_chunk.py`) walks the chunks
with the state.

X by blocks of BC = 16: the four diagonal blocks (I + A_ii)^{-1} by forward substitution (interleaved
in one loop of 16 rows), the off-diagonal blocks by X_ij = -X_ii · sum_{m=j}^{i-1} A_im X_mj.
One program per (chunk, value head); everything stays in registers. (The default stage 1 is the sliced form of
this kernel, `triton_chunk_wy_sliced.py`; this held form and the split one below remain launch options.) Split form (STORE_X): this kernel writes X
instead (rows of [BT, BT], zeros above the diagonal) and chunk_wu_kernel makes w and u with one [BT, BT] x [BT, D]
dot each, so that neither launch holds X and the right-hand sides at once (same values: X and the right-hand sides
are rounded to the input dtype before the products either way).
"""

import triton
import triton.language as tl

from atlas.plugins_trt.gated_delta_net.triton_common import LOG2E, gdn_gate, inv_unit_lower


@triton.jit
def _block_gates(a, b, stride_ab, rows, valid, h, neg_A, dtb):
    """g (natural log) and beta of rows [BC] of value head h; zero on invalid rows."""
    a_r = tl.load(a + rows * stride_ab + h, mask=valid, other=0.0)
    b_r = tl.load(b + rows * stride_ab + h, mask=valid, other=0.0)
    g, beta = gdn_gate(a_r, b_r, neg_A, dtb)
    return tl.where(valid, g, 0.0), tl.where(valid, beta, 0.0)


@triton.jit
def _chunk_of(chunks, cu_seqlens, A_log, dt_bias, HK: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr):
    """This program's chunk (grid dim 0) and value head (dim 1): its first row r0, the tokens L left from there,
    the key head and the head's gate constants -exp(A_log) and dt_bias."""
    i, h = tl.program_id(0), tl.program_id(1)
    seq = tl.load(chunks + 2 * i)
    c = tl.load(chunks + 2 * i + 1)
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    L = tl.load(cu_seqlens + seq + 1) - bos - c * BT
    return (bos + c * BT, L, h // (HV // HK), -tl.exp(tl.load(A_log + h).to(tl.float32)),
            tl.load(dt_bias + h).to(tl.float32))


@triton.jit
def _sub_block_gates(a, b, stride_ab, G, r0, L, h, neg_A, dtb, HV: tl.constexpr, BC: tl.constexpr):
    """Rows, validity, beta and the chunk-local cumulative log2 decay of the chunk's four sub-blocks of BC rows;
    the decay is stored into G."""
    ob = tl.arange(0, BC)
    m0, m1, m2, m3 = ob < L, ob + BC < L, ob + 2 * BC < L, ob + 3 * BC < L
    R0, R1, R2, R3 = r0 + ob, r0 + BC + ob, r0 + 2 * BC + ob, r0 + 3 * BC + ob
    g0, be0 = _block_gates(a, b, stride_ab, R0, m0, h, neg_A, dtb)
    g1, be1 = _block_gates(a, b, stride_ab, R1, m1, h, neg_A, dtb)
    g2, be2 = _block_gates(a, b, stride_ab, R2, m2, h, neg_A, dtb)
    g3, be3 = _block_gates(a, b, stride_ab, R3, m3, h, neg_A, dtb)
    G0 = tl.cumsum(g0, axis=0) * LOG2E
    G1 = tl.cumsum(g1, axis=0) * LOG2E + tl.sum(g0, axis=0) * LOG2E
    G2 = tl.cumsum(g2, axis=0) * LOG2E + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0)) * LOG2E
    G3 = tl.cumsum(g3, axis=0) * LOG2E + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0)) * LOG2E
    tl.store(G + R0 * HV + h, G0, mask=m0)
    tl.store(G + R1 * HV + h, G1, mask=m1)
    tl.store(G + R2 * HV + h, G2, mask=m2)
    tl.store(G + R3 * HV + h, G3, mask=m3)
    return R0, R1, R2, R3, m0, m1, m2, m3, be0, be1, be2, be3, G0, G1, G2, G3


@triton.jit
def _load_rows(p, rows, stride, col0, valid, D: tl.constexpr):
    """p[rows, col0 : col0 + D] [BC, D] in p's dtype; zero on invalid rows."""
    return tl.load(p + rows[:, None] * stride + col0 + tl.arange(0, D)[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def _rnorm(x):
    """1 / ||row|| as in reference.l2norm: rsqrt(sum(x²) + 1e-6) per row of x [BC, D], fp32 [BC]."""
    xf = x.to(tl.float32)
    return tl.rsqrt(tl.sum(xf * xf, axis=1) + 1e-6)


@triton.jit
def _kkt(ki, kj, si, sj, Gi, Gj, valid_i, valid_j, DIAG: tl.constexpr, DOT_PREC: tl.constexpr):
    """A_ij = beta_i (k̂_i · k̂_j) exp(G_i - G_j) on valid pairs (strictly lower on a diagonal block),
    from raw keys: si = beta_i / ||k_i||, sj = 1 / ||k_j||."""
    o = tl.arange(0, ki.shape[0])
    m = valid_i[:, None] & valid_j[None, :]
    if DIAG:
        m = m & (o[:, None] > o[None, :])
    s = tl.dot(ki, tl.trans(kj), input_precision=DOT_PREC)
    # min(., 0): entries above the diagonal are masked; clamping keeps exp2 finite there
    decay = tl.exp2(tl.minimum(Gi[:, None] - Gj[None, :], 0.0))
    return tl.where(m, s * decay * si[:, None] * sj[None, :], 0.0)


@triton.jit
def _mm(x, y):
    return tl.dot(x, y, input_precision="ieee")


@triton.jit
def _dot(x, y, DOT_PREC: tl.constexpr):
    return tl.dot(x, y, input_precision=DOT_PREC)


@triton.jit
def _store_rows(p, rows, stride, valid, val):
    """p[rows] <- val for the valid rows; p: [1, D] pointers of row 0, rows [BC], val [BC, D]."""
    tl.store(p + rows[:, None] * stride, val.to(p.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _solve_blocks(A00, A11, A22, A33, A10, A20, A21, A30, A31, A32, BC: tl.constexpr, INV: tl.constexpr = False):
    """The [BC, BC] blocks of X = (I + A)^{-1} for a strictly lower A given by its 10 blocks (fp32). INV: the
    diagonal blocks by inv_unit_lower instead of forward substitution (same values up to rounding; untimed)."""
    ob = tl.arange(0, BC)
    # Diagonal blocks of X: row r of (I + A_ii)^{-1} is e_r - sum_{m<r} A_ii[r, m] X_ii[m, :].
    eye = (ob[:, None] == ob[None, :]).to(tl.float32)
    X00, X11, X22, X33 = eye, eye, eye, eye
    if INV:
        tl.static_assert(BC <= 16, "inv_unit_lower is unrolled for blocks of up to 16 rows here")
        X00, X11 = inv_unit_lower(A00, 4), inv_unit_lower(A11, 4)
        X22, X33 = inv_unit_lower(A22, 4), inv_unit_lower(A33, 4)
    else:
        for r in range(1, BC):
            sel = (ob == r)[:, None]
            e_r = (ob == r).to(tl.float32)
            a0 = tl.sum(tl.where(sel, A00, 0.0), axis=0)
            a1 = tl.sum(tl.where(sel, A11, 0.0), axis=0)
            a2 = tl.sum(tl.where(sel, A22, 0.0), axis=0)
            a3 = tl.sum(tl.where(sel, A33, 0.0), axis=0)
            X00 = tl.where(sel, (e_r - tl.sum(a0[:, None] * X00, axis=0))[None, :], X00)
            X11 = tl.where(sel, (e_r - tl.sum(a1[:, None] * X11, axis=0))[None, :], X11)
            X22 = tl.where(sel, (e_r - tl.sum(a2[:, None] * X22, axis=0))[None, :], X22)
            X33 = tl.where(sel, (e_r - tl.sum(a3[:, None] * X33, axis=0))[None, :], X33)
    # Off-diagonal blocks: X_ij = -X_ii · sum_{m=j}^{i-1} A_im X_mj.
    X10 = -_mm(X11, _mm(A10, X00))
    X21 = -_mm(X22, _mm(A21, X11))
    X20 = -_mm(X22, _mm(A20, X00) + _mm(A21, X10))
    X32 = -_mm(X33, _mm(A32, X22))
    X31 = -_mm(X33, _mm(A31, X11) + _mm(A32, X21))
    X30 = -_mm(X33, _mm(A30, X00) + _mm(A31, X10) + _mm(A32, X20))
    return X00, X11, X22, X33, X10, X20, X21, X30, X31, X32


@triton.jit
def chunk_wy_kernel(
    q, stride_q,          # [total_T, HK*DK] queries after the conv (only their norms are taken here)
    k, stride_k,          # [total_T, HK*DK] keys after the conv (raw; row stride in elements)
    v, stride_v,          # [total_T, HV*DV] values after the conv
    a, b, stride_ab,      # [total_T, HV] raw gate inputs, one row stride
    A_log, dt_bias,       # [HV]
    cu_seqlens,           # int32 [N+1]
    chunks,               # int32 [NT, 2]: (sequence, chunk index inside it) of every chunk
    w,                    # [total_T, HV, DK] out (dtype of w)
    u,                    # [total_T, HV, DV] out
    G,                    # fp32 [total_T, HV] out: chunk-local cumulative log2 decay
    RQ, RK,               # fp32 [total_T, HK] out: 1/(||q||·sqrt(DK)) and 1/||k|| per token and key head
    X,                    # [total_T, HV, BT] out with STORE_X (dtype of w): row t holds X[t - chunk start, :]
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr,  # chunk (64) and sub-block (16): BT == 4 * BC
    DOT_PREC: tl.constexpr,              # "tf32" (bf16 operands ignore it) or "ieee" for fp32 activations
    STORE_X: tl.constexpr = False,       # write X = (I + A)^{-1} instead of w and u (chunk_wu_kernel makes them)
    RELOAD_K: tl.constexpr = False,      # load the key tiles again for w's right-hand side (fewer live registers:
                                         # sm_90 stack 776 -> 608 B at 2 warps, 192 -> 16 B at 4); untimed
):
    """Grid (NT, HV)."""
    tl.static_assert(BT == 4 * BC, "the block solve is written for four sub-blocks")
    h = tl.program_id(1)
    r0, L, kh, neg_A, dtb = _chunk_of(chunks, cu_seqlens, A_log, dt_bias, HK, HV, BT)
    # Per sub-block: validity, gates and the cumulative log2 decay (stored for stage 2).
    R0, R1, R2, R3, m0, m1, m2, m3, be0, be1, be2, be3, G0, G1, G2, G3 = _sub_block_gates(
        a, b, stride_ab, G, r0, L, h, neg_A, dtb, HV, BC)
    # Raw keys (dot operands) and their inverse norms; q̂ and k̂ are never formed as tiles.
    kr0 = _load_rows(k, R0, stride_k, kh * DK, m0, DK)
    kr1 = _load_rows(k, R1, stride_k, kh * DK, m1, DK)
    kr2 = _load_rows(k, R2, stride_k, kh * DK, m2, DK)
    kr3 = _load_rows(k, R3, stride_k, kh * DK, m3, DK)
    rk0, rk1, rk2, rk3 = _rnorm(kr0), _rnorm(kr1), _rnorm(kr2), _rnorm(kr3)
    if h % (HV // HK) == 0:  # one value head per key head writes the norms stage 2 uses
        scale = 1.0 / tl.sqrt(DK * 1.0)
        tl.store(RK + R0 * HK + kh, rk0, mask=m0)
        tl.store(RK + R1 * HK + kh, rk1, mask=m1)
        tl.store(RK + R2 * HK + kh, rk2, mask=m2)
        tl.store(RK + R3 * HK + kh, rk3, mask=m3)
        tl.store(RQ + R0 * HK + kh, _rnorm(_load_rows(q, R0, stride_q, kh * DK, m0, DK)) * scale, mask=m0)
        tl.store(RQ + R1 * HK + kh, _rnorm(_load_rows(q, R1, stride_q, kh * DK, m1, DK)) * scale, mask=m1)
        tl.store(RQ + R2 * HK + kh, _rnorm(_load_rows(q, R2, stride_q, kh * DK, m2, DK)) * scale, mask=m2)
        tl.store(RQ + R3 * HK + kh, _rnorm(_load_rows(q, R3, stride_q, kh * DK, m3, DK)) * scale, mask=m3)

    # A = beta (K̂K̂ᵀ ⊙ decay), strictly lower: 4 diagonal and 6 off-diagonal [BC, BC] blocks.
    s0, s1, s2, s3 = be0 * rk0, be1 * rk1, be2 * rk2, be3 * rk3
    A00 = _kkt(kr0, kr0, s0, rk0, G0, G0, m0, m0, True, DOT_PREC)
    A11 = _kkt(kr1, kr1, s1, rk1, G1, G1, m1, m1, True, DOT_PREC)
    A22 = _kkt(kr2, kr2, s2, rk2, G2, G2, m2, m2, True, DOT_PREC)
    A33 = _kkt(kr3, kr3, s3, rk3, G3, G3, m3, m3, True, DOT_PREC)
    A10 = _kkt(kr1, kr0, s1, rk0, G1, G0, m1, m0, False, DOT_PREC)
    A20 = _kkt(kr2, kr0, s2, rk0, G2, G0, m2, m0, False, DOT_PREC)
    A21 = _kkt(kr2, kr1, s2, rk1, G2, G1, m2, m1, False, DOT_PREC)
    A30 = _kkt(kr3, kr0, s3, rk0, G3, G0, m3, m0, False, DOT_PREC)
    A31 = _kkt(kr3, kr1, s3, rk1, G3, G1, m3, m1, False, DOT_PREC)
    A32 = _kkt(kr3, kr2, s3, rk2, G3, G2, m3, m2, False, DOT_PREC)

    X00, X11, X22, X33, X10, X20, X21, X30, X31, X32 = _solve_blocks(A00, A11, A22, A33, A10, A20, A21, A30, A31,
                                                                      A32, BC)

    if STORE_X:  # in the order the blocks were made; zeros above the diagonal blocks
        xd = X.dtype.element_ty
        zero = tl.zeros([BC, BC], dtype=xd)
        _store_x_block(X, R0, m0, h, HV, BT, BC, 0, X00.to(xd))
        _store_x_block(X, R1, m1, h, HV, BT, BC, 1, X11.to(xd))
        _store_x_block(X, R2, m2, h, HV, BT, BC, 2, X22.to(xd))
        _store_x_block(X, R3, m3, h, HV, BT, BC, 3, X33.to(xd))
        _store_x_block(X, R1, m1, h, HV, BT, BC, 0, X10.to(xd))
        _store_x_block(X, R2, m2, h, HV, BT, BC, 1, X21.to(xd))
        _store_x_block(X, R2, m2, h, HV, BT, BC, 0, X20.to(xd))
        _store_x_block(X, R3, m3, h, HV, BT, BC, 2, X32.to(xd))
        _store_x_block(X, R3, m3, h, HV, BT, BC, 1, X31.to(xd))
        _store_x_block(X, R3, m3, h, HV, BT, BC, 0, X30.to(xd))
        for j in range(1, 4):
            _store_x_block(X, R0, m0, h, HV, BT, BC, j, zero)
        for j in range(2, 4):
            _store_x_block(X, R1, m1, h, HV, BT, BC, j, zero)
        _store_x_block(X, R2, m2, h, HV, BT, BC, 3, zero)
    else:
        _wu_from_blocks(k, stride_k, v, stride_v, w, u, h, kh, HV, DK, DV, DOT_PREC, R0, R1, R2, R3,
                        m0, m1, m2, m3, kr0, kr1, kr2, kr3, s0, s1, s2, s3, G0, G1, G2, G3, be0, be1, be2, be3,
                        X00, X11, X22, X33, X10, X20, X21, X30, X31, X32, RELOAD_K)


@triton.jit
def _store_x_block(X, rows, valid, h, HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, j, x):
    """X[rows, h, j·BC : (j+1)·BC] <- x [BC, BC] for the valid rows."""
    p = X + rows[:, None] * (HV * BT) + h * BT + j * BC + tl.arange(0, BC)[None, :]
    tl.store(p, x.to(X.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _wu_from_blocks(k, stride_k, v, stride_v, w, u, h, kh, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                    DOT_PREC: tl.constexpr, R0, R1, R2, R3, m0, m1, m2, m3, kr0, kr1, kr2, kr3,
                    s0, s1, s2, s3, G0, G1, G2, G3, be0, be1, be2, be3,
                    X00, X11, X22, X33, X10, X20, X21, X30, X31, X32, RELOAD_K: tl.constexpr):
    """w and u of the chunk from the blocks of X (the fused kernel's second half)."""
    dt = k.dtype.element_ty
    # Right-hand sides: beta·exp(G)·k̂ and beta·v, per sub-block, in the input dtype for the dots.
    if RELOAD_K:  # the key tiles again (L2 hits) instead of holding them through the solve
        kr0 = _load_rows(k, R0, stride_k, kh * DK, m0, DK)
        kr1 = _load_rows(k, R1, stride_k, kh * DK, m1, DK)
        kr2 = _load_rows(k, R2, stride_k, kh * DK, m2, DK)
        kr3 = _load_rows(k, R3, stride_k, kh * DK, m3, DK)
    rk0 = (kr0.to(tl.float32) * (s0 * tl.exp2(G0))[:, None]).to(dt)
    rk1 = (kr1.to(tl.float32) * (s1 * tl.exp2(G1))[:, None]).to(dt)
    rk2 = (kr2.to(tl.float32) * (s2 * tl.exp2(G2))[:, None]).to(dt)
    rk3 = (kr3.to(tl.float32) * (s3 * tl.exp2(G3))[:, None]).to(dt)
    x00, x11, x22, x33 = X00.to(dt), X11.to(dt), X22.to(dt), X33.to(dt)
    x10, x20, x21, x30, x31, x32 = X10.to(dt), X20.to(dt), X21.to(dt), X30.to(dt), X31.to(dt), X32.to(dt)
    # Rows of sub-block i: sum_{j <= i} X_ij · rhs_j.
    w_out = w + h * DK + tl.arange(0, DK)[None, :]
    _store_rows(w_out, R0, HV * DK, m0, _dot(x00, rk0, DOT_PREC))
    _store_rows(w_out, R1, HV * DK, m1, _dot(x10, rk0, DOT_PREC) + _dot(x11, rk1, DOT_PREC))
    _store_rows(w_out, R2, HV * DK, m2,
                _dot(x20, rk0, DOT_PREC) + _dot(x21, rk1, DOT_PREC) + _dot(x22, rk2, DOT_PREC))
    _store_rows(w_out, R3, HV * DK, m3, _dot(x30, rk0, DOT_PREC) + _dot(x31, rk1, DOT_PREC)
                + _dot(x32, rk2, DOT_PREC) + _dot(x33, rk3, DOT_PREC))
    rv0 = (_load_rows(v, R0, stride_v, h * DV, m0, DV).to(tl.float32) * be0[:, None]).to(dt)
    rv1 = (_load_rows(v, R1, stride_v, h * DV, m1, DV).to(tl.float32) * be1[:, None]).to(dt)
    rv2 = (_load_rows(v, R2, stride_v, h * DV, m2, DV).to(tl.float32) * be2[:, None]).to(dt)
    rv3 = (_load_rows(v, R3, stride_v, h * DV, m3, DV).to(tl.float32) * be3[:, None]).to(dt)
    u_out = u + h * DV + tl.arange(0, DV)[None, :]
    _store_rows(u_out, R0, HV * DV, m0, _dot(x00, rv0, DOT_PREC))
    _store_rows(u_out, R1, HV * DV, m1, _dot(x10, rv0, DOT_PREC) + _dot(x11, rv1, DOT_PREC))
    _store_rows(u_out, R2, HV * DV, m2,
                _dot(x20, rv0, DOT_PREC) + _dot(x21, rv1, DOT_PREC) + _dot(x22, rv2, DOT_PREC))
    _store_rows(u_out, R3, HV * DV, m3, _dot(x30, rv0, DOT_PREC) + _dot(x31, rv1, DOT_PREC)
                + _dot(x32, rv2, DOT_PREC) + _dot(x33, rv3, DOT_PREC))


@triton.jit
def chunk_wu_kernel(
    k, stride_k,          # [total_T, HK*DK] keys after the conv (raw)
    v, stride_v,          # [total_T, HV*DV] values after the conv
    a, b, stride_ab,      # [total_T, HV] raw gate inputs
    A_log, dt_bias,       # [HV]
    cu_seqlens, chunks,   # as for chunk_wy_kernel
    X,                    # [total_T, HV, BT] from chunk_wy_kernel with STORE_X
    G, RK,                # fp32 [total_T, HV] and [total_T, HK] from chunk_wy_kernel
    w, u,                 # out: [total_T, HV, DK] and [total_T, HV, DV]
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Stage 1b of the split form: w = X · (beta·exp(G)·k̂) and u = X · (beta·v) for one chunk of one value head,
    each one [BT, BT] x [BT, D] dot. Grid (NT, HV)."""
    h = tl.program_id(1)
    r0, L, kh, neg_A, dtb = _chunk_of(chunks, cu_seqlens, A_log, dt_bias, HK, HV, BT)
    ot = tl.arange(0, BT)
    valid = ot < L
    rows = r0 + ot
    dt = k.dtype.element_ty
    _, beta = _block_gates(a, b, stride_ab, rows, valid, h, neg_A, dtb)
    Gr = tl.load(G + rows * HV + h, mask=valid, other=0.0)
    rk = tl.load(RK + rows * HK + kh, mask=valid, other=0.0)
    x = tl.load(X + rows[:, None] * (HV * BT) + h * BT + ot[None, :], mask=valid[:, None] & valid[None, :],
                other=0.0)
    kr = _load_rows(k, rows, stride_k, kh * DK, valid, DK)
    rhs_k = (kr.to(tl.float32) * (beta * rk * tl.exp2(Gr))[:, None]).to(dt)
    _store_rows(w + h * DK + tl.arange(0, DK)[None, :], rows, HV * DK, valid, _dot(x, rhs_k, DOT_PREC))
    vr = _load_rows(v, rows, stride_v, h * DV, valid, DV)
    rhs_v = (vr.to(tl.float32) * beta[:, None]).to(dt)
    _store_rows(u + h * DV + tl.arange(0, DV)[None, :], rows, HV * DV, valid, _dot(x, rhs_v, DOT_PREC))
