"""Causal grouped-query attention over a sequence's cached prefix (reference, fp32 math)."""

import torch


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
