"""The ops of a step on the GPU: the plugins' Triton kernels, launched from the engine's cubins.

Same methods and results as runtime/paged_model.ReferenceOps (the model composes either). Every launch goes through
the plugins' `launch_*` functions with `aot=`: the engine's precompiled instances (atlas.plugins_trt.launch), or a
recorder at build time, which calls these same methods on meta tensors to learn which instances to compile. Nothing
here reads a device value on the host (sizes come from tensor shapes and StepInputs' host ints), so a step records
into a CUDA graph.

The GDN kernels run on what runtime/cuda_engine.py loads and build_engine/step_kernels.py records: bf16 activations,
conv weight and conv windows; fp32 recurrent states, A_log, dt_bias and gated-norm weight.
"""

from __future__ import annotations

import torch
import triton

from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
from atlas.plugins_trt.attention.triton_decode import launch_paged_decode_rope
from atlas.plugins_trt.attention.triton_prefill import launch_paged_prefill
from atlas.plugins_trt.causal_conv1d.triton_conv import launch_conv_varlen
from atlas.plugins_trt.embedding.triton_embed import launch_embedding
from atlas.plugins_trt.gated_delta_net.triton_chunk import CHUNK, launch_chunk_gdn, padded_chunk_plan
from atlas.plugins_trt.gated_delta_net.triton_decode import launch_gdn_decode
from atlas.plugins_trt.pdl_order import WAIT_FIRST
from atlas.plugins_trt.rms_norm.triton_norm import launch_gated_rms_norm, launch_rms_norm
from atlas.plugins_trt.rope.reference import rope_inv_freq
from atlas.plugins_trt.rope.triton_rope import launch_qkv_rope
from atlas.plugins_trt.sampling.triton_sampling import launch_argmax
from atlas.runtime.config import ModelConfig
from atlas.runtime.knobs import knob
from atlas.runtime.kv_cache import LayerKV
from atlas.runtime.state_pool import LayerState
from atlas.runtime.step import StepInputs


DEFER_NORM = False
"""Whether CudaOps leaves a residual projection's RMSNorm to the next projection where both have the forms for it
(plugins_trt/rms_norm/deferred.py); read when a CudaOps is made. Off until its kernels have passed their GPU tests
(written 2026-12-08 without a GPU: tests/plugins_trt/test_deferred_norm.py); `deferred_norm(True)` makes ones that
defer, for the A/B runs (tools/bench_decode.py --defer-ab) and those tests."""


def deferred_norm(enabled: bool):
    """DEFER_NORM set to `enabled` for the CudaOps made inside (a context manager)."""
    return knob(__name__, "DEFER_NORM", enabled)


