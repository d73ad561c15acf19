"""Benchmark Atlas's Triton Gated DeltaNet kernels against flash-linear-attention on one GPU.

    python3 tools/bench_gdn.py [--out tools/results/gdn.json] [--repeats 20] [--models qwen3.5-27b,...]

Cases, for Qwen3.5-27B (HK 16, HV 48, D 128) and Qwen3-Next-80B (HK 16, HV 32, D 128), bf16 activations,
fp32 recurrent state, conv width 4:
- prefill T in {512, 4096, 32768}, one sequence: causal conv + chunked delta rule, state from a slot and
  back (Atlas: conv_varlen + chunk_wy + chunk_scan; fla: causal_conv1d + chunk_gated_delta_rule with
  gating, beta sigmoid and q/k L2 norm inside, then the final conv/recurrent states copied into the pool);
- decode B in {1, 8, 64}: conv update + gating + L2 norm + one delta step, in place in the slots (Atlas:
  one fused kernel; fla: causal_conv1d_update + fused_recurrent_gated_delta_rule + state write-back;
  `fla_kernel_us` leaves the write-back out);
- verify K in {2, 4, 8, 17} at B in {1, 8}: K tokens from the slots, then the commit of an accepted prefix
  (Atlas rollback mode "deltas", the default: chunk-form verify + rank-n commit; also timed: mode "states",
  per-token states + copy commit, and mode "replay"; fla: causal_conv1d over K tokens + fused_recurrent over
  K tokens + write-back of the final states. fla keeps nothing to roll back a partial accept with: it does
  less work than any Atlas mode).

Every case is timed as CUDA-graph replays of the same work on both sides (median over repeats; inputs
rotate over enough state copies to exceed 4x L2); a side that cannot be captured is timed with events over
back-to-back calls and marked so. The copy bandwidth is measured in the same run; `floor_us` is the
fewest bytes the case must move (inputs and outputs once, the state read and written once) over it.
Writes JSON (--out) with device, versions, bandwidth, every case and a summary; prints a table last.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from atlas.plugins_trt.causal_conv1d.triton_conv import launch_conv_varlen
from atlas.plugins_trt.gated_delta_net.triton_chunk import chunk_plan, launch_chunk_gdn
from atlas.plugins_trt.gated_delta_net.triton_decode import launch_gdn_decode
from atlas.plugins_trt.gated_delta_net.triton_verify import (
    DELTAS_KERNELS, VerifyRollback, deltas_verify_kernel, launch_gdn_commit, launch_gdn_commit_replay,
    launch_gdn_verify)
from atlas.tools.bench.timing import copies_for, copy_bandwidth, device_info, graph_time

MODELS = {"qwen3.5-27b": (16, 48, 128), "qwen3-next-80b": (16, 32, 128)}
KW = 4
BF16 = torch.bfloat16
DEVICE = "cuda"


def event_time(calls, repeats: int) -> float:
    """Median seconds per call over back-to-back eager runs of `calls` (when capture is impossible)."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for c in calls:
            c()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(calls))
    return statistics.median(times)


def timed(row: dict, key: str, calls, repeats: int) -> None:
    """row[key_us]: median microseconds per call, as graph replays; row[key_timing]: how it was timed."""
    try:
        t, how = graph_time(calls, repeats=repeats), "graph"
    except Exception as e:  # noqa: BLE001 — fall back to eager timing and say so
        torch.cuda.synchronize()
        t, how = event_time(calls, repeats), f"events ({type(e).__name__}: {str(e)[:80]})"
    row[f"{key}_us"], row[f"{key}_timing"] = t * 1e6, how


class Layer:
    """Weights of one GDN layer at a model's shape (random, fixed seed)."""

    def __init__(self, HK: int, HV: int, D: int):
        self.HK, self.HV, self.D = HK, HV, D
        self.C = 2 * HK * D + HV * D
        g = torch.Generator(device=DEVICE).manual_seed(0)
        self.conv_w = (torch.randn(self.C, KW, device=DEVICE, generator=g) * 0.5).to(BF16)
        self.A_log = torch.randn(HV, device=DEVICE, generator=g) * 0.5
        self.dt_bias = torch.randn(HV, device=DEVICE, generator=g)
        self.state_bytes = HV * D * D * 4

    def rand(self, *shape, dtype=BF16, scale=1.0):
        return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def _fla():
    try:
        import fla
        from fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        return {"version": getattr(fla, "__version__", "?"), "conv": causal_conv1d, "conv_update": causal_conv1d_update,
                "chunk": chunk_gated_delta_rule, "recurrent": fused_recurrent_gated_delta_rule}
    except Exception as e:  # noqa: BLE001
        print(f"flash-linear-attention not importable ({type(e).__name__}: {e}); timing Atlas only", file=sys.stderr)
        return None


def fla_gdn_kwargs(L: Layer):
    return dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=L.A_log, dt_bias=L.dt_bias,
                use_beta_sigmoid_in_kernel=True, output_final_state=True)


def fla_split(L: Layer, y, B, T):
    H = L.HK * L.D
    q, k, v = y.split([H, H, L.HV * L.D], dim=-1)
    return q.view(B, T, L.HK, L.D), k.view(B, T, L.HK, L.D), v.view(B, T, L.HV, L.D)


# forms of the prefill timed beside launch_chunk_gdn's default in every prefill case: keyword arguments of
# launch_chunk_gdn, or of launch_conv_varlen with a "conv_" prefix
PREFILL_FORMS = {"wy_w1": {"wy_warps": 1}, "out_heads": {"out_heads": True},
                 "out_heads_s1": {"out_heads": True, "out_head_stages": 1}}
