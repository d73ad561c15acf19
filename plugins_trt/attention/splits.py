"""How many splits of the context the decode attention takes (triton_decode.py's flash-decoding stage 1), without
importing Triton: the runner's options and the build CLI read it on machines that never compile a kernel."""

ATTN_SPLIT_TOKENS = 256
"""default_num_splits' shortest split (RunnerOptions.attn_split_tokens, atlas-build --attn-split-tokens)."""


def default_num_splits(batch: int, num_kv_heads: int, max_context: int, num_sms: int = 132,
                       min_split_tokens: int = ATTN_SPLIT_TOKENS, max_splits: int = 32) -> int:
    """Splits per sequence: enough (sequence, kv head, split) programs for about two waves over num_sms SMs,
    but no split shorter than min_split_tokens of max_context (each split costs a partial write and read),
    between 1 and max_splits."""
    by_length = -(-max(max_context, 1) // min_split_tokens)
    by_occupancy = -(-2 * num_sms // max(batch * num_kv_heads, 1))
    return max(1, min(by_length, by_occupancy, max_splits))
