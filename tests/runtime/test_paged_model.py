"""The batched paged model (runtime/paged_model.py) against the per-sequence reference model (runtime/model.py).

Sequences of a tiny engine of each family run as mixed steps: prefill chunks of several sequences together,
decode tokens beside another sequence's chunk, a verify-width step, ragged lengths that cross KV blocks, blocks
handed out out of order. Every step's last-token logits must equal the reference's for that sequence.
"""

from __future__ import annotations

import random

import pytest
import torch

from atlas.runtime.block_manager import BlockManager
from atlas.runtime.config import GDN
from atlas.runtime.engine import load_engine
from atlas.runtime.kv_cache import KVCache
from atlas.runtime.model import Model
from atlas.runtime.paged_model import PagedModel
from atlas.runtime.state_pool import StatePool
from atlas.runtime.step import StepBatch, StepInputs

BLOCK = 4
MAX_BLOCKS = 12


def _pools(config, dtype):
    attn = sum(k != GDN for k in config.layer_types)
    kv = KVCache.allocate(attn, num_blocks=40, block_size=BLOCK, num_kv_heads=config.num_kv_heads,
                          head_dim=config.head_dim, dtype=dtype)
    states = StatePool(config, num_slots=4, dtype=dtype) if GDN in config.layer_types else None
    return kv, states


# Each step: (sequence, number of new tokens) pairs.
STEPS = [
    [(0, 7), (1, 3)],          # two prefills
    [(0, 1), (1, 6), (2, 9)],  # decode beside a second chunk and a third prompt
    [(0, 1), (1, 1), (2, 1)],  # plain decode
    [(0, 4), (2, 1)],          # a verify-width step (4 tokens) beside a decode
    [(1, 1), (3, 2), (0, 1)],  # a late prompt; out-of-order sequences
]


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_mixed_steps_match_the_reference(tiny_engine, family):
    engine = load_engine(tiny_engine(family))
    c = engine.config
    ref = Model(c, engine.weights)
    paged = PagedModel(c, engine.weights)
    kv, states = _pools(c, engine.weights["embed.weight"].dtype)
    blocks = BlockManager(kv.num_blocks, BLOCK)
    rng = random.Random(1)
    ref_states, slots = {}, {}
    worst = 0.0
    for step_seqs in STEPS:
        tokens = {s: tuple(rng.randrange(c.vocab_size) for _ in range(n)) for s, n in step_seqs}
        for s, _ in step_seqs:
            if s not in ref_states:
                ref_states[s] = ref.new_state(64)
                slots[s] = states.acquire() if states else -1
        batch = StepBatch(tuple(tokens), tuple(tokens.values()),
                          tuple(slots[s] for s in tokens) if states else ())
        logits = paged.forward(StepInputs.build(batch, blocks, MAX_BLOCKS), kv, states)
        for row, (s, toks) in enumerate(tokens.items()):
            want = ref.forward(torch.tensor(toks), ref_states[s]).logits[-1]
            err = ((logits[row] - want).norm() / want.norm()).item()
            worst = max(worst, err)
            assert err < 1e-5, f"{family}: sequence {s} at step {step_seqs}: error ratio {err:.2e}"
    print(f"{family}: worst error ratio {worst:.1e}")


