"""Chunked prefill, stage 3 of 3: the outputs, every chunk in parallel.

With the state H entering the chunk (stage 2), the token updates Δ (stage 2), G the chunk-local
cumulative log2 decay and the inverse norms rq (times 1/sqrt(DK)) and rk (stage 1):

    o = diag(rq ⊙ 2^G) (q H) + (q kᵀ ⊙ rq rkᵀ ⊙ causal ⊙ 2^(G_i - G_j)) Δ        [BT, BV]

from the raw q, k tiles (their norms are applied to the products). One program per (chunk, value head,
Dv tile): grid (NT, HV, DV // BV); or with HEADS per (chunk, key head, Dv tile), grid (NT, HK, DV // BV), q kᵀ
computed once for the key head's HV / HK value heads and the loop over them software-pipelined.
"""

import triton
import triton.language as tl


@triton.jit
def chunk_out_kernel(
    q, stride_q,          # [total_T, HK*DK] queries after the conv (raw); row stride in elements
    k, stride_k,          # [total_T, HK*DK] keys after the conv (raw)
    G, RQ, RK,            # stage 1: fp32 [total_T, HV], [total_T, HK], [total_T, HK]
    cu_seqlens,           # int32 [N+1]
    chunks,               # int32 [NT, 2] (sequence, chunk index), sequence-major: row i is chunk i of H
    H,                    # [NT, HV, DK, DV] stage 2: the state entering each chunk
    dv,                   # [total_T, HV, DV] stage 2: the token updates Δ
    o, stride_o,          # [total_T, HV*DV] out
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr,  # "tf32" (bf16 operands ignore it) or "ieee" for fp32 activations
    HEADS: tl.constexpr = False,  # grid (NT, HK, DV // BV): a program serves the HV / HK value heads of its key head
    HEAD_STAGES: tl.constexpr = 2,  # with HEADS: software-pipeline depth of the loop over those value heads
):
    i, hp, iv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = tl.load(chunks + 2 * i)
    c = tl.load(chunks + 2 * i + 1)
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    T = tl.load(cu_seqlens + seq + 1) - bos
    R: tl.constexpr = HV // HK
    kh = hp if HEADS else hp // R
    ot = tl.arange(0, BT)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    t0 = c * BT
    r0 = bos + t0
    valid = t0 + ot < T
    vm = valid[:, None]
    dt = q.dtype.element_ty
    qr = tl.load(q + r0 * stride_q + kh * DK + ot[:, None] * stride_q + ck[None, :], mask=vm, other=0.0).to(dt)
    kr = tl.load(k + r0 * stride_k + kh * DK + ot[:, None] * stride_k + ck[None, :], mask=vm, other=0.0).to(dt)
    rq = tl.load(RQ + (r0 + ot) * HK + kh, mask=valid, other=0.0)
    rk = tl.load(RK + (r0 + ot) * HK + kh, mask=valid, other=0.0)
    qk = tl.dot(qr, tl.trans(kr), input_precision=DOT_PREC) * (rq[:, None] * rk[None, :])  # [BT, BT], every head's
    keep = (ot[:, None] >= ot[None, :]) & vm
    if HEADS:  # q kᵀ once for the key head's R value heads
        for r in tl.range(0, R, num_stages=HEAD_STAGES):
            _head_out(qr, qk, keep, rq, G, H, dv, o, stride_o, i, r0, kh * R + r, ot, ck, cv, valid, vm, HV, DK, DV,
                      DOT_PREC)
    else:
        _head_out(qr, qk, keep, rq, G, H, dv, o, stride_o, i, r0, hp, ot, ck, cv, valid, vm, HV, DK, DV, DOT_PREC)


@triton.jit
def _head_out(qr, qk, keep, rq, G, H, dv, o, stride_o, i, r0, h, ot, ck, cv, valid, vm, HV: tl.constexpr,
              DK: tl.constexpr, DV: tl.constexpr, DOT_PREC: tl.constexpr):
    """Value head h's output tile [BT, BV] of chunk i from the normalised q kᵀ of its key head."""
    dt = qr.dtype
    g = tl.load(G + (r0 + ot) * HV + h, mask=valid, other=0.0)
    hs = tl.load(H + (i.to(tl.int64) * HV + h) * (DK * DV) + ck[:, None] * DV + cv[None, :]).to(dt)
    delta = tl.load(dv + (r0 * HV + h) * DV + ot[:, None] * (HV * DV) + cv[None, :], mask=vm, other=0.0).to(dt)
    # min(., 0): entries above the diagonal are masked; clamping keeps exp2 finite there
    att = tl.where(keep, qk * tl.exp2(tl.minimum(g[:, None] - g[None, :], 0.0)), 0.0)
    out = tl.dot(qr, hs, input_precision=DOT_PREC) * (rq * tl.exp2(g))[:, None]
    out += tl.dot(att.to(dt), delta, input_precision=DOT_PREC)
    tl.store(o + r0 * stride_o + h * DV + ot[:, None] * stride_o + cv[None, :], out.to(o.dtype.element_ty), mask=vm)
