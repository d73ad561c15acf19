"""The RS warp-specialized GEMM's ring protocol (gluon_ws: loader, `ready` / `empty` mbarriers, one or two consumer
partitions, with and without PP) over random interleavings, in the model of tools/dev/ws_protocol.py: no deadlock,
no barrier wait passing on another round's phase, no slot refilled while a wgmma may still read it."""

import pytest

from atlas.tools.dev.ws_protocol import simulate


@pytest.mark.parametrize("S,KS,PP", [(4, 1, False), (3, 1, False), (4, 2, False), (6, 2, False), (4, 2, True),
                                     (3, 2, True)])
def test_ring_protocol_is_safe_and_live(S, KS, PP):
    for seed in range(150):
        r = simulate(S, KS, 12 * KS, PP, seed)
        assert not r["deadlock"] and not r["errors"], (seed, r)


def test_the_checks_catch_a_slot_released_before_its_wgmma_completes():
    assert any(simulate(4, 1, 16, False, seed, early=True)["errors"] for seed in range(50))


def test_two_consumers_without_pp_starve_the_loader_at_four_slots():
    """Why KS 2 measured 1.5-2x slower than RS (tools/results/nvfp4_wgmma_ws_ks_h100.json): each consumer holds its
    current and its previous block's slots, so at four slots the loader waits; PP or six slots relieve it."""
    def starved(S, PP):
        return sum(simulate(S, 2, 24, PP, seed)["starved"] for seed in range(100))

    assert starved(4, False) > 2 * starved(4, True) and starved(4, False) > 2 * starved(6, False)


def test_persistent_walk_releases_every_slot_once():
    """nvfp4_gemm_rs_sk_kernel: the ring runs on across a program's work items (whole tiles, then stream-K parts of
    any even length); an item's last slot is released after its final wait, its first block releases nothing."""
    import random

    rng = random.Random(0)
    for seed in range(150):
        items = [2 * rng.randint(1, 6) for _ in range(rng.randint(1, 5))]
        for S in (3, 4, 5):
            r = simulate(S, 1, 0, False, seed, items=items)
            assert not r["deadlock"] and not r["errors"], (items, S, r)
