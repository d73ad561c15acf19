"""Which KV blocks each sequence holds: plain Python bookkeeping over the pool of runtime/kv_cache.py.

Policy only: nothing here touches a tensor or a device. The model runner turns `block_table` and `slots` into the
int32 tensors the kernels read (block_tables, slot_mapping).

Invariant: a sequence holding n tokens owns exactly ceil(n / block_size) blocks, its token at position p lives in
slot `blocks[p // block_size] * block_size + p % block_size`, and no block is owned twice or both owned and free.
"""

from __future__ import annotations

from collections import deque


class OutOfBlocks(RuntimeError):
    """The pool cannot hold the tokens asked for; the scheduler preempts or waits (nothing was allocated)."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._blocks: dict[int, list[int]] = {}
        """sequence id -> its blocks, in position order."""
        self._lengths: dict[int, int] = {}
        """sequence id -> tokens held."""

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq_id: int, new_tokens: int) -> int:
        """Blocks `extend(seq_id, new_tokens)` would take from the pool."""
        have = len(self._blocks.get(seq_id, ()))
        return max(0, -(-(self._lengths.get(seq_id, 0) + new_tokens) // self.block_size) - have)

    def can_extend(self, seq_id: int, new_tokens: int) -> bool:
        return self.blocks_needed(seq_id, new_tokens) <= len(self._free)

    def extend(self, seq_id: int, new_tokens: int) -> list[int]:
        """Make room for `new_tokens` more tokens of `seq_id` (a new id starts empty); returns their slots.

        All or nothing: raises OutOfBlocks without changing anything when the pool is short.
        """
        if new_tokens < 0:
            raise ValueError(f"new_tokens must be >= 0, got {new_tokens}")
        need = self.blocks_needed(seq_id, new_tokens)
        if need > len(self._free):
            raise OutOfBlocks(f"sequence {seq_id} needs {need} more KV blocks of {self.block_size} tokens, "
                              f"{len(self._free)} are free")
        blocks = self._blocks.setdefault(seq_id, [])
        blocks.extend(self._free.popleft() for _ in range(need))
        start = self._lengths.get(seq_id, 0)
        self._lengths[seq_id] = start + new_tokens
        return self.slots(seq_id, start, new_tokens)

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep the first `length` tokens (rejected draft tokens); blocks past them go back to the pool."""
        if not 0 <= length <= self._lengths[seq_id]:
            raise ValueError(f"cannot truncate sequence {seq_id} of {self._lengths[seq_id]} tokens to {length}")
        keep = -(-length // self.block_size)
        blocks = self._blocks[seq_id]
        self._free.extend(blocks[keep:])
        del blocks[keep:]
        self._lengths[seq_id] = length

    def free(self, seq_id: int) -> None:
        """Return every block of a finished or preempted sequence."""
        self._free.extend(self._blocks.pop(seq_id, ()))
        self._lengths.pop(seq_id, None)

    def length(self, seq_id: int) -> int:
        return self._lengths.get(seq_id, 0)

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._blocks.get(seq_id, ()))

    def slots(self, seq_id: int, start: int, count: int) -> list[int]:
        """Slots of positions start .. start+count-1 (all must be held)."""
        if start < 0 or start + count > self._lengths.get(seq_id, 0):
            raise ValueError(f"positions {start}..{start + count - 1} are not held by sequence {seq_id}")
        bs, blocks = self.block_size, self._blocks.get(seq_id, [])
        return [blocks[p // bs] * bs + p % bs for p in range(start, start + count)]
