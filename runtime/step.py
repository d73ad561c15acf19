"""One forward step over a batch of sequences: what the scheduler asks for, and the int32 tensors the kernels read.

The scheduler says which sequences run and which new tokens each brings (`StepBatch`: a prefill chunk, one decode
token, or the K tokens of a verify). `StepInputs.build` reserves their KV slots in the block manager and lays the
step out in the paged-KV contract of runtime/kv_cache.py (packed tokens, cu_q, context_lens, block_tables,
slot_mapping), padded to a batch bucket for a captured graph: padding sequences bring q_len tokens each with slot -1
(nothing written), context length 0 and state slot -1 (no state read or written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from atlas.runtime.block_manager import BlockManager, OutOfBlocks


@dataclass(frozen=True)
class StepBatch:
    seq_ids: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]
    """New token ids of each sequence (at least one each), in position order after its cached tokens."""
    state_slots: tuple[int, ...] = ()
    """Slot of each sequence in the recurrent-state pool (hybrid models); empty for attention-only models."""

    def __post_init__(self):
        if len(self.seq_ids) != len(self.tokens) or not self.seq_ids:
            raise ValueError("a step needs one token list per sequence and at least one sequence")
        if len(set(self.seq_ids)) != len(self.seq_ids):
            raise ValueError(f"a sequence appears twice in one step: {self.seq_ids}")
        if any(len(t) == 0 for t in self.tokens):
            raise ValueError("every sequence of a step brings at least one token")
        if self.state_slots and len(self.state_slots) != len(self.seq_ids):
            raise ValueError("state_slots needs one slot per sequence")

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


FIELDS = ("input_ids", "positions", "slot_mapping", "cu_q", "context_lens", "block_tables", "state_slots",
          "last_rows")


@dataclass
class StepInputs:
    """The step in tensors (int32, on the model's device). T = packed tokens, B = sequences (with padding)."""

    input_ids: torch.Tensor
    """[T] token ids, sequence after sequence."""
    positions: torch.Tensor
    """[T] absolute position of each token."""
    slot_mapping: torch.Tensor
    """[T] KV slot each token's K / V goes to; -1 for padding."""
    cu_q: torch.Tensor
    """[B + 1] sequence b's tokens are rows cu_q[b] .. cu_q[b+1]-1."""
    context_lens: torch.Tensor
    """[B] tokens in each sequence's cache after this step (0 for padding)."""
    block_tables: torch.Tensor
    """[B, max_blocks] each sequence's blocks (0 past its own, never read)."""
    state_slots: torch.Tensor
    """[B] recurrent-state slot of each sequence; -1 for padding (and for attention-only models)."""
    last_rows: torch.Tensor
    """[B] the row of each sequence's last token (whose logits sample its next token)."""
    num_seqs: int
    """Sequences before padding."""
    max_q_len: int
    """The most new tokens of one sequence (1: a decode step), known on the host: it picks the attention kernel."""
    flat: torch.Tensor
    """int32: the one buffer every field above is a view of."""

    @classmethod
    def build(cls, batch: StepBatch, blocks: BlockManager, max_blocks: int, device: torch.device | str = "cpu",
              pad_to: int | None = None, pin: bool = False, pad_tokens_to: int | None = None) -> "StepInputs":
        """Reserve the new tokens' KV slots in `blocks` (all sequences or none) and lay the step out.

        pad_to: the batch bucket of a captured graph (every sequence then has the same q_len, the decode /
        verify case); padding sequences follow the real ones. pad_tokens_to: the token rows of a captured prefill
        graph (at least the step's tokens): padding rows follow the last sequence, in none of them (past cu_q[-1],
        which the kernels neither read as queries nor write; slot -1), and max_q_len is that bound (it picks the
        graph's attention tile; any bound is correct). pin (device "cpu"): in page-locked memory, so that
        `copy_into` a graph's buffers is an asynchronous copy.
        """
        B = len(batch.seq_ids)
        pad = (pad_to or B) - B
        if pad < 0:
            raise ValueError(f"{B} sequences do not fit the batch bucket {pad_to}")
        q_lens = [len(t) for t in batch.tokens]
        if pad and len(set(q_lens)) != 1:
            raise ValueError("padding to a bucket needs the same number of new tokens for every sequence")
        rows = pad_tokens_to or 0
        if rows and (pad or rows < sum(q_lens)):
            raise ValueError(f"pad_tokens_to {rows} needs no padding sequences and at least the step's "
                             f"{sum(q_lens)} tokens")
        need = sum(blocks.blocks_needed(s, n) for s, n in zip(batch.seq_ids, q_lens))
        if need > blocks.num_free:
            raise OutOfBlocks(f"the step needs {need} more KV blocks, {blocks.num_free} are free")
        ids, positions, slots, lens, tables = [], [], [], [], []
        for s, toks in zip(batch.seq_ids, batch.tokens):
            start = blocks.length(s)
            slots += blocks.extend(s, len(toks))
            ids += toks
            positions += range(start, start + len(toks))
            lens.append(start + len(toks))
            table = blocks.block_table(s)
            if len(table) > max_blocks:
                raise ValueError(f"sequence {s} holds {len(table)} blocks, the step's tables have room for "
                                 f"{max_blocks}; raise max_blocks (the engine's max_seq_len / block_size)")
            tables.append(table + [0] * (max_blocks - len(table)))
        q = q_lens[0] if pad else 0
        ids += [0] * (pad * q)
        positions += [0] * (pad * q)
        slots += [-1] * (pad * q)
        lens += [0] * pad
        tables += [[0] * max_blocks] * pad
        extra = max(0, rows - len(ids))  # pad_tokens_to: rows in no sequence
        ids += [0] * extra
        positions += [0] * extra
        slots += [-1] * extra
        cu = [0]
        for n in q_lens + [q] * pad:
            cu.append(cu[-1] + n)
        state = list(batch.state_slots) or [-1] * B
        fields = {"input_ids": ids, "positions": positions, "slot_mapping": slots, "cu_q": cu, "context_lens": lens,
                  "block_tables": tables, "state_slots": state + [-1] * pad, "last_rows": [c - 1 for c in cu[1:]]}
        # One int32 buffer holds every field (each starting on a 16-byte boundary, as the kernels were compiled to
        # assume), so that a step reaches the GPU, and a graph's static buffers, in one copy.
        values: list[int] = []
        spans: list[tuple[str, int, tuple[int, ...]]] = []
        for name, x in fields.items():
            shape = (len(x), max_blocks) if name == "block_tables" else (len(x),)
            spans.append((name, len(values), shape))
            values += [v for row in x for v in row] if name == "block_tables" else x
            values += [0] * (-len(values) % 4)
        flat = torch.tensor(values, dtype=torch.int32, pin_memory=pin).to(device)
        views = {name: flat[start:start + math.prod(shape)].view(shape) for name, start, shape in spans}
        return cls(**views, num_seqs=B, max_q_len=max(max(q_lens), rows), flat=flat)

    def copy_into(self, static: "StepInputs", keep_ids: bool = False) -> None:
        """Write this step into the static buffers a graph was captured over (same bucket shape): one copy,
        asynchronous from pinned memory. keep_ids: leave the graph's input_ids as they are (a decode graph writes
        its own next ids there, runtime/model_runner.py) and copy the fields after them."""
        if self.max_q_len != static.max_q_len:
            raise ValueError(f"a step of {self.max_q_len} tokens a sequence cannot replay a graph captured for "
                             f"{static.max_q_len}")
        for name in FIELDS:
            src, dst = getattr(self, name), getattr(static, name)
            if src.shape != dst.shape:
                raise ValueError(f"{name}: step shape {tuple(src.shape)} does not match the graph's "
                                 f"{tuple(dst.shape)}")
        start = self.positions.storage_offset() - self.flat.storage_offset() if keep_ids else 0
        # same shapes, so the same layout in the flat buffer
        static.flat[start:].copy_(self.flat[start:], non_blocking=True)
        static.num_seqs = self.num_seqs
