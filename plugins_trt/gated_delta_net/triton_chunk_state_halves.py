"""Chunked prefill, stage 2 in flash-linear-attention's shape (an option of `launch_chunk_gdn`, untimed).

Same inputs and outputs as `triton_chunk.chunk_state_kernel`; differs only in how the work is laid out, after fla
0.6.0's `chunk_gated_delta_rule_fwd_kernel_h_blockdim64` (793 us against Atlas's 1252 us for one 32768-token
sequence at Qwen3.5-27B's shape on the H200, tools/results/gdn_stages_32768.json):
  * the state [DK, BV] is held as two [64, BV] halves, and w and k are loaded 64 columns at a time, so fewer
    operand registers are live at once (the single-tile kernel sits at 255 registers on sm_90);
  * keys are loaded transposed ([64, BT] through the pointers), and each half's update is accumulated by its dot:
    S_half = k_halfᵀ (Δ ⊙ decay) + exp(g_last) S_half in one tl.dot.
"""

import triton
import triton.language as tl


@triton.jit
def chunk_state_halves_kernel(
    k, stride_k, w, u, G, RK, cu_seqlens, slots, chunk_first, state, H, dv, snaps, snap_first, snap_every,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, SNAPSHOT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """Grid (DV // BV, HV, N), parameters as chunk_state_kernel's; DK == 128."""
    tl.static_assert(DK == 128, "two 64-row halves of the state")
    iv, h, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + n).to(tl.int64)
    if slot < 0:
        return
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    T = tl.load(cu_seqlens + n + 1) - bos
    c0 = tl.load(chunk_first + n).to(tl.int64)
    kh = h // (HV // HK)
    ot = tl.arange(0, BT)
    c64 = tl.arange(0, 64)
    cv = iv * BV + tl.arange(0, BV)
    top = c64[:, None] * DV + cv[None, :]  # offsets of the [64, BV] top half in a head's state; bottom: + 64 * DV
    base = (slot * HV + h) * (DK * DV)
    S1 = tl.load(state + base + top).to(tl.float32)
    S2 = tl.load(state + base + 64 * DV + top).to(tl.float32)
    dt = k.dtype.element_ty
    w_rows = ot[:, None] * (HV * DK) + c64[None, :]
    u_rows = ot[:, None] * (HV * DV) + cv[None, :]
    kt_cols = c64[:, None] + ot[None, :] * stride_k  # keys transposed: [64, BT]
    for c in range(tl.cdiv(T, BT)):
        t0 = c * BT
        r0 = bos + t0
        valid = t0 + ot < T
        hb = H + ((c0 + c) * HV + h) * (DK * DV)
        tl.store(hb + top, S1.to(H.dtype.element_ty))
        tl.store(hb + 64 * DV + top, S2.to(H.dtype.element_ty))
        wb = w + (r0 * HV + h) * DK
        w1 = tl.load(wb + w_rows, mask=valid[:, None], other=0.0).to(dt)
        acc = tl.dot(w1, S1.to(dt), input_precision=DOT_PREC)
        w2 = tl.load(wb + 64 + w_rows, mask=valid[:, None], other=0.0).to(dt)
        acc = tl.dot(w2, S2.to(dt), acc, input_precision=DOT_PREC)
        delta = tl.load(u + (r0 * HV + h) * DV + u_rows, mask=valid[:, None], other=0.0).to(tl.float32) - acc
        tl.store(dv + (r0 * HV + h) * DV + u_rows, delta.to(dv.dtype.element_ty), mask=valid[:, None])
        rk = tl.load(RK + (r0 + ot) * HK + kh, mask=valid, other=0.0)
        g = tl.load(G + (r0 + ot) * HV + h, mask=valid, other=0.0)
        g_last = tl.load(G + (bos + tl.minimum(t0 + BT, T) - 1) * HV + h)
        dd = (delta * (tl.where(valid, tl.exp2(g_last - g), 0.0) * rk)[:, None]).to(dt)
        eg = tl.exp2(g_last)
        kb = k + r0 * stride_k + kh * DK
        k1 = tl.load(kb + kt_cols, mask=valid[None, :], other=0.0).to(dt)
        S1 = tl.dot(k1, dd, S1 * eg, input_precision=DOT_PREC)
        k2 = tl.load(kb + 64 + kt_cols, mask=valid[None, :], other=0.0).to(dt)
        S2 = tl.dot(k2, dd, S2 * eg, input_precision=DOT_PREC)
        if SNAPSHOT:
            end = t0 + BT
            if (end % snap_every == 0) & (end <= T):
                idx = (tl.load(snap_first + n) + end // snap_every - 1).to(tl.int64)
                sb = snaps + (idx * HV + h) * (DK * DV)
                tl.store(sb + top, S1.to(snaps.dtype.element_ty))
                tl.store(sb + 64 * DV + top, S2.to(snaps.dtype.element_ty))
    tl.debug_barrier()  # every thread has read its part of the initial state before it is overwritten
    tl.store(state + base + top, S1.to(state.dtype.element_ty))
    tl.store(state + base + 64 * DV + top, S2.to(state.dtype.element_ty))
