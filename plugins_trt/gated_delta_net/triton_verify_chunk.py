"""Gated DeltaNet verify of width T (2..17) as one chunk, and the commit that installs the accepted prefix.

Rollback mode "deltas". The token-by-token kernel (triton_recurrent.py) walks the T tokens one after the
other, a chain of T dependent state updates; here the T tokens are solved together, so the only
sequential part is a T-row triangular solve on [TP, BV] numbers. With G_i = sum_{s<=i} g_s (natural-log
cumulative decay over the verify), q̂, k̂ the L2-normalised query and key (q̂ scaled by 1/sqrt(DK)), S0 the
slot's state [DK, DV] and

    A[i, j] = beta_i (k̂_i · k̂_j) exp(G_i - G_j)  (j < i, else 0),

the per-token updates u_i = beta_i (v_i - (exp(g_i) S_{i-1})ᵀ k̂_i) of the delta rule solve

    (I + A) U = beta ⊙ (V - exp(G) ⊙ (K̂ S0))                     U: [T, DV]

and then S_i = exp(G_i) S0 + sum_{j<=i} exp(G_i - G_j) k̂_j u_jᵀ, so

    o_i = exp(G_i) (q̂_i S0) + sum_{j<=i} exp(G_i - G_j) (q̂_i · k̂_j) u_j.

The rollback buffer keeps, per token, k̂_t [HK, DK], u_t [HV, DV] and g_t [HV] (fp32): the state after any
t tokens follows from them and the slot's state, which the verify leaves untouched. Committing n accepted
tokens is then one rank-n update, S_n = exp(G_n) S0 + K̂_nᵀ (w ⊙ U_n) with w_j = exp(G_n - G_j): one state
read and one write, instead of a copy of a materialised per-token state (mode "states", T state writes in
the verify) or a token-by-token replay (mode "replay").

Both kernels: one program per (Dv tile, value head, sequence), grid (DV // BV, HV, B). Every dot takes fp32
operands (DOT_PREC "ieee": exact fp32 products; "tf32x3" runs them on the tensor cores at about fp32
accuracy). TP is the token tile: the next power of two >= T, at least 16 (the dot's minimum).
"""

from __future__ import annotations

import triton
import triton.language as tl

from atlas.plugins_trt.causal_conv1d.triton_conv import slide_window
from atlas.plugins_trt.gated_delta_net.triton_common import gated_norm_vec, gdn_gate, inv_unit_lower, l2norm_rows


def token_tile(T: int) -> int:
    """TP for a verify of width T."""
    return max(16, triton.next_power_of_2(T))


