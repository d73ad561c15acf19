"""The build records the decode path's kernel instances by calling the runtime's launchers on meta tensors, compiles
them for sm_90, and the runtime's AotKernels then finds every one of them through the same launcher calls.

Shapes: a Llama-3.1-8B-like step (hidden 4096, intermediate 14336, vocab 128256, Hq 32, Hkv 8, D 128) with a bf16
KV cache (decode split over the context: stage 1 + reduce; a prefill chunk) and an FP8 one (direct decode; a
verify of 4 tokens), and a Qwen3.5-like one (hidden 5120, vocab 248320, Hq 24, Hkv 4, D 256, output gate, QK-norm
with offset 1, rotary 64 of 256, the GDN gated norm) with an FP8 cache. Activations bf16, block_size 16.

Compilation runs in a subprocess without TRITON_INTERPRET (kernels decorated under the interpreter, as
tests/plugins_trt turn it on, cannot be compiled), with its own Triton cache so that the time is real; the rest
runs here, whichever way the kernels were decorated: recording and looking up never run a kernel. This module
imports triton only inside its tests, so that collecting it does not decide how tests/plugins_trt import it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("needs triton (the `test` extra)", allow_module_level=True)

META = "meta"
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


@dataclass(frozen=True)
class Model:
    hidden: int
    intermediate: int
    vocab: int
    Hq: int
    Hkv: int
    D: int
    rotary: int
    gate: bool
    """Attention output gate (a block of Hq·D columns after q in the qkv rows)."""
    qk_norm: bool
    norm_offset: float
    gdn_heads: int = 0
    """GDN value heads whose output goes through the gated norm (0: no GDN layers)."""
    gdn_dim: int = 0


LLAMA = Model(4096, 14336, 128256, 32, 8, 128, 128, gate=False, qk_norm=False, norm_offset=0.0)
QWEN35 = Model(5120, 17408, 248320, 24, 4, 256, 64, gate=True, qk_norm=True, norm_offset=1.0, gdn_heads=48,
               gdn_dim=128)


@dataclass(frozen=True)
class Scenario:
    model: Model
    kv_dtype: torch.dtype
    num_splits: int
    """Decode splits over the context (1: the direct form, no reduce)."""
    max_q_len: int
    """Tokens per sequence of the prefill / verify step (it picks the prefill tile)."""


SCENARIOS = {
    "llama-bf16": Scenario(LLAMA, BF16, num_splits=4, max_q_len=64),
    "llama-fp8": Scenario(LLAMA, FP8, num_splits=1, max_q_len=4),
    "qwen3.5-fp8": Scenario(QWEN35, FP8, num_splits=2, max_q_len=64),
}
BATCH, BLOCK_SIZE, NUM_BLOCKS, MAX_BLOCKS = 4, 16, 512, 64


def meta(*shape, dtype=BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=META)


def run_step(s: Scenario, aot) -> None:
    """One decode step (B = 4) and one prefill / verify step (2 sequences of max_q_len tokens) of one layer,
    through every launcher of the decode path, on meta tensors, as the runtime's ops call them."""
    from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
    from atlas.plugins_trt.attention.triton_decode import launch_paged_decode
    from atlas.plugins_trt.attention.triton_prefill import launch_paged_prefill
    from atlas.plugins_trt.embedding.triton_embed import launch_embedding
    from atlas.plugins_trt.rms_norm.triton_norm import launch_gated_rms_norm, launch_rms_norm
    from atlas.plugins_trt.rope.triton_rope import launch_qkv_rope
    from atlas.plugins_trt.sampling.triton_sampling import launch_argmax, launch_sample

    m, B, i32, f32 = s.model, BATCH, torch.int32, torch.float32
    q_size = m.Hq * m.D
    qkv_cols = q_size * (2 if m.gate else 1) + 2 * m.Hkv * m.D
    k_cache, v_cache = (meta(NUM_BLOCKS, BLOCK_SIZE, m.Hkv, m.D, dtype=s.kv_dtype) for _ in range(2))
    k_scale, v_scale = meta(1, dtype=f32), meta(1, dtype=f32)
    inv_freq = meta(m.rotary // 2, dtype=f32)
    q_norm, k_norm = (meta(m.D), meta(m.D)) if m.qk_norm else (None, None)
    block_tables, norm_w = meta(B, MAX_BLOCKS, dtype=i32), meta(m.hidden)

    def attention(T: int, context_lens, cu_q=None):
        qkv = meta(T, qkv_cols)
        q = launch_qkv_rope(qkv, meta(T, dtype=i32), inv_freq, k_cache, v_cache, k_scale, v_scale, meta(T, dtype=i32),
                            m.Hq, has_gate=m.gate, q_norm=q_norm, k_norm=k_norm, eps=1e-6, norm_offset=m.norm_offset,
                            aot=aot)
        gate = qkv[:, q_size:2 * q_size].view(T, m.Hq, m.D) if m.gate else None  # a column slice, as the runtime
        if cu_q is None:
            return launch_paged_decode(q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens,
                                       m.D ** -0.5, gate=gate, num_splits=s.num_splits, aot=aot)
        return launch_paged_prefill(q, k_cache, v_cache, k_scale, v_scale, block_tables[:2], context_lens, cu_q,
                                    m.D ** -0.5, gate=gate, max_q_len=s.max_q_len, aot=aot)

    # decode
    h = launch_embedding(meta(m.vocab, m.hidden), meta(B, dtype=i32), aot=aot)
    launch_rms_norm(h, norm_w, 1e-6, m.norm_offset, aot=aot)
    attention(B, meta(B, dtype=i32))
    launch_rms_norm(meta(B, m.hidden), norm_w, 1e-6, m.norm_offset, residual=h, aot=aot)
    launch_silu_mul(meta(B, 2 * m.intermediate), aot=aot)
    if m.gdn_heads:  # the GDN output norm: x and its gate z are column slices of one projection output
        width = m.gdn_heads * m.gdn_dim
        proj = meta(B, 2 * width + 64)
        launch_gated_rms_norm(proj[:, :width], proj[:, width:2 * width], meta(m.gdn_dim, dtype=f32), 1e-6, aot=aot)
    logits = meta(B, m.vocab)
    launch_argmax(logits, aot=aot)
    launch_sample(logits, meta(B, dtype=f32), meta(B, dtype=i32), meta(B, dtype=f32), meta(B, dtype=torch.int64),
                  meta(B, dtype=torch.int64), aot=aot)
    # prefill chunk / verify: 2 sequences of max_q_len tokens
    attention(2 * s.max_q_len, meta(2, dtype=i32), cu_q=meta(3, dtype=i32))


def record_all(aot) -> None:
    for s in SCENARIOS.values():
        run_step(s, aot)


LAUNCHERS = 11  # per run_step: embedding, 2 norms, rope + decode (+ reduce), silu, 2 argmax, sample, rope + prefill

# ------------------------------------------------------------------------------------------- the sm_90 build

BUILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import test_recorded_kernels as T
from atlas.build_engine.kernels import write_kernels
from atlas.build_engine.recorded_kernels import KernelRecorder, compile_recorded

recorder = KernelRecorder()
T.record_all(recorder)
t0 = time.perf_counter()
compiled, instances = compile_recorded(recorder, 90)
seconds = time.perf_counter() - t0
table = write_kernels(compiled, sys.argv[2])
grids = {key: [list(g) for g in inst.grids] for key, inst in recorder.instances.items()}
print(json.dumps({"table": table, "instances": instances, "grids": grids, "seconds": seconds}))
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(kernels dir, table, instances, grids per key) of the scenarios' instances compiled for sm_90."""
    out = tmp_path_factory.mktemp("recorded")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(out / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", BUILD, str(Path(__file__).parent), str(out / "kernels")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  compiled {len(result['instances'])} instances in {result['seconds']:.1f} s")
    return out, result["table"], result["instances"], result["grids"]


class FakeTable:
    """The engine's KernelTable (loaded and checked from the build's cubins) with the CUDA launch replaced by a
    record of the call, after the checks a launch would make: argument count and each argument's kind and dtype."""

    def __init__(self, table):
        self.table = table
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def launch(self, name, grid, *args):
        from atlas.plugins_trt.launch import pointer_type

        params = self.table.params(name)
        assert len(args) == len(params), f"{name}: {len(args)} args for {len(params)} params"
        for (param, ty), arg in zip(params, args):
            if ty.startswith("*"):
                assert arg is None or isinstance(arg, torch.Tensor), f"{name}.{param}: {type(arg)}"
                assert pointer_type(arg) == ty, f"{name}.{param}: {pointer_type(arg)} for {ty}"
            else:
                assert isinstance(arg, (int, float)) and not isinstance(arg, torch.Tensor), f"{name}.{param}"
                assert isinstance(arg, float) == (ty == "fp32"), f"{name}.{param}: {arg!r} for {ty}"
        self.calls.append((name, tuple(grid) + (1,) * (3 - len(grid))))


@pytest.mark.slow
def test_recorded_instances_compile_and_the_runtime_finds_each(engine):
    """Every recorded instance compiled once under a unique name; replaying the same launcher calls through
    AotKernels over the loaded table finds an instance for every launch, with the build's parameters and grid,
    and uses every compiled instance."""
    from atlas.build_engine.recorded_kernels import KernelRecorder
    from atlas.plugins_trt.launch import AotKernels
    from atlas.runtime.kernels import KernelTable

    out, table, instances, grids = engine
    assert table["arch"] == 90 and set(table["kernels"]) == set(instances.values())
    assert len(set(instances.values())) == len(instances)
    recorder = KernelRecorder()  # the same calls in this process (JIT or interpreter functions alike)
    record_all(recorder)
    assert set(recorder.instances) == set(instances)
    assert sum(i.launches for i in recorder.instances.values()) == LAUNCHERS * len(SCENARIOS) + sum(
        s.num_splits > 1 for s in SCENARIOS.values()) + 1  # + the reduce stages + Qwen3.5's gated norm

    fake = FakeTable(KernelTable.load(out, table, arch=90))  # checks every cubin's sha256 against the table
    record_all(AotKernels(fake, instances))
    assert len(fake.calls) == sum(i.launches for i in recorder.instances.values())
    by_name = {name: key for key, name in instances.items()}
    for name, grid in fake.calls:
        assert list(grid) in [g + [1] * (3 - len(g)) for g in grids[by_name[name]]], (name, grid)
    assert {name for name, _ in fake.calls} == set(table["kernels"])  # nothing compiled that is never launched
    for name, entry in table["kernels"].items():  # the table holds what was recorded
        inst = recorder.instances[by_name[name]]
        assert entry["params"] == [list(p) for p in inst.params]
        assert entry["divisible_by_16"] == list(inst.divisible_by_16) and entry["constexprs"] == inst.constexprs
        assert entry["num_warps"] == inst.num_warps and entry["num_stages"] == inst.num_stages
        assert entry["grid"] == list(inst.grids[0]) + [1] * (3 - len(inst.grids[0]))


def test_an_instance_the_engine_lacks_says_rebuild():
    """A launch the build did not record (another hidden size; other activation dtype) is an EngineError that
    names the instance and says to rebuild, raised before anything is launched."""
    from atlas.build_engine.recorded_kernels import KernelRecorder
    from atlas.plugins_trt.launch import AotKernels
    from atlas.plugins_trt.rms_norm.triton_norm import launch_rms_norm
    from atlas.runtime.errors import EngineError

    recorder = KernelRecorder()
    launch_rms_norm(meta(4, 4096), meta(4096), 1e-6, aot=recorder)
    launched = []
    aot = AotKernels(type("Table", (), {"launch": lambda self, *a: launched.append(a)})(),
                     {key: inst.name for key, inst in recorder.instances.items()})
    launch_rms_norm(meta(4, 4096), meta(4096), 1e-6, aot=aot)
    assert len(launched) == 1
    for x, w in ((meta(4, 2048), meta(2048)), (meta(4, 4096, dtype=torch.float16), meta(4096))):
        with pytest.raises(EngineError, match="rebuild it with atlas-build --device cuda") as err:
            launch_rms_norm(x, w, 1e-6, aot=aot)
        assert "no compiled rms_norm_kernel" in str(err.value) and "rms_norm_kernel(BLOCK=4096" in str(err.value)
    assert len(launched) == 1


def test_recorded_signature_of_decode_and_norm():
    """The recorded types and alignment of known kernels: split decode over a bf16 cache agrees with the
    hand-written AOT signature (signature_paged_decode) in every type and constexpr; views are unaligned."""
    from atlas.build_engine.recorded_kernels import KernelRecorder
    from atlas.plugins_trt.attention.triton_decode import signature_paged_decode

    recorder = KernelRecorder()
    run_step(SCENARIOS["llama-bf16"], recorder)
    by_kernel: dict[str, list] = {}
    for inst in recorder.instances.values():
        by_kernel.setdefault(inst.kernel, []).append(inst)

    (decode,) = by_kernel["paged_decode_kernel"]
    hand = signature_paged_decode(32, 8, 128, BLOCK_SIZE, BF16)
    assert decode.params == hand.params
    assert decode.constexprs == hand.constexprs and decode.constexprs["DIRECT"] is False
    pointers = [n for n, ty in decode.params if ty.startswith("*")]
    assert set(decode.divisible_by_16) == set(pointers) - {"q", "gate", "out"}
    assert decode.grids == [(BATCH, 8, 4)] and (decode.num_warps, decode.num_stages) == (4, 3)
    assert dict(decode.params)["k_cache"] == "*bf16" and dict(decode.params)["sm_scale"] == "fp32"

    plain, residual = sorted(by_kernel["rms_norm_kernel"], key=lambda i: i.constexprs["HAS_RESIDUAL"])
    assert residual.constexprs == dict(OFFSET=0, HAS_RESIDUAL=True, HAS_GATE=False, BLOCK=4096, PDL=False)
    assert residual.params == [("x", "*bf16"), ("stride_x", "i32"), ("residual", "*bf16"), ("stride_r", "i32"),
                               ("residual_out", "*bf16"), ("stride_ro", "i32"), ("gate", "*bf16"),
                               ("stride_g", "i32"), ("weight", "*bf16"), ("y", "*bf16"), ("stride_y", "i32"),
                               ("N", "i32"), ("eps", "fp32")]
    assert residual.divisible_by_16 == ("weight",) and residual.num_warps == 8
    assert plain.grids == residual.grids == [(BATCH, 1)]

    (embed,) = by_kernel["embedding_kernel"]
    assert dict(embed.params)["ids"] == "*i32" and embed.divisible_by_16 == ("ids",)
    (combine,) = by_kernel["argmax_combine_kernel"]
    assert combine.constexprs == {"NB_P2": 32, "PDL": False} and dict(combine.params)["out"] == "*i64"  # cdiv(128256, 4096) = 32


# ------------------------------------------------------------------------------------------- the recorder


def _probe_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe_kernel(x, y, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + offs, mask=offs < n)
        if FLAG:
            v = v * scale
        tl.store(y + offs, v, mask=offs < n)

    return probe_kernel


def test_recorder_types_alignment_and_merging():
    from atlas.build_engine.recorded_kernels import KernelRecorder, KernelRecordError

    fn = _probe_kernel()
    rec = KernelRecorder()
    cx = dict(BLOCK=128, FLAG=True)
    x, y = meta(1024, dtype=torch.float32), meta(1024, dtype=torch.float32)
    rec.launch(fn, cx, 4, 1, (8,), (x, y, 1000, 0.5))
    rec.launch(fn, cx, 4, 1, (8,), (x, y, 2 ** 40, 2.0))  # the same instance: n widens to i64
    rec.launch(fn, cx, 4, 1, (9,), (x, None, True, 0.5), unaligned=("y",))  # None, bool: another instance
    rec.launch(fn, cx, 4, 1, (8,), (x[1:], y, 1, 0.5), unaligned=("x",))  # an odd view where it is allowed
    assert len(rec) == 2
    first, null = rec.instances.values()
    assert first.params == [("x", "*fp32"), ("y", "*fp32"), ("n", "i64"), ("scale", "fp32")]
    assert first.divisible_by_16 == ("y",)  # the last call called x unaligned: every call site's promise holds
    assert first.grids == [(8,)] and first.launches == 3
    assert null.params == [("x", "*fp32"), ("y", "*i8"), ("n", "i32"), ("scale", "fp32")]
    assert null.divisible_by_16 == ("x",) and null.key.endswith("[*fp32,*i8]")
    assert rec.launch(fn, cx, 4, 1, (8,), (x.half(), y, 1, 0.5)) is None and len(rec) == 3  # dtype: a new key
    assert first.kernel_spec().signature == {"x": "*fp32", "y": "*fp32", "n": "i64", "scale": "fp32",
                                             "BLOCK": "constexpr", "FLAG": "constexpr"}

    with pytest.raises(KernelRecordError, match=r"missing \['FLAG'\]"):
        rec.launch(fn, dict(BLOCK=128), 4, 1, (8,), (x, y, 1, 0.5))
    with pytest.raises(KernelRecordError, match="3 run-time arguments for the 4"):
        rec.launch(fn, cx, 4, 1, (8,), (x, y, 1))
    with pytest.raises(KernelRecordError, match="not 16-byte aligned"):
        rec.launch(fn, cx, 4, 1, (8,), (x[1:], y, 1, 0.5))
    with pytest.raises(KernelRecordError, match="unaligned names"):
        rec.launch(fn, cx, 4, 1, (8,), (x, y, 1, 0.5), unaligned=("z",))
    with pytest.raises(KernelRecordError, match="recorded as i64 and as fp32"):
        rec.launch(fn, cx, 4, 1, (8,), (x, y, 1.0, 0.5))
    with pytest.raises(KernelRecordError, match="argument scale"):
        rec.launch(fn, cx, 4, 1, (8,), (x, y, 1, "0.5"))