"""(The other stage-2 forms and 4 stages were slower than the default or within 0.4% of it in every case of the
2026-12-03 gdn.json, the time-major conv grid slower everywhere; that file has their times as atlas_state_plain /
state_halves / state_s4 / conv_time_major. They stay launch options.)"""
PREFILL_DEFAULT = "sliced_wy_w2_accdot_bv64_s3"
"""launch_chunk_gdn's default (stage 1 sliced at 2 warps, stage 2 accumulating at BV 64 / 3 stages; the conv's grid
channel-major), the name this file records it under (earlier runs: "sliced_wy_bk32_w2", "held_wy" for the
defaults of their time; --resummarize re-picks it)."""
CHUNK_WARPS = inspect.signature(launch_chunk_gdn).parameters["num_warps"].default


def case_prefill(L: Layer, T: int, fla, repeats: int, bw: float, cfg: dict | None = None) -> dict:
    x, ab = L.rand(T, L.C), L.rand(T, 2 * L.HV)
    a, b = ab[:, :L.HV], ab[:, L.HV:]
    window = L.rand(1, L.C, KW - 1)
    state = L.rand(1, L.HV, L.D, L.D, dtype=torch.float32, scale=0.1)
    slots = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
    y = torch.empty(T, L.C, dtype=BF16, device=DEVICE)
    o = torch.empty(T, L.HV, L.D, dtype=BF16, device=DEVICE)
    H = L.HK * L.D
    work = chunk_plan([0, T], DEVICE)
    cfg = cfg or {}

    def atlas(work=work, form=cfg):
        conv = {k.removeprefix("conv_"): v for k, v in form.items() if k.startswith("conv_")}
        launch_conv_varlen(x, cu, window, slots, L.conv_w, max_seqlen=T, out=y, **conv)
        launch_chunk_gdn(y[:, :H], y[:, H:2 * H], y[:, 2 * H:], a, b, L.A_log, L.dt_bias, state, slots, cu,
                         cu_seqlens_host=[0, T], out=o, work=work,
                         **{k: v for k, v in form.items() if not k.startswith("conv_")})

    atlas()  # fills `work` with every buffer it needs, outside the capture
    row = {"kind": "prefill", "T": T, "B": 1, "atlas_way": PREFILL_DEFAULT if not cfg else json.dumps(cfg)}
    timed(row, "atlas", [atlas], repeats)
    for name, form in PREFILL_FORMS.items():  # other forms, timed beside the default
        work_f = chunk_plan([0, T], DEVICE)

        def atlas_form(work_f=work_f, form=form):
            atlas(work_f, {**cfg, **form})

        atlas_form()
        timed(row, f"atlas_{name}", [atlas_form], repeats)
    nbytes = T * (L.C + 2 * L.HV + L.HV * L.D) * 2 + 2 * L.state_bytes
    if fla is not None:
        cache = L.rand(1, L.C, KW)
        h0 = state.clone()

        def peer():
            yy, fs = fla["conv"](x.view(1, T, L.C), weight=L.conv_w, initial_state=cache, output_final_state=True,
                                 activation="silu")
            q, k, v = fla_split(L, yy, 1, T)
            _, ht = fla["chunk"](q, k, v, g=a.view(1, T, L.HV), beta=b.view(1, T, L.HV), initial_state=h0,
                                 **fla_gdn_kwargs(L))
            cache.copy_(fs)
            h0.copy_(ht)

        timed(row, "fla", [peer], repeats)
        for name in PREFILL_FORMS:
            row[f"speedup_{name}_vs_fla"] = row["fla_us"] / row[f"atlas_{name}_us"]
    return finish(row, nbytes, bw)


def case_decode(L: Layer, B: int, fla, repeats: int, bw: float, cfg: dict | None = None) -> dict:
    n = copies_for(B * 2 * L.state_bytes)
    x, ab = L.rand(B, L.C), L.rand(B, 2 * L.HV)
    a, b = ab[:, :L.HV], ab[:, L.HV:]
    window = L.rand(n * B, L.C, KW - 1)
    state = L.rand(n * B, L.HV, L.D, L.D, dtype=torch.float32, scale=0.1)
    slot_sets = [torch.arange(i * B, (i + 1) * B, dtype=torch.int32, device=DEVICE) for i in range(n)]
    o = torch.empty(B, L.HV, L.D, dtype=BF16, device=DEVICE)
    cfg = cfg or {}
    calls = [lambda s=s: launch_gdn_decode(x, a, b, L.conv_w, L.A_log, L.dt_bias, window, state, s, L.HK, out=o,
                                           **cfg) for s in slot_sets]
    row = {"kind": "decode", "B": B, "T": 1, "rotation": n}
    timed(row, "atlas", calls, repeats)
    nbytes = B * (2 * L.state_bytes + 2 * L.C * (KW - 1) * 2 + (L.C + 2 * L.HV + L.HV * L.D) * 2)
    if fla is not None:
        cache = L.rand(n * B, L.C, KW)

        def peer(i, write_back=True):
            yy, _ = fla["conv_update"](x, cache[i * B:(i + 1) * B], weight=L.conv_w, activation="silu")
            q, k, v = fla_split(L, yy.view(B, 1, L.C), B, 1)
            h0 = state[i * B:(i + 1) * B]
            _, ht = fla["recurrent"](q, k, v, g=a.view(B, 1, L.HV), beta=b.view(B, 1, L.HV), initial_state=h0,
                                     **fla_gdn_kwargs(L))
            if write_back:
                h0.copy_(ht)

        timed(row, "fla", [lambda i=i: peer(i) for i in range(n)], repeats)
        timed(row, "fla_kernel", [lambda i=i: peer(i, False) for i in range(n)], repeats)
    return finish(row, nbytes, bw)


VERIFY_WAYS = tuple(f"deltas_{k}" for k in DELTAS_KERNELS) + ("states", "replay")


