"""Paged attention decode (one query token per sequence) with the context split across programs (flash-decoding).

Stage 1, `paged_decode_kernel`, grid (B, Hkv, num_splits): program (b, kh, s) takes the G = Hq / Hkv query
heads of kv head kh as the rows of one tile (padded to at least 16 rows for tl.dot), so each K/V tile is read
once per GQA group, and runs an online softmax over its share of the context: split s covers tokens
[s · per, min((s + 1) · per, ctx)), per = cdiv(cdiv(ctx, num_splits), BLOCK_N) · BLOCK_N, so that every split
but the last of a sequence holds whole tiles and splits past the context are empty. It writes the split's
normalised output and log2-sum-exp to the workspace.

Stage 2, `paged_decode_reduce_kernel`, grid (B, Hq): combines the non-empty splits (their count comes from ctx
by the same formula, so empty splits need not be written), applies the optional sigmoid gate and writes out.
With num_splits == 1 stage 1 writes the output itself (DIRECT) and stage 2 is not launched.

COMBINE (given int32 counters [B, Hkv], zero): one launch instead of two. Each split program, its partials
written, adds one to its (sequence, kv head) counter; the program that brings it to num_splits combines that kv
head's G query heads as stage 2 would (the same operations in the same order: the same bits) and sets the counter
back to zero for the next launch (a CUDA graph replays it). The partials are read past L1 (.cg), after a CTA barrier
and an acquire-release atomic, the pattern of gluon_streamk's tile counters.

ROPE (launch_paged_decode_rope): q is the fused projection's raw row [q | gate? | k | v]; each program QK-norms and
rotates its query heads and its kv head's new K (triton_rope's helpers, one head at a time: qkv_rope_kernel's
bits), and quantizes the new K / V as the cache stores them. The split holding the new position (context_lens[b] - 1)
writes them at slot_mapping[b]; that position's K / V come from registers in every program, so no program reads the
cache row being written. One launch fewer a decode step's attention layer than qkv_rope then decode.

Defined behaviour for padding: a sequence with context_lens[b] <= 0 gets zeros (its block-table row is not read).
context_lens[b] is also clamped to max_blocks_per_seq · block_size so a bad length cannot read past its row.

num_splits is a launch argument, not derived from the lengths on the device: a CUDA graph captured for a batch
bucket fixes it (and the workspace); `default_num_splits` picks one from the largest context the block table
can hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.attention.splits import default_num_splits  # noqa: F401 (launch_paged_decode's default)
from atlas.plugins_trt.attention.triton_common import (KV_TYPES, Q_TYPES, aot_signature, check_cache, check_rows,
                                                       clamped_context, default_block_n, dot_in_fp32, kv_row_offsets,
                                                       load_scales, softmax_step)
from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter
from atlas.plugins_trt.rope.triton_rope import check_qkv_rope, normed_rotated, quantized_kv, rope_factors


@triton.jit
def split_size(ctx, num_splits, BLOCK_N: tl.constexpr):
    """Tokens per split for a context of ctx (>= 0) tokens: whole tiles, at least one."""
    per = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    return tl.maximum(per, BLOCK_N)


@triton.jit
def _prefetch_l2(k_cache, v_cache, bt_row, lo, hi, kh, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """prefetch.global.L2 of the K and V rows of tokens lo .. hi (kv head kh), every 128-byte line: nothing is held
    in registers and nothing is read back here, so it is safe before the PDL wait (L2 is coherent: a row the kernel
    before writes meanwhile is read as written). Tokens past hi in a tile prefetch block 0's rows (kv_row_offsets),
    which exist. sm_90 PTX (GPU launches only: the interpreter runs no PDL kernel)."""
    ES: tl.constexpr = k_cache.dtype.element_ty.primitive_bitwidth // 8
    LINES: tl.constexpr = (D * ES + 127) // 128
    line = tl.arange(0, LINES) * (128 // ES)
    for start in range(lo, hi, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        rows = kv_row_offsets(bt_row, tok, tok < hi, kh, HKV, D, BS)[:, None] + line[None, :]
        _prefetch_lines(k_cache + rows)
        _prefetch_lines(v_cache + rows)


@triton.jit
def _prefetch_lines(ptrs):
    """prefetch.global.L2 of the line at each of ptrs (the PTX instruction, one per element)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs.to(tl.int64)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def paged_decode_kernel(
    q, stride_qb, stride_qh,             # [B, HQ, D] (unit last stride)
    k_cache, v_cache,                    # [num_blocks, BS, HKV, D] contiguous; bf16 / fp16 / fp32 / fp8e4nv
    k_scale, v_scale,                    # fp32 [1] (read only if IS_FP8)
    block_tables, stride_bt, max_blocks,  # int32 [B, max_blocks] (row stride stride_bt)
    context_lens,                        # int32 [B]
    gate, stride_gb, stride_gh,          # [B, HQ, D] sigmoid output gate (read only if HAS_GATE and DIRECT)
    out, stride_ob, stride_oh,           # [B, HQ, D] (written only if DIRECT)
    part_o, part_lse,                    # fp32 [B, HQ, num_splits, D], [B, HQ, num_splits] (written unless DIRECT)
    counters,                            # int32 [B, HKV], zero before and after (read only if COMBINE)
    num_splits,                          # splits per sequence (the grid's third dim)
    sm_scale,                            # fp32 softmax scale (usually D ** -0.5)
    positions, inv_freq, q_norm, k_norm, slot_mapping, eps,  # ROPE's (triton_rope.qkv_rope_kernel's); else unread
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_N: tl.constexpr,               # keys per tile (any power of two >= 16; independent of BS)
    GP: tl.constexpr,                    # rows of the query tile: next power of two >= max(G, 16)
    IS_FP8: tl.constexpr, DOT_F32: tl.constexpr, HAS_GATE: tl.constexpr, DIRECT: tl.constexpr,
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
    COMBINE: tl.constexpr = False,  # the last split program of each (b, kh) combines (module docstring)
    ROPE: tl.constexpr = False,     # q is the fused projection's raw q: QK-norm, RoPE, K/V write here (docstring)
    R: tl.constexpr = 0, K_COL: tl.constexpr = 0, QK_NORM: tl.constexpr = False, NORM_OFFSET: tl.constexpr = 0,
):
    b, kh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = HQ // HKV
    # the step's inputs (lengths, block tables) are written before the step's first kernel: read before the PDL wait
    ctx = clamped_context(context_lens, b, max_blocks, BS)
    per = split_size(ctx, num_splits, BLOCK_N)
    lo = split * per
    hi = tl.minimum(lo + per, ctx)
    bt_row = block_tables + b.to(tl.int64) * stride_bt
    if PDL:  # this split's K / V rows into L2 while the kernel before still runs
        _prefetch_l2(k_cache, v_cache, bt_row, lo, hi, kh, HKV, D, BS, BLOCK_N)
    pdl_enter(PDL)

    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    head = kh * G + g
    head_ok = g < G
    cd = tl.float32 if DOT_F32 else q.dtype.element_ty  # the dots' operand dtype
    dot_prec: tl.constexpr = "ieee" if DOT_F32 else "tf32"
    if ROPE:  # q, and this kv head's new K / V, as qkv_rope_kernel computes them
        row = q + b.to(tl.int64) * stride_qb
        is_rot, partner, cos, sin_signed = rope_factors(positions, b, inv_freq, d, R)
        qf = tl.zeros([GP, D], tl.float32)
        for i in tl.static_range(G):  # one head at a time: qkv_rope_kernel's operations, so its bits
            qi = normed_rotated(row + (kh * G + i) * stride_qh, q_norm, d, d < D, partner, is_rot, cos, sin_signed,
                                eps, D, QK_NORM, NORM_OFFSET)
            qf = tl.where(g[:, None] == i, qi.to(q.dtype.element_ty).to(tl.float32)[None, :], qf)
        qt = qf.to(cd)  # qt: [GP, D]
        new_k = quantized_kv(k_cache, k_scale, normed_rotated(row + K_COL + kh * D, k_norm, d, d < D, partner, is_rot,
                                                             cos, sin_signed, eps, D, QK_NORM, NORM_OFFSET))
        new_v = quantized_kv(v_cache, v_scale, tl.load(row + K_COL + (HKV + kh) * D + d).to(tl.float32))
        new_pos = ctx - 1  # the new token's position; no cache row of it is read in this launch
        slot = tl.load(slot_mapping + b).to(tl.int64)
        if (lo <= new_pos) & (new_pos < hi) & (slot >= 0):  # the split that holds it writes it
            tl.store(k_cache + slot * (HKV * D) + kh * D + d, new_k)
            tl.store(v_cache + slot * (HKV * D) + kh * D + d, new_v)
        new_k = new_k.to(cd)
        new_v = new_v.to(cd)
    else:
        qt = tl.load(q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + d[None, :],
                     mask=head_ok[:, None], other=0.0).to(cd)  # qt: [GP, D]
    qk_scale, vs = load_scales(k_scale, v_scale, sm_scale, IS_FP8)

    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        valid = tok < hi
        rows = kv_row_offsets(bt_row, tok, valid, kh, HKV, D, BS)
        kv = rows[:, None] + d[None, :]  # kv: [BLOCK_N, D]
        if ROPE:  # the new token's K / V from registers, the same values its cache row gets
            is_new = (tok == new_pos)[:, None]
            k = tl.load(k_cache + kv, mask=valid[:, None] & ~is_new, other=0.0).to(cd)
            k = tl.where(is_new, new_k[None, :], k)
        else:
            k = tl.load(k_cache + kv, mask=valid[:, None], other=0.0).to(cd)
        s = tl.dot(qt, tl.trans(k), input_precision=dot_prec) * qk_scale  # s: [GP, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        if ROPE:
            v = tl.load(v_cache + kv, mask=valid[:, None] & ~is_new, other=0.0).to(cd)
            v = tl.where(is_new, new_v[None, :], v)
        else:
            v = tl.load(v_cache + kv, mask=valid[:, None], other=0.0).to(cd)
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, DOT_F32)

    # an empty split (or a padding sequence) has l = 0 and acc = 0: its output is 0, never 0 / 0
    o = acc * (vs / tl.where(l_i > 0, l_i, 1.0))[:, None]
    if DIRECT:
        _gated_store(o, gate, stride_gb, stride_gh, out, stride_ob, stride_oh, b, head, head_ok, D, HAS_GATE)
    else:
        part = (b.to(tl.int64) * HQ + head) * num_splits + split  # part: [GP]
        keep = head_ok & (lo < hi)  # empty splits write nothing: stage 2 reads only the non-empty ones
        tl.store(part_o + part[:, None] * D + d[None, :], o, mask=keep[:, None])
        tl.store(part_lse + part, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), mask=keep)
        if COMBINE:
            tl.debug_barrier()  # every thread's partials are written before the count
            count = counters + b.to(tl.int64) * HKV + kh
            if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                # the G query heads in GR rows (not GP: no dot here), so more splits' rows fit in flight
                GR: tl.constexpr = 1 if G == 1 else (2 if G == 2 else (4 if G <= 4 else (8 if G <= 8 else GP)))
                hc = kh * G + tl.arange(0, GR)
                hc_ok = tl.arange(0, GR) < G
                oc = _combine(part_o, part_lse, (b.to(tl.int64) * HQ + hc) * num_splits, hc_ok, ctx, num_splits,
                             D, GR, BLOCK_N, ".cg")
                _gated_store(oc, gate, stride_gb, stride_gh, out, stride_ob, stride_oh, b, hc, hc_ok, D, HAS_GATE)
                tl.store(count, 0)


