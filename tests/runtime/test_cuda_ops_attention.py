"""CudaOps.attention (the attention layer of the GPU step) against ReferenceOps.attention, through the JIT kernels.

A decode step takes the one-launch decode (QK-norm, RoPE and the K/V write inside, splits combined through the
counters) with a padding row; a prefill step (two chunks over cached prefixes, packed by cu_q) takes qkv_rope then the
varlen prefill kernel. Both from a cache already holding the sequences' earlier tokens (random K/V), as a later token
or chunk finds it. Checked: the output of the real rows within an error ratio; the slots the step writes within it too
(cache values); every other slot of the cache bit-identical to before; the split counters back at zero.

Without a GPU the kernels run in Triton's interpreter in fp32 (FP32_TOL); on a GPU also in bf16 (BF16_TOL). Like
test_cuda_ops_gdn.py this module never turns the interpreter on for the process that imports it: without a GPU,
test_cpu_tests_in_fresh_process reruns its tests in a process started with TRITON_INTERPRET=1, unless triton already
runs interpreted here. Run with -s to see the error ratios.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, also in subprocesses
from triton_interpreter import fix_interpreter_index, rel, run_in_fresh_process, skip_unless_interpreted  # noqa: E402

NO_GPU = not torch.cuda.is_available()

pytest.importorskip("triton")

from atlas.plugins_trt.attention import triton_decode  # noqa: E402
from atlas.runtime.block_manager import BlockManager  # noqa: E402
from atlas.runtime.config import ATTENTION, ModelConfig  # noqa: E402
from atlas.runtime.cuda_ops import CudaOps  # noqa: E402
from atlas.runtime.kv_cache import LayerKV  # noqa: E402
from atlas.runtime.paged_model import ReferenceOps  # noqa: E402
from atlas.runtime.step import StepBatch, StepInputs  # noqa: E402

DEV = "cpu" if NO_GPU else "cuda"
FP32_TOL, BF16_TOL = 1e-4, 2e-2
BLOCK, BLOCKS, MAX_BLOCKS = 8, 40, 12

if os.environ.get("TRITON_INTERPRET") == "1":
    fix_interpreter_index()

INTERPRET = type(triton_decode.paged_decode_kernel).__name__ == "InterpretedFunction"


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreted(request, INTERPRET)


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_cpu_tests_in_fresh_process():
    run_in_fresh_process(__file__, "not fresh_process", timeout=600)


def _config(kind: str) -> ModelConfig:
    """One attention layer: Llama's (full rotary, no QK-norm or gate) or Qwen3.5's (partial rotary, (1+w) QK-norm,
    the sigmoid output gate)."""
    common = dict(family="test", vocab_size=16, hidden_size=64, intermediate_size=16, num_layers=1,
                  layer_types=(ATTENTION,), num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6)
    if kind == "llama":
        return ModelConfig(**common, rotary_dim=32, rope_theta=500000.0)
    return ModelConfig(**common, rotary_dim=8, rope_theta=1e7, norm_offset=1.0, qk_norm=True, attn_output_gate=True)


DTYPES = [pytest.param(torch.float32, id="fp32"),
          pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.gpu)]


def _compare(kind: str, act: torch.dtype, cached: list[int], new: list[int], pad_to: int | None, splits: int,
             seed: int, pad_tokens_to: int | None = None) -> None:
    """Sequences holding `cached` tokens bring `new` tokens each: CudaOps on DEV against ReferenceOps on the CPU.
    pad_tokens_to: the step laid out over that many rows, those past the last sequence in none (a prefill graph's
    tier)."""
    c = _config(kind)
    g = torch.Generator().manual_seed(seed)
    step = _step(cached, new, pad_to, "cpu", pad_tokens_to)
    shape = (BLOCKS, BLOCK, c.num_kv_heads, c.head_dim)
    k, v = torch.randn(shape, generator=g).to(act), torch.randn(shape, generator=g).to(act)
    T = step.input_ids.numel()
    qkv = torch.randn(T, c.qkv_size, generator=g).to(act)
    norms = (torch.randn(c.head_dim, generator=g).to(act) * 0.5,
             torch.randn(c.head_dim, generator=g).to(act) * 0.5) if c.qk_norm else (None, None)
    one = torch.ones(1)

    ref_kv = LayerKV(k.clone(), v.clone(), one, one)
    ref = ReferenceOps(c).attention(qkv, ref_kv, step, *norms)
    dev_kv = LayerKV(k.to(DEV), v.to(DEV), one.to(DEV), one.to(DEV))
    ops = CudaOps(c, None, device=DEV, num_splits=splits, pdl=False, max_batch=8)
    out = ops.attention(qkv.to(DEV), dev_kv, _step(cached, new, pad_to, DEV, pad_tokens_to),
                        *(n.to(DEV) if n is not None else None for n in norms))

    tol = FP32_TOL if act == torch.float32 else BF16_TOL
    real = sum(new)  # padding rows: the reference leaves zeros, the kernels too (context 0)
    assert out.shape == (T, c.q_size) and out.dtype == act
    err = rel(out[:real], ref[:real])
    print(f"  {kind} {act} out: rel err {err:.2e} (tol {tol:.0e})")
    assert err < tol
    written = step.slot_mapping[step.slot_mapping >= 0].long()
    others = torch.ones(BLOCKS * BLOCK, dtype=torch.bool)
    others[written] = False
    for name, got, want, before in (("k", dev_kv.k, ref_kv.k, k), ("v", dev_kv.v, ref_kv.v, v)):
        got, want, before = (t.reshape(BLOCKS * BLOCK, -1).cpu() for t in (got, want, before))
        err = rel(got[written], want[written])
        print(f"  {kind} {act} written {name}: rel err {err:.2e}")
        assert err < tol
        assert torch.equal(got[others], before[others]), f"{name}: a slot the step does not write changed"
    assert not ops.decode_counters.any()


def _step(cached: list[int], new: list[int], pad_to: int | None, device, pad_tokens_to: int | None = None) -> StepInputs:
    """Sequences 0.. holding `cached` tokens (their blocks taken in order from a fresh pool) bring `new` tokens."""
    blocks = BlockManager(BLOCKS, BLOCK)
    for s, n in enumerate(cached):
        if n:
            blocks.extend(s, n)
    return StepInputs.build(StepBatch(tuple(range(len(new))), tuple((1,) * n for n in new)), blocks, MAX_BLOCKS,
                            device=device, pad_to=pad_to, pad_tokens_to=pad_tokens_to)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kind", ["llama", "qwen3.5"])
@pytest.mark.parametrize("splits", [1, 3], ids=["S1", "S3-combine"])
def test_decode_step_matches_the_reference(kind, act, splits):
    """Three sequences (contexts 20, 1 and 37 after the step) of one new token each in a bucket of four (row 3:
    padding, slot -1, context 0): launch_paged_decode_rope."""
    _compare(kind, act, [19, 0, 36], [1, 1, 1], 4, splits, seed=splits)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kind", ["llama", "qwen3.5"])
def test_prefill_chunks_match_the_reference(kind, act):
    """A 13-token chunk after 9 cached tokens beside a first chunk of 6: qkv_rope then the varlen prefill."""
    _compare(kind, act, [9, 0], [13, 6], None, 1, seed=7)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kind", ["llama", "qwen3.5"])
def test_prefill_chunk_padded_to_a_tier_matches_the_reference(kind, act):
    """A 13-token chunk after 9 cached tokens laid out over 32 rows (a prefill graph's tier; rows 13.. in no
    sequence, slot -1, the attention tile picked for 32): the real rows as the reference's, no other slot written."""
    step = _step([9], [13], None, "cpu", 32)
    assert step.input_ids.numel() == 32 and step.cu_q.tolist() == [0, 13] and step.max_q_len == 32
    _compare(kind, act, [9], [13], None, 1, seed=8, pad_tokens_to=32)
