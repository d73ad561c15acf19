"""Stream-K NVFP4 GEMV for M = 1..16 in Gluon: a fixed grid of PROGRAMS programs (a few an SM) shares the weight's
blocks evenly, and the split-K reduction happens inside the kernel.

Why: the split GEMV (gluon_gemv.nvfp4_gemv_mma_kernel) gives every (row tile, split) its own program, so the last
wave runs part-full (27B gate_up M 1: 2.35 waves, ncu), each program streams only a few blocks before its epilogue,
and SPLIT_K > 1 costs a second launch that reads SPLIT_K fp32 partials of [M, N] back (8B qkv M 16, SPLIT_K 8: 3 MB of
partials beside 14 MB of weights). Here:

  * the weight is T = (N / BLOCK_N) * (K / BLOCK_K) blocks in row-tile-major order; program c takes blocks
    [c T / G, (c + 1) T / G) (G = PROGRAMS), so every program streams the same number of blocks, across row tiles,
    with the next blocks' weights always in flight (in registers one block ahead, or in a cp.async ring; the first
    ones before the PDL wait);
  * a row tile's blocks are met by one program (its output is written directly) or by a run of consecutive programs
    (stream-K segments). Each program has at most two partial segments: the first (starting inside a tile: slot 0)
    and the last (starting at a tile's first block and ending inside it: slot 1), stored unscaled in fp32 to
    part[c, slot]. Every partial's program then adds one to the tile's counter (after a fence); the program that
    brings it to the tile's segment count sums the segments in program order (deterministic whoever comes last),
    writes the output with the epilogue and sets the counter back to 0 for the next launch;
  * the decode and the mma.sync are gluon_gemv's (swap-AB, weights decoded into A-operand registers).

Tiled weights only (layout.py, N % BLOCK_N == 0, BLOCK_N 64 / 128 / 256, BLOCK_K 128 / 256); BITS: each word's bits in
layout.NVFP4_BITS order (the build's plans use it, gluon_gemv._bits_pair_asm decodes). The counters (int32
[N / BLOCK_N]) must be zero before the first launch; the kernel leaves them zero. Gluon kernels cannot run in
Triton's interpreter: the GPU tests of tests/runtime/test_linear_tiled.py check it against the reference.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from atlas.plugins_trt.quant_linear.gluon_gemv import (
    _block, _fence, _gdc_launch_dependents, _gdc_wait, _row_ptrs, _scales, _store_out, _x_operand, _x_unpack,
    copy_layouts, mma_layouts, x_pairs_layout)
from atlas.runtime.layers.linear_cuda import streamk_partials_shape


@gluon.jit
def _block_off(g, nk, K, BN: gl.constexpr, BK: gl.constexpr, UNIT: gl.constexpr, ROW: gl.constexpr):
    """Offset (pointer elements) of block g (row tile g // nk, K block g % nk) in the tiled order: UNIT elements a
    128 x 128 tile, ROW a tile row (words: 2048 / 16 int32, scales: 1024 / 8 bytes)."""
    r = g // nk
    n0 = r * BN
    return (n0 // 128) * (K // 128) * UNIT + (n0 % 128) * ROW + (g - r * nk) * (BK // 128) * UNIT


@gluon.jit
def _segment_end(acc, c, r, seg_lo, nk, T, G: gl.constexpr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr,
                 cnt_ptr, stride_rm, stride_om, whole, BN: gl.constexpr, MP: gl.constexpr, mma: gl.constexpr,
                 HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Row tile r's segment [seg_lo, ...) of program c ends with acc: the output, or a partial (and the reduction when
    it is the tile's last)."""
    cn = r * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, mma))
    if whole:
        _store_out(acc, cn, cm, 0, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS,
                   HAS_RESIDUAL)
    else:
        t0 = r * nk
        offs = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))[:, None] * MP + cm[None, :]
        slot = (seg_lo == t0).to(gl.int32)  # 1: the segment starts the tile (its program's last); 0: its first
        gl.store(part_ptr + (c * 2 + slot) * (BN * MP) + offs, acc)
        _fence()
        gl.thread_barrier()
        old = gl.atomic_add(cnt_ptr + r, 1, sem="acq_rel", scope="gpu")
        c_first = ((t0 + 1) * G - 1) // T      # the program holding the tile's first block
        c_last = ((t0 + nk) * G - 1) // T      # and its last
        if old == c_last - c_first:            # every other segment is in: sum them in program order
            _fence()
            tot = gl.load(part_ptr + (c_first * 2 + 1) * (BN * MP) + offs, cache_modifier=".cg")
            for cc in range(c_first + 1, c_last + 1):
                tot += gl.load(part_ptr + (cc * 2) * (BN * MP) + offs, cache_modifier=".cg")
            _store_out(tot, cn, cm, 0, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS,
                       HAS_RESIDUAL)
            gl.store(cnt_ptr + r, 0)


