"""NVFP4 GEMM for M >= 64 in Gluon: wgmma with the weights decoded straight into the register A operand (swap-AB:
acc[BLOCK_N, BLOCK_M] += W[BLOCK_N, BLOCK_K] @ x^T[BLOCK_K, BLOCK_M]), x tiles through a cp.async ring in shared
memory as the B operand. One more way of the GEMM buckets (triton_gemm.CONFIGS_nvfp4_wgmma, "WGMMA": True; the
build keeps it only where it is correct and fastest); `python -m atlas.tools.dev.nvfp4_wgmma_gemm` checks and times
it on the GPU box on its own.

Why Gluon: Triton 3.6's swap-AB form of this kernel (tools/dev/nvfp4_swap_ab.py, NOTES.md) lets the next block's
decode overwrite A registers an in-flight wgmma still reads (the wait it emits covers the shared-memory operand
only). Here the wait is explicit: block kb's A operand is carried into the next iteration and passed to the
`warpgroup_mma_wait(num_outstanding=1, deps=...)` that follows block kb + 1's wgmma, so it stays live (and its
registers unclaimed) until the wgmma that reads it has completed, while the decode of the next block overlaps it.

The weights are decoded exactly as in the Gluon GEMV (gluon_gemv._a_operand: the same k permutation inside each
BLOCK_K block, one PTX op per bf16x2 pair, layouts checked by assert_trivial conversions). The B operand is read by
the hardware in its natural k order, so x is permuted the same way first (`permute_k`: one gather over M x K bf16,
2.6 MB at M = 256, K = 5120).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from atlas.plugins_trt.buffers import grown
from atlas.plugins_trt.quant_linear import gluon_gemv as gg


@gluon.constexpr_function
def out_layout(BN, NW):
    """The epilogue's layout: 8 consecutive output columns (n) a thread, n fastest across lanes."""
    BN, NW = (getattr(v, "value", v) for v in (BN, NW))
    tn = min(BN // 8, 32)
    return gl.BlockedLayout([8, 1], [tn, 32 // tn], [1, NW], [0, 1])


@gluon.constexpr_function
def wgmma_layouts(BN, BM, BK, NW):
    """The decode-in-the-loop wgmma kernels' layouts: (accumulator [BN, BM], register A operand, words, scales,
    pairs)."""
    BN, BM, BK, NW = (getattr(v, "value", v) for v in (BN, BM, BK, NW))
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    layouts = (acc, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2),
               gg.words_layout(BN, BK // 8, NW, False), gg.words_layout(BN, BK // 8, NW, True),
               gg.pairs_layout(BN, BK, NW))
    return gl.tuple([gl.constexpr(v) for v in layouts])  # a tuple of constexprs, unpacked in the kernels


@gluon.jit
def _woff(kb, BK: gl.constexpr, TILED: gl.constexpr):
    """int32-word offset of weight block kb (BK columns) from a row's block 0: row-major BK / 8 words a block;
    tiled (layout.py: 2048 words a tile, 16 a tile row) a block of BK >= 128 starts BK / 128 tiles on, and blocks of
    BK < 128 share a tile row, (128 / BK) of them (written so that the compiler sees each term's alignment)."""
    if TILED:
        if BK >= 128:
            return kb * (BK // 128) * 2048
        else:
            return (kb // (128 // BK)) * 2048 + (kb % (128 // BK)) * (BK // 8)
    else:
        return kb * (BK // 8)


@gluon.jit
def _soff(kb, BK: gl.constexpr, TILED: gl.constexpr):
    """Byte offset of block kb's scales (BK / 16 a row): as _woff, 1024 bytes a tile, 8 a tile row."""
    if TILED:
        if BK >= 128:
            return kb * (BK // 128) * 1024
        else:
            return (kb // (128 // BK)) * 1024 + (kb % (128 // BK)) * (BK // 16)
    else:
        return kb * (BK // 16)


@gluon.jit
def _step(acc, a_prev, wd, sr, x_s, x_rows, w_rows, s_rows, kb, b_lo, b_hi, BN: gl.constexpr, BK: gl.constexpr,
          KW: gl.constexpr, RP: gl.constexpr, S: gl.constexpr, wL: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr,
          TILED: gl.constexpr, BITS: gl.constexpr = False):
    """Block kb: refill the x slot of block kb - 2 with block kb + S - 2 (every warpgroup is past its wait for block
    kb - 2's wgmma: the barrier), decode block kb's weights (wd, sr) into A, issue its wgmma, wait for block
    kb - 1's (whose A operand is a_prev: a dependency of that wait, so its registers are not reused before), load
    block kb + 1's weights. Returns (acc, A of kb, a_prev, next wd, next sr); the caller alternates two A values so
    that no copy between loop iterations moves an operand away from its registers (a wgmma reads the registers it
    was issued with)."""
    async_copy.wait_group(S - 3)  # block kb's x (this thread's copies) has landed
    fence_async_shared()           # ... visible to the wgmma (async proxy)
    gl.thread_barrier()            # everyone's copies are in; every warpgroup has waited for block kb - 2's wgmma
    it = kb - b_lo  # slots count from the split's first block (the prologue filled slot i with block b_lo + i)
    async_copy.async_copy_global_to_shared(x_s.index((it + S - 2) % S),
                                           x_rows + gl.minimum(kb + S - 2, b_hi - 1) * BK)
    async_copy.commit_group()
    a = gg._a_operand(wd, gg._scales(sr, BN, KW, wL), BN, BK, RP, pL, aL, BITS)
    nxt = gl.minimum(kb + 1, b_hi - 1)  # the next block's weights, in registers while this one multiplies
    wd = gl.load(w_rows + _woff(nxt, BK, TILED))
    sr = gl.load(s_rows + _soff(nxt, BK, TILED))
    acc = warpgroup_mma(a, x_s.index(it % S).permute((1, 0)), acc, is_async=True)
    acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
    return acc, a, a_prev, wd, sr


@gluon.jit
def _step_smem(acc, a_prev, x_s, w_s, s_s, x_rows, wp, sp, kb, b_lo, b_hi, BN: gl.constexpr, BK: gl.constexpr,
               KW: gl.constexpr, RP: gl.constexpr, S: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr,
               pL: gl.constexpr, aL: gl.constexpr, TILED: gl.constexpr, BITS: gl.constexpr = False):
    """_step with the weights and scales in the cp.async ring beside x (W_SMEM): refill slot kb - 2 with block
    kb + S - 2's x, words and scales, read block kb's words and scales from shared memory, decode, issue, wait for
    block kb - 1's wgmma. The weights are S - 2 blocks in flight instead of one block in registers."""
    async_copy.wait_group(S - 3)
    fence_async_shared()
    gl.thread_barrier()
    it = kb - b_lo  # slots count from the split's first block
    slot = (it + S - 2) % S
    nxt = gl.minimum(kb + S - 2, b_hi - 1)
    async_copy.async_copy_global_to_shared(x_s.index(slot), x_rows + nxt * BK)
    async_copy.async_copy_global_to_shared(w_s.index(slot), wp + _woff(nxt, BK, TILED))
    async_copy.async_copy_global_to_shared(s_s.index(slot), sp + _soff(nxt, BK, TILED))
    async_copy.commit_group()
    wd = w_s.index(it % S).load(wL)
    sr = s_s.index(it % S).load(sL).to(gl.float8e4nv, bitcast=True)
    a = gg._a_operand(wd, gg._scales(sr, BN, KW, wL), BN, BK, RP, pL, aL, BITS)
    acc = warpgroup_mma(a, x_s.index(it % S).permute((1, 0)), acc, is_async=True)
    acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
    return acc, a, a_prev


@gluon.jit
def _tile_ptrs(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m, BM: gl.constexpr,
               BN: gl.constexpr, BK: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr, xcL: gl.constexpr,
               TILED: gl.constexpr):
    """Block 0's pointers of output tile (pid_n, pid_m): the weight words [BN, BK / 8] (layout wL) and scale bytes
    [BN, BK / 16] (sL) of its rows, and x [BM, BK] (xcL) of its tokens (rows past N and M clamped)."""
    KW: gl.constexpr = BK // 8
    rows = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wL)), N - 1)
    srows = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, sL)), N - 1)
    w_rows, s_rows = gg._row_ptrs(w_ptr, ws_ptr, rows, srows, gl.arange(0, KW, layout=gl.SliceLayout(0, wL)),
                                  gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL)), K, stride_wn, stride_sn, BK,
                                  TILED)
    xm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, xcL))
    x_rows = x_ptr + gl.minimum(xm, M - 1)[:, None] * stride_xm \
        + gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))[None, :]
    return w_rows, s_rows, x_rows


