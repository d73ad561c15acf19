"""How many splits of the context the decode attention takes (triton_decode.py's flash-decoding stage 1), without
importing Triton: the runner's options and the build CLI read it on machines that never compile a kernel."""

ATTN_SPLIT_TOKENS = 64
"""default_num_splits' shortest split (RunnerOptions.attn_split_tokens, atlas-build --attn-split-tokens): a key tile
(64 tokens) a split where the occupancy cap allows. Measured 2026-12-07 (tenth session, H100, 8B nvfp4, 768-token
context, tools/results/splitab_h100.json against decode_h100.json): 365.5 -> 387.5 tok/s at batch 1 (12 splits, 3
before), 2360 -> 2389 at batch 8 (5, 3 before); batch 32 and long contexts take the same splits either way."""
LEGACY_ATTN_SPLIT_TOKENS = 256
"""What engines built before the option existed (no attn_split_tokens in their manifest) decode with."""


def default_num_splits(batch: int, num_kv_heads: int, max_context: int, num_sms: int = 132,
                       min_split_tokens: int = ATTN_SPLIT_TOKENS, max_splits: int = 32) -> int:
    """Splits per sequence: enough (sequence, kv head, split) programs for about two waves over num_sms SMs,
    but no split shorter than min_split_tokens of max_context (each split costs a partial write and read),
    between 1 and max_splits."""
    by_length = -(-max(max_context, 1) // min_split_tokens)
    by_occupancy = -(-2 * num_sms // max(batch * num_kv_heads, 1))
    return max(1, min(by_length, by_occupancy, max_splits))
