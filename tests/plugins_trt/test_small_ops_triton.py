"""Triton small ops of the decode path against their torch references: RMSNorm (plain, residual, gated), the
fused QK-norm + RoPE + paged KV write, SiLU-mul, embedding gather, argmax and sampling.

Without a GPU the kernels run under Triton's CPU interpreter at tiny shapes. TRITON_INTERPRET=1 must hold when
triton is first imported and while kernels run: when this module is the first to import triton (or triton was
imported under the interpreter) it sets the variable for its imports and its tests and restores it in between;
when another module imported triton for compilation first, test_interpreter_tests_in_fresh_process reruns these
tests in a subprocess that starts with the variable set. The same small tests run on CUDA where a GPU is present;
`gpu` tests repeat them at real sizes. test_aot_compile_sm90 compiles every kernel for sm_90 in a subprocess.

Every input is fresh random data, every output is poisoned first (NaN, or -7 for ids), and cache slots a launch
does not own must come back bit-identical. Error ratio ‖out - ref‖ / ‖ref‖ is printed (run with -s) against:
  FP32_TOL 1e-5   fp32 io: only the order of fp32 operations differs;
  BF16_TOL 8e-3   bf16 / fp16 outputs: one rounding of the output (2^-9 relative) and rare last-bit flips where the
                  kernel's fp32 value and the reference's straddle a rounding boundary;
  FP8_TOL  2e-2   e4m3 cache rows (dequantized): same bytes as the reference but for rare one-step flips
                  (a step is 2^-3 relative), and at least 99% of the bytes identical.

Triton 3.6's interpreter (numpy 2.x) gets three things wrong that these kernels use, and is slow at a fourth;
tests/triton_interpreter.py fixes them while this module's tests run (test_interpreter_patches checks the first three):
  1. int() of a scalar tensor fails (scalars are 1-element arrays): loops with run-time bounds cannot start;
  2. fp32 -> bf16 casts truncate instead of rounding to nearest even (the GPU rounds);
  3. fp32 -> e4m3 casts lose the carry when rounding up crosses a power of two (127.6 -> 64);
  4. every call of a nested @jit function (tl.max, tl.sum, helpers) re-patches triton.language, ~1 ms each:
     patched once per launch instead (speed only: the same patches, applied once).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from triton_interpreter import (check_patches, fixed_interpreter, interpreter_possible, rel, report,  # noqa: E402
                                restore_env, run_in_fresh_process)

from atlas.plugins_trt.activation.reference import silu_mul
from atlas.plugins_trt.embedding.reference import embedding
from atlas.plugins_trt.rms_norm.reference import fused_add_rms_norm, gated_rms_norm, rms_norm
from atlas.plugins_trt.rope.reference import qkv_rope_kv_write, rope_inv_freq
from atlas.plugins_trt.sampling.reference import sampling_probs
from atlas.runtime.kv_cache import LayerKV

NO_GPU = not torch.cuda.is_available()
DEV = "cpu" if NO_GPU else "cuda"
FP32_TOL, BF16_TOL, FP8_TOL = 1e-5, 8e-3, 2e-2
FP8 = torch.float8_e4m3fn


_saved_env = os.environ.get("TRITON_INTERPRET")
if interpreter_possible():
    os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton.language as _tl

    from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
    from atlas.plugins_trt.embedding.triton_embed import launch_embedding
    from atlas.plugins_trt.rms_norm.triton_norm import launch_gated_rms_norm, launch_rms_norm, rms_norm_kernel
    from atlas.plugins_trt.rope.triton_rope import launch_qkv_rope
    from atlas.plugins_trt.sampling.triton_sampling import launch_argmax, launch_sample
finally:
    restore_env(_saved_env)

# True where the interpreter tests can run in this process.
INTERPRET = NO_GPU and all(type(f).__name__ == "InterpretedFunction" for f in (_tl.zeros, rms_norm_kernel))
small = pytest.mark.skipif(NO_GPU and not INTERPRET, reason=(
    "triton was imported for compilation before this module; test_interpreter_tests_in_fresh_process runs these"))


@pytest.fixture(scope="module", autouse=True)
def _fixed_interpreter():
    yield from fixed_interpreter(INTERPRET, fast_nested=True)


# ---------------------------------------------------------------------------------------------- helpers


def tol_of(dtype: torch.dtype) -> float:
    return FP32_TOL if dtype == torch.float32 else BF16_TOL


def check(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """The error ratio against the tolerance of out's dtype; a bf16 / fp16 output must also equal the reference
    rounded to its dtype in >= 99% of the elements (a slip in what is rounded when flips about half of them)."""
    report(name, rel(out, ref), tol_of(out.dtype))
    if out.dtype in (torch.bfloat16, torch.float16):
        same = (out == ref.to(out.dtype)).float().mean().item()
        print(f"    {same:.2%} bit-identical to the reference")
        assert same >= 0.99, f"{name}: only {same:.2%} of the elements round like the reference"


def rand(g: torch.Generator, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(device=DEV, dtype=dtype)


def poison(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def strided_rows(g: torch.Generator, rows: int, cols: int, dtype, pad: int = 8) -> torch.Tensor:
    """Random [rows, cols] as a column slice of a wider buffer: rows are stride cols + 2·pad apart."""
    return rand(g, rows, cols + 2 * pad, dtype=dtype)[:, pad:pad + cols]


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------- RMSNorm


@small
@pytest.mark.parametrize("N", [48, 8192], ids=["N48", "N8192"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["w", "1+w"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_rms_norm(dtype, offset, residual, N):
    g = torch.Generator().manual_seed(N + int(offset) + 2 * residual)
    M, eps = 3, 1e-6
    x = strided_rows(g, M, N, dtype)
    w = rand(g, N, scale=0.5)
    out = poison(M, N, dtype=dtype)
    if residual:
        r = rand(g, M, N, dtype=dtype, scale=2.0)
        r_before = r.clone()
        launch_rms_norm(x, w, eps, offset, residual=r, out=out)  # the residual is updated in place
        ref, h_ref = fused_add_rms_norm(x, r_before, w, eps, offset)
        assert torch.equal(r, h_ref), "the new residual is one rounding of the same fp32 sum"
    else:
        launch_rms_norm(x, w, eps, offset, out=out)
        ref = rms_norm(x, w, eps, offset)
    check(f"rms_norm {dtype} offset {offset} residual {residual} N {N}", out, ref)


@small
def test_rms_norm_in_place_and_limits():
    """out = x and residual_out = residual (the decoder's in-place use); over 8192 values is refused."""
    g = torch.Generator().manual_seed(5)
    M, N = 4, 40
    x, r, w = rand(g, M, N, dtype=torch.bfloat16), rand(g, M, N, dtype=torch.bfloat16), rand(g, N)
    ref, h_ref = fused_add_rms_norm(x, r, w, 1e-5, 1.0)
    y = launch_rms_norm(x, w, 1e-5, 1.0, residual=r, out=x)
    assert y is x and torch.equal(r, h_ref)
    check("rms_norm in place", x, ref)
    with pytest.raises(ValueError, match="8192"):
        launch_rms_norm(rand(g, 1, 8200), rand(g, 8200), 1e-6)


@small
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_gated_rms_norm(dtype):
    """The GDN output norm per head: x [M, G, N], gate a strided column slice of a wider projection output."""
    g = torch.Generator().manual_seed(7)
    M, G, N = 3, 4, 32
    x = rand(g, M, G, N, dtype=dtype)
    gate = strided_rows(g, M, G * N, dtype).view(M, G, N)
    w = rand(g, N, scale=0.5)
    out = launch_gated_rms_norm(x, gate, w, 1e-6, out=poison(M, G, N, dtype=dtype))
    check(f"gated_rms_norm {dtype}", out, gated_rms_norm(x, gate, w, 1e-6))


# ---------------------------------------------------------------------------------------------- SiLU-mul, embedding


@small
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_silu_mul(dtype):
    g = torch.Generator().manual_seed(11)
    T, I = 4, 40
    gate_up = strided_rows(g, T, 2 * I, dtype, pad=4)
    out = launch_silu_mul(gate_up, out=poison(T, I, dtype=dtype), BLOCK=16)  # 3 blocks, the last one partial
    check(f"silu_mul {dtype}", out, silu_mul(gate_up))


@small
def test_pdl_launch_computes_the_same():
    """pdl=True (the engine's launch, plugins_trt/pdl.py) leaves the result unchanged; under the interpreter the
    launch path compiles PDL off (its instructions have no interpreter form)."""
    g = torch.Generator().manual_seed(12)
    gate_up = strided_rows(g, 3, 2 * 40, torch.float32, pad=4)
    x = strided_rows(g, 3, 64, torch.float32, pad=4)
    w = torch.randn(64, generator=g)
    assert torch.equal(launch_silu_mul(gate_up, BLOCK=16, pdl=True), launch_silu_mul(gate_up, BLOCK=16))
    assert torch.equal(launch_rms_norm(x, w, 1e-6, pdl=True), launch_rms_norm(x, w, 1e-6))


@small
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=["ids_i32", "ids_i64"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_embedding(dtype, id_dtype):
    """A gather is exact; ids outside [0, V) (padding) give zero rows."""
    g = torch.Generator().manual_seed(13)
    V, H = 50, 40
    table = rand(g, V, H, dtype=dtype)
    ids = torch.tensor([3, 0, V - 1, -1, V, 17, 3], dtype=id_dtype, device=DEV)
    out = launch_embedding(table, ids, out=poison(len(ids), H, dtype=dtype), BLOCK=16)
    ref = embedding(table, ids)
    print(f"  embedding {dtype} {id_dtype}: rel err {rel(out, ref):.2e} (exact)")
    assert torch.equal(out, ref)
    assert (out[3] == 0).all() and (out[4] == 0).all()


# ---------------------------------------------------------------------------------------------- QKV RoPE + KV write

ROPE_CONFIGS = {  # Hq, Hkv, D, rotary fraction, QK-norm, norm offset, output gate, rope scaling
    "llama": dict(Hq=4, Hkv=2, D=32, partial=1.0, qk_norm=False, offset=0.0, gate=False, theta=500000.0,
                  scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}),
    "qwen3-D24": dict(Hq=4, Hkv=2, D=24, partial=1.0, qk_norm=True, offset=0.0, gate=False, theta=1e6, scaling=None),
    "qwen3.5": dict(Hq=4, Hkv=1, D=32, partial=0.25, qk_norm=True, offset=1.0, gate=True, theta=1e7, scaling=None),
}
ROPE_DTYPES = {"io_fp32-cache_fp32": (torch.float32, torch.float32),
               "io_bf16-cache_bf16": (torch.bfloat16, torch.bfloat16),
               "io_bf16-cache_fp8": (torch.bfloat16, FP8)}


def _rope_case(cfg: dict, io_dtype, cache_dtype, T: int, num_blocks: int, block_size: int, seed: int):
    """Fresh random qkv rows (strided), positions, weights, a prefilled cache and a slot mapping with padding."""
    g = torch.Generator().manual_seed(seed)
    Hq, Hkv, D = cfg["Hq"], cfg["Hkv"], cfg["D"]
    width = Hq * D * (2 if cfg["gate"] else 1) + 2 * Hkv * D
    qkv = strided_rows(g, T, width, io_dtype, pad=16)
    qkv[0, width - Hkv * D] = 10.0  # a large v value of token 0 (written): clamps at 448 in an FP8 cache
    positions = torch.randint(0, 200000, (T,), generator=g, dtype=torch.int32).to(DEV)
    positions[0] = 0
    inv_freq = rope_inv_freq(int(D * cfg["partial"]), cfg["theta"], cfg["scaling"]).to(DEV)
    norms = (rand(g, D, scale=0.5), rand(g, D, scale=0.5)) if cfg["qk_norm"] else (None, None)
    shape = (num_blocks, block_size, Hkv, D)
    fp8 = cache_dtype == FP8
    k_cache, v_cache = rand(g, *shape, dtype=cache_dtype), rand(g, *shape, dtype=cache_dtype)
    # FP8 scales that put typical k and v values in e4m3's normal range (and the planted 10.0 past 448)
    k_scale = torch.tensor([0.008 if fp8 else 1.0], device=DEV)
    v_scale = torch.tensor([0.006 if fp8 else 1.0], device=DEV)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(torch.int32)
    slots[1::3] = -1  # padding tokens
    return qkv, positions, inv_freq, norms, (k_cache, v_cache, k_scale, v_scale), slots.to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _check_cache(name: str, got: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, scale: torch.Tensor,
                 slots: torch.Tensor):
    """Written slots match the reference write; every other slot is bit-identical to before the launch."""
    Hkv, D = got.shape[2:]
    got, ref, before = (t.view(-1, Hkv, D) for t in (got, ref, before))
    written = slots[slots >= 0].long()
    others = torch.ones(got.shape[0], dtype=torch.bool, device=got.device)
    others[written] = False
    assert torch.equal(_bits(got[others]), _bits(before[others])), f"{name}: slots not written by this step changed"
    if got.dtype != FP8:
        check(f"{name} written rows", got[written], ref[written])
    else:
        report(f"{name} written rows", rel(got[written].float() * scale, ref[written].float() * scale), FP8_TOL)
        same = (_bits(got[written]) == _bits(ref[written])).float().mean().item()
        print(f"    {name}: {same:.2%} of the e4m3 bytes identical")
        assert same >= 0.99


@small
@pytest.mark.parametrize("dtypes", list(ROPE_DTYPES.values()), ids=list(ROPE_DTYPES))
@pytest.mark.parametrize("config", list(ROPE_CONFIGS), ids=list(ROPE_CONFIGS))
def test_qkv_rope_kv_write(config, dtypes):
    cfg, (io_dtype, cache_dtype) = ROPE_CONFIGS[config], dtypes
    T = 7
    qkv, positions, inv_freq, (qn, kn), (kc, vc, ks, vs), slots = _rope_case(cfg, io_dtype, cache_dtype, T, 4, 4,
                                                                          seed=len(config))
    kc_before, vc_before, qkv_before = kc.clone(), vc.clone(), qkv.clone()
    ref_layer = LayerKV(kc.clone(), vc.clone(), ks, vs)
    q_ref = qkv_rope_kv_write(qkv, positions, inv_freq, ref_layer, slots, cfg["Hq"], cfg["gate"], qn, kn, 1e-6,
                              cfg["offset"])
    q = launch_qkv_rope(qkv, positions, inv_freq, kc, vc, ks, vs, slots, cfg["Hq"], cfg["gate"], qn, kn, 1e-6,
                        cfg["offset"], out=poison(T, cfg["Hq"], cfg["D"], dtype=io_dtype))
    name = f"{config} {io_dtype}->{cache_dtype}"
    check(f"{name} q", q, q_ref)
    _check_cache(f"{name} k", kc, ref_layer.k, kc_before, ks, slots)
    _check_cache(f"{name} v", vc, ref_layer.v, vc_before, vs, slots)
    assert torch.equal(qkv, qkv_before), "qkv (and the gate in it) must stay as it was"
    if cache_dtype == FP8:  # the planted v value was clamped
        assert float(vc.view(-1, cfg["Hkv"], cfg["D"])[slots[0].long(), 0, 0].float()) == 448.0


# ---------------------------------------------------------------------------------------------- argmax


@small
@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32], ids=["out_i64", "out_i32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_argmax(dtype, out_dtype):
    """Exactly torch.argmax, ties included (lowest index), across blocks and within one."""
    g = torch.Generator().manual_seed(17)
    B, V = 6, 1000
    logits = rand(g, B, V, dtype=dtype)
    logits[1, 100] = logits[1, 700] = 9.0  # tie across blocks
    logits[2, 129] = logits[2, 130] = 9.0  # tie inside a block
    logits[3] = 0.5                        # all equal
    logits[4, V - 1] = 9.0                 # in the last, partial block
    logits[5] = float("-inf")
    out = torch.full((B,), -7, dtype=out_dtype, device=DEV)
    launch_argmax(logits, out=out, BLOCK=128)
    assert torch.equal(out.long(), torch.argmax(logits, dim=-1)), (out, torch.argmax(logits, dim=-1))


# ---------------------------------------------------------------------------------------------- sampling


def _sample(logits_row: torch.Tensor, params: list[tuple[float, int, float]], draws: int, seed: int = 1234,
            first_offset: int = 0, BLOCK: int = 1024) -> torch.Tensor:
    """`draws` tokens for each (temperature, top_k, top_p) from one row of logits, all in one launch:
    rows share the seed and take offsets first_offset, first_offset + 1, ... -> [len(params), draws].
    The logits are that row repeated with row stride 0 (the kernels take any row stride)."""
    n = len(params) * draws
    temps = torch.tensor([p[0] for p in params for _ in range(draws)], dtype=torch.float32, device=DEV)
    ks = torch.tensor([p[1] for p in params for _ in range(draws)], dtype=torch.int32, device=DEV)
    ps = torch.tensor([p[2] for p in params for _ in range(draws)], dtype=torch.float32, device=DEV)
    seeds = torch.full((n,), seed, dtype=torch.int64, device=DEV)
    offsets = torch.arange(first_offset, first_offset + n, dtype=torch.int64, device=DEV)
    logits = logits_row.expand(n, -1)
    out = torch.full((n,), -7, dtype=torch.int64, device=DEV)
    launch_sample(logits, temps, ks, ps, seeds, offsets, out=out, BLOCK=BLOCK)
    return out.view(len(params), draws).cpu()


@small
def test_sample_limits_are_greedy():
    """temperature 0 (whatever k and p), top_k 1, a tiny temperature and a tiny top_p all pick the argmax."""
    g = torch.Generator().manual_seed(19)
    B, V = 7, 300
    logits = rand(g, B, V, scale=2.0)
    best = torch.randint(0, V, (B,), generator=g).to(DEV)
    logits[torch.arange(B, device=DEV), best] = logits.max(dim=-1).values + 0.5  # a clear winner per row
    logits[6, 40] = logits[6, 250] = logits[6].max() + 1.0  # a tie: greedy takes the lower index
    params = [(0.0, 0, 1.0), (0.0, 5, 0.5), (1.0, 1, 1.0), (1e-4, 0, 1.0), (0.7, 0, 1e-6), (1.5, 1, 0.3),
              (0.0, 0, 1.0)]
    temps, ks, ps = (torch.tensor(col, device=DEV) for col in zip(*params))
    out = torch.full((B,), -7, dtype=torch.int64, device=DEV)
    launch_sample(logits, temps.float(), ks.int(), ps.float(), torch.arange(B, dtype=torch.int64, device=DEV) + 3,
                  torch.zeros(B, dtype=torch.int64, device=DEV), out=out, BLOCK=128)
    assert torch.equal(out, torch.argmax(logits, dim=-1)), (out, torch.argmax(logits, dim=-1))
    assert int(out[6]) == 40


def _assert_clear_nucleus_edge(logits: torch.Tensor, t: float, k: int, p: float):
    """top_p is not within float noise of a cumulative mass: the tests check the kept set, not rounding luck."""
    if p >= 1:
        return
    n = int((sampling_probs(logits.cpu(), t, k, p) > 0).sum())
    cum = torch.sort(sampling_probs(logits.cpu(), t, k, 1.0), descending=True).values.cumsum(0)
    assert n >= 2 and cum[n - 2] < p - 1e-3 and cum[n - 1] > p + 1e-3, "test data: top_p sits on an edge"


@small
def test_sample_stays_in_top_k_and_nucleus():
    """Over many draws, no token outside the reference's kept set (top-k, top-p, both after temperature), and every
    kept token of probability >= 0.1 is drawn (the draws are not stuck on one token)."""
    g = torch.Generator().manual_seed(23)
    V, draws = 32, 48
    logits = rand(g, V, scale=1.5)
    params = [(1.0, 5, 1.0), (1.0, 0, 0.6), (0.8, 10, 0.7)]
    got = _sample(logits, params, draws, BLOCK=16)  # two blocks a pass
    for (t, k, p), tokens in zip(params, got):
        probs = sampling_probs(logits.cpu(), t, k, p)
        kept = probs > 0
        n = int(kept.sum())
        _assert_clear_nucleus_edge(logits, t, k, p)
        outside = [tok for tok in tokens.tolist() if not kept[tok]]
        assert not outside, f"(T {t}, k {k}, p {p}): drew {outside} outside the kept set {kept.nonzero().flatten()}"
        likely = set((probs >= 0.1).nonzero().flatten().tolist())
        assert likely <= set(tokens.tolist()), f"(T {t}, k {k}, p {p}): never drew {likely - set(tokens.tolist())}"
        print(f"  T {t} k {k} p {p}: kept {n} tokens, drew {len(set(tokens.tolist()))} distinct")


def _chi2_quantile(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at the normal quantile z (3.719: p = 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@small
def test_sample_frequencies_match_reference():
    """300 draws (fixed seed) against reference.sampling_probs by a chi-square test at p = 1e-4, with temperature,
    top-k and top-p all active. The kept set, one token of p 0.49 and ten of 0.04-0.07, tells a wrong draw apart:
    the same counts fail against temperature 1 (chi2 ~70 expected), and so would drawing by argmax p·E instead of
    p / E (a sign slip in the Gumbel noise: ~77 expected), against a bound of ~36."""
    logits = torch.tensor([1.0, 0.97, 2.0, 0.94, -2.0, 0.91, 0.88, 0.2, 0.85, 0.0, 0.82, -0.5, 0.79, 0.76, -1.0, 0.73],
                          device=DEV)
    T, k, p, N = 0.5, 13, 0.95, 300
    _assert_clear_nucleus_edge(logits, T, k, p)
    tokens = _sample(logits, [(T, k, p)], N, seed=2024)[0]
    counts = torch.bincount(tokens, minlength=len(logits)).double()
    probs = sampling_probs(logits.cpu(), T, k, p).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0
    chi2 = float(((counts[kept] - N * probs[kept]) ** 2 / (N * probs[kept])).sum())
    wrong = sampling_probs(logits.cpu(), 1.0, k, p).double()[kept]
    chi2_wrong = float(((counts[kept] - N * wrong) ** 2 / (N * wrong)).sum())
    bound = _chi2_quantile(int(kept.sum()) - 1)
    print(f"  counts {counts[kept].int().tolist()} expected {[round(x, 1) for x in (N * probs[kept]).tolist()]}: "
          f"chi2 {chi2:.2f} (bound {bound:.1f}); against temperature 1: {chi2_wrong:.1f}")
    assert chi2 < bound
    assert chi2_wrong > bound


@small
def test_sample_is_a_function_of_seed_and_offset():
    """A draw depends on (seed, offset) only: shifting every row's offset by one shifts the draws by one row, the
    same launch repeats itself, another seed draws differently."""
    g = torch.Generator().manual_seed(29)
    logits = rand(g, 16)
    a = _sample(logits, [(1.0, 0, 1.0)], 24, seed=99)[0]
    assert torch.equal(a, _sample(logits, [(1.0, 0, 1.0)], 24, seed=99)[0])
    b = _sample(logits, [(1.0, 0, 1.0)], 24, seed=99, first_offset=1)[0]
    assert torch.equal(a[1:], b[:-1])
    c = _sample(logits, [(1.0, 0, 1.0)], 24, seed=100)[0]
    assert not torch.equal(a, c)


# ---------------------------------------------------------------------------------------------- interpreter


@pytest.mark.skipif(not INTERPRET, reason="checks the interpreter patches (no GPU, interpreter on)")
def test_interpreter_patches():
    """Each patched interpreter operation now agrees with torch (triton_interpreter.check_patches)."""
    check_patches()


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_interpreter_tests_in_fresh_process():
    """Another module imported triton for compilation first: rerun this module's small tests in a process that
    imports triton with TRITON_INTERPRET=1."""
    run_in_fresh_process(__file__, "not fresh_process and not aot", timeout=600)


# ---------------------------------------------------------------------------------------------- AOT for sm_90

AOT_SCRIPT = r"""
import json, re, subprocess, tempfile, time
from pathlib import Path
import triton
from atlas.build_engine.kernels import KernelSpec, compile_kernel
from atlas.plugins_trt.activation.triton_silu import silu_mul_kernel
from atlas.plugins_trt.embedding.triton_embed import embedding_kernel
from atlas.plugins_trt.rms_norm.triton_norm import norm_config, rms_norm_kernel
from atlas.plugins_trt.rope.triton_rope import qkv_rope_kernel
from atlas.plugins_trt.sampling.triton_sampling import argmax_combine_kernel, argmax_partial_kernel, sample_kernel

cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
B16, F32, I32, I64, F8 = "*bf16", "*fp32", "*i32", "*i64", "*fp8e4nv"


def spec(name, fn, types, constexprs, num_warps=4):
    if "PDL" in fn.arg_names:  # plugins_trt/pdl.py (the step's kernels; not the sampler)
        constexprs = {**constexprs, "PDL": name.endswith(".pdl")}
    sig = {a: ("constexpr" if a in constexprs else types[a]) for a in fn.arg_names}
    div = tuple(a for a, t in types.items() if t.startswith("*"))
    return KernelSpec(fn=fn, name=name, signature=sig, constexprs=constexprs, num_warps=num_warps, num_stages=1,
                      divisible_by_16=div)


def norm(name, H, offset, residual, gate):
    block, warps = norm_config(H)
    types = dict(x=B16, stride_x="i32", residual=B16, stride_r="i32", residual_out=B16, stride_ro="i32", gate=B16,
                 stride_g="i32", weight=B16, y=B16, stride_y="i32", N="i32", eps="fp32")
    return spec(name, rms_norm_kernel, types, dict(OFFSET=offset, HAS_RESIDUAL=residual, HAS_GATE=gate, BLOCK=block),
                warps)


def rope(name, Hq, Hkv, D, R, gate, qk_norm, offset, cache):
    types = dict(qkv=B16, stride_qkv="i32", positions=I32, inv_freq=F32, q_norm=B16, k_norm=B16, q_out=B16,
                 stride_qo="i32", k_cache=cache, v_cache=cache, k_scale=F32, v_scale=F32, slot_mapping=I32, eps="fp32")
    const = dict(HQ=Hq, HKV=Hkv, D=D, R=R, K_COL=Hq * D * (2 if gate else 1), BLOCK_D=D, QK_NORM=qk_norm,
                 NORM_OFFSET=offset)
    return spec(name, qkv_rope_kernel, types, const, max(1, min(D // 128, 4)))


def sample(name, logits):
    types = dict(logits=logits, stride_l="i32", temperature=F32, top_k=I32, top_p=F32, seeds=I64, offsets=I64,
                 out=I64, V="i32")
    return spec(name, sample_kernel, types, dict(BLOCK=1024))


cases = [
    norm("rms_norm.H4096", 4096, 0, False, False),
    norm("rms_norm.residual.H5120.offset1", 5120, 1, True, False),
    norm("rms_norm.residual.H8192", 8192, 0, True, False),
    norm("gated_rms_norm.D128", 128, 0, False, True),
    rope("qkv_rope.llama.D128.bf16", 32, 8, 128, 128, False, False, 0, B16),
    rope("qkv_rope.llama.D128.fp8", 32, 8, 128, 128, False, False, 0, F8),
    rope("qkv_rope.qwen35.D256.R64.fp8", 24, 4, 256, 64, True, True, 1, F8),
    spec("silu_mul", silu_mul_kernel, dict(gate_up=B16, stride_in="i32", out=B16, stride_out="i32", I="i32"),
         dict(BLOCK=1024)),
    spec("embedding.i32", embedding_kernel, dict(ids=I32, table=B16, stride_table="i32", out=B16, stride_out="i32",
                                                 V="i32", H="i32"), dict(BLOCK=1024)),
    spec("embedding.i64", embedding_kernel, dict(ids=I64, table=B16, stride_table="i32", out=B16, stride_out="i32",
                                                 V="i32", H="i32"), dict(BLOCK=1024)),
    spec("argmax_partial", argmax_partial_kernel, dict(logits=B16, stride_l="i32", part_val=F32, part_idx=I32,
                                                       V="i32", NB="i32"), dict(BLOCK=4096), 8),
    spec("argmax_combine", argmax_combine_kernel, dict(part_val=F32, part_idx=I32, out=I64, NB="i32"),
         dict(NB_P2=64), 1),
    sample("sample.bf16", B16),
    sample("sample.fp32", F32),
    # the decode step's small kernels as the engine compiles them: programmatic dependent launch
    norm("rms_norm.residual.H4096.pdl", 4096, 0, True, False),
    rope("qkv_rope.llama.D128.bf16.pdl", 32, 8, 128, 128, False, False, 0, B16),
    spec("silu_mul.pdl", silu_mul_kernel, dict(gate_up=B16, stride_in="i32", out=B16, stride_out="i32", I="i32"),
         dict(BLOCK=1024)),
    spec("embedding.i32.pdl", embedding_kernel, dict(ids=I32, table=B16, stride_table="i32", out=B16,
                                                     stride_out="i32", V="i32", H="i32"), dict(BLOCK=1024)),
    spec("argmax_partial.pdl", argmax_partial_kernel, dict(logits=B16, stride_l="i32", part_val=F32, part_idx=I32,
                                                           V="i32", NB="i32"), dict(BLOCK=4096), 8),
    spec("argmax_combine.pdl", argmax_combine_kernel, dict(part_val=F32, part_idx=I32, out=I64, NB="i32"),
         dict(NB_P2=64), 1),
]
report = {}
for s in cases:
    t = time.time()
    k = compile_kernel(s, 90)
    entry = {"seconds": round(time.time() - t, 2), "bytes": len(k.cubin), "shared": k.metadata.shared}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.cubin); f.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True).stdout
    # griddepcontrol.launch_dependents / .wait in SASS
    entry["preexit"], entry["acqbulk"] = sass.count("PREEXIT"), sass.count("ACQBULK")
    for key in ("REG", "STACK", "LOCAL"):
        m = re.search(key + r":(\d+)", usage)
        entry[key.lower()] = int(m.group(1)) if m else None
    report[s.name] = entry
print(json.dumps(report))
"""


def test_aot_compile_sm90(tmp_path):
    """Every kernel compiles for sm_90 through the build stage's KernelSpec / compile_kernel (no GPU needed), in a
    subprocess without the interpreter; none spills registers. The RoPE kernels' 32-byte stack frame is
    libdevice's __nv_cosf / __nv_sinf large-angle reduction buffer (a kernel with one tl.cos has the same), used
    only for angles past ~1e5 radians."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report) == 20
    for name, e in report.items():
        # programmatic dependent launch: launch_dependents and wait at the start of the PDL builds only
        assert (e["preexit"] > 0 and e["acqbulk"] > 0) == name.endswith(".pdl"), (name, e["preexit"], e["acqbulk"])
        print(f"  {name:34s} regs {e['reg']}  stack {e['stack']}  local {e['local']}  smem {e['shared']:>5} B  "
              f"{e['seconds']} s")
        assert e["bytes"] > 0
        assert e["local"] == 0, f"{name} spills registers"
        assert e["stack"] <= (32 if name.startswith("qkv_rope") else 0), f"{name} uses a stack frame"


# ---------------------------------------------------------------------------------------------- GPU, real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4096, 5120], ids=["H4096", "H5120"])
def test_gpu_rms_norm_real_sizes(H):
    g = torch.Generator().manual_seed(31)
    T = 64
    for offset in (0.0, 1.0):
        x, r = rand(g, T, H, dtype=torch.bfloat16), rand(g, T, H, dtype=torch.bfloat16, scale=4.0)
        w = rand(g, H, dtype=torch.bfloat16, scale=0.2)
        r_before = r.clone()
        y = launch_rms_norm(x, w, 1e-6, offset, residual=r, out=poison(T, H, dtype=torch.bfloat16))
        ref, h_ref = fused_add_rms_norm(x, r_before, w, 1e-6, offset)
        assert torch.equal(r, h_ref)
        check(f"rms_norm residual H{H} offset {offset}", y, ref)
        check(f"rms_norm H{H} offset {offset}", launch_rms_norm(x, w, 1e-6, offset), rms_norm(x, w, 1e-6, offset))


@pytest.mark.gpu
@pytest.mark.parametrize("I", [14336, 17408], ids=["I14336", "I17408"])
def test_gpu_silu_mul_real_sizes(I):
    g = torch.Generator().manual_seed(37)
    gate_up = rand(g, 64, 2 * I, dtype=torch.bfloat16)
    check(f"silu_mul I{I}", launch_silu_mul(gate_up, out=poison(64, I, dtype=torch.bfloat16)), silu_mul(gate_up))


@pytest.mark.gpu
@pytest.mark.parametrize("V,H", [(128256, 4096), (151936, 5120)], ids=["V128256-H4096", "V151936-H5120"])
def test_gpu_embedding_real_sizes(V, H):
    g = torch.Generator().manual_seed(41)
    table = rand(g, V, H, dtype=torch.bfloat16)
    ids = torch.randint(0, V, (64,), generator=g, dtype=torch.int32).to(DEV)
    ids[5], ids[9] = -1, V - 1
    out = launch_embedding(table, ids, out=poison(64, H, dtype=torch.bfloat16))
    assert torch.equal(out, embedding(table, ids))


GPU_ROPE = {
    "llama-8b": dict(Hq=32, Hkv=8, D=128, partial=1.0, qk_norm=False, offset=0.0, gate=False, theta=500000.0,
                     scaling=ROPE_CONFIGS["llama"]["scaling"]),
    "qwen3.5-27b": dict(Hq=24, Hkv=4, D=256, partial=0.25, qk_norm=True, offset=1.0, gate=True, theta=1e7,
                        scaling=None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize("model", list(GPU_ROPE))
def test_gpu_qkv_rope_real_sizes(model, cache):
    cfg = GPU_ROPE[model]
    cache_dtype = FP8 if cache == "fp8" else torch.bfloat16
    T = 64
    qkv, positions, inv_freq, (qn, kn), (kc, vc, ks, vs), slots = _rope_case(cfg, torch.bfloat16, cache_dtype, T,
                                                                          256, 16, seed=43)
    kc_before, vc_before = kc.clone(), vc.clone()
    ref_layer = LayerKV(kc.clone(), vc.clone(), ks, vs)
    q_ref = qkv_rope_kv_write(qkv, positions, inv_freq, ref_layer, slots, cfg["Hq"], cfg["gate"], qn, kn, 1e-6,
                              cfg["offset"])
    q = launch_qkv_rope(qkv, positions, inv_freq, kc, vc, ks, vs, slots, cfg["Hq"], cfg["gate"], qn, kn, 1e-6,
                        cfg["offset"], out=poison(T, cfg["Hq"], cfg["D"], dtype=torch.bfloat16))
    check(f"{model} q", q, q_ref)
    _check_cache(f"{model} {cache} k", kc, ref_layer.k, kc_before, ks, slots)
    _check_cache(f"{model} {cache} v", vc, ref_layer.v, vc_before, vs, slots)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("V", [128256, 151936], ids=["V128256", "V151936"])
def test_gpu_argmax_and_greedy_real_vocab(V, dtype):
    g = torch.Generator().manual_seed(47)
    B = 16
    logits = rand(g, B, V, dtype=dtype, scale=3.0)
    logits[0, 5] = logits[0, V - 3] = 30.0
    ref = torch.argmax(logits, dim=-1)
    assert torch.equal(launch_argmax(logits), ref)
    zeros = torch.zeros(B, device=DEV)
    greedy = launch_sample(logits, zeros, torch.zeros(B, dtype=torch.int32, device=DEV), zeros + 1,
                           torch.zeros(B, dtype=torch.int64, device=DEV), torch.zeros(B, dtype=torch.int64, device=DEV))
    assert torch.equal(greedy, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("V", [128256, 151936], ids=["V128256", "V151936"])
def test_gpu_sampling_real_vocab(V):
    """Kept sets over 2048 draws per setting, and a chi-square test of top-k 8 at T 0.8 over 8192 draws (the top 8
    logits planted so that every expected count is in the hundreds)."""
    g = torch.Generator().manual_seed(53)
    logits = rand(g, V, scale=4.0)
    params = [(1.0, 40, 1.0), (0.7, 0, 0.9), (0.8, 50, 0.8)]
    got = _sample(logits, params, 2048)
    for (t, k, p), tokens in zip(params, got):
        kept = sampling_probs(logits.cpu(), t, k, p) > 0
        assert kept[tokens].all(), f"(T {t}, k {k}, p {p}) drew outside its kept set"
    logits = rand(g, V).clamp(max=6.0)
    top = torch.randperm(V, generator=g)[:8].to(DEV)
    logits[top] = torch.tensor([10.0, 9.6, 9.3, 9.0, 8.8, 8.5, 8.2, 8.0], device=DEV)
    N = 8192
    tokens = _sample(logits, [(0.8, 8, 1.0)], N, seed=77)[0]
    probs = sampling_probs(logits.cpu(), 0.8, 8, 1.0).double()
    kept = probs > 0
    counts = torch.bincount(tokens, minlength=V).double()
    assert counts[~kept].sum() == 0
    chi2 = float(((counts[kept] - N * probs[kept]) ** 2 / (N * probs[kept])).sum())
    print(f"  V{V}: chi2 {chi2:.1f} (bound {_chi2_quantile(int(kept.sum()) - 1):.1f})")
    assert chi2 < _chi2_quantile(int(kept.sum()) - 1)
