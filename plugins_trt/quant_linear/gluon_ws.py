"""NVFP4 GEMM for M >= 64 in Gluon, warp-specialized: the copies (and in one form the decode) in other warps than the
wgmma.

gluon_gemm.nvfp4_gemm_wgmma_kernel decodes each weight block in the warps that issue the wgmma (register A operand)
and syncs the whole CTA once a block; Nsight Compute put its tensor pipe at about half of peak on the SMs it uses
(NOTES.md, 2026-12-05 fourth session). Here the two jobs run in separate warps that sync only through mbarriers:

* the decoder (a worker partition of DW warps) loads the packed words and scales two blocks ahead in registers,
  decodes a block (NAT: in natural k order, 16-byte shared stores; otherwise gluon_gemv._a_operand's order, stored by
  stmatrix, x permuted to match by permute_k), stores the bf16 block into an S-slot ring in shared memory (NVMMA
  128-byte swizzle, the wgmma's A operand), and copies x's block into the same slot with cp.async, whose completion
  the slot's `ready` barrier tracks (cp.async.mbarrier.arrive.noinc: every decoder thread arrives once its copies
  have landed; after the weight stores Triton syncs the partition (bar.sync 2, 32 DW) and thread 0 arrives once
  more, so the barrier counts 32 DW + 1);
* the consumers (the default partition, one or two warpgroups on 64-row parts of the tile) wait for a slot, issue
  the shared-memory wgmma (SS: acc [BN, BM] += W [BN, BK] @ x^T [BK, BM]) and, once the wgmma of the slot before
  has completed, release that slot (`empty`, count 1: Triton syncs the partition first, then thread 0 arrives, so
  every warpgroup is past its wgmma wait).

RS (the form among the build's candidates, triton_gemm.CONFIGS_nvfp4_ws_rs) splits the work the other way: the
consumers decode into the register A operand as gluon_gemm does and issue the RS wgmma; a loader partition only copies
the packed words, scale bytes and x into the ring (_loader, `ready` counts 32 DW cp.async arrivals). Variants: KS 2
(two consumer partitions on the even and odd blocks of one tile, accumulators added through shared memory; PP: each
waits for its own wgmma and releases its slot at once) and XP (the loader copies x in the decode's k order itself,
4-byte copies, so the host's permute_k launch goes).

The epilogue is the shipped kernel's (gluon_gemv._store_out). tests/tools/test_nvfp4_wgmma_ws.py checks the PTX for
the barrier structure the counts rely on; `python -m atlas.tools.dev.nvfp4_wgmma_ws` checks and times it on the GPU
(measurements: NOTES.md, 2026-12-06).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from atlas.plugins_trt.quant_linear import gluon_gemm as gm
from atlas.plugins_trt.quant_linear import gluon_gemv as gg


@gluon.jit
def _natural(wd, sc, BN: gl.constexpr, BK: gl.constexpr, BITS: gl.constexpr):
    """One block's decoded weights [BN, BK] (bf16) in natural k order: word j's pair i is k = 8j + 2i, 8j + 2i + 1
    (the layout is the words' own, each thread's words whole; the shared-memory ring takes any layout)."""
    if BITS:
        p0 = gg._pair(wd, sc, gg.Q0)
        p1 = gg._pair(wd, sc, gg.Q1)
        p2 = gg._pair(wd, sc, gg.Q2)
        p3 = gg._pair(wd, sc, gg.Q3)
    else:
        p0 = gg._pair(wd, sc, gg.P0)
        p1 = gg._pair(wd, sc, gg.P1)
        p2 = gg._pair(wd, sc, gg.P2)
        p3 = gg._pair(wd, sc, gg.P3)
    t = gl.reshape(gl.join(gl.join(p0, p2), gl.join(p1, p3)), [BN, BK // 2])  # [n, j, c, b] = pair 2c + b of word j
    u = gl.inline_asm_elementwise(gg.UNPACK, "=r,r,r", [gl.join(t, t)], dtype=gl.bfloat16, is_pure=True, pack=2)
    return gl.reshape(u, [BN, BK])


@gluon.jit
def _decoder(w_ptr, ws_ptr, x_ptr, w_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m,
             b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, DW: gl.constexpr,
             TILED: gl.constexpr, BITS: gl.constexpr, NAT: gl.constexpr):
    """Fill slot (kb - b_lo) % S with block kb's decoded weights and x, for kb in [b_lo, b_hi) (NAT: natural k
    order, x as given; else gluon_gemv's order, x permuted to match)."""
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    _, aL, wL, sL, pL = gm.wgmma_layouts(BN, 64, BK, DW)  # (the A operand of a 64-wide wgmma: its stmatrix order)
    xcL: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [DW, 1], [1, 0])  # 16-byte copies

    w_rows, s_rows, x_rows = gm._tile_ptrs(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, pid_n,
                                           pid_m, BM, BN, BK, wL, sL, xcL, TILED)

    wd0 = gl.load(w_rows + gm._woff(b_lo, BK, TILED))
    sr0 = gl.load(s_rows + gm._soff(b_lo, BK, TILED))
    nxt = gl.minimum(b_lo + 1, b_hi - 1)
    wd1 = gl.load(w_rows + gm._woff(nxt, BK, TILED))
    sr1 = gl.load(s_rows + gm._soff(nxt, BK, TILED))
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        slot = it % S
        mbarrier.wait(empty.index(slot), ((it // S) & 1) ^ 1)  # the consumers are done with the slot's last block
        async_copy.async_copy_global_to_shared(x_s.index(slot), x_rows + kb * BK)
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        if NAT:
            a = _natural(wd0, gg._scales(sr0, BN, KW, wL), BN, BK, BITS)
        else:
            a = gg._a_operand(wd0, gg._scales(sr0, BN, KW, wL), BN, BK, RP, pL, aL, BITS)
        wd0 = wd1
        sr0 = sr1
        nxt = gl.minimum(kb + 2, b_hi - 1)
        wd1 = gl.load(w_rows + gm._woff(nxt, BK, TILED))
        sr1 = gl.load(s_rows + gm._soff(nxt, BK, TILED))
        w_s.index(slot).store(a)
        fence_async_shared()
        mbarrier.arrive(ready.index(slot))


@gluon.jit
def _consumer(w_s, x_s, ready, empty, b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr, S: gl.constexpr,
              NW: gl.constexpr):
    """acc [BN, BM] fp32 over blocks [b_lo, b_hi) from the ring."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        slot = it % S
        mbarrier.wait(ready.index(slot), (it // S) & 1)
        fence_async_shared()  # the cp.async writes of x (generic proxy) before the wgmma reads them (async proxy)
        acc = warpgroup_mma(w_s.index(slot), x_s.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(empty.index((it + S - 1) % S), pred=it > 0)  # the block before has completed
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )  # warp_specialize's default results are a tuple


@gluon.constexpr_function
def x_copy_layout(BK, DW, XP):
    """The loader's layout of an x block [BM, BK]: 16-byte copies (8 elements a thread), or with XP 4-byte ones (the
    pairs of k that stay adjacent under the decode's k permutation)."""
    BK, DW, XP = (getattr(v, "value", v) for v in (BK, DW, XP))
    per = 2 if XP else 8
    cols = min(32, BK // per)
    return gl.BlockedLayout([1, per], [32 // cols, cols], [DW, 1], [1, 0])


@gluon.jit
def _x_cols(BK: gl.constexpr, xcL: gl.constexpr, XP: gl.constexpr):
    """Column offsets [BK] of x that an x block's columns copy: j itself, or with XP the decode's k order
    (gluon_gemm.k_phys, the formula permute_k gathers by), so that x needs no permute_k launch."""
    j = gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))
    if XP:  # adjacent pairs (s0, the lowest bit of both j and k_phys), each starting at an even k: 4-byte copies.
        # The hints go on an op made here: on k_phys's value they are lost when the call is inlined.
        return gl.max_contiguous(gl.multiple_of(((gm.k_phys(j, BK) >> 1) << 1) + (j & 1), 2), 2)
    else:
        return j


@gluon.jit
def _loader_ptrs(w_ptr, ws_ptr, x_ptr, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m, BM: gl.constexpr,
                 BN: gl.constexpr, BK: gl.constexpr, DW: gl.constexpr, TILED: gl.constexpr, XP: gl.constexpr):
    """Block 0's copy sources of output tile (pid_n, pid_m): packed words and scale bytes (gluon_gemm.ring_ptrs) and
    x [BM, BK] in the decode's k order (given so, or with XP reordered here, _x_cols)."""
    wp, sp = gm.ring_ptrs(w_ptr, ws_ptr, N, K, stride_wn, stride_sn, pid_n, BN, BK, DW, TILED)
    xcL: gl.constexpr = x_copy_layout(BK, DW, XP)
    xm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, xcL))
    return wp, sp, x_ptr + gl.minimum(xm, M - 1)[:, None] * stride_xm + _x_cols(BK, xcL, XP)[None, :]


@gluon.jit
def _copy_block(w_s, s_s, x_s, ready, empty, it, kb, wp, sp, x_rows, BK: gl.constexpr, S: gl.constexpr,
                TILED: gl.constexpr):
    """The loader's block at ring position `it` (K block kb): wait until the consumers have released its slot, copy
    the words, scales and x, and have every loader thread arrive on the slot's `ready` once its copies land."""
    slot = it % S
    mbarrier.wait(empty.index(slot), ((it // S) & 1) ^ 1)  # the consumers are done with the slot's last block
    async_copy.async_copy_global_to_shared(x_s.index(slot), x_rows + kb * BK)
    async_copy.async_copy_global_to_shared(w_s.index(slot), wp + gm._woff(kb, BK, TILED))
    async_copy.async_copy_global_to_shared(s_s.index(slot), sp + gm._soff(kb, BK, TILED))
    async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)


@gluon.jit
def _loader(w_ptr, ws_ptr, x_ptr, w_s, s_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn, pid_n,
            pid_m, b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr,
            DW: gl.constexpr, TILED: gl.constexpr, XP: gl.constexpr = False, PDL: gl.constexpr = False):
    """RS: fill slot (kb - b_lo) % S with block kb's packed words, scale bytes and x in the decode's k order by
    cp.async, for kb in [b_lo, b_hi); every loader thread arrives on the slot's `ready` barrier when its copies have
    landed. x comes k-permuted (permute_k), or with XP as given and permuted by the copies (4-byte ones). PDL: the
    first S blocks' words and scales (nobody's output) are copied before waiting for the kernel before (permute_k,
    which writes x), their x after it."""
    wp, sp, x_rows = _loader_ptrs(w_ptr, ws_ptr, x_ptr, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m, BM,
                                  BN, BK, DW, TILED, XP)
    first = b_lo
    if PDL:
        for i in gl.static_range(S):  # the ring's first use: no slot to wait for
            if b_lo + i < b_hi:
                async_copy.async_copy_global_to_shared(w_s.index(i), wp + gm._woff(b_lo + i, BK, TILED))
                async_copy.async_copy_global_to_shared(s_s.index(i), sp + gm._soff(b_lo + i, BK, TILED))
        gg._gdc_wait()
        for i in gl.static_range(S):
            if b_lo + i < b_hi:
                async_copy.async_copy_global_to_shared(x_s.index(i), x_rows + (b_lo + i) * BK)
                async_copy.mbarrier_arrive(ready.index(i), increment_count=False)
        first = b_lo + S
    for kb in range(first, b_hi):
        _copy_block(w_s, s_s, x_s, ready, empty, kb - b_lo, kb, wp, sp, x_rows, BK, S, TILED)


@gluon.jit
def _release(bar, pred, TA: gl.constexpr):
    """A consumer's release of a ring slot: one arrival after a barrier over the partition (Triton's lowering of
    mbarrier.arrive: thread 0 arrives once every warp is past it; `empty` counts 1), or with TA every thread's own
    arrival (cp.async.mbarrier.arrive.noinc with no copies of its own outstanding: it arrives at once; `empty` counts
    32 NW), so the warps of the partition never wait for each other."""
    if TA:
        if pred:
            async_copy.mbarrier_arrive(bar, increment_count=False)
    else:
        mbarrier.arrive(bar, pred=pred)


@gluon.jit
def _rs_step(acc, a_prev, w_s, s_s, x_s, ready, empty, it, rel, KS: gl.constexpr, BN: gl.constexpr,
             BK: gl.constexpr, S: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr, pL: gl.constexpr,
             aL: gl.constexpr, BITS: gl.constexpr, PP: gl.constexpr = False, TA: gl.constexpr = False):
    """RS, the block at ring position `it` (the count of blocks through the ring before it): wait for its slot,
    decode the words into the register A operand, issue the wgmma, wait for this partition's block before (it - KS;
    a_prev, its A operand, is a dependency of that wait, so its registers are not reused before) and release that
    block's slot if `rel`. Returns (acc, A of this block, a_prev); the caller alternates the two A values (as
    gluon_gemm._step). PP (ping-pong, for KS 2): wait for this block's own wgmma and release its slot at once, so
    that a partition holds one slot, not two, and its decode overlaps the other partition's wgmma."""
    slot = it % S
    mbarrier.wait(ready.index(slot), (it // S) & 1)
    wd = w_s.index(slot).load(wL)
    sr = s_s.index(slot).load(sL).to(gl.float8e4nv, bitcast=True)
    a = gg._a_operand(wd, gg._scales(sr, BN, BK // 8, wL), BN, BK, BK // 32, pL, aL, BITS)
    fence_async_shared()  # the cp.async writes of x (generic proxy) before the wgmma reads them (async proxy)
    acc = warpgroup_mma(a, x_s.index(slot).permute((1, 0)), acc, is_async=True)
    if PP:
        acc, a_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_prev))
        _release(empty.index(slot), True, TA)
    else:
        acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
        _release(empty.index((it + S - KS) % S), rel, TA)
    return acc, a, a_prev


@gluon.jit
def _rs_loop(w_s, s_s, x_s, ready, empty, b_lo, b_hi, P: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr,
             BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr,
             PP: gl.constexpr, TA: gl.constexpr = False):
    """RS: acc [BN, BM] fp32 over blocks b_lo + P, b_lo + P + KS, ... < b_hi (an even count), each decoded here
    from the ring's packed words into the register A operand (gluon_gemm's decode-in-the-loop, without its CTA
    barriers and copies)."""
    acc_l, aL, wL, sL, pL = gm.wgmma_layouts(BN, BM, BK, NW)
    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    a1 = gl.zeros([BN, BK], gl.bfloat16, layout=aL)
    for kb in range(b_lo + P, b_hi, 2 * KS):
        it = kb - b_lo
        acc, a0, a1 = _rs_step(acc, a1, w_s, s_s, x_s, ready, empty, it, it >= KS, KS, BN, BK, S, wL, sL, pL, aL,
                               BITS, PP, TA)
        acc, a1, a0 = _rs_step(acc, a0, w_s, s_s, x_s, ready, empty, it + KS, True, KS, BN, BK, S, wL, sL, pL, aL,
                               BITS, PP, TA)
    acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
    return acc


@gluon.jit
def _consumer_rs(w_s, s_s, x_s, ready, empty, red_s, done, b_lo, b_hi, KS: gl.constexpr, BM: gl.constexpr,
                 BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr,
                 PP: gl.constexpr, TA: gl.constexpr = False):
    """RS, the default partition: blocks b_lo, b_lo + KS, ...; with KS = 2 it then adds the other consumer's
    accumulator (_consumer_rs_odd, through red_s once `done` completes)."""
    acc = _rs_loop(w_s, s_s, x_s, ready, empty, b_lo, b_hi, 0, KS, BM, BN, BK, S, NW, BITS, PP, TA)
    if KS == 2:
        mbarrier.wait(done.index(0), 0)
        acc += red_s.load(acc.type.layout)
    return (acc, )  # warp_specialize's default results are a tuple


@gluon.jit
def _consumer_rs_odd(w_s, s_s, x_s, ready, empty, red_s, done, b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr,
                     BK: gl.constexpr, S: gl.constexpr, NW: gl.constexpr, BITS: gl.constexpr, PP: gl.constexpr,
                     TA: gl.constexpr = False):
    """RS with KS = 2, a worker partition of NW warps: the odd blocks b_lo + 1, b_lo + 3, ...; its accumulator goes
    to red_s, then one arrival on `done` (after a barrier over the partition)."""
    acc = _rs_loop(w_s, s_s, x_s, ready, empty, b_lo, b_hi, 1, 2, BM, BN, BK, S, NW, BITS, PP, TA)
    red_s.store(acc)
    mbarrier.arrive(done.index(0))


@gluon.jit(do_not_specialize=["M"])  # one compile for every M (the JIT sweep and tuner)
def nvfp4_gemm_ws_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                         M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                         HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr, TILED: gl.constexpr = False,
                         SPLIT_K: gl.constexpr = 1, BITS: gl.constexpr = False, DW: gl.constexpr = 4,
                         DREGS: gl.constexpr = 128, NAT: gl.constexpr = False, RS: gl.constexpr = False,
                         KS: gl.constexpr = 1, KREGS: gl.constexpr = 224, PP: gl.constexpr = False,
                         XP: gl.constexpr = False, TA: gl.constexpr = False, PDL: gl.constexpr = False):
    """out[M, N] = x @ W^T (+ bias) (+ residual) with the arguments, grid and SPLIT_K partials of
    gluon_gemm.nvfp4_gemm_wgmma_kernel (x k-permuted by permute_k unless NAT), warp-specialized (module docstring):
    num_warps consumer warps (4 or 8: BLOCK_N / 64 warpgroups), DW decoder warps with DREGS registers each.
    K % (BLOCK_K SPLIT_K) == 0; TILED: N % 128 == K % 128 == 0.
    RS: the consumers decode (register A operand, as gluon_gemm) and the DW worker warps only copy the packed words,
    scales and x into the ring (_loader): the shipped kernel's loop without its CTA barriers, address arithmetic and
    copies. x k-permuted; K % (2 BLOCK_K SPLIT_K) == 0.
    KS = 2 (RS only): two consumer partitions of num_warps warps each (a second one with KREGS registers) take the
    even and the odd blocks of the same tile and add their accumulators at the end (through shared memory): the
    decode of one warpgroup-sized tile spread over twice the warps; K % (4 BLOCK_K SPLIT_K) == 0. PP: each consumer
    waits for its own wgmma before its next decode (_rs_step), holding one ring slot instead of two. XP (RS only): x
    as given, put in the decode's k order by the loader's copies (_x_cols), no permute_k launch. TA (RS only): every
    consumer thread releases its slots itself (_release), no barrier over the consumer partition a block. PDL (RS
    only): compiled for programmatic dependent launch, the loader's first S weight blocks copied before its wait for
    the kernel before (_loader), the epilogue's reads (residual) after the consumers' own wait."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(RS or not PDL)
    gl.static_assert(SPLIT_K == 1 or not (HAS_BIAS or HAS_RESIDUAL))
    pid, pk = gl.program_id(0), gl.program_id(1)
    n_m = gl.cdiv(M, BLOCK_M)
    per = K // BLOCK_K // SPLIT_K
    b_lo = pk * per
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * DW if RS else 32 * DW + 1)
        mbarrier.init(empty.index(i), count=32 * NW if TA else 1)
    if RS:
        shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        w_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_K // 8], shl)
        s_s = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_K // 16], shl)
        if KS == 2:
            red_s = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M], shl)
            done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            mbarrier.init(done.index(0), count=1)
            acc, = gl.warp_specialize([
                (_consumer_rs, (w_s, s_s, x_s, ready, empty, red_s, done, b_lo, b_lo + per, KS, BLOCK_M, BLOCK_N,
                                BLOCK_K, STAGES, NW, BITS, PP, TA)),
                (_consumer_rs_odd, (w_s, s_s, x_s, ready, empty, red_s, done, b_lo, b_lo + per, BLOCK_M, BLOCK_N,
                                    BLOCK_K, STAGES, NW, BITS, PP, TA)),
                (_loader, (w_ptr, ws_ptr, x_ptr, w_s, s_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn,
                           pid // n_m, pid % n_m, b_lo, b_lo + per, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DW, TILED, XP,
                           PDL)),
            ], [NW, DW], [KREGS, DREGS])
        else:
            acc, = gl.warp_specialize([
                (_consumer_rs, (w_s, s_s, x_s, ready, empty, w_s, ready, b_lo, b_lo + per, KS, BLOCK_M, BLOCK_N,
                                BLOCK_K, STAGES, NW, BITS, PP, TA)),  # (red_s, done unused)
                (_loader, (w_ptr, ws_ptr, x_ptr, w_s, s_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn,
                           pid // n_m, pid % n_m, b_lo, b_lo + per, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DW, TILED, XP,
                           PDL)),
            ], [DW], [DREGS])
    else:
        w_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K],
                                        gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
        acc, = gl.warp_specialize([
            (_consumer, (w_s, x_s, ready, empty, b_lo, b_lo + per, BLOCK_M, BLOCK_N, STAGES, NW)),
            (_decoder, (w_ptr, ws_ptr, x_ptr, w_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn,
                        pid // n_m, pid % n_m, b_lo, b_lo + per, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DW, TILED, BITS,
                        NAT)),
        ], [DW], [DREGS])
    oL: gl.constexpr = gm.out_layout(BLOCK_N, NW)
    if PDL:  # the residual may be the kernel before's output (the loader waited in its own warps)
        gg._gdc_wait()
    gg._store_out(gl.convert_layout(acc, oL),
                  (pid // n_m) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, oL)),
                  (pid % n_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, oL)), pk, M, N, ws2_ptr,
                  bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@gluon.jit
def _sk_loader(w_ptr, ws_ptr, x_ptr, w_s, s_s, x_s, ready, empty, M, N, K, DP, stride_xm, stride_wn, stride_sn,
               BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, DW: gl.constexpr,
               TILED: gl.constexpr, XP: gl.constexpr, PDL: gl.constexpr = False):
    """_loader over a persistent program's work items: the ring position g counts every block the program takes.
    PDL: it waits for the kernel before (permute_k, which writes x) before its first copy."""
    pid, G, n_dp, it, end, NP, n_m = gm.sk_walk(M, N, K, DP, BM, BN, BK)
    if PDL:
        gg._gdc_wait()
    i = 0
    g = 0
    while (i < n_dp) | (it < end):
        t, p0, p1, i, it = gm.sk_item(i, it, end, n_dp, pid, G, DP, NP)
        wp, sp, x_rows = _loader_ptrs(w_ptr, ws_ptr, x_ptr, M, N, K, stride_xm, stride_wn, stride_sn, t // n_m,
                                      t % n_m, BM, BN, BK, DW, TILED, XP)
        for kb in range(2 * p0, 2 * p1):
            _copy_block(w_s, s_s, x_s, ready, empty, g, kb, wp, sp, x_rows, BK, S, TILED)
            g += 1


@gluon.jit
def _sk_consumer(w_s, s_s, x_s, ready, empty, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K, DP,
                 stride_rm, stride_om, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr,
                 NW: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr, BITS: gl.constexpr,
                 TA: gl.constexpr = False, FIX: gl.constexpr = 0, PDL: gl.constexpr = False,
                 TRACE: gl.constexpr = False):
    """The RS consumers over a persistent program's work items: each item's blocks through _rs_step (its first
    block releases nothing: the item before released its last one after its final wait), then the item's epilogue
    here (gluon_gemm.sk_store: a whole tile stored, a part to part_ptr for sk_reduce_kernel, or with FIX 1 summed by
    the program that completes the tile's counter: gluon_gemm.sk_fixup; FIX 2: by the tile's owner, which waits for
    the others' parts: gluon_gemm.sk_finish_own). PDL: they wait for the kernel before
    (whose output the residual may be) before their first block. TRACE (experiments only: tools/dev/nvfp4_rs_sk_trace)
    writes time stamps after the parts in part_ptr: int64 row pid of TRACE_ROW, globaltimer at the start and the end,
    then per item (up to TRACE_ITEMS) %clock64 at its start, after its last wgmma, after its store and after FIX, and
    last %clock64 at the start and the end."""
    acc_l, aL, wL, sL, pL = gm.wgmma_layouts(BN, BM, BK, NW)
    oL: gl.constexpr = gm.out_layout(BN, NW)
    pid, G, n_dp, it, end, NP, n_m = gm.sk_walk(M, N, K, DP, BM, BN, BK)
    if TRACE:
        tp = part_ptr.to(gl.pointer_type(gl.int64)) + G * (BM * BN) + pid * TRACE_ROW  # [G, 2, BN, BM] fp32 first
        gl.store(tp, _timer("globaltimer"))
        gl.store(tp + TRACE_ROW - 2, _timer("clock64"))
    if PDL:
        gg._gdc_wait()
    i = 0
    g = 0
    j = 0
    while (i < n_dp) | (it < end):
        t, p0, p1, i, it = gm.sk_item(i, it, end, n_dp, pid, G, DP, NP)
        if TRACE:
            _trace(tp, j, 0)
        acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        a1 = gl.zeros([BN, BK], gl.bfloat16, layout=aL)
        for q in range(p0, p1):  # two blocks a step (a pair), as _rs_loop
            acc, a0, a1 = _rs_step(acc, a1, w_s, s_s, x_s, ready, empty, g, q > p0, 1, BN, BK, S, wL, sL, pL, aL,
                                   BITS, False, TA)
            acc, a1, a0 = _rs_step(acc, a0, w_s, s_s, x_s, ready, empty, g + 1, True, 1, BN, BK, S, wL, sL, pL,
                                   aL, BITS, False, TA)
            g += 2
        acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
        _release(empty.index((g + S - 1) % S), True, TA)  # the item's last block: its wgmma has completed
        if TRACE:
            _trace(tp, j, 1)
        if FIX == 2:
            gm.sk_finish_own(acc, t, p0, p1, NP, n_m, pid, DP, G, part_ptr, cnt_ptr, M, N, ws2_ptr, bias_ptr, res_ptr,
                             out_ptr, stride_rm, stride_om, BM, BN, oL, HAS_BIAS, HAS_RESIDUAL)
        else:
            gm.sk_store(acc, t, p0, p1, NP, n_m, pid, part_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm,
                        stride_om, BM, BN, oL, HAS_BIAS, HAS_RESIDUAL)
        if TRACE:
            _trace(tp, j, 2)
        if FIX == 1:
            if (p0 != 0) | (p1 != NP):  # a part: stored by sk_store
                gm.sk_fixup(acc, t, DP, NP, G, n_m, part_ptr, cnt_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                            stride_rm, stride_om, BM, BN, oL, HAS_BIAS, HAS_RESIDUAL)
        if TRACE:
            _trace(tp, j, 3)
        j += 1
    if TRACE:
        gl.store(tp + 1, _timer("globaltimer"))
        gl.store(tp + TRACE_ROW - 1, _timer("clock64"))
    return ()


TRACE_ROW = gl.constexpr(32)
"""int64 slots a program of a TRACE launch: 2 globaltimer stamps, then 4 %clock64 stamps for each of TRACE_ITEMS."""
TRACE_ITEMS = gl.constexpr(7)


@gluon.jit
def _timer(which: gl.constexpr):
    """%globaltimer (ns, common to the SMs) or %clock64 (this SM's cycles), read once."""
    if which == "globaltimer":
        return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    else:
        return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _trace(tp, j, k: gl.constexpr):
    """TRACE: stamp k of item j (%clock64), dropped past TRACE_ITEMS items."""
    if j < TRACE_ITEMS:
        gl.store(tp + 2 + j * 4 + k, _timer("clock64"))


@gluon.jit
def nvfp4_gemm_rs_sk_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr,
                            M, N, K, DP, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                            STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                            TILED: gl.constexpr = False, BITS: gl.constexpr = False, DW: gl.constexpr = 4,
                            DREGS: gl.constexpr = 64, XP: gl.constexpr = False, TA: gl.constexpr = False,
                            FIX: gl.constexpr = 0, PDL: gl.constexpr = False, TRACE: gl.constexpr = False):
    """RS (nvfp4_gemm_ws_kernel's consumers and loader) on gluon_gemm.nvfp4_gemm_wgmma_sk_kernel's persistent grid and
    work walk: G programs, the first DP tiles whole, the rest as equal ranges of block pairs; the parts of shared
    tiles go to part_ptr for triton_gemv.sk_reduce_kernel, or with FIX 1 the program that completes a tile's counter
    (cnt_ptr, zero before and after) sums them, with FIX 2 the tile's owner (_sk_consumer). The ring runs on across a program's items; each item's epilogue is in
    the consumer partition. x k-permuted (permute_k) unless XP; K % (2 BLOCK_K) == 0. PDL: compiled for
    programmatic dependent launch after permute_k (both partitions wait for it before touching x or the residual).
    TRACE: time stamps after the parts (_sk_consumer; experiments only, part_ptr then needs G TRACE_ROW int64 more)."""
    NW: gl.constexpr = gl.num_warps()
    shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    w_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_K // 8], shl)
    s_s = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_K // 16], shl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * DW)
        mbarrier.init(empty.index(i), count=32 * NW if TA else 1)
    gl.warp_specialize([
        (_sk_consumer, (w_s, s_s, x_s, ready, empty, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K,
                        DP, stride_rm, stride_om, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, NW, HAS_BIAS, HAS_RESIDUAL, BITS,
                        TA, FIX, PDL, TRACE)),
        (_sk_loader, (w_ptr, ws_ptr, x_ptr, w_s, s_s, x_s, ready, empty, M, N, K, DP, stride_xm, stride_wn, stride_sn,
                      BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DW, TILED, XP, PDL)),
    ], [DW], [DREGS])


def rs_sk_constexprs(config: dict, has_bias: bool = False, has_residual: bool = False) -> dict:
    """nvfp4_gemm_rs_sk_kernel's constexprs for an RS config with "SK" (programs) and "DP" (sk_dp_tiles' mode)."""
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "STAGES": config["STAGES"], "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual,
            "TILED": bool(config.get("TILED")), "BITS": bool(config.get("BITS")), "DW": config.get("DW", 4),
            "DREGS": config.get("DREGS", 64), "XP": bool(config.get("XP")), "TA": bool(config.get("TA")),
            "FIX": int(config.get("FIX", 0)), "PDL": bool(config.get("PDL")), "TRACE": bool(config.get("TRACE"))}


def signature_nvfp4_gemm_rs_sk(config: dict, N: int, K: int, has_bias: bool = False, has_residual: bool = False):
    """AotSignature of nvfp4_gemm_rs_sk_kernel for a contiguous [N, K] weight: the parameters of
    gluon_gemm.signature_nvfp4_gemm_wgmma_sk less the FIX counters (x_ptr: x_operand's output); the grid is the
    config's "SK" programs, and gluon_gemm.signature_sk_reduce sums the shared tiles after it."""
    from atlas.plugins_trt.quant_linear.triton_gemm import nvfp4_gemm_params
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature

    types, ints = nvfp4_gemm_params(N, K, part_ptr="*fp32", cnt_ptr="*i32", DP="i32")
    return aot_signature(nvfp4_gemm_rs_sk_kernel, types, ints, rs_sk_constexprs(config, has_bias, has_residual),
                         config, (str(config["SK"]), "1", "1"))


def launch_nvfp4_gemm_rs_sk(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                            part: torch.Tensor | None = None, reduce: bool = True,
                            counters: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual) through nvfp4_gemm_rs_sk_kernel on config["SK"] programs, then (without
    "FIX") triton_gemv.sk_reduce_kernel over the tiles the programs shared (as gluon_gemm.launch_nvfp4_gemm_wgmma_sk).
    part: a preallocated gluon_gemm.sk_partials_shape buffer; counters: FIX's int32 tile counters (zero; zero again
    afterwards); reduce=False leaves the shared tiles unsummed."""
    M, K = x.shape
    N = weight.shape[0]
    if K % (2 * config["BLOCK_K"]):
        raise ValueError(f"the RS stream-K GEMM needs K % (2 BLOCK_K) == 0, got K = {K}, config {config}")
    if config.get("FIX") == 2 and config["SK"] > torch.cuda.get_device_properties(x.device).multi_processor_count:
        raise ValueError(f"FIX 2 needs every program resident (SK <= the SM count): its owners wait for the others' "
                         f"parts; got SK = {config['SK']}")
    xp = x_operand(x, config)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return out
    if part is None:
        part = torch.empty(gm.sk_partials_shape(config), dtype=torch.float32, device=x.device)
    res = residual if residual is not None else out
    dp = gm.sk_dp_tiles(config, M, N)
    if counters is None:
        counters = gm.sk_counter_buffer(gm.sk_counters(config, M, N), x.device)
    nvfp4_gemm_rs_sk_kernel[(config["SK"], 1, 1)](
        xp, weight, weight_scale, weight_scale_2, bias if bias is not None else out, res, out, part, counters, M, N, K,
        dp, xp.stride(0), weight.stride(0), weight_scale.stride(0), res.stride(0), out.stride(0),
        **rs_sk_constexprs(config, bias is not None, residual is not None), num_warps=config["num_warps"],
        num_stages=config["num_stages"], launch_pdl=bool(config.get("PDL")))
    if reduce and not config.get("FIX"):
        gm.launch_sk_reduce(config, part, weight_scale_2, bias, residual, out, K, dp)
    return out


def ws_constexprs(config: dict, has_bias: bool = False, has_residual: bool = False) -> dict:
    """nvfp4_gemm_ws_kernel's constexprs for a "WS" config (bias and residual only without SPLIT_K)."""
    split = config.get("SPLIT_K", 1)
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "STAGES": config["STAGES"], "HAS_BIAS": has_bias and split == 1,
            "HAS_RESIDUAL": has_residual and split == 1, "TILED": bool(config.get("TILED")), "SPLIT_K": split,
            "BITS": bool(config.get("BITS")), "DW": config.get("DW", 4), "DREGS": config.get("DREGS", 128),
            "NAT": bool(config.get("NAT")), "RS": bool(config.get("RS")), "KS": config.get("KS", 1),
            "KREGS": config.get("KREGS", 224), "PP": bool(config.get("PP")), "XP": bool(config.get("XP")),
            "TA": bool(config.get("TA")), "PDL": bool(config.get("PDL"))}


def supports(config: dict, K: int) -> bool:
    """Whether a WS config can serve K: whole blocks in each of SPLIT_K equal ranges (RS: an even number for each of
    its KS consumers)."""
    blocks = 2 * config.get("KS", 1) if config.get("RS") else 1  # RS: an even count for each consumer
    return K % (config["BLOCK_K"] * config.get("SPLIT_K", 1) * blocks) == 0


def x_operand(x: torch.Tensor, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """The activation as a WS config's kernel reads it: as given (NAT, XP) or in the decode's k order (permute_k)."""
    from atlas.plugins_trt.quant_linear.triton_gemm import permutes_x

    return gm.permute_k(x, config["BLOCK_K"], out) if permutes_x(config) else x.contiguous()


def signature_nvfp4_gemm_ws(config: dict, N: int, K: int, has_bias: bool = False, has_residual: bool = False):
    """AotSignature of nvfp4_gemm_ws_kernel for a contiguous [N, K] weight: gluon_gemm.signature_nvfp4_gemm_wgmma's
    parameters and grid (x_ptr: x_operand's output; out_ptr fp32 partials with SPLIT_K > 1)."""
    from atlas.plugins_trt.quant_linear.triton_gemm import nvfp4_gemm_params
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature

    types, ints = nvfp4_gemm_params(N, K, "*fp32" if config.get("SPLIT_K", 1) > 1 else "*bf16")
    return aot_signature(nvfp4_gemm_ws_kernel, types, ints, ws_constexprs(config, has_bias, has_residual), config,
                         gm.WGMMA_GRID)


def launch_nvfp4_gemm_ws(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                         residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         x_perm: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N] through nvfp4_gemm_ws_kernel; config: BLOCK_M, BLOCK_N,
    BLOCK_K, STAGES, num_warps, num_stages (1), DW, optional DREGS + MAXNREG, NAT, TILED, BITS, SPLIT_K (fp32
    partials, then triton_gemv's split-K reduction). x_perm: a preallocated [M, K] buffer for permute_k."""
    M, K = x.shape
    N = weight.shape[0]
    if not supports(config, K):
        raise ValueError(f"the warp-specialized GEMM needs K % (BLOCK_K SPLIT_K) == 0, got K = {K}, config {config}")
    xp = x_operand(x, config, x_perm)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return out
    res = residual if residual is not None else out
    split = config.get("SPLIT_K", 1)
    dst = out if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    nvfp4_gemm_ws_kernel[gm.grid_wgmma(config, M, N)](
        xp, weight, weight_scale, weight_scale_2, bias if bias is not None else out, res, dst, M, N, K,
        xp.stride(0), weight.stride(0), weight_scale.stride(0), res.stride(0), N if split > 1 else out.stride(0),
        **ws_constexprs(config, bias is not None, residual is not None), num_warps=config["num_warps"],
        num_stages=config["num_stages"], maxnreg=config.get("MAXNREG"), launch_pdl=bool(config.get("PDL")))
    if split > 1:
        from atlas.plugins_trt.quant_linear.triton_gemv import CONFIGS_splitk_reduce, launch_splitk_reduce
        launch_splitk_reduce(dst, out, CONFIGS_splitk_reduce[0], bias, residual)
    return out
