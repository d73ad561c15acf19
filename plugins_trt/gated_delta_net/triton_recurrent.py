"""Fused token-by-token Gated DeltaNet kernel: causal conv + SiLU, gating, L2 norm, the delta rule,
optionally the gated RMSNorm, for a batch of sequences of T = 1..17 new tokens each.

It serves decode (T = 1, state and conv window updated in place), verify (width T: the slot is left
alone, per-token states and the raw inputs go to rollback buffers) and the replay commit (the kept
inputs re-run for the accepted tokens, in place). `triton_decode.py` and `triton_verify.py` hold the
launchers. Per value head h, with key head kh = h // (HV/HK) and state S [DK, DV]:

    q, k = l2norm(conv(x)[q_kh]) / sqrt(DK), l2norm(conv(x)[k_kh]);  v = conv(x)[v_h]
    g = -exp(A_log) · softplus(a + dt_bias);  beta = sigmoid(b)
    S <- exp(g) · S;  u = beta · (v - Sᵀk);  S <- S + k uᵀ;  o = Sᵀq
    (FUSE_NORM) o <- norm_w · o / rms(o) · silu(z)

One program per (Dv tile, value head, sequence): grid (DV // BV, HV, B).

The gated norm needs a head's whole o. With several tokens (verify) one program holds the head (BV = DV, 8 warps). A
decode step (T = 1) keeps the Dv tiles of the unfused kernel (BV 32 / 64, 4 warps; at BV = DV the kernel needed 255
registers and a 1000-byte stack of spills a thread on sm_90: tools/results/gdn_registers.txt) and fuses the norm
across them (SPLIT_NORM): each tile writes its o, rounded to the output dtype, and its sum of squares (fp32 scratch
`nss`); the head's last tile to arrive, found with a counter in `sync` after the window's, normalizes the head.
Written 2026-12-07 from the SASS and the 27B engine's profile (the fused decode at 23 us a layer against 6.7 us for
the unfused tiles in bench_gdn); GPU tests and timing pending.

The conv (width KW = 4) runs in registers: the last three inputs of each channel start from the
window and shift by one per token, so a token costs one load of its own input row, issued a token
ahead; no memory access sits on the token-to-token path.

In-place conv window, race-free: the v channels of a program are its own; the q and k channels of
key head kh are read by all R·NV programs of that head (R = HV/HK value heads, NV = DV/BV tiles), so
their window is written by whichever of them finishes last, found with an atomic counter per
(sequence, key head) in `sync` (int32 [B, HK], zeros; the last arriver sets it back to zero).
"""

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.buffers import grown
from atlas.plugins_trt.gated_delta_net.triton_common import gated_norm_vec, gdn_gate, l2norm_vec
from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter


@triton.jit
def gdn_recurrent_kernel(
    x, stride_x,          # [B*T, C] raw conv inputs [q | k | v], C = 2·HK·DK + HV·DV; row b·T + t
    a, b, stride_ab,      # [B*T, HV] raw gate inputs (decay a, beta b), one row stride for both
    conv_w, conv_b,       # [C, KW], [C] (conv_b read only if HAS_CONV_BIAS)
    A_log, dt_bias,       # [HV]
    window,               # [num_slots, C, KW-1] conv windows (written only if IN_PLACE)
    state,                # [num_slots, HV, DK, DV] recurrent states, fp32 or bf16 (the pointer's type)
    slots,                # int32 [B]; a negative slot is a padding row: skipped, nothing written
    lens,                 # int32 [B] tokens to run, 0..T (read only if HAS_LENS; else every row runs T)
    sync,                 # int32 [B, HK] zeroed counters (IN_PLACE), then [B, HV] (SPLIT_NORM); left zero
    nss,                  # fp32 [B, HV, NV] each Dv tile's sum of squares of o (SPLIT_NORM)
    o, stride_o,          # [B*T, HV*DV] outputs (STORE_O)
    z, stride_z, norm_w,  # [B*T, HV*DV] output gate and [DV] norm weight (FUSE_NORM)
    steps,                # [B, T, HV, DK, DV] the state after each token (STORE_STEPS)
    keep_x, keep_ab,      # [B*T, C] copy of x, [B*T, 2·HV] copy of [a | b] (KEEP_INPUTS)
    dk, du, dg,           # fp32 [B*T, HK, DK] k̂, [B*T, HV, DV] u, [B*T, HV] g per token (STORE_DELTAS)
    T,                    # rows per sequence in x, a, b, o, z (1..17)
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    KW: tl.constexpr, WP: tl.constexpr,  # conv width, next power of two >= KW-1
    BV: tl.constexpr,                    # Dv tile (divides DV)
    IN_PLACE: tl.constexpr,              # write the final state and slide the window in the slot
    STORE_STEPS: tl.constexpr, KEEP_INPUTS: tl.constexpr, STORE_O: tl.constexpr, STORE_DELTAS: tl.constexpr,
    FUSE_NORM: tl.constexpr, NORM_EPS: tl.constexpr,
    HAS_CONV_BIAS: tl.constexpr, HAS_LENS: tl.constexpr,
    PDL: tl.constexpr = False,           # programmatic dependent launch (plugins_trt/pdl.py)
    SPLIT_NORM: tl.constexpr = False,    # FUSE_NORM over NV > 1 Dv tiles (T = 1 only): module docstring
):
    tl.static_assert(KW == 4, "the fused kernel keeps the conv's last three inputs in registers (KW 4)")
    pdl_enter(PDL)
    iv, h, bi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    R: tl.constexpr = HV // HK
    NV: tl.constexpr = DV // BV
    C: tl.constexpr = 2 * HK * DK + HV * DV
    if FUSE_NORM and not SPLIT_NORM:
        tl.static_assert(BV == DV, "FUSE_NORM needs the whole head in one program (BV == DV) or SPLIT_NORM")
    slot = tl.load(slots + bi).to(tl.int64)
    n = T
    if HAS_LENS:
        n = tl.load(lens + bi)
    if (slot < 0) | (n <= 0):
        return
    kh = h // R
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    q_ch = kh * DK + ck
    k_ch = HK * DK + kh * DK + ck
    v_ch = 2 * HK * DK + h * DV + cv
    win = window + slot * (C * (KW - 1))
    row0 = (bi * T).to(tl.int64)
    xs = x + row0 * stride_x
    tile = ck[:, None] * DV + cv[None, :]  # int32 offsets of a [DK, BV] tile inside one head's state
    S = tl.load(state + (slot * HV + h) * (DK * DV) + tile).to(tl.float32)  # S: [DK, BV]
    neg_A = -tl.exp(tl.load(A_log + h).to(tl.float32))
    dtb = tl.load(dt_bias + h).to(tl.float32)
    scale = 1.0 / tl.sqrt(DK * 1.0)
    # The conv's last three inputs per channel live in registers (oldest first), starting from the
    # window; each token then needs only its own input row, loaded one token ahead.
    q1, q2, q3 = _window_cols(win, q_ch)
    k1, k2, k3 = _window_cols(win, k_ch)
    v1, v2, v3 = _window_cols(win, v_ch)
    xq = tl.load(xs + q_ch)
    xk = tl.load(xs + k_ch)
    xv = tl.load(xs + v_ch)
    a_n = tl.load(a + row0 * stride_ab + h)
    b_n = tl.load(b + row0 * stride_ab + h)
    for t in range(n):
        row = row0 + t
        cq, ckk, cvv, a_t, b_t = xq, xk, xv, a_n, b_n
        more = t + 1 < n
        xq = tl.load(xs + (t + 1) * stride_x + q_ch, mask=more, other=0.0)
        xk = tl.load(xs + (t + 1) * stride_x + k_ch, mask=more, other=0.0)
        xv = tl.load(xs + (t + 1) * stride_x + v_ch, mask=more, other=0.0)
        a_n = tl.load(a + (row + 1) * stride_ab + h, mask=more, other=0.0)
        b_n = tl.load(b + (row + 1) * stride_ab + h, mask=more, other=0.0)
        q = _conv4(conv_w, conv_b, q_ch, q1, q2, q3, cq, HAS_CONV_BIAS)
        k = _conv4(conv_w, conv_b, k_ch, k1, k2, k3, ckk, HAS_CONV_BIAS)
        v = _conv4(conv_w, conv_b, v_ch, v1, v2, v3, cvv, HAS_CONV_BIAS)
        q1, q2, q3 = q2, q3, cq.to(tl.float32)
        k1, k2, k3 = k2, k3, ckk.to(tl.float32)
        v1, v2, v3 = v2, v3, cvv.to(tl.float32)
        q = l2norm_vec(q) * scale
        k = l2norm_vec(k)
        g, beta = gdn_gate(a_t, b_t, neg_A, dtb)
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))  # u: [BV]
        S = S + k[:, None] * u[None, :]
        if STORE_DELTAS:  # what rollback mode "deltas" keeps (triton_verify_chunk.py has its commit)
            tl.store(du + (row * HV + h) * DV + cv, u)
            if iv == 0:
                tl.store(dg + row * HV + h, g)
                if h % R == 0:
                    tl.store(dk + (row * HK + kh) * DK + ck, k)
        if STORE_O:
            out = tl.sum(S * q[:, None], axis=0)  # out: [BV]
            if SPLIT_NORM:  # this tile's o (rounded, as gated_norm_vec first does) and its sum of squares; the
                # head's last tile to arrive normalizes all NV of them
                out = out.to(o.dtype.element_ty)
                tl.store(o + row * stride_o + h * DV + cv, out)
                ss = tl.sum(out.to(tl.float32) * out.to(tl.float32), axis=0)
                tl.store(nss + (bi * HV + h) * NV + iv, ss)
                _split_norm(o + row * stride_o + h * DV, z + row * stride_z + h * DV, norm_w,
                            nss + (bi * HV + h) * NV, sync + HK * tl.num_programs(2) + bi * HV + h, DV, NV,
                            NORM_EPS)
            else:
                if FUSE_NORM:
                    out = gated_norm_vec(out, z + row * stride_z + h * DV, norm_w, cv, DV, NORM_EPS,
                                         o.dtype.element_ty)
                tl.store(o + row * stride_o + h * DV + cv, out.to(o.dtype.element_ty))
        if STORE_STEPS:
            tl.store(steps + (row * HV + h) * (DK * DV) + tile, S.to(steps.dtype.element_ty))
        if KEEP_INPUTS:
            tl.store(keep_x + row * C + v_ch, cvv)
            if (h % R == 0) & (iv == 0):
                tl.store(keep_x + row * C + q_ch, cq)
                tl.store(keep_x + row * C + k_ch, ckk)
            if iv == 0:
                tl.store(keep_ab + row * (2 * HV) + h, a_t)
                tl.store(keep_ab + row * (2 * HV) + HV + h, b_t)
    if IN_PLACE:
        tl.debug_barrier()  # every thread has read its part of S and the window before they are overwritten
        tl.store(state + (slot * HV + h) * (DK * DV) + tile, S.to(state.dtype.element_ty))
        _store_window_cols(win, v_ch, v1, v2, v3)
        # The q/k windows of key head kh: written by the last of its R·NV programs to get here.
        arrived = tl.atomic_add(sync + bi * HK + kh, 1, sem="acq_rel")
        if arrived == R * NV - 1:
            _store_window_cols(win, q_ch, q1, q2, q3)
            _store_window_cols(win, k_ch, k1, k2, k3)
            tl.atomic_xchg(sync + bi * HK + kh, 0, sem="relaxed")


