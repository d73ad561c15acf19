"""The model over a batch step with a paged KV cache and a recurrent-state pool.

Where runtime/model.py runs one sequence over its own contiguous state, this runs any mix of sequences (prefill
chunks, decode tokens, verify tokens) as one packed step laid out by runtime/step.py, reading and writing the
shared pools (runtime/kv_cache.py, runtime/state_pool.py). It composes ops only; which implementation runs each
op is the `ops` object's business: `ReferenceOps` here (plain torch, any device: the ground truth and the CPU
path) or the GPU kernels of the model runner. Tests hold the batched result to runtime/model.py's per sequence.
"""

from __future__ import annotations

import torch

from atlas.plugins_trt.activation.reference import silu_mul
from atlas.plugins_trt.attention.reference import paged_attention
from atlas.plugins_trt.causal_conv1d.reference import causal_conv1d
from atlas.plugins_trt.gated_delta_net.reference import gated_delta_rule, gdn_gating
from atlas.plugins_trt.rms_norm.reference import fused_add_rms_norm, gated_rms_norm, rms_norm
from atlas.plugins_trt.rope.reference import qkv_rope_kv_write, rope_inv_freq
from atlas.runtime.config import ATTENTION, ModelConfig
from atlas.runtime.kv_cache import KVCache, LayerKV
from atlas.runtime.layers.linear import Linear
from atlas.runtime.state_pool import LayerState, StatePool
from atlas.runtime.step import StepInputs


class ReferenceOps:
    """Every op of a step in plain torch (fp32 math, results in the activation dtype)."""

    def __init__(self, config: ModelConfig):
        self.c = config
        self.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, config.rope_scaling)

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return table[ids.long()]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.c.rms_norm_eps, self.c.norm_offset)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        """(norm(residual + x), residual + x)."""
        return fused_add_rms_norm(x, residual, weight, self.c.rms_norm_eps, self.c.norm_offset)

    def attention(self, qkv: torch.Tensor, kv: LayerKV, step: StepInputs, q_norm, k_norm) -> torch.Tensor:
        """qkv [T, qkv_size] -> attention output [T, q_size] (gated where the model gates); writes K / V."""
        c = self.c
        T = qkv.shape[0]
        q = qkv_rope_kv_write(qkv, step.positions, self.inv_freq.to(qkv.device), kv, step.slot_mapping,
                              c.num_heads, has_gate=c.attn_output_gate, q_norm=q_norm, k_norm=k_norm,
                              eps=c.rms_norm_eps, norm_offset=c.norm_offset).to(qkv.dtype)
        gate = qkv[:, c.q_size:2 * c.q_size].reshape(T, c.num_heads, c.head_dim) if c.attn_output_gate else None
        o = paged_attention(q, kv.k, kv.v, kv.k_scale, kv.v_scale, step.block_tables, step.context_lens, step.cu_q,
                            c.head_dim ** -0.5)
        if gate is not None:  # as runtime/layers/attention.py: the output rounded, then gated
            o = o * torch.sigmoid(gate)
        return o.reshape(T, c.q_size)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)

    def gate_up_silu(self, gate_up_proj, h: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of the [gate | up] projection of h."""
        return self.silu_mul(gate_up_proj(h))

    def project_add_rms_norm(self, proj, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, then=None):
        """add_rms_norm of the projection proj(x) into the residual stream (then: the projection reading the normed
        rows next, where the GPU ops may leave the norm to it)."""
        return self.add_rms_norm(proj(x), residual, weight)

    def gdn(self, proj: torch.Tensor, layer: "PagedGDN", pool: LayerState, step: StepInputs) -> torch.Tensor:
        """in_proj output [T, gdn_in_proj_size] -> gated-normed o [T, gdn_value_size]; advances each slot."""
        c = self.c
        qkv, z, b, a = proj.split(layer.split, dim=-1)
        out = torch.empty(proj.shape[0], c.gdn_value_size, dtype=proj.dtype, device=proj.device)
        cu, slots = step.cu_q.tolist(), step.state_slots.tolist()
        for s in range(step.num_seqs):
            rows, slot = slice(cu[s], cu[s + 1]), slots[s]
            T = cu[s + 1] - cu[s]
            x, pool.window[slot] = causal_conv1d(qkv[rows], pool.window[slot], layer.conv_weight)
            q, k, v = x.split([c.gdn_key_size, c.gdn_key_size, c.gdn_value_size], dim=-1)
            g, beta = gdn_gating(a[rows], b[rows], layer.A_log, layer.dt_bias)
            o, pool.state[slot] = gated_delta_rule(
                q.view(T, c.linear_num_key_heads, -1), k.view(T, c.linear_num_key_heads, -1),
                v.view(T, c.linear_num_value_heads, -1), g, beta, pool.state[slot])
            z_s = z[rows].view(T, c.linear_num_value_heads, c.linear_value_head_dim)
            out[rows] = gated_rms_norm(o.to(proj.dtype), z_s, layer.norm, c.rms_norm_eps).reshape(T, -1)
        return out

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).to(torch.int32)


class PagedGDN:
    """A Gated DeltaNet layer's weights (the op does the work)."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], prefix: str, linear):
        self.in_proj = linear(weights, f"{prefix}.in_proj")  # rows [q | k | v | z | b | a]
        self.out_proj = linear(weights, f"{prefix}.out_proj")
        self.conv_weight = weights[f"{prefix}.conv.weight"]  # [conv_channels, kernel]
        self.A_log = weights[f"{prefix}.A_log"]
        self.dt_bias = weights[f"{prefix}.dt_bias"]
        self.norm = weights[f"{prefix}.norm.weight"]
        hv = config.linear_num_value_heads
        self.split = [config.gdn_conv_size, config.gdn_value_size, hv, hv]


class PagedLayer:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], index: int, linear):
        p = f"layers.{index}"
        self.kind = config.layer_types[index]
        self.input_norm = weights[f"{p}.input_norm.weight"]
        self.post_norm = weights[f"{p}.post_norm.weight"]
        if self.kind == ATTENTION:
            self.qkv_proj = linear(weights, f"{p}.attn.qkv_proj")  # rows [q | gate? | k | v]
            self.o_proj = linear(weights, f"{p}.attn.o_proj")
            self.q_norm = weights.get(f"{p}.attn.q_norm.weight")
            self.k_norm = weights.get(f"{p}.attn.k_norm.weight")
        else:
            self.gdn = PagedGDN(config, weights, f"{p}.gdn", linear)
        self.gate_up_proj = linear(weights, f"{p}.mlp.gate_up_proj")  # rows [gate | up]
        self.down_proj = linear(weights, f"{p}.mlp.down_proj")

    @property
    def input_proj(self):
        """The projection that reads the layer's normed input (the attention's qkv, or the GDN's in_proj)."""
        return self.qkv_proj if self.kind == ATTENTION else self.gdn.in_proj


class PagedModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], ops=None, linear=Linear):
        self.c = config
        self.ops = ops or ReferenceOps(config)
        self.embed = weights["embed.weight"]  # [V, H]
        self.layers = [PagedLayer(config, weights, i, linear) for i in range(config.num_layers)]
        self.norm = weights["norm.weight"]
        self.lm_head = linear({"lm_head.weight": self.embed} if config.tie_word_embeddings else weights, "lm_head")
        self.attn_index = {i: n for n, i in enumerate(i for i, k in enumerate(config.layer_types) if k == ATTENTION)}
        """decoder layer -> its layer in the KV cache (attention layers only, in order)."""

    @torch.inference_mode()
    def forward(self, step: StepInputs, kv: KVCache, states: StatePool | None) -> torch.Tensor:
        """Run a step; returns the fp32 logits [B, V] of each sequence's last token (padding rows included)."""
        ops = self.ops
        x = ops.embed(self.embed, step.input_ids)  # x: [T, H]
        residual = x
        h = ops.rms_norm(x, self.layers[0].input_norm)
        for i, layer in enumerate(self.layers):
            if layer.kind == ATTENTION:
                o = ops.attention(layer.qkv_proj(h), kv.layers[self.attn_index[i]], step, layer.q_norm,
                                  layer.k_norm)
                h, residual = ops.project_add_rms_norm(layer.o_proj, o, residual, layer.post_norm,
                                                       then=layer.gate_up_proj)
            else:
                o = ops.gdn(layer.gdn.in_proj(h), layer.gdn, states.layers[i], step)
                h, residual = ops.project_add_rms_norm(layer.gdn.out_proj, o, residual, layer.post_norm,
                                                       then=layer.gate_up_proj)
            nxt = self.layers[i + 1] if i + 1 < len(self.layers) else None  # the last one's: the final norm (the LM
            # head reads a row gather of it, so it is not left to a projection)
            h, residual = ops.project_add_rms_norm(layer.down_proj, ops.gate_up_silu(layer.gate_up_proj, h), residual,
                                                   nxt.input_norm if nxt else self.norm, then=nxt and nxt.input_proj)
        # last: [B, H] final-normed hidden state of each sequence's last token; one token a sequence (decode): the
        # rows in order, no gather (two launches fewer a decode step)
        last = h if step.max_q_len == 1 else h[step.last_rows.long()]
        return self.lm_head(last).float()