@gluon.jit
def _ring_issue(w_s, s_s, x_s, slot, g, wp, sp, xp, xmask, nk, K, BN: gl.constexpr, BK: gl.constexpr,
                WEIGHTS: gl.constexpr, X: gl.constexpr):
    """cp.async of block g's words, scales (WEIGHTS) and x (X) into ring slot `slot`."""
    if WEIGHTS:
        async_copy.async_copy_global_to_shared(w_s.index(slot), wp + _block_off(g, nk, K, BN, BK, 2048, 16))
        async_copy.async_copy_global_to_shared(s_s.index(slot), sp + _block_off(g, nk, K, BN, BK, 1024, 8))
    if X:
        async_copy.async_copy_global_to_shared(x_s.index(slot), xp + (g % nk) * BK, mask=xmask)


@gluon.jit
def nvfp4_gemv_streamk_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr,
                              M, N, K, stride_xm, stride_rm, stride_om,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                              PROGRAMS: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
                              RING: gl.constexpr = 0, PDL: gl.constexpr = False, BITS: gl.constexpr = False):
    """y = x @ W.T (+ bias) (+ residual), bf16 [M, N]; grid (PROGRAMS, 1, 1), PROGRAMS <= T (the block count).

    x_ptr *bf16 [M, K] (row stride stride_xm); w_ptr / ws_ptr the tiled NVFP4 weight (layout.tile_nvfp4);
    ws2_ptr *fp32 [N]; out_ptr *bf16 [M, N]; part_ptr *fp32 [PROGRAMS, 2, BLOCK_N, MP] (MP = 8, or 16 for
    BLOCK_M 16); cnt_ptr *i32 [N / BLOCK_N], zero. RING 0: the next block's weights loaded into registers before
    this block's math (a third register block measured slower, tools/results/nvfp4_streamk_registers.json); RING >= 3:
    cp.async of words, scales and x through RING shared-memory slots, RING - 1 blocks ahead (one CTA barrier a block,
    as gluon_gemv._pipelined; no weight registers cross the loop). BITS: words in layout.NVFP4_BITS order."""
    NW: gl.constexpr = gl.num_warps()
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BK: gl.constexpr = BLOCK_K
    BN: gl.constexpr = BLOCK_N
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    G: gl.constexpr = PROGRAMS
    gl.static_assert(BK % 128 == 0)
    mma, aL, bL, wL, sL, pL, xL = mma_layouts(BN, BK, MP, NW)
    c = gl.program_id(0)
    nk = K // BK
    T = (N // BN) * nk
    lo = c * T // G
    hi = (c + 1) * T // G
    last = hi - 1
    acc = gl.zeros([BN, MP], gl.float32, layout=mma)
    seg_lo = lo
    if RING > 0:  # cp.async ring: RING slots of words, scales and x
        gl.static_assert(RING >= 3)
        S: gl.constexpr = RING
        shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        w_s = gl.allocate_shared_memory(gl.int32, [S, BN, KW], shl)
        s_s = gl.allocate_shared_memory(gl.int8, [S, BN, KW // 2], shl)
        x_s = gl.allocate_shared_memory(gl.bfloat16, [S, MP, BK], shl)
        wcL, scL, xcL = copy_layouts(BK, NW)
        wp, sp = _row_ptrs(w_ptr, ws_ptr, gl.arange(0, BN, layout=gl.SliceLayout(1, wcL)),
                           gl.arange(0, BN, layout=gl.SliceLayout(1, scL)),
                           gl.arange(0, KW, layout=gl.SliceLayout(0, wcL)),
                           gl.arange(0, KW // 2, layout=gl.SliceLayout(0, scL)), K, 0, 0, BK, True)
        sp = sp.to(gl.pointer_type(gl.int8))
        xr = gl.arange(0, MP, layout=gl.SliceLayout(1, xcL))
        xp = x_ptr + xr[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))[None, :]
        xmask = (xr < M)[:, None]
        for i in gl.static_range(S - 1):  # the first S - 1 blocks' weights (clamped) before the PDL wait
            _ring_issue(w_s, s_s, x_s, i, gl.minimum(lo + i, last), wp, sp, xp, xmask, nk, K, BN, BK, True, False)
        if PDL:
            _gdc_launch_dependents()
            _gdc_wait()
        for i in gl.static_range(S - 1):  # their x; group i ends with block i's x
            _ring_issue(w_s, s_s, x_s, i, gl.minimum(lo + i, last), wp, sp, xp, xmask, nk, K, BN, BK, False, True)
            async_copy.commit_group()
        for g in range(lo, hi):
            it = g - lo
            async_copy.wait_group(S - 2)  # block g's group (this thread's copies) has landed
            gl.thread_barrier()            # everyone's copies are in, everyone is past block g - 1's reads
            _ring_issue(w_s, s_s, x_s, (it + S - 1) % S, gl.minimum(g + S - 1, last), wp, sp, xp, xmask, nk, K, BN,
                        BK, True, True)
            async_copy.commit_group()
            cur = it % S
            sc = _scales(s_s.index(cur).load(sL).to(gl.float8e4nv, bitcast=True), BN, KW, wL)
            b = _x_operand(x_s.index(cur).load(xL), BK, MP, RP, bL)
            acc = _block(acc, w_s.index(cur).load(wL), sc, b, BN, BK, RP, pL, aL, BITS)
            acc, seg_lo = _after_block(acc, g, c, seg_lo, last, nk, T, G, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                                       part_ptr, cnt_ptr, stride_rm, stride_om, BN, MP, mma, HAS_BIAS, HAS_RESIDUAL)
        async_copy.wait_group(0)
    else:  # registers: the next block's weights loaded before this block's math
        w_lane, s_lane = _row_ptrs(w_ptr, ws_ptr, gl.arange(0, BN, layout=gl.SliceLayout(1, wL)),
                                   gl.arange(0, BN, layout=gl.SliceLayout(1, sL)),
                                   gl.arange(0, KW, layout=gl.SliceLayout(0, wL)),
                                   gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL)), K, 0, 0, BK, True)
        xpL: gl.constexpr = x_pairs_layout(BK, MP, NW)
        xpm = gl.arange(0, MP, layout=gl.SliceLayout(1, xpL))
        xp_rows = (x_ptr + xpm[:, None] * stride_xm).to(gl.pointer_type(gl.int32)) \
            + gl.arange(0, BK // 2, layout=gl.SliceLayout(0, xpL))[None, :]
        xpmask = (xpm < M)[:, None]
        wd = gl.load(w_lane + _block_off(lo, nk, K, BN, BK, 2048, 16))
        sr = gl.load(s_lane + _block_off(lo, nk, K, BN, BK, 1024, 8))
        if PDL:  # the weights are nobody's output: only x (and the partials, counters, output) wait
            _gdc_launch_dependents()
            _gdc_wait()
        xw = gl.load(xp_rows + (lo % nk) * (BK // 2), mask=xpmask, other=0)
        for g in range(lo, hi):
            # the next block's weights and x (clamped to this program's last block)
            ga = gl.minimum(g + 1, last)
            wd_a = gl.load(w_lane + _block_off(ga, nk, K, BN, BK, 2048, 16))
            sr_a = gl.load(s_lane + _block_off(ga, nk, K, BN, BK, 1024, 8))
            xw_n = gl.load(xp_rows + (ga % nk) * (BK // 2), mask=xpmask, other=0)
            b = _x_operand(_x_unpack(xw, BK, MP, xL), BK, MP, RP, bL)
            acc = _block(acc, wd, _scales(sr, BN, KW, wL), b, BN, BK, RP, pL, aL, BITS)
            wd, sr = wd_a, sr_a
            xw = xw_n
            acc, seg_lo = _after_block(acc, g, c, seg_lo, last, nk, T, G, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                                       part_ptr, cnt_ptr, stride_rm, stride_om, BN, MP, mma, HAS_BIAS, HAS_RESIDUAL)


@gluon.jit
def _after_block(acc, g, c, seg_lo, last, nk, T, G: gl.constexpr, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr,
                 cnt_ptr, stride_rm, stride_om, BN: gl.constexpr, MP: gl.constexpr, mma: gl.constexpr,
                 HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """After block g: at the end of its row tile or of this program's range, the segment's epilogue; returns
    (acc, seg_lo) for the next block."""
    r = g // nk
    kb = g - r * nk
    if (kb == nk - 1) | (g == last):
        _segment_end(acc, c, r, seg_lo, nk, T, G, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, part_ptr, cnt_ptr,
                     stride_rm, stride_om, (seg_lo == r * nk) & (kb == nk - 1), BN, MP, mma, HAS_BIAS, HAS_RESIDUAL)
        acc = gl.zeros([BN, MP], gl.float32, layout=mma)
        seg_lo = g + 1
    return acc, seg_lo


# ---- host side ---------------------------------------------------------------------------------------------------

STREAMK_GRID = ("PROGRAMS", "1", "1")


def blocks(config: dict, n: int, k: int) -> int:
    """T: the weight's blocks of BLOCK_N x BLOCK_K."""
    return (n // config["BLOCK_N"]) * (k // config["BLOCK_K"])


def programs_for(config: dict, n: int, k: int, sm_count: int) -> int:
    """PROGRAMS for a config asking "STREAMK": programs an SM (at most one block each)."""
    return min(config["STREAMK"] * sm_count, blocks(config, n, k))


def check_streamk(config: dict, n: int, k: int) -> None:
    """Raise ValueError unless the stream-K GEMV can run this config on an [n, k] NVFP4 weight."""
    bn, bk = config["BLOCK_N"], config["BLOCK_K"]
    if not config.get("TILED") or n % 128 or k % 128 or n % bn or bk % 128 or k % bk or bn not in (64, 128, 256):
        raise ValueError(f"stream-K GEMV config {config}: needs the tiled order (N % 128 == K % 128 == 0), "
                         f"N % BLOCK_N == 0 (BLOCK_N 64 / 128 / 256) and K % BLOCK_K == 0 (BLOCK_K 128 / 256); "
                         f"got N = {n}, K = {k}.")
    if not 1 <= config["PROGRAMS"] <= blocks(config, n, k):
        raise ValueError(f"stream-K GEMV config {config}: PROGRAMS must be 1..{blocks(config, n, k)} for {n}x{k}.")


def workspace_shapes(config: dict, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(partials fp32, counters int32) shapes for a config on N = n; the counters start (and stay) zero."""
    return streamk_partials_shape(config), (n // config["BLOCK_N"],)


def streamk_constexprs(config: dict, has_bias: bool, has_residual: bool, pdl: bool) -> dict:
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "PROGRAMS": config["PROGRAMS"], "HAS_BIAS": has_bias, "HAS_RESIDUAL": has_residual,
            "RING": config.get("RING", 0), "PDL": pdl,
            "BITS": bool(config.get("BITS"))}


def signature_nvfp4_gemv_streamk(config: dict, N: int, K: int, has_bias: bool = False, has_residual: bool = False,
                                 pdl: bool = False):
    """The AOT instance of nvfp4_gemv_streamk_kernel for a tiled [N, K] weight (M a run-time argument)."""
    from atlas.plugins_trt.quant_linear.triton_gemv import aot_signature
    check_streamk(config, N, K)
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
             "K": "i32", "stride_xm": "i32", "stride_rm": "i32", "stride_om": "i32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_rm": N, "stride_om": N}
    return aot_signature(nvfp4_gemv_streamk_kernel, types, ints,
                         streamk_constexprs(config, has_bias, has_residual, pdl), config, STREAMK_GRID)


def launch_nvfp4_gemv_streamk(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                              weight_scale_2: torch.Tensor, config: dict, counters: torch.Tensor,
                              bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                              out: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                              pdl: bool = False) -> torch.Tensor:
    """JIT launch (tests, tuning): y = x @ W.T (+ bias) (+ residual) bf16 [M, N], W tiled (layout.tile_nvfp4).
    counters: int32 [N / BLOCK_N], zero (left zero); partials: fp32 workspace_shapes(config)[0] (allocated when
    None)."""
    from atlas.plugins_trt.quant_linear.triton_gemv import _check_gemv_inputs, check_tiled
    N, K = weight.shape[0], weight.shape[1] * 2
    check_streamk(config, N, K)
    check_tiled(config, N, K, weight, weight_scale)
    M = _check_gemv_inputs(x, N, K, config, bias, residual)
    part_shape, cnt_shape = workspace_shapes(config, N)
    if counters.dtype != torch.int32 or tuple(counters.shape) != cnt_shape:
        raise ValueError(f"stream-K counters must be int32 {list(cnt_shape)} (zero), got {counters.dtype} "
                         f"{list(counters.shape)}.")
    if partials is None:
        partials = torch.empty(part_shape, dtype=torch.float32, device=x.device)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    res = residual if residual is not None else out
    cx = streamk_constexprs(config, bias is not None, residual is not None, pdl)
    if pdl:
        cx["launch_pdl"] = True
    if config.get("MAXNREG"):  # a register cap for the compiler, as the AOT build applies it
        cx["maxnreg"] = config["MAXNREG"]
    nvfp4_gemv_streamk_kernel[(config["PROGRAMS"], 1, 1)](
        x, weight, weight_scale, weight_scale_2, bias if bias is not None else out, res, out, partials, counters,
        M, N, K, x.stride(0), res.stride(0), out.stride(0), **cx, num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    return out


def grid_streamk(config: dict) -> tuple[int, int, int]:
    return (config["PROGRAMS"], 1, 1)