@triton.jit
def _split_norm(o_row, z_row, norm_w, ss_row, count, DV: tl.constexpr, NV: tl.constexpr, NORM_EPS: tl.constexpr):
    """SPLIT_NORM: after this program's tile of one head's o and its sum of squares are written, the head's last
    program to arrive (an acq_rel counter, after a CTA barrier: gluon_streamk's / COMBINE's pattern) adds the NV sums
    and writes norm_w · o / rms(o) · silu(z) over the whole head (what the others wrote read past L1, .cg)."""
    tl.debug_barrier()  # every thread's stores are issued before the count
    if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == NV - 1:
        total = tl.sum(tl.load(ss_row + tl.arange(0, NV), cache_modifier=".cg"), axis=0)
        d = tl.arange(0, DV)
        out = tl.load(o_row + d, cache_modifier=".cg").to(tl.float32)
        zt = tl.load(z_row + d).to(tl.float32)
        w = tl.load(norm_w + d).to(tl.float32)
        y = out * tl.rsqrt(total / DV + NORM_EPS) * w * (zt * tl.sigmoid(zt))
        tl.store(o_row + d, y.to(o_row.dtype.element_ty))
        tl.store(count, 0)


@triton.jit
def _window_cols(win, chan):
    """The three window columns (oldest first) of channels `chan`, fp32."""
    p = win + chan * 3
    return tl.load(p).to(tl.float32), tl.load(p + 1).to(tl.float32), tl.load(p + 2).to(tl.float32)


@triton.jit
def _store_window_cols(win, chan, c0, c1, c2):
    p = win + chan * 3
    tl.store(p, c0.to(win.dtype.element_ty))
    tl.store(p + 1, c1.to(win.dtype.element_ty))
    tl.store(p + 2, c2.to(win.dtype.element_ty))


