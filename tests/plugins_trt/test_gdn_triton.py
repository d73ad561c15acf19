"""Triton Gated DeltaNet and causal conv1d kernels against the torch references.

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before
the kernel modules are imported) at tiny shapes: B 2-4, HK 2, HV 4, DK 16/32, DV 32, up to 130 tokens so
that chunk boundaries are crossed, varlen. fp32 throughout: errors (‖out - ref‖ / ‖ref‖, printed; run
with -s to see them) must stay under 1e-4. Every input is fresh random data, every output is poisoned
with NaN first, and slots the call does not own must come back unchanged.

`gpu` tests run at the real shapes (Qwen3.5-27B: HK 16, HV 48, D 128; Qwen3-Next-80B: HK 16, HV 32) in
bf16 against the fp32 reference and against flash-linear-attention when it is importable.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, also in subprocesses
from triton_interpreter import (fix_interpreter_index, rel, report, run_in_fresh_process,  # noqa: E402
                                skip_unless_interpreted)

NO_GPU = not torch.cuda.is_available()
if NO_GPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from atlas.plugins_trt.causal_conv1d import triton_conv as _triton_conv  # noqa: E402
from atlas.plugins_trt.causal_conv1d.reference import causal_conv1d  # noqa: E402
from atlas.plugins_trt.causal_conv1d.triton_conv import (  # noqa: E402
    launch_conv_commit, launch_conv_update, launch_conv_varlen)
from atlas.plugins_trt.gated_delta_net.reference import gated_delta_rule, gdn_gating  # noqa: E402
from atlas.plugins_trt.gated_delta_net.triton_chunk import launch_chunk_gdn  # noqa: E402
from atlas.plugins_trt.gated_delta_net.triton_decode import launch_gdn_decode  # noqa: E402
from atlas.plugins_trt.gated_delta_net.triton_recurrent import sync_counters  # noqa: E402
from atlas.plugins_trt.gated_delta_net.triton_verify import (  # noqa: E402
    VerifyRollback, launch_gdn_commit, launch_gdn_commit_replay, launch_gdn_verify)
from atlas.plugins_trt.rms_norm.reference import gated_rms_norm  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-4
KW = 4


if os.environ.get("TRITON_INTERPRET") == "1":
    fix_interpreter_index()

# The interpreter only takes effect if it was on when triton was first imported; a module that compiles
# kernels for sm_90 may have imported it first. Then these CPU tests rerun in a fresh process instead.
INTERPRET = type(_triton_conv.conv_varlen_kernel).__name__ == "InterpretedFunction"


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreted(request, INTERPRET, compiles=("ahead_of_time",))


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_cpu_tests_in_fresh_process():
    """Rerun this module's interpreter tests in a process that imports triton with TRITON_INTERPRET=1."""
    run_in_fresh_process(__file__, "not fresh_process and not ahead_of_time")








class Shape:
    """One GDN layer's dims and fresh random weights."""

    def __init__(self, HK, HV, DK, DV, dtype=torch.float32, device=DEV, seed=0, slots=8):
        g = torch.Generator().manual_seed(seed)
        self.HK, self.HV, self.DK, self.DV, self.dtype, self.device = HK, HV, DK, DV, dtype, device
        self.C = 2 * HK * DK + HV * DV
        self.gen = g
        self.conv_w = self.rand(self.C, KW, scale=0.5)
        self.A_log = self.rand(HV, scale=0.5, dtype=torch.float32)
        self.dt_bias = self.rand(HV, dtype=torch.float32)
        self.window = self.rand(slots, self.C, KW - 1)
        self.state = self.rand(slots, HV, DK, DV, scale=0.3, dtype=torch.float32)

    def rand(self, *shape, scale=1.0, dtype=None):
        t = torch.randn(*shape, generator=self.gen) * scale
        return t.to(device=self.device, dtype=dtype or self.dtype)

    def ref(self, x, a, b, window, state):
        """The layer's composition (runtime/layers/gdn.py) over T tokens of one sequence, in fp32."""
        y, win = causal_conv1d(x.float(), window.float(), self.conv_w.float())
        T = x.shape[0]
        q, k, v = y.split([self.HK * self.DK, self.HK * self.DK, self.HV * self.DV], dim=-1)
        g, beta = gdn_gating(a, b, self.A_log, self.dt_bias)
        o, S = gated_delta_rule(q.reshape(T, self.HK, self.DK), k.reshape(T, self.HK, self.DK),
                                v.reshape(T, self.HV, self.DV), g, beta, state.float())
        return o, win, S