@triton.jit
def _conv_tile(xs, stride_x, win, conv_w, conv_b, ch, t, T, TP: tl.constexpr, D: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    """silu(conv(x)) [TP, D] fp32 of channels ch [D] for tokens t [TP] (rows of xs); tokens before the
    first come from the window [C, 3] (oldest first). Rounded to x's dtype as the reference does;
    rows t >= T are zero."""
    valid = t < T
    acc = tl.zeros([TP, D], dtype=tl.float32)
    for j in tl.static_range(4):  # weight j multiplies the input j - 3 tokens back
        r = t + (j - 3)
        # one load per tap: the token's row of x, or its window column (x and window share a dtype)
        src = tl.where((r >= 0)[:, None], xs + r[:, None] * stride_x + ch[None, :], win + ch[None, :] * 3 + (r + 3)[:, None])
        xv = tl.load(src, mask=valid[:, None], other=0.0)
        acc += tl.load(conv_w + ch * 4 + j).to(tl.float32)[None, :] * xv.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(conv_b + ch).to(tl.float32)[None, :]
    y = (acc * tl.sigmoid(acc)).to(xs.dtype.element_ty).to(tl.float32)
    return tl.where(valid[:, None], y, 0.0)


@triton.jit
def _row(X, t, i):
    """Row i of a [TP, n] tile as an [n] vector."""
    return tl.sum(tl.where((t == i)[:, None], X, 0.0), axis=0)


@triton.jit
def gdn_verify_chunk_kernel(
    x, stride_x,          # [B*T, C] raw conv inputs [q | k | v], C = 2·HK·DK + HV·DV; row b·T + t
    a, b, stride_ab,      # [B*T, HV] raw gate inputs (decay a, beta b), one row stride for both
    conv_w, conv_b,       # [C, 4], [C] (conv_b read only if HAS_CONV_BIAS)
    A_log, dt_bias,       # [HV]
    window,               # [num_slots, C, 3] conv windows (read only)
    state,                # [num_slots, HV, DK, DV] recurrent states, fp32 or bf16 (read only)
    slots,                # int32 [B]; a negative slot is a padding row: skipped, nothing written
    o, stride_o,          # [B*T, HV*DV] outputs
    z, stride_z, norm_w,  # [B*T, HV*DV] output gate and [DV] norm weight (FUSE_NORM)
    keep_x, keep_ab,      # [B*T, C] copy of x, [B*T, 2·HV] copy of [a | b]
    dk, du, dg,           # fp32 [B*T, HK, DK] k̂, [B*T, HV, DV] u, [B*T, HV] g of every verify token
    qn, vc, beta_in,      # PREPPED: q̂ [B*T, HK, DK], silu(conv(v)) [B*T, HV*DV], beta [B*T, HV] (and k̂, g in
                          # dk, dg) from triton_verify_prep.gdn_verify_prep_kernel, which also kept the inputs
    T,                    # tokens per sequence (1..TP)
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BV: tl.constexpr, TP: tl.constexpr,
    FUSE_NORM: tl.constexpr, NORM_EPS: tl.constexpr, HAS_CONV_BIAS: tl.constexpr, DOT_PREC: tl.constexpr,
    PREPPED: tl.constexpr,
    TAIL: tl.constexpr,   # 1: the last token runs as one delta step after the tile (T - 1 <= TP; PREPPED), from
                          # products taken before the solve: the tile's end state is never formed
    SOLVE_INV: tl.constexpr = False,  # solve with inv_unit_lower (LOG2TP = log2(TP)) instead of forward substitution
    LOG2TP: tl.constexpr = 4,
    TAIL_DOTS: tl.constexpr = False,  # the tail's products as three small tensor-core dots (untimed)
):
    iv, h, bi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    R: tl.constexpr = HV // HK
    C: tl.constexpr = 2 * HK * DK + HV * DV
    if FUSE_NORM:
        tl.static_assert(BV == DV, "FUSE_NORM needs the whole head in one program (BV == DV)")
    slot = tl.load(slots + bi).to(tl.int64)
    if slot < 0:
        return
    kh = h // R
    if TAIL:
        tl.static_assert(PREPPED, "the tail step reads the prep launch's outputs")
    NT = T - TAIL  # tokens in the tile
    t = tl.arange(0, TP)
    valid = t < NT
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    q_ch = kh * DK + ck
    k_ch = HK * DK + kh * DK + ck
    v_ch = 2 * HK * DK + h * DV + cv
    win = window + slot * (C * 3)
    row0 = (bi * T).to(tl.int64)
    rows = row0 + t
    xs = x + row0 * stride_x

    m2 = valid[:, None]
    if PREPPED:
        q = tl.load(qn + (rows[:, None] * HK + kh) * DK + ck[None, :], mask=m2, other=0.0)
        k = tl.load(dk + (rows[:, None] * HK + kh) * DK + ck[None, :], mask=m2, other=0.0)
        v = tl.load(vc + rows[:, None] * (HV * DV) + h * DV + cv[None, :], mask=m2, other=0.0).to(tl.float32)
        g = tl.load(dg + rows * HV + h, mask=valid, other=0.0)
        beta = tl.load(beta_in + rows * HV + h, mask=valid, other=0.0)
    else:
        q = l2norm_rows(_conv_tile(xs, stride_x, win, conv_w, conv_b, q_ch, t, T, TP, DK, HAS_CONV_BIAS)) \
            * (1.0 / tl.sqrt(DK * 1.0))
        k = l2norm_rows(_conv_tile(xs, stride_x, win, conv_w, conv_b, k_ch, t, T, TP, DK, HAS_CONV_BIAS))
        v = _conv_tile(xs, stride_x, win, conv_w, conv_b, v_ch, t, T, TP, BV, HAS_CONV_BIAS)
        a_t = tl.load(a + rows * stride_ab + h, mask=valid, other=0.0)
        b_t = tl.load(b + rows * stride_ab + h, mask=valid, other=0.0)
        g, beta = gdn_gate(a_t, b_t, -tl.exp(tl.load(A_log + h).to(tl.float32)),
                           tl.load(dt_bias + h).to(tl.float32))
        g = tl.where(valid, g, 0.0)
        beta = tl.where(valid, beta, 0.0)
    G = tl.cumsum(g, axis=0)
    eG = tl.exp(G)

    S0 = tl.load(state + (slot * HV + h) * (DK * DV) + ck[:, None] * DV + cv[None, :]).to(tl.float32)  # [DK, BV]
    kt = tl.trans(k)
    decay = tl.exp(tl.minimum(G[:, None] - G[None, :], 0.0))  # [TP, TP]; g <= 0, so exact for j <= i
    A = tl.where(t[:, None] > t[None, :], tl.dot(k, kt, input_precision=DOT_PREC) * decay * beta[:, None], 0.0)
    U = beta[:, None] * (v - eG[:, None] * tl.dot(k, S0, input_precision=DOT_PREC))  # right-hand side [TP, BV]
    # everything that needs q, k or S0 before the solve, so that none of them stays live through it
    M = tl.where(t[:, None] >= t[None, :], tl.dot(q, kt, input_precision=DOT_PREC) * decay, 0.0)
    out = eG[:, None] * tl.dot(q, S0, input_precision=DOT_PREC)
    if (iv == 0) & (h % R == 0) & (not PREPPED):
        tl.store(dk + (rows[:, None] * HK + kh) * DK + ck[None, :], k, mask=m2)
    if TAIL:  # the tail token's products with S0 and with the tile's keys, so that S0, q and k die here
        tr = row0 + NT
        G_last = tl.sum(g, axis=0)
        w_j = tl.where(valid, tl.exp(G_last - G), 0.0)
        if TAIL_DOTS:  # rows 0 / 1 of a [TP, DK] tile hold k1 / q1: dots instead of cross-warp reductions
            own = (tr * HK + kh) * DK + ck[None, :]
            Q1 = tl.load(tl.where((t == 0)[:, None], dk + own, qn + own), mask=(t < 2)[:, None], other=0.0)
            P = tl.dot(Q1, S0, input_precision=DOT_PREC)  # [TP, BV]: rows k1ᵀ S0, q1ᵀ S0
            kS0, qS0 = _row(P, t, 0), _row(P, t, 1)
            Cw = tl.dot(Q1, kt, input_precision=DOT_PREC) * w_j[None, :]  # rows: k1 · k̂_j w_j, q1 · k̂_j w_j
            qk1 = tl.sum(tl.where(t == 0, _row(tl.dot(Q1, tl.trans(Q1), input_precision=DOT_PREC), t, 1), 0.0), axis=0)
        else:
            q1 = tl.load(qn + (tr * HK + kh) * DK + ck)
            k1 = tl.load(dk + (tr * HK + kh) * DK + ck)
            kS0 = tl.sum(S0 * k1[:, None], axis=0)  # [BV]  k1ᵀ S0
            qS0 = tl.sum(S0 * q1[:, None], axis=0)
            kk1 = tl.sum(k * k1[None, :], axis=1)   # [TP]  k̂_j · k1
            kq1 = tl.sum(k * q1[None, :], axis=1)
            qk1 = tl.sum(q1 * k1, axis=0)
    if SOLVE_INV:  # U = (I + A)^{-1} rhs with the inverse by products: no row-by-row loop
        U = tl.dot(inv_unit_lower(A, LOG2TP), U, input_precision="ieee")
    else:
        for i in range(1, NT):  # forward substitution: row i of U <- rhs_i - sum_{j<i} A[i, j] U[j]
            sel = (t == i)[:, None]
            a_i = tl.sum(tl.where(sel, A, 0.0), axis=0)  # [TP] by column j
            U = tl.where(sel, U - tl.sum(a_i[:, None] * U, axis=0)[None, :], U)
    out += tl.dot(M, U, input_precision=DOT_PREC)
    if FUSE_NORM:
        out = out.to(o.dtype.element_ty).to(tl.float32)  # the layer rounds o before the norm
        zt = tl.load(z + rows[:, None] * stride_z + h * DV + cv[None, :], mask=valid[:, None], other=0.0)
        zt = zt.to(tl.float32)
        w = tl.load(norm_w + cv).to(tl.float32)
        out = out * tl.rsqrt(tl.sum(out * out, axis=1) / DV + NORM_EPS)[:, None] * w[None, :] \
            * (zt * tl.sigmoid(zt))
    tl.store(o + rows[:, None] * stride_o + h * DV + cv[None, :], out.to(o.dtype.element_ty), mask=m2)
    tl.store(du + (rows[:, None] * HV + h) * DV + cv[None, :], U, mask=m2)
    if TAIL:  # S_NT = exp(G_NT) S0 + sum_j w_j k̂_j u_jᵀ is never formed: only k1ᵀ S_NT and q1ᵀ S_NT are needed
        e1 = tl.exp(tl.load(dg + tr * HV + h))
        eL = tl.exp(G_last)
        if TAIL_DOTS:
            D = tl.dot(Cw, U, input_precision=DOT_PREC)  # rows: sum_j (k1 · k̂_j) w_j u_j, the same with q1
            kS, qS = e1 * (eL * kS0 + _row(D, t, 0)), e1 * (eL * qS0 + _row(D, t, 1))
        else:
            kS = e1 * (eL * kS0 + tl.sum((kk1 * w_j)[:, None] * U, axis=0))  # k1ᵀ (exp(g1) S_NT)
            qS = e1 * (eL * qS0 + tl.sum((kq1 * w_j)[:, None] * U, axis=0))
        v1 = tl.load(vc + tr * (HV * DV) + h * DV + cv).to(tl.float32)
        u1 = tl.load(beta_in + tr * HV + h) * (v1 - kS)
        o1 = qS + qk1 * u1  # q1ᵀ S_T with S_T = exp(g1) S_NT + k1 u1ᵀ
        if FUSE_NORM:
            o1 = gated_norm_vec(o1, z + tr * stride_z + h * DV, norm_w, cv, DV, NORM_EPS, o.dtype.element_ty)
        tl.store(o + tr * stride_o + h * DV + cv, o1.to(o.dtype.element_ty))
        tl.store(du + (tr * HV + h) * DV + cv, u1)
    if not PREPPED:
        # the raw inputs, for the window slide of the commit (and a replay commit): each channel by one owner
        tl.store(keep_x + rows[:, None] * C + v_ch[None, :],
                 tl.load(xs + t[:, None] * stride_x + v_ch[None, :], mask=m2), mask=m2)
        if iv == 0:
            tl.store(dg + rows * HV + h, g, mask=valid)
            tl.store(keep_ab + rows * (2 * HV) + h, a_t, mask=valid)
            tl.store(keep_ab + rows * (2 * HV) + HV + h, b_t, mask=valid)
            if h % R == 0:
                tl.store(keep_x + rows[:, None] * C + q_ch[None, :],
                         tl.load(xs + t[:, None] * stride_x + q_ch[None, :], mask=m2), mask=m2)
                tl.store(keep_x + rows[:, None] * C + k_ch[None, :],
                         tl.load(xs + t[:, None] * stride_x + k_ch[None, :], mask=m2), mask=m2)


@triton.jit
def gdn_commit_deltas_kernel(
    state,                # [num_slots, HV, DK, DV] recurrent states, updated in place
    slots,                # int32 [B]; negative = padding, skipped
    accepted,             # int32 [B], 0..T
    dk, du, dg,           # fp32 [B*T, HK, DK], [B*T, HV, DV], [B*T, HV] from the verify
    window,               # [num_slots, C, KW-1]
    keep_x,               # [B*T, C] raw conv inputs of the verify
    T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    KW: tl.constexpr, WP: tl.constexpr, BV: tl.constexpr, TP: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """Grid (DV // BV, HV, B): S <- exp(G_n) S + sum_{j<n} exp(G_n - G_j) k̂_j u_jᵀ; window slid by n.
    Channel ownership of the window as in gdn_commit_kernel."""
    iv, h, bi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + bi).to(tl.int64)
    n = tl.load(accepted + bi)
    if (slot < 0) | (n <= 0):
        return
    kh = h // (HV // HK)
    t = tl.arange(0, TP)
    m = t < n
    rows = (bi * T).to(tl.int64) + t
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    g = tl.load(dg + rows * HV + h, mask=m, other=0.0)
    Gn = tl.sum(g, axis=0)
    w = tl.where(m, tl.exp(Gn - tl.cumsum(g, axis=0)), 0.0)
    K = tl.load(dk + (rows[:, None] * HK + kh) * DK + ck[None, :], mask=m[:, None], other=0.0)  # [TP, DK]
    U = tl.load(du + (rows[:, None] * HV + h) * DV + cv[None, :], mask=m[:, None], other=0.0)  # [TP, BV]
    p = state + (slot * HV + h) * (DK * DV) + ck[:, None] * DV + cv[None, :]
    S = tl.exp(Gn) * tl.load(p).to(tl.float32) + tl.dot(tl.trans(K), U * w[:, None], input_precision=DOT_PREC)
    tl.store(p, S.to(state.dtype.element_ty))
    slide_head_windows(window, keep_x, slot, bi, T, n, h, iv, cv, HK, HV, DK, DV, KW, WP)


@triton.jit
def slide_head_windows(window, keep_x, slot, bi, T, n, h, iv, cv, HK: tl.constexpr, HV: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr, WP: tl.constexpr):
    """A commit's window slide by n for program (iv, h, bi) of a (DV // BV, HV, B) grid: its own v channels cv,
    and the q/k channels of key head h // R by the program (h % R == 0, tile 0), so no channel has two writers."""
    R: tl.constexpr = HV // HK
    C: tl.constexpr = 2 * HK * DK + HV * DV
    win = window + slot * (C * (KW - 1))
    xs = keep_x + (bi * T).to(tl.int64) * C
    slide_window(win, xs, C, 2 * HK * DK + h * DV + cv, cv < DV, n, KW, WP)
    if (h % R == 0) & (iv == 0):
        ck = tl.arange(0, DK)
        kh = h // R
        slide_window(win, xs, C, kh * DK + ck, ck < DK, n, KW, WP)
        slide_window(win, xs, C, HK * DK + kh * DK + ck, ck < DK, n, KW, WP)


# ---------------------------------------------------------------------------------------------- launchers

def verify_chunk_config(DV: int, fuse_norm: bool, BV: int | None = None,
                        num_warps: int | None = None) -> tuple[int, int]:
    """The launcher's default (BV, num_warps) for the chunk verify: BV 64 / 4 warps was the fastest of the H200
    sweep (BV 16-64, 2-8 warps, tools/bench_gdn.py --sweep verify_deltas) at both token tiles. Larger tiles
    win because the per-program work that does not scale with BV (conv, norms, K̂K̂ᵀ, Q̂K̂ᵀ) dominates."""
    if fuse_norm:
        return DV, num_warps or 8
    return BV or min(DV, 64), num_warps or 4


def commit_deltas_bv(DV: int) -> int:
    """The commit's default Dv tile."""
    return min(DV, 32)


def launch_verify_chunk(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, state, slots, *, num_k_heads: int,
                        T: int, o, keep_x, keep_ab, dk, du, dg, z=None, norm_weight=None, norm_eps: float = 1e-6,
                        BV: int | None = None, num_warps: int | None = None, dot_prec: str = "tf32",
                        prepped=None, tail: bool = False, solve_inverse: bool = False,
                        tail_dots: bool = False) -> None:
    """Launch gdn_verify_chunk_kernel; x [B*T, C], a/b [B*T, HV] (one row stride), o/z [B*T, HV*DV].
    prepped: (qn, vc, beta) filled (with dk, dg, keep_x, keep_ab) by gdn_verify_prep_kernel, or None.
    tail (needs prepped): the first T - 1 tokens in the tile, the last as one step after it (T 17 in a 16 tile),
    from k1ᵀ S0, q1ᵀ S0 and its products with the tile's keys taken before the solve.
    solve_inverse: the token solve by (I + A)^{-1} computed with products (no row loop).
    tail_dots (with tail): the tail's products with S0 and the keys as three small dots, not cross-warp sums
    (sm_90 at BV 64 / 4 warps: 33 CTA barriers and 1816 instructions in the kernel against 56 and 2024)."""
    if tail and prepped is None:
        raise ValueError("tail=True needs the prep launch's outputs (prepped)")
    _, HV, DK, DV = state.shape
    C, KW = conv_weight.shape
    if KW != 4:
        raise ValueError(f"the chunk verify is written for conv width 4, got {KW}")
    if a.stride(0) != b.stride(0):
        raise ValueError(f"a and b need one row stride, got {a.stride(0)} and {b.stride(0)}")
    fuse_norm = z is not None
    TP = token_tile(T - 1 if tail else T)
    if solve_inverse and TP > 16:  # the powers of A grow with the tile: 7e-5 state error at 32 on repeated keys
        raise ValueError(f"solve_inverse needs a token tile of 16 (T <= 16, or T 17 with tail); T = {T} has {TP}")
    BV, num_warps = verify_chunk_config(DV, fuse_norm, BV, num_warps)
    dummy = state
    gdn_verify_chunk_kernel[(DV // BV, HV, slots.numel())](
        x, x.stride(0), a, b, a.stride(0), conv_weight, conv_bias if conv_bias is not None else conv_weight,
        A_log, dt_bias, window, state, slots, o, o.stride(0),
        z if fuse_norm else dummy, z.stride(0) if fuse_norm else 0, norm_weight if fuse_norm else dummy,
        keep_x, keep_ab, dk, du, dg, *(prepped if prepped is not None else (dk, du, dg)), T,
        HK=num_k_heads, HV=HV, DK=DK, DV=DV, BV=BV, TP=TP, FUSE_NORM=fuse_norm,
        NORM_EPS=float(norm_eps), HAS_CONV_BIAS=conv_bias is not None, DOT_PREC=dot_prec,
        PREPPED=prepped is not None, TAIL=int(tail), SOLVE_INV=solve_inverse, LOG2TP=TP.bit_length() - 1,
        TAIL_DOTS=tail_dots, num_warps=num_warps)


def launch_commit_deltas(dk, du, dg, keep_x, accepted, window, state, slots, *, num_k_heads: int, T: int,
                         BV: int | None = None, num_warps: int = 4, dot_prec: str = "tf32") -> None:
    """Launch gdn_commit_deltas_kernel (rollback mode "deltas")."""
    _, HV, DK, DV = state.shape
    KW = window.shape[2] + 1
    BV = BV or commit_deltas_bv(DV)
    gdn_commit_deltas_kernel[(DV // BV, HV, slots.numel())](
        state, slots, accepted, dk, du, dg, window, keep_x, T, HK=num_k_heads, HV=HV, DK=DK, DV=DV, KW=KW,
        WP=triton.next_power_of_2(KW - 1), BV=BV, TP=token_tile(T), DOT_PREC=dot_prec, num_warps=num_warps)


def signature_gdn_verify_chunk(HK: int, HV: int, DK: int, DV: int, T: int, *, BV: int, num_warps: int,
                               num_stages: int = 2, norm_eps: float = 1e-6, fuse_norm: bool = True,
                               act: str = "*bf16", state: str = "*fp32", has_conv_bias: bool = False,
                               dot_prec: str = "tf32", prepped: bool = False, tail: bool = False,
                               solve_inverse: bool = False, tail_dots: bool = False):
    """gdn_verify_chunk_kernel for widths of the token tile token_tile(T); T stays a run-time int. prepped: reads the
    prep launch's outputs (triton_verify_prep) instead of computing the conv and norms.

    act: dtype of the activations, conv weight, window and keep buffers; state: of the state; k, u, g and
    A_log, dt_bias and the norm weight are fp32. a, b and z are column views of the in_proj output (not assumed
    aligned). Grid (DV // BV, HV, B), B = slots.numel()."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(x=P, stride_x=i32, a=P, b=P, stride_ab=i32, conv_w=P, conv_b=P, A_log=F, dt_bias=F, window=P,
                 state=state, slots=I, o=P, stride_o=i32, z=P, stride_z=i32, norm_w=F, keep_x=P, keep_ab=P,
                 dk=F, du=F, dg=F, qn=F, vc=P, beta_in=F, T=i32)
    TP = token_tile(T - 1 if tail else T)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BV=BV, TP=TP, FUSE_NORM=fuse_norm,
                 NORM_EPS=float(norm_eps), HAS_CONV_BIAS=has_conv_bias, DOT_PREC=dot_prec, PREPPED=prepped,
                 TAIL=int(tail), SOLVE_INV=solve_inverse, LOG2TP=TP.bit_length() - 1, TAIL_DOTS=tail_dots)
    return aot_signature_of(gdn_verify_chunk_kernel, types, const, num_warps, num_stages, unaligned=("a", "b", "z"))


def signature_gdn_commit_deltas(HK: int, HV: int, DK: int, DV: int, KW: int, T: int, *, BV: int,
                                num_warps: int = 4, num_stages: int = 2, act: str = "*bf16", state: str = "*fp32",
                                dot_prec: str = "tf32"):
    """gdn_commit_deltas_kernel for verify widths of the token tile token_tile(T). Grid (DV // BV, HV, B)."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    types = dict(state=state, slots="*i32", accepted="*i32", dk="*fp32", du="*fp32", dg="*fp32", window=act,
                 keep_x=act, T="i32")
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, KW=KW, WP=triton.next_power_of_2(KW - 1), BV=BV, TP=token_tile(T),
                 DOT_PREC=dot_prec)
    return aot_signature_of(gdn_commit_deltas_kernel, types, const, num_warps, num_stages)
