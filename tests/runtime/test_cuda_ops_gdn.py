"""CudaOps.gdn (the Gated DeltaNet layer of the GPU step) against ReferenceOps.gdn, through the JIT kernels.

A decode step (the fused recurrent kernel; one padding row of state slot -1) and prefill steps (conv varlen, the
chunked delta rule over a padded chunk plan, the gated norm; sequences packed by cu_q) run from random non-zero
windows and states, as a sequence's later chunk or token does. Checked: the outputs of the real rows and the states
of their slots within an error ratio ‖out - ref‖ / ‖ref‖; their windows bit-identical to the reference's (a window
holds copies of the raw inputs); every other slot bit-identical to before.

Without a GPU the kernels run in Triton's interpreter in fp32, to FP32_TOL (only the order of fp32 operations
differs). On a GPU the same steps also run in the engine's dtypes (bf16 activations, conv weight and windows; fp32
states, A_log, dt_bias, norm weight) to BF16_TOL, the bound tests/plugins_trt/test_gdn_triton.py holds these kernels
to in bf16.

TRITON_INTERPRET=1 must hold when triton is first imported, and every kernel decorated under it cannot be compiled
afterwards; other modules of tests/runtime compile kernels for sm_90 in their process. So this module never turns
the interpreter on for the process that imports it: without a GPU, test_cpu_tests_in_fresh_process reruns its
tests in a process started with the variable set (before the kernel modules are imported), unless triton already
runs interpreted here (tests/plugins_trt/test_gdn_triton.py imported it first), in which case they run in place.
Run with -s to see the error ratios.
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

from atlas.plugins_trt.gated_delta_net import triton_recurrent  # noqa: E402
from atlas.runtime.block_manager import BlockManager  # noqa: E402
from atlas.runtime.config import GDN, ModelConfig  # noqa: E402
from atlas.runtime.cuda_ops import CudaOps  # noqa: E402
from atlas.runtime.paged_model import PagedGDN, ReferenceOps  # noqa: E402
from atlas.runtime.state_pool import StatePool  # noqa: E402
from atlas.runtime.step import StepBatch, StepInputs  # noqa: E402

DEV = "cpu" if NO_GPU else "cuda"
FP32_TOL, BF16_TOL = 1e-4, 2e-2
SLOTS = 6


if os.environ.get("TRITON_INTERPRET") == "1":
    fix_interpreter_index()

INTERPRET = type(triton_recurrent.gdn_recurrent_kernel).__name__ == "InterpretedFunction"


@pytest.fixture(autouse=True)
def _interpreter_or_fresh_process(request):
    skip_unless_interpreted(request, INTERPRET)


@pytest.mark.skipif(not NO_GPU or INTERPRET, reason="the interpreter tests run in this process")
def test_cpu_tests_in_fresh_process():
    run_in_fresh_process(__file__, "not fresh_process", timeout=600)


# One GDN layer at the shapes of the kernel tests: HK 2, HV 4, DK 16, DV 32, conv width 4 (C = 192).
CONFIG = ModelConfig(family="test", vocab_size=16, hidden_size=16, intermediate_size=16, num_layers=1,
                     layer_types=(GDN,), num_heads=1, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rotary_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=32, linear_conv_kernel=4)

DTYPES = [pytest.param(torch.float32, id="fp32"),
          pytest.param(torch.bfloat16, id="bf16-engine-dtypes", marks=pytest.mark.gpu)]


def _weights(act: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A GDN layer's tensors in the engine's dtypes (runtime/cuda_engine.py): the conv weight in act, the vectors
    fp32."""
    c = CONFIG

    def rand(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    return {"gdn.conv.weight": rand(c.gdn_conv_size, c.linear_conv_kernel, scale=0.5, dtype=act),
            "gdn.A_log": rand(c.linear_num_value_heads, scale=0.5), "gdn.dt_bias": rand(c.linear_num_value_heads),
            "gdn.norm.weight": rand(c.linear_value_head_dim)}


def _layer(weights: dict[str, torch.Tensor], device) -> PagedGDN:
    weights = {k: v.to(device) for k, v in weights.items()}
    return PagedGDN(CONFIG, weights, "gdn", linear=lambda w, prefix: None)  # the projections are not the op's


def _pool(act: torch.dtype, gen: torch.Generator):
    """A layer of the state pool with random windows and states in every slot (sequences past their first chunk)."""
    pool = StatePool(CONFIG, SLOTS, dtype=act).layers[0]
    pool.window.copy_(torch.randn(pool.window.shape, generator=gen))
    pool.state.copy_(torch.randn(pool.state.shape, generator=gen) * 0.3)
    return pool


def _step(lens: list[int], slots: list[int], pad_to: int | None, device, pad_tokens_to: int | None = None) -> StepInputs:
    batch = StepBatch(tuple(range(len(lens))), tuple((0,) * n for n in lens), tuple(slots))
    return StepInputs.build(batch, BlockManager(64, 16), 16, device=device, pad_to=pad_to,
                            pad_tokens_to=pad_tokens_to)





def _run_and_compare(act: torch.dtype, lens: list[int], slots: list[int], pad_to: int | None, seed: int,
                     pad_tokens_to: int | None = None):
    """CudaOps.gdn on DEV and ReferenceOps.gdn on the CPU over the same step; compares what the step owns.
    pad_tokens_to: the step laid out over that many rows, those past the last sequence in none."""
    gen = torch.Generator().manual_seed(seed)
    weights = _weights(act, gen)
    pool_cpu = _pool(act, gen)
    step_cpu = _step(lens, slots, pad_to, "cpu", pad_tokens_to)
    T = step_cpu.input_ids.numel()
    proj = torch.randn(T, CONFIG.gdn_in_proj_size, generator=gen).to(act)  # proj: [T, q | k | v | z | b | a]
    before_window, before_state = pool_cpu.window.clone(), pool_cpu.state.clone()

    pool = StatePool(CONFIG, SLOTS, dtype=act, device=DEV).layers[0]
    pool.window.copy_(before_window)
    pool.state.copy_(before_state)
    out = CudaOps(CONFIG, None, device=DEV).gdn(proj.to(DEV), _layer(weights, DEV), pool,
                                                _step(lens, slots, pad_to, DEV, pad_tokens_to))
    ref = ReferenceOps(CONFIG).gdn(proj, _layer(weights, "cpu"), pool_cpu, step_cpu)

    tol = FP32_TOL if act == torch.float32 else BF16_TOL
    assert out.shape == (T, CONFIG.gdn_value_size) and out.dtype == act
    real = sum(lens)  # the rows of the real sequences (padding rows are left unwritten by both)
    err = rel(out[:real], ref[:real])
    print(f"  o rows 0..{real - 1}: rel err {err:.2e} (tol {tol:.0e})")
    assert err < tol
    for s in slots:
        err = rel(pool.state[s], pool_cpu.state[s])
        print(f"  state slot {s}: rel err {err:.2e} (tol {tol:.0e})")
        assert err < tol
        assert torch.equal(pool.window[s].cpu(), pool_cpu.window[s]), f"window of slot {s}"
    others = [s for s in range(SLOTS) if s not in slots]
    assert torch.equal(pool.state[others].cpu(), before_state[others]), "a slot the step does not own changed"
    assert torch.equal(pool.window[others].cpu(), before_window[others]), "a window the step does not own changed"


@pytest.mark.parametrize("act", DTYPES)
def test_decode_step_with_a_padding_row_matches_the_reference(act):
    """Three sequences of one token each in a bucket of four (row 3: state slot -1) take the fused decode kernel."""
    step = _step([1, 1, 1], [4, 0, 2], 4, "cpu")
    assert step.state_slots.tolist() == [4, 0, 2, -1] and step.max_q_len == 1
    _run_and_compare(act, [1, 1, 1], [4, 0, 2], 4, seed=0)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("lens,slots", [([70, 5], [3, 1]), ([1, 6, 64], [5, 0, 2])],
                         ids=["T70-T5", "T1-T6-T64"])
def test_prefill_chunks_continue_from_their_slots(act, lens, slots):
    """Later prompt chunks packed by cu_q: 70 tokens (past one 64-token chunk) beside 5 (whose second chunk row in
    the padded plan is empty); a decode token beside two chunks (max_q_len > 1 takes this path for all three).
    The conv, the chunked delta rule and the gated norm."""
    _run_and_compare(act, lens, slots, None, seed=1)


@pytest.mark.parametrize("act", DTYPES)
def test_prefill_chunk_padded_to_a_tier_matches_the_reference(act):
    """A 70-token chunk laid out over 128 rows (a prefill graph's tier: rows 70.. in no sequence; max_q_len 128 sizes
    the chunk plan, two chunk rows of which hold tokens): the real rows, the slot's state and window as the
    reference's, no other slot touched."""
    step = _step([70], [3], None, "cpu", 128)
    assert step.input_ids.numel() == 128 and step.cu_q.tolist() == [0, 70] and step.max_q_len == 128
    _run_and_compare(act, [70], [3], None, seed=2, pad_tokens_to=128)
