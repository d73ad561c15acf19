"""Triton paged attention kernels (decode, chunked prefill / verify) against the torch reference.

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before the kernel
modules are imported) at tiny shapes: B 2-3, Hq 4, Hkv 2 and 1, D 64 (128 once), block_size 8 / 16 / 32, ragged
contexts crossing block boundaries (length 1 included), shuffled non-contiguous block ids. Every input is fresh
random data and every output is poisoned with NaN first; cache slots past each context and the block-table
entries past each sequence's blocks point at NaN, so a read the layout contract forbids turns the output NaN.
Errors are ‖out - ref‖ / ‖ref‖ (printed; run with -s to see them): under 1e-4 where the dots take exact operands
(fp32 q, any cache dtype, FP8 with non-unit scales included: the reference reads the same stored values), under
1e-2 with bf16 q (bf16 probabilities in the P·V product, bf16 output).

`gpu` tests run at real shapes (Llama-3.1-8B: Hq 32, Hkv 8, D 128; Qwen3.5-27B attention: Hq 24, Hkv 4, D 256 with
the output gate), contexts 512-8192, bf16 and FP8 caches, and replay the launches from CUDA graphs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, also in subprocesses
from triton_interpreter import (fix_interpreter_index, fixed_interpreter, rel, report,  # noqa: E402
                                run_in_fresh_process, skip_unless_interpreted)

NO_GPU = not torch.cuda.is_available()
if NO_GPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from atlas.plugins_trt.attention import triton_decode as _triton_decode  # noqa: E402
from atlas.plugins_trt.attention.reference import attention_with_cache, paged_attention  # noqa: E402
from atlas.plugins_trt.attention.triton_decode import (  # noqa: E402
    decode_workspace, default_num_splits, launch_paged_decode)
from atlas.plugins_trt.attention.triton_prefill import launch_paged_prefill  # noqa: E402
from atlas.runtime.kv_cache import LayerKV, quantize_kv, write_kv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-4
BF16_TOL = 1e-2
FP8 = torch.float8_e4m3fn


if os.environ.get("TRITON_INTERPRET") == "1":
    fix_interpreter_index()

# The interpreter only takes effect if it was on when triton was first imported; a module that compiles kernels
# for sm_90 may have imported it first. Then these CPU tests rerun in a fresh process instead.
INTERPRET = type(_triton_decode.paged_decode_kernel).__name__ == "InterpretedFunction"


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreted(request, INTERPRET, compiles=("sm90",))


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_cpu_tests_in_fresh_process():
    """Rerun this module's interpreter tests in a process that imports triton with TRITON_INTERPRET=1."""
    run_in_fresh_process(__file__, "not fresh_process and not sm90")


@pytest.fixture(scope="module", autouse=True)
def _fixed_interpreter():
    yield from fixed_interpreter(INTERPRET)






