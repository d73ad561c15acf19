"""Gated DeltaNet verify, rollback mode "deltas", in two launches: the per-token inputs first, then the recurrence.

The fused token-by-token kernel (triton_recurrent.py) recomputes the conv, SiLU and L2 norm of a key head's q
and k in each of its R·DV/BV programs (R = HV/HK value heads per key head) on every token, and keeps the conv
window of all its channels in registers. Here a first launch computes them once:

    gdn_verify_prep_kernel, grid (HK + HV, B): program p < HK: q̂, k̂ of key head p for the T tokens (conv + SiLU
    + L2 norm, q̂ scaled by 1/sqrt(DK)); program HK + h: conv + SiLU of value head h's channels, g and beta.
    It also keeps the raw inputs for the commit's window slide.

and the recurrence (gdn_recurrent_prepped_kernel, grid (DV // BV, HV, B)) reads q̂_t, k̂_t, v_t, g_t, beta_t:
per token two [DK] loads, one [BV] load and the delta step, nothing else. k̂ and g go straight to the
rollback buffers (the commit, triton_verify_chunk.gdn_commit_deltas_kernel, reads them); q̂, v and beta are
scratch buffers of the rollback.
"""

from __future__ import annotations

import triton
import triton.language as tl

from atlas.plugins_trt.gated_delta_net.triton_common import gated_norm_vec, gdn_gate, l2norm_rows
from atlas.plugins_trt.gated_delta_net.triton_verify_chunk import _conv_tile, launch_verify_chunk, token_tile


@triton.jit
def gdn_verify_prep_kernel(
    x, stride_x,          # [B*T, C] raw conv inputs [q | k | v]; row b·T + t
    a, b, stride_ab,      # [B*T, HV] raw gate inputs, one row stride
    conv_w, conv_b,       # [C, 4], [C] (conv_b read only if HAS_CONV_BIAS)
    A_log, dt_bias,       # [HV]
    window,               # [num_slots, C, 3] conv windows (read only)
    slots,                # int32 [B]; negative = padding, skipped
    qn, kn,               # fp32 [B*T, HK, DK] out: q̂ (scaled), k̂
    vc,                   # [B*T, HV*DV] out: silu(conv(v)), rounded to x's dtype
    g_out, beta_out,      # fp32 [B*T, HV] out
    keep_x, keep_ab,      # [B*T, C], [B*T, 2·HV] out: copies of x and [a | b]
    T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, TP: tl.constexpr,
    HAS_CONV_BIAS: tl.constexpr,
    TAIL: tl.constexpr = False,  # the first T - 1 tokens in the TP tile, the last one as a 1-row tile (T - 1 <= TP)
):
    p, bi = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + bi).to(tl.int64)
    if slot < 0:
        return
    _prep_rows(x, stride_x, a, b, stride_ab, conv_w, conv_b, A_log, dt_bias, window, slot, qn, kn, vc, g_out,
               beta_out, keep_x, keep_ab, T, T - TAIL, p, bi, tl.arange(0, TP), HK, HV, DK, DV, TP, HAS_CONV_BIAS)
    if TAIL:
        _prep_rows(x, stride_x, a, b, stride_ab, conv_w, conv_b, A_log, dt_bias, window, slot, qn, kn, vc, g_out,
                   beta_out, keep_x, keep_ab, T, T, p, bi, T - 1 + tl.arange(0, 1), HK, HV, DK, DV, 1, HAS_CONV_BIAS)


