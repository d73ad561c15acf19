"""Token embedding lookup (reference)."""

import torch


def embedding(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows of `table` for `ids`: table [V, H], ids int32 / int64 [T] -> [T, H] in the table's dtype.

    An id outside [0, V) (a padding token of a fixed-size batch) gives a zero row instead of an error or a
    wrapped-around row, so that padded CUDA-graph batches never read out of bounds.
    """
    V = table.shape[0]
    valid = (ids >= 0) & (ids < V)
    out = table[ids.clamp(0, V - 1).long()]
    return out.masked_fill(~valid[:, None], 0)
