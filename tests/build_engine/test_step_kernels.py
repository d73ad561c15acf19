"""The step kernels an engine built for cuda carries (build_engine/step_kernels.py): recorded from the model runner's
own steps, compiled for sm_90 on the CPU, and found again by the runtime's lookups for every step it launches."""

from __future__ import annotations

import pytest

from atlas.build_engine.builder import BuildConfig, build
from atlas.build_engine.step_kernels import _meta_linear, _meta_weights
from atlas.plugins_trt.launch import AotKernels
from atlas.runtime.config import ModelConfig
from atlas.runtime.cuda_ops import CudaOps
from atlas.runtime.errors import EngineError
from atlas.runtime.kv_cache import KV_DTYPES, KVCache
from atlas.runtime.model_runner import RunnerOptions, step_shapes, synthetic_step
from atlas.runtime.paged_model import PagedModel


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


def test_every_step_the_runner_launches_finds_its_kernels(built):
    plan = built["step_kernels"]
    options = RunnerOptions(**plan["options"])
    config = ModelConfig.from_dict(built["config"])
    table = _Table(built["kernels"]["kernels"])
    ops = CudaOps(config, AotKernels(table, plan["instances"]), device="meta")
    model = PagedModel(config, _meta_weights(config), ops=ops, linear=_meta_linear)
    dtype = KV_DTYPES[options.kv_cache_dtype]
    kv = KVCache.allocate(config.num_layers, 1, options.block_size, config.num_kv_heads, config.head_dim, dtype,
                          device="meta", scales=[(1.0, 1.0)] * config.num_layers if options.kv_cache_dtype == "fp8"
                          else None)
    for batch, q_len in step_shapes(options) + [(1, 7), (3, 1), (1, 300)]:  # and shapes between the recorded ones
        bucket = next(b for b in options.buckets if b >= batch)
        ops.num_splits = options.num_splits(config, bucket)
        ops.argmax(model.forward(synthetic_step(batch, q_len, options, "meta"), kv, None))
    assert set(table.launched) == set(plan["instances"].values())  # every compiled kernel is used
    # the decode step of a long context splits it (a second, reducing launch) at small batch
    assert any(n.startswith("paged_decode_reduce_kernel") for n in table.launched)
    assert config.qk_norm and any(n.startswith("qkv_rope_kernel") for n in table.launched)


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


def test_hybrid_models_carry_no_step_kernels_yet():
    from atlas.build_engine.step_kernels import supports_gpu_step
    from atlas.runtime.config import GDN
    c = ModelConfig(family="t", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, layer_types=(GDN,),
                    num_heads=1, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, rotary_dim=8, linear_num_key_heads=1,
                    linear_num_value_heads=1, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel=4)
    assert not supports_gpu_step(c)
    with pytest.raises(NotImplementedError, match="attention-only"):
        CudaOps(c, None, device="meta")
