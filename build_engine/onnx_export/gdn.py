"""Gated DeltaNet token mixer as a graph (mirrors runtime.layers.gdn.GatedDeltaNet).

fused in_proj [q | k | v | z | b | a] -> depthwise causal conv1d over [q | k | v] from the carried
window, then SiLU -> gating g, beta -> the delta-rule recurrence as an ONNX Scan over T ->
gated RMSNorm with z -> out_proj.
"""

from __future__ import annotations

import onnx_ir as ir

from atlas.build_engine.onnx_export import ops
from atlas.build_engine.onnx_export.graphs import FLOAT, LayerGraph
from atlas.runtime.config import ModelConfig


def causal_conv1d(g: LayerGraph, x: ir.Value, window: ir.Value, weight: ir.Value, channels: int,
                  kernel: int) -> tuple[ir.Value, ir.Value]:
    """Depthwise causal conv + SiLU (reference: plugins_trt.causal_conv1d.reference.causal_conv1d).

    x: [B, T, C] new inputs; window: [B, C, K-1] the previous K-1 inputs; weight: [C, K].
    Returns y [B, T, C] and the new window [B, C, K-1] (the last K-1 columns of [window | xᵀ]).
    """
    op = g.op
    xx = op.Concat(window, op.Transpose(x, perm=[0, 2, 1]), axis=2)  # [B, C, K-1+T]
    y = op.Conv(xx, op.Unsqueeze(weight, [1]), group=channels, kernel_shape=[kernel])  # [B, C, T]
    y = ops.silu(g, op.Transpose(y, perm=[0, 2, 1]))  # [B, T, C]
    new_window = op.Slice(xx, [-(kernel - 1)], [2**62], [2])  # [B, C, K-1]
    return y, new_window


def delta_rule_scan(g: LayerGraph, q: ir.Value, k: ir.Value, v: ir.Value, decay: ir.Value, beta: ir.Value,
                    state: ir.Value, c: ModelConfig) -> tuple[ir.Value, ir.Value]:
    """The recurrence, one Scan iteration per token (reference: gated_delta_rule), per value head:

        S <- exp(g_t)·S;  u = beta_t·(v_t - Sᵀk_t);  S <- S + k_t uᵀ;  o_t = Sᵀq_t

    q, k: [B, T, Hv, Dk] (normalised, q scaled, heads already repeated to Hv); v: [B, T, Hv, Dv];
    decay = exp(g), beta: [B, T, Hv]; state: [B, Hv, Dk, Dv]. Returns o [B, T, Hv, Dv] and the final state.
    """
    op = g.op
    hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    # Rows and columns prepared outside the loop so that the body is only Mul, MatMul, Sub, Add.
    q_row = op.Unsqueeze(q, [3])  # [B, T, Hv, 1, Dk]
    k_row = op.Unsqueeze(k, [3])  # [B, T, Hv, 1, Dk]
    k_col = op.Unsqueeze(k, [4])  # [B, T, Hv, Dk, 1]
    v_row = op.Unsqueeze(v, [3])  # [B, T, Hv, 1, Dv]
    decay = op.Unsqueeze(decay, [3, 4])  # [B, T, Hv, 1, 1]
    beta = op.Unsqueeze(beta, [3, 4])

    def step(op, s, q_t, k_row_t, k_col_t, v_t, decay_t, beta_t):
        s = op.Mul(s, decay_t)  # [B, Hv, Dk, Dv]
        u = op.Mul(op.Sub(v_t, op.MatMul(k_row_t, s)), beta_t)  # [B, Hv, 1, Dv]
        s = op.Add(s, op.MatMul(k_col_t, u))
        return s, op.MatMul(q_t, s)  # o_t: [B, Hv, 1, Dv]

    def val(name, *shape):
        return ir.val(name, FLOAT, ["B", *shape])

    body = g.builder.subgraph(
        step,
        inputs=[val("state", hv, dk, dv), val("q_t", hv, 1, dk), val("k_row_t", hv, 1, dk),
                val("k_col_t", hv, dk, 1), val("v_t", hv, 1, dv), val("decay_t", hv, 1, 1),
                val("beta_t", hv, 1, 1)],
        outputs=[val("state_out", hv, dk, dv), val("o_t", hv, 1, dv)],
        name="delta_rule_step",
    )
    scanned = [q_row, k_row, k_col, v_row, decay, beta]
    final, o = op.Scan(state, *scanned, body=body, num_scan_inputs=len(scanned),
                       scan_input_axes=[1] * len(scanned), scan_output_axes=[1], _outputs=2)
    return op.Reshape(o, [0, 0, hv, dv]), final  # o: [B, T, Hv, Dv]


def gated_delta_net(g: LayerGraph, c: ModelConfig, formats: dict[str, str], x: ir.Value, conv_window: ir.Value,
                    state: ir.Value, prefix: str) -> tuple[ir.Value, ir.Value, ir.Value]:
    """x: [B, T, H] (normed); conv_window: [B, C, K-1]; state: [B, Hv, Dk, Dv] float32.

    Returns the mixer output [B, T, H], the new conv window and the new recurrent state.
    """
    op = g.op
    hk, hv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    proj = ops.linear(g, x, f"{prefix}.in_proj", formats[f"{prefix}.in_proj"], c.gdn_in_proj_size, c.hidden_size)
    qkv, z, b, a = ops.split(g, proj, [c.gdn_conv_size, c.gdn_value_size, hv, hv])
    conv_weight = g.weight(f"{prefix}.conv.weight", (c.gdn_conv_size, c.linear_conv_kernel))
    qkv, conv_window = causal_conv1d(g, qkv, conv_window, conv_weight, c.gdn_conv_size, c.linear_conv_kernel)
    q, k, v = ops.split(g, qkv, [c.gdn_key_size, c.gdn_key_size, c.gdn_value_size])
    q = ops.repeat_heads(g, ops.l2norm(g, ops.heads(g, q, hk, dk)), hv // hk, dk)  # [B, T, Hv, Dk]
    q = op.Mul(q, dk**-0.5)
    k = ops.repeat_heads(g, ops.l2norm(g, ops.heads(g, k, hk, dk)), hv // hk, dk)
    v = ops.heads(g, v, hv, dv)  # [B, T, Hv, Dv]

    # gating (reference: gdn_gating): g = -exp(A_log)·softplus(a + dt_bias), beta = sigmoid(b)
    a_log = g.weight(f"{prefix}.A_log", (hv,))
    dt_bias = g.weight(f"{prefix}.dt_bias", (hv,))
    log_decay = op.Mul(op.Neg(op.Exp(a_log)), op.Softplus(op.Add(a, dt_bias)))  # [B, T, Hv]
    o, state = delta_rule_scan(g, q, k, v, op.Exp(log_decay), op.Sigmoid(b), state, c)

    o = ops.gated_rms_norm(g, o, ops.heads(g, z, hv, dv), g.weight(f"{prefix}.norm.weight", (dv,)), c.rms_norm_eps)
    o = op.Reshape(o, [0, 0, c.gdn_value_size])
    out = ops.linear(g, o, f"{prefix}.out_proj", formats[f"{prefix}.out_proj"], c.hidden_size, c.gdn_value_size)
    return out, conv_window, state
