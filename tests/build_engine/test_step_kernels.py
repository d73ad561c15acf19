"""The step kernels an engine built for cuda carries (build_engine/step_kernels.py): recorded from the model runner's
own steps, compiled for sm_90 on the CPU, and found again by the runtime's lookups for every step it launches; for an
attention-only model (tiny-qwen3) and a hybrid one (tiny-qwen3.5: Gated DeltaNet layers, their recurrent-state pool)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from atlas.build_engine.builder import BuildConfig, build
from atlas.build_engine.step_kernels import _meta_linear, _meta_weights
from atlas.plugins_trt.launch import AotKernels
from atlas.runtime.config import ATTENTION, GDN, ModelConfig
from atlas.runtime.cuda_engine import loaded_dtype
from atlas.runtime.cuda_ops import CudaOps
from atlas.runtime.errors import EngineError
from atlas.runtime.kv_cache import KV_DTYPES, KVCache
from atlas.runtime.model_runner import RunnerOptions, step_shapes, synthetic_step
from atlas.runtime.paged_model import PagedModel
from atlas.runtime.state_pool import StatePool


class _Table:
    """Stands in for a KernelTable: records which compiled kernels a step launches."""

    def __init__(self, entries: dict):
        self.entries = entries
        self.launched: list[str] = []

    def launch(self, name, grid, *args):
        assert len(args) == len(self.entries[name]["params"]), name
        self.launched.append(name)


@pytest.fixture(scope="module", params=["bfloat16", "fp8"])
def built(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("step") / "e"
    result = build(BuildConfig("synthetic:tiny-qwen3", out, device="cuda", autotune=False, onnx=False,
                               kv_cache_dtype=request.param, max_batch=8, max_seq_len=1024, progress=False))
    return result.manifest


@pytest.fixture(scope="module")
def built_hybrid(tmp_path_factory):
    out = tmp_path_factory.mktemp("step-hybrid") / "e"
    result = build(BuildConfig("synthetic:tiny-qwen3.5", out, device="cuda", autotune=False, onnx=False,
                               max_batch=4, max_seq_len=1024, progress=False))
    return out, result.manifest


def _run_runner_steps(manifest: dict, shapes: list[tuple[int, int]]) -> list[str]:
    """Run the runner's steps of each (sequences, tokens a sequence) shape on meta tensors through the engine's
    instance lookups (AotKernels over a stand-in table); returns the table names launched, in order."""
    plan = manifest["step_kernels"]
    options = RunnerOptions(**plan["options"])
    config = ModelConfig.from_dict(manifest["config"])
    table = _Table(manifest["kernels"]["kernels"])
    ops = CudaOps(config, AotKernels(table, plan["instances"]), device="meta")
    model = PagedModel(config, _meta_weights(config), ops=ops, linear=_meta_linear)
    dtype = KV_DTYPES[options.kv_cache_dtype]
    attn_layers = sum(kind == ATTENTION for kind in config.layer_types)
    kv = KVCache.allocate(attn_layers, 1, options.block_size, config.num_kv_heads, config.head_dim, dtype,
                          device="meta", scales=[(1.0, 1.0)] * attn_layers if options.kv_cache_dtype == "fp8" else None)
    # as ModelRunner: a state slot per sequence of the largest bucket (hybrid models)
    states = StatePool(config, options.buckets[-1], device="meta") if GDN in config.layer_types else None
    for batch, q_len in shapes:
        bucket = next(b for b in options.buckets if b >= batch)
        ops.num_splits = options.num_splits(config, bucket)
        ops.argmax(model.forward(synthetic_step(batch, q_len, options, "meta"), kv, states))
    return table.launched


def test_every_step_the_runner_launches_finds_its_kernels(built):
    plan = built["step_kernels"]
    config = ModelConfig.from_dict(built["config"])
    options = RunnerOptions(**plan["options"])
    # and shapes between the recorded ones
    launched = _run_runner_steps(built, step_shapes(options) + [(1, 7), (3, 1), (1, 300)])
    assert set(launched) == set(plan["instances"].values())  # every compiled kernel is used
    # the decode step of a long context splits it at small batch, the splits combined in the same launch (COMBINE:
    # no second, reducing launch)
    decode = [k for k in plan["instances"] if k.startswith("paged_decode_kernel(")]
    assert any("COMBINE=True" in k for k in decode)
    # ... and QK-norm, RoPE and the K / V write happen inside it (launch_paged_decode_rope); qkv_rope_kernel serves
    # the prefill steps only
    assert decode and all("ROPE=True" in k for k in decode)
    assert not any(k.startswith("paged_decode_reduce_kernel") for k in plan["instances"])
    assert config.qk_norm and any(n.startswith("qkv_rope_kernel") for n in launched)
    # the step's small kernels are compiled for programmatic dependent launch, the wait-first order by default
    # (plugins_trt/pdl.py WAIT_FIRST = PDL=2)
    small = ("embedding_kernel", "rms_norm_kernel", "qkv_rope_kernel", "paged_decode_kernel", "silu_mul_kernel",
             "argmax_partial_kernel", "argmax_combine_kernel")
    keys = [k for k in plan["instances"] if k.startswith(small)]
    assert {k.split("(")[0] for k in keys} == set(small) and all("PDL=2" in k for k in keys)


def test_no_pdl_records_plain_instances(built):
    """--no-pdl (RunnerOptions.pdl False): the same kernels, every one compiled for a plain launch."""
    from atlas.build_engine.step_kernels import record_step_kernels

    config = ModelConfig.from_dict(built["config"])
    options = RunnerOptions(**{**built["step_kernels"]["options"], "pdl": False})
    keys = list(record_step_kernels(config, options).instances)
    assert keys and not any("PDL=True" in k or "PDL=2" in k for k in keys)
    assert {k.split("(")[0] for k in keys} == {k.split("(")[0] for k in built["step_kernels"]["instances"]}


def test_pdl_launch_first_records_its_instances(built):
    """RunnerOptions.pdl LAUNCH_FIRST (atlas-build --pdl-launch-first): the same kernels, the small ones compiled
    with PDL=True (plugins_trt/pdl.py: let the next kernel launch, then wait), none with the default order."""
    from atlas.build_engine.step_kernels import record_step_kernels
    from atlas.plugins_trt.pdl_order import LAUNCH_FIRST

    config = ModelConfig.from_dict(built["config"])
    options = RunnerOptions(**{**built["step_kernels"]["options"], "pdl": LAUNCH_FIRST})
    keys = list(record_step_kernels(config, options).instances)
    assert not any("PDL=2" in k for k in keys)
    assert any(k.startswith("paged_decode_kernel(") and "PDL=True" in k for k in keys)
    assert {k.split("(")[0] for k in keys} == {k.split("(")[0] for k in built["step_kernels"]["instances"]}


GDN_STEP_KERNELS = {"gdn_recurrent_kernel",  # decode: conv + gating + delta rule + gated norm, fused
                    "conv_varlen_kernel", "chunk_wy_sliced_kernel", "chunk_state_kernel", "chunk_out_kernel"}  # prefill


def test_every_step_of_a_hybrid_model_finds_its_kernels(built_hybrid):
    """Decode buckets (padded), prefill tiers, lengths between them and several prompts packed in one prefill step
    (as ModelRunner.step runs them): every GDN and attention launch finds the instance the build compiled."""
    _, manifest = built_hybrid
    plan = manifest["step_kernels"]
    config = ModelConfig.from_dict(manifest["config"])
    assert GDN in config.layer_types and ATTENTION in config.layer_types
    options = RunnerOptions(**plan["options"])
    launched = _run_runner_steps(manifest, step_shapes(options) + [(3, 1), (1, 7), (1, 300), (3, 33), (2, 70)])
    assert set(launched) == set(plan["instances"].values())  # every compiled kernel is used
    kernels = {n.split(".")[0] for n in launched}
    assert GDN_STEP_KERNELS <= kernels, GDN_STEP_KERNELS - kernels
    # the GDN output norm (gated, plain weight) beside the decoder's (1 + w) norms
    assert any(k.startswith("rms_norm_kernel(") and "HAS_GATE=True" in k for k in plan["instances"])
    # the fused GDN decode is compiled for programmatic dependent launch (plugins_trt/pdl.py, wait-first)
    decode = [k for k in plan["instances"] if k.startswith("gdn_recurrent_kernel(")]
    assert decode and all("PDL=2" in k for k in decode)


_ST_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
"""safetensors header dtype -> torch dtype (the float dtypes an unquantized engine stores)."""


def test_meta_weights_are_the_hybrid_engines_tensors_as_the_gpu_loads_them(built_hybrid):
    """The build records the step over tensors of the shapes and dtypes runtime/cuda_engine.py puts on the GPU
    (fp32 GDN A_log, dt_bias and norm weight: the recorded instances' pointer types depend on them)."""
    path, manifest = built_hybrid
    config = ModelConfig.from_dict(manifest["config"])
    quantized = {p for p, f in manifest.get("weight_formats", {}).items() if f in ("nvfp4", "fp8")}
    stored = {}  # name -> (shape, dtype) from the files' headers
    for name in manifest["weights"]:
        with safe_open(str(path / name), "pt") as f:
            for k in f.keys():
                header = f.get_slice(k)
                stored[k] = (tuple(header.get_shape()), _ST_DTYPES[header.get_dtype()])
    meta = _meta_weights(config)
    assert any(k.endswith(".gdn.A_log") for k in meta)
    for key, t in meta.items():
        assert key in stored, f"{key} is not an engine tensor"
        shape, dtype = stored[key]
        assert (tuple(t.shape), t.dtype) == (shape, loaded_dtype(key, dtype, quantized)), key


def test_a_shape_the_build_did_not_record_asks_for_a_rebuild(built):
    plan = built["step_kernels"]
    config = ModelConfig.from_dict(built["config"])
    options = RunnerOptions(**{**plan["options"], "kv_cache_dtype": "fp8" if plan["options"]["kv_cache_dtype"]
                               == "bfloat16" else "bfloat16"})
    ops = CudaOps(config, AotKernels(_Table(built["kernels"]["kernels"]), plan["instances"]), device="meta")
    model = PagedModel(config, _meta_weights(config), ops=ops, linear=_meta_linear)
    dtype = KV_DTYPES[options.kv_cache_dtype]
    kv = KVCache.allocate(config.num_layers, 1, options.block_size, config.num_kv_heads, config.head_dim, dtype,
                          device="meta", scales=[(1.0, 1.0)] * config.num_layers)
    with pytest.raises(EngineError, match="rebuild it with atlas-build --device cuda"):
        model.forward(synthetic_step(1, 1, options, "meta"), kv, None)


@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "llama-3.1-8b"])
def test_prefill_tiers_past_16_record_no_new_kernels(preset, monkeypatch):
    """The runner captures a prefill graph per tier (runtime/model_runner.PREFILL_Q_LENS); the tiers added after
    engines were first built (32, 128, 384) must need no kernel those engines lack: from 16 tokens on every chunk takes
    the same attention tile, so the recorded instances are those of the first tiers."""
    from atlas.build_engine.families import family_for
    from atlas.build_engine.step_kernels import record_step_kernels
    from atlas.runtime import model_runner
    from atlas.tools.synthetic import text_config
    from atlas.tools.synthetic_presets import PRESETS

    hf = text_config(PRESETS[preset])
    config = family_for(hf).canonical_config(hf, {}, set())
    options = RunnerOptions(max_batch=8, max_seq_len=1024)
    assert {32, 128, 384} <= set(model_runner.prefill_tiers(options))
    now = set(record_step_kernels(config, options).instances)
    monkeypatch.setattr(model_runner, "PREFILL_Q_LENS", (2, 3, 4, 5, 8, 16, 64, 256, 512))
    assert set(record_step_kernels(config, options).instances) == now