def poison(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


class Paged:
    """A paged cache (runtime/kv_cache.py layout) holding fresh random K / V for sequences of `ctx` tokens.

    Blocks are handed out in a shuffled order; the slots past each context in its last block, and one extra
    block that every block-table entry past a sequence's blocks points at, hold NaN (e4m3 NaN in an FP8 cache:
    the GPU reads it as NaN, Triton 3.6's interpreter as 480, still far off the data's scale, ~1 after the scale).
    Contexts <= 0 are padding rows (no blocks)."""

    def __init__(self, ctx: list[int], Hkv: int, D: int, bs: int, dtype=torch.float32, scales=(1.0, 1.0),
                 seed: int = 0, device=DEV):
        g = torch.Generator().manual_seed(seed)
        self.gen, self.device = g, device
        self.ctx, self.bs = ctx, bs
        nblk = [-(-max(c, 0) // bs) for c in ctx]
        max_blocks = max(nblk) + 1  # one column past the longest sequence: never read
        num_blocks = sum(nblk) + 2  # + one unused + the NaN block
        ids = torch.randperm(num_blocks, generator=g)
        nan_block = int(ids[-1])
        table = torch.full((len(ctx), max_blocks), nan_block, dtype=torch.int32)
        used = 0
        for b, n in enumerate(nblk):
            table[b, :n] = ids[used:used + n].int()
            used += n
        self.k_scale = torch.tensor([scales[0]], dtype=torch.float32, device=device)
        self.v_scale = torch.tensor([scales[1]], dtype=torch.float32, device=device)
        k = torch.randn(num_blocks, bs, Hkv, D, generator=g)
        v = torch.randn(num_blocks, bs, Hkv, D, generator=g)
        k[nan_block] = v[nan_block] = float("nan")
        for b, c in enumerate(ctx):  # the unused tail of each last block
            if c > 0 and c % bs:
                k[table[b, nblk[b] - 1], c % bs:] = v[table[b, nblk[b] - 1], c % bs:] = float("nan")
        # an FP8 cache stores x / scale: with scales ~0.02-0.03 the stored values span tens (inside e4m3's 448)
        self.k = quantize_kv(k, dtype, self.k_scale.cpu()).to(device)
        self.v = quantize_kv(v, dtype, self.v_scale.cpu()).to(device)
        self.block_tables = table.to(device)
        self.context_lens = torch.tensor(ctx, dtype=torch.int32, device=device)

    def rand(self, *shape, dtype=torch.float32):
        return torch.randn(*shape, generator=self.gen).to(device=self.device, dtype=dtype)

    def cache_args(self):
        return self.k, self.v, self.k_scale, self.v_scale, self.block_tables, self.context_lens


def cu_of(lens: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=DEV)


def q_and_gate(p: Paged, T: int, Hq: int, D: int, dtype, gated: bool, strided: bool):
    """q [T, Hq, D] and the gate (or None); strided: both as column views of one [T, 2·Hq·D] projection output,
    as the fused qkv projection gives them."""
    if strided:
        proj = p.rand(T, 2 * Hq * D, dtype=dtype)
        q, gate = proj[:, :Hq * D].view(T, Hq, D), proj[:, Hq * D:].view(T, Hq, D)
        return q, gate if gated else None
    return p.rand(T, Hq, D, dtype=dtype), p.rand(T, Hq, D, dtype=dtype) if gated else None


# ------------------------------------------------------------------------------------------- the reference

def test_reference_matches_contiguous_attention():
    """paged_attention over a cache written through the layout contract (write_kv at the block table's slots)
    equals the eager layer's attention_with_cache over each sequence's contiguous K / V, with and without the
    gate; decode (q_len 1), chunks over a prefix, and a whole prompt."""
    g = torch.Generator().manual_seed(5)
    Hq, Hkv, D, bs = 4, 2, 32, 8
    ctx, q_lens = [19, 1, 40, 7], [1, 1, 9, 7]
    layer = LayerKV(torch.zeros(24, bs, Hkv, D), torch.zeros(24, bs, Hkv, D), torch.ones(1), torch.ones(1))
    table = torch.randperm(24, generator=g)[:4 * 6].view(4, 6).int()
    seq_k = [torch.randn(c, Hkv, D, generator=g) for c in ctx]
    seq_v = [torch.randn(c, Hkv, D, generator=g) for c in ctx]
    for b, c in enumerate(ctx):
        pos = torch.arange(c)
        slots = (table[b, pos // bs].long() * bs + pos % bs).int()
        write_kv(layer, seq_k[b], seq_v[b], slots)
    T = sum(q_lens)
    q = torch.randn(T, Hq, D, generator=g)
    gate = torch.randn(T, Hq, D, generator=g)
    cu = torch.tensor([0, 1, 2, 11, 18], dtype=torch.int32)
    scale = D ** -0.5
    out = paged_attention(q, layer.k, layer.v, layer.k_scale, layer.v_scale, table,
                          torch.tensor(ctx, dtype=torch.int32), cu, scale)
    gated = paged_attention(q, layer.k, layer.v, layer.k_scale, layer.v_scale, table,
                            torch.tensor(ctx, dtype=torch.int32), cu, scale, gate=gate)
    for b, c in enumerate(ctx):
        r = slice(int(cu[b]), int(cu[b + 1]))
        ref = attention_with_cache(q[r], seq_k[b], seq_v[b], c - q_lens[b], scale)
        report(f"paged vs contiguous seq{b} (ctx {c}, q_len {q_lens[b]})", rel(out[r], ref), 1e-6)
        report(f"  gated seq{b}", rel(gated[r], ref * torch.sigmoid(gate[r])), 1e-6)


def test_reference_padding_gives_zeros():
    p = Paged([0, 5, -1], Hkv=1, D=16, bs=8, device="cpu")
    q = p.rand(3, 2, 16)
    out = paged_attention(q, *p.cache_args(), torch.arange(4, dtype=torch.int32), 0.25)
    assert out[0].eq(0).all() and out[2].eq(0).all() and out[1].abs().sum() > 0


# ------------------------------------------------------------------------------------------- decode

# (id, B contexts, Hq, Hkv, D, block_size, q dtype, cache dtype, (k_scale, v_scale), num_splits, gate, tol, extra)
DECODE_CASES = [
    ("B3-Hq4-Hkv2-D64-bs16-fp32-S1", [1, 37, 70], 4, 2, 64, 16, torch.float32, torch.float32, (1, 1), 1, False,
     TOL, {}),
    ("B3-Hq4-Hkv2-D64-bs16-fp32-S3-gate-strided", [70, 1, 37], 4, 2, 64, 16, torch.float32, torch.float32, (1, 1),
     3, True, TOL, {"strided": True, "workspace": 8}),
    ("B3-Hq4-Hkv1-D64-bs32-fp32-S2-gate", [33, 5, 96], 4, 1, 64, 32, torch.float32, torch.float32, (1, 1), 2, True,
     TOL, {}),
    ("B2-Hq4-Hkv2-D64-bs32-fp32-S2-tile16", [64, 40], 4, 2, 64, 32, torch.float32, torch.float32, (1, 1), 2, False,
     TOL, {"block_n": 16}),
    ("B2-Hq4-Hkv2-D128-bs16-fp32-S2", [50, 17], 4, 2, 128, 16, torch.float32, torch.float32, (1, 1), 2, False, TOL,
     {}),
    ("B3-Hq4-Hkv2-D64-bs8-fp8-S4-gate", [3, 45, 29], 4, 2, 64, 8, torch.float32, FP8, (0.02, 0.03), 4, True, TOL,
     {}),
    ("B2-Hq4-Hkv2-D64-bs16-q32-bf16cache-S2", [20, 49], 4, 2, 64, 16, torch.float32, torch.bfloat16, (1, 1), 2,
     False, TOL, {}),
    ("B3-Hq4-Hkv2-D64-bs32-bf16-S2", [1, 66, 31], 4, 2, 64, 32, torch.bfloat16, torch.bfloat16, (1, 1), 2, False,
     BF16_TOL, {}),
    ("B2-Hq4-Hkv2-D64-bs16-bf16q-fp8-S1-gate", [48, 9], 4, 2, 64, 16, torch.bfloat16, FP8, (0.02, 0.03), 1, True,
     BF16_TOL, {}),
    ("B2-Hq4-Hkv2-D64-bs16-fp16-S2", [35, 64], 4, 2, 64, 16, torch.float16, torch.float16, (1, 1), 2, False,
     BF16_TOL, {}),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_matches_reference(case):
    name, ctx, Hq, Hkv, D, bs, qdt, kvdt, scales, splits, gated, tol, extra = case
    p = Paged(ctx, Hkv, D, bs, dtype=kvdt, scales=scales, seed=len(name))
    B = len(ctx)
    q, gate = q_and_gate(p, B, Hq, D, qdt, gated, extra.get("strided", False))
    ws = decode_workspace(extra["workspace"], Hq, D, 4, DEV) if "workspace" in extra else None  # a larger bucket's
    out = launch_paged_decode(q, *p.cache_args(), D ** -0.5, gate=gate, num_splits=splits,
                              out=poison(B, Hq, D, dtype=qdt), workspace=ws, block_n=extra.get("block_n"))
    ref = paged_attention(q, *p.cache_args(), torch.arange(B + 1, dtype=torch.int32, device=DEV), D ** -0.5, gate=gate)
    assert out.dtype == qdt
    report(f"decode {name}", rel(out, ref), tol)


@pytest.mark.parametrize("case", [c for c in DECODE_CASES if c[9] > 1], ids=[c[0] for c in DECODE_CASES if c[9] > 1])
def test_decode_combine_is_the_two_stages_to_the_bit(case):
    """COMBINE (counters given): the last split program of each (sequence, kv head) combines, one launch: the two
    launches' output to the bit, gate and empty splits included; the counters are left zero, so a second launch
    (a graph replay) does it again."""
    name, ctx, Hq, Hkv, D, bs, qdt, kvdt, scales, splits, gated, tol, extra = case
    p = Paged(ctx + [0], Hkv, D, bs, dtype=kvdt, scales=scales, seed=len(name) + 1)  # and a padding row
    B = len(ctx) + 1
    q, gate = q_and_gate(p, B, Hq, D, qdt, gated, extra.get("strided", False))
    args = (q, *p.cache_args(), D ** -0.5)
    two = launch_paged_decode(*args, gate=gate, num_splits=splits, out=poison(B, Hq, D, dtype=qdt),
                              block_n=extra.get("block_n"))
    counters = torch.zeros(B * Hkv + 3, dtype=torch.int32, device=DEV)
    for _ in range(2):
        one = launch_paged_decode(*args, gate=gate, num_splits=splits, out=poison(B, Hq, D, dtype=qdt),
                                  block_n=extra.get("block_n"), counters=counters)
        assert torch.equal(one.view(torch.uint8 if qdt != torch.float32 else torch.int32),
                           two.view(torch.uint8 if qdt != torch.float32 else torch.int32)), name
        assert not counters.any()
    with pytest.raises(ValueError, match="counters must be int32"):
        launch_paged_decode(*args, gate=gate, num_splits=splits, counters=counters[:B * Hkv - 1])


# (id, contexts (0: a padding row), Hq, Hkv, D, bs, io dtype, cache dtype, (k_scale, v_scale), num_splits, combine,
#  gate, QK-norm, rotary fraction, norm offset)
ROPE_DECODE_CASES = [
    ("llama-fp32-S1", [37, 0, 70], 4, 2, 64, 16, torch.float32, torch.float32, (1, 1), 1, False, False, False, 1.0,
     0.0),
    ("llama-bf16-S3-combine", [70, 1, 0, 33], 4, 2, 64, 16, torch.bfloat16, torch.bfloat16, (1, 1), 3, True, False,
     False, 1.0, 0.0),
    ("qwen3-bf16-S2-two-launches", [45, 16], 4, 2, 64, 8, torch.bfloat16, torch.bfloat16, (1, 1), 2, False, False,
     True, 1.0, 0.0),
    ("qwen3.5-bf16-fp8-S4-combine-gate", [3, 45, 0, 29], 4, 1, 64, 8, torch.bfloat16, FP8, (0.02, 0.03), 4, True,
     True, True, 0.25, 1.0),
    ("qwen3.5-fp32-D128-S2-combine-gate", [50, 17], 6, 2, 128, 16, torch.float32, torch.float32, (1, 1), 2, True,
     True, True, 0.25, 1.0),
]


def rope_decode_pair(case, launches: int = 2):
    """One ROPE_DECODE_CASES case both ways: launch_qkv_rope then launch_paged_decode, and launch_paged_decode_rope
    (`launches` times on the same inputs, as graph replays do). Returns (fused out, two-launch out, fused caches,
    two-launch caches, torch reference out, counters)."""
    from atlas.plugins_trt.attention.triton_decode import launch_paged_decode_rope
    from atlas.plugins_trt.rope.reference import qkv_rope_kv_write, rope_inv_freq
    from atlas.plugins_trt.rope.triton_rope import launch_qkv_rope

    name, ctx, Hq, Hkv, D, bs, io, kvdt, scales, splits, combine, gated, qk_norm, partial, offset = case
    p = Paged(ctx, Hkv, D, bs, dtype=kvdt, scales=scales, seed=len(name) + 7)
    B = len(ctx)
    width = Hq * D * (2 if gated else 1) + 2 * Hkv * D
    qkv = p.rand(B, width + 8, dtype=io)[:, :width]  # strided rows, as the projection's output view
    table = p.block_tables.cpu()
    slots = torch.tensor([int(table[b, (c - 1) // bs]) * bs + (c - 1) % bs if c > 0 else -1 for b, c in enumerate(ctx)],
                         dtype=torch.int32, device=DEV)
    positions = torch.tensor([max(c - 1, 0) for c in ctx], dtype=torch.int32, device=DEV)
    inv_freq = rope_inv_freq(int(D * partial), 1e6, None).to(DEV)
    norms = dict(q_norm=p.rand(D, dtype=io) * 0.5, k_norm=p.rand(D, dtype=io) * 0.5) if qk_norm else {}
    rope = dict(has_gate=gated, **norms, eps=1e-6, norm_offset=offset)
    counters = torch.zeros(B * Hkv, dtype=torch.int32, device=DEV) if combine else None

    k2, v2 = p.k.clone(), p.v.clone()
    q = launch_qkv_rope(qkv, positions, inv_freq, k2, v2, p.k_scale, p.v_scale, slots, Hq, **rope)
    gate = qkv[:, Hq * D:2 * Hq * D].view(B, Hq, D) if gated else None
    two = launch_paged_decode(q, k2, v2, p.k_scale, p.v_scale, p.block_tables, p.context_lens, D ** -0.5, gate=gate,
                              num_splits=splits, out=poison(B, Hq, D, dtype=io), counters=counters)
    k1, v1 = p.k.clone(), p.v.clone()
    outs = [launch_paged_decode_rope(qkv, positions, inv_freq, slots, k1, v1, p.k_scale, p.v_scale, p.block_tables,
                                     p.context_lens, D ** -0.5, Hq, **rope, num_splits=splits,
                                     out=poison(B, Hq, D, dtype=io), counters=counters) for _ in range(launches)]
    assert all(torch.equal(o, outs[0]) for o in outs), f"{name}: a second launch gave other output"
    ref_layer = LayerKV(p.k.clone(), p.v.clone(), p.k_scale, p.v_scale)
    q_ref = qkv_rope_kv_write(qkv, positions, inv_freq, ref_layer, slots, Hq, gated, norms.get("q_norm"),
                              norms.get("k_norm"), 1e-6, offset)
    ref = paged_attention(q_ref, ref_layer.k, ref_layer.v, p.k_scale, p.v_scale, p.block_tables, p.context_lens,
                          torch.arange(B + 1, dtype=torch.int32, device=DEV), D ** -0.5, gate=gate)
    with pytest.raises(TypeError, match="takes the gate from qkv"):
        launch_paged_decode_rope(qkv, positions, inv_freq, slots, k1, v1, p.k_scale, p.v_scale, p.block_tables,
                                 p.context_lens, D ** -0.5, Hq, **rope, gate=gate)
    return outs[0], two, (k1, v1), (k2, v2), ref, counters


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("case", ROPE_DECODE_CASES, ids=[c[0] for c in ROPE_DECODE_CASES])
def test_decode_rope_is_qkv_rope_then_decode_to_the_bit(case):
    """launch_paged_decode_rope (QK-norm, RoPE and the K / V write inside the decode launch) against
    launch_qkv_rope then launch_paged_decode: the output and both caches to the bit, twice (the counters back at
    zero), padding rows (slot -1, context 0) zero; the output near the torch reference too."""
    name, ctx, io = case[0], case[1], case[6]
    one, two, caches1, caches2, ref, counters = rope_decode_pair(case)
    assert same_bits(one, two), name
    assert all(same_bits(a, b) for a, b in zip(caches1, caches2)), f"{name}: the caches differ"
    assert counters is None or not counters.any()
    assert all(one[b].eq(0).all() for b, c in enumerate(ctx) if c <= 0)
    report(f"decode+rope {name}", rel(one, ref), TOL if io == torch.float32 else BF16_TOL)


@pytest.mark.parametrize("splits", [1, 3], ids=["S1", "S3"])
def test_decode_padding_rows_are_zero(splits):
    """context_lens <= 0 marks a padding row (a CUDA-graph bucket's unused slots): output zeros, block-table row
    not read (here it points at NaN only)."""
    p = Paged([0, 41, -1], Hkv=2, D=64, bs=16, seed=3)
    q, gate = p.rand(3, 4, 64), p.rand(3, 4, 64)
    out = launch_paged_decode(q, *p.cache_args(), 0.125, gate=gate, num_splits=splits, out=poison(3, 4, 64))
    ref = paged_attention(q, *p.cache_args(), torch.arange(4, dtype=torch.int32, device=DEV), 0.125, gate=gate)
    assert out[0].eq(0).all() and out[2].eq(0).all()
    report(f"decode with padding rows S{splits}", rel(out, ref))


def test_default_num_splits():
    """Few long sequences split (up to 32 ways, no split under 64 tokens, about two waves of programs); a full batch
    does not."""
    assert default_num_splits(1, 8, 8192) == 32
    assert default_num_splits(1, 8, 768) == 12  # 768 / 64
    assert default_num_splits(2, 8, 2048) == 17  # two waves of 132 SMs over 16 (sequence, kv head) pairs
    assert default_num_splits(2, 8, 2048, min_split_tokens=256) == 8  # 2048 / 256
    assert default_num_splits(64, 8, 8192) == 1  # 512 programs already fill 132 SMs
    assert default_num_splits(4, 1, 100) == 2 and default_num_splits(4, 1, 64) == 1  # no split under 64 tokens


# ------------------------------------------------------------------------------------------- prefill / verify

# (id, cached prefixes, q lens, Hq, Hkv, D, block_size, q dtype, cache dtype, scales, gate, max_q_len hint, tol,
#  extra)
PREFILL_CASES = [
    ("chunk-B3-Hq4-Hkv2-D64-bs16-fp32", [20, 0, 33], [5, 1, 12], 4, 2, 64, 16, torch.float32, torch.float32,
     (1, 1), False, None, TOL, {}),
    ("chunk-B2-Hq4-Hkv1-D64-bs32-fp32-gate-strided", [40, 7], [30, 19], 4, 1, 64, 32, torch.float32, torch.float32,
     (1, 1), True, 30, TOL, {"strided": True}),
    ("verify-B3-Hq4-Hkv2-D64-bs16-fp32-gate", [30, 1, 64], [2, 3, 4], 4, 2, 64, 16, torch.float32, torch.float32,
     (1, 1), True, 4, TOL, {}),
    ("verify-B2-Hq4-Hkv2-D128-bs32-fp32", [70, 15], [3, 3], 4, 2, 128, 32, torch.float32, torch.float32, (1, 1),
     False, 3, TOL, {}),
    ("decode-B3-Hq4-Hkv2-D64-bs8-fp32-tile16", [0, 16, 40], [1, 1, 1], 4, 2, 64, 8, torch.float32, torch.float32,
     (1, 1), False, 1, TOL, {"block_n": 16}),
    ("chunk-B2-Hq4-Hkv2-D64-bs16-fp8-gate", [25, 3], [9, 14], 4, 2, 64, 16, torch.float32, FP8, (0.02, 0.03), True,
     None, TOL, {}),
    ("verify-B2-Hq4-Hkv2-D64-bs32-bf16", [50, 31], [4, 2], 4, 2, 64, 32, torch.bfloat16, torch.bfloat16, (1, 1),
     False, 4, BF16_TOL, {}),
    ("chunk-B2-Hq4-Hkv1-D64-bs16-bf16q-fp8-gate", [17, 0], [8, 20], 4, 1, 64, 16, torch.bfloat16, FP8, (0.02, 0.03),
     True, 20, BF16_TOL, {}),
    ("verify-B2-Hq4-Hkv2-D64-bs16-fp16q-fp8", [33, 12], [3, 2], 4, 2, 64, 16, torch.float16, FP8, (0.02, 0.03), False,
     3, BF16_TOL, {}),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
def test_prefill_matches_reference(case):
    name, prefix, q_lens, Hq, Hkv, D, bs, qdt, kvdt, scales, gated, max_q_len, tol, extra = case
    ctx = [a + n for a, n in zip(prefix, q_lens)]  # context_lens count the new tokens too
    p = Paged(ctx, Hkv, D, bs, dtype=kvdt, scales=scales, seed=len(name))
    T = sum(q_lens)
    q, gate = q_and_gate(p, T, Hq, D, qdt, gated, extra.get("strided", False))
    cu = cu_of(q_lens)
    out = launch_paged_prefill(q, *p.cache_args(), cu, D ** -0.5, gate=gate, max_q_len=max_q_len,
                               out=poison(T, Hq, D, dtype=qdt), block_n=extra.get("block_n"))
    ref = paged_attention(q, *p.cache_args(), cu, D ** -0.5, gate=gate)
    assert out.dtype == qdt
    report(f"prefill {name}", rel(out, ref), tol)


def test_prefill_tile_sizes_agree():
    """Every tile shape gives the reference's result: BLOCK_M 16 (4 queries × 4 heads a tile), 32 and 64 with
    16-key tiles, over a whole prompt and chunks after prefixes of 16..19 tokens, so that query tiles start at
    every position modulo the key tile (the edge between the unmasked and the causal loop)."""
    prefix, q_lens = [0, 16, 17, 18, 19], [45, 21, 21, 21, 21]
    p = Paged([a + n for a, n in zip(prefix, q_lens)], Hkv=1, D=64, bs=16, seed=9)
    T = sum(q_lens)
    q, cu = p.rand(T, 4, 64), cu_of(q_lens)
    ref = paged_attention(q, *p.cache_args(), cu, 0.125)
    for block_m in (16, 32, 64):
        out = launch_paged_prefill(q, *p.cache_args(), cu, 0.125, out=poison(T, 4, 64), block_m=block_m,
                                   block_n=16)
        report(f"prefill BLOCK_M {block_m}", rel(out, ref))


def test_prefill_padding_sequences_are_zero():
    """Sequences with context_lens <= 0 (verify padding) get zeros, their block-table rows not read; a query
    placed before position 0 (context_lens 2 for 3 queries: positions -1, 0, 1) sees no key and gets zeros while
    the others of its tile attend."""
    p = Paged([0, 23, -1, 2], Hkv=2, D=64, bs=16, seed=4)
    q_lens = [3, 3, 3, 3]
    q, gate, cu = p.rand(12, 4, 64), p.rand(12, 4, 64), cu_of(q_lens)
    out = launch_paged_prefill(q, *p.cache_args(), cu, 0.125, gate=gate, max_q_len=3, out=poison(12, 4, 64))
    ref = paged_attention(q, *p.cache_args(), cu, 0.125, gate=gate)
    assert out[:3].eq(0).all() and out[6:10].eq(0).all() and out[10:].ne(0).all()
    report("verify with padding sequences", rel(out, ref))


# ------------------------------------------------------------------------------------------- sm_90 build

AOT_SCRIPT = r"""
import json, re, subprocess, tempfile
from pathlib import Path
import torch, triton
from atlas.plugins_trt.attention import triton_decode as TD, triton_prefill as TP
from atlas.plugins_trt.quant_linear.triton_gemv import compile_aot

cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
bf, f8 = torch.bfloat16, torch.float8_e4m3fn
cases = {  # Llama-3.1-8B's attention (Hq 32, Hkv 8, D 128), block_size 16
    "decode.bf16": TD.signature_paged_decode(32, 8, 128, 16, bf),
    "decode.fp8": TD.signature_paged_decode(32, 8, 128, 16, f8),
    "decode.direct.bf16.gate": TD.signature_paged_decode(32, 8, 128, 16, bf, has_gate=True, direct=True),
    "decode_reduce.gate": TD.signature_paged_decode_reduce(32, 128, 16, has_gate=True),
    "prefill.bf16": TP.signature_paged_prefill(32, 8, 128, 16, bf),
    "prefill.fp8": TP.signature_paged_prefill(32, 8, 128, 16, f8),
    "prefill.verify.fp8.gate": TP.signature_paged_prefill(32, 8, 128, 16, f8, has_gate=True, block_m=16),
    # Qwen3.5-27B's attention (Hq 24, Hkv 4, D 256, output gate)
    "qwen3.5.decode.fp8.gate": TD.signature_paged_decode(24, 4, 256, 16, f8, has_gate=True),
    "qwen3.5.prefill.bf16.gate": TP.signature_paged_prefill(24, 4, 256, 16, bf, has_gate=True),
    # as the engine compiles the decode step's: programmatic dependent launch (plugins_trt/pdl.py)
    "decode.bf16.pdl": TD.signature_paged_decode(32, 8, 128, 16, bf, pdl=True),
    "decode.combine.gate.pdl": TD.signature_paged_decode(24, 4, 256, 16, bf, has_gate=True, pdl=True, combine=True),
    "decode_reduce.pdl": TD.signature_paged_decode_reduce(32, 128, 16, pdl=True),
    # pdl.WAIT_FIRST (2): wait, then let the next kernel launch
    "decode.combine.wait_first.pdl": TD.signature_paged_decode(32, 8, 128, 16, bf, pdl=2, combine=True),
    # QK-norm, RoPE and the K / V write inside (launch_paged_decode_rope), as the engines' decode steps launch it
    "decode.rope.combine.pdl": TD.signature_paged_decode(32, 8, 128, 16, bf, pdl=True, combine=True,
                                                         rope=dict(R=128, K_COL=4096, QK_NORM=False, NORM_OFFSET=0)),
    "decode.rope.fp8.combine.gate.pdl": TD.signature_paged_decode(
        24, 4, 256, 16, torch.float8_e4m3fn, has_gate=True, pdl=True, combine=True,
        rope=dict(R=64, K_COL=2 * 24 * 256, QK_NORM=True, NORM_OFFSET=1)),
}
report = {}
for name, sig in cases.items():
    k = compile_aot(sig)
    entry = {"cubin": len(k.asm["cubin"]), "smem": k.metadata.shared, "scratch": k.metadata.global_scratch_size}
    lines = k.asm["ptx"].splitlines()
    atoms = [i for i, line in enumerate(lines) if "atom." in line]
    entry["atoms"] = [lines[i].strip() for i in atoms]
    # the partials' stores, then a CTA barrier, then the atomic
    last = lambda what, i: max((j for j in range(i) if what in lines[j]), default=-1)
    entry["barrier_before_atom"] = all(last("st.global", i) < last("bar.sync", i) for i in atoms)
    entry["cg_loads"] = sum("ld.global.cg" in line for line in lines)
    wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), 0)  # what runs before it
    entry["before_wait"] = {op: sum(op in line for line in lines[:wait])
                            for op in ("ld.global", "st.global", "atom.", "prefetch.global.L2")}
    if cuobjdump.exists():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"]); f.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
            sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True).stdout
        entry["pdl"] = "PREEXIT" in sass and "ACQBULK" in sass  # griddepcontrol.launch_dependents / .wait
        entry["wait_first"] = entry["pdl"] and sass.index("ACQBULK") < sass.index("PREEXIT")
        for key in ("REG", "STACK", "LOCAL"):
            m = re.search(key + r":(\d+)", usage)
            entry[key.lower()] = int(m.group(1)) if m else None
    report[name] = entry
print(json.dumps(report))
"""


@pytest.mark.slow
def test_kernels_compile_for_sm90(tmp_path):
    """Decode (split and direct), its reduce and prefill / verify compile to sm_90 cubins for Llama-3.1-8B's
    attention in bf16 and FP8 (and Qwen3.5-27B's, D 256) with no GPU, without register spills (in a fresh process
    without TRITON_INTERPRET: kernels decorated under the interpreter cannot be compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json
    report_ = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, e in report_.items():
        print(f"  {name:26s} regs {e.get('reg')}  stack {e.get('stack')}  local(spill) {e.get('local')}  "
              f"smem {e['smem']} B  cubin {e['cubin']} B")
        assert e["cubin"] > 0 and e["scratch"] == 0, name
        assert e.get("local") in (0, None), f"{name} spills registers to local memory"
        assert e.get("pdl", name.endswith(".pdl")) == name.endswith(".pdl"), name
        # plugins_trt/pdl.py: the default order lets the next kernel launch, then waits; WAIT_FIRST the other way
        assert e.get("wait_first", ".wait_first" in name) == (".wait_first" in name), name
        if name.startswith(("decode.", "qwen3.5.decode.")) and name.endswith(".pdl"):
            # before the PDL wait only the step's inputs (context length, block table) are read and the split's K / V
            # lines prefetched into L2: nothing the kernel before may still be writing is loaded, nothing is written
            b = e["before_wait"]
            assert b["ld.global"] == 2 and b["st.global"] == b["atom."] == 0 and b["prefetch.global.L2"] == 2, (name, b)
        if ".combine" in name:  # the split counter: one acq_rel GPU-scope atomic by one thread after a CTA barrier,
            # the partials read back past L1
            assert len(e["atoms"]) == 1 and e["atoms"][0].startswith("@"), e["atoms"]
            assert "atom.global.gpu.acq_rel.add" in e["atoms"][0] and e["barrier_before_atom"] and e["cg_loads"], name
        else:
            assert not e["atoms"] and not e["cg_loads"], name


# ------------------------------------------------------------------------------------------- GPU, real shapes

MODELS = {"llama3.1-8b": (32, 8, 128, False), "qwen3.5-27b": (24, 4, 256, True)}  # Hq, Hkv, D, output gate
KV_DTYPES = {"bf16": (torch.bfloat16, (1.0, 1.0)), "fp8": (FP8, (0.02, 0.03))}


@pytest.mark.gpu
@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("model", list(MODELS))
def test_gpu_decode_real_shapes(model, kv):
    Hq, Hkv, D, gated = MODELS[model]
    kvdt, scales = KV_DTYPES[kv]
    ctx = [512, 3001, 8192, 1, 0, 1337]
    p = Paged(ctx, Hkv, D, 16, dtype=kvdt, scales=scales, seed=1)
    B = len(ctx)
    q = p.rand(B, Hq, D, dtype=torch.bfloat16)
    gate = p.rand(B, Hq, D, dtype=torch.bfloat16) if gated else None
    ref = paged_attention(q, *p.cache_args(), torch.arange(B + 1, dtype=torch.int32, device=DEV), D ** -0.5,
                          gate=gate)
    counters = torch.zeros(B * Hkv, dtype=torch.int32, device=DEV)
    for splits in (None, 1, 16):
        out = launch_paged_decode(q, *p.cache_args(), D ** -0.5, gate=gate, num_splits=splits,
                                  out=poison(B, Hq, D, dtype=torch.bfloat16))
        report(f"{model} {kv} decode splits {splits or 'default'}", rel(out, ref), BF16_TOL)
        for _ in range(3):  # the one-launch combine: the same bits, every time (the counters back at zero)
            one = launch_paged_decode(q, *p.cache_args(), D ** -0.5, gate=gate, num_splits=splits,
                                      out=poison(B, Hq, D, dtype=torch.bfloat16), counters=counters)
            assert torch.equal(one.view(torch.int16), out.view(torch.int16)) and not counters.any()


@pytest.mark.gpu
@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("model", list(MODELS))
def test_gpu_prefill_and_verify_real_shapes(model, kv):
    Hq, Hkv, D, gated = MODELS[model]
    kvdt, scales = KV_DTYPES[kv]
    for what, prefix, q_lens in (("chunk", [0, 4096, 7680], [512, 1000, 512]),
                                 ("verify", [511, 8188, 2999, 0], [4, 4, 4, 4])):
        ctx = [a + n for a, n in zip(prefix, q_lens)]
        p = Paged(ctx, Hkv, D, 16, dtype=kvdt, scales=scales, seed=2)
        T = sum(q_lens)
        q = p.rand(T, Hq, D, dtype=torch.bfloat16)
        gate = p.rand(T, Hq, D, dtype=torch.bfloat16) if gated else None
        cu = cu_of(q_lens)
        out = launch_paged_prefill(q, *p.cache_args(), cu, D ** -0.5, gate=gate, max_q_len=max(q_lens),
                                   out=poison(T, Hq, D, dtype=torch.bfloat16))
        ref = paged_attention(q, *p.cache_args(), cu, D ** -0.5, gate=gate)
        report(f"{model} {kv} {what}", rel(out, ref), BF16_TOL)


GPU_ROPE_CASES = [  # real shapes, contexts 640 / 4096 split and combined, bf16 and FP8 caches
    ("llama3.1-8b-bf16-S4", [640, 4096, 0, 17], 32, 8, 128, 16, torch.bfloat16, torch.bfloat16, (1, 1), 4, True,
     False, False, 1.0, 0.0),
    ("llama3.1-8b-fp8-S1", [640, 1], 32, 8, 128, 16, torch.bfloat16, FP8, (0.02, 0.03), 1, False, False, False,
     1.0, 0.0),
    ("qwen3.5-27b-bf16-S8", [640, 4096, 0], 24, 4, 256, 16, torch.bfloat16, torch.bfloat16, (1, 1), 8, True, True,
     True, 0.25, 1.0),
    ("qwen3.5-27b-fp8-S2", [4096, 640], 24, 4, 256, 16, torch.bfloat16, FP8, (0.02, 0.03), 2, True, True, True,
     0.25, 1.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_ROPE_CASES, ids=[c[0] for c in GPU_ROPE_CASES])
def test_gpu_decode_rope_real_shapes(case):
    """The fused decode (QK-norm, RoPE, K / V write inside) against qkv_rope then decode on the GPU. Without
    QK-norm the same bits (elementwise operations only); with it, the RMS's sum may be reduced in another order
    by the two kernels' layouts: then the caches' written rows and the output are compared by error ratio, and the
    fraction of identical bits is reported."""
    name, qk_norm = case[0], case[12]
    one, two, caches1, caches2, ref, counters = rope_decode_pair(case, launches=3)
    assert counters is None or not counters.any()
    report(f"decode+rope {name} vs reference", rel(one, ref), BF16_TOL)
    if not qk_norm:
        assert same_bits(one, two), name
        assert all(same_bits(a, b) for a, b in zip(caches1, caches2)), f"{name}: the caches differ"
        return
    print(f"    {name}: {(one.view(torch.int16) == two.view(torch.int16)).float().mean().item():.2%} of the output's "
          f"bits identical to the two launches'")
    report(f"decode+rope {name} vs two launches", rel(one, two), BF16_TOL)
    for a, b in zip(caches1, caches2):
        report(f"decode+rope {name} cache vs two launches", rel(a.float().nan_to_num(), b.float().nan_to_num()),
               BF16_TOL)


@pytest.mark.gpu
def test_gpu_launches_replay_from_cuda_graphs():
    """Decode and verify captured once over static buffers, replayed after the lengths and block tables change
    on the device, give the eager results (no host read of device values in the launchers)."""
    Hq, Hkv, D = 32, 8, 128
    p = Paged([900, 4000, 17, 2048], Hkv, D, 16, dtype=torch.bfloat16, seed=3)
    B = 4
    q = p.rand(B, Hq, D, dtype=torch.bfloat16)
    qv = p.rand(4 * B, Hq, D, dtype=torch.bfloat16)
    cu = cu_of([4] * B)
    out, out_v = poison(B, Hq, D, dtype=torch.bfloat16), poison(4 * B, Hq, D, dtype=torch.bfloat16)
    ws = decode_workspace(B, Hq, D, 8, DEV)
    args = p.cache_args()
    launch_paged_decode(q, *args, D ** -0.5, num_splits=8, out=out, workspace=ws)  # compile outside the capture
    launch_paged_prefill(qv, *args, cu, D ** -0.5, max_q_len=4, out=out_v)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_paged_decode(q, *args, D ** -0.5, num_splits=8, out=out, workspace=ws)
        launch_paged_prefill(qv, *args, cu, D ** -0.5, max_q_len=4, out=out_v)
    # sequences swap block-table rows (b takes 3 - b's), with lengths inside the blocks they now hold (3 - b's
    # were 2048, 17, 4000, 900 tokens) and one padding row
    p.block_tables.copy_(p.block_tables.flip(0))
    p.context_lens.copy_(torch.tensor([2000, 12, 0, 900], dtype=torch.int32))
    q.copy_(p.rand(B, Hq, D, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    report("graph decode", rel(out, paged_attention(q, *args, torch.arange(B + 1, dtype=torch.int32, device=DEV),
                                                     D ** -0.5)), BF16_TOL)
    report("graph verify", rel(out_v, paged_attention(qv, *args, cu, D ** -0.5)), BF16_TOL)
