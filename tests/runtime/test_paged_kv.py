"""The block manager's bookkeeping and the paged KV reference write / read (runtime/kv_cache.py)."""

from __future__ import annotations

import random

import pytest
import torch

from atlas.runtime.block_manager import BlockManager, OutOfBlocks
from atlas.runtime.kv_cache import FP8_MAX, KVCache, gather_kv, write_kv


def _check_invariant(bm: BlockManager, ids) -> None:
    owned = [b for s in ids for b in bm.block_table(s)]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert len(owned) + bm.num_free == bm.num_blocks, "blocks lost or duplicated between owners and free list"
    for s in ids:
        assert len(bm.block_table(s)) == -(-bm.length(s) // bm.block_size)


def test_random_walk_keeps_invariant():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=40, block_size=8)
    live: set[int] = set()
    for step in range(400):
        s = rng.randrange(6)
        op = rng.random()
        if op < 0.6:
            n = rng.choice([1, 1, 3, 9, 17])
            before = (bm.num_free, bm.length(s))
            try:
                slots = bm.extend(s, n)
            except OutOfBlocks:
                assert (bm.num_free, bm.length(s)) == before  # all or nothing
                continue
            live.add(s)
            assert slots == bm.slots(s, bm.length(s) - n, n)
        elif op < 0.8 and s in live and bm.length(s):
            bm.truncate(s, rng.randrange(bm.length(s) + 1))
        else:
            bm.free(s)
            live.discard(s)
        _check_invariant(bm, range(6))


def test_slots_follow_the_block_table():
    bm = BlockManager(num_blocks=10, block_size=4)
    bm.extend(0, 3)
    bm.extend(1, 5)
    bm.extend(0, 4)  # crosses into a second block taken after sequence 1's two
    table = bm.block_table(0)
    assert table == [0, 3]
    assert bm.slots(0, 0, 7) == [0, 1, 2, 3, 12, 13, 14]
    with pytest.raises(ValueError, match="not held"):
        bm.slots(0, 5, 3)


