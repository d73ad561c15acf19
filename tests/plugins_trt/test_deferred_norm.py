"""The decoder's RMSNorm deferred into the next projection (plugins_trt/rms_norm/deferred.py).

CPU: the dataflow's math (hw and the column parts of the sum of squares give rms_norm's rows back: `materialize`,
what a consumer's rstd scaling computes) on random rows; the split-K reductions (Triton) under the interpreter:
the producer's against splitk_reduce_norm_kernel (the same residual bits, the parts of its sum of squares, hw),
the consumer's (plain and SILU) against the product of the normed rows. The Gluon kernels' sm_90 compile is
tests/tools/test_nvfp4_wk.py::test_deferred_norm_forms_compile_without_spills_or_a_serial_tail. GPU: each WK kernel
against the unfused launches on fresh random weights and activations; the reductions at the small tests' shapes.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from triton_interpreter import (fixed_interpreter, interpreter_possible, rel, report, restore_env,  # noqa: E402
                                run_in_fresh_process)

from atlas.plugins_trt.rms_norm.reference import rms_norm  # noqa: E402

NO_GPU = not torch.cuda.is_available()
DEV = "cpu" if NO_GPU else "cuda"


_saved_env = os.environ.get("TRITON_INTERPRET")
if interpreter_possible():
    os.environ["TRITON_INTERPRET"] = "1"
try:
    from atlas.plugins_trt.quant_linear.triton_gemv import launch_splitk_reduce_norm
    from atlas.plugins_trt.rms_norm import deferred as D
    from atlas.plugins_trt.rms_norm.deferred import PART_COLUMNS, DeferredNorm, parts_bound
finally:
    restore_env(_saved_env)

INTERPRET = NO_GPU and type(D.splitk_reduce_defer_kernel).__name__ == "InterpretedFunction"
small = pytest.mark.skipif(NO_GPU and not INTERPRET, reason=(
    "triton was imported for compilation before this module; test_interpreter_tests_in_fresh_process runs these"))


@pytest.fixture(scope="module", autouse=True)
def _fixed_interpreter():
    yield from fixed_interpreter(INTERPRET, fast_nested=True)


def emulated(h: torch.Tensor, weight: torch.Tensor, offset: float, columns: int, eps: float) -> DeferredNorm:
    """What the producer leaves for rows h (bf16 [M, N]): hw = h (offset + w) in bf16, and the sum of h^2 over each
    program's `columns` columns (fp32 [M, N / columns])."""
    hf = h.float()
    hw = (hf * (offset + weight.float())).to(torch.bfloat16)
    return DeferredNorm(hw, (hf * hf).view(h.shape[0], -1, columns).sum(-1), eps)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("columns", [16, 64])
