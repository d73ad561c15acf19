"""Paged attention of packed varlen queries over each sequence's cache: chunked prefill over a cached prefix and
speculative verify (K draft tokens per sequence) are the same math, so one kernel serves both (decode too).

Queries of sequence b are rows cu_q[b] .. cu_q[b+1]-1 of q; query i sits at position ctx - q_len + i
(ctx = context_lens[b], which already counts the new tokens) and sees keys 0 .. its position.

Tiling: a program takes BLOCK_Q = BLOCK_M // G consecutive queries of one sequence times the G = Hq / Hkv query
heads of one kv head, folded into the BLOCK_M rows of one tile (row r: query r // G, head r % G), so that each K/V
tile is read once per GQA group and a verify of K = 2..5 tokens still fills a 16-row tile. It loops over the keys
BLOCK_N at a time through the block table with an online softmax: first the keys every row of the tile sees (no
mask), then the last tiles up to the tile's last query with the causal mask.

Grid (T // BLOCK_Q + B, Hkv), from shapes alone (no device read, CUDA-graph capturable): sequence b owns the
query tiles cu_q[b] // BLOCK_Q + b .. (at least cdiv(q_len_b, BLOCK_Q) of them); a program finds its sequence by
binary search over cu_q and exits if its tile is past the sequence's queries.

Defined behaviour: a query that sees no key (position < 0, i.e. a padding sequence with context_lens[b] <= 0)
gets zeros; context_lens[b] is clamped to max_blocks_per_seq · block_size so that no length reads past the
sequence's block-table row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.attention.triton_common import (KV_TYPES, Q_TYPES, aot_signature, check_cache, check_rows,
                                                       clamped_context, default_block_n, dot_in_fp32, kv_row_offsets,
                                                       load_scales, softmax_step)
from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch


@triton.jit
def find_sequence(cu_q, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence whose query tiles hold `tile`: the last b with cu_q[b] // BLOCK_Q + b <= tile (tile starts
    grow by at least one per sequence, so the search is over a strictly increasing list)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def paged_prefill_kernel(
    q, stride_qt, stride_qh,             # [T, HQ, D] packed queries (unit last stride)
    k_cache, v_cache,                    # [num_blocks, BS, HKV, D] contiguous; bf16 / fp16 / fp32 / fp8e4nv
    k_scale, v_scale,                    # fp32 [1] (read only if IS_FP8)
    block_tables, stride_bt, max_blocks,  # int32 [B, max_blocks] (row stride stride_bt)
    context_lens,                        # int32 [B]: cached prefix + this step's tokens
    cu_q, num_seqs,                      # int32 [B + 1] query row offsets; B
    gate, stride_gt, stride_gh,          # [T, HQ, D] sigmoid output gate (HAS_GATE)
    out, stride_ot, stride_oh,           # [T, HQ, D]
    sm_scale,                            # fp32 softmax scale
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_M: tl.constexpr,               # rows of a tile: BLOCK_M // G queries × G heads (power of two >= 16, >= G)
    BLOCK_N: tl.constexpr,               # keys per tile (power of two >= 16; independent of BS)
    IS_FP8: tl.constexpr, DOT_F32: tl.constexpr, HAS_GATE: tl.constexpr,
):
    G: tl.constexpr = HQ // HKV
    BLOCK_Q: tl.constexpr = BLOCK_M // G
    tile, kh = tl.program_id(0), tl.program_id(1)
    b = find_sequence(cu_q, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_q + b)
    q_len = tl.load(cu_q + b + 1) - q_start
    q_first = (tile - (q_start // BLOCK_Q + b)) * BLOCK_Q  # the tile's first query, within the sequence
    if q_first >= q_len:
        return
    ctx = clamped_context(context_lens, b, max_blocks, BS)

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    qi = q_first + r // G  # query index within the sequence, per row
    head = kh * G + r % G
    row_ok = (r < BLOCK_Q * G) & (qi < q_len)
    pos = ctx - q_len + qi  # absolute position, per row: sees keys 0 .. pos
    row_tok = (q_start + qi).to(tl.int64)
    cd = tl.float32 if DOT_F32 else q.dtype.element_ty  # the dots' operand dtype
    qt = tl.load(q + row_tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=row_ok[:, None],
                 other=0.0).to(cd)  # qt: [BLOCK_M, D]
    qk_scale, vs = load_scales(k_scale, v_scale, sm_scale, IS_FP8)
    dot_prec: tl.constexpr = "ieee" if DOT_F32 else "tf32"

    first_pos = ctx - q_len + q_first  # the smallest position in the tile: every row sees keys 0 .. first_pos
    last_pos = ctx - q_len + tl.minimum(q_first + BLOCK_Q, q_len) - 1  # the largest (<= ctx - 1)
    full_end = tl.maximum(first_pos + 1, 0) // BLOCK_N * BLOCK_N  # whole tiles every row sees
    kv_end = tl.maximum(last_pos + 1, 0)

    bt_row = block_tables + b.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, full_end, BLOCK_N):  # keys below every row's position: no mask, no bounds check
        kv = kv_row_offsets(bt_row, start + tl.arange(0, BLOCK_N), None, kh, HKV, D, BS)[:, None] + d[None, :]
        k = tl.load(k_cache + kv).to(cd)
        s = tl.dot(qt, tl.trans(k), input_precision=dot_prec) * qk_scale  # s: [BLOCK_M, BLOCK_N]
        m_i, l_i, acc = softmax_step(s, tl.load(v_cache + kv).to(cd), m_i, l_i, acc, DOT_F32)
    for start in range(full_end, kv_end, BLOCK_N):  # the causal edge: at most cdiv(BLOCK_Q, BLOCK_N) + 1 tiles
        tok = start + tl.arange(0, BLOCK_N)
        valid = tok < kv_end
        kv = kv_row_offsets(bt_row, tok, valid, kh, HKV, D, BS)[:, None] + d[None, :]
        k = tl.load(k_cache + kv, mask=valid[:, None], other=0.0).to(cd)
        s = tl.dot(qt, tl.trans(k), input_precision=dot_prec) * qk_scale
        s = tl.where(tok[None, :] <= pos[:, None], s, float("-inf"))  # tok <= pos < kv_end: in the context
        v = tl.load(v_cache + kv, mask=valid[:, None], other=0.0).to(cd)
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, DOT_F32)

    o = acc * (vs / tl.where(l_i > 0, l_i, 1.0))[:, None]  # rows that saw no key: 0
    if HAS_GATE:
        z = tl.load(gate + row_tok[:, None] * stride_gt + head[:, None] * stride_gh + d[None, :],
                    mask=row_ok[:, None], other=0.0).to(tl.float32)
        o = o * tl.sigmoid(z)
    tl.store(out + row_tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             o.to(out.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------- launcher

def prefill_config(max_q_len: int, group: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for queries of up to max_q_len tokens per sequence and G = group heads per
    kv head: the smallest of 16 / 32 / 64 rows that holds max_q_len × G (a verify of K = 2..5 at G 4-8 takes
    16 or 32; prefill chunks take 64), never fewer rows than G."""
    rows = max(16, min(64, triton.next_power_of_2(max(max_q_len, 1) * group)))
    block_m = max(rows, triton.next_power_of_2(group))
    block_n = default_block_n(head_dim)
    return block_m, block_n, 8 if head_dim > 128 and block_m >= 64 else 4