def poison(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def cu_of(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


# ---------------------------------------------------------------------------------------- causal conv


@pytest.mark.parametrize("chan_first", [False, True], ids=["time-major-grid", "channel-major-grid"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_conv_varlen_matches_reference(bias, chan_first):
    s = Shape(2, 4, 16, 16, seed=1)
    lens = [70, 1, 2, 9]
    cu = cu_of(lens)
    x = s.rand(cu[-1], s.C)
    cb = s.rand(s.C) if bias else None
    slots = torch.tensor([5, 0, 7, 2], dtype=torch.int32, device=DEV)
    window = s.window.clone()
    y = launch_conv_varlen(x, torch.tensor(cu, dtype=torch.int32, device=DEV), window, slots, s.conv_w, cb,
                           max_seqlen=max(lens), out=poison(cu[-1], s.C), BT=16, BC=64, chan_first=chan_first)
    for i, sl in enumerate(slots.tolist()):
        yr, wr = causal_conv1d(x[cu[i]:cu[i + 1]], s.window[sl], s.conv_w, cb)
        report(f"conv y seq{i} (T={lens[i]})", rel(y[cu[i]:cu[i + 1]], yr))
        report(f"conv window seq{i}", rel(window[sl], wr))
    others = [i for i in range(window.shape[0]) if i not in slots.tolist()]
    assert torch.equal(window[others], s.window[others])


def test_conv_update_decode_and_verify_commit():
    s = Shape(2, 4, 16, 16, seed=2)
    B, T = 3, 5
    slots = torch.tensor([4, 1, 6], dtype=torch.int32, device=DEV)
    x = s.rand(B, T, s.C)
    window = s.window.clone()
    y = launch_conv_update(x, window, slots, s.conv_w, out=poison(B, T, s.C), BC=32)
    for i, sl in enumerate(slots.tolist()):
        yr, wr = causal_conv1d(x[i], s.window[sl], s.conv_w)
        report(f"conv update y seq{i}", rel(y[i], yr))
        report(f"conv update window seq{i}", rel(window[sl], wr))
    # verify: the window stays; the commit slides it by the accepted count only
    window = s.window.clone()
    keep = poison(B, T, s.C)
    y = launch_conv_update(x, window, slots, s.conv_w, keep=keep, out=poison(B, T, s.C), BC=32)
    assert torch.equal(window, s.window)
    accepted = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEV)
    launch_conv_commit(window, slots, keep, accepted, BC=32)
    for i, sl in enumerate(slots.tolist()):
        n = int(accepted[i])
        wr = causal_conv1d(x[i, :n], s.window[sl], s.conv_w)[1] if n else s.window[sl]
        report(f"conv verify y seq{i}", rel(y[i], causal_conv1d(x[i], s.window[sl], s.conv_w)[0]))
        assert rel(window[sl], wr) < TOL, f"window of seq{i} after accepting {n}"


# ---------------------------------------------------------------------------------------- decode / verify

SHAPES = [(2, 4, 16, 32), (2, 4, 32, 32)]
SHAPE_IDS = ["HK2-HV4-DK16-DV32", "HK2-HV4-DK32-DV32"]


@pytest.mark.parametrize("dims", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("BV", [16, 32], ids=["BV16", "BV32"])
def test_decode_equals_one_reference_step(dims, BV):
    s = Shape(*dims, seed=3)
    B = 3
    slots = torch.tensor([6, 0, 3], dtype=torch.int32, device=DEV)
    x, a, b = s.rand(B, s.C), s.rand(B, s.HV), s.rand(B, s.HV)
    window, state = s.window.clone(), s.state.clone()
    o = launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK,
                          out=poison(B, s.HV, s.DV), BV=BV)
    for i, sl in enumerate(slots.tolist()):
        orf, wr, Sr = s.ref(x[i:i + 1], a[i:i + 1], b[i:i + 1], s.window[sl], s.state[sl])
        report(f"decode o seq{i}", rel(o[i], orf[0]))
        report(f"decode state seq{i}", rel(state[sl], Sr))
        report(f"decode window seq{i}", rel(window[sl], wr))
    others = [i for i in range(state.shape[0]) if i not in slots.tolist()]
    assert torch.equal(state[others], s.state[others]) and torch.equal(window[others], s.window[others])
    assert int(sync_counters(state.device, B * s.HK)[:B * s.HK].abs().sum()) == 0, "sync counters left dirty"


def test_decode_skips_padding_rows_and_fuses_gated_norm():
    s = Shape(2, 4, 16, 32, seed=4)
    slots = torch.tensor([2, -1, 5], dtype=torch.int32, device=DEV)
    B = 3
    x, a, b = s.rand(B, s.C), s.rand(B, s.HV), s.rand(B, s.HV)
    z, norm_w = s.rand(B, s.HV * s.DV), s.rand(s.DV)
    window, state = s.window.clone(), s.state.clone()
    o = launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, z=z,
                          norm_weight=norm_w, norm_eps=1e-6, out=poison(B, s.HV, s.DV))
    for i in (0, 2):
        sl = int(slots[i])
        orf, _, Sr = s.ref(x[i:i + 1], a[i:i + 1], b[i:i + 1], s.window[sl], s.state[sl])
        ref = gated_rms_norm(orf[0].to(DEV), z[i].view(s.HV, s.DV), norm_w, 1e-6)
        report(f"decode+norm o seq{i}", rel(o[i], ref))
        report(f"decode+norm state seq{i}", rel(state[sl], Sr))
    assert torch.isnan(o[1]).all(), "a padding row was written"
    others = [1, 3, 4, 6, 7]
    assert torch.equal(state[others], s.state[others]) and torch.equal(window[others], s.window[others])


@pytest.mark.parametrize("BV", [16, 32], ids=["NV4", "NV2"])
def test_decode_fuses_gated_norm_across_dv_tiles(BV):
    """The engine's decode (SPLIT_NORM): each Dv tile writes its o and sum of squares, the head's last tile to
    arrive normalizes the whole head. Against the reference and the one-tile form (BV = DV), with a padding row;
    the counters left zero, and a second launch (a graph replay) gives the same output."""
    from atlas.plugins_trt.gated_delta_net.triton_recurrent import sync_counters

    s = Shape(2, 4, 16, 64, seed=9)
    slots = torch.tensor([6, -1, 0, 3], dtype=torch.int32, device=DEV)
    B = 4
    x, a, b = s.rand(B, s.C), s.rand(B, s.HV), s.rand(B, s.HV)
    z, norm_w = s.rand(B, s.HV * s.DV), s.rand(s.DV)
    outs = []
    for bv in (BV, BV, s.DV):
        window, state = s.window.clone(), s.state.clone()
        outs.append(launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, z=z,
                                      norm_weight=norm_w, norm_eps=1e-6, out=poison(B, s.HV, s.DV), BV=bv,
                                      num_warps=4))
        assert int(sync_counters(state.device, B * (s.HK + s.HV))[:B * (s.HK + s.HV)].abs().sum()) == 0
    split, again, whole = outs
    assert torch.equal(split.nan_to_num(), again.nan_to_num())
    for i in (0, 2, 3):
        sl = int(slots[i])
        orf, _, Sr = s.ref(x[i:i + 1], a[i:i + 1], b[i:i + 1], s.window[sl], s.state[sl])
        ref = gated_rms_norm(orf[0].to(DEV), z[i].view(s.HV, s.DV), norm_w, 1e-6)
        report(f"decode+norm over {s.DV // BV} tiles seq{i}", rel(split[i], ref))
        report(f"  against one tile seq{i}", rel(split[i], whole[i]))
    assert torch.isnan(split[1]).all(), "a padding row was written"


@pytest.mark.parametrize("mode", ["states", "replay", "deltas"])
@pytest.mark.parametrize("dims", SHAPES, ids=SHAPE_IDS)
def test_verify_then_commit_equals_reference_on_accepted_tokens(mode, dims):
    s = Shape(*dims, seed=5)
    B, K = 3, 6
    slots = torch.tensor([1, 7, 4], dtype=torch.int32, device=DEV)
    x, a, b = s.rand(B, K, s.C), s.rand(B, K, s.HV), s.rand(B, K, s.HV)
    window, state = s.window.clone(), s.state.clone()
    rb = VerifyRollback.empty(B, K, s.C, s.HV, s.DK, s.DV, s.dtype, DEV, mode=mode)
    if rb.steps is not None:
        rb.steps.fill_(float("nan"))
    o = launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, rb,
                          out=poison(B, K, s.HV, s.DV), BV=16)
    assert torch.equal(window, s.window) and torch.equal(state, s.state), "verify changed a slot"
    for i, sl in enumerate(slots.tolist()):
        orf, _, _ = s.ref(x[i], a[i], b[i], s.window[sl], s.state[sl])
        report(f"verify o seq{i}", rel(o[i], orf))
        if rb.steps is not None:
            for t in (0, K - 1):
                _, _, St = s.ref(x[i, :t + 1], a[i, :t + 1], b[i, :t + 1], s.window[sl], s.state[sl])
                report(f"verify step state seq{i} t{t}", rel(rb.steps[i, t], St))
    accepted = torch.tensor([3, 0, K], dtype=torch.int32, device=DEV)
    if mode == "states":
        launch_gdn_commit(rb, accepted, window, state, slots, s.HK)
    else:
        launch_gdn_commit_replay(rb, accepted, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, BV=16)
    for i, sl in enumerate(slots.tolist()):
        n = int(accepted[i])
        if n == 0:
            assert torch.equal(state[sl], s.state[sl]) and torch.equal(window[sl], s.window[sl])
            continue
        _, wr, Sr = s.ref(x[i, :n], a[i, :n], b[i, :n], s.window[sl], s.state[sl])
        report(f"commit({mode}) state seq{i} n={n}", rel(state[sl], Sr))
        report(f"commit({mode}) window seq{i} n={n}", rel(window[sl], wr))