def test_padding_rows_touch_nothing(tiny_engine):
    """A decode padded to a bucket: the padding sequences write no KV and leave the logits of real rows alone."""
    engine = load_engine(tiny_engine("qwen3_5"))
    c = engine.config
    paged = PagedModel(c, engine.weights)
    kv, states = _pools(c, engine.weights["embed.weight"].dtype)
    blocks = BlockManager(kv.num_blocks, BLOCK)
    slot = states.acquire()
    paged.forward(StepInputs.build(StepBatch((0,), ((1, 2, 3),), (slot,)), blocks, MAX_BLOCKS), kv, states)
    snapshot = [layer.k.clone() for layer in kv.layers]
    state_before = {i: layer.state.clone() for i, layer in states.layers.items()}
    plain = PagedModel(c, engine.weights)
    kv2, states2 = _pools(c, engine.weights["embed.weight"].dtype)
    for a, b in zip(kv2.layers, kv.layers):
        a.k.copy_(b.k)
        a.v.copy_(b.v)
    for i in states.layers:
        states2.layers[i].state.copy_(states.layers[i].state)
        states2.layers[i].window.copy_(states.layers[i].window)
    blocks2 = BlockManager(kv.num_blocks, BLOCK)
    blocks2.extend(0, 3)
    want = plain.forward(StepInputs.build(StepBatch((0,), ((4,),), (slot,)), blocks2, MAX_BLOCKS), kv2,
                         states2)
    got = paged.forward(StepInputs.build(StepBatch((0,), ((4,),), (slot,)), blocks, MAX_BLOCKS, pad_to=4), kv,
                        states)
    assert got.shape[0] == 4
    assert ((got[0] - want[0]).norm() / want[0].norm()).item() < 1e-6  # more rows may change the matmul's order
    for before, layer in zip(snapshot, kv.layers):  # only the real token's slot changed
        changed = (before != layer.k).flatten(1).any(dim=1)
        assert changed.sum() <= 1
    for i, layer in states.layers.items():
        others = [s for s in range(states.num_slots) if s != slot]
        assert torch.equal(layer.state[others], state_before[i][others])


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_padded_prefill_rows_touch_nothing(tiny_engine, family):
    """A prefill chunk laid out over more token rows than it has (StepInputs.build's pad_tokens_to: a captured
    prefill graph's tier): the rows past cu_q[-1] write no KV and no state, and the sequence's logits, KV and state
    are the unpadded step's. Two chunks, so that the second reads the first's KV and state."""
    engine = load_engine(tiny_engine(family))
    c = engine.config
    dtype = engine.weights["embed.weight"].dtype
    rng = random.Random(2)
    chunks = [tuple(rng.randrange(c.vocab_size) for _ in range(n)) for n in (5, 3)]
    runs = []
    for rows in (None, 8):
        model = PagedModel(c, engine.weights)
        kv, states = _pools(c, dtype)
        blocks = BlockManager(kv.num_blocks, BLOCK)
        slot = states.acquire() if states else -1
        logits = []
        for toks in chunks:
            step = StepInputs.build(StepBatch((0,), (toks,), (slot,) if states else ()), blocks, MAX_BLOCKS,
                                    pad_tokens_to=rows)
            assert step.input_ids.shape[0] == (rows or len(toks)) and step.cu_q.tolist() == [0, len(toks)]
            assert step.max_q_len == (rows or len(toks))
            logits.append(model.forward(step, kv, states)[0])
        runs.append((logits, kv, states, slot))
    (want, kv, states, slot), (got, kv2, states2, _) = runs
    for w, g in zip(want, got):
        assert ((g - w).norm() / w.norm()).item() < 1e-6  # more rows may change the matmul's order
    for a, b in zip(kv.layers, kv2.layers):
        written = (a.k != 0).flatten(0, 1).flatten(1).any(dim=1)  # written: [slots] (block x offset)
        assert torch.equal(written, (b.k != 0).flatten(0, 1).flatten(1).any(dim=1))  # the same 8 slots, no others
        assert written.sum() == 8
        assert ((b.k.float() - a.k.float()).norm() / a.k.float().norm()).item() < 1e-6
    if states:
        for i, layer in states.layers.items():
            other = states2.layers[i]
            assert ((other.state[slot] - layer.state[slot]).norm() / layer.state[slot].norm()).item() < 1e-5
            rest = [s for s in range(states.num_slots) if s != slot]
            assert torch.equal(other.state[rest], layer.state[rest]) and not other.state[rest].any()


def test_pad_tokens_to_needs_room_and_no_padding_sequences():
    blocks = BlockManager(8, BLOCK)
    batch = StepBatch((0,), ((1, 2, 3),))
    with pytest.raises(ValueError, match="pad_tokens_to 2"):
        StepInputs.build(batch, blocks, MAX_BLOCKS, pad_tokens_to=2)
    with pytest.raises(ValueError, match="pad_tokens_to 4"):
        StepInputs.build(batch, blocks, MAX_BLOCKS, pad_to=2, pad_tokens_to=4)
    step = StepInputs.build(batch, blocks, MAX_BLOCKS, pad_tokens_to=4)
    assert step.slot_mapping.tolist()[3] == -1 and step.last_rows.tolist() == [2]