@gluon.jit
def ring_ptrs(w_ptr, ws_ptr, N, K, stride_wn, stride_sn, pid_n, BN: gl.constexpr, BK: gl.constexpr,
              NW: gl.constexpr, TILED: gl.constexpr):
    """Block 0's source pointers of a weight block's cp.async copies into a shared-memory ring (NW warps issuing):
    the packed words [BN, BK / 8] in 16-byte copies and the scale bytes [BN, BK / 16] in 4-byte ones (rows past N
    clamped)."""
    KW: gl.constexpr = BK // 8
    wcL: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (KW // 4), KW // 4], [NW, 1], [1, 0])  # 16-byte copies
    scL: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (KW // 8), KW // 8], [NW, 1], [1, 0])  # 4-byte copies
    wr = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wcL)), N - 1)
    sq = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, scL)), N - 1)
    return gg._row_ptrs(w_ptr, ws_ptr.to(gl.pointer_type(gl.int8)), wr, sq,
                        gl.arange(0, KW, layout=gl.SliceLayout(0, wcL)),
                        gl.arange(0, KW // 2, layout=gl.SliceLayout(0, scL)), K, stride_wn, stride_sn, BK, TILED)


@gluon.jit
def _tile_acc(x_ptr, w_ptr, ws_ptr, x_s, w_s, s_s, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m, b_lo, b_hi,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, NW: gl.constexpr,
              W_SMEM: gl.constexpr, TILED: gl.constexpr, BITS: gl.constexpr):
    """acc [BN, BM] fp32 = W[pid_n tile rows, blocks b_lo .. b_hi) @ x^T (the output tile (pid_n, pid_m) over those
    K blocks; b_hi - b_lo even). x_s (and w_s, s_s with W_SMEM) are the kernel's ring; every copy into it has landed
    and every wgmma reading it has completed when this returns, so the next call may refill it."""
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    acc_l, aL, wL, sL, pL = wgmma_layouts(BN, BM, BK, NW)
    xcL: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [NW, 1], [1, 0])  # 16-byte copies

    w_rows, s_rows, x_rows = _tile_ptrs(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m,
                                        BM, BN, BK, wL, sL, xcL, TILED)

    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    a1 = gl.zeros([BN, BK], gl.bfloat16, layout=aL)
    gl.thread_barrier()  # every warp is past its reads of the ring (a previous call's last blocks)
    if W_SMEM:
        wp, sp = ring_ptrs(w_ptr, ws_ptr, N, K, stride_wn, stride_sn, pid_n, BN, BK, NW, TILED)
        for i in gl.static_range(S - 2):  # prologue: blocks b_lo .. b_lo + S - 3 (clamped; an extra copy is harmless)
            kb0 = gl.minimum(b_lo + i, b_hi - 1)
            async_copy.async_copy_global_to_shared(x_s.index(i), x_rows + kb0 * BK)
            async_copy.async_copy_global_to_shared(w_s.index(i), wp + _woff(kb0, BK, TILED))
            async_copy.async_copy_global_to_shared(s_s.index(i), sp + _soff(kb0, BK, TILED))
            async_copy.commit_group()
        for kb in range(b_lo, b_hi, 2):  # unrolled by two, as below
            acc, a0, a1 = _step_smem(acc, a1, x_s, w_s, s_s, x_rows, wp, sp, kb, b_lo, b_hi, BN, BK, KW, RP, S, wL,
                                     sL, pL, aL, TILED, BITS)
            acc, a1, a0 = _step_smem(acc, a0, x_s, w_s, s_s, x_rows, wp, sp, kb + 1, b_lo, b_hi, BN, BK, KW, RP, S,
                                     wL, sL, pL, aL, TILED, BITS)
    else:
        for i in gl.static_range(S - 2):  # prologue: x of blocks b_lo .. b_lo + S - 3 (clamped)
            async_copy.async_copy_global_to_shared(x_s.index(i), x_rows + gl.minimum(b_lo + i, b_hi - 1) * BK)
            async_copy.commit_group()
        wd = gl.load(w_rows + _woff(b_lo, BK, TILED))
        sr = gl.load(s_rows + _soff(b_lo, BK, TILED))
        for kb in range(b_lo, b_hi, 2):  # unrolled by two: the A operands of even and odd blocks are different values
            acc, a0, a1, wd, sr = _step(acc, a1, wd, sr, x_s, x_rows, w_rows, s_rows, kb, b_lo, b_hi, BN, BK, KW, RP,
                                        S, wL, pL, aL, TILED, BITS)
            acc, a1, a0, wd, sr = _step(acc, a0, wd, sr, x_s, x_rows, w_rows, s_rows, kb + 1, b_lo, b_hi, BN, BK, KW,
                                        RP, S, wL, pL, aL, TILED, BITS)
    acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _ring(BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, W_SMEM: gl.constexpr):
    """The shared-memory ring of _tile_acc: S slots of x [BM, BK] (NVMMA 128-byte swizzle, the wgmma's B operand),
    with W_SMEM also S slots of weight words [BN, BK / 8] and scale bytes [BN, BK / 16] (w_s, s_s: x_s otherwise)."""
    x_s = gl.allocate_shared_memory(gl.bfloat16, [S, BM, BK],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    if W_SMEM:
        shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        w_s = gl.allocate_shared_memory(gl.int32, [S, BN, BK // 8], shl)
        s_s = gl.allocate_shared_memory(gl.int8, [S, BN, BK // 16], shl)
        return x_s, w_s, s_s
    else:
        return x_s, x_s, x_s


@gluon.jit
def nvfp4_gemm_wgmma_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                            M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                            STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                            W_SMEM: gl.constexpr = False, TILED: gl.constexpr = False, SPLIT_K: gl.constexpr = 1,
                            BITS: gl.constexpr = False):
    """out[M, N] = x @ W^T (+ bias) (+ residual), x given k-permuted (permute_k). Grid (cdiv(N, BLOCK_N) *
    cdiv(M, BLOCK_M),), M tiles fastest (neighbouring programs share a weight tile). K % (2 BLOCK_K) == 0; BLOCK_N a
    multiple of 16 x num_warps; BLOCK_M 64..256, a multiple of 64 up to 256; STAGES >= 3 x slots (prefetch
    distance STAGES - 2 blocks). W_SMEM: the weight words and scales go through the same ring (_step_smem)
    instead of one block ahead in registers, whose load latency (about 1 us) one block's wgmma does not cover.
    TILED: the weights in the engine's tiled order (layout.tile_nvfp4; N % 128 == K % 128 == 0), strides ignored.
    BITS: each word's bits in layout.NVFP4_BITS order (layout.bits_nvfp4; gluon_gemv._bits_pair_asm decodes).
    SPLIT_K > 1: grid (tiles, SPLIT_K); program (t, s) takes the s-th of SPLIT_K equal K ranges (K % (2 BLOCK_K
    SPLIT_K) == 0) and writes fp32 partials to out_ptr [SPLIT_K, M, N] (stride_om = N) without bias or residual,
    which triton_gemv.splitk_reduce_kernel sums and adds: for shapes with fewer tiles than SMs (27B down at M 256:
    80 programs of 64 x 256 on 132 SMs)."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(SPLIT_K == 1 or not (HAS_BIAS or HAS_RESIDUAL))  # the split-K reduction adds those
    pid, pk = gl.program_id(0), gl.program_id(1)
    n_m = gl.cdiv(M, BLOCK_M)
    per = K // BLOCK_K // SPLIT_K  # even (supports): the loops take two blocks a step
    x_s, w_s, s_s = _ring(BLOCK_M, BLOCK_N, BLOCK_K, STAGES, W_SMEM)
    acc = _tile_acc(x_ptr, w_ptr, ws_ptr, x_s, w_s, s_s, M, N, K, stride_xm, stride_wn, stride_sn, pid // n_m,
                    pid % n_m, pk * per, pk * per + per, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, NW, W_SMEM, TILED, BITS)
    # epilogue in a layout with n fastest (16-byte stores along the output rows)
    oL: gl.constexpr = out_layout(BLOCK_N, NW)
    gg._store_out(gl.convert_layout(acc, oL), (pid // n_m) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, oL)),
                  (pid % n_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, oL)), pk, M, N, ws2_ptr,
                  bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@gluon.jit
def _fence():
    """fence.acq_rel.gpu: this thread's earlier writes are visible GPU-wide before its later ones (and reads)."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def sk_owners(u, NP, T, G):
    """The programs whose stream-K ranges [c T / G, (c + 1) T / G) hold the first and the last block pair of
    stream-K tile u (G <= T: every range is non-empty)."""
    x0 = u * NP
    return ((x0 + 1) * G + T - 1) // T - 1, ((x0 + NP) * G + T - 1) // T - 1


@gluon.jit
def sk_item(i, it, end, n_dp, pid, G, DP, NP):
    """The next work item of a persistent program (sk_walk's share): data-parallel
    tile pid + i G while i < n_dp, then the stream-K range [it, end) of block pairs tile by tile. Returns (tile,
    first pair, end pair, next i, next it)."""
    if i < n_dp:
        t = pid + i * G
        p0 = 0
        p1 = NP
        i += 1
    else:
        u = it // NP
        t = DP + u
        p0 = it - u * NP
        p1 = gl.minimum(NP, p0 + end - it)
        it += p1 - p0
    return t, p0, p1, i, it


@gluon.jit
def sk_walk(M, N, K, DP, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """A persistent program's share of the work (the same in every partition of a warp-specialized kernel):
    (program, programs, data-parallel tiles, stream-K range start and end, pairs a tile, M tiles). The data-parallel
    tiles are pid, pid + G, ... < DP; the T = (tiles - DP) x pairs block pairs of the rest are cut into
    Gs = min(G, T) equal ranges [c T / Gs, (c + 1) T / Gs) (empty for pid >= Gs)."""
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    n_m = gl.cdiv(M, BM)
    NP = K // (2 * BK)
    n_dp = gl.maximum(DP - pid + G - 1, 0) // G
    T = (gl.cdiv(N, BN) * n_m - DP) * NP
    Gs = gl.maximum(gl.minimum(G, T), 1)
    return pid, G, n_dp, gl.minimum(pid, Gs) * T // Gs, gl.minimum(pid + 1, Gs) * T // Gs, NP, n_m


@gluon.jit
def _part_offsets(acc, BN: gl.constexpr, BM: gl.constexpr):
    """Offsets of a stream-K part [BN, BM] (m contiguous) in the layout of acc: the wgmma accumulator's own, in which
    each thread holds pairs of consecutive m, so a part is stored and read back as 8-byte accesses that fill whole
    sectors, with no layout conversion (the [m, n] parts stored from the epilogue layout took ~3 us a 128 x 128 part
    on an H100: tools/results/nvfp4_rs_sk_trace_h100.log)."""
    on = gl.arange(0, BN, layout=gl.SliceLayout(1, acc.type.layout))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, acc.type.layout))
    return on[:, None] * BM + om[None, :]


@gluon.jit
def _store_tile(acc, t, n_m, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, BM: gl.constexpr,
                BN: gl.constexpr, oL: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Output tile t (M tiles fastest) from a raw accumulator, through the epilogue layout oL (scale, bias,
    residual)."""
    on = gl.arange(0, BN, layout=gl.SliceLayout(1, oL))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, oL))
    gg._store_out(gl.convert_layout(acc, oL), (t // n_m) * BN + on, (t % n_m) * BM + om, 0, M, N, ws2_ptr, bias_ptr,
                  res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@gluon.jit
def _tile_owners(u, N, n_m, DP, NP, G, BN: gl.constexpr):
    """sk_owners of stream-K tile u with sk_walk's pair count and range count."""
    T = (gl.cdiv(N, BN) * n_m - DP) * NP
    return sk_owners(u, NP, T, gl.maximum(gl.minimum(G, T), 1))


@gluon.jit
def sk_store(acc, t, p0, p1, NP, n_m, pid, part_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
             BM: gl.constexpr, BN: gl.constexpr, oL: gl.constexpr, HAS_BIAS: gl.constexpr,
             HAS_RESIDUAL: gl.constexpr):
    """A persistent program's work item done (acc [BN, BM], the raw wgmma accumulator): a whole tile stored through
    the epilogue layout oL (scale, bias, residual), a part of one to part_ptr [G, 2, BN, BM] as it is: slot 0 for a
    part that starts inside the tile (the program's first), 1 for one that starts at its first pair (its last)."""
    if (p0 == 0) & (p1 == NP):
        _store_tile(acc, t, n_m, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, BM, BN, oL,
                    HAS_BIAS, HAS_RESIDUAL)
    else:
        gl.store(part_ptr + (pid * 2 + (p0 == 0).to(gl.int32)) * (BM * BN)
                 + _part_offsets(acc, BN, BM), acc)


@gluon.jit
def sk_fixup(acc, t, DP, NP, G, n_m, part_ptr, cnt_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm,
             stride_om, BM: gl.constexpr, BN: gl.constexpr, oL: gl.constexpr, HAS_BIAS: gl.constexpr,
             HAS_RESIDUAL: gl.constexpr):
    """FIX, once a program has stored its part of stream-K tile t (sk_store's part case; acc only gives the parts'
    layout): one more on the tile's counter (cnt_ptr, int32 a stream-K tile, zero before the launch); the program
    that completes the count sums the tile's parts in program order (deterministic), stores the tile (scale, bias,
    residual) and zeroes the counter."""
    offs = _part_offsets(acc, BN, BM)
    _fence()
    gl.thread_barrier()
    u = t - DP
    old = gl.atomic_add(cnt_ptr + u, 1, sem="acq_rel", scope="gpu")
    c_first, c_last = _tile_owners(u, N, n_m, DP, NP, G, BN)
    if old == c_last - c_first:  # every other part is in: sum them in program order (its own read back too:
        _fence()                  # holding acc beside the sum would spill)
        tot = gl.load(part_ptr + (c_first * 2 + 1) * (BM * BN) + offs, cache_modifier=".cg")
        for cc in range(c_first + 1, c_last + 1):
            tot += gl.load(part_ptr + (cc * 2) * (BM * BN) + offs, cache_modifier=".cg")
        _store_tile(tot, t, n_m, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, BM, BN, oL,
                    HAS_BIAS, HAS_RESIDUAL)
        gl.store(cnt_ptr + u, 0)


@gluon.jit
def sk_finish_own(acc, t, p0, p1, NP, n_m, pid, DP, G, part_ptr, cnt_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                  stride_rm, stride_om, BM: gl.constexpr, BN: gl.constexpr, oL: gl.constexpr, HAS_BIAS: gl.constexpr,
                  HAS_RESIDUAL: gl.constexpr):
    """A persistent program's work item done, FIX 2 (a fixed owner; gluon_ws.nvfp4_gemm_rs_sk_kernel): a whole tile
    stored (sk_store); a shared tile's other programs store their part (slot 0: each starts inside the tile), then one
    release-add on the tile's counter; its owner, the program holding the tile's first pair (sk_owners' c_first, which
    reaches it at the end of its range, after the others), waits for the count, adds their parts to its own
    accumulator in program order (deterministic, as sk_fixup's sum), stores the tile and zeroes the counter. No part
    of the owner's is written, and nothing waits but the owner: every program is resident (one an SM, G <= SMs)."""
    if (p0 == 0) & (p1 == NP):
        _store_tile(acc, t, n_m, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, BM, BN, oL,
                    HAS_BIAS, HAS_RESIDUAL)
    else:
        offs = _part_offsets(acc, BN, BM)
        u = t - DP
        if p0 == 0:  # the owner
            c_first, c_last = _tile_owners(u, N, n_m, DP, NP, G, BN)
            seen = gl.atomic_add(cnt_ptr + u, 0, sem="acquire", scope="gpu")
            while seen < c_last - c_first:
                seen = gl.atomic_add(cnt_ptr + u, 0, sem="acquire", scope="gpu")
            _fence()
            for cc in range(c_first + 1, c_last + 1):
                acc += gl.load(part_ptr + (cc * 2) * (BM * BN) + offs, cache_modifier=".cg")
            _store_tile(acc, t, n_m, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, BM, BN, oL,
                        HAS_BIAS, HAS_RESIDUAL)
            gl.store(cnt_ptr + u, 0)
        else:
            gl.store(part_ptr + (pid * 2) * (BM * BN) + offs, acc)
            _fence()
            gl.thread_barrier()
            gl.atomic_add(cnt_ptr + u, 1, sem="release", scope="gpu")


@gluon.jit
def nvfp4_gemm_wgmma_sk_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr,
                               M, N, K, DP, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                               STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                               W_SMEM: gl.constexpr = False, TILED: gl.constexpr = False, BITS: gl.constexpr = False,
                               FIX: gl.constexpr = False):
    """nvfp4_gemm_wgmma_kernel on a persistent grid of G programs (about one an SM), the work shared evenly instead of
    tile by tile, so that no wave is left part-empty (27B gate_up at M 256: 544 tiles of 128 x 128 on 264 slots
    were 2.06 waves). The output tiles (M tiles fastest) split in two:
      * the first DP tiles (a whole number of waves, the host's choice: sk_dp_tiles): program c computes tiles c,
        c + G, ... whole and stores them (data-parallel);
      * the rest as stream-K: their K-block pairs, T = tiles x K / (2 BLOCK_K) in all, are cut into Gs = min(G, T)
        equal ranges [c T / Gs, (c + 1) T / Gs); program c < Gs walks its range tile by tile. A tile it covers whole
        is stored; a part of a tile goes as fp32 (the raw accumulator) to part_ptr [G, 2, BLOCK_N, BLOCK_M]: slot 0
        for the part that starts inside a tile (the program's first), slot 1 for the one that starts at a tile's first
        block and ends inside it (its last). Without FIX, triton_gemv.sk_reduce_kernel then sums every shared tile's
        parts in program order (deterministic), scales, adds bias and residual and stores. With FIX the programs do
        it: after its part, a program adds one to the tile's counter (cnt_ptr, int32 a stream-K tile, zero before
        the launch and after it); the one that completes the count sums the parts in program order and stores.
    Same contract as nvfp4_gemm_wgmma_kernel (x k-permuted, K % (2 BLOCK_K) == 0)."""
    NW: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = BLOCK_N
    BM: gl.constexpr = BLOCK_M
    pid, G, n_dp, it, end, NP, n_m = sk_walk(M, N, K, DP, BM, BN, BLOCK_K)
    x_s, w_s, s_s = _ring(BM, BN, BLOCK_K, STAGES, W_SMEM)
    oL: gl.constexpr = out_layout(BN, NW)
    i = 0
    while (i < n_dp) | (it < end):  # one work item a step (one copy of the K loop in the kernel)
        t, p0, p1, i, it = sk_item(i, it, end, n_dp, pid, G, DP, NP)
        acc = _tile_acc(x_ptr, w_ptr, ws_ptr, x_s, w_s, s_s, M, N, K, stride_xm, stride_wn, stride_sn, t // n_m,
                        t % n_m, 2 * p0, 2 * p1, BM, BN, BLOCK_K, STAGES, NW, W_SMEM, TILED, BITS)
        sk_store(acc, t, p0, p1, NP, n_m, pid, part_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm,
                 stride_om, BM, BN, oL, HAS_BIAS, HAS_RESIDUAL)
        if FIX:
            if (p0 != 0) | (p1 != NP):  # a part: stored by sk_store
                sk_fixup(acc, t, DP, NP, G, n_m, part_ptr, cnt_ptr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                         stride_rm, stride_om, BM, BN, oL, HAS_BIAS, HAS_RESIDUAL)


WGMMA_GRID = ("cdiv(N, BLOCK_N) * cdiv(M, BLOCK_M)", "SPLIT_K", "1")


def grid_wgmma(config: dict, M: int, N: int) -> tuple[int, int, int]:
    return (-(-N // config["BLOCK_N"]) * -(-M // config["BLOCK_M"]), config.get("SPLIT_K", 1), 1)


def wgmma_constexprs(config: dict, has_bias: bool, has_residual: bool) -> dict:
    split = config.get("SPLIT_K", 1)
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "STAGES": config["STAGES"], "HAS_BIAS": has_bias and split == 1,
            "HAS_RESIDUAL": has_residual and split == 1,
            "W_SMEM": config.get("W_SMEM", False), "TILED": bool(config.get("TILED")), "SPLIT_K": split,
            "BITS": bool(config.get("BITS"))}


def supports(config: dict, K: int) -> bool:
    """Whether a WGMMA config can serve K: its K loop is unrolled by two blocks (in each of SPLIT_K equal ranges),
    and W_SMEM's 4-byte cp.async of the block scales needs their row stride (K / 16 bytes) 16-byte aligned (Triton
    3.6 fails to compile it otherwise, e.g. K 128, 384, 1152)."""
    return K % (2 * config["BLOCK_K"] * config.get("SPLIT_K", 1)) == 0 and not (config.get("W_SMEM") and K % 256)


def signature_nvfp4_gemm_wgmma(config: dict, N: int, K: int, has_bias: bool = False, has_residual: bool = False):
    """AotSignature of nvfp4_gemm_wgmma_kernel for a contiguous [N, K] weight (M stays a run-time argument); x_ptr is
    the k-permuted activation (permute_k with BLOCK_K); out_ptr '*fp32' partials [SPLIT_K, M, N] when SPLIT_K > 1
    (followed by splitk_reduce_kernel, which adds the bias and residual)."""
    from atlas.plugins_trt.quant_linear.triton_gemm import nvfp4_gemm_params
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature

    types, ints = nvfp4_gemm_params(N, K, "*fp32" if config.get("SPLIT_K", 1) > 1 else "*bf16")
    return aot_signature(nvfp4_gemm_wgmma_kernel, types, ints, wgmma_constexprs(config, has_bias, has_residual),
                         config, WGMMA_GRID)


SK_REDUCE_ROWS = 32
"""Output columns a program of triton_gemv.sk_reduce_kernel sums (of its tile's BLOCK_N)."""


def sk_constexprs(config: dict, has_bias: bool, has_residual: bool) -> dict:
    """nvfp4_gemm_wgmma_sk_kernel's constexprs for a config ("SK": programs, "DP": sk_dp_tiles' mode, "FIX")."""
    cx = {k: v for k, v in wgmma_constexprs(config, has_bias, has_residual).items() if k != "SPLIT_K"}
    return {**cx, "FIX": bool(config.get("FIX"))}


def signature_nvfp4_gemm_wgmma_sk(config: dict, N: int, K: int, has_bias: bool = False,
                                  has_residual: bool = False):
    """AotSignature of nvfp4_gemm_wgmma_sk_kernel for a contiguous [N, K] weight: M and DP (sk_dp_tiles of the
    launch's M) are run-time arguments, the grid is the config's "SK" programs."""
    from atlas.plugins_trt.quant_linear.triton_gemm import nvfp4_gemm_params
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature

    types, ints = nvfp4_gemm_params(N, K, part_ptr="*fp32", cnt_ptr="*i32", DP="i32")
    return aot_signature(nvfp4_gemm_wgmma_sk_kernel, types, ints, sk_constexprs(config, has_bias, has_residual),
                         config, (str(config["SK"]), "1", "1"))


SK_REDUCE_GRID = ("cdiv(N, BLOCK_N) * cdiv(M, BLOCK_M) - DP", f"BLOCK_N // {SK_REDUCE_ROWS}", "1")


def signature_sk_reduce(config: dict, N: int, K: int, has_bias: bool = False, has_residual: bool = False):
    """AotSignature of triton_gemv.sk_reduce_kernel after a (non-FIX) SK config; its grid is SK_REDUCE_GRID over the
    launch's M and DP (launch it only where that is positive)."""
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature, sk_reduce_kernel

    types = {"part_ptr": "*fp32", "ws2_ptr": "*fp32", "bias_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16",
             "M": "i32", "N": "i32", "K": "i32", "DP": "i32", "G": "i32", "stride_rm": "i32", "stride_om": "i32"}
    cx = {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
          "ROWS": SK_REDUCE_ROWS, "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual}
    return aot_signature(sk_reduce_kernel, types, {"N": N, "K": K, "G": config["SK"], "stride_rm": N, "stride_om": N},
                         cx, {"num_warps": 4, "num_stages": 1}, SK_REDUCE_GRID)


def grid_sk_reduce(config: dict, M: int, N: int) -> tuple[int, int, int]:
    tiles = -(-N // config["BLOCK_N"]) * -(-M // config["BLOCK_M"])
    return (max(1, tiles - sk_dp_tiles(config, M, N)), config["BLOCK_N"] // SK_REDUCE_ROWS, 1)


_PERM = {}


@gluon.jit
def k_phys(j, BK: gl.constexpr):
    """The decode's k order inside a BK block: logical column j (bits s0, i0, i1, s1, r0, rhi from the lowest) holds
    physical k (BK / 4)(2 i1 + i0) + 4 (2 rhi + r0) + 2 s1 + s0 (gluon_gemv._a_operand). Plain operators only, so
    that the host evaluates the same source on a torch tensor (`k_phys.fn`, in permutation) that the RS loader's
    copies run on the GPU (gluon_ws._x_cols)."""
    return (BK // 4) * (2 * ((j >> 2) & 1) + ((j >> 1) & 1)) + 4 * (2 * (j >> 5) + ((j >> 4) & 1)) \
        + 2 * ((j >> 3) & 1) + (j & 1)


def permutation(K: int, BK: int, device) -> torch.Tensor:
    """int64 [K]: x_perm[:, j] = x[:, perm[j]], the Gluon GEMV's k order inside every BK block (k_phys)."""
    key = (K, BK, str(device))
    if key not in _PERM:
        phys = k_phys.fn(torch.arange(BK), BK)
        _PERM[key] = (torch.arange(0, K, BK)[:, None] + phys[None, :]).reshape(-1).to(device)
    return _PERM[key]


def permute_k_view(x: torch.Tensor, BK: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """permute_k as one strided copy instead of a gather: inside a block, k's bits (s0, i0, i1, s1, r0, rhi from
    the lowest) sit at physical bits (s0, s1, r0, rhi, i0, i1), so viewing x's block as [i1, i0, rhi, r0, s1, s0]
    and moving the dims to (rhi, r0, s1, i1, i0, s0) is the permutation. Equal to permute_k (tests); on an H100
    slower than permute_k_kernel at every M and K timed (tools/results/permute_k_kernel_h100.log), so not used
    by the launchers."""
    M, K = x.shape
    v = x.view(M, K // BK, 2, 2, BK // 32, 2, 2, 2).permute(0, 1, 4, 5, 6, 2, 3, 7)
    if out is None:
        return v.reshape(M, K)
    out.view(M, K // BK, BK // 32, 2, 2, 2, 2, 2).copy_(v)
    return out


def block_index(BK: int, device) -> torch.Tensor:
    """int32 [BK]: the k order inside one block (triton_gemm.permute_k_kernel's idx)."""
    key = ("block", BK, str(device))
    if key not in _PERM:
        _PERM[key] = k_phys.fn(torch.arange(BK), BK).to(torch.int32).to(device)
    return _PERM[key]


def gather_k(x: torch.Tensor, BK: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """permute_k as torch.index_select (the CPU's way, and CudaLinear's for an engine built before its plan named
    permute_k_kernel)."""
    idx = permutation(x.shape[1], BK, x.device)
    return torch.index_select(x, 1, idx, out=out) if out is not None else torch.index_select(x, 1, idx)


def permute_k(x: torch.Tensor, BK: int, out: torch.Tensor | None = None, words: bool = True) -> torch.Tensor:
    """x [M, K] bf16 -> its columns in the kernel's k order (out: a preallocated [M, K] buffer):
    triton_gemm.permute_k_words_kernel on the GPU (the order as a transpose of 32-bit words; Triton's JIT: the build's
    tuner, tests, tools; engines launch its AOT compile; both with programmatic dependent launch), a gather elsewhere.
    words=False: the gather kernel permute_k_kernel instead (what engines built before the words kernel launch;
    tools/dev/permute_k.py times both)."""
    from atlas.plugins_trt.quant_linear import triton_gemm as tg

    if x.device.type != "cuda":
        return gather_k(x, BK, out)
    M, K = x.shape
    if x.stride(1) != 1 or (words and x.stride(0) % 2):  # the words kernel moves bf16 pairs as 32-bit words
        x = x.contiguous()
    out = torch.empty(M, K, dtype=x.dtype, device=x.device) if out is None else out
    if M == 0:
        return out
    args = (x, out) if words else (x, block_index(BK, x.device), out)
    (tg.permute_k_words_kernel if words else tg.permute_k_kernel)[tg.grid_permute_k(BK, M, K)](
        *args, M, K, x.stride(0), out.stride(0), BK=BK, ROWS=tg.PERMUTE_CONFIG["ROWS"], COLS=tg.permute_cols(BK),
        PDL=True, launch_pdl=True, num_warps=tg.PERMUTE_CONFIG["num_warps"],
        num_stages=tg.PERMUTE_CONFIG["num_stages"])
    return out


def launch_nvfp4_gemm_wgmma(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                            weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                            x_perm: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N]; config: BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps,
    num_stages (1), optional W_SMEM, TILED, SPLIT_K (fp32 partials, then triton_gemv's split-K reduction). x_perm:
    a preallocated [M, K] bf16 buffer for the permuted x (allocated when None)."""
    M, K = x.shape
    N = weight.shape[0]
    if not supports(config, K):
        raise ValueError(f"the wgmma GEMM needs K % (2 BLOCK_K SPLIT_K) == 0 (and K % 256 == 0 with W_SMEM), got "
                         f"K = {K}, config {config}")
    xp = permute_k(x, config["BLOCK_K"], x_perm)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return out
    res = residual if residual is not None else out
    split = config.get("SPLIT_K", 1)
    dst = out if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    nvfp4_gemm_wgmma_kernel[grid_wgmma(config, M, N)](
        xp, weight, weight_scale, weight_scale_2, bias if bias is not None else out, res, dst, M, N, K,
        xp.stride(0), weight.stride(0), weight_scale.stride(0), res.stride(0), N if split > 1 else out.stride(0),
        **wgmma_constexprs(config, bias is not None, residual is not None), num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    if split > 1:
        from atlas.plugins_trt.quant_linear.triton_gemv import CONFIGS_splitk_reduce, launch_splitk_reduce
        launch_splitk_reduce(dst, out, CONFIGS_splitk_reduce[0], bias, residual)
    return out


def sk_dp_tiles(config: dict, M: int, N: int) -> int:
    """How many output tiles nvfp4_gemm_wgmma_sk_kernel computes whole, data-parallel (DP argument): config "DP"
    0: none (all stream-K); 1: all but the last full wave and the part-wave (CUTLASS's default: two waves' worth or
    less shared by stream-K); 2: every full wave (stream-K shares only the part-wave)."""
    G = config["SK"]
    tiles = -(-N // config["BLOCK_N"]) * -(-M // config["BLOCK_M"])
    waves = tiles // G
    return {0: 0, 1: max(0, waves - 1) * G, 2: waves * G}[config.get("DP", 1)]


def sk_counters(config: dict, M: int, N: int) -> int:
    """The stream-K tiles of a launch (FIX: one int32 counter each)."""
    return -(-N // config["BLOCK_N"]) * -(-M // config["BLOCK_M"]) - sk_dp_tiles(config, M, N)


_COUNTERS: dict = {}


def sk_counter_buffer(n: int, device) -> torch.Tensor:
    """A zeroed int32 buffer of at least n FIX counters, kept per device (each launch leaves its counters zero; an
    outgrown one is kept for the CUDA graphs captured with it: plugins_trt/buffers.py)."""
    return grown(_COUNTERS, str(device), n, lambda k: torch.zeros(max(k, 1024), dtype=torch.int32, device=device))


def sk_items(G: int, DP: int, tiles: int, NP: int) -> list[list[tuple[int, int, int]]]:
    """The host's model of each persistent program's work items (tile, first pair, end pair), as sk_walk and sk_item
    walk them: data-parallel tiles pid, pid + G, ... < DP whole, then its stream-K range of the rest's block pairs
    (NP a tile). For tests and tools (tools/dev/nvfp4_rs_sk_trace labels its time stamps with it)."""
    T = (tiles - DP) * NP
    Gs = max(1, min(G, T))  # the stream-K programs (every range non-empty)
    out = []
    for pid in range(G):
        items = [(t, 0, NP) for t in range(pid, DP, G)]
        it, end = min(pid, Gs) * T // Gs, min(pid + 1, Gs) * T // Gs
        while it < end:
            u = it // NP
            p0 = it - u * NP
            p1 = min(NP, p0 + end - it)
            items.append((DP + u, p0, p1))
            it += p1 - p0
        out.append(items)
    return out


def sk_partials_shape(config: dict) -> tuple[int, int, int, int]:
    """The stream-K parts' workspace: [SK programs, 2, BLOCK_N, BLOCK_M] fp32 (m contiguous: sk_store)."""
    return config["SK"], 2, config["BLOCK_N"], config["BLOCK_M"]


def launch_nvfp4_gemm_wgmma_sk(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                               weight_scale_2: torch.Tensor, config: dict, bias: torch.Tensor | None = None,
                               residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                               x_perm: torch.Tensor | None = None, part: torch.Tensor | None = None,
                               counters: torch.Tensor | None = None, reduce: bool = True) -> torch.Tensor:
    """launch_nvfp4_gemm_wgmma on a persistent grid (config "SK": programs, "DP": sk_dp_tiles' mode), then (without
    "FIX") triton_gemv.sk_reduce_kernel over the tiles the programs shared. part: a preallocated sk_partials_shape
    buffer; counters: FIX's int32 tile counters (at least sk_counters(config, M, N), zero; zero again afterwards).
    reduce=False leaves the shared tiles unsummed (for timing the two launches apart)."""
    M, K = x.shape
    N = weight.shape[0]
    if not supports(config, K):
        raise ValueError(f"the wgmma GEMM needs K % (2 BLOCK_K) == 0 (and K % 256 == 0 with W_SMEM), got "
                         f"K = {K}, config {config}")
    xp = permute_k(x, config["BLOCK_K"], x_perm)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    if M == 0:
        return out
    if part is None:
        part = torch.empty(sk_partials_shape(config), dtype=torch.float32, device=x.device)
    fix = bool(config.get("FIX"))
    if counters is None:
        counters = sk_counter_buffer(sk_counters(config, M, N), x.device)
    res = residual if residual is not None else out
    b = bias if bias is not None else out
    dp = sk_dp_tiles(config, M, N)
    nvfp4_gemm_wgmma_sk_kernel[(config["SK"], 1, 1)](
        xp, weight, weight_scale, weight_scale_2, b, res, out, part, counters, M, N, K, dp, xp.stride(0),
        weight.stride(0), weight_scale.stride(0), res.stride(0), out.stride(0),
        **sk_constexprs(config, bias is not None, residual is not None), num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    if reduce and not fix:
        launch_sk_reduce(config, part, weight_scale_2, bias, residual, out, K, dp)
    return out


def launch_sk_reduce(config: dict, part: torch.Tensor, weight_scale_2: torch.Tensor, bias: torch.Tensor | None,
                     residual: torch.Tensor | None, out: torch.Tensor, K: int, dp: int) -> None:
    """triton_gemv.sk_reduce_kernel after a persistent stream-K launch of `config` (SK programs, dp data-parallel
    tiles): sums the parts of every shared tile in program order into out [M, N] (scale, bias, residual); nothing
    when every tile was data-parallel."""
    from atlas.plugins_trt.quant_linear.triton_gemv import sk_reduce_kernel

    M, N = out.shape
    tiles = -(-N // config["BLOCK_N"]) * -(-M // config["BLOCK_M"])
    if tiles <= dp:
        return
    res = residual if residual is not None else out
    sk_reduce_kernel[(tiles - dp, config["BLOCK_N"] // SK_REDUCE_ROWS, 1)](
        part, weight_scale_2, bias if bias is not None else out, res, out, M, N, K, dp, config["SK"], res.stride(0),
        out.stride(0), BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
        ROWS=SK_REDUCE_ROWS, HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, num_warps=4)