@pytest.mark.parametrize("T", [5, 17])
def test_verify_prep_with_a_tail_row_matches_one_tile(T):
    """The prep launch with its last token as a 1-row tile after the others' tile (tail; T 17: 16 + 1 rows) writes
    exactly what the one-tile form writes (T 17: a 32-row tile), and leaves a padding row untouched."""
    from atlas.plugins_trt.gated_delta_net.triton_verify_prep import launch_verify_prep

    s = Shape(2, 4, 16, 32, seed=21)
    B = 3
    slots = torch.tensor([1, -1, 5], dtype=torch.int32, device=DEV)
    x, ab = s.rand(B * T, s.C), s.rand(B * T, 2 * s.HV)
    outs = []
    for tail in (False, True):
        bufs = dict(keep_x=poison(B * T, s.C, dtype=s.dtype), keep_ab=poison(B * T, 2 * s.HV, dtype=s.dtype),
                    dk=poison(B * T, s.HK * s.DK), dg=poison(B * T, s.HV), qn=poison(B * T, s.HK * s.DK),
                    vc=poison(B * T, s.HV * s.DV, dtype=s.dtype), beta=poison(B * T, s.HV))
        launch_verify_prep(x, ab[:, :s.HV], ab[:, s.HV:], s.conv_w, None, s.A_log, s.dt_bias, s.window, slots,
                           num_k_heads=s.HK, HV=s.HV, T=T, tail=tail, **bufs)
        outs.append(bufs)
    for name in outs[0]:
        one, tiled = outs[0][name].view(B, T, -1), outs[1][name].view(B, T, -1)
        assert torch.isnan(tiled[1]).all(), f"{name}: the padding row was written"
        assert not torch.isnan(tiled[[0, 2]]).any(), f"{name}: a row was not written"
        torch.testing.assert_close(tiled[[0, 2]], one[[0, 2]], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("kernel", ["chunk", "recurrent", "prepped", "prepped_chunk", "prepped_chunk_tail",
                                    "chunk-inverse", "prepped_chunk_tail-inverse", "prepped_chunk_tail-substitution",
                                    "prepped_chunk_tail-dots", "prepped_chunk_tail-dots-preptail"])
@pytest.mark.parametrize("K", [2, 17], ids=["K2", "K17"])
def test_verify_deltas_with_bias_norm_padding_and_wide_tiles(K, kernel):
    """Mode "deltas", filled by either verify kernel (the chunk form at both token tiles, 16 and 32, or token
    by token), with conv bias, the fused gated norm and a padding row; its commit installs exactly the
    accepted prefix."""
    s = Shape(2, 4, 16, 32, seed=9)
    B = 3
    slots = torch.tensor([2, -1, 6], dtype=torch.int32, device=DEV)
    x, a, b = s.rand(B, K, s.C), s.rand(B, K, s.HV), s.rand(B, K, s.HV)
    z, norm_w, cb = s.rand(B, K, s.HV * s.DV), s.rand(s.DV), s.rand(s.C)
    window, state = s.window.clone(), s.state.clone()
    rb = VerifyRollback.empty(B, K, s.C, s.HV, s.DK, s.DV, s.dtype, DEV, mode="deltas")
    assert rb.mode == "deltas"
    kernel, inverse = kernel.removesuffix("-inverse"), kernel.endswith("-inverse")  # "-inverse": solve by products
    kernel, prep_tail = kernel.removesuffix("-preptail"), kernel.endswith("-preptail")  # the prep's 1-row tail
    kernel, tail_dots = kernel.removesuffix("-dots"), kernel.endswith("-dots")  # the tail from three small dots
    if kernel.endswith("-substitution"):  # the default at K 17 is the solve by products; this is the other
        kernel, inverse = kernel.removesuffix("-substitution"), False
    elif not inverse:
        inverse = None  # the launcher's choice
    if inverse and kernel == "chunk" and K > 16:  # a 32-token tile: refused (accuracy)
        with pytest.raises(ValueError, match="solve_inverse"):
            launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, rb,
                              deltas_kernel=kernel, solve_inverse=True)
        return
    o = launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, rb, conv_bias=cb,
                          z=z, norm_weight=norm_w, out=poison(B, K, s.HV, s.DV), deltas_kernel=kernel,
                          solve_inverse=inverse, tail_dots=tail_dots, prep_tail=prep_tail)
    assert torch.equal(window, s.window) and torch.equal(state, s.state), "verify changed a slot"
    assert torch.isnan(o[1]).all(), "a padding row was written"

    def ref(i, n):
        sl = int(slots[i])
        y, win = causal_conv1d(x[i, :n], s.window[sl], s.conv_w, cb)
        q, k, v = y.split([s.HK * s.DK, s.HK * s.DK, s.HV * s.DV], dim=-1)
        g, beta = gdn_gating(a[i, :n], b[i, :n], s.A_log, s.dt_bias)
        on, Sn = gated_delta_rule(q.reshape(n, s.HK, s.DK), k.reshape(n, s.HK, s.DK), v.reshape(n, s.HV, s.DV),
                                  g, beta, s.state[sl])
        return on, win, Sn

    for i in (0, 2):
        orf, _, _ = ref(i, K)
        report(f"verify(deltas, {kernel}) K{K} o+norm seq{i}", rel(o[i], gated_rms_norm(orf, z[i].view(K, s.HV, s.DV),
                                                                                norm_w, 1e-6)))
    accepted = torch.tensor([K - 1, 3, K], dtype=torch.int32, device=DEV)
    launch_gdn_commit(rb, accepted, window, state, slots, s.HK)
    for i in (0, 2):
        sl, n = int(slots[i]), int(accepted[i])
        _, wr, Sr = ref(i, n)
        report(f"commit(deltas) K{K} n={n} state seq{i}", rel(state[sl], Sr))
        report(f"commit(deltas) K{K} n={n} window seq{i}", rel(window[sl], wr))
    others = [j for j in range(state.shape[0]) if j not in (2, 6)]
    assert torch.equal(state[others], s.state[others]) and torch.equal(window[others], s.window[others])