@triton.jit
def _conv4(conv_w, conv_b, chan, e0, e1, e2, x_t, HAS_BIAS: tl.constexpr):
    """silu(bias + w0·e0 + w1·e1 + w2·e2 + w3·x_t), rounded to the input dtype as the reference does."""
    p = conv_w + chan * 4
    acc = tl.load(p).to(tl.float32) * e0 + tl.load(p + 1).to(tl.float32) * e1 \
        + tl.load(p + 2).to(tl.float32) * e2 + tl.load(p + 3).to(tl.float32) * x_t.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(conv_b + chan).to(tl.float32)
    y = acc * tl.sigmoid(acc)
    return y.to(x_t.dtype).to(tl.float32)


# ---------------------------------------------------------------------------------------------- launcher

_SYNC: dict[torch.device, torch.Tensor] = {}


def sync_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed int32 counters for the in-place window slide, at least `count` of them (kept zero by the kernel).

    The first call for a device (or a larger count) allocates and zeroes them: make it outside CUDA graph capture
    (a warm-up launch), where the zeroing runs at once rather than at the graph's first replay."""
    return grown(_SYNC, device, count, lambda n: torch.zeros(max(n, 1024), dtype=torch.int32, device=device))


_NSS: dict[torch.device, torch.Tensor] = {}


def norm_partials(device: torch.device, count: int) -> torch.Tensor:
    """fp32 scratch for SPLIT_NORM's per-tile sums of squares, at least `count` (written before read every launch,
    so never zeroed; grown like sync_counters)."""
    return grown(_NSS, device, count, lambda n: torch.empty(max(n, 4096), dtype=torch.float32, device=device))


