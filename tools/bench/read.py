"""The read ceiling of a GEMV's weight bytes: a kernel that only reads them, launched as the engine launches its
GEMVs (back to back in one CUDA graph over rotated buffers, programmatic dependent launch, every load issued before
the wait for the kernel before it). tools/results/read_ceiling.json (tools/dev/read_ceiling.py): 0.98 of the copy
bandwidth from 14 MB up on the H200, against 0.65 for the same kernel launched plainly at 14 MB.

Each program reads ITERS blocks of BLOCK int32 words (16-byte loads), PRE of them before the wait, and writes one
word (the xor of what it read, so that no load is dead code) after it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def read_kernel(src, out, BLOCK: tl.constexpr, ITERS: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr):
    """src *i32 [programs * ITERS * BLOCK]; out *i32 [programs]: out[p] = xor of program p's words."""
    pid = tl.program_id(0)
    base = src + pid.to(tl.int64) * (ITERS * BLOCK)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if PDL:
        gdc_launch_dependents()
    for i in tl.static_range(PRE):
        acc ^= tl.load(base + i * BLOCK + offs)
    if PDL:
        gdc_wait()
    for i in range(PRE, ITERS):
        acc ^= tl.load(base + i * BLOCK + offs)
    tl.store(out + pid, tl.reduce(acc, 0, _xor))


def launch_read(src, out, programs: int, block: int, iters: int, pre: int, pdl: bool, num_warps: int) -> None:
    kw = {"launch_pdl": True} if pdl else {}
    read_kernel[(programs,)](src, out, BLOCK=block, ITERS=iters, PRE=pre, PDL=pdl, num_warps=num_warps, **kw)


class ReadBuffers:
    """Enough copies of a read's bytes to defeat L2 (timing.copies_for), shaped for programs of `words` int32
    words each (nbytes rounded down to whole programs), and the kernel's output [programs]."""

    def __init__(self, nbytes: int, words: int):
        import torch

        from atlas.tools.bench.timing import copies_for

        self.programs = max(1, nbytes // 4 // words)
        self.nbytes = self.programs * words * 4
        self.bufs = [torch.randint(-2**31, 2**31 - 1, (self.nbytes // 4,), dtype=torch.int32, device="cuda")
                     for _ in range(copies_for(self.nbytes))]
        self.out = torch.empty(self.programs, dtype=torch.int32, device="cuda")

    def time(self, block: int, iters: int, pre: int, pdl: bool, num_warps: int) -> tuple[float, bool]:
        """(median seconds a read of nbytes, chained over the copies in one graph; whether the first read's
        output is the xor of each program's words)."""
        import numpy as np

        from atlas.tools.bench.timing import graph_time

        def call(b):
            launch_read(b, self.out, self.programs, block, iters, pre, pdl, num_warps)

        call(self.bufs[0])
        want = np.bitwise_xor.reduce(self.bufs[0].view(self.programs, -1).cpu().numpy(), axis=1)
        correct = bool((self.out.cpu().numpy() == want).all())
        return graph_time([lambda b=b: call(b) for b in self.bufs], repeats=20), correct


def read_ceiling(nbytes: int, bandwidth: float) -> float:
    """The fraction of the copy bandwidth that chained PDL reads of nbytes (all loads before the wait) reach: the
    best of two tiles (programs of 32 KB and 64 KB)."""
    best = 0.0
    for block, iters, warps in ((1024, 8, 4), (2048, 8, 8)):
        bufs = ReadBuffers(nbytes, block * iters)
        t, correct = bufs.time(block, iters, iters, True, warps)
        if not correct:
            raise RuntimeError(f"the read-ceiling kernel returned a wrong xor (BLOCK {block}, ITERS {iters})")
        best = max(best, bufs.nbytes / t / bandwidth)
        del bufs
    return best
