"""Scratch buffers shared by every launch of a kernel on a device (counters, partial sums), grown on demand.

A CUDA graph records the addresses its kernels read, so a buffer a graph was captured with must outlive the graph:
a buffer outgrown by a larger launch is kept (OUTGROWN), never freed. Counters stay valid in an old buffer because
every launch leaves its counters as it found them (zero).
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch

OUTGROWN: list[torch.Tensor] = []
"""Buffers replaced by larger ones, kept for the graphs captured with them."""


def grown(cache: dict, key: Hashable, count: int, make: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """cache[key], replaced by make(count) when it holds fewer than `count` elements (the old one kept in OUTGROWN).

    The first call for a key (or a larger count) allocates: make it outside CUDA graph capture (a warm-up launch),
    where a zeroing runs at once rather than at the graph's first replay."""
    buf = cache.get(key)
    if buf is None or buf.numel() < count:
        if buf is not None:
            OUTGROWN.append(buf)
        buf = cache[key] = make(count)
    return buf