def test_verify_rejects_a_way_its_rollback_cannot_take():
    s = Shape(2, 4, 16, 32, seed=11)
    x, a, b = s.rand(1, 4, s.C), s.rand(1, 4, s.HV), s.rand(1, 4, s.HV)
    slots = torch.tensor([0], dtype=torch.int32, device=DEV)
    for mode, kernel in (("states", "chunk"), ("deltas", "bogus")):
        rb = VerifyRollback.empty(1, 4, s.C, s.HV, s.DK, s.DV, s.dtype, DEV, mode=mode)
        with pytest.raises(ValueError, match="deltas_kernel"):
            launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, s.window.clone(), s.state.clone(), slots, s.HK,
                              rb, deltas_kernel=kernel)
    with pytest.raises(ValueError, match="mode must be one of"):
        VerifyRollback.empty(1, 4, s.C, s.HV, s.DK, s.DV, s.dtype, DEV, mode="snapshots")


@pytest.mark.parametrize("kernel,inverse", [("chunk", False), ("prepped_chunk", False), ("prepped_chunk_tail", False),
                                            ("prepped_chunk_tail", True)])
def test_verify_deltas_stays_exact_on_repeated_keys(kernel, inverse):
    """The same input for every token (equal keys, beta near 1, slow decay) is where a triangular solve
    loses accuracy if done carelessly; the chunk verify must still match the token-by-token reference."""
    s = Shape(2, 4, 16, 32, seed=10)
    s.A_log.fill_(-6.0)  # decay ~ 1 per token
    K = 17
    x = s.rand(1, 1, s.C).expand(1, K, s.C).contiguous()
    a = s.rand(1, K, s.HV)
    b = torch.full((1, K, s.HV), 6.0, device=DEV)  # beta = sigmoid(6) ~ 0.998
    slots = torch.tensor([4], dtype=torch.int32, device=DEV)
    window, state = s.window.clone(), s.state.clone()
    rb = VerifyRollback.empty(1, K, s.C, s.HV, s.DK, s.DV, s.dtype, DEV, mode="deltas")
    o = launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, s.HK, rb,
                          out=poison(1, K, s.HV, s.DV), deltas_kernel=kernel, solve_inverse=inverse)
    orf, _, _ = s.ref(x[0], a[0], b[0], s.window[4], s.state[4])
    report("verify(deltas) repeated keys o", rel(o[0], orf))
    launch_gdn_commit(rb, torch.tensor([K], dtype=torch.int32, device=DEV), window, state, slots, s.HK)
    _, _, Sr = s.ref(x[0], a[0], b[0], s.window[4], s.state[4])
    report("commit(deltas) repeated keys state", rel(state[4], Sr))


# ---------------------------------------------------------------------------------------- chunked prefill