def rows(t: torch.Tensor, name: str, width: int) -> torch.Tensor:
    """t [..., width] as [rows, width] with unit column stride (a view where t allows it)."""
    r = t.reshape(-1, width)
    if r.stride(1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous, got strides {t.stride()}")
    return r


def recurrent_config(T: int, B: int, HV: int, DV: int, fuse_norm: bool, BV: int | None = None,
                     num_warps: int | None = None) -> tuple[int, int]:
    """The launcher's default (BV, num_warps); see launch_recurrent."""
    if fuse_norm and T > 1:
        BV, num_warps = DV, num_warps or 8
    elif BV is None:
        if T > 1:
            BV, num_warps = min(DV, 16), num_warps or 1
        else:
            BV = min(DV, 64 if B * HV >= 2 * 132 else 32)
    return BV, num_warps or 4


RECURRENT_MODES = {
    # decode: T = 1, state and window updated in place, fused gated norm
    "decode": dict(IN_PLACE=True, STORE_STEPS=False, KEEP_INPUTS=False, STORE_O=True, FUSE_NORM=True,
                   HAS_LENS=False),
    # verify, rollback mode "states": slot untouched, per-token states and raw inputs kept, fused gated norm
    "verify": dict(IN_PLACE=False, STORE_STEPS=True, KEEP_INPUTS=True, STORE_O=True, FUSE_NORM=True,
                   HAS_LENS=False),
    # verify, rollback mode "replay": only the raw inputs kept
    "verify_replay": dict(IN_PLACE=False, STORE_STEPS=False, KEEP_INPUTS=True, STORE_O=True, FUSE_NORM=True,
                          HAS_LENS=False),
    # verify, rollback mode "deltas" token by token (the chunk-form kernel is the other way to fill them)
    "verify_deltas": dict(IN_PLACE=False, STORE_STEPS=False, KEEP_INPUTS=True, STORE_O=True, FUSE_NORM=True,
                          HAS_LENS=False, STORE_DELTAS=True),
    # the replay commit (launch_gdn_commit_replay): accepted tokens re-run in place, no output
    "commit_replay": dict(IN_PLACE=True, STORE_STEPS=False, KEEP_INPUTS=False, STORE_O=False, FUSE_NORM=False,
                          HAS_LENS=True),
}


# a, b and z are column views of the fused in_proj output (any offset); every other pointer is compiled 16-byte
# aligned (x: the output's column 0)
_VIEWS = ("a", "b", "z")


def signature_gdn_recurrent(mode: str, HK: int, HV: int, DK: int, DV: int, KW: int, *, BV: int, num_warps: int,
                            num_stages: int = 3, norm_eps: float = 1e-6, act: str = "*bf16",
                            state: str = "*fp32", has_conv_bias: bool = False, split_norm: bool = False):
    """gdn_recurrent_kernel for one of RECURRENT_MODES; T (tokens per sequence) stays a run-time int.

    act: dtype of the activations, conv weight, window and keep buffers; state: of state and steps; A_log,
    dt_bias and the norm weight are fp32. a, b and z are column views of the in_proj output (not assumed
    aligned). Grid (DV // BV, HV, B), B = slots.numel()."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(x=P, stride_x=i32, a=P, b=P, stride_ab=i32, conv_w=P, conv_b=P, A_log=F, dt_bias=F, window=P,
                 state=state, slots=I, lens=I, sync=I, nss=F if split_norm else state, o=P, stride_o=i32, z=P,
                 stride_z=i32, norm_w=F, steps=state, keep_x=P, keep_ab=P, dk=F, du=F, dg=F, T=i32)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, KW=KW, WP=triton.next_power_of_2(KW - 1), BV=BV,
                 NORM_EPS=float(norm_eps), HAS_CONV_BIAS=has_conv_bias,
                 **{"STORE_DELTAS": False, **RECURRENT_MODES[mode]}, SPLIT_NORM=split_norm)
    return aot_signature_of(gdn_recurrent_kernel, types, const, num_warps, num_stages, unaligned=_VIEWS)


def launch_recurrent(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, state, slots, *, num_k_heads: int,
                     T: int, lens=None, o=None, z=None, norm_weight=None, norm_eps: float = 1e-6, steps=None,
                     keep_x=None, keep_ab=None, deltas=None, in_place: bool, BV: int | None = None,
                     num_warps: int | None = None, aot=None, pdl: bool = False):
    """Launch gdn_recurrent_kernel; x [B*T, C], a/b [B*T, HV] (one row stride), state [S, HV, DK, DV].

    Default tiles (H200 sweep at HV 48, D 128): one token (decode) BV 64 / 4 warps once B·HV fills the
    chip twice, else BV 32 / 4 warps; several tokens (verify, replay) BV 16 / 1 warp, whose reductions
    stay inside a warp and whose many small programs hide the token-to-token latency.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Nothing is read from the device on the host: a decode launch records into a CUDA graph (the first launch at a
    batch may allocate the sync counters: make it outside capture, as ModelRunner's warm-up launch does).
    """
    _, HV, DK, DV = state.shape
    HK = num_k_heads
    C, KW = conv_weight.shape
    if C != 2 * HK * DK + HV * DV:
        raise ValueError(f"conv channels {C} != 2·{HK}·{DK} + {HV}·{DV}")
    B = slots.numel()
    if a.stride(0) != b.stride(0):
        raise ValueError(f"a and b need one row stride, got {a.stride(0)} and {b.stride(0)}")
    fuse_norm = z is not None
    BV, num_warps = recurrent_config(T, B, HV, DV, fuse_norm, BV, num_warps)
    split_norm = fuse_norm and BV < DV
    if split_norm and T != 1:
        raise ValueError(f"the gated norm fused over Dv tiles (BV {BV} < DV {DV}) needs T = 1, got T = {T}")
    dummy = state  # stands in for every pointer a constexpr flag keeps the kernel from touching
    grid = (DV // BV, HV, B)
    launch(gdn_recurrent_kernel, grid,
           (x, x.stride(0), a, b, a.stride(0), conv_weight, conv_bias if conv_bias is not None else conv_weight,
            A_log, dt_bias, window, state, slots, lens if lens is not None else slots,
            sync_counters(state.device, B * (HK + HV)),
            norm_partials(state.device, B * HV * (DV // BV)) if split_norm else dummy,
            o if o is not None else dummy, o.stride(0) if o is not None else 0,
            z if fuse_norm else dummy, z.stride(0) if fuse_norm else 0, norm_weight if fuse_norm else dummy,
            steps if steps is not None else dummy, keep_x if keep_x is not None else dummy,
            keep_ab if keep_ab is not None else dummy, *(deltas if deltas is not None else (dummy,) * 3), T),
           dict(HK=HK, HV=HV, DK=DK, DV=DV, KW=KW, WP=triton.next_power_of_2(KW - 1), BV=BV, IN_PLACE=in_place,
                STORE_STEPS=steps is not None, KEEP_INPUTS=keep_x is not None, STORE_O=o is not None,
                STORE_DELTAS=deltas is not None, FUSE_NORM=fuse_norm, NORM_EPS=float(norm_eps),
                HAS_CONV_BIAS=conv_bias is not None, HAS_LENS=lens is not None, PDL=pdl, SPLIT_NORM=split_norm),
           num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=_VIEWS)