def test_the_deferred_rows_are_the_rms_norm(offset, columns):
    """materialize (hw times the rstd of the parts) is rms_norm's row within a bf16 ulp, also for large rows."""
    g = torch.Generator().manual_seed(7 + columns)
    n = 4096
    for scale in (1.0, 40.0):  # residual streams grow large: hw must not lose what x̂ keeps
        h = (torch.randn(3, n, generator=g) * scale).to(torch.bfloat16)
        weight = (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
        want = rms_norm(h, weight, 1e-6, offset).to(torch.bfloat16).float()
        got = emulated(h, weight, offset, columns, 1e-6).materialize().float()
        diff = (got - want).abs()
        assert float(diff.max()) <= float(want.abs().max()) * 2 ** -7, (scale, float(diff.max()))
        assert float((diff <= want.abs() * 2 ** -7).float().mean()) > 0.99


def test_parts_bound_holds_every_producer():
    """A consumer of a K-wide norm sizes its parts tile for the narrowest producer (PART_COLUMNS columns a program)."""
    for k in (576, 2048, 4096, 5120):
        bound = parts_bound(k)
        assert bound >= k // PART_COLUMNS and bound & (bound - 1) == 0 and bound < 2 * k // PART_COLUMNS + 1


# ---------------------------------------------------------------------------------------------- split-K reductions

def _rand(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(device=DEV, dtype=dtype)


@small
@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["w", "1+w"])
def test_split_reduce_defer_is_the_fused_reduction(offset, bias):
    """splitk_reduce_defer_kernel against splitk_reduce_norm_kernel on the same partials: the residual stream to the
    bit, each program's part the sum of squares of its columns of it, hw = h (offset + w) rounded, and the
    DeferredNorm's rows within two bf16 ulps of the fused reduction's normed rows (N off the 512-column blocks)."""
    g = torch.Generator().manual_seed(3 + int(offset) + 2 * bias)
    S, M, N = 3, 2, 1100
    partials = _rand(g, S, M, N, scale=2.0)
    residual = _rand(g, M, N, dtype=torch.bfloat16, scale=4.0)
    weight = (torch.rand(N, generator=g) + 0.5).to(device=DEV, dtype=torch.bfloat16)
    b = _rand(g, N, dtype=torch.bfloat16) if bias else None
    want_res = residual.clone()
    want = launch_splitk_reduce_norm(partials, want_res, weight, 1e-6, offset, bias=b)
    got_res = residual.clone()
    d = D.launch_splitk_reduce_defer(partials, got_res, weight, 1e-6, offset, bias=b)
    assert torch.equal(got_res, want_res)
    cols = D.reduce_defer_config()["BLOCK_N"]
    h = torch.nn.functional.pad(got_res.float(), (0, d.parts.shape[1] * cols - N))
    report("parts", rel(d.parts, (h * h).view(M, -1, cols).sum(-1)), 1e-6)
    hw = (got_res.float() * (offset + weight.float())).to(torch.bfloat16)
    assert float((d.hw == hw).float().mean()) > 0.99
    report("materialized rows", rel(d.materialize(), want), 8e-3)


@small
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_split_reduce_rstd_is_the_product_of_the_normed_rows(silu):
    """splitk_reduce_rstd_kernel on the split-K partials of hw @ W.T: the product of the normed rows (materialize)
    within bf16 noise, and, with SILU, silu(gate) * up of it; parts from producers of 16 and of 512 columns."""
    g = torch.Generator().manual_seed(5 + silu)
    M, K, N, S = 3, 640, 96, 2
    h = _rand(g, M, K, dtype=torch.bfloat16, scale=3.0)
    weight = (torch.rand(K, generator=g) + 0.5).to(torch.bfloat16)
    W = _rand(g, N, K, scale=0.05)
    for columns in (16, 128):
        d = emulated(h.cpu(), weight, 0.0, columns, 1e-6)
        d = DeferredNorm(d.hw.to(DEV), d.parts.to(DEV), d.eps)
        ks = torch.arange(K, device=DEV).chunk(S)
        partials = torch.stack([d.hw[:, k].float() @ W[:, k].T for k in ks]).contiguous()
        out = D.launch_splitk_reduce_rstd(partials, d, silu=silu)
        ref = d.materialize().float() @ W.T
        if silu:
            ref = torch.nn.functional.silu(ref[:, :N // 2]) * ref[:, N // 2:]
        assert out.shape == (M, N // 2 if silu else N)
        report(f"{columns}-column parts", rel(out, ref), 1.5e-2)


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_interpreter_tests_in_fresh_process():
    """Another module imported triton for compilation first: rerun this module's CPU tests in a process that imports
    triton with TRITON_INTERPRET=1."""
    run_in_fresh_process(__file__, "not fresh_process", timeout=600)


# ---------------------------------------------------------------------------------------------- GPU

def _wk_configs():
    """The build's WK candidates at M 1 (every one) and two at M 4, each with a norm offset (0: Llama, 1: Qwen3.5)."""
    from atlas.build_engine.linear_kernels import wk_candidates

    configs = wk_candidates(1, 4096, 4096) + wk_candidates(4, 4096, 4096)[:2]
    return [(c, float(i % 2)) for i, c in enumerate(configs)]


@pytest.mark.gpu
@pytest.mark.parametrize("config, offset", _wk_configs(), ids=lambda c: f"M{c['BLOCK_M']}-BK{c['BLOCK_K']}-WK{c['WK']}"
                         f"-PRE{c['PRE']}-LA{c.get('LA', 0)}" if isinstance(c, dict) else f"offset{c:.0f}")
def test_deferred_norm_gpu(config, offset):
    """At 8B o_proj -> gate_up / qkv shapes: the producer's residual to the bit of the fused-norm WK GEMV's, its
    parts the sums of squares of the new residual rows, its DeferredNorm's rows within a bf16 ulp or two of that
    kernel's normed rows; the consumer (plain and SILU) on it against the fp32 product of the normed rows: relative
    error under 1e-2, as the GEMV itself; twice in a row alike (no state)."""
    from atlas.plugins_trt.quant_linear import triton_gemv as GV
    from atlas.plugins_trt.rms_norm import deferred as D
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    n = k = 4096
    g, w, ws, ws2, _ = nvfp4_tiled_weight(n, k, True)
    weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    for m in sorted({max(1, config["BLOCK_M"] - 1), config["BLOCK_M"]}):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        residual = (torch.randn(m, n, device="cuda", generator=g) * 8).to(torch.bfloat16)
        want_res = residual.clone()
        want = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, pdl=True, norm=(want_res, weight, 1e-5, offset))
        got_res = residual.clone()
        deferred = D.launch_wk_defer(x, w, ws, ws2, config, got_res, weight, 1e-5, offset, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(got_res, want_res), m
        assert deferred.parts.shape == (m, n // config["BLOCK_N"])
        ref_parts = (want_res.float() ** 2).view(m, -1, config["BLOCK_N"]).sum(-1)
        assert torch.allclose(deferred.parts, ref_parts, rtol=1e-5, atol=0), m
        got = deferred.materialize().float()
        assert float((got - want.float()).abs().max()) <= float(want.float().abs().max()) * 2 ** -6, m
        for nc, silu in ((6144, False), (28672, True)):
            if nc % config["BLOCK_N"]:
                continue
            _, w2, ws2_, wss2, ref_w2 = nvfp4_tiled_weight(nc, k, True)
            outs = [D.launch_wk_rstd(deferred, w2, ws2_, wss2, config, pdl=True, silu=silu) for _ in range(2)]
            assert torch.equal(outs[0], outs[1]), (m, nc)
            ref = want.float() @ ref_w2.T
            if silu:
                ref = torch.nn.functional.silu(ref[:, :nc // 2]) * ref[:, nc // 2:]
            err = float((outs[0].float() - ref).norm() / ref.norm())
            assert err < 1e-2, (m, nc, silu, err)