def case_verify(L: Layer, B: int, K: int, fla, repeats: int, bw: float, cfg: dict | None = None,
                modes=VERIFY_WAYS) -> dict:
    """modes: rollback modes to time ("deltas" with cfg's deltas_kernel or the default one; "deltas_<kernel>";
    "states"; "replay"). atlas_us is the mode and kernel the launcher picks by default (deltas_verify_kernel)."""
    n = copies_for(B * (K + 3) * L.state_bytes)
    x, ab = L.rand(B, K, L.C), L.rand(B, K, 2 * L.HV)
    a, b = ab[..., :L.HV], ab[..., L.HV:]
    window = L.rand(n * B, L.C, KW - 1)
    state = L.rand(n * B, L.HV, L.D, L.D, dtype=torch.float32, scale=0.1)
    slot_sets = [torch.arange(i * B, (i + 1) * B, dtype=torch.int32, device=DEVICE) for i in range(n)]
    accepted = torch.full((B,), max(1, K // 2), dtype=torch.int32, device=DEVICE)
    o = torch.empty(B, K, L.HV, L.D, dtype=BF16, device=DEVICE)
    row = {"kind": "verify", "B": B, "K": K, "accepted": max(1, K // 2), "rotation": n}
    cfg = cfg or {}
    for label in modes:
        mode, _, kern = label.partition("_")
        rbs = [VerifyRollback.empty(B, K, L.C, L.HV, L.D, L.D, BF16, DEVICE, mode=mode) for _ in range(n)]
        kw = dict(cfg, **({"deltas_kernel": kern} if kern else {}))

        def step(i, mode=mode, rbs=rbs, kw=kw):
            s = slot_sets[i]
            launch_gdn_verify(x, a, b, L.conv_w, L.A_log, L.dt_bias, window, state, s, L.HK, rbs[i], out=o, **kw)
            if mode in ("states", "deltas"):
                launch_gdn_commit(rbs[i], accepted, window, state, s, L.HK,
                                  **{k: v for k, v in cfg.items() if k == "dot_prec"})
            else:
                launch_gdn_commit_replay(rbs[i], accepted, L.conv_w, L.A_log, L.dt_bias, window, state, s, L.HK,
                                         **{k: v for k, v in cfg.items() if k in ("BV", "num_warps")})

        timed(row, f"atlas_{label}", [lambda i=i: step(i) for i in range(n)], repeats)
        del rbs
    pick_default(row, L.HV, modes[0])
    nbytes = B * (2 * L.state_bytes + 2 * L.C * (KW - 1) * 2 + K * (L.C + 2 * L.HV + L.HV * L.D) * 2)
    if fla is not None:
        cache = L.rand(n * B, L.C, KW)

        def peer(i):
            c = cache[i * B:(i + 1) * B]
            yy, fs = fla["conv"](x, weight=L.conv_w, initial_state=c, output_final_state=True, activation="silu")
            q, k, v = fla_split(L, yy, B, K)
            h0 = state[i * B:(i + 1) * B]
            _, ht = fla["recurrent"](q, k, v, g=a, beta=b, initial_state=h0, **fla_gdn_kwargs(L))
            h0.copy_(ht)
            c.copy_(fs)

        timed(row, "fla", [lambda i=i: peer(i) for i in range(n)], repeats)
    return finish(row, nbytes, bw)


def pick_default(row: dict, HV: int, fallback: str) -> None:
    """atlas_us <- the time of the rollback the launcher uses by default: mode "deltas" filled by
    deltas_verify_kernel(B, K, HV)'s kernel, if that was timed, else `fallback`'s."""
    key = f"deltas_{deltas_verify_kernel(row['B'], row['K'], HV)}"
    key = key if f"atlas_{key}_us" in row else fallback
    row["atlas_us"], row["atlas_timing"], row["atlas_way"] = row[f"atlas_{key}_us"], row[f"atlas_{key}_timing"], key


def finish(row: dict, nbytes: int, bw: float) -> dict:
    row["floor_bytes"] = nbytes
    row["floor_us"] = nbytes / bw * 1e6
    row["atlas_fraction_of_floor"] = row["floor_us"] / row["atlas_us"]
    if "fla_us" in row:
        row["speedup_vs_fla"] = row["fla_us"] / row["atlas_us"]
        for mode in VERIFY_WAYS:
            if f"atlas_{mode}_us" in row:
                row[f"speedup_{mode}_vs_fla"] = row["fla_us"] / row[f"atlas_{mode}_us"]
    return row


SWEEP = {
    "decode": [dict(BV=bv, num_warps=w) for bv, w in [(32, 4), (16, 2), (16, 1), (8, 1), (64, 4)]],
    "verify": [dict(BV=bv, num_warps=w) for bv, w in [(32, 4), (16, 2), (16, 1), (8, 1)]],
    "verify_deltas": [dict(deltas_kernel=kern, BV=bv, num_warps=w) for kern in ("chunk", "prepped_chunk")
                      for bv, w in [(64, 4), (32, 4), (128, 4)]]
    + [dict(deltas_kernel="recurrent", BV=bv, num_warps=w) for bv, w in [(16, 1), (16, 2), (32, 4)]]
    + [dict(deltas_kernel="prepped", BV=bv, num_warps=w) for bv, w in [(16, 1), (16, 2), (32, 2), (32, 4)]],
    "prefill": [dict(BV=bv, num_warps=(8, w, 4)) for bv, w in [(16, 4), (32, 4), (64, 4), (32, 8), (64, 8)]],
    # K 17's way (the weak end of verify): its tile and warps, at B 1 and 8 only
    "verify_tail": [dict(deltas_kernel="prepped_chunk_tail", BV=bv, num_warps=w, tail_dots=dots, prep_tail=pt)
                    for bv, w in [(64, 4), (32, 4), (128, 8)] for dots, pt in ((True, False), (False, True),
                                                                             (True, True))]
    + [dict(deltas_kernel="prepped_chunk_tail", BV=bv, num_warps=w)
       for bv, w in [(64, 4), (32, 4), (32, 2), (128, 8), (64, 8), (16, 2)]]
    + [dict(deltas_kernel="prepped_chunk_tail", BV=bv, num_warps=w, solve_inverse=False)
       for bv, w in [(64, 4), (32, 4), (128, 8)]],
    # the chunk verify's token solve by forward substitution or by the inverse from products, K 4 / 8 / 16
    "verify_inverse": [dict(deltas_kernel="prepped_chunk", solve_inverse=inv) for inv in (False, True)],
}


def sweep(kinds: list[str], repeats: int, bw: float) -> list[dict]:
    """Atlas-only timings of launch configurations at Qwen3.5-27B's shape, to choose defaults."""
    L = Layer(*MODELS["qwen3.5-27b"])
    rows = []
    for cfg in SWEEP["decode"] if "decode" in kinds else []:
        for B in (1, 8, 64):
            r = case_decode(L, B, None, repeats, bw, cfg)
            rows.append({"case": f"decode B{B}", "cfg": cfg, "us": r["atlas_us"]})
    for cfg in SWEEP["verify"] if "verify" in kinds else []:
        for B, K in ((1, 8), (8, 17)):
            r = case_verify(L, B, K, None, repeats, bw, cfg, modes=("states", "replay"))
            rows.append({"case": f"verify B{B} K{K}", "cfg": cfg, "us": r["atlas_states_us"],
                         "replay_us": r["atlas_replay_us"]})
    for cfg in SWEEP["verify_deltas"] if "verify_deltas" in kinds else []:
        for B, K in [(B, K) for B in (1, 2, 8) for K in (2, 4, 8, 17)]:
            r = case_verify(L, B, K, None, repeats, bw, cfg, modes=("deltas",))
            rows.append({"case": f"verify(deltas) B{B} K{K}", "cfg": cfg, "us": r["atlas_deltas_us"]})
    for cfg in SWEEP["verify_tail"] if "verify_tail" in kinds else []:
        for B in (1, 8):
            r = case_verify(L, B, 17, None, repeats, bw, cfg, modes=("deltas",))
            rows.append({"case": f"verify(deltas) B{B} K17", "cfg": cfg, "us": r["atlas_deltas_us"]})
    for cfg in SWEEP["verify_inverse"] if "verify_inverse" in kinds else []:
        for B, K in [(B, K) for B in (1, 8) for K in (4, 8, 16)]:
            r = case_verify(L, B, K, None, repeats, bw, cfg, modes=("deltas",))
            rows.append({"case": f"verify(deltas) B{B} K{K}", "cfg": cfg, "us": r["atlas_deltas_us"]})
    for cfg in SWEEP["prefill"] if "prefill" in kinds else []:
        for T in (4096, 32768):
            rows.append({"case": f"prefill T{T}", "cfg": {**cfg, "num_warps": list(cfg["num_warps"])},
                         "us": case_prefill(L, T, None, repeats, bw, cfg)["atlas_us"]})
    for r in rows:
        print(f"sweep {r['case']:16s} {json.dumps(r['cfg']):40s} {r['us']:9.1f} us"
              + (f"  replay {r['replay_us']:9.1f} us" if "replay_us" in r else ""), flush=True)
    return rows


def verify_stages(B: int, K: int, repeats: int) -> list[dict]:
    """Per-launch times of one "deltas" verify of K tokens for B sequences at Qwen3.5-27B's shape, the ways the
    launcher picks at K 9..17: the prep launch, the chunk launch (with the tail at K 17) and the commit."""
    from atlas.plugins_trt.gated_delta_net import triton_verify_chunk as vc
    from atlas.plugins_trt.gated_delta_net import triton_verify_prep as vp
    from atlas.plugins_trt.gated_delta_net.triton_verify import verify_solve_inverse
    L = Layer(*MODELS["qwen3.5-27b"])
    n = copies_for(B * (K + 3) * L.state_bytes)
    x, ab = L.rand(B * K, L.C), L.rand(B * K, 2 * L.HV)
    a, b = ab[:, :L.HV], ab[:, L.HV:]
    window = L.rand(n * B, L.C, KW - 1)
    state = L.rand(n * B, L.HV, L.D, L.D, dtype=torch.float32, scale=0.1)
    slot_sets = [torch.arange(i * B, (i + 1) * B, dtype=torch.int32, device=DEVICE) for i in range(n)]
    accepted = torch.full((B,), max(1, K // 2), dtype=torch.int32, device=DEVICE)
    o = torch.empty(B * K, L.HV * L.D, dtype=BF16, device=DEVICE)
    R = VerifyRollback.empty(B, K, L.C, L.HV, L.D, L.D, BF16, DEVICE, mode="deltas")
    qn, vcb, beta = (t.view(B * K, -1) for t in R.scratch)
    dk, du, dg = R.k.view(B * K, -1), R.u.view(B * K, -1), R.g.view(B * K, -1)
    keep_x, keep_ab = R.keep_x.view(B * K, L.C), R.keep_ab.view(B * K, 2 * L.HV)
    tail = K > 16
    kernel = "prepped_chunk_tail" if tail else "prepped_chunk"
    inv = verify_solve_inverse(kernel, K)
    common = dict(keep_x=keep_x, keep_ab=keep_ab, dk=dk, dg=dg, qn=qn, vc=vcb, beta=beta)
    launches = {
        "prep": lambda s: vp.launch_verify_prep(x, a, b, L.conv_w, None, L.A_log, L.dt_bias, window, s,
                                                num_k_heads=L.HK, HV=L.HV, T=K, **common),
        "chunk": lambda s: vc.launch_verify_chunk(x, a, b, L.conv_w, None, L.A_log, L.dt_bias, window, state, s,
                                                  num_k_heads=L.HK, T=K, o=o, keep_x=keep_x, keep_ab=keep_ab, dk=dk,
                                                  du=du, dg=dg, prepped=(qn, vcb, beta), tail=tail,
                                                  solve_inverse=inv),
        "commit": lambda s: launch_gdn_commit(R, accepted, window, state, s, L.HK)}
    if tail:
        launches["prep (tail row)"] = lambda s: vp.launch_verify_prep(x, a, b, L.conv_w, None, L.A_log, L.dt_bias,
                                                                      window, s, num_k_heads=L.HK, HV=L.HV, T=K,
                                                                      tail=True, **common)
        launches["chunk (tail by dots)"] = lambda s: vc.launch_verify_chunk(
            x, a, b, L.conv_w, None, L.A_log, L.dt_bias, window, state, s, num_k_heads=L.HK, T=K, o=o, keep_x=keep_x,
            keep_ab=keep_ab, dk=dk, du=du, dg=dg, prepped=(qn, vcb, beta), tail=True, solve_inverse=inv,
            tail_dots=True)
    rows = []
    for name, fn in launches.items():
        r = {}
        timed(r, "us", [lambda s=s, fn=fn: fn(s) for s in slot_sets], repeats)
        rows.append({"stage": f"verify B{B} K{K} {name}" + (" (tail, products)" if name == "chunk" and tail else
                                                            " (products)" if name == "chunk" and inv else ""),
                     "us": r["us_us"], "timing": r["us_timing"]})
        print(f"stage {rows[-1]['stage']:40s} {rows[-1]['us']:9.1f} us", flush=True)
    return rows


def stages(T: int, repeats: int) -> list[dict]:
    """Per-stage times of one prefill of T tokens at Qwen3.5-27B's shape, stage 1 at several num_warps."""
    from atlas.plugins_trt.gated_delta_net import triton_chunk as tc
    L = Layer(*MODELS["qwen3.5-27b"])
    HV, HK, D = L.HV, L.HK, L.D
    x, ab = L.rand(T, L.C), L.rand(T, 2 * HV)
    a, b = ab[:, :HV], ab[:, HV:]
    window = L.rand(1, L.C, KW - 1)
    state = L.rand(1, HV, D, D, dtype=torch.float32, scale=0.1)
    slots = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
    y = launch_conv_varlen(x, cu, window, slots, L.conv_w, max_seqlen=T)
    H = HK * D
    q, k, v = y[:, :H], y[:, H:2 * H], y[:, 2 * H:]
    W = chunk_plan([0, T], DEVICE)
    o, _ = launch_chunk_gdn(q, k, v, a, b, L.A_log, L.dt_bias, state, slots, cu, cu_seqlens_host=[0, T], work=W)
    NT = W["chunks"].shape[0]
    rows = []

    def add(name, fn):
        row = {}
        timed(row, "t", [fn], repeats)
        rows.append({"stage": name, "us": row["t_us"]})
        print(f"stage T{T} {name:24s} {row['t_us']:9.1f} us", flush=True)

    add("conv", lambda: launch_conv_varlen(x, cu, window, slots, L.conv_w, max_seqlen=T, out=y))
    for bt, bc, nw in ((16, 64, 4), (32, 32, 2), (32, 128, 4), (16, 128, 4), (128, 64, 8), (64, 64, 8)):
        add(f"conv BT={bt} BC={bc} num_warps={nw}", lambda bt=bt, bc=bc, nw=nw: launch_conv_varlen(
            x, cu, window, slots, L.conv_w, max_seqlen=T, out=y, BT=bt, BC=bc, num_warps=nw))
    X = torch.empty(T, HV, 64, dtype=q.dtype, device=DEVICE)
    for nw in (1, 2, 4, 8):
        for store_x in (False, True):  # the fused stage 1, and the first launch of the split one
            add(f"wy{' X' if store_x else ''} num_warps={nw}", lambda nw=nw, sx=store_x: tc.chunk_wy_kernel[(NT, HV)](
                q, q.stride(0), k, k.stride(0), v, v.stride(0), a, b, a.stride(0), L.A_log, L.dt_bias, cu,
                W["chunks"], W["w"], W["u"], W["G"], W["RQ"], W["RK"], X, HK=HK, HV=HV, DK=D, DV=D, BT=64, BC=16,
                DOT_PREC="tf32", STORE_X=sx, num_warps=nw))
    for nw in (2, 4):  # the fused stage 1 holding fewer registers (RELOAD_K)
        add(f"wy reload-k num_warps={nw}", lambda nw=nw: tc.chunk_wy_kernel[(NT, HV)](
            q, q.stride(0), k, k.stride(0), v, v.stride(0), a, b, a.stride(0), L.A_log, L.dt_bias, cu,
            W["chunks"], W["w"], W["u"], W["G"], W["RQ"], W["RK"], X, HK=HK, HV=HV, DK=D, DV=D, BT=64, BC=16,
            DOT_PREC="tf32", RELOAD_K=True, num_warps=nw))
    for nw in (4, 8):  # the split stage 1's second launch
        add(f"wu num_warps={nw}", lambda nw=nw: tc.chunk_wu_kernel[(NT, HV)](
            k, k.stride(0), v, v.stride(0), a, b, a.stride(0), L.A_log, L.dt_bias, cu, W["chunks"], X, W["G"],
            W["RK"], W["w"], W["u"], HK=HK, HV=HV, DK=D, DV=D, BT=64, DOT_PREC="tf32", num_warps=nw))
    for bk, nw, inv in [(bk, nw, False) for bk in (16, 32, 64) for nw in (1, 2, 4)] + [
            (bk, nw, True) for bk in (16, 32) for nw in (1, 2, 4)]:  # stage 1 taking keys and values bk columns
        add(f"sliced-wy bk{bk}{' inv' if inv else ''} num_warps={nw}", lambda bk=bk, nw=nw, inv=inv:
            tc.chunk_wy_sliced_kernel[(NT, HV)](
                q, q.stride(0), k, k.stride(0), v, v.stride(0), a, b, a.stride(0), L.A_log, L.dt_bias, cu,
                W["chunks"], W["w"], W["u"], W["G"], W["RQ"], W["RK"], HK=HK, HV=HV, DK=D, DV=D, BT=64, BC=16,
                BK=bk, DOT_PREC="tf32", INV=inv, num_warps=nw))
    # one sequence: BV 32 gives 192 programs, BV 16 384; fla autotunes its state pass over BV 32 / 64, 2 / 4 warps
    # and 2-4 stages
    for bv, nw, ns, acc in [(bv, nw, ns, False) for bv, nw, ns in (
            (16, 4, 2), (32, 4, 2), (64, 4, 2), (32, 2, 2), (64, 2, 2), (32, 4, 3), (32, 4, 4), (32, 2, 3),
            (64, 4, 3), (64, 2, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3), (32, 8, 2))] + [
            (32, 4, 2, True), (32, 4, 3, True), (64, 4, 3, True),
                                                     (32, 2, 3, True)]:  # acc: fla's form (ACC_DOT)
        add(f"state BV={bv} num_warps={nw} num_stages={ns}{' acc-dot' if acc else ''}",
            lambda bv=bv, nw=nw, ns=ns, acc=acc: tc.chunk_state_kernel[(D // bv, HV, 1)](
                k, k.stride(0), W["w"], W["u"], W["G"], W["RK"], cu, slots, W["chunk_first"], state, W["H"], W["dv"],
                state, slots, 1, HK=HK, HV=HV, DK=D, DV=D, BT=64, BV=bv, SNAPSHOT=False, DOT_PREC="tf32",
                ACC_DOT=acc, num_warps=nw, num_stages=ns))
    from atlas.plugins_trt.gated_delta_net.triton_chunk_state_halves import chunk_state_halves_kernel
    for bv, nw, ns in ((32, 4, 2), (64, 4, 2), (64, 8, 2), (32, 4, 3), (64, 4, 3), (32, 8, 2)):  # fla's layout
        add(f"state halves BV={bv} num_warps={nw} num_stages={ns}", lambda bv=bv, nw=nw, ns=ns:
            chunk_state_halves_kernel[(D // bv, HV, 1)](
                k, k.stride(0), W["w"], W["u"], W["G"], W["RK"], cu, slots, W["chunk_first"], state, W["H"], W["dv"],
                state, slots, 1, HK=HK, HV=HV, DK=D, DV=D, BT=64, BV=bv, SNAPSHOT=False, DOT_PREC="tf32",
                num_warps=nw, num_stages=ns))
    for bv, nw, ns in ((64, 4, 2), (64, 4, 3), (32, 4, 2), (64, 8, 2), (128, 8, 2), (32, 2, 2)):
        add(f"out BV={bv} num_warps={nw} num_stages={ns}", lambda bv=bv, nw=nw, ns=ns: tc.chunk_out_kernel[
            (NT, HV, D // bv)](q, q.stride(0), k, k.stride(0), W["G"], W["RQ"], W["RK"], cu, W["chunks"], W["H"],
                               W["dv"], o, o.stride(0), HK=HK, HV=HV, DK=D, DV=D, BT=64, BV=bv, DOT_PREC="tf32",
                               num_warps=nw, num_stages=ns))
    for bv, nw, hs in ((64, 4, 2), (64, 4, 1), (64, 8, 2), (32, 4, 2), (128, 8, 2)):  # by key head (HEADS)
        add(f"out heads BV={bv} num_warps={nw} head_stages={hs}", lambda bv=bv, nw=nw, hs=hs: tc.chunk_out_kernel[
            (NT, HK, D // bv)](q, q.stride(0), k, k.stride(0), W["G"], W["RQ"], W["RK"], cu, W["chunks"], W["H"],
                               W["dv"], o, o.stride(0), HK=HK, HV=HV, DK=D, DV=D, BT=64, BV=bv, DOT_PREC="tf32",
                               HEADS=True, HEAD_STAGES=hs, num_warps=nw))
    fla_stages(L, T, x, q, k, v, a, b, state, add)
    rows.extend(fla_configs())
    return rows


def fla_configs() -> list[dict]:
    """The configurations fla's autotuners picked for its prefill kernels in this process (after fla_stages)."""
    out = []
    try:
        import fla.ops.common.chunk_delta_h as h
        import fla.ops.common.chunk_o as o
        import fla.ops.gated_delta_rule.chunk_fwd as intra
        import fla.ops.gated_delta_rule.wy_fast as wy
    except Exception:  # noqa: BLE001
        return out
    for mod in (intra, wy, h, o):
        for name, obj in vars(mod).items():
            f = obj
            while f is not None and not hasattr(f, "best_config"):
                f = getattr(f, "fn", None)
            if f is not None and getattr(f, "best_config", None) is not None:
                out.append({"stage": f"fla config {name}", "config": str(f.best_config)})
                print(f"fla config {name}: {f.best_config}", flush=True)
    return out


def fla_stages(L: Layer, T: int, x, q, k, v, a, b, state, add) -> None:
    """flash-linear-attention's prefill, kernel by kernel, on the same inputs (fla 0.6.0's chunk_gated_delta_rule
    forward: l2norm of q and k, beta sigmoid, gate cumsum, fused kkt + solve + w/u, the state pass, the output)."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.common.gate import fused_beta_sigmoid
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.gated_delta_rule.gate import gdn_gate_chunk_cumsum
        from fla.ops.utils.constant import RCP_LN2
    except Exception as e:  # noqa: BLE001
        print(f"fla stages not timed ({type(e).__name__}: {e})", file=sys.stderr)
        return
    try:  # a failure here is reported, the Atlas stages above are kept
        HK, HV, D = L.HK, L.HV, L.D
        q4, k4 = q.reshape(1, T, HK, D).contiguous(), k.reshape(1, T, HK, D).contiguous()
        v4 = v.reshape(1, T, HV, D).contiguous()
        cache = L.rand(1, L.C, KW)
        add("fla conv", lambda: causal_conv1d(x.view(1, T, L.C), weight=L.conv_w, initial_state=cache,
                                              output_final_state=True, activation="silu"))
        qn, _ = l2norm_fwd(q4)
        kn, _ = l2norm_fwd(k4)
        add("fla l2norm q, k", lambda: (l2norm_fwd(q4), l2norm_fwd(k4)))
        bb = b.reshape(1, T, HV)
        beta = fused_beta_sigmoid(bb, scale=1.0)
        add("fla beta sigmoid", lambda: fused_beta_sigmoid(bb, scale=1.0))
        aa = a.reshape(1, T, HV)
        g = gdn_gate_chunk_cumsum(g=aa, A_log=L.A_log, chunk_size=64, scale=RCP_LN2, dt_bias=L.dt_bias)
        add("fla gate cumsum", lambda: gdn_gate_chunk_cumsum(g=aa, A_log=L.A_log, chunk_size=64, scale=RCP_LN2,
                                                             dt_bias=L.dt_bias))
        w, u, _ = chunk_gated_delta_rule_fwd_intra(k=kn, v=v4, g=g, beta=beta, chunk_size=64)
        add("fla intra (kkt + solve + wu)", lambda: chunk_gated_delta_rule_fwd_intra(k=kn, v=v4, g=g, beta=beta,
                                                                                      chunk_size=64))
        h0 = state.clone()
        h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=kn, w=w, u=u, g=g, initial_state=h0, output_final_state=True,
                                                   chunk_size=64)
        add("fla state (fwd_h)", lambda: chunk_gated_delta_rule_fwd_h(k=kn, w=w, u=u, g=g, initial_state=h0,
                                                                       output_final_state=True, chunk_size=64))
        add("fla out (fwd_o)", lambda: chunk_fwd_o(q=qn, k=kn, v=v_new, h=h, g=g, scale=D ** -0.5, chunk_size=64))
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def print_table(cases: list[dict]) -> None:
    print(f"\n{'model':16s} {'case':18s} {'atlas us':>10s} {'fla us':>10s} {'speedup':>8s} {'%floor':>7s} "
          f"{'states':>8s} {'replay':>8s}")
    for c in cases:
        if "error" in c:
            print(f"{c['model']:16s} {c['kind']:8s} {c.get('params')} ERROR {c['error'][:60]}")
            continue
        name = {"prefill": f"prefill T{c.get('T')}", "decode": f"decode B{c.get('B')}",
                "verify": f"verify B{c.get('B')} K{c.get('K')}"}[c["kind"]]
        fl = f"{c['fla_us']:10.1f}" if "fla_us" in c else f"{'-':>10s}"
        sp = f"{c['speedup_vs_fla']:8.2f}" if "speedup_vs_fla" in c else f"{'-':>8s}"
        rp = " ".join(f"{c[k]:8.2f}" for k in ("speedup_states_vs_fla", "speedup_replay_vs_fla") if k in c)
        rp += f"  ({c['atlas_way']})" if "atlas_way" in c else ""
        print(f"{c['model']:16s} {name:18s} {c['atlas_us']:10.1f} {fl} {sp} "
              f"{100 * c['atlas_fraction_of_floor']:6.1f}% {rp}")


def summarize(cases: list[dict]) -> dict:
    def smallest(kind, key="speedup_vs_fla"):
        vals = [c[key] for c in cases if c.get("kind") == kind and key in c]
        return min(vals) if vals else None

    return {"min_prefill_speedup_vs_fla": smallest("prefill"), "min_decode_speedup_vs_fla": smallest("decode"),
            "min_verify_speedup_vs_fla": smallest("verify"),
            "min_verify_speedup_by_way": {w: smallest("verify", f"speedup_{w}_vs_fla") for w in VERIFY_WAYS}}


def merge_into(old: dict, new: dict) -> dict:
    """`old`'s result with the (model, kind) groups timed in `new` replaced by new's cases. Each case was timed
    beside fla in its own run; `runs` keeps every run's device, copy bandwidth and which groups came from it."""
    groups = {(c.get("model"), c.get("kind")) for c in new["cases"]}
    runs = old.pop("runs", None) or [{k: old.get(k) for k in ("device", "copy_bandwidth_Bps", "wall_s")}]
    for r in runs:
        r["groups"] = [g for g in r.get("groups", sorted({(c.get("model"), c.get("kind")) for c in old["cases"]}))
                       if tuple(g) not in groups]
    runs.append({"device": new["device"], "copy_bandwidth_Bps": new["copy_bandwidth_Bps"], "wall_s": new["wall_s"],
                 "groups": sorted(groups)})
    cases = [c for c in old["cases"] if (c.get("model"), c.get("kind")) not in groups] + new["cases"]
    return {**old, **{k: v for k, v in new.items() if k not in ("cases", "summary", "sweep")}, "cases": cases,
            "summary": summarize(cases), "runs": runs}


def resummarize(path: str) -> int:
    """Re-pick each verify case's default way with the current deltas_verify_kernel from the times recorded in
    `path` (nothing is re-timed), recompute the figures that follow from it and the summary, and write it back."""
    result = json.loads(Path(path).read_text())
    for c in result["cases"]:
        if c.get("kind") == "verify" and "error" not in c:
            pick_default(c, MODELS[c["model"]][1], "states")
            finish(c, c["floor_bytes"], result["copy_bandwidth_Bps"])
        key = f"atlas_{PREFILL_DEFAULT}"
        if c.get("kind") == "prefill" and f"{key}_us" in c and c.get("atlas_way") != PREFILL_DEFAULT:
            # timed when the default was the held-tile stage 1: keep that time under its form's name
            c["atlas_held_wy_us"], c["atlas_held_wy_timing"] = c["atlas_us"], c["atlas_timing"]
            c["atlas_us"], c["atlas_timing"], c["atlas_way"] = c[f"{key}_us"], c[f"{key}_timing"], PREFILL_DEFAULT
            finish(c, c["floor_bytes"], result["copy_bandwidth_Bps"])
            for name in list(PREFILL_FORMS) + [PREFILL_DEFAULT]:
                if f"atlas_{name}_us" in c and "fla_us" in c:
                    c[f"speedup_{name}_vs_fla"] = c["fla_us"] / c[f"atlas_{name}_us"]
    result["summary"] = summarize(result["cases"])
    result["resummarized"] = ("verify defaults (and prefill cases timed before the sliced stage 1 became the default) "
                              "re-picked from the recorded times by tools/bench_gdn.py --resummarize")
    Path(path).write_text(json.dumps(result, indent=1))
    print_table(result["cases"])
    print("summary:", json.dumps(result["summary"]))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="tools/results/gdn.json")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--prefill", default="512,4096,32768")
    p.add_argument("--decode", default="1,8,64")
    p.add_argument("--verify-k", default="2,4,8,17")
    p.add_argument("--verify-b", default="1,8")
    p.add_argument("--sweep", default="", help="also time launch configurations (Atlas only) of these kinds: "
                   f"comma-separated from {list(SWEEP)}, or all")
    p.add_argument("--stages", default="", help="prefill lengths whose stages are timed one by one first")
    p.add_argument("--verify-stages", default="", help="verify widths (K 9..17) whose launches are timed one by one, "
                   "at batch 1 and 8")
    p.add_argument("--chunk-warps", default="",
                   help="num_warps of the three chunked-prefill stages (default: launch_chunk_gdn's), or auto "
                   "(needs --stages)")
    p.add_argument("--merge-into", metavar="JSON", help="write an existing result file with the (model, kind) "
                   "groups timed in this run replaced (the file's `runs` says which run timed which group)")
    p.add_argument("--resummarize", metavar="JSON", help="only re-pick the verify defaults in an existing result file "
                   "with the current launcher policy (no GPU needed)")
    args = p.parse_args(argv)
    if args.resummarize:
        return resummarize(args.resummarize)
    if not torch.cuda.is_available():
        print("bench_gdn needs a CUDA GPU", file=sys.stderr)
        return 2
    t_start = time.time()
    torch.manual_seed(0)
    fla = _fla()
    info = device_info()
    info["fla"] = fla["version"] if fla else None
    bw = copy_bandwidth()
    print(f"{info['device']}: copy bandwidth {bw / 1e12:.2f} TB/s; fla {info['fla']}", flush=True)
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    staged = [r for T in ints(args.stages) for r in stages(T, args.repeats)]
    staged += [r for K in ints(args.verify_stages) for B in (1, 8) for r in verify_stages(B, K, args.repeats)]
    if args.chunk_warps == "auto":  # stage 1's fastest num_warps from the stage timings
        wy = [r for r in staged if r["stage"].startswith("wy")]
        best = min(wy, key=lambda r: r["us"])["stage"].split("=")[1] if wy else "8"
        args.chunk_warps = f"{best},4,4"
    chunk_cfg = {"num_warps": tuple(ints(args.chunk_warps))} if args.chunk_warps else {}
    cases = []
    for model in args.models.split(","):
        L = Layer(*MODELS[model])
        plan = ([("prefill", (T,)) for T in ints(args.prefill)] + [("decode", (B,)) for B in ints(args.decode)]
                + [("verify", (B, K)) for B in ints(args.verify_b) for K in ints(args.verify_k)])
        for kind, params in plan:
            t0 = time.time()
            try:
                fn = {"prefill": case_prefill, "decode": case_decode, "verify": case_verify}[kind]
                row = fn(L, *params, fla, args.repeats, bw, chunk_cfg if kind == "prefill" else None)
            except Exception as e:  # noqa: BLE001 — record the failure, keep benchmarking
                traceback.print_exc()
                row = {"kind": kind, "params": list(params), "error": f"{type(e).__name__}: {e}"}
            row["model"] = model
            row["wall_s"] = round(time.time() - t0, 1)
            cases.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            torch.cuda.empty_cache()

    swept = None
    if args.sweep:
        if not set(args.sweep.split(",")) <= set(SWEEP) | {"all"}:
            p.error(f"--sweep: kinds are {list(SWEEP)} or all, got {args.sweep!r}")
        try:
            swept = sweep(list(SWEEP) if args.sweep == "all" else args.sweep.split(","), args.repeats, bw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            swept = [{"error": f"{type(e).__name__}: {e}"}]

    summary = summarize(cases)
    result = {"device": info, "copy_bandwidth_Bps": bw, "cases": cases, "summary": summary,
              "wall_s": round(time.time() - t_start, 1)}
    if swept is not None:
        result["sweep"] = swept
    if staged:
        result["prefill_stages"] = staged
    result["chunk_warps"] = list(chunk_cfg.get("num_warps", CHUNK_WARPS))
    if args.merge_into:
        result = merge_into(json.loads(Path(args.merge_into).read_text()), result)
        cases, summary = result["cases"], result["summary"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_table(cases)
    print("summary:", json.dumps(summary), f"(wall {result['wall_s']} s, written to {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
