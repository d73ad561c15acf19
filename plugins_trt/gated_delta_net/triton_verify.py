"""Gated DeltaNet verify of width T (2..17) per sequence, and the commit of the accepted prefix.

The verify runs T tokens from the slot (conv window and state) and leaves the slot untouched. Two ways
to roll back exactly, chosen per call:

- mode "states" (per-token states): the state after each token goes to `steps [B, T, HV, DK, DV]`;
  the commit copies steps[b, n-1] into the slot. Costs T state writes per verify (T·HV·DK·DV·4 bytes:
  52 MB for T 17, HV 48, D 128, per sequence and layer).
- mode "replay": nothing but the raw inputs is kept; the commit re-runs the n accepted tokens from the
  slot, in place (one state read and write). Three state passes in all, whatever T.
- mode "deltas" (the default; triton_verify_chunk.py): per token the normalised key, the delta-rule update
  u_t and the decay g_t are kept (fp32, T·(HK·DK + HV·DV + HV)·4 bytes), from which the state after any prefix
  follows; the commit applies the accepted prefix as one rank-n update (one state read and write). Three
  state passes in all. Four ways fill it (DELTAS_KERNELS; deltas_verify_kernel picks one per batch and width):
  the fused token-by-token kernel ("recurrent"), the chunk form that solves the T tokens together ("chunk"),
  or either of them after a prep launch that computes q̂, k̂, v, g, beta once per head (triton_verify_prep.py:
  "prepped", "prepped_chunk"; "prepped_chunk_tail" puts T - 1 tokens in the chunk tile and runs the last as one
  step, so T 17 fits the 16-token tile). Measured per way in tools/results/gdn.json and plugins_trt/gated_delta_net/NOTES.md.

All keep the raw conv inputs (`keep_x [B, T, C]`) and gate inputs (`keep_ab [B, T, 2·HV]`), and both
commits slide the conv window by n. n = accepted[b] counts the verify tokens that stay (0..T; 0 keeps
the slot as it was). Output of both: o [B, T, HV, DV], the same up to fp32 rounding in every mode (bitwise between "states" and "replay").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.gated_delta_net.triton_recurrent import launch_recurrent, rows
from atlas.plugins_trt.gated_delta_net.triton_verify_chunk import (launch_commit_deltas, launch_verify_chunk,
                                                                    slide_head_windows)
from atlas.plugins_trt.gated_delta_net.triton_verify_prep import launch_verify_prepped


MODES = ("states", "replay", "deltas")
DELTAS_KERNELS = ("chunk", "recurrent", "prepped", "prepped_chunk", "prepped_chunk_tail")


@dataclass
class VerifyRollback:
    """What a verify keeps for its commit (static buffers, reusable across steps of the same shape)."""

    keep_x: torch.Tensor
    """[B, T, C] raw conv inputs of the verify tokens."""
    keep_ab: torch.Tensor
    """[B, T, 2·HV] raw gate inputs [a | b]."""
    steps: torch.Tensor | None
    """[B, T, HV, DK, DV] state after each token (mode "states"), else None."""
    k: torch.Tensor | None = None
    """fp32 [B, T, HK, DK] normalised keys (mode "deltas"), else None."""
    u: torch.Tensor | None = None
    """fp32 [B, T, HV, DV] delta-rule updates u_t (mode "deltas")."""
    g: torch.Tensor | None = None
    """fp32 [B, T, HV] log decays g_t (mode "deltas")."""
    scratch: tuple[torch.Tensor, ...] | None = None
    """Mode "deltas": (q̂ fp32 [B, T, HK, DK], silu(conv(v)) [B, T, HV·DV], beta fp32 [B, T, HV]), written and
    read by the two-launch verify (deltas_kernel "prepped"), not by the commit."""

    @classmethod
    def empty(cls, B: int, T: int, C: int, HV: int, DK: int, DV: int, dtype: torch.dtype, device,
              mode: str = "states", state_dtype: torch.dtype = torch.float32) -> "VerifyRollback":
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        keep = (torch.empty((B, T, C), dtype=dtype, device=device), torch.empty((B, T, 2 * HV), dtype=dtype, device=device))
        if mode == "states":
            return cls(*keep, torch.empty((B, T, HV, DK, DV), dtype=state_dtype, device=device))
        if mode == "replay":
            return cls(*keep, None)
        HK, rem = divmod(C - HV * DV, 2 * DK)
        if rem or HK <= 0:
            raise ValueError(f"conv channels {C} are not 2·HK·{DK} + {HV}·{DV} for any key head count HK")
        f32 = dict(dtype=torch.float32, device=device)
        scratch = (torch.empty((B, T, HK, DK), **f32), torch.empty((B, T, HV * DV), dtype=dtype, device=device),
                   torch.empty((B, T, HV), **f32))
        return cls(*keep, None, torch.empty((B, T, HK, DK), **f32), torch.empty((B, T, HV, DV), **f32),
                   torch.empty((B, T, HV), **f32), scratch)

    @property
    def mode(self) -> str:
        return "states" if self.steps is not None else "deltas" if self.u is not None else "replay"

    @property
    def T(self) -> int:
        return self.keep_x.shape[1]


def launch_gdn_verify(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv_weight: torch.Tensor,
                      A_log: torch.Tensor, dt_bias: torch.Tensor, window: torch.Tensor, state: torch.Tensor,
                      slots: torch.Tensor, num_k_heads: int, rollback: VerifyRollback,
                      conv_bias: torch.Tensor | None = None, z: torch.Tensor | None = None,
                      norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
                      out: torch.Tensor | None = None, BV: int | None = None,
                      num_warps: int | None = None, dot_prec: str = "tf32",
                      deltas_kernel: str | None = None, solve_inverse: bool | None = None,
                      tail_dots: bool | None = None, prep_tail: bool | None = None) -> torch.Tensor:
    """Verify T tokens per sequence from the slots without changing them.

    mixed_qkv: [B, T, C] raw in_proj rows (rows b·T + t, any row stride); a, b: [B, T, HV];
    z: [B, T, HV·DV] (optional fused gated norm). Returns o [B, T, HV, DV]; fills `rollback`.
    Mode "deltas" only: deltas_kernel, one of DELTAS_KERNELS (default: deltas_verify_kernel's choice), and
    dot_prec, the chunk kernel's dot precision ("tf32" default, "tf32x3", "ieee"); solve_inverse, the chunk
    kernels' token solve by (I + A)^{-1} from products instead of forward substitution (default:
    verify_solve_inverse's choice); tail_dots, "prepped_chunk_tail"'s last token from three small dots
    (launch_verify_chunk); prep_tail, the prepped ways' first launch with its last token as a 1-row tile
    (launch_verify_prep). Both default to on for "prepped_chunk_tail" (H200, 27B B 8 K 17: 78.7 us with both,
    100.1 without, tools/results/gdn_sweep_tail.json), off otherwise.
    """
    B, T, C = mixed_qkv.shape
    _, HV, DK, DV = state.shape
    if rollback.keep_x.shape != (B, T, C):
        raise ValueError(f"rollback buffers are for [B, T, C] = {list(rollback.keep_x.shape)}, the verify is "
                         f"{[B, T, C]}: make them with VerifyRollback.empty for this batch and width")
    o = torch.empty((B, T, HV, DV), dtype=mixed_qkv.dtype, device=mixed_qkv.device) if out is None else out
    R = rollback
    # [B*T, width] views, one row per token
    x2, a2, b2 = rows(mixed_qkv, "mixed_qkv", C), rows(a, "a", HV), rows(b, "b", HV)
    z2 = rows(z, "z", HV * DV) if z is not None else None
    common = dict(o=o.view(B * T, HV * DV), keep_x=R.keep_x.view(B * T, C), keep_ab=R.keep_ab.view(B * T, 2 * HV),
                  z=z2, norm_weight=norm_weight, norm_eps=norm_eps, BV=BV, num_warps=num_warps)
    args = (x2, a2, b2, conv_weight, conv_bias, A_log, dt_bias, window, state, slots)
    if R.mode != "deltas":
        if deltas_kernel is not None:
            raise ValueError(f"deltas_kernel={deltas_kernel!r} applies to rollback mode 'deltas'; this rollback is "
                             f"mode {R.mode!r} (make it with VerifyRollback.empty(..., mode='deltas'))")
        launch_recurrent(*args, num_k_heads=num_k_heads, T=T, steps=R.steps, in_place=False, **common)
        return o
    deltas_kernel = deltas_kernel or deltas_verify_kernel(B, T, HV)
    if deltas_kernel not in DELTAS_KERNELS:
        raise ValueError(f"deltas_kernel must be one of {DELTAS_KERNELS}, got {deltas_kernel!r}")
    if solve_inverse is None:
        solve_inverse = verify_solve_inverse(deltas_kernel, T)
    tail_dots = deltas_kernel == "prepped_chunk_tail" if tail_dots is None else tail_dots
    prep_tail = deltas_kernel == "prepped_chunk_tail" if prep_tail is None else prep_tail
    deltas = dict(dk=R.k.view(B * T, -1), du=R.u.view(B * T, -1), dg=R.g.view(B * T, -1))
    if deltas_kernel == "recurrent":
        launch_recurrent(*args, num_k_heads=num_k_heads, T=T, deltas=tuple(deltas.values()), in_place=False,
                         **common)
    elif deltas_kernel == "chunk":
        launch_verify_chunk(*args, num_k_heads=num_k_heads, T=T, dot_prec=dot_prec, solve_inverse=solve_inverse,
                            **deltas, **common)
    else:
        qn, vc, beta = R.scratch
        launch_verify_prepped(*args, num_k_heads=num_k_heads, T=T, qn=qn.view(B * T, -1), vc=vc.view(B * T, -1),
                              beta=beta.view(B * T, -1), chunk=deltas_kernel.startswith("prepped_chunk"),
                              tail=deltas_kernel == "prepped_chunk_tail", dot_prec=dot_prec,
                              solve_inverse=solve_inverse, tail_dots=tail_dots, prep_tail=prep_tail, **deltas,
                              **common)
    return o


def verify_solve_inverse(deltas_kernel: str, T: int) -> bool:
    """Whether the chunk verify solves its tokens by (I + A)^{-1} from products (triton_common.inv_unit_lower) rather
    than by forward substitution. H200, Qwen3.5-27B (`python -m atlas.tools.bench_gdn --sweep
    verify_tail,verify_inverse`, tools/results/gdn_verify_sweep2.json): products are faster once the substitution
    has more than 8 rows (T 16: 67.2 -> 62.0 us at B 8; T 17 with the tail 99.8 -> 96.9) and 2-4% slower at T 4 /
    8 (B 8). Only in a 16-token tile (a 32 tile loses accuracy: launch_verify_chunk refuses it)."""
    if deltas_kernel == "prepped_chunk_tail":
        return T - 1 > 8
    return deltas_kernel in ("chunk", "prepped_chunk") and 8 < T <= 16


def deltas_verify_kernel(B: int, T: int, HV: int) -> str:
    """Which kernel fills a "deltas" rollback (each way's time for every benchmark case is in
    tools/results/gdn.json; H200, HV 32 and 48, B 1 and 8):
    - T <= 2, or T <= 4 with few programs (B·HV <= 96): the fused token-by-token kernel, one launch;
    - T <= 16 otherwise: prep launch + chunk form (the T tokens solved together, token tile 16);
    - T 17: prep launch + chunk form on the first 16 tokens (one token tile; a 32-token tile spills) + the last
      token as one recurrence step ("prepped_chunk_tail": 1.16-1.38x fla against 1.06-1.30x for the prepped
      token-by-token recurrence)."""
    if T <= 2 or (T <= 4 and B * HV <= 96):
        return "recurrent"
    return "prepped_chunk" if T <= 16 else "prepped_chunk_tail"


@triton.jit
def gdn_commit_kernel(
    state,                # [num_slots, HV, DK, DV]
    slots,                # int32 [B]; negative = padding, skipped
    accepted,             # int32 [B], 0..T
    steps,                # [B, T, HV, DK, DV] per-token states of the verify
    window,               # [num_slots, C, KW-1]
    keep_x,               # [B*T, C] raw conv inputs of the verify
    T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    KW: tl.constexpr, WP: tl.constexpr, BV: tl.constexpr,
):
    """Grid (DV // BV, HV, B): slot state <- steps[b, n-1]; window slid by n. Channel ownership as in
    the verify: v channels per program, q/k channels of key head kh by (h % R == 0, tile 0)."""
    iv, h, bi = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + bi).to(tl.int64)
    n = tl.load(accepted + bi)
    if (slot < 0) | (n <= 0):
        return
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    src = steps + (((bi * T + n - 1).to(tl.int64) * HV + h) * DK + ck[:, None]) * DV + cv[None, :]
    dst = state + ((slot * HV + h) * DK + ck[:, None]) * DV + cv[None, :]
    tl.store(dst, tl.load(src).to(state.dtype.element_ty))
    slide_head_windows(window, keep_x, slot, bi, T, n, h, iv, cv, HK, HV, DK, DV, KW, WP)


def launch_gdn_commit(rollback: VerifyRollback, accepted: torch.Tensor, window: torch.Tensor,
                      state: torch.Tensor, slots: torch.Tensor, num_k_heads: int, BV: int | None = None,
                      num_warps: int = 4, dot_prec: str = "tf32") -> None:
    """Install the state after accepted[b] tokens in each slot and slide its conv window: mode "states"
    copies the kept state, mode "deltas" applies the kept updates (one rank-n update)."""
    B, T, C = rollback.keep_x.shape
    if rollback.mode == "deltas":
        launch_commit_deltas(rollback.k.view(B * T, -1), rollback.u.view(B * T, -1), rollback.g.view(B * T, -1),
                             rollback.keep_x.view(B * T, C), accepted, window, state, slots,
                             num_k_heads=num_k_heads, T=T, BV=BV, num_warps=num_warps, dot_prec=dot_prec)
        return
    if rollback.steps is None:
        raise ValueError("this rollback was made in mode 'replay': commit with launch_gdn_commit_replay")
    _, HV, DK, DV = state.shape
    KW = window.shape[2] + 1
    BV = BV or min(DV, 64)
    gdn_commit_kernel[(DV // BV, HV, B)](state, slots, accepted, rollback.steps, window, rollback.keep_x, T,
                                         HK=num_k_heads, HV=HV, DK=DK, DV=DV, KW=KW,
                                         WP=triton.next_power_of_2(KW - 1), BV=BV, num_warps=num_warps)


def launch_gdn_commit_replay(rollback: VerifyRollback, accepted: torch.Tensor, conv_weight: torch.Tensor,
                             A_log: torch.Tensor, dt_bias: torch.Tensor, window: torch.Tensor,
                             state: torch.Tensor, slots: torch.Tensor, num_k_heads: int,
                             conv_bias: torch.Tensor | None = None, BV: int | None = None,
                             num_warps: int | None = None) -> None:
    """Mode "replay" (works for either mode): re-run the accepted tokens from the slot, in place."""
    B, T, C = rollback.keep_x.shape
    HV = state.shape[1]
    ab = rollback.keep_ab.view(B * T, 2 * HV)
    launch_recurrent(rollback.keep_x.view(B * T, C), ab[:, :HV], ab[:, HV:], conv_weight, conv_bias, A_log, dt_bias,
                     window, state, slots, num_k_heads=num_k_heads, T=T, lens=accepted, in_place=True, BV=BV,
                     num_warps=num_warps)


def signature_gdn_commit(HK: int, HV: int, DK: int, DV: int, KW: int, *, BV: int, num_warps: int = 4,
                         num_stages: int = 3, act: str = "*bf16", state: str = "*fp32"):
    """gdn_commit_kernel (rollback mode "states"); launch_gdn_commit's default BV is min(DV, 64).
    Grid (DV // BV, HV, B)."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    types = dict(state=state, slots="*i32", accepted="*i32", steps=state, window=act, keep_x=act, T="i32")
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, KW=KW, WP=triton.next_power_of_2(KW - 1), BV=BV)
    return aot_signature_of(gdn_commit_kernel, types, const, num_warps, num_stages)