class CudaOps:
    def __init__(self, config: ModelConfig, aot, device: torch.device | str = "cuda", num_splits: int = 1,
                 pdl: bool | int = WAIT_FIRST, max_batch: int = 128):
        """aot: AotKernels of the engine (or a KernelRecorder at build). num_splits: the decode attention's
        splits over the context (fixed per captured graph; see ModelRunner). pdl: launch the step's small kernels
        (embedding, norms, RoPE, decode attention, the fused GDN decode, SiLU-mul, argmax) with programmatic dependent
        launch (plugins_trt/pdl.py; WAIT_FIRST or LAUNCH_FIRST), as the GEMVs are: each launch overlaps the
        kernel before it. max_batch: the largest decode batch (sizes the decode attention's split counters)."""
        self.c = config
        self.aot = aot
        self.pdl = pdl
        self.num_splits = num_splits
        self.defer_norm = DEFER_NORM
        # the split decode attention's (sequence, kv head) counters: zero, and left zero by every launch, so one
        # buffer serves every layer and every captured graph (launch_paged_decode's COMBINE: one launch, not two)
        self.decode_counters = torch.zeros(max_batch * config.num_kv_heads, dtype=torch.int32, device=device)
        self.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, config.rope_scaling).to(device)
        self._plans: dict[tuple, dict] = {}
        """(sequences, chunk rows a sequence, device) -> padded_chunk_plan: shared by a step's GDN layers, and kept
        (a few KB each), since a captured prefill graph reads the plan it was captured with."""

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return launch_embedding(table, ids, aot=self.aot, pdl=self.pdl)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return launch_rms_norm(x, weight, self.c.rms_norm_eps, self.c.norm_offset, aot=self.aot, pdl=self.pdl)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        """(norm(residual + x), residual + x); the residual stream is updated in place."""
        y = launch_rms_norm(x, weight, self.c.rms_norm_eps, self.c.norm_offset, residual=residual, aot=self.aot,
                            pdl=self.pdl)
        return y, residual

    def project_add_rms_norm(self, proj, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, then=None):
        """add_rms_norm(proj(x), residual, weight): left to `then`, the projection that reads the normed rows next,
        where the two have the forms for it (CudaLinear.defers_norm / takes_deferred: a DeferredNorm is returned,
        which `then` reads; plugins_trt/rms_norm/deferred.py), else in the projection's split-K reduction or its WK
        GEMV where its plan compiled that (CudaLinear.fuses_norm: one launch fewer), else the projection then
        add_rms_norm."""
        m = x.shape[0]
        defers, takes = getattr(proj, "defers_norm", None), getattr(then, "takes_deferred", None)
        if then is not None and self.defer_norm and defers is not None and defers(m) and takes is not None and takes(m):
            return proj(x, norm=(residual, weight, self.c.rms_norm_eps), defer=True), residual
        fuses = getattr(proj, "fuses_norm", None)
        if fuses is not None and fuses(m):
            return proj(x, norm=(residual, weight, self.c.rms_norm_eps)), residual
        return self.add_rms_norm(proj(x), residual, weight)

    def attention(self, qkv: torch.Tensor, kv: LayerKV, step: StepInputs, q_norm, k_norm) -> torch.Tensor:
        c = self.c
        T = qkv.shape[0]
        rope = dict(num_heads=c.num_heads, has_gate=c.attn_output_gate, q_norm=q_norm, k_norm=k_norm,
                    eps=c.rms_norm_eps, norm_offset=c.norm_offset)
        if step.max_q_len == 1:  # decode: one query a sequence, split over the context; QK-norm, RoPE and the K / V
            # write in the same launch (the two launches' bits)
            o = launch_paged_decode_rope(qkv, step.positions, self.inv_freq, step.slot_mapping, kv.k, kv.v,
                                         kv.k_scale, kv.v_scale, step.block_tables, step.context_lens,
                                         c.head_dim ** -0.5, **rope, num_splits=self.num_splits, aot=self.aot,
                                         pdl=self.pdl, counters=self.decode_counters)
            return o.view(T, c.q_size)
        q = launch_qkv_rope(qkv, step.positions, self.inv_freq, kv.k, kv.v, kv.k_scale, kv.v_scale,
                            step.slot_mapping, **rope, aot=self.aot, pdl=self.pdl)
        gate = qkv[:, c.q_size:2 * c.q_size].view(T, c.num_heads, c.head_dim) if c.attn_output_gate else None
        # prefill chunks and verify widths: causal over the cached prefix
        o = launch_paged_prefill(q, kv.k, kv.v, kv.k_scale, kv.v_scale, step.block_tables, step.context_lens,
                                 step.cu_q, c.head_dim ** -0.5, gate=gate, max_q_len=step.max_q_len, aot=self.aot)
        return o.view(T, c.q_size)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return launch_silu_mul(gate_up, aot=self.aot, pdl=self.pdl)

    def gate_up_silu(self, gate_up_proj, h: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the [gate | up] projection of h: in the projection's split-K reduction where its plan
        compiled that (CudaLinear.fuses_silu: one launch fewer, the same bits), else the projection then silu_mul."""
        fuses = getattr(gate_up_proj, "fuses_silu", None)
        if fuses is not None and fuses(h.shape[0]):
            return gate_up_proj(h, silu=True)
        return self.silu_mul(gate_up_proj(h))

    def gdn(self, proj: torch.Tensor, layer, pool: LayerState, step: StepInputs) -> torch.Tensor:
        """in_proj output [T, gdn_in_proj_size] -> gated-normed o [T, gdn_value_size]; advances each sequence's conv
        window and recurrent state in its slot (layer: runtime/paged_model.PagedGDN). State slot -1 (padding): its
        slots untouched, its rows of o left unwritten (as ReferenceOps, which skips them too)."""
        c = self.c
        T = proj.shape[0]
        C, V, HV = c.gdn_conv_size, c.gdn_value_size, c.linear_num_value_heads
        # proj rows [q | k | v | z | b | a] (PagedGDN.split): the kernels read column views at the row stride of the
        # fused projection; z, b and a may start off a 16-byte boundary (the launchers name them `unaligned`)
        mixed = proj[:, :C]  # mixed: [T, C] the conv inputs
        z = proj[:, C:C + V]
        b = proj[:, C + V:C + V + HV]
        a = proj[:, C + V + HV:]
        if step.max_q_len == 1:  # decode: one token a sequence, conv + gating + delta rule + gated norm fused
            o = launch_gdn_decode(mixed, a, b, layer.conv_weight, layer.A_log, layer.dt_bias, pool.window,
                                  pool.state, step.state_slots, c.linear_num_key_heads, z=z, norm_weight=layer.norm,
                                  norm_eps=c.rms_norm_eps, aot=self.aot, pdl=self.pdl)  # o: [T, HV, DV]
            return o.view(T, V)
        # prefill chunks (several sequences packed by cu_q), each from its slot's window and state: the conv, the
        # chunked delta rule, then the gated norm
        N = step.state_slots.numel()
        x = launch_conv_varlen(mixed, step.cu_q, pool.window, step.state_slots, layer.conv_weight,
                               max_seqlen=step.max_q_len, aot=self.aot)  # x: [T, C] silu(conv) rows [q | k | v]
        K = c.gdn_key_size
        work = dict(self._chunk_plan(N, step.max_q_len, proj.device))  # the stages' buffers are added to a copy
        o, _ = launch_chunk_gdn(x[:, :K], x[:, K:2 * K], x[:, 2 * K:], a, b, layer.A_log, layer.dt_bias, pool.state,
                                step.state_slots, step.cu_q, work=work, aot=self.aot)  # o: [T, HV, DV]
        return launch_gated_rms_norm(o.view(T, V), z, layer.norm, c.rms_norm_eps, aot=self.aot)

    def _chunk_plan(self, num_seqs: int, max_q_len: int, device) -> dict:
        """The chunk rows of a prefill step from its host sizes (no device read), made once for all its GDN layers
        (and for every later step of as many sequences and chunks: the plan depends on nothing else)."""
        key = (num_seqs, triton.cdiv(max_q_len, CHUNK), str(device))
        if key not in self._plans:
            self._plans[key] = padded_chunk_plan(num_seqs, max_q_len, device)
        return self._plans[key]

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return launch_argmax(logits, aot=self.aot, pdl=self.pdl)