@pytest.mark.parametrize("dims", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("lens", [[70, 5], [64, 1, 130]], ids=["B2-T70-T5", "B3-T64-T1-T130"])
def test_chunked_prefill_matches_reference(dims, lens):
    s = Shape(*dims, seed=6)
    cu = cu_of(lens)
    TT = cu[-1]
    qkv = s.rand(TT, s.C)  # the conv output; q, k, v are column views of it
    q, k, v = qkv[:, :s.HK * s.DK], qkv[:, s.HK * s.DK:2 * s.HK * s.DK], qkv[:, 2 * s.HK * s.DK:]
    ab = s.rand(TT, 2 * s.HV)
    a, b = ab[:, :s.HV], ab[:, s.HV:]
    slots = torch.tensor([3, 6, 0][:len(lens)], dtype=torch.int32, device=DEV)
    state = s.state.clone()
    o, snaps = launch_chunk_gdn(q, k, v, a, b, s.A_log, s.dt_bias, state, slots,
                                torch.tensor(cu, dtype=torch.int32, device=DEV), cu_seqlens_host=cu,
                                snapshot_every=64, out=poison(TT, s.HV, s.DV), BV=16)
    snap = 0
    for i, sl in enumerate(slots.tolist()):
        r = slice(cu[i], cu[i + 1])
        T = lens[i]
        g, beta = gdn_gating(a[r], b[r], s.A_log, s.dt_bias)
        qh, kh, vh = q[r].reshape(T, s.HK, s.DK), k[r].reshape(T, s.HK, s.DK), v[r].reshape(T, s.HV, s.DV)
        orf, Sr = gated_delta_rule(qh, kh, vh, g, beta, s.state[sl])
        report(f"prefill o seq{i} (T={T})", rel(o[r], orf))
        report(f"prefill state seq{i}", rel(state[sl], Sr))
        for j in range(T // 64):
            n = 64 * (j + 1)
            _, Sj = gated_delta_rule(qh[:n], kh[:n], vh[:n], g[:n], beta[:n], s.state[sl])
            report(f"prefill snapshot seq{i} after {n}", rel(snaps[snap], Sj))
            snap += 1
    assert snap == snaps.shape[0]
    others = [i for i in range(state.shape[0]) if i not in slots.tolist()]
    assert torch.equal(state[others], s.state[others])


@pytest.mark.parametrize("dims", SHAPES, ids=SHAPE_IDS)
def test_chunked_prefill_split_stage1_matches_fused(dims):
    """Stage 1 as two launches (X, then w and u), the fused one reloading its key tiles, and the sliced one (keys
    and values 16 columns at a time; also with its diagonal blocks inverted by products) give the fused stage 1's
    outputs and state."""
    s = Shape(*dims, seed=9)
    lens = [70, 5]
    cu = cu_of(lens)
    TT = cu[-1]
    qkv, ab = s.rand(TT, s.C), s.rand(TT, 2 * s.HV)
    q, k, v = qkv[:, :s.HK * s.DK], qkv[:, s.HK * s.DK:2 * s.HK * s.DK], qkv[:, 2 * s.HK * s.DK:]
    a, b = ab[:, :s.HV], ab[:, s.HV:]
    slots = torch.tensor([3, 6], dtype=torch.int32, device=DEV)
    outs = []
    forms = [dict(wy_slice=0), dict(wy_slice=0, split_wy=True), dict(wy_slice=0, reload_k=True), dict(wy_slice=16),
             dict(wy_slice=16, wy_inverse=True), dict(wy_slice=0, state_acc_dot=False),
             dict(wy_slice=0, out_heads=True)]
    for form in forms:
        state, work = s.state.clone(), {}
        o, _ = launch_chunk_gdn(q, k, v, a, b, s.A_log, s.dt_bias, state, slots,
                                torch.tensor(cu, dtype=torch.int32, device=DEV), cu_seqlens_host=cu,
                                out=poison(TT, s.HV, s.DV), BV=16, work=work, **form)
        outs.append((o, state, work["w"], work["u"]))
    for form, other in (("split stage 1", outs[1]), ("reloaded keys", outs[2]), ("sliced stage 1", outs[3]),
                        ("sliced stage 1, blocks inverted by products", outs[4]),
                        ("stage 2 adding its update after the dot", outs[5]),
                        ("stage 3 by key head", outs[6])):
        for name, x, y in zip(("o", "state", "w", "u"), outs[0], other):
            report(f"{form} vs fused: {name}", rel(y, x), 1e-5 if s.dtype == torch.float32 else BF16_TOL)


def test_chunked_prefill_state_halves_match_the_default():
    """Stage 2 in fla's layout (two 64-row state halves, transposed keys, accumulating dots; DK 128 only) gives the
    default stage 2's outputs, state and snapshots."""
    s = Shape(1, 2, 128, 32, seed=13)
    lens = [130, 5]
    cu = cu_of(lens)
    TT = cu[-1]
    qkv, ab = s.rand(TT, s.C), s.rand(TT, 2 * s.HV)
    q, k, v = qkv[:, :s.HK * s.DK], qkv[:, s.HK * s.DK:2 * s.HK * s.DK], qkv[:, 2 * s.HK * s.DK:]
    a, b = ab[:, :s.HV], ab[:, s.HV:]
    slots = torch.tensor([1, 3], dtype=torch.int32, device=DEV)
    outs = []
    for halves in (False, True):
        state = s.state.clone()
        o, snaps = launch_chunk_gdn(q, k, v, a, b, s.A_log, s.dt_bias, state, slots,
                                    torch.tensor(cu, dtype=torch.int32, device=DEV), cu_seqlens_host=cu,
                                    out=poison(TT, s.HV, s.DV), BV=16, snapshot_every=64, state_halves=halves)
        outs.append((o, state, snaps))
    for name, x, y in zip(("o", "state", "snapshots"), outs[0], outs[1]):
        report(f"stage 2 in halves vs default: {name}", rel(y, x), 1e-5)


def test_strong_decay_stays_finite_and_exact():
    """Large |g| (cumulative decay far below fp32's range inside a chunk) must not overflow exp2."""
    s = Shape(2, 4, 16, 32, seed=7)
    s.A_log.fill_(3.0)  # -exp(3)·softplus(~3) ≈ -60 per token: 2^-5000 over a chunk
    lens = [70]
    cu = cu_of(lens)
    qkv, ab = s.rand(70, s.C), s.rand(70, 2 * s.HV) + 2.0
    q, k, v = qkv[:, :32], qkv[:, 32:64], qkv[:, 64:]
    a, b = ab[:, :4], ab[:, 4:]
    slots = torch.tensor([2], dtype=torch.int32, device=DEV)
    state = s.state.clone()
    o, _ = launch_chunk_gdn(q, k, v, a, b, s.A_log, s.dt_bias, state, slots,
                            torch.tensor(cu, dtype=torch.int32, device=DEV), cu_seqlens_host=cu, BV=32)
    g, beta = gdn_gating(a, b, s.A_log, s.dt_bias)
    orf, Sr = gated_delta_rule(q.reshape(70, 2, 16), k.reshape(70, 2, 16), v.reshape(70, 4, 32), g, beta,
                               s.state[2])
    report("strong decay o", rel(o, orf))
    report("strong decay state", rel(state[2], Sr))


def test_prefill_decode_verify_compose_like_the_layer():
    """conv + chunked prefill, one decode step, a verify of 4 with 2 accepted: the state pool then holds
    exactly what the reference holds after prompt + 1 + 2 tokens."""
    s = Shape(2, 4, 16, 32, seed=8)
    P = 67
    xs, ab = s.rand(P + 1 + 4, s.C), s.rand(P + 1 + 4, 2 * s.HV)
    slot = torch.tensor([5], dtype=torch.int32, device=DEV)
    window, state = s.window.clone(), s.state.clone()
    window[5].zero_()
    state[5].zero_()
    cu = torch.tensor([0, P], dtype=torch.int32, device=DEV)
    y = launch_conv_varlen(xs[:P], cu, window, slot, s.conv_w, max_seqlen=P)
    H = s.HK * s.DK
    launch_chunk_gdn(y[:, :H], y[:, H:2 * H], y[:, 2 * H:], ab[:P, :4], ab[:P, 4:], s.A_log, s.dt_bias, state,
                     slot, cu, cu_seqlens_host=[0, P])
    launch_gdn_decode(xs[P:P + 1], ab[P:P + 1, :4], ab[P:P + 1, 4:], s.conv_w, s.A_log, s.dt_bias, window, state,
                      slot, s.HK)
    rb = VerifyRollback.empty(1, 4, s.C, s.HV, s.DK, s.DV, s.dtype, DEV)
    xv, abv = xs[P + 1:].unsqueeze(0), ab[P + 1:].unsqueeze(0)
    launch_gdn_verify(xv, abv[..., :4], abv[..., 4:], s.conv_w, s.A_log, s.dt_bias, window, state, slot, s.HK, rb)
    launch_gdn_commit(rb, torch.tensor([2], dtype=torch.int32, device=DEV), window, state, slot, s.HK)
    n = P + 1 + 2
    _, wr, Sr = s.ref(xs[:n], ab[:n, :4], ab[:n, 4:], torch.zeros_like(window[5]), torch.zeros_like(state[5]))
    report("composed state", rel(state[5], Sr))
    report("composed window", rel(window[5], wr))


# ---------------------------------------------------------------------------------------- AOT compile


def _aot_cases():
    from atlas.plugins_trt.causal_conv1d import triton_conv as tc
    from atlas.plugins_trt.gated_delta_net.triton_chunk import chunk_state_kernel
    from atlas.plugins_trt.gated_delta_net.triton_chunk_out import chunk_out_kernel
    from atlas.plugins_trt.gated_delta_net.triton_chunk_wy import chunk_wu_kernel, chunk_wy_kernel
    from atlas.plugins_trt.gated_delta_net.triton_chunk_wy_sliced import chunk_wy_sliced_kernel
    from atlas.plugins_trt.gated_delta_net.triton_recurrent import gdn_recurrent_kernel
    from atlas.plugins_trt.gated_delta_net.triton_verify import gdn_commit_kernel
    P, F, I, i32 = "*bf16", "*fp32", "*i32", "i32"
    dims = dict(HK=16, HV=48, DK=128, DV=128)
    rec = dict(x=P, stride_x=i32, a=P, b=P, stride_ab=i32, conv_w=P, conv_b=P, A_log=F, dt_bias=F, window=P,
               state=F, slots=I, lens=I, sync=I, nss=F, o=P, stride_o=i32, z=P, stride_z=i32, norm_w=P, steps=F,
               keep_x=P, keep_ab=P, dk=F, du=F, dg=F, T=i32)
    rec_c = dict(dims, KW=4, WP=4, BV=32, IN_PLACE=True, STORE_STEPS=False, KEEP_INPUTS=False, STORE_O=True,
                 FUSE_NORM=False, NORM_EPS=1e-6, HAS_CONV_BIAS=False, HAS_LENS=False, STORE_DELTAS=False, PDL=False,
                 SPLIT_NORM=False)
    return {
        "conv_varlen": (tc.conv_varlen_kernel, dict(x=P, stride_x=i32, y=P, stride_y=i32, weight=P, bias=P,
                        window=P, cu_seqlens=I, slots=I, C=i32), dict(KW=4, WP=4, BT=32, BC=64, HAS_BIAS=False,
                                                                  CHAN_FIRST=True)),
        "conv_update": (tc.conv_update_kernel, dict(x=P, stride_x=i32, y=P, stride_y=i32, weight=P, bias=P,
                        window=P, slots=I, keep=P, T=i32, C=i32),
                        dict(KW=4, WP=4, BC=256, HAS_BIAS=False, IN_PLACE=False)),
        "conv_commit": (tc.conv_commit_kernel, dict(window=P, slots=I, keep=P, accepted=I, T=i32, C=i32),
                        dict(KW=4, WP=4, BC=256)),
        "decode": (gdn_recurrent_kernel, rec, rec_c),
        "decode.pdl": (gdn_recurrent_kernel, rec, dict(rec_c, PDL=True)),  # as the engine's decode step (pdl.py)
        # the engine's decode: the gated norm fused across the Dv tiles (SPLIT_NORM; BV = DV spilled ~1 KB a thread)
        "decode.split_norm": (gdn_recurrent_kernel, rec, dict(rec_c, FUSE_NORM=True, SPLIT_NORM=True, PDL=True)),
        "decode.split_norm.bv64": (gdn_recurrent_kernel, rec, dict(rec_c, BV=64, FUSE_NORM=True, SPLIT_NORM=True,
                                                                   PDL=True)),
        "verify": (gdn_recurrent_kernel, rec, dict(rec_c, IN_PLACE=False, STORE_STEPS=True, KEEP_INPUTS=True)),
        "commit": (gdn_commit_kernel, dict(state=F, slots=I, accepted=I, steps=F, window=P, keep_x=P, T=i32),
                   dict(dims, KW=4, WP=4, BV=64)),
        "chunk_wy": (chunk_wy_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P,
                     stride_ab=i32, A_log=F, dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F, RQ=F, RK=F, X=P),
                     dict(dims, BT=64, BC=16, DOT_PREC="tf32", STORE_X=False, RELOAD_K=False)),
        "chunk_wy_reload": (chunk_wy_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32, a=P,
                            b=P, stride_ab=i32, A_log=F, dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F, RQ=F,
                            RK=F, X=P), dict(dims, BT=64, BC=16, DOT_PREC="tf32", STORE_X=False, RELOAD_K=True)),
        "chunk_wy_x": (chunk_wy_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P,
                       stride_ab=i32, A_log=F, dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F, RQ=F, RK=F, X=P),
                       dict(dims, BT=64, BC=16, DOT_PREC="tf32", STORE_X=True, RELOAD_K=False)),
        "chunk_wy_sliced": (chunk_wy_sliced_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32,
                            a=P, b=P, stride_ab=i32, A_log=F, dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F,
                            RQ=F, RK=F), dict(dims, BT=64, BC=16, BK=32, DOT_PREC="tf32", INV=False)),
        "chunk_wu": (chunk_wu_kernel, dict(k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P, stride_ab=i32, A_log=F,
                     dt_bias=F, cu_seqlens=I, chunks=I, X=P, G=F, RK=F, w=P, u=P),
                     dict(dims, BT=64, DOT_PREC="tf32")),
        "chunk_state": (chunk_state_kernel, dict(k=P, stride_k=i32, w=P, u=P, G=F, RK=F, cu_seqlens=I, slots=I,
                        chunk_first=I, state=F, H=P, dv=P, snaps=F, snap_first=I, snap_every=i32),
                        dict(dims, BT=64, BV=64, SNAPSHOT=True, DOT_PREC="tf32", ACC_DOT=True)),
        "chunk_out": (chunk_out_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, G=F, RQ=F, RK=F, cu_seqlens=I,
                      chunks=I, H=P, dv=P, o=P, stride_o=i32), dict(dims, BT=64, BV=64, DOT_PREC="tf32", HEADS=False,
                                                                    HEAD_STAGES=2)),
        "chunk_out_heads": (chunk_out_kernel, dict(q=P, stride_q=i32, k=P, stride_k=i32, G=F, RQ=F, RK=F,
                            cu_seqlens=I, chunks=I, H=P, dv=P, o=P, stride_o=i32),
                            dict(dims, BT=64, BV=64, DOT_PREC="tf32", HEADS=True, HEAD_STAGES=2)),
    }