@triton.jit
def _prep_rows(x, stride_x, a, b, stride_ab, conv_w, conv_b, A_log, dt_bias, window, slot, qn, kn, vc, g_out,
               beta_out, keep_x, keep_ab, T, bound, p, bi, t, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
               DV: tl.constexpr, TP: tl.constexpr, HAS_CONV_BIAS: tl.constexpr):
    """gdn_verify_prep_kernel's work for the tokens t [TP] (those < bound) of sequence bi (T tokens), program p."""
    C: tl.constexpr = 2 * HK * DK + HV * DV
    valid = t < bound
    row0 = (bi * T).to(tl.int64)
    rows = row0 + t
    xs = x + row0 * stride_x
    win = window + slot * (C * 3)
    if p < HK:
        ck = tl.arange(0, DK)
        m2 = valid[:, None]
        for part in tl.static_range(2):  # 0: q, 1: k
            ch = part * HK * DK + p * DK + ck
            y = l2norm_rows(_conv_tile(xs, stride_x, win, conv_w, conv_b, ch, t, bound, TP, DK, HAS_CONV_BIAS))
            if part == 0:
                tl.store(qn + (rows[:, None] * HK + p) * DK + ck[None, :], y * (1.0 / tl.sqrt(DK * 1.0)), mask=m2)
            else:
                tl.store(kn + (rows[:, None] * HK + p) * DK + ck[None, :], y, mask=m2)
            tl.store(keep_x + rows[:, None] * C + ch[None, :], tl.load(xs + t[:, None] * stride_x + ch[None, :],
                                                                       mask=m2), mask=m2)
    else:
        h = p - HK
        cv = tl.arange(0, DV)
        ch = 2 * HK * DK + h * DV + cv
        m2 = valid[:, None]
        v = _conv_tile(xs, stride_x, win, conv_w, conv_b, ch, t, bound, TP, DV, HAS_CONV_BIAS)
        tl.store(vc + rows[:, None] * (HV * DV) + h * DV + cv[None, :], v.to(vc.dtype.element_ty), mask=m2)
        tl.store(keep_x + rows[:, None] * C + ch[None, :], tl.load(xs + t[:, None] * stride_x + ch[None, :], mask=m2),
                 mask=m2)
        a_t = tl.load(a + rows * stride_ab + h, mask=valid, other=0.0)
        b_t = tl.load(b + rows * stride_ab + h, mask=valid, other=0.0)
        g, beta = gdn_gate(a_t, b_t, -tl.exp(tl.load(A_log + h).to(tl.float32)), tl.load(dt_bias + h).to(tl.float32))
        tl.store(g_out + rows * HV + h, g, mask=valid)
        tl.store(beta_out + rows * HV + h, beta, mask=valid)
        tl.store(keep_ab + rows * (2 * HV) + h, a_t, mask=valid)
        tl.store(keep_ab + rows * (2 * HV) + HV + h, b_t, mask=valid)


@triton.jit
def gdn_recurrent_prepped_kernel(
    qn, kn,               # fp32 [B*T, HK, DK] q̂ (scaled), k̂ from gdn_verify_prep_kernel
    vc,                   # [B*T, HV*DV] silu(conv(v))
    g_in, beta_in,        # fp32 [B*T, HV]
    state,                # [num_slots, HV, DK, DV] (read only)
    slots,                # int32 [B]; negative = padding, skipped
    o, stride_o,          # [B*T, HV*DV] outputs
    z, stride_z, norm_w,  # [B*T, HV*DV] output gate and [DV] norm weight (FUSE_NORM)
    du,                   # fp32 [B*T, HV, DV] out: u_t of every token
    T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    FUSE_NORM: tl.constexpr, NORM_EPS: tl.constexpr,
):
    """Grid (DV // BV, HV, B): S <- exp(g) S; u = beta (v - Sᵀk̂); S <- S + k̂ uᵀ; o = Sᵀq̂ per token, from the slot's
    state, which stays untouched."""
    iv, h, bi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if FUSE_NORM:
        tl.static_assert(BV == DV, "FUSE_NORM needs the whole head in one program (BV == DV)")
    slot = tl.load(slots + bi).to(tl.int64)
    if slot < 0:
        return
    kh = h // (HV // HK)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    row0 = (bi * T).to(tl.int64)
    S = tl.load(state + (slot * HV + h) * (DK * DV) + ck[:, None] * DV + cv[None, :]).to(tl.float32)  # [DK, BV]
    # token t + 1's inputs are loaded while token t runs
    qp, kp, vp = qn + kh * DK + ck, kn + kh * DK + ck, vc + h * DV + cv
    q_n, k_n, v_n = tl.load(qp + row0 * (HK * DK)), tl.load(kp + row0 * (HK * DK)), tl.load(vp + row0 * (HV * DV))
    g_n, b_n = tl.load(g_in + row0 * HV + h), tl.load(beta_in + row0 * HV + h)
    for t in range(T):
        row = row0 + t
        q, k, v, g, beta = q_n, k_n, v_n.to(tl.float32), g_n, b_n
        more = t + 1 < T
        q_n = tl.load(qp + (row + 1) * (HK * DK), mask=more, other=0.0)
        k_n = tl.load(kp + (row + 1) * (HK * DK), mask=more, other=0.0)
        v_n = tl.load(vp + (row + 1) * (HV * DV), mask=more, other=0.0)
        g_n = tl.load(g_in + (row + 1) * HV + h, mask=more, other=0.0)
        b_n = tl.load(beta_in + (row + 1) * HV + h, mask=more, other=0.0)
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))  # u: [BV]
        S = S + k[:, None] * u[None, :]
        tl.store(du + (row * HV + h) * DV + cv, u)
        out = tl.sum(S * q[:, None], axis=0)  # out: [BV]
        if FUSE_NORM:
            out = gated_norm_vec(out, z + row * stride_z + h * DV, norm_w, cv, DV, NORM_EPS, o.dtype.element_ty)
        tl.store(o + row * stride_o + h * DV + cv, out.to(o.dtype.element_ty))


