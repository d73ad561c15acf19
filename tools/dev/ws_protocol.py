"""Experiment helper (CPU): a model of the RS warp-specialized GEMM's ring protocol
(plugins_trt/quant_linear/gluon_ws.py), run over random interleavings to check what the GPU cannot show cheaply: that
it never deadlocks, that no barrier wait passes on the wrong round's phase, that a slot is refilled only after every
wgmma reading it has completed, and how far the loader can run ahead of the consumers (the KS 2 slowdown: each
consumer holding two of four slots).

The model keeps the kernel's index arithmetic:
  * loader, block g (g = kb - b_lo): wait `empty[g % S]` for parity ((g // S) & 1) ^ 1, copy, arrive on
    `ready[g % S]` (count 1 here: the copies of all loader threads complete together);
  * consumer P of KS (blocks P, P + KS, ...), block g: wait `ready[g % S]` for parity (g // S) & 1, issue the wgmma;
    without PP wait until one wgmma of this consumer is in flight, then arrive on `empty[(g + S - KS) % S]` if
    g >= KS; with PP wait until none is, then arrive on `empty[g % S]`;
  * mbarrier parity: a wait for parity p passes once the phase of parity p has completed, i.e. when the number of
    completed phases is odd for p = 0 and even for p = 1 (a fresh barrier passes a wait for parity 1 at once).

    python -m atlas.tools.dev.ws_protocol      # a few configurations, printed
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Barrier:
    count: int
    done: int = 0  # completed phases
    pending: int = 0

    def arrive(self) -> None:
        self.pending += 1
        if self.pending == self.count:
            self.pending = 0
            self.done += 1

    def passes(self, parity: int) -> bool:
        return (self.done & 1) != parity


@dataclass
class Consumer:
    blocks: list[int]
    i: int = 0  # next of its blocks to wait for
    flight: list[int] = field(default_factory=list)  # its issued wgmmas not yet complete (oldest first)
    state: str = "wait_ready"  # -> "wait_mma" -> "wait_ready"


def simulate(S: int, KS: int, blocks: int, PP: bool, seed: int, early: bool = False,
             items: list[int] | None = None) -> dict:
    """One random interleaving of the loader, KS consumers and their wgmma completions over `blocks` blocks (an even
    count for each consumer, as the kernel's unrolled loop takes). Returns {"deadlock", "errors", "max_lead",
    "starved"}: max_lead is the most blocks the loader was ever ahead of the oldest block still held by a
    consumer; starved counts the steps at which a consumer waited for a block the loader could not copy yet for
    want of a free slot. early: a wrong protocol (a block's slot released as soon as its wgmma is issued), which the
    checks must catch. items: the persistent stream-K form (nvfp4_gemm_rs_sk_kernel, KS 1): the program's work items'
    block counts (`blocks` is ignored); an item's first block releases nothing, and after its last block the consumer
    waits for every wgmma and releases that block's slot (_sk_consumer)."""
    firsts, lasts = set(), set()
    if items is not None:
        assert KS == 1 and not PP
        start = 0
        for n in items:
            firsts.add(start)
            lasts.add(start + n - 1)
            start += n
        blocks = start
    rng = random.Random(seed)
    ready = [Barrier(1) for _ in range(S)]
    empty = [Barrier(1) for _ in range(S)]
    readers: dict[int, set[int]] = {s: set() for s in range(S)}  # slot -> blocks whose wgmma may still read it
    cons = [Consumer(list(range(p, blocks, KS))) for p in range(KS)]
    loaded = 0  # blocks the loader has copied
    errors, max_lead, starved = [], 0, 0
    held = set()  # blocks copied and not yet released

    def step_options():
        opts = []
        if loaded < blocks and empty[loaded % S].passes(((loaded // S) & 1) ^ 1):
            opts.append(("load", None))
        for c, con in enumerate(cons):
            if con.flight:
                opts.append(("complete", c))
            if con.i >= len(con.blocks):
                continue
            g = con.blocks[con.i]
            if con.state == "wait_ready" and ready[g % S].passes((g // S) & 1):
                opts.append(("issue", c))
            if con.state == "wait_mma" and (early or len(con.flight) <= (0 if PP else 1)):
                opts.append(("release", c))
            if con.state == "drain" and not con.flight:
                opts.append(("drain", c))
        return opts

    while True:
        opts = step_options()
        if not opts:
            break
        if loaded < blocks and not any(o[0] == "load" for o in opts):
            waiting = [con.blocks[con.i] for con in cons if con.i < len(con.blocks) and con.state == "wait_ready"]
            starved += any(g >= loaded for g in waiting)
        kind, c = rng.choice(opts)
        if kind == "load":
            g, s = loaded, loaded % S
            if empty[s].done != g // S:
                errors.append(f"loader passed empty[{s}] for block {g} at phase {empty[s].done}")
            if readers[s]:
                errors.append(f"slot {s} refilled with block {g} while wgmmas of {sorted(readers[s])} may read it")
            held.add(g)
            loaded += 1
            ready[s].arrive()
            max_lead = max(max_lead, loaded - min(held))
        elif kind == "issue":
            con = cons[c]
            g = con.blocks[con.i]
            if ready[g % S].done != g // S + 1:
                errors.append(f"consumer {c} passed ready[{g % S}] for block {g} at phase {ready[g % S].done}")
            readers[g % S].add(g)
            con.flight.append(g)
            con.state = "wait_mma"
        elif kind == "complete":
            g = cons[c].flight.pop(0)
            readers[g % S].discard(g)
        elif kind == "drain":  # the item's last block, after waiting for every wgmma
            con = cons[c]
            g = con.blocks[con.i]
            empty[g % S].arrive()
            held.discard(g)
            con.i += 1
            con.state = "wait_ready"
        else:  # release
            con = cons[c]
            g = con.blocks[con.i]
            if PP or early:
                done = g
            elif items is not None:
                done = g - 1 if g not in firsts else None
            else:
                done = g - KS if g >= KS else None
            if done is not None:
                empty[done % S].arrive()
                held.discard(done)
            if g in lasts:
                con.state = "drain"
            else:
                con.i += 1
                con.state = "wait_ready"
    finished = loaded == blocks and all(con.i == len(con.blocks) for con in cons)
    return {"deadlock": not finished, "errors": errors, "max_lead": max_lead, "starved": starved}


def main() -> None:
    for S, KS, PP in [(4, 1, False), (4, 2, False), (6, 2, False), (4, 2, True), (3, 2, True)]:
        runs = [simulate(S, KS, 8 * KS * 2, PP, seed) for seed in range(200)]
        print(f"S {S} KS {KS} PP {PP}: deadlocks {sum(r['deadlock'] for r in runs)}, errors "
              f"{sum(len(r['errors']) for r in runs)}, loader lead at most {max(r['max_lead'] for r in runs)}, "
              f"starved steps (mean) {sum(r['starved'] for r in runs) / len(runs):.1f}")


if __name__ == "__main__":
    main()
