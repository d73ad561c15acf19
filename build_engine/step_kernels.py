"""The kernels of the GPU step (embedding, norms, RoPE + KV write, paged attention, the Gated DeltaNet layers' conv,
delta rule and gated norm, SiLU-mul, argmax), compiled at build for exactly the instances the runtime's model runner
launches.

The build runs the runner's own steps (runtime/model_runner.step_shapes: every decode bucket, the prefill chunk
tiers) through the same model and ops on meta tensors with a KernelRecorder in place of the engine's kernels, so
that nothing the runtime asks for can be missing (build_engine/recorded_kernels.py). The linears are not recorded:
their kernels come from their own plan (build_engine/linear_kernels.py).

Manifest (manifest["step_kernels"]): {"options": RunnerOptions.to_dict(), "instances": {instance key: kernel name}}.
"""

from __future__ import annotations

import torch

from atlas.build_engine.recorded_kernels import KernelRecorder, compile_recorded
from atlas.runtime.config import ATTENTION, GDN, ModelConfig
from atlas.runtime.cuda_ops import CudaOps
from atlas.runtime.kv_cache import KV_DTYPES, KVCache
from atlas.runtime.model_runner import RunnerOptions, step_shapes, synthetic_step
from atlas.runtime.paged_model import PagedModel
from atlas.runtime.state_pool import StatePool

ACT = torch.bfloat16


def _meta_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    """The non-linear tensors the step reads, and each linear's weight shape, as meta tensors in the dtypes
    runtime/cuda_engine.py loads them in: bf16, but fp32 for the GDN vectors (cuda_engine.GDN_FP32)."""
    c = config

    def t(*shape, dtype=ACT):
        return torch.empty(shape, dtype=dtype, device="meta")

    w = {"embed.weight": t(c.vocab_size, c.hidden_size), "norm.weight": t(c.hidden_size),
         "lm_head.weight": t(c.vocab_size, c.hidden_size)}
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}"
        w.update({f"{p}.input_norm.weight": t(c.hidden_size), f"{p}.post_norm.weight": t(c.hidden_size),
                  f"{p}.mlp.gate_up_proj.weight": t(2 * c.intermediate_size, c.hidden_size),
                  f"{p}.mlp.down_proj.weight": t(c.hidden_size, c.intermediate_size)})
        if kind == GDN:
            g, hv = f"{p}.gdn", c.linear_num_value_heads
            w.update({f"{g}.in_proj.weight": t(c.gdn_in_proj_size, c.hidden_size),
                      f"{g}.out_proj.weight": t(c.hidden_size, c.gdn_value_size),
                      f"{g}.conv.weight": t(c.gdn_conv_size, c.linear_conv_kernel),
                      f"{g}.A_log": t(hv, dtype=torch.float32), f"{g}.dt_bias": t(hv, dtype=torch.float32),
                      f"{g}.norm.weight": t(c.linear_value_head_dim, dtype=torch.float32)})
            continue
        w.update({f"{p}.attn.qkv_proj.weight": t(c.qkv_size, c.hidden_size),
                  f"{p}.attn.o_proj.weight": t(c.hidden_size, c.q_size)})
        if c.qk_norm:
            w.update({f"{p}.attn.q_norm.weight": t(c.head_dim), f"{p}.attn.k_norm.weight": t(c.head_dim)})
    return w


def _meta_linear(weights: dict[str, torch.Tensor], prefix: str):
    """A linear of the right output size that launches nothing (the linears have their own plan)."""
    n = weights[f"{prefix}.weight"].shape[0]
    return lambda x: x.new_empty(x.shape[0], n)


def record_step_kernels(config: ModelConfig, options: RunnerOptions) -> KernelRecorder:
    """Every step-kernel instance a ModelRunner with these options launches, from its own steps on meta tensors."""
    recorder = KernelRecorder()
    ops = CudaOps(config, recorder, device="meta", pdl=options.pdl)
    model = PagedModel(config, _meta_weights(config), ops=ops, linear=_meta_linear)
    dtype = KV_DTYPES[options.kv_cache_dtype]
    attn_layers = sum(kind == ATTENTION for kind in config.layer_types)  # the KV cache holds these only
    scales = [(1.0, 1.0)] * attn_layers if dtype == torch.float8_e4m3fn else None
    kv = KVCache.allocate(attn_layers, 1, options.block_size, config.num_kv_heads, config.head_dim, dtype,
                          device="meta", scales=scales)
    # the recurrent-state pool as ModelRunner makes it (bf16 windows, fp32 states), one slot a sequence of the
    # largest bucket; the synthetic steps' state slots are -1, which the launchers never read on the host
    states = StatePool(config, options.buckets[-1], device="meta") if GDN in config.layer_types else None
    for batch, q_len in step_shapes(options):
        ops.num_splits = options.num_splits(config, batch)
        ops.argmax(model.forward(synthetic_step(batch, q_len, options, "meta"), kv, states))
    return recorder


def compile_step_kernels(config: ModelConfig, options: RunnerOptions, arch: int = 90) -> tuple[list, dict]:
    """(compiled kernels for write_kernels, manifest["step_kernels"]): every mixer of ModelConfig is on the step."""
    compiled, instances = compile_recorded(record_step_kernels(config, options), arch)
    return compiled, {"options": options.to_dict(), "instances": instances}