@triton.jit
def _combine(part_o, part_lse, base, row_ok, ctx, num_splits, D: tl.constexpr, R: tl.constexpr,
             BLOCK_N: tl.constexpr, CACHE: tl.constexpr):
    """The rows' (query heads') outputs from their non-empty splits' partials: rows base[r] * D .. of part_o and
    base[r] .. of part_lse, a split apart (base: [R]); fp32 [R, D]. Two passes: the largest lse, then
    sum_s o_s 2^(lse_s - max) / sum_s 2^(lse_s - max), each in split order with elementwise operations only, so every
    caller (whatever its rows, warps and layouts) gets the same bits. Each pass reads SC splits at once (unrolled,
    no load waits for another's use): one L2 round trip for up to SC splits, not one a split."""
    SC: tl.constexpr = max(1, min(16, 8192 // (R * D)))  # o rows in flight: at most 64 fp32 registers a thread
    d = tl.arange(0, D)
    n = tl.cdiv(ctx, split_size(ctx, num_splits, BLOCK_N))  # non-empty splits: each has a finite lse
    m = tl.full([R], float("-inf"), tl.float32)
    for c in range(0, n, 32):  # lse alone: 32 splits in flight (default_num_splits' most)
        for i in tl.static_range(32):
            m = tl.maximum(m, tl.load(part_lse + base + c + i, mask=row_ok & (c + i < n), other=float("-inf"),
                                      cache_modifier=CACHE))
    m = tl.where(row_ok & (n > 0), m, 0.0)  # rows not combined: no -inf - -inf below
    total = tl.zeros([R, 1], tl.float32)
    acc = tl.zeros([R, D], tl.float32)
    for c in range(0, n, SC):
        for i in tl.static_range(SC):
            ok = (row_ok & (c + i < n))[:, None]
            # [R, 1], not [R]: loaded in o's row layout, so no layout conversion (a CTA barrier) waits for it
            lse = tl.load(part_lse + (base + c + i)[:, None], mask=ok, other=float("-inf"), cache_modifier=CACHE)
            o = tl.load(part_o + (base + c + i)[:, None] * D + d[None, :], mask=ok, other=0.0, cache_modifier=CACHE)
            w = tl.exp2(lse - m[:, None])  # 0 where the split is past n
            acc += o * w
            total += w
    return acc / tl.where(total > 0, total, 1.0)


@triton.jit
def _gated_store(o, gate, stride_gb, stride_gh, out, stride_ob, stride_oh, b, head, row_ok, D: tl.constexpr,
                 HAS_GATE: tl.constexpr):
    """out[b, head] = o (· sigmoid(gate[b, head]) with HAS_GATE) for the rows row_ok; o fp32 [R, D]."""
    d = tl.arange(0, D)
    if HAS_GATE:
        o = o * tl.sigmoid(tl.load(gate + b.to(tl.int64) * stride_gb + head[:, None] * stride_gh + d[None, :],
                                   mask=row_ok[:, None], other=0.0).to(tl.float32))
    tl.store(out + b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + d[None, :], o.to(out.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def paged_decode_reduce_kernel(
    part_o, part_lse,                    # fp32 [B, HQ, num_splits, D], [B, HQ, num_splits] from stage 1
    context_lens, max_blocks,            # int32 [B]; block-table width (the same clamp as stage 1)
    gate, stride_gb, stride_gh,          # [B, HQ, D] (HAS_GATE)
    out, stride_ob, stride_oh,           # [B, HQ, D]
    num_splits,
    HQ: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr,
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    pdl_enter(PDL)
    b, h = tl.program_id(0), tl.program_id(1)
    ctx = clamped_context(context_lens, b, max_blocks, BS)
    head = h + tl.arange(0, 1)  # one row: _combine and _gated_store work on rows of query heads
    row_ok = head < HQ
    o = _combine(part_o, part_lse, (b.to(tl.int64) * HQ + head) * num_splits, row_ok, ctx, num_splits, D, 1,
                 BLOCK_N, "")
    _gated_store(o, gate, stride_gb, stride_gh, out, stride_ob, stride_oh, b, head, row_ok, D, HAS_GATE)


# ---------------------------------------------------------------------------------------------- launcher

def decode_workspace(batch: int, num_q_heads: int, head_dim: int, num_splits: int,
                     device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's partial outputs fp32 [batch, Hq, num_splits, D] and log2-sum-exps fp32 [batch, Hq, num_splits]
    (uninitialised: the kernels read only what they wrote). One pair sized for the largest bucket serves smaller
    ones (launch_paged_decode takes any buffers with enough elements)."""
    return (torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=device),
            torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=device))


def launch_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                        v_scale: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                        sm_scale: float, gate: torch.Tensor | None = None, num_splits: int | None = None,
                        out: torch.Tensor | None = None,
                        workspace: tuple[torch.Tensor, torch.Tensor] | None = None, block_n: int | None = None,
                        num_warps: int = 4, aot=None, pdl: bool = False,
                        counters: torch.Tensor | None = None, rope: dict | None = None) -> torch.Tensor:
    """Decode attention for B sequences, one query each, over the paged cache (reference:
    reference.paged_attention with cu_q = 0, 1, .., B).

    q: [B, Hq, D] bf16 / fp16 / fp32 at position context_lens[b] - 1 (its own K/V already written); unit last
    stride, free token and head strides.
    k_cache, v_cache: [num_blocks, block_size, Hkv, D] contiguous, bf16 / fp16 / fp32 / float8_e4m3fn.
    k_scale, v_scale: fp32 [1] on the device (read only for an FP8 cache).
    block_tables: int32 [>= B, max_blocks_per_seq]; context_lens: int32 [B] (<= 0: padding, output zeros).
    gate: [B, Hq, D] or None: out = attn · sigmoid(gate).
    num_splits: splits per sequence; None picks default_num_splits from max_blocks_per_seq · block_size.
    out: [B, Hq, D] (q's dtype if allocated here). workspace: (partial out, partial lse), fp32 with at least
    B·Hq·num_splits·D and B·Hq·num_splits elements (decode_workspace); allocated here if None and num_splits > 1.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    counters: int32 with at least B·Hkv elements, zero (and left zero), or None: with num_splits > 1 the last split
    program of each (sequence, kv head) combines them (COMBINE: one launch, not two; the same bits).
    rope: launch_paged_decode_rope's (q is then the raw q of the fused projection, a view of it).
    No host-device synchronisation: capturable in a CUDA graph with static out and workspace (and counters).
    Returns out.
    """
    B, Hq, D = q.shape
    check_rows(q, "q", B, Hq, D)
    check_cache(k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, Hq, D, B)
    _, BS, Hkv, _ = k_cache.shape
    if out is None:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    check_rows(out, "out", B, Hq, D)
    if gate is not None:
        check_rows(gate, "gate", B, Hq, D)
    if B == 0:
        return out
    max_blocks = block_tables.shape[1]
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
        num_splits = default_num_splits(B, Hkv, max_blocks * BS, sms)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    direct = num_splits == 1
    if direct:
        part_o = part_lse = out  # not touched with DIRECT
    else:
        part_o, part_lse = workspace or decode_workspace(B, Hq, D, num_splits, q.device)
        if part_o.dtype != torch.float32 or part_lse.dtype != torch.float32 or \
                part_o.numel() < B * Hq * num_splits * D or part_lse.numel() < B * Hq * num_splits:
            raise ValueError(f"workspace must be fp32 buffers of at least {B * Hq * num_splits * D} and "
                             f"{B * Hq * num_splits} elements (decode_workspace({B}, {Hq}, {D}, {num_splits}))")
    combine = counters is not None and not direct
    if combine and (counters.dtype != torch.int32 or counters.numel() < B * Hkv):
        raise ValueError(f"counters must be int32 with at least {B * Hkv} elements (zero), got {counters.dtype} "
                         f"{list(counters.shape)}")
    block_n = block_n or default_block_n(D)
    g = gate if gate is not None else out
    # q, gate and out may be views (free token and head strides: gate is a column slice of the fused qkv output);
    # with DIRECT the unused workspace arguments are `out` too
    views = ("q", "gate", "out") + (("part_o", "part_lse") if direct else ())
    # without rope its arguments are not read: context_lens and k_scale stand in for them
    r = rope or dict(positions=context_lens, inv_freq=k_scale, q_norm=k_scale, k_norm=k_scale,
                     slot_mapping=context_lens, eps=0.0, const={})
    launch(paged_decode_kernel, (B, Hkv, num_splits),
           (q, q.stride(0), q.stride(1), k_cache, v_cache, k_scale, v_scale, block_tables, block_tables.stride(0),
            max_blocks, context_lens, g, g.stride(0), g.stride(1), out, out.stride(0), out.stride(1), part_o,
            part_lse, counters if combine else context_lens, num_splits, float(sm_scale), r["positions"],
            r["inv_freq"], r["q_norm"], r["k_norm"], r["slot_mapping"], float(r["eps"])),
           dict(HQ=Hq, HKV=Hkv, D=D, BS=BS, BLOCK_N=block_n, GP=max(16, triton.next_power_of_2(Hq // Hkv)),
                IS_FP8=k_cache.dtype == torch.float8_e4m3fn, DOT_F32=dot_in_fp32(q.dtype, k_cache.dtype),
                HAS_GATE=gate is not None, DIRECT=direct, PDL=pdl, COMBINE=combine, **rope_constexprs(r["const"])),
           num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=views)
    if not direct and not combine:
        launch(paged_decode_reduce_kernel, (B, Hq),
               (part_o, part_lse, context_lens, max_blocks, g, g.stride(0), g.stride(1), out, out.stride(0),
                out.stride(1), num_splits),
               dict(HQ=Hq, D=D, BS=BS, BLOCK_N=block_n, HAS_GATE=gate is not None, PDL=pdl),
               1, JIT_DEFAULT_STAGES, aot=aot, unaligned=("gate", "out"))
    return out


def rope_constexprs(const: dict) -> dict:
    """paged_decode_kernel's ROPE constexprs: off (the defaults) or as launch_paged_decode_rope sets them."""
    return dict(ROPE=False, R=0, K_COL=0, QK_NORM=False, NORM_OFFSET=0) | const


def launch_paged_decode_rope(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                             slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             k_scale: torch.Tensor, v_scale: torch.Tensor, block_tables: torch.Tensor,
                             context_lens: torch.Tensor, sm_scale: float, num_heads: int, has_gate: bool = False,
                             q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                             eps: float = 1e-6, norm_offset: float = 0.0, **decode) -> torch.Tensor:
    """launch_qkv_rope then launch_paged_decode in one launch (decode steps: one token a sequence, at position
    context_lens[b] - 1): each program QK-norms and rotates its query heads from the fused projection's row and its
    kv head's new K / V (qkv_rope_kernel's operations, one head at a time: the same bits); the split that holds the
    new position writes K / V into the cache at slot_mapping[b] (negative, or a padding row: not written) and every
    program reads that token's K / V from registers, never from the cache row being written. So the output and the
    cache are the two launches' to the bit. Arguments: launch_qkv_rope's (qkv [B, q | gate? | k | v], ...), then
    launch_paged_decode's; `decode` takes launch_paged_decode's keywords (gate excepted: with has_gate it is
    qkv's gate columns). Returns out [B, Hq, D]."""
    if "gate" in decode:
        raise TypeError("launch_paged_decode_rope takes the gate from qkv (has_gate=True), not as an argument")
    B, D = qkv.shape[0], k_cache.shape[3]
    R, k_col = check_qkv_rope(qkv, positions, inv_freq, k_cache, v_cache, slot_mapping, num_heads, has_gate, q_norm,
                              k_norm, norm_offset)
    q = qkv[:, :num_heads * D].view(B, num_heads, D)  # raw: rotated in the kernel
    gate = qkv[:, num_heads * D:2 * num_heads * D].view(B, num_heads, D) if has_gate else None
    qk_norm = q_norm is not None
    rope = dict(positions=positions, inv_freq=inv_freq, q_norm=q_norm if qk_norm else inv_freq,
                k_norm=k_norm if qk_norm else inv_freq, slot_mapping=slot_mapping, eps=eps,
                const=dict(ROPE=True, R=R, K_COL=k_col, QK_NORM=qk_norm, NORM_OFFSET=int(norm_offset)))
    return launch_paged_decode(q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, sm_scale,
                               gate=gate, rope=rope, **decode)


# ---------------------------------------------------------------------------------------------- AOT

def signature_paged_decode(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                           kv_dtype: torch.dtype, q_dtype: torch.dtype = torch.bfloat16, has_gate: bool = False,
                           direct: bool = False, block_n: int | None = None, num_warps: int = 4,
                           num_stages: int = JIT_DEFAULT_STAGES, pdl: bool = False, combine: bool = False,
                           rope: dict | None = None):
    """AotSignature of stage 1 for one model's attention shape; grid (B, Hkv, num_splits). The defaults are what
    launch_paged_decode launches (the engine's instances are recorded from it: build_engine/recorded_kernels.py).
    rope: launch_paged_decode_rope's constexprs (R, K_COL, QK_NORM, NORM_OFFSET; QK-norm weights in q_dtype)."""
    P, F, PI, i32 = Q_TYPES[q_dtype], "*fp32", "*i32", "i32"
    types = dict(q=P, stride_qb=i32, stride_qh=i32, k_cache=KV_TYPES[kv_dtype], v_cache=KV_TYPES[kv_dtype],
                 k_scale=F, v_scale=F, block_tables=PI, stride_bt=i32, max_blocks=i32, context_lens=PI, gate=P,
                 stride_gb=i32, stride_gh=i32, out=P, stride_ob=i32, stride_oh=i32, part_o=F, part_lse=F,
                 counters=PI, num_splits=i32, sm_scale="fp32", positions=PI, inv_freq=F,
                 q_norm=P if rope and rope["QK_NORM"] else F, k_norm=P if rope and rope["QK_NORM"] else F,
                 slot_mapping=PI, eps="fp32")
    const = dict(HQ=num_q_heads, HKV=num_kv_heads, D=head_dim, BS=block_size,
                 BLOCK_N=block_n or default_block_n(head_dim),
                 GP=max(16, triton.next_power_of_2(num_q_heads // num_kv_heads)),
                 IS_FP8=kv_dtype == torch.float8_e4m3fn, DOT_F32=dot_in_fp32(q_dtype, kv_dtype), HAS_GATE=has_gate,
                 DIRECT=direct, PDL=pdl, COMBINE=combine and not direct,
                 **rope_constexprs(dict(rope, ROPE=True) if rope else {}))
    return aot_signature(paged_decode_kernel, types, const, num_warps, num_stages)


def signature_paged_decode_reduce(num_q_heads: int, head_dim: int, block_size: int,
                                  q_dtype: torch.dtype = torch.bfloat16, has_gate: bool = False,
                                  block_n: int | None = None, pdl: bool = False):
    """AotSignature of stage 2 (block_n must be stage 1's); grid (B, Hq)."""
    P, F, PI, i32 = Q_TYPES[q_dtype], "*fp32", "*i32", "i32"
    types = dict(part_o=F, part_lse=F, context_lens=PI, max_blocks=i32, gate=P, stride_gb=i32, stride_gh=i32, out=P,
                 stride_ob=i32, stride_oh=i32, num_splits=i32)
    const = dict(HQ=num_q_heads, D=head_dim, BS=block_size, BLOCK_N=block_n or default_block_n(head_dim),
                 HAS_GATE=has_gate, PDL=pdl)
    return aot_signature(paged_decode_reduce_kernel, types, const, num_warps=1, num_stages=JIT_DEFAULT_STAGES)