def _compile_all():
    """Compile every case for sm_90 and print its resources (run without TRITON_INTERPRET)."""
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for name, (fn, sig, const) in _aot_cases().items():
        full = {p: ("constexpr" if p in const else sig[p]) for p in fn.arg_names}
        # like the JIT on aligned tensors (and the engine's divisible_by_16): pointers and strides
        index = {p: i for i, p in enumerate(fn.arg_names)}
        attrs = {(index[p],): [["tt.divisibility", 16]] for p in sig if sig[p].startswith("*") or "stride" in p}
        compiled = triton.compile(ASTSource(fn=fn, signature=full, constexprs=const, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 2 if name.startswith("chunk_wy") else 4, "num_stages": 2})
        usage = ""
        if os.path.exists(cuobjdump):
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True)
                usage = " ".join(w for line in out.stdout.splitlines() if "REG:" in line
                                 for w in line.split() if w.startswith(("REG:", "STACK:")))
        print(f"  {name}: sm_90 cubin {len(compiled.asm['cubin'])} B, shared {compiled.metadata.shared} B {usage}")


@pytest.mark.slow
def test_kernels_compile_ahead_of_time_for_sm90():
    """Every kernel takes only pointers, ints and constexprs and compiles to an sm_90 cubin with no GPU
    (in a fresh interpreter: kernels decorated under TRITON_INTERPRET cannot be compiled)."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import test_gdn_triton as t; t._compile_all()"
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="0"),
                       capture_output=True, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-4000:]
    # the engine's decode kernel keeps everything in registers (the BV = DV form it replaced: 255 registers and a
    # 1000-byte stack of spills a thread)
    for line in r.stdout.splitlines():
        if line.strip().startswith("decode.split_norm") and "STACK:" in line:
            assert "STACK:0" in line.split(), line


# ---------------------------------------------------------------------------------------- GPU, real shapes

MODELS = {"qwen3.5-27b": (16, 48, 128), "qwen3-next-80b": (16, 32, 128)}
BF16_TOL = 2e-2  # bf16 inputs and bf16 operands of the products, against the fp32 reference


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 — not installed here, or broken: compare with the reference only
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _fla_kwargs(s: Shape):
    return dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=s.A_log, dt_bias=s.dt_bias,
                use_beta_sigmoid_in_kernel=True, output_final_state=True)


@pytest.mark.gpu
@pytest.mark.parametrize("form", [{}, {"wy_inverse": True}, {"wy_slice": 0}, {"split_wy": True},
                                  {"wy_slice": 64, "wy_warps": 4}, {"wy_warps": 1}],
                         ids=["default-sliced-stage1", "sliced-stage1-inverse", "held-stage1", "split-stage1",
                              "sliced-stage1-bk64", "sliced-stage1-1warp"])
@pytest.mark.parametrize("model", list(MODELS))
def test_gpu_chunked_prefill_real_shapes(model, form):
    HK, HV, D = MODELS[model]
    s = Shape(HK, HV, D, D, dtype=torch.bfloat16, seed=11, slots=4)
    lens = [1000, 64, 333]
    cu = cu_of(lens)
    TT = cu[-1]
    qkv, ab = s.rand(TT, s.C), s.rand(TT, 2 * HV)
    H = HK * D
    q, k, v = qkv[:, :H], qkv[:, H:2 * H], qkv[:, 2 * H:]
    a, b = ab[:, :HV], ab[:, HV:]
    slots = torch.tensor([2, 0, 3], dtype=torch.int32, device=DEV)
    state = s.state.clone()
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    o, _ = launch_chunk_gdn(q, k, v, a, b, s.A_log, s.dt_bias, state, slots, cu_t, cu_seqlens_host=cu,
                            out=poison(TT, HV, D, dtype=torch.bfloat16), **form)
    fla = _fla()
    if fla is not None:
        o_f, ht_f = fla[0](q.reshape(1, TT, HK, D), k.reshape(1, TT, HK, D), v.reshape(1, TT, HV, D),
                           g=a.reshape(1, TT, HV), beta=b.reshape(1, TT, HV), initial_state=s.state[slots.long()],
                           cu_seqlens=cu_t.long(), **_fla_kwargs(s))
    for i, sl in enumerate(slots.tolist()):
        r = slice(cu[i], cu[i + 1])
        T = lens[i]
        g, beta = gdn_gating(a[r], b[r], s.A_log, s.dt_bias)
        orf, Sr = gated_delta_rule(q[r].reshape(T, HK, D), k[r].reshape(T, HK, D), v[r].reshape(T, HV, D), g, beta,
                                   s.state[sl])
        orf = orf.to(DEV)
        report(f"{model} prefill o seq{i} (T={T})", rel(o[r], orf), BF16_TOL)
        report(f"{model} prefill state seq{i}", rel(state[sl], Sr), BF16_TOL)
        if fla is not None:
            print(f"    fla: o {rel(o_f[0, r], orf):.2e}, state {rel(ht_f[i], Sr):.2e}; atlas vs fla o "
                  f"{rel(o[r], o_f[0, r].float()):.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(MODELS))
def test_gpu_decode_and_verify_real_shapes(model):
    HK, HV, D = MODELS[model]
    s = Shape(HK, HV, D, D, dtype=torch.bfloat16, seed=12, slots=16)
    B = 8
    slots = torch.arange(15, 15 - B, -1, dtype=torch.int32, device=DEV)
    x, a, b = s.rand(B, s.C), s.rand(B, HV), s.rand(B, HV)
    window, state = s.window.clone(), s.state.clone()
    o = launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots, HK,
                          out=poison(B, HV, D, dtype=torch.bfloat16))
    fla = _fla()
    for i, sl in enumerate(slots.tolist()):
        orf, wr, Sr = s.ref(x[i:i + 1], a[i:i + 1], b[i:i + 1], s.window[sl], s.state[sl])
        report(f"{model} decode o seq{i}", rel(o[i], orf[0].to(DEV)), BF16_TOL)
        report(f"{model} decode state seq{i}", rel(state[sl], Sr), BF16_TOL)
        assert rel(window[sl], wr) < 1e-2
    if fla is not None:
        y, _ = causal_conv1d(x[:1].float(), s.window[slots[0]].float(), s.conv_w.float())  # seq 0 through fla
        H = HK * D
        q, k, v = y.to(torch.bfloat16).split([H, H, HV * D], -1)
        of, _ = fla[1](q.view(1, 1, HK, D), k.view(1, 1, HK, D), v.view(1, 1, HV, D), g=a[:1].view(1, 1, HV),
                       beta=b[:1].view(1, 1, HV), initial_state=s.state[slots[:1].long()], **_fla_kwargs(s))
        print(f"    fla decode seq0 vs atlas: {rel(o[0], of[0, 0].float()):.2e}")
    for mode, kernel, inverse in (("states", None, False), ("deltas", "chunk", False), ("deltas", "recurrent", False),
                                  ("deltas", "prepped", False), ("deltas", "prepped_chunk", False),
                                  ("deltas", "prepped_chunk_tail", False), ("deltas", "prepped_chunk_tail", True),
                                  ("deltas", "prepped_chunk_tail-dots", True)):
        kernel, dots = (kernel.removesuffix("-dots"), kernel.endswith("-dots")) if kernel else (kernel, False)
        prep_tail = dots  # the dots way also takes the prep's 1-row tail
        for K in (4, 17):
            x, a, b = s.rand(2, K, s.C), s.rand(2, K, HV), s.rand(2, K, HV)
            window, state = s.window.clone(), s.state.clone()
            rb = VerifyRollback.empty(2, K, s.C, HV, D, D, torch.bfloat16, DEV, mode=mode)
            o = launch_gdn_verify(x, a, b, s.conv_w, s.A_log, s.dt_bias, window, state, slots[:2], HK, rb,
                                  out=poison(2, K, HV, D, dtype=torch.bfloat16), deltas_kernel=kernel,
                                  solve_inverse=inverse, tail_dots=dots, prep_tail=prep_tail)
            way = f"{mode}, {kernel}{', inverse' if inverse else ''}{', dots + prep tail' if dots else ''}" \
                if kernel else mode
            accepted = torch.tensor([K // 2 + 1, K], dtype=torch.int32, device=DEV)
            launch_gdn_commit(rb, accepted, window, state, slots[:2], HK)
            for i, sl in enumerate(slots[:2].tolist()):
                orf, _, _ = s.ref(x[i], a[i], b[i], s.window[sl], s.state[sl])
                report(f"{model} verify({way}) K{K} o seq{i}", rel(o[i], orf.to(DEV)), BF16_TOL)
                n = int(accepted[i])
                _, _, Sr = s.ref(x[i, :n], a[i, :n], b[i, :n], s.window[sl], s.state[sl])
                report(f"{model} commit({way}) n={n} state seq{i}", rel(state[sl], Sr), BF16_TOL)


@pytest.mark.gpu
def test_gpu_bf16_state_error_over_1000_decode_steps():
    """The error a bf16 recurrent state adds, against the fp32 reference, next to an fp32 state."""
    HK, HV, D = MODELS["qwen3.5-27b"]
    s = Shape(HK, HV, D, D, dtype=torch.bfloat16, seed=13, slots=2)
    B = 2
    slots = torch.arange(B, dtype=torch.int32, device=DEV)
    s.state.zero_()
    s.window.zero_()
    win32, st32 = s.window.clone(), s.state.clone()
    win16, st16 = s.window.clone(), s.state.to(torch.bfloat16)
    ref_win = [s.window[i].float() for i in range(B)]
    ref_st = [s.state[i].float() for i in range(B)]
    errs = {}
    for step in range(1, 1001):
        x, a, b = s.rand(B, s.C), s.rand(B, HV), s.rand(B, HV)
        o32 = launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, win32, st32, slots, HK)
        o16 = launch_gdn_decode(x, a, b, s.conv_w, s.A_log, s.dt_bias, win16, st16, slots, HK)
        oref = []
        for i in range(B):
            o_i, ref_win[i], ref_st[i] = s.ref(x[i:i + 1], a[i:i + 1], b[i:i + 1], ref_win[i], ref_st[i])
            oref.append(o_i[0].to(DEV))
        oref = torch.stack(oref)
        if step in (1, 10, 100, 1000):
            sref = torch.stack(ref_st)
            errs[step] = (rel(o32, oref), rel(o16, oref), rel(st32, sref), rel(st16.float(), sref))
            print(f"  step {step:4d}: o err fp32-state {errs[step][0]:.2e}, bf16-state {errs[step][1]:.2e}; "
                  f"state err fp32 {errs[step][2]:.2e}, bf16 {errs[step][3]:.2e}")
    assert errs[1000][0] < BF16_TOL, "fp32 state drifted"
    assert errs[1000][1] < 0.1, "bf16 state drifted past 10%"
