"""Depthwise causal conv1d (+ SiLU) in Triton: varlen prefill, decode/verify update, verify commit.

Window pool: `window [num_slots, C, KW-1]`, columns oldest to newest, one row of slots per sequence,
addressed by an int32 slot index per sequence (the layout of `GDNState.conv_window`, stacked).
For a sequence, the "extended input" is ext = [window | x_0, x_1, ...] along time, so

    y_t[c]            = silu(bias[c] + sum_j weight[c, j] * ext[c, t + j])      j = 0..KW-1
    new window[c, j]  = ext[c, n + j]                                          j = 0..KW-2

after n tokens: exactly `reference.causal_conv1d`, whose output is rounded to the input dtype (so is ours).

Verify (width T, partial accept) design: the verify launch leaves the window untouched and copies the
raw inputs into a keep buffer `[B, T, C]`; the commit slides the window by the accepted count n,
reading [window | keep[:n]]. Keeping the inputs (T·C values) is cheaper than keeping T windows
((KW-1)·T·C) and rolls back exactly: n = 0 leaves the window as it was.

Every kernel takes pointers, ints and constexprs only (they are compiled ahead of time). `launch_conv_varlen` (the
GPU step's prefill conv) launches through atlas.plugins_trt.launch: JIT, or the engine's cubins with `aot=`; the
other `launch_*` are JIT wrappers for the tests and benchmarks (the decode step's conv is fused into
gated_delta_net/triton_recurrent.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch


@triton.jit
def ext_load(win, xs, stride_x, chan, cmask, idx, KW: tl.constexpr):
    """ext[chan, idx] as fp32: window column idx if idx < KW-1, else input token idx-(KW-1).

    win: this sequence's window row [C, KW-1]; xs: its token 0 (rows stride_x apart);
    chan, cmask, idx broadcast together (idx scalar or a tensor).
    """
    in_win = idx < KW - 1
    wv = tl.load(win + chan * (KW - 1) + tl.minimum(idx, KW - 2), mask=cmask & in_win, other=0.0)
    xv = tl.load(xs + tl.maximum(idx - (KW - 1), 0).to(tl.int64) * stride_x + chan,
                 mask=cmask & (idx >= KW - 1), other=0.0)
    return wv.to(tl.float32) + xv.to(tl.float32)


@triton.jit
def conv_silu_at(win, xs, stride_x, weight, bias, chan, cmask, t, KW: tl.constexpr, HAS_BIAS: tl.constexpr):
    """silu(conv) at token t for the channels `chan`, rounded to the input dtype, returned as fp32."""
    acc = tl.zeros(chan.shape, dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + chan, mask=cmask, other=0.0).to(tl.float32)
    for j in tl.static_range(KW):
        wj = tl.load(weight + chan * KW + j, mask=cmask, other=0.0).to(tl.float32)
        acc += wj * ext_load(win, xs, stride_x, chan, cmask, t + j, KW)
    y = acc * tl.sigmoid(acc)
    return y.to(xs.dtype.element_ty).to(tl.float32)


@triton.jit
def slide_window(win, xs, stride_x, chan, cmask, n, KW: tl.constexpr, WP: tl.constexpr):
    """Window <- ext[:, n : n+KW-1] for the channels `chan` [BC] (in place; WP = pow2 >= KW-1).

    The caller must own these channels: nothing else in the launch may read or write them.
    """
    j = tl.arange(0, WP)
    m = cmask[:, None] & (j < KW - 1)[None, :]
    new = ext_load(win, xs, stride_x, chan[:, None], m, n + j[None, :], KW)
    tl.debug_barrier()  # every thread has read the old window before any overwrites it
    tl.store(win + chan[:, None] * (KW - 1) + j[None, :], new.to(win.dtype.element_ty), mask=m)


@triton.jit
def conv_varlen_kernel(
    x, stride_x,          # [total_T, C] packed inputs (row stride in elements, unit column stride)
    y, stride_y,          # [total_T, C] outputs silu(conv), dtype of y
    weight, bias,         # [C, KW], [C] (bias read only if HAS_BIAS)
    window,               # [num_slots, C, KW-1], read then overwritten with each sequence's new window
    cu_seqlens,           # int32 [N+1]
    slots,                # int32 [N]; a negative slot skips the sequence
    C,                    # channels
    KW: tl.constexpr, WP: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr,
    CHAN_FIRST: tl.constexpr = False,  # grid (cdiv(C, BC), cdiv(max_T, BT), N): neighbouring programs share rows
):
    """Grid (N, cdiv(max_T, BT), cdiv(C, BC)), or its reverse with CHAN_FIRST. Only time block 0 of a sequence
    reads its window (needs BT >= KW-1), so that program alone writes the new window: no other program races it."""
    if CHAN_FIRST:
        cb, tb, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    else:
        n, tb, cb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    T = tl.load(cu_seqlens + n + 1) - bos
    slot = tl.load(slots + n).to(tl.int64)
    if (tb * BT >= T) | (slot < 0):
        return
    rows = tb * BT + tl.arange(0, BT)
    chan = cb * BC + tl.arange(0, BC)
    cmask = chan < C
    m = (rows < T)[:, None] & cmask[None, :]
    win = window + slot * C * (KW - 1)
    xs = x + bos * stride_x
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + chan, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(KW):  # tap j reads input row t + j - (KW-1)
        wj = tl.load(weight + chan * KW + j, mask=cmask, other=0.0).to(tl.float32)
        src = rows + (j - (KW - 1))
        xv = tl.load(xs + src[:, None] * stride_x + chan[None, :], mask=m & (src >= 0)[:, None], other=0.0)
        acc += wj[None, :] * xv.to(tl.float32)
    if tb == 0:  # rows t < KW-1 - j of tap j read window column t + j instead
        for j in tl.static_range(KW - 1):
            wj = tl.load(weight + chan * KW + j, mask=cmask, other=0.0).to(tl.float32)
            col = rows + j
            wv = tl.load(win + chan[None, :] * (KW - 1) + tl.minimum(col, KW - 2)[:, None],
                         mask=m & (col < KW - 1)[:, None], other=0.0)
            acc += wj[None, :] * wv.to(tl.float32)
    out = acc * tl.sigmoid(acc)
    tl.store(y + (bos + rows.to(tl.int64))[:, None] * stride_y + chan[None, :], out.to(y.dtype.element_ty), mask=m)
    if tb == 0:
        slide_window(win, xs, stride_x, chan, cmask, T, KW, WP)


@triton.jit
def conv_update_kernel(
    x, stride_x,          # [B*T, C] inputs, row b*T + t (row stride in elements)
    y, stride_y,          # [B*T, C] outputs
    weight, bias,         # [C, KW], [C]
    window,               # [num_slots, C, KW-1]
    slots,                # int32 [B]; negative = padding row, skipped
    keep,                 # [B*T, C] copy of x for the commit (written only if not IN_PLACE)
    T,                    # tokens per sequence, 1..17
    C,
    KW: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr,
    IN_PLACE: tl.constexpr,  # True: decode, the window slides by T; False: verify, window kept, x copied
):
    """Grid (B, cdiv(C, BC)); each program owns its channels of one sequence."""
    b, cb = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + b).to(tl.int64)
    if slot < 0:
        return
    chan = cb * BC + tl.arange(0, BC)
    cmask = chan < C
    win = window + slot * C * (KW - 1)
    row0 = (b * T).to(tl.int64)
    xs = x + row0 * stride_x
    for t in range(T):
        out = conv_silu_at(win, xs, stride_x, weight, bias, chan, cmask, t, KW, HAS_BIAS)
        tl.store(y + (row0 + t) * stride_y + chan, out.to(y.dtype.element_ty), mask=cmask)
        if not IN_PLACE:
            xv = tl.load(xs + t * stride_x + chan, mask=cmask)
            tl.store(keep + (row0 + t) * C + chan, xv.to(keep.dtype.element_ty), mask=cmask)
    if IN_PLACE:
        slide_window(win, xs, stride_x, chan, cmask, T, KW, WP)


@triton.jit
def conv_commit_kernel(
    window,               # [num_slots, C, KW-1]
    slots,                # int32 [B]
    keep,                 # [B*T, C] the verify inputs (conv_update_kernel with IN_PLACE=False)
    accepted,             # int32 [B], 0..T: tokens of the verify that stay
    T, C,
    KW: tl.constexpr, WP: tl.constexpr, BC: tl.constexpr,
):
    """Grid (B, cdiv(C, BC)): window <- last KW-1 columns of [window | keep[:accepted]]."""
    b, cb = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + b).to(tl.int64)
    n = tl.load(accepted + b)
    if (slot < 0) | (n <= 0):
        return
    chan = cb * BC + tl.arange(0, BC)
    slide_window(window + slot * C * (KW - 1), keep + (b * T).to(tl.int64) * C, C, chan, chan < C, n, KW, WP)


# ---------------------------------------------------------------------------------------------- launchers


def _check_rows(name: str, t: torch.Tensor, C: int):
    if t.dim() != 2 or t.shape[1] != C or t.stride(1) != 1:
        raise ValueError(f"{name}: expected [rows, {C}] with unit column stride, got {tuple(t.shape)} "
                         f"strides {t.stride()}")


def launch_conv_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, window: torch.Tensor, slots: torch.Tensor,
                       weight: torch.Tensor, bias: torch.Tensor | None = None, max_seqlen: int | None = None,
                       out: torch.Tensor | None = None, BT: int = 32, BC: int = 64, num_warps: int = 4,
                       chan_first: bool = True, aot=None) -> torch.Tensor:
    """Prefill conv over packed sequences; updates each sequence's window in `window` in place.

    x: [total_T, C] (any row stride); cu_seqlens int32 [N+1]; window [num_slots, C, KW-1];
    slots int32 [N] (distinct; negative: the sequence is skipped, its rows of y left unwritten); weight [C, KW].
    max_seqlen: the longest sequence, or any bound on it (it sizes the grid); None reads it from cu_seqlens on the
    host (a device sync: the GPU step passes it).
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    Returns y [total_T, C] in x's dtype.
    chan_first: channel blocks vary fastest over the grid (fla's order): neighbouring programs read the same rows.
    H200, C 10240, T 32768 (tools/results/gdn_stages_32768.json): 706 us against 828 with time blocks fastest.
    """
    C, KW = weight.shape
    _check_rows("x", x, C)
    if BT < KW - 1:
        raise ValueError(f"BT={BT} must be at least KW-1={KW - 1}")
    N = cu_seqlens.numel() - 1
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if N else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if N == 0 or max_seqlen == 0:
        return y
    grid = (N, triton.cdiv(max_seqlen, BT), triton.cdiv(C, BC))
    # every pointer is compiled as 16-byte aligned (as signature_conv_varlen): the GPU step's x is column 0 of the
    # in_proj output
    launch(conv_varlen_kernel, grid[::-1] if chan_first else grid,
           (x, x.stride(0), y, y.stride(0), weight, bias if bias is not None else weight, window, cu_seqlens, slots,
            C),
           dict(KW=KW, WP=triton.next_power_of_2(KW - 1), BT=BT, BC=BC, HAS_BIAS=bias is not None,
                CHAN_FIRST=chan_first),
           num_warps, JIT_DEFAULT_STAGES, aot=aot)
    return y


def launch_conv_update(x: torch.Tensor, window: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                       out: torch.Tensor | None = None, BC: int = 256) -> torch.Tensor:
    """Decode (keep=None: the window slides in place) or verify (keep given: window kept, x copied).

    x: [B, T, C] (rows of one sequence contiguous in time: x.view(B*T, C) with any row stride);
    keep: [B, T, C] buffer for `launch_conv_commit`. Returns y [B, T, C].
    """
    B, T, C = x.shape
    KW = weight.shape[1]
    x2 = x.reshape(B * T, C)
    _check_rows("x", x2, C)
    y = torch.empty((B, T, C), dtype=x.dtype, device=x.device) if out is None else out
    in_place = keep is None
    grid = (B, triton.cdiv(C, BC))
    conv_update_kernel[grid](x2, x2.stride(0), y, C, weight, bias if bias is not None else weight, window, slots,
                             y if in_place else keep, T, C, KW=KW, WP=triton.next_power_of_2(KW - 1), BC=BC,
                             HAS_BIAS=bias is not None, IN_PLACE=in_place)
    return y


def launch_conv_commit(window: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor, accepted: torch.Tensor,
                       BC: int = 256) -> None:
    """Slide each sequence's window by accepted[b] (int32, 0..T) verify tokens kept in `keep` [B, T, C]."""
    B, T, C = keep.shape
    KW = window.shape[2] + 1
    conv_commit_kernel[(B, triton.cdiv(C, BC))](window, slots, keep, accepted, T, C, KW=KW,
                                                WP=triton.next_power_of_2(KW - 1), BC=BC)


# ---------------------------------------------------------------------------------------------- AOT signatures
# Grids: conv_varlen (cdiv(C, BC), cdiv(max_T, BT), N) (CHAN_FIRST); conv_update and conv_commit (B, cdiv(C, BC)).
# C stays a run-time int; activations, weight and window share `act`; int parameters are not assumed aligned.


def signature_conv_varlen(KW: int, *, BT: int = 32, BC: int = 64, has_bias: bool = False, num_warps: int = 4,
                          num_stages: int = 3, act: str = "*bf16"):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    types = dict(x=act, stride_x="i32", y=act, stride_y="i32", weight=act, bias=act, window=act,
                 cu_seqlens="*i32", slots="*i32", C="i32")
    const = dict(KW=KW, WP=triton.next_power_of_2(KW - 1), BT=BT, BC=BC, HAS_BIAS=has_bias, CHAN_FIRST=True)
    return aot_signature_of(conv_varlen_kernel, types, const, num_warps, num_stages)


def signature_conv_update(KW: int, *, in_place: bool, BC: int = 256, has_bias: bool = False, num_warps: int = 4,
                          num_stages: int = 3, act: str = "*bf16"):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    types = dict(x=act, stride_x="i32", y=act, stride_y="i32", weight=act, bias=act, window=act, slots="*i32",
                 keep=act, T="i32", C="i32")
    const = dict(KW=KW, WP=triton.next_power_of_2(KW - 1), BC=BC, HAS_BIAS=has_bias, IN_PLACE=in_place)
    return aot_signature_of(conv_update_kernel, types, const, num_warps, num_stages)


def signature_conv_commit(KW: int, *, BC: int = 256, num_warps: int = 4, num_stages: int = 3, act: str = "*bf16"):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    types = dict(window=act, slots="*i32", keep=act, accepted="*i32", T="i32", C="i32")
    const = dict(KW=KW, WP=triton.next_power_of_2(KW - 1), BC=BC)
    return aot_signature_of(conv_commit_kernel, types, const, num_warps, num_stages)