def test_out_of_blocks_says_what_is_short():
    bm = BlockManager(num_blocks=2, block_size=16)
    bm.extend(7, 20)
    with pytest.raises(OutOfBlocks, match="needs 1 more KV blocks of 16 tokens, 0 are free"):
        bm.extend(8, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_write_then_gather_round_trips(dtype):
    torch.manual_seed(0)
    Hkv, D, bs = 2, 8, 4
    scales = [(0.05, 0.02)] if dtype == torch.float8_e4m3fn else None
    cache = KVCache.allocate(1, num_blocks=6, block_size=bs, num_kv_heads=Hkv, head_dim=D, dtype=dtype,
                             scales=scales)
    layer = cache.layers[0]
    bm = BlockManager(6, bs)
    bm.extend(0, 2)
    bm.extend(1, 3)
    k, v = torch.randn(7, Hkv, D), torch.randn(7, Hkv, D)
    slots = bm.slots(0, 0, 2) + bm.extend(0, 5)  # sequence 0: 7 tokens in blocks 0 and 2
    write_kv(layer, k, v, torch.tensor(slots, dtype=torch.int32))
    # a padding token (slot -1) writes nothing
    before = layer.k.clone()
    write_kv(layer, torch.randn(1, Hkv, D), torch.randn(1, Hkv, D), torch.tensor([-1], dtype=torch.int32))
    assert torch.equal(before.float(), layer.k.float())
    gk, gv = gather_kv(layer, torch.tensor(bm.block_table(0)), 7)
    tol = {torch.float32: 0, torch.bfloat16: 1e-2, torch.float8_e4m3fn: 7e-2}[dtype]
    assert (gk - k).norm() / k.norm() <= tol
    assert (gv - v).norm() / v.norm() <= tol


def test_fp8_write_clamps_to_the_format():
    cache = KVCache.allocate(1, 1, 4, 1, 2, torch.float8_e4m3fn, scales=[(1.0, 1.0)])
    write_kv(cache.layers[0], torch.tensor([[[1e6, -1e6]]]), torch.tensor([[[3.0, -3.0]]]),
             torch.tensor([2], dtype=torch.int32))
    assert cache.layers[0].k[0, 2, 0].float().tolist() == [FP8_MAX, -FP8_MAX]


def test_fp8_cache_needs_scales():
    with pytest.raises(ValueError, match="needs one \\(k_scale, v_scale\\) per layer"):
        KVCache.allocate(2, 4, 16, 1, 8, torch.float8_e4m3fn)


def test_step_inputs_lay_out_a_mixed_step():
    from atlas.runtime.step import StepBatch, StepInputs
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.extend(1, 6)  # sequence 1 has 6 cached tokens (blocks 0, 1)
    step = StepInputs.build(StepBatch((1, 2), ((11,), (21, 22, 23))), bm, max_blocks=3)
    assert step.input_ids.tolist() == [11, 21, 22, 23]
    assert step.positions.tolist() == [6, 0, 1, 2]
    assert step.cu_q.tolist() == [0, 1, 4]
    assert step.context_lens.tolist() == [7, 3]
    assert step.slot_mapping.tolist() == [1 * 4 + 2, 8, 9, 10]  # seq 1: block 1 offset 2; seq 2: block 2
    assert step.block_tables.tolist() == [[0, 1, 0], [2, 0, 0]]
    assert step.last_rows.tolist() == [0, 3]
    assert step.state_slots.tolist() == [-1, -1]


def test_step_inputs_pad_to_a_bucket():
    from atlas.runtime.step import StepBatch, StepInputs
    bm = BlockManager(num_blocks=8, block_size=4)
    step = StepInputs.build(StepBatch((5,), ((7, 8),), state_slots=(3,)), bm, max_blocks=2, pad_to=4)
    assert step.cu_q.tolist() == [0, 2, 4, 6, 8]
    assert step.slot_mapping.tolist() == [0, 1] + [-1] * 6
    assert step.context_lens.tolist() == [2, 0, 0, 0]
    assert step.state_slots.tolist() == [3, -1, -1, -1]
    assert step.num_seqs == 1
    static = StepInputs.build(StepBatch((6,), ((1, 2),)), bm, max_blocks=2, pad_to=4)
    step.copy_into(static)
    assert static.slot_mapping.tolist() == step.slot_mapping.tolist()
    # keep_ids: every field but the graph's own input_ids
    static.input_ids.fill_(42)
    nxt = StepInputs.build(StepBatch((5,), ((9, 9),), state_slots=(3,)), bm, max_blocks=2, pad_to=4)
    nxt.copy_into(static, keep_ids=True)
    assert static.input_ids.tolist() == [42] * 8
    for name in ("positions", "slot_mapping", "cu_q", "context_lens", "block_tables", "state_slots", "last_rows"):
        assert torch.equal(getattr(static, name), getattr(nxt, name)), name
    assert static.positions.tolist()[:2] == [2, 3]


def test_step_inputs_reserve_all_or_nothing():
    from atlas.runtime.step import StepBatch, StepInputs
    bm = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(OutOfBlocks, match="needs 3 more KV blocks, 2 are free"):
        StepInputs.build(StepBatch((1, 2), ((1,) * 4, (2,) * 5)), bm, max_blocks=2)
    assert bm.num_free == 2 and bm.length(1) == 0
    with pytest.raises(ValueError, match="appears twice"):
        StepBatch((1, 1), ((1,), (2,)))


def test_state_pool_hands_out_zeroed_slots():
    from atlas.runtime.config import GDN, ModelConfig
    from atlas.runtime.state_pool import OutOfSlots, StatePool
    c = ModelConfig(family="t", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
                    layer_types=(GDN, "attention"), num_heads=2, num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6,
                    rotary_dim=4, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=4,
                    linear_value_head_dim=4, linear_conv_kernel=4)
    pool = StatePool(c, num_slots=2, dtype=torch.float32)
    assert list(pool.layers) == [0]
    assert pool.layers[0].window.shape == (2, c.gdn_conv_size, 3)
    assert pool.layers[0].state.shape == (2, 2, 4, 4)
    a = pool.acquire()
    pool.layers[0].state[a].normal_()
    pool.layers[0].window[a].normal_()
    b = pool.acquire()
    with pytest.raises(OutOfSlots):
        pool.acquire()
    pool.release(a)
    with pytest.raises(ValueError, match="not held"):
        pool.release(a)
    again = pool.acquire()
    assert again == a and b != a
    assert not pool.layers[0].state[a].any() and not pool.layers[0].window[a].any()
    assert StatePool.bytes_per_slot(c, torch.float32) == (c.gdn_conv_size * 3 + 2 * 4 * 4) * 4


def test_step_fields_share_one_aligned_buffer():
    """A step reaches the GPU in one copy: every field is a view of one int32 buffer, starting 16-byte aligned (the
    kernels are compiled to assume aligned pointers)."""
    from atlas.runtime.step import FIELDS, StepBatch, StepInputs
    bm = BlockManager(num_blocks=8, block_size=4)
    step = StepInputs.build(StepBatch((1, 2, 3), ((5,), (6,), (7,))), bm, max_blocks=3, pad_to=4)
    base = step.flat.data_ptr()
    for name in FIELDS:
        t = getattr(step, name)
        assert t.untyped_storage().data_ptr() == step.flat.untyped_storage().data_ptr(), name
        assert (t.data_ptr() - base) % 16 == 0, name
    static = StepInputs.build(StepBatch((9,), ((1,),)), BlockManager(8, 4), max_blocks=3, pad_to=4)
    step.copy_into(static)
    for name in FIELDS:
        assert torch.equal(getattr(static, name), getattr(step, name)), name