def launch_paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                         v_scale: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                         cu_q: torch.Tensor, sm_scale: float, gate: torch.Tensor | None = None,
                         max_q_len: int | None = None, out: torch.Tensor | None = None, block_m: int | None = None,
                         block_n: int | None = None, num_warps: int | None = None, aot=None) -> torch.Tensor:
    """Causal attention of packed varlen queries over the paged cache (reference: reference.paged_attention).

    q: [T, Hq, D] bf16 / fp16 / fp32, T = the query rows (cu_q[-1] <= T; rows past it are not written); unit last
    stride, free token and head strides. Their K/V rows are already in the cache.
    k_cache, v_cache: [num_blocks, block_size, Hkv, D] contiguous, bf16 / fp16 / fp32 / float8_e4m3fn.
    k_scale, v_scale: fp32 [1] on the device (read only for an FP8 cache).
    block_tables: int32 [>= B, max_blocks_per_seq]; context_lens: int32 [B] (cached prefix + new tokens;
    <= 0: padding, output zeros); cu_q: int32 [B + 1], cu_q[0] = 0, non-decreasing.
    gate: [T, Hq, D] or None: out = attn · sigmoid(gate).
    max_q_len: the longest q_len (a host int the scheduler knows; it only picks the tile, any upper bound is
    correct); None takes T. out: [T, Hq, D] (q's dtype if allocated here).
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    No host-device synchronisation: capturable in a CUDA graph with a static out. Returns out.
    """
    T, Hq, D = q.shape
    B = cu_q.shape[0] - 1
    check_rows(q, "q", T, Hq, D)
    check_cache(k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, Hq, D, B)
    if cu_q.dtype != torch.int32 or cu_q.dim() != 1 or cu_q.stride(0) != 1:  # read at cu_q + b
        raise ValueError(f"cu_q must be contiguous int32 [B + 1], got {cu_q.dtype} {tuple(cu_q.shape)} "
                         f"strides {cu_q.stride()}")
    _, BS, Hkv, _ = k_cache.shape
    if out is None:
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    check_rows(out, "out", T, Hq, D)
    if gate is not None:
        check_rows(gate, "gate", T, Hq, D)
    if T == 0 or B == 0:
        return out
    G = Hq // Hkv
    bm, bn, warps = prefill_config(T if max_q_len is None else max_q_len, G, D)
    block_m, block_n, num_warps = block_m or bm, block_n or bn, num_warps or warps
    if block_m < G or block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= max(16, G = {G}), got {block_m}")
    g = gate if gate is not None else out
    # q, gate and out may be views (free token and head strides: gate is a column slice of the fused qkv output)
    launch(paged_prefill_kernel, (T // (block_m // G) + B, Hkv),
           (q, q.stride(0), q.stride(1), k_cache, v_cache, k_scale, v_scale, block_tables, block_tables.stride(0),
            block_tables.shape[1], context_lens, cu_q, B, g, g.stride(0), g.stride(1), out, out.stride(0),
            out.stride(1), float(sm_scale)),
           dict(HQ=Hq, HKV=Hkv, D=D, BS=BS, BLOCK_M=block_m, BLOCK_N=block_n,
                IS_FP8=k_cache.dtype == torch.float8_e4m3fn, DOT_F32=dot_in_fp32(q.dtype, k_cache.dtype),
                HAS_GATE=gate is not None),
           num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=("q", "gate", "out"))
    return out


# ---------------------------------------------------------------------------------------------- AOT

def signature_paged_prefill(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                            kv_dtype: torch.dtype, q_dtype: torch.dtype = torch.bfloat16, has_gate: bool = False,
                            block_m: int = 64, block_n: int | None = None, num_warps: int | None = None,
                            num_stages: int = JIT_DEFAULT_STAGES):
    """AotSignature of paged_prefill_kernel for one model's attention shape; grid (T // (BLOCK_M // G) + B, Hkv).
    The defaults are what launch_paged_prefill launches for block_m (build_engine/recorded_kernels.py records
    the engine's instances from it)."""
    P, F, PI, i32 = Q_TYPES[q_dtype], "*fp32", "*i32", "i32"
    types = dict(q=P, stride_qt=i32, stride_qh=i32, k_cache=KV_TYPES[kv_dtype], v_cache=KV_TYPES[kv_dtype],
                 k_scale=F, v_scale=F, block_tables=PI, stride_bt=i32, max_blocks=i32, context_lens=PI, cu_q=PI,
                 num_seqs=i32, gate=P, stride_gt=i32, stride_gh=i32, out=P, stride_ot=i32, stride_oh=i32,
                 sm_scale="fp32")
    const = dict(HQ=num_q_heads, HKV=num_kv_heads, D=head_dim, BS=block_size, BLOCK_M=block_m,
                 BLOCK_N=block_n or default_block_n(head_dim), IS_FP8=kv_dtype == torch.float8_e4m3fn,
                 DOT_F32=dot_in_fp32(q_dtype, kv_dtype), HAS_GATE=has_gate)
    warps = num_warps or (8 if head_dim > 128 and block_m >= 64 else 4)
    return aot_signature(paged_prefill_kernel, types, const, warps, num_stages)