# ---------------------------------------------------------------------------------------------- launchers

def launch_verify_prepped(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, state, slots, *,
                          num_k_heads: int, T: int, o, keep_x, keep_ab, dk, du, dg, qn, vc, beta, z=None,
                          norm_weight=None, norm_eps: float = 1e-6, BV: int | None = None,
                          num_warps: int | None = None, prep_warps: int | None = None, chunk: bool = False,
                          tail: bool = False, dot_prec: str = "tf32", solve_inverse: bool = False,
                          tail_dots: bool = False, prep_tail: bool = False) -> None:
    """Both launches; x [B*T, C], a/b [B*T, HV] (one row stride), o/z [B*T, HV*DV]; dk/qn [B*T, HK, DK],
    du [B*T, HV, DV], vc [B*T, HV*DV], dg/beta [B*T, HV]. chunk: the second launch is the chunk-form kernel
    (triton_verify_chunk, PREPPED) instead of the token-by-token recurrence; with tail, its tile holds the first
    T - 1 tokens and the last runs as one step after it (tail_dots: see launch_verify_chunk); solve_inverse: its token
    solve by products; prep_tail: the first launch with its last token as a 1-row tile (launch_verify_prep)."""
    _, HV, DK, DV = state.shape
    C, KW = conv_weight.shape
    HK = num_k_heads
    if KW != 4:
        raise ValueError(f"the verify kernels are written for conv width 4, got {KW}")
    if a.stride(0) != b.stride(0):
        raise ValueError(f"a and b need one row stride, got {a.stride(0)} and {b.stride(0)}")
    B = slots.numel()
    launch_verify_prep(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, slots, num_k_heads=HK, HV=HV, T=T,
                       keep_x=keep_x, keep_ab=keep_ab, dk=dk, dg=dg, qn=qn, vc=vc, beta=beta, num_warps=prep_warps,
                       tail=prep_tail)
    if chunk:
        launch_verify_chunk(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, state, slots, num_k_heads=HK,
                            T=T, o=o, keep_x=keep_x, keep_ab=keep_ab, dk=dk, du=du, dg=dg, z=z,
                            norm_weight=norm_weight, norm_eps=norm_eps, BV=BV, num_warps=num_warps,
                            dot_prec=dot_prec, prepped=(qn, vc, beta), tail=tail, solve_inverse=solve_inverse,
                            tail_dots=tail_dots)
        return
    fuse_norm = z is not None
    BV, num_warps = prepped_config(DV, fuse_norm, BV, num_warps)
    gdn_recurrent_prepped_kernel[(DV // BV, HV, B)](
        qn, dk, vc, dg, beta, state, slots, o, o.stride(0), z if fuse_norm else o, z.stride(0) if fuse_norm else 0,
        norm_weight if fuse_norm else state, du, T, HK=HK, HV=HV, DK=DK, DV=DV, BV=BV, FUSE_NORM=fuse_norm,
        NORM_EPS=float(norm_eps), num_warps=num_warps)


def launch_verify_prep(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, slots, *, num_k_heads: int, HV: int,
                       T: int, keep_x, keep_ab, dk, dg, qn, vc, beta, num_warps: int | None = None,
                       tail: bool = False) -> None:
    """The first launch alone (gdn_verify_prep_kernel, grid (HK + HV, B)): q̂, k̂ into qn / dk, silu(conv(v)) into
    vc, g / beta into dg / beta, the raw inputs into keep_x / keep_ab; qn [B*T, HK*DK] and vc [B*T, HV*DV].
    tail: the last token as a 1-row tile after a token_tile(T - 1) tile (T 17: 16 + 1 rows at 4 warps, instead of a
    32-row tile at 8)."""
    HK = num_k_heads
    DK, DV = qn.shape[1] // HK, vc.shape[1] // HV
    TP = token_tile(T - 1 if tail else T)
    gdn_verify_prep_kernel[(HK + HV, slots.numel())](
        x, x.stride(0), a, b, a.stride(0), conv_weight, conv_bias if conv_bias is not None else conv_weight,
        A_log, dt_bias, window, slots, qn, dk, vc, dg, beta, keep_x, keep_ab, T,
        HK=HK, HV=HV, DK=DK, DV=DV, TP=TP, HAS_CONV_BIAS=conv_bias is not None, TAIL=tail,
        num_warps=num_warps or prep_config(TP))


def prepped_config(DV: int, fuse_norm: bool, BV: int | None = None,
                   num_warps: int | None = None) -> tuple[int, int]:
    """The recurrence's default (BV, num_warps)."""
    if fuse_norm:
        return DV, num_warps or 8
    return BV or min(DV, 16), num_warps or 1


def prep_config(T: int) -> int:
    """The first launch's num_warps: its [TP, 128] conv tiles compile without spilling at 4 warps for TP 16
    (196 registers) and 8 for TP 32 (194; 4 warps spill)."""
    return 8 if token_tile(T) > 16 else 4


def signature_gdn_verify_prep(HK: int, HV: int, DK: int, DV: int, T: int, *, num_warps: int | None = None,
                              num_stages: int = 2, act: str = "*bf16", has_conv_bias: bool = False,
                              tail: bool = False):
    """gdn_verify_prep_kernel for widths of the token tile token_tile(T). Grid (HK + HV, B)."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(x=P, stride_x=i32, a=P, b=P, stride_ab=i32, conv_w=P, conv_b=P, A_log=F, dt_bias=F, window=P,
                 slots=I, qn=F, kn=F, vc=P, g_out=F, beta_out=F, keep_x=P, keep_ab=P, T=i32)
    TP = token_tile(T - 1 if tail else T)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, TP=TP, HAS_CONV_BIAS=has_conv_bias, TAIL=tail)
    return aot_signature_of(gdn_verify_prep_kernel, types, const, num_warps or prep_config(TP), num_stages,
                            unaligned=("a", "b"))


def signature_gdn_recurrent_prepped(HK: int, HV: int, DK: int, DV: int, *, BV: int, num_warps: int,
                                    num_stages: int = 2, norm_eps: float = 1e-6, fuse_norm: bool = True,
                                    act: str = "*bf16", state: str = "*fp32"):
    """gdn_recurrent_prepped_kernel; T stays a run-time int. Grid (DV // BV, HV, B)."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, i32 = act, "*fp32", "i32"
    types = dict(qn=F, kn=F, vc=P, g_in=F, beta_in=F, state=state, slots="*i32", o=P, stride_o=i32, z=P,
                 stride_z=i32, norm_w=F, du=F, T=i32)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BV=BV, FUSE_NORM=fuse_norm, NORM_EPS=float(norm_eps))
    return aot_signature_of(gdn_recurrent_prepped_kernel, types, const, num_warps, num_stages, unaligned=("z",))
