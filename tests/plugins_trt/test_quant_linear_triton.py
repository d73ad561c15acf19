"""Triton quant_linear kernels (GEMV, GEMM, FP8 row quantization) against the torch reference.

Without a GPU the kernels run under Triton's CPU interpreter at small shapes. TRITON_INTERPRET=1 must hold when
triton is first imported (triton.language's own @jit helpers, tl.zeros and tl.sum among them, are decorated then)
and while kernels run. When this module is the first to import triton it sets the variable for its imports and its
tests and restores it in between, so kernels that other test modules define stay compilable; when another module
imported triton for compilation first, test_interpreter_tests_in_fresh_process reruns the interpreter tests in a
subprocess that starts with the variable set. `gpu` tests repeat the checks at real sizes on CUDA. The AOT test
compiles every kernel for sm_90 in a subprocess, through the build stage's KernelSpec / compile_kernel.

Triton 3.6's interpreter (with numpy 2.x) gets four things wrong that these kernels use; triton_interpreter.py fixes
them in this process only, and test_interpreter_patches checks each against torch:
  1. int() of a scalar tensor fails (scalars are 1-element arrays), so loops with run-time bounds cannot start;
  2. tl.dot on bf16 multiplies the raw uint16 bit patterns;
  3. fp32 -> bf16 casts truncate instead of rounding to nearest even;
  4. fp32 -> e4m3 casts lose the carry when rounding up crosses a power of two (127.6 -> 64).
The patches make the interpreter compute what the GPU computes (RNE casts, fp32-accumulated dots); they do not
touch the kernels, and they hold only while this module's tests run (other modules see the stock interpreter).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from atlas.build_engine.quantize import QTensor
from atlas.build_engine.quantize.quantizer import quantize
from atlas.plugins_trt.quant_linear.layout import tile_nvfp4
from atlas.plugins_trt.quant_linear.reference import pack_e2m1, quant_linear

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from triton_interpreter import check_patches, fixed_interpreter, restore_env, run_in_fresh_process  # noqa: E402

NO_GPU = not torch.cuda.is_available()


_saved_env = os.environ.get("TRITON_INTERPRET")
if NO_GPU and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton.language as _tl  # noqa: E402

    from atlas.plugins_trt.quant_linear import triton_gemm as GM  # noqa: E402
    from atlas.plugins_trt.quant_linear import triton_gemv as GV  # noqa: E402
finally:
    restore_env(_saved_env)

# True where the interpreter tests can run in this process: no GPU, and triton (with these kernels) was imported
# under TRITON_INTERPRET=1.
INTERPRET = NO_GPU and all(type(f).__name__ == "InterpretedFunction" for f in (_tl.zeros, GV.nvfp4_gemv_kernel))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module", autouse=True)
def _fixed_interpreter():
    yield from fixed_interpreter(INTERPRET)


cpu_only = pytest.mark.skipif(not INTERPRET, reason=(
    "triton was imported for compilation before this module; test_interpreter_tests_in_fresh_process runs these"
    if NO_GPU else "interpreter test (runs where no GPU is present)"))


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def random_weight(fmt, n, k, g, codes=False):
    """A quantized weight. codes=True draws every E2M1 code and e4m3 scales down to subnormals (nvfp4 only)."""
    if fmt == "nvfp4" and codes:
        c = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        bits = torch.randint(1, 0x7F, (n, k // 16), generator=g, dtype=torch.uint8)  # positive, finite
        return QTensor("nvfp4", pack_e2m1(c), bits.view(torch.float8_e4m3fn), torch.rand(n, generator=g) * 1e-2 + 1e-3)
    return quantize(torch.randn(n, k, generator=g), fmt)


def to_device(qt):
    return QTensor(qt.fmt, qt.weight.to(DEVICE), qt.weight_scale.to(DEVICE),
                   None if qt.weight_scale_2 is None else qt.weight_scale_2.to(DEVICE))


def reference(x, qt, bias, residual):
    """fp32: quant_linear on fp32 inputs (+ residual)."""
    y = quant_linear(x.float(), qt, None if bias is None else bias.float())
    return y if residual is None else y + residual.float()


def run_gemv(fmt, x, qt, config, bias, residual):
    out = torch.full((x.shape[0], qt.shape[0]), float("nan"), dtype=torch.bfloat16, device=x.device)
    ws = None
    if config["SPLIT_K"] > 1:
        ws = torch.full((config["SPLIT_K"], x.shape[0], qt.shape[0]), float("nan"), device=x.device)
    if fmt == "nvfp4":
        return GV.launch_nvfp4_gemv(x, qt.weight, qt.weight_scale, qt.weight_scale_2, config, bias, residual, out, ws)
    return GV.launch_fp8_gemv(x, qt.weight, qt.weight_scale, config, bias, residual, out, ws)


@functools.lru_cache(maxsize=4)
def cached_weight(fmt, n, k):
    """One random weight per (format, shape) for the GPU tests (quantizing 17M elements takes a while)."""
    return to_device(random_weight(fmt, n, k, torch.Generator().manual_seed(n * 7 + k)))


def check_gemv(fmt, M, N, K, config, seed, epilogue=True, codes=False, limit=1e-2, qt=None):
    g = torch.Generator().manual_seed(seed)
    qt = to_device(random_weight(fmt, N, K, g, codes)) if qt is None else qt
    x = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE) if epilogue else None
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE) if epilogue else None
    got = run_gemv(fmt, x, qt, config, bias, residual)
    want = reference(x, qt, bias, residual)
    assert got.shape == (M, N) and got.dtype == torch.bfloat16
    assert not got.isnan().any(), "output not fully written"
    err, floor = rel(got, want), rel(want.bfloat16(), want)
    print(f"{fmt} gemv M={M} N={N} K={K} {config}: rel err {err:.2e} (bf16 rounding of the reference {floor:.2e})")
    assert err < limit
    return err


# ---- CPU (interpreter) ----------------------------------------------------------------------------------------

def _cfg(bm, bn=32, bk=32, split=1, warps=4, stages=1):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": warps, "num_stages": stages}


# (M, config): BLOCK_M 1 is the CUDA-core path, BLOCK_M 4 and 16 the tensor-core path; K = 80 leaves a partial
# tail block of 16, N = 104 a partial row block; SPLIT_K 4 over three K blocks leaves one split empty.
GEMV_CASES = [(1, _cfg(1)), (1, _cfg(1, split=4)), (1, {**_cfg(1, split=2), "PIPE": 3}), (3, _cfg(4)),
              (3, _cfg(4, split=2)), (16, _cfg(16, bk=64, split=2))]
# fp8's split-position tensor-core path (BLOCK_K % 64 == 0), M = 1 included; K = 80 + 64 leaves a partial tail block
FP8_TC_CASES = [(1, {**_cfg(1, bk=64), "TC": True}), (3, _cfg(4, bk=64, split=2)), (16, _cfg(16, bk=128))]


@cpu_only
@pytest.mark.parametrize("fmt,M,config", [("nvfp4", m, c) for m, c in GEMV_CASES]
                         + [("fp8", m, c) for m, c in GEMV_CASES if c["BLOCK_M"] == 1],  # fp8 M > 1: below
                         ids=lambda v: f"M{v}" if isinstance(v, int) else v if isinstance(v, str) else
                         f"BM{v['BLOCK_M']}-BK{v['BLOCK_K']}-S{v['SPLIT_K']}-P{v.get('PIPE', 1)}")
def test_gemv_interpreter(fmt, M, config):
    check_gemv(fmt, M, 104, 80, config, seed=len(fmt) * 1000 + M * 100 + config["BLOCK_M"] * 10 + config["SPLIT_K"])


def test_fp8_gemv_rejects_a_config_its_paths_cannot_run():
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    w, ws = torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.ones(8)
    with pytest.raises(ValueError, match="BLOCK_M 1 only"):
        GV.launch_fp8_gemv(x, w, ws, {**_cfg(4, bk=64), "TC": False})
    with pytest.raises(ValueError, match="multiple of 64"):
        GV.launch_fp8_gemv(x, w, ws, _cfg(4, bk=32))


@cpu_only
@pytest.mark.parametrize("M,config", FP8_TC_CASES, ids=lambda v: f"M{v}" if isinstance(v, int) else
                         f"BM{v['BLOCK_M']}-BK{v['BLOCK_K']}-S{v['SPLIT_K']}")
def test_fp8_tc_gemv_interpreter(M, config):
    """Every e4m3 code (NaN aside) through the byte-split decode; K = 144 leaves a partial K block."""
    g = torch.Generator().manual_seed(7 + M)
    bits = torch.randint(0, 256, (72, 144), generator=g, dtype=torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x01
    qt = QTensor("fp8", bits.view(torch.float8_e4m3fn), torch.rand(72, generator=g) + 0.5, None)
    check_gemv("fp8", M, 72, 144, config, seed=M, qt=to_device(qt))


@cpu_only
@pytest.mark.parametrize("pre", [1, 2])
@pytest.mark.parametrize("M,config", [(1, _cfg(1, bk=16, split=2)), (1, {**_cfg(1, bk=16, split=4), "PIPE": 3}),
                                      (1, {**_cfg(1, bk=64), "TC": True}), (3, _cfg(4, bk=64, split=2)),
                                      (16, _cfg(16, bk=64, split=4))],
                         ids=lambda v: f"M{v}" if isinstance(v, int) else
                         f"BM{v['BLOCK_M']}-BK{v['BLOCK_K']}-S{v['SPLIT_K']}-P{v.get('PIPE', 1)}-TC{v.get('TC')}")
def test_fp8_gemv_pre_interpreter(M, config, pre):
    """PRE (the first weight blocks loaded before the PDL wait, their dots after it): K = 144 gives splits with
    fewer full blocks than PRE (one empty at SPLIT_K 4) and a partial tail block."""
    check_gemv("fp8", M, 72, 144, {**config, "PRE": pre}, seed=100 + M * 10 + pre)


@cpu_only
@pytest.mark.parametrize("bm", [1, 4])
def test_gemv_interpreter_every_code_no_epilogue(bm):
    """All 16 E2M1 codes, subnormal block scales, no bias / residual, K a multiple of BLOCK_K (no tail)."""
    check_gemv("nvfp4", 1 if bm == 1 else 4, 40, 128, _cfg(bm, bk=64), seed=10 + bm, epilogue=False, codes=True)


def run_gemm(fmt, x, qt, config, bias, residual, quant_config):
    M, N = x.shape[0], qt.shape[0]
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=x.device)
    if fmt == "nvfp4":
        return GM.launch_nvfp4_gemm(x, qt.weight, qt.weight_scale, qt.weight_scale_2, config, bias, residual, out)
    xq = torch.full(x.shape, float("nan"), device=x.device).to(torch.float8_e4m3fn)
    xs = torch.full((M,), float("nan"), device=x.device)
    GM.launch_quantize_rows_fp8(x, quant_config, out=(xq, xs))
    assert not xs.isnan().any() and not xq.float().isnan().any(), "quantized activations not fully written"
    if config.get("CUBLAS"):
        return GM.scaled_mm_fp8(xq, xs, qt.weight, qt.weight_scale, bias, residual, out)
    return GM.launch_fp8_gemm(xq, xs, qt.weight, qt.weight_scale, config, bias, residual, out)


def quantize_rows_torch(x):
    """x_q = RNE_e4m3(x * RN(448 / amax)), scale = RN(amax / 448), amax = 1 for a zero row (the kernel's contract)."""
    amax = x.float().abs().amax(1).double()
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv, scale = (448.0 / amax).float(), (amax / 448.0).float()  # correctly rounded fp32 quotients
    return (x.float() * inv[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def emulate_w8a8(x, qt, bias, residual):
    """The W8A8 math in torch: per-row e4m3 activations, then the fp32 reference."""
    xq, scale = quantize_rows_torch(x)
    y = (xq.float() * scale[:, None]) @ qt.dequantize().T
    y = y if bias is None else y + bias.float()
    return y if residual is None else y + residual.float()


def check_gemm(fmt, M, N, K, config, seed, quant_config=None, qt=None):
    g = torch.Generator().manual_seed(seed)
    qt = to_device(random_weight(fmt, N, K, g)) if qt is None else qt
    x = (torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 4).bfloat16().to(DEVICE)
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE)
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE)
    got = run_gemm(fmt, x, qt, config, bias, residual, quant_config or GM.CONFIGS_quantize_rows_fp8[0])
    assert not got.isnan().any(), "output not fully written"
    want = reference(x, qt, bias, residual)
    err = rel(got, want)
    if fmt == "nvfp4":
        print(f"nvfp4 gemm M={M} N={N} K={K}: rel err {err:.2e} (bf16 rounding {rel(want.bfloat16(), want):.2e})")
        assert err < 1e-2
        return
    emu = emulate_w8a8(x, qt, bias, residual)
    err_emu = rel(got, emu)
    print(f"fp8 w8a8 gemm M={M} N={N} K={K}: rel err vs W8A8 emulation {err_emu:.2e}, "
          f"vs weight-only reference {err:.2e}")
    assert err_emu < 1e-2
    assert err < 6e-2  # e4m3 activations: ~2-3% by construction


@cpu_only
@pytest.mark.parametrize("M", [64, 70])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_gemm_interpreter(fmt, M):
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    check_gemm(fmt, M, 104, 80, cfg, seed=M + len(fmt), quant_config={"BLOCK_K": 32, "num_warps": 4, "num_stages": 1})


def emulate_wgmma_sk(x, w, ws2, config, M, N, K, out, part):
    """What gluon_gemm.nvfp4_gemm_wgmma_sk_kernel (without FIX) leaves behind, computed with torch (w: the weight
    without its global scale 256 ws2 [N]): each program's walk (data-parallel tiles, then its stream-K range of block
    pairs), whole tiles scaled and stored to out, raw parts to part[pid, slot]. Returns (G, DP)."""
    from atlas.plugins_trt.quant_linear.gluon_gemm import sk_dp_tiles, sk_items

    G, BM, BN, BK = config["SK"], config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    n_m = -(-M // BM)
    NP = K // (2 * BK)
    DP = sk_dp_tiles(config, M, N)
    for pid, items in enumerate(sk_items(G, DP, -(-N // BN) * n_m, NP)):
        for t, p0, p1 in items:
            n0, m0 = (t // n_m) * BN, (t % n_m) * BM
            k0, k1 = 2 * BK * p0, 2 * BK * p1
            acc = torch.zeros(BM, BN)
            xs, wsl = x[m0:m0 + BM, k0:k1].float(), w[n0:n0 + BN, k0:k1].float()
            acc[: xs.shape[0], : wsl.shape[0]] = xs @ wsl.T
            if p0 == 0 and p1 == NP:  # stored by the kernel's epilogue, times 2^8 weight_scale_2
                out[m0:m0 + BM, n0:n0 + BN] = (acc[: xs.shape[0], : wsl.shape[0]]
                                               * (256 * ws2[n0:n0 + BN])).to(out.dtype)
            else:
                part[pid, int(p0 == 0)] = acc.T  # [BN, BM]: m contiguous (gluon_gemm.sk_store)
    return G, DP


@cpu_only
@pytest.mark.parametrize("G,dp,M", [(7, 0, 64), (7, 1, 100), (5, 2, 64), (16, 0, 64), (4, 1, 130), (40, 0, 64)])
def test_sk_reduce_interpreter(G, dp, M):
    """The stream-K wgmma GEMM's reduction (triton_gemv.sk_reduce_kernel, interpreted) over the parts an emulation of
    the persistent kernel's walk leaves: every output element right (bias and residual added once), the tiles the
    kernel stored whole untouched (NaN-filled buffers show any element written twice or never)."""
    from atlas.plugins_trt.quant_linear.gluon_gemm import SK_REDUCE_ROWS, sk_partials_shape

    N, K = 96, 384  # 3 tile columns of 32 at BLOCK_N 32; 6 block pairs a tile at BLOCK_K 32
    cfg = {"SK": G, "DP": dp, "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}
    g = torch.Generator().manual_seed(G * 31 + M)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    ws2 = (torch.rand(N, generator=g) + 0.5) / 256
    bias = torch.randn(N, generator=g).to(torch.bfloat16)
    res = torch.randn(M, N, generator=g).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    part = torch.full(sk_partials_shape(cfg), float("nan"))
    _, DP = emulate_wgmma_sk(x, w, ws2, cfg, M, N, K, out, part)
    direct = ~out.float().isnan()
    out[direct] += (bias.float()[None, :] + res.float()).expand(M, N)[direct].to(torch.bfloat16)  # the kernel's epilogue
    tiles = -(-N // 32) * -(-M // 64)
    GV.sk_reduce_kernel[(tiles - DP, 32 // SK_REDUCE_ROWS, 1)](
        part, ws2, bias, res, out, M, N, K, DP, G, res.stride(0), out.stride(0), BLOCK_M=64, BLOCK_N=32, BLOCK_K=32,
        ROWS=SK_REDUCE_ROWS, HAS_BIAS=True, HAS_RESIDUAL=True)
    ref = (x.float() @ w.float().T) * (256 * ws2) + bias.float() + res.float()
    assert not out.float().isnan().any()
    assert rel(out, ref) < 1e-2
    assert (~direct).any()  # the reduction wrote some tiles


def check_dequant_linear(M, N, K, config, seed, qt=None):
    """The DEQUANT way (nvfp4_dequant_kernel per chunk of rows + torch.mm) against the fp32 reference, and the
    dequantized rows themselves against the reference dequantization (one bf16 rounding each)."""
    g = torch.Generator().manual_seed(seed)
    qt = to_device(random_weight("nvfp4", N, K, g)) if qt is None else qt
    x = (torch.randn(M, K, generator=g) * 4).bfloat16().to(DEVICE)
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE)
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE)
    rows = GM.dequant_rows(config, K)
    w = torch.full((min(rows, N), K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    GM.launch_nvfp4_dequant(qt.weight[:rows], qt.weight_scale[:rows], qt.weight_scale_2[:rows], w, config)
    want_w = qt.dequantize()[:rows].float().to(DEVICE)
    assert torch.equal(w, want_w.bfloat16()), "dequantized rows are not RN_bf16 of the reference"
    for b, r in ((bias, residual), (None, None), (bias, None)):
        got = run_gemm("nvfp4", x, qt, config, b, r, None)
        want = reference(x, qt, b, r)
        err = rel(got, want)
        print(f"nvfp4 dequant+matmul M={M} N={N} K={K} rows/chunk {rows}: rel err {err:.2e}")
        assert not got.isnan().any() and err < 1e-2


@cpu_only
@pytest.mark.parametrize("split,M,N", [(4, 1, 80), (2, 3, 64)])
def test_splitk_reduce_silu_interpreter(split, M, N):
    """The gate_up reduction with SiLU-mul fused (splitk_reduce_kernel SILU, interpreted; N off the block) against
    the plain reduction (interpreted) then silu(gate) * up in torch with the same roundings (bf16 sums, bf16 silu):
    equal but for the last bit where numpy's and torch's sigmoid differ; a bias is refused."""
    g = torch.Generator().manual_seed(split * 100 + N)
    part = torch.randn(split, M, 2 * N, generator=g) * 2
    cfg = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    fused = GV.launch_splitk_reduce(part, torch.empty(M, N, dtype=torch.bfloat16), cfg, silu=True)
    plain = GV.launch_splitk_reduce(part, torch.empty(M, 2 * N, dtype=torch.bfloat16), cfg)
    gate, up = plain.float().split(N, dim=1)
    want = ((gate * torch.sigmoid(gate)).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    assert float((fused.float() - want.float()).norm() / want.float().norm()) < 1e-2
    assert float((fused == want).float().mean()) > 0.95
    with pytest.raises(ValueError, match="without bias"):
        GV.launch_splitk_reduce(part, torch.empty(M, N, dtype=torch.bfloat16), cfg, torch.zeros(2 * N), silu=True)


@cpu_only
@pytest.mark.parametrize("fmt,split", [("nvfp4", 1), ("nvfp4", 2), ("fp8", 2)])
def test_gemv_silu_interpreter(fmt, split):
    """launch_*_gemv(silu=True), the gate_up way the build times (interpreted): SiLU-mul in the split-K reduction
    where the config splits, silu_mul after the GEMV where not; either way the runtime's result (the GEMV then
    silu_mul, to the last bit but where numpy's and torch's sigmoid differ); a bias is refused."""
    from atlas.plugins_trt.activation.triton_silu import launch_silu_mul

    g = torch.Generator().manual_seed(7 + split)
    M, N, K = 1, 96, 80
    qt = to_device(random_weight(fmt, N, K, g))
    x = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
    cfg = _cfg(1, split=split)
    launch = GV.launch_nvfp4_gemv if fmt == "nvfp4" else GV.launch_fp8_gemv
    w = (qt.weight, qt.weight_scale, qt.weight_scale_2) if fmt == "nvfp4" else (qt.weight, qt.weight_scale)
    got = launch(x, *w, cfg, silu=True)
    want = launch_silu_mul(launch(x, *w, cfg))
    assert got.shape == (M, N // 2) and not got.isnan().any()
    assert rel(got, want) < 1e-2 and float((got == want).float().mean()) > 0.95
    with pytest.raises(ValueError, match="without bias"):
        launch(x, *w, cfg, torch.zeros(N, dtype=torch.bfloat16, device=DEVICE), silu=True)


@cpu_only
@pytest.mark.parametrize("fmt,split,offset,bias", [("nvfp4", 1, 0, False), ("nvfp4", 2, 1, True),
                                                   ("fp8", 4, 0, False)])
def test_gemv_norm_interpreter(fmt, split, offset, bias):
    """launch_*_gemv(norm=...), the o_proj / down_proj way the build times (interpreted): the decoder's add + RMSNorm
    in the split-K reduction (splitk_reduce_norm_kernel) where the config splits, the norm kernel after the GEMV
    where not; either way the runtime's unfused result (the projection, then rms_norm_kernel with the residual) to
    the bit, the residual stream updated in place alike; a residual of the GEMV's own is refused."""
    from atlas.plugins_trt.rms_norm.triton_norm import launch_rms_norm

    g = torch.Generator().manual_seed(11 + split)
    M, N, K = 2, 96, 80
    qt = to_device(random_weight(fmt, N, K, g))
    x = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
    b = torch.randn(N, generator=g).bfloat16().to(DEVICE) if bias else None
    weight = (torch.rand(N, generator=g) + 0.5).to(DEVICE)
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE)
    cfg = _cfg(4, bk=64 if fmt == "fp8" else 32, split=split)  # fp8 M > 1: the tensor-core path
    launch = GV.launch_nvfp4_gemv if fmt == "nvfp4" else GV.launch_fp8_gemv
    w = (qt.weight, qt.weight_scale, qt.weight_scale_2) if fmt == "nvfp4" else (qt.weight, qt.weight_scale)
    fused_res = residual.clone()
    got = launch(x, *w, cfg, b, norm=(fused_res, weight, 1e-6, offset))
    plain_res = residual.clone()
    want = launch_rms_norm(launch(x, *w, cfg, b), weight, 1e-6, offset, residual=plain_res)
    assert not got.isnan().any() and torch.equal(fused_res, plain_res) and torch.equal(got, want)
    assert not torch.equal(fused_res, residual)
    with pytest.raises(ValueError, match="residual is norm's own"):
        launch(x, *w, cfg, None, residual, norm=(fused_res, weight, 1e-6, offset))


@cpu_only
def test_fp8_cublas_gemm_interpreter():
    """The CUBLAS way of W8A8: the quantization kernel (interpreter), then torch._scaled_mm with row-wise scales;
    N and K not multiples of 16 are refused with a clear error."""
    quant = {"BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    check_gemm("fp8", 70, 112, 80, GM.CONFIGS_fp8_scaled_mm[0], seed=70, quant_config=quant)
    g = torch.Generator().manual_seed(1)
    qt = random_weight("fp8", 104, 80, g)
    xq, xs = torch.zeros(4, 80).to(torch.float8_e4m3fn), torch.ones(4)
    with pytest.raises(ValueError, match="multiples of 16"):
        GM.scaled_mm_fp8(xq, xs, qt.weight, qt.weight_scale)


@cpu_only
@pytest.mark.parametrize("pack", [False, True], ids=["tile", "pack"])
@pytest.mark.parametrize("K", [80, 128], ids=["K-tail", "K-even"])
def test_dequant_linear_interpreter(K, pack):
    """Chunks of 32 rows (the last one partial: N = 80), K with and without a tail (BLOCK_K 64)."""
    cfg = {**GM.CONFIGS_nvfp4_dequant[0], "BLOCK_N": 16, "BLOCK_K": 64, "CHUNK": 32 * K, "PACK": pack}
    check_dequant_linear(5, 80, K, cfg, seed=7 + K)


# ---- the tiled weight order (layout.py; the kernels' TILED) ----------------------------------------------------

def tiled(qt):
    """qt with its weight and block scales in layout.tile_nvfp4's order (same shapes, weight_scale_2 as is)."""
    w, ws = tile_nvfp4(qt.weight, qt.weight_scale)
    return QTensor(qt.fmt, w, ws, qt.weight_scale_2)


def test_tile_nvfp4_offsets():
    """Element (n, j) of the tiled words (int32 units, as the kernels read them) and scales sits at row_part(n) +
    col_part(j) (layout.py), for every element (so tiling is a permutation); N = 192 (not whole tiles) is refused."""
    g = torch.Generator().manual_seed(5)
    qt = random_weight("nvfp4", 256, 384, g)
    w, ws = tile_nvfp4(qt.weight, qt.weight_scale)
    assert w.shape == qt.weight.shape and ws.shape == qt.weight_scale.shape and ws.dtype == qt.weight_scale.dtype
    assert not torch.equal(w, qt.weight)
    for tensor, t, ROW, TILE in ((qt.weight.view(torch.int32), w.view(torch.int32), 16, 2048),
                                 (qt.weight_scale.view(torch.uint8), ws.view(torch.uint8), 8, 1024)):
        N, C = tensor.shape
        n, j = torch.arange(N)[:, None], torch.arange(C)[None, :]
        off = (n // 128) * (384 // 128) * TILE + (n % 128) * ROW + (j // ROW) * TILE + j % ROW
        assert torch.equal(t.reshape(-1)[off], tensor)
    with pytest.raises(ValueError, match="whole"):
        tile_nvfp4(torch.ones(192, 64, dtype=torch.uint8), torch.ones(192, 8).to(torch.float8_e4m3fn))


def test_tiled_launchers_refuse_shapes_that_are_not_whole_tiles():
    """A TILED config needs N, K and BLOCK_K multiples of 128 (checked before any launch, AOT signatures too)."""
    x = torch.zeros(1, 384, dtype=torch.bfloat16)
    w, ws, ws2 = torch.ones(192, 192, dtype=torch.uint8), torch.ones(192, 24).to(torch.float8_e4m3fn), torch.ones(192)
    t = {"TILED": True}
    with pytest.raises(ValueError, match="N % 128 == 0"):
        GV.launch_nvfp4_gemv(x, w, ws, ws2, {**_cfg(1, bk=128), **t})
    with pytest.raises(ValueError, match="BLOCK_K % 128 == 0"):
        GV.launch_nvfp4_gemv(x, w[:128], ws[:128], ws2[:128], {**_cfg(1, bk=64), **t})
    with pytest.raises(ValueError, match="N % 128 == 0"):
        GM.launch_nvfp4_gemm(x, w, ws, ws2, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 2,
                                             "num_warps": 4, "num_stages": 1, **t})
    with pytest.raises(ValueError, match="N % 128 == 0"):
        GM.launch_nvfp4_dequant(w, ws, ws2, torch.empty(192, 384, dtype=torch.bfloat16),
                                {**GM.CONFIGS_nvfp4_dequant[0], **t})
    with pytest.raises(ValueError, match="K % 128 == 0"):
        GV.signature_nvfp4_gemv({**_cfg(1, bk=128), **t}, 256, 4112)
    with pytest.raises(ValueError, match="nvfp4"):
        GV.launch_fp8_gemv(x, torch.zeros(128, 384).to(torch.float8_e4m3fn), torch.ones(128), {**_cfg(1), **t})
    assert GM.dequant_rows({"CHUNK": 200 * 512, **t}, 512) == 128 and GM.dequant_rows({"CHUNK": 200 * 512}, 512) == 192


# (M, N, K, config): N = 256 in whole tiles; K 384 leaves a masked tail block at BLOCK_K 256; BLOCK_N 256 over
# N = 384 leaves a second program with rows past N (clamped)
TILED_GEMV_CASES = [(m, 256, k, c) for m, c in ((1, _cfg(1, bk=128)), (1, _cfg(1, bk=256, split=2)),
                                                (3, _cfg(4, bk=128, split=2)), (4, _cfg(4, bn=64, bk=256)))
                    for k in (512, 384)] + [(1, 384, 512, _cfg(1, bn=256, bk=128, split=2))]


@cpu_only
@pytest.mark.parametrize("M,N,K,config", TILED_GEMV_CASES, ids=[
    f"M{m}-N{n}-K{k}-BM{c['BLOCK_M']}-BN{c['BLOCK_N']}-BK{c['BLOCK_K']}-S{c['SPLIT_K']}"
    for m, n, k, c in TILED_GEMV_CASES])
def test_tiled_gemv_interpreter(M, N, K, config):
    """TILED GEMV (CUDA-core and tensor-core paths) on tiled weights equals the row-major GEMV bit for bit, and the
    fp32 reference to 1e-2."""
    g = torch.Generator().manual_seed(N + K + M * 10 + config["BLOCK_K"] + config["SPLIT_K"])
    qt = to_device(random_weight("nvfp4", N, K, g))
    x = torch.randn(M, K, generator=g).bfloat16().to(DEVICE)
    epilogue = config["SPLIT_K"] == 1
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE) if epilogue else None
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE) if epilogue else None
    want = run_gemv("nvfp4", x, qt, config, bias, residual)
    got = run_gemv("nvfp4", x, tiled(qt), {**config, "TILED": True}, bias, residual)
    assert not got.isnan().any(), "output not fully written"
    assert torch.equal(got, want), f"tiled differs from row-major: rel {rel(got, want):.2e}"
    err = rel(got, reference(x, qt, bias, residual))
    print(f"tiled nvfp4 gemv M={M} N={N} K={K} {config}: rel err {err:.2e}")
    assert err < 1e-2


@cpu_only
def test_tiled_gemm_interpreter():
    """TILED nvfp4_gemm_kernel (M 40: a partial M tile) equals the row-major GEMM and the fp32 reference."""
    M, N, K = 40, 256, 384
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    g = torch.Generator().manual_seed(40)
    qt = to_device(random_weight("nvfp4", N, K, g))
    x = (torch.randn(M, K, generator=g) * 4).bfloat16().to(DEVICE)
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE)
    residual = torch.randn(M, N, generator=g).bfloat16().to(DEVICE)
    want = run_gemm("nvfp4", x, qt, cfg, bias, residual, None)
    got = run_gemm("nvfp4", x, tiled(qt), {**cfg, "TILED": True}, bias, residual, None)
    assert not got.isnan().any(), "output not fully written"
    assert torch.equal(got, want), f"tiled differs from row-major: rel {rel(got, want):.2e}"
    err = rel(got, reference(x, qt, bias, residual))
    print(f"tiled nvfp4 gemm M={M} N={N} K={K}: rel err {err:.2e}")
    assert err < 1e-2


@cpu_only
@pytest.mark.parametrize("pack", [False, True], ids=["tile", "pack"])
@pytest.mark.parametrize("K", [384, 512], ids=["K-tail", "K-even"])
def test_tiled_dequant_interpreter(K, pack):
    """TILED nvfp4_dequant_kernel (BLOCK_K 256: EVEN_K at K 512, a masked block at 384): the whole weight and the
    row slice [128, 256) of the tiled tensors equal the row-major dequantization; nvfp4_dequant_linear in chunks of
    128 rows equals the row-major way and the fp32 reference."""
    N, M = 256, 5
    cfg = {**GM.CONFIGS_nvfp4_dequant[0], "BLOCK_N": 32, "BLOCK_K": 256, "CHUNK": 128 * K, "PACK": pack}
    cfg_t = {**cfg, "TILED": True}
    g = torch.Generator().manual_seed(K + pack)
    qt = to_device(random_weight("nvfp4", N, K, g))
    qtt = tiled(qt)
    want_w = qt.dequantize().to(DEVICE).bfloat16()
    w = torch.full((N, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    GM.launch_nvfp4_dequant(qtt.weight, qtt.weight_scale, qtt.weight_scale_2, w, cfg_t)
    assert torch.equal(w, want_w), "tiled dequantization differs from the reference's"
    w = torch.full((128, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    GM.launch_nvfp4_dequant(qtt.weight[128:], qtt.weight_scale[128:], qtt.weight_scale_2[128:], w, cfg_t)
    assert torch.equal(w, want_w[128:]), "a row slice of the tiled weight dequantizes wrong"
    x = (torch.randn(M, K, generator=g) * 4).bfloat16().to(DEVICE)
    bias = torch.randn(N, generator=g).bfloat16().to(DEVICE)
    assert GM.dequant_rows(cfg_t, K) == 128
    want = GM.nvfp4_dequant_linear(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, bias)
    got = GM.launch_nvfp4_gemm(x, qtt.weight, qtt.weight_scale, qtt.weight_scale_2, cfg_t, bias)
    assert torch.equal(got, want)
    err = rel(got, reference(x, qt, bias, None))
    print(f"tiled nvfp4 dequant+matmul N={N} K={K} pack={pack}: rel err {err:.2e}")
    assert err < 1e-2


@cpu_only
@pytest.mark.parametrize("K", [384, 512], ids=["K-tail", "K-even"])
def test_bits_dequant_interpreter(K):
    """The PACK dequantization of a tiled weight whose words are in layout.NVFP4_BITS order (BITS) equals the
    row-major one bit for bit (the Triton decode e2m1_bits_f32, which the interpreter runs)."""
    from atlas.plugins_trt.quant_linear.layout import bits_nvfp4

    N = 256
    cfg = {**GM.CONFIGS_nvfp4_dequant[0], "BLOCK_N": 32, "BLOCK_K": 256, "CHUNK": 128 * K, "PACK": True,
           "TILED": True, "BITS": True}
    g = torch.Generator().manual_seed(K + 7)
    qt = to_device(random_weight("nvfp4", N, K, g))
    qtt = tiled(qt)
    want_w = qt.dequantize().to(DEVICE).bfloat16()
    w = torch.full((N, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    GM.launch_nvfp4_dequant(bits_nvfp4(qtt.weight), qtt.weight_scale, qtt.weight_scale_2, w, cfg)
    assert torch.equal(w, want_w), "BITS dequantization differs from the reference's"
    w = torch.full((N, K), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    GM.launch_nvfp4_dequant(qtt.weight, qtt.weight_scale, qtt.weight_scale_2, w, cfg)
    assert not torch.equal(w, want_w), "BITS must change what the kernel reads"


def check_quantize_rows(M, K, config, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 10 ** torch.randint(-3, 4, (M, 1), generator=g)).bfloat16()
    x[0] = 0  # an all-zero row
    x = x.to(DEVICE)
    xq = torch.full((M, K), float("nan"), device=DEVICE).to(torch.float8_e4m3fn)
    xs = torch.full((M,), float("nan"), device=DEVICE)
    GM.launch_quantize_rows_fp8(x, config, out=(xq, xs))
    want_q, want_s = quantize_rows_torch(x)
    assert torch.equal(xs, want_s.to(DEVICE))
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8).to(DEVICE)), "x_q is not RNE(x * 448 / amax)"


@cpu_only
def test_quantize_rows_fp8_interpreter_is_exact():
    check_quantize_rows(5, 96, {"BLOCK_K": 32, "num_warps": 4, "num_stages": 1}, seed=7)


@cpu_only
def test_interpreter_patches():
    """Each patched interpreter operation now agrees with torch (triton_interpreter.check_patches)."""
    check_patches()


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_interpreter_tests_in_fresh_process():
    """Another module imported triton for compilation first: rerun this module's interpreter tests in a process
    that imports triton with TRITON_INTERPRET=1."""
    run_in_fresh_process(__file__, "interpreter and not fresh_process", timeout=600)


# ---- AOT compilation for sm_90 (no GPU needed) ----------------------------------------------------------------

AOT_SCRIPT = r"""
import json, re, subprocess, tempfile, time
from pathlib import Path
import triton
from atlas.build_engine.kernels import compile_kernel
from atlas.plugins_trt.quant_linear import gluon_gemm as GLG, gluon_ws as GWS, triton_gemm as GM, triton_gemv as GV

cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
N, K = 4096, 4096
gemv = lambda bm, split: {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": split, "num_warps": 4,
                          "num_stages": 1 if bm == 1 else 3}
gemm = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
fp8_gemm = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 4}
red, quant = GV.CONFIGS_splitk_reduce[0], GM.CONFIGS_quantize_rows_fp8[1]
sk = {**{k: v for k, v in GM.CONFIGS_nvfp4_wgmma_sk[0].items() if k != "SK_PER_SM"}, "SK": 132}
cases = {  # name: (AotSignature, grid)
    "nvfp4_gemv.BM1": (GV.signature_nvfp4_gemv(gemv(1, 1), N, K, True, True), GV.grid_gemv(gemv(1, 1), N)),
    "nvfp4_gemv.BM1.S4": (GV.signature_nvfp4_gemv(gemv(1, 4), N, K), GV.grid_gemv(gemv(1, 4), N)),
    "nvfp4_gemv.BM16": (GV.signature_nvfp4_gemv(gemv(16, 1), N, K, True, True), GV.grid_gemv(gemv(16, 1), N)),
    "fp8_gemv.BM1": (GV.signature_fp8_gemv(gemv(1, 1), N, K, True, True), GV.grid_gemv(gemv(1, 1), N)),
    "fp8_gemv.BM16.S2": (GV.signature_fp8_gemv(gemv(16, 2), N, K), GV.grid_gemv(gemv(16, 2), N)),
    "splitk_reduce": (GV.signature_splitk_reduce(red, 4, N, True, True), GV.grid_splitk_reduce(red, 1, N)),
    "nvfp4_gemv.gluon.pdl": (GV.signature_nvfp4_gemv({**gemv(1, 4), "GLUON": True, "PIPE": 2}, N, K, pdl=True),
                             GV.grid_gemv(gemv(1, 4), N)),
    "nvfp4_gemv.gluon.pipe3.pdl": (GV.signature_nvfp4_gemv({**gemv(8, 4), "BLOCK_K": 128, "num_stages": 1, "GLUON": True,
                                                            "PIPE": 3}, N, K, pdl=True), GV.grid_gemv(gemv(8, 4), N)),
    "splitk_reduce.pdl": (GV.signature_splitk_reduce(red, 4, N, pdl=True), GV.grid_splitk_reduce(red, 1, N)),
    "splitk_reduce.silu.pdl": (GV.signature_splitk_reduce(red, 4, N, pdl=True, silu=True),
                               GV.grid_splitk_reduce(red, 1, N)),
    "nvfp4_gemm": (GM.signature_nvfp4_gemm(gemm, N, K, True, True), GM.grid_gemm(gemm, 2048, N)),
    "quantize_rows_fp8": (GM.signature_quantize_rows_fp8(quant, K), GM.grid_quantize_rows_fp8(quant, 2048)),
    "nvfp4_dequant": (GM.signature_nvfp4_dequant(GM.CONFIGS_nvfp4_dequant[0], N, K),
                      GM.grid_nvfp4_dequant(GM.CONFIGS_nvfp4_dequant[0], 4096, K)),
    "fp8_gemm": (GM.signature_fp8_gemm(fp8_gemm, N, K, True, True), GM.grid_gemm(fp8_gemm, 2048, N)),
    "nvfp4_wgmma": (GLG.signature_nvfp4_gemm_wgmma(GM.CONFIGS_nvfp4_wgmma[0], N, K, True, True),
                    GLG.grid_wgmma(GM.CONFIGS_nvfp4_wgmma[0], 2048, N)),
    "nvfp4_wgmma_sk": (GLG.signature_nvfp4_gemm_wgmma_sk(sk, N, K), (sk["SK"], 1, 1)),  # the build compiles no bias
    "nvfp4_wgmma_sk.fix": (GLG.signature_nvfp4_gemm_wgmma_sk({**sk, "FIX": True}, N, K), (sk["SK"], 1, 1)),
    "sk_reduce": (GLG.signature_sk_reduce(sk, N, K, True, True), GLG.grid_sk_reduce(sk, 2048, N)),
    "nvfp4_ws": (GWS.signature_nvfp4_gemm_ws(GM.CONFIGS_nvfp4_ws[0], N, K, True, True),
                 GLG.grid_wgmma(GM.CONFIGS_nvfp4_ws[0], 2048, N)),
    "nvfp4_ws.split": (GWS.signature_nvfp4_gemm_ws(GM.CONFIGS_nvfp4_ws[-1], N, K),
                       GLG.grid_wgmma(GM.CONFIGS_nvfp4_ws[-1], 256, N)),
}
report = {}
for name, (sig, grid) in cases.items():
    t = time.time()
    k = GV.compile_aot(sig)
    seconds = round(time.time() - t, 2)
    built = compile_kernel(sig.kernel_spec(name, grid))  # the build stage's path, checked for the runtime
    assert built.cubin == k.asm["cubin"], name
    entry = {"seconds": seconds, "dyn_shared": k.metadata.shared, "global_scratch": k.metadata.global_scratch_size,
             "ptx_v4_loads": k.asm["ptx"].count("ld.global.v4"), "wgmma": k.asm["ptx"].count("wgmma.mma_async"),
             "params": len(sig.params), "griddepcontrol": k.asm["ptx"].count("griddepcontrol.")}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
    for key in ("REG", "STACK", "LOCAL"):  # cuobjdump's SHARED is the static 1 KB Triton reserves
        m = re.search(key + r":(\d+)", usage)
        entry[key.lower()] = int(m.group(1)) if m else None
    report[name] = entry
print(json.dumps(report))
"""


def test_aot_compile_sm90(tmp_path):
    """Every kernel compiles for sm_90 through ASTSource + signature_<kernel>; prints registers, spills, smem."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile for real, and time it
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, e in report.items():
        print(f"{name:20s} regs {e['reg']:>3}  stack {e['stack']}  local(spill) {e['local']}  "
              f"dynamic smem {e['dyn_shared']:>6} B  v4 loads {e['ptx_v4_loads']:>2}  wgmma {e['wgmma']:>2}  "
              f"{e['seconds']} s")
        assert e["local"] == 0 and e["stack"] == 0, f"{name} spills registers"
        assert e["global_scratch"] == 0
    for name in ("nvfp4_gemv.BM1", "fp8_gemv.BM1"):
        assert report[name]["ptx_v4_loads"] > 0, f"{name}: weights are not loaded 16 bytes at a time"
    for name in ("nvfp4_gemm", "fp8_gemm", "nvfp4_wgmma", "nvfp4_wgmma_sk", "nvfp4_wgmma_sk.fix", "nvfp4_ws",
                 "nvfp4_ws.split"):
        assert report[name]["wgmma"] > 0, f"{name} does not use wgmma"
    for name, e in report.items():  # launch_dependents and wait in the PDL builds only
        assert e["griddepcontrol"] == (2 if name.endswith(".pdl") else 0), name


PERMUTE_WORDS_SCRIPT = r"""
import json
from atlas.plugins_trt.quant_linear import triton_gemm as GM, triton_gemv as GV

report = {}
for bk in (64, 128):
    ptx = GV.compile_aot(GM.signature_permute_k(bk, 4096)).asm["ptx"]
    report[bk] = {"ld_v4": ptx.count("ld.global.v4."), "st_v4": ptx.count("st.global.v4."),
                  "ld_b16": ptx.count("ld.global.b16") + ptx.count("ld.global.u16")}
print(json.dumps(report))
"""


def test_permute_k_words_compiles_to_wide_copies(tmp_path):
    """permute_k_words_kernel compiles for sm_90 to 16-byte loads and stores only (the gather kernel it replaced
    loads 2-byte elements): the transpose stays inside the program."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", PERMUTE_WORDS_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for bk, e in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        assert e["ld_v4"] > 0 and e["st_v4"] > 0 and e["ld_b16"] == 0, (bk, e)


AOT_TILED_SCRIPT = r"""
import json
from atlas.build_engine.kernels import compile_kernel
from atlas.plugins_trt.quant_linear import triton_gemm as GM, triton_gemv as GV

N, K = 4096, 4096
T = {"TILED": True}
gemv = {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 1}
gemm = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
deq = {**GM.CONFIGS_nvfp4_dequant[0], **T}
cases = {
    "gemv.BM1.row": (GV.signature_nvfp4_gemv(gemv, N, K, pdl=True), GV.grid_gemv(gemv, N)),
    "gemv.BM1.tiled": (GV.signature_nvfp4_gemv({**gemv, **T}, N, K, pdl=True), GV.grid_gemv(gemv, N)),
    "gemm.tiled": (GM.signature_nvfp4_gemm({**gemm, **T}, N, K), GM.grid_gemm(gemm, 2048, N)),
    "dequant.tiled": (GM.signature_nvfp4_dequant(deq, N, K), GM.grid_nvfp4_dequant(deq, 4096, K)),
}
report = {}
for name, (sig, grid) in cases.items():
    built = compile_kernel(sig.kernel_spec(name, grid))  # the build stage's path (KernelSpec checks the constexprs)
    k = GV.compile_aot(sig)
    assert built.cubin == k.asm["cubin"] and len(k.asm["cubin"]) > 0, name
    ptx = k.asm["ptx"]
    report[name] = {"v4": ptx.count("ld.global.v4."), "nc_v4": ptx.count("ld.global.nc.v4"),
                    "tiled": sig.constexprs["TILED"]}
print(json.dumps(report))
"""


def test_aot_compile_sm90_tiled(tmp_path):
    """TILED kernels compile for sm_90 through the build stage's KernelSpec; the BLOCK_M 1 GEMV still loads its
    weights 16 bytes at a time (as many ld.global.v4 as the row-major build); a config without "TILED" compiles
    with the default (False)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", AOT_TILED_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, e in report.items():
        print(f"{name:16s} ld.global.v4 {e['v4']:>2}  ld.global.nc.v4 {e['nc_v4']:>2}  TILED {e['tiled']}")
        assert e["tiled"] == name.endswith(".tiled"), name
    row, tiled = (report[n]["v4"] + report[n]["nc_v4"] for n in ("gemv.BM1.row", "gemv.BM1.tiled"))
    assert tiled >= row > 0, f"the TILED GEMV lost its 16-byte weight loads: {tiled} against {row} row-major"


# ---- GPU ------------------------------------------------------------------------------------------------------

ODD = (4096 + 64 + 8, 4096 + 16)  # N, K: partial row block, K a multiple of 16 only (unaligned nvfp4 rows)
ALIGNED = (4096, 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [ODD, ALIGNED], ids=["odd", "aligned"])
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_gemv_gpu(fmt, M, shape):
    configs = GV.CONFIGS_nvfp4_gemv if fmt == "nvfp4" else GV.CONFIGS_fp8_gemv
    bucket = GV.gemv_bucket(M)
    same = [c for c in configs if c["BLOCK_M"] == bucket and c["SPLIT_K"] in (1, 4)]
    ways = {}  # CUDA cores with plain or pipelined loads, tensor cores, Gluon mma.sync, fp8's PRE: two of every way
    for c in same:
        if not (c.get("GLUON") and shape[1] % c["BLOCK_K"]):  # Gluon: K % BLOCK_K == 0 only
            ways.setdefault((bool(c.get("TC")), c.get("PIPE", 1), bool(c.get("GLUON")), c.get("PRE", 0)),
                            []).append(c)
    picks = [c for way in ways.values() for c in way[:2]]
    for i, cfg in enumerate(picks):
        check_gemv(fmt, M, *shape, cfg, seed=100 * M + i, epilogue=i % 2 == 0, qt=cached_weight(fmt, *shape))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [ODD, ALIGNED], ids=["odd", "aligned"])
@pytest.mark.parametrize("M", [64, 256, 2048])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_gemm_gpu(fmt, M, shape):
    configs = [c for c in GM.gemm_candidates(fmt, *shape) if not (c.get("WGMMA") or c.get("WS"))]
    for i, cfg in enumerate(configs[::3]):
        check_gemm(fmt, M, *shape, cfg, seed=M + i, qt=cached_weight(fmt, *shape))
    if fmt == "nvfp4":  # every Gluon wgmma config, warp-specialized too, where K allows it (the odd K 4112 does not)
        from atlas.plugins_trt.quant_linear import gluon_ws as GWS

        wgmma = [c for c in GM.gemm_candidates(fmt, *shape) if c.get("WGMMA") or c.get("WS")] + [
            c for c in GM.CONFIGS_nvfp4_ws if c not in GM.CONFIGS_nvfp4_gemm and GWS.supports(c, shape[1])]
        assert bool(wgmma) == (shape == ALIGNED)
        for i, cfg in enumerate(wgmma):
            check_gemm(fmt, M, *shape, cfg, seed=M + 70 + i, qt=cached_weight(fmt, *shape))
    if fmt == "fp8" and shape == ALIGNED:  # cuBLASLt (N, K multiples of 16 only)
        check_gemm(fmt, M, *shape, GM.CONFIGS_fp8_scaled_mm[0], seed=M + 60, qt=cached_weight(fmt, *shape))
    if fmt == "nvfp4":  # the dequantize + cuBLAS way, at several chunks a weight (the last one partial)
        for i, cfg in enumerate(GM.CONFIGS_nvfp4_dequant):
            check_dequant_linear(M, *shape, {**cfg, "CHUNK": cfg["CHUNK"] // 8}, seed=M + 50 + i,
                                 qt=cached_weight(fmt, *shape))


@pytest.mark.gpu
@pytest.mark.parametrize("K", [4096 + 16, 17408])
def test_quantize_rows_fp8_gpu_is_exact(K):
    for cfg in GM.CONFIGS_quantize_rows_fp8:
        check_quantize_rows(37, K, cfg, seed=K)


@functools.lru_cache(maxsize=2)
def chain_layers(fmt, K, n=6):
    g = torch.Generator().manual_seed(K + len(fmt))
    return [to_device(quantize(torch.randn(K, K, generator=g) / K ** 0.5, fmt)) for _ in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_gemv_pdl_chain_gpu(fmt, M):
    """Programmatic dependent launch: a chain of GEMVs, each reading the previous one's output, launched with the
    attribute and replayed from a CUDA graph, equals the same chain launched plainly, bit for bit. Every
    intermediate buffer is NaN-filled first inside the graph, so a GEMV that read x before its wait would show it."""
    configs = GV.CONFIGS_nvfp4_gemv if fmt == "nvfp4" else GV.CONFIGS_fp8_gemv
    ways = {}
    for c in configs:  # one config of every way at this bucket, split and unsplit
        if c["BLOCK_M"] == GV.gemv_bucket(M):
            ways.setdefault((bool(c.get("TC")), c.get("PIPE", 1), bool(c.get("GLUON")), c["SPLIT_K"] > 1), c)
    layers = chain_layers(fmt, 4096)
    K = 4096
    x0 = torch.randn(M, K, generator=torch.Generator().manual_seed(M * 13 + len(fmt))).bfloat16().to(DEVICE)
    for cfg in ways.values():
        bufs = [torch.empty(M, K, dtype=torch.bfloat16, device=DEVICE) for _ in layers]
        ws = [torch.empty(cfg["SPLIT_K"], M, K, device=DEVICE) for _ in layers] if cfg["SPLIT_K"] > 1 else None

        def chain(pdl):
            for b in bufs:
                b.fill_(float("nan"))
            x = x0
            for i, qt in enumerate(layers):
                w = None if ws is None else ws[i]
                if fmt == "nvfp4":
                    x = GV.launch_nvfp4_gemv(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, out=bufs[i],
                                             workspace=w, pdl=pdl)
                else:
                    x = GV.launch_fp8_gemv(x, qt.weight, qt.weight_scale, cfg, out=bufs[i], workspace=w, pdl=pdl)
            return x

        want = chain(False).clone()
        assert not want.isnan().any()
        chain(True)  # compile and warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(True)
        for _ in range(20):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(got, want), f"{fmt} M={M} {cfg}: the PDL chain differs from the plain one"
        print(f"{fmt} M={M} {cfg}: PDL chain of {len(layers)} equals the plain chain over 20 graph replays")


def _permute_cases():
    """(M, K, BK, ROWS, COLS): a partial row tile, a partial column tile (K not a multiple of COLS), the shipped tile."""
    return [(5, 256, 64, 4, 128), (9, 640, 128, 4, 256), (3, 512, 128, 8, 512)]


def _check_permute_k_kernel(M, K, BK, ROWS, COLS, device, words=False):
    import triton

    from atlas.plugins_trt.quant_linear.gluon_gemm import block_index, permutation

    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M * K + BK)).to(torch.bfloat16).to(device)
    out = torch.full_like(x, float("nan"))
    grid = (triton.cdiv(M, ROWS), triton.cdiv(K, COLS), 1)
    if words:
        GM.permute_k_words_kernel[grid](x, out, M, K, x.stride(0), out.stride(0), BK=BK, ROWS=ROWS, COLS=COLS)
    else:
        GM.permute_k_kernel[grid](x, block_index(BK, device), out, M, K, x.stride(0), out.stride(0), BK=BK,
                                  ROWS=ROWS, COLS=COLS)
    assert torch.equal(out, x[:, permutation(K, BK, device)]), (M, K, BK, ROWS, COLS, words)


@cpu_only
@pytest.mark.parametrize("case", _permute_cases())
def test_permute_k_kernel_interpreted(case):
    """permute_k_kernel (x into the wgmma kernels' k order, one launch) equals the gather by gluon_gemm.permutation,
    on fresh random rows, with partial row and column tiles."""
    _check_permute_k_kernel(*case, "cpu")


@cpu_only
@pytest.mark.parametrize("case", _permute_cases())
def test_permute_k_words_kernel_interpreted(case):
    """permute_k_words_kernel (the same order as a transpose of 32-bit words) equals the gather by
    gluon_gemm.permutation on fresh random rows, partial row and column tiles included."""
    _check_permute_k_kernel(*case, "cpu", words=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _permute_cases())
def test_permute_k_kernel_gpu(case):
    """As the two interpreted tests (permute_k_kernel and permute_k_words_kernel), compiled; and gluon_gemm.permute_k
    (which launches either) equals the gather at the benchmark's K values and M 300."""
    from atlas.plugins_trt.quant_linear.gluon_gemm import gather_k, permute_k

    _check_permute_k_kernel(*case, "cuda")
    _check_permute_k_kernel(*case, "cuda", words=True)
    for k in (4096, 5120, 14336, 17408):
        x = torch.randn(300, k, device="cuda").to(torch.bfloat16)
        for bk in (64, 128):
            assert torch.equal(permute_k(x, bk), gather_k(x, bk)), (k, bk, "words")
            assert torch.equal(permute_k(x, bk, words=False), gather_k(x, bk)), (k, bk)
