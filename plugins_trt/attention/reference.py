"""Causal grouped-query attention over cached keys and values (references, fp32 math): a contiguous per-sequence
cache (`attention_with_cache`, the eager layer's) and the paged cache of runtime/kv_cache.py (`paged_attention`,
the reference of triton_decode.py and triton_prefill.py)."""

import torch

from atlas.runtime.kv_cache import LayerKV, gather_kv


def attention_with_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                         scale: float) -> torch.Tensor:
    """Attention of T new queries over the cache holding the prefix and the new tokens.

    q: [T, Hq, D] for absolute positions start .. start+T-1.
    k_cache, v_cache: [S, Hkv, D] with S >= start + T; rows past start+T are ignored.
    Query at position p sees keys 0..p (causal). Hq must be a multiple of Hkv (GQA).
    Returns [T, Hq, D] in q's dtype.
    """
    T, Hq, D = q.shape
    S = start + T
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    k = k_cache[:S].float().repeat_interleave(group, dim=1)  # k: [S, Hq, D]
    v = v_cache[:S].float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale  # scores: [Hq, T, S]
    q_pos = torch.arange(start, S)[:, None]
    k_pos = torch.arange(S)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hts,shd->thd", probs, v).to(q.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                    v_scale: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                    cu_q: torch.Tensor, sm_scale: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """Causal GQA attention of packed varlen queries over a paged KV cache (runtime/kv_cache.py layout), fp32 math.

    q: [T, Hq, D], T = cu_q[-1]; rows cu_q[b] .. cu_q[b+1]-1 are sequence b's q_len_b queries.
    k_cache, v_cache: [num_blocks, block_size, Hkv, D] (bf16 / fp16 / fp32, or float8_e4m3fn read as stored · scale).
    k_scale, v_scale: fp32 [1]. block_tables: int32 [B, max_blocks_per_seq]. context_lens, cu_q: int32 [B], [B + 1].
    gate: [T, Hq, D] or None: out = attn · sigmoid(gate) (the Qwen3-Next / Qwen3.5 output gate), in fp32 before the
    cast (the layer in runtime/layers/attention.py rounds attn to q's dtype first: a last-bit difference).
    Query i of sequence b sits at position p = context_lens[b] - q_len_b + i and sees keys 0 .. p. A query that
    sees no key (p < 0: a padding sequence with context_lens[b] <= 0) gets zeros. Decode is q_len_b = 1.
    Returns [T, Hq, D] in q's dtype.
    """
    T, Hq, D = q.shape
    layer = LayerKV(k_cache, v_cache, k_scale, v_scale)
    group = Hq // k_cache.shape[2]
    out = torch.zeros(T, Hq, D, dtype=torch.float32, device=q.device)
    cu, lens = cu_q.tolist(), context_lens.tolist()
    for b, ctx in enumerate(lens):
        q_b = q[cu[b]:cu[b + 1]].float()  # q_b: [q_len, Hq, D]
        q_len = q_b.shape[0]
        if q_len == 0 or ctx <= 0:
            continue
        k, v = gather_kv(layer, block_tables[b], ctx)  # k, v: [ctx, Hkv, D] fp32
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q_b, k) * sm_scale  # scores: [Hq, q_len, ctx]
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
        visible = torch.arange(ctx, device=q.device)[None, :] <= q_pos  # visible: [q_len, ctx]
        scores = scores.masked_fill(~visible, float("-inf"))
        # rows that see no key (q_pos < 0) would be softmax(all -inf) = NaN: they stay zero
        seen = visible.any(dim=1)
        probs = scores[:, seen].softmax(dim=-1)
        out[cu[b]:cu[b + 1]][seen] = torch.einsum("hts,shd->thd", probs, v)
    if gate is not None:
        out = out * torch.sigmoid(gate.float())
    return out.to(q.dtype)
