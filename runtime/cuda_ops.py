"""The ops of a step on the GPU: the plugins' Triton kernels, launched from the engine's cubins.

Same methods and results as runtime/paged_model.ReferenceOps (the model composes either). Every launch goes through
the plugins' `launch_*` functions with `aot=`: the engine's precompiled instances (atlas.plugins_trt.launch), or a
recorder at build time, which calls these same methods on meta tensors to learn which instances to compile. Nothing
here reads a device value on the host, so a step records into a CUDA graph.
"""

from __future__ import annotations

import torch

from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
from atlas.plugins_trt.attention.triton_decode import launch_paged_decode
from atlas.plugins_trt.attention.triton_prefill import launch_paged_prefill
from atlas.plugins_trt.embedding.triton_embed import launch_embedding
from atlas.plugins_trt.rms_norm.triton_norm import launch_rms_norm
from atlas.plugins_trt.rope.reference import rope_inv_freq
from atlas.plugins_trt.rope.triton_rope import launch_qkv_rope
from atlas.plugins_trt.sampling.triton_sampling import launch_argmax
from atlas.runtime.config import ModelConfig
from atlas.runtime.kv_cache import LayerKV
from atlas.runtime.step import StepInputs


class CudaOps:
    def __init__(self, config: ModelConfig, aot, device: torch.device | str = "cuda", num_splits: int = 1):
        """aot: AotKernels of the engine (or a KernelRecorder at build). num_splits: the decode attention's
        splits over the context (fixed per captured graph; see ModelRunner)."""
        if any(kind != "attention" for kind in config.layer_types):
            raise NotImplementedError("the GPU step runs attention-only models for now; hybrid (Gated DeltaNet) "
                                      "models run on the CPU reference path")
        self.c = config
        self.aot = aot
        self.num_splits = num_splits
        self.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, config.rope_scaling).to(device)

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return launch_embedding(table, ids, aot=self.aot)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return launch_rms_norm(x, weight, self.c.rms_norm_eps, self.c.norm_offset, aot=self.aot)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        """(norm(residual + x), residual + x); the residual stream is updated in place."""
        y = launch_rms_norm(x, weight, self.c.rms_norm_eps, self.c.norm_offset, residual=residual, aot=self.aot)
        return y, residual

    def attention(self, qkv: torch.Tensor, kv: LayerKV, step: StepInputs, q_norm, k_norm) -> torch.Tensor:
        c = self.c
        T = qkv.shape[0]
        q = launch_qkv_rope(qkv, step.positions, self.inv_freq, kv.k, kv.v, kv.k_scale, kv.v_scale,
                            step.slot_mapping, c.num_heads, has_gate=c.attn_output_gate, q_norm=q_norm,
                            k_norm=k_norm, eps=c.rms_norm_eps, norm_offset=c.norm_offset, aot=self.aot)
        gate = qkv[:, c.q_size:2 * c.q_size].view(T, c.num_heads, c.head_dim) if c.attn_output_gate else None
        if step.max_q_len == 1:  # decode: one query a sequence, split over the context
            o = launch_paged_decode(q, kv.k, kv.v, kv.k_scale, kv.v_scale, step.block_tables, step.context_lens,
                                    c.head_dim ** -0.5, gate=gate, num_splits=self.num_splits, aot=self.aot)
        else:  # prefill chunks and verify widths: causal over the cached prefix
            o = launch_paged_prefill(q, kv.k, kv.v, kv.k_scale, kv.v_scale, step.block_tables, step.context_lens,
                                     step.cu_q, c.head_dim ** -0.5, gate=gate, max_q_len=step.max_q_len,
                                     aot=self.aot)
        return o.view(T, c.q_size)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return launch_silu_mul(gate_up, aot=self.aot)

    def gdn(self, *args):
        raise NotImplementedError("Gated DeltaNet layers are not on the GPU step yet")

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return launch_argmax(logits, aot=self.aot)
