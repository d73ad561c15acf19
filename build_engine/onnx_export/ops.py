"""Graph forms of the small ops layers compose (the ONNX side of plugins_trt's references).

Each function appends nodes to a LayerGraph and mirrors the plain-torch reference named in its
docstring, operation for operation, in float32. Shapes use B (batch), T (new tokens) and static sizes.
"""

from __future__ import annotations

import onnx_ir as ir

from atlas.build_engine.onnx_export import dequant
from atlas.build_engine.onnx_export.graphs import LayerGraph


def rms_norm(g: LayerGraph, x: ir.Value, weight: ir.Value, eps: float, offset: float = 0.0) -> ir.Value:
    """x / rms(x) · (offset + w) over the last dim (plugins_trt.rms_norm.reference.rms_norm). x: [..., D]."""
    op = g.op
    mean_sq = op.ReduceMean(op.Mul(x, x), [-1], keepdims=1)  # [..., 1]
    x = op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(mean_sq, eps))))
    return op.Mul(x, op.Add(weight, offset) if offset else weight)


def gated_rms_norm(g: LayerGraph, x: ir.Value, gate: ir.Value, weight: ir.Value, eps: float) -> ir.Value:
    """w · x / rms(x) · silu(gate), plain weight (plugins_trt.rms_norm.reference.gated_rms_norm)."""
    return g.op.Mul(rms_norm(g, x, weight, eps), silu(g, gate))


def l2norm(g: LayerGraph, x: ir.Value, eps: float = 1e-6) -> ir.Value:
    """x · rsqrt(sum(x²) + eps) over the last dim (plugins_trt.gated_delta_net.reference.l2norm)."""
    op = g.op
    return op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(x, x), [-1], keepdims=1), eps))))


def silu(g: LayerGraph, x: ir.Value) -> ir.Value:
    return g.op.Mul(x, g.op.Sigmoid(x))


def silu_mul(g: LayerGraph, gate_up: ir.Value, intermediate: int) -> ir.Value:
    """silu(gate) · up of the fused [gate | up] projection: [..., 2I] -> [..., I]."""
    gate, up = g.op.Split(gate_up, [intermediate, intermediate], axis=-1, _outputs=2)
    return g.op.Mul(silu(g, gate), up)


def linear(g: LayerGraph, x: ir.Value, prefix: str, fmt: str, n: int, k: int, bias: bool = False) -> ir.Value:
    """x @ Wᵀ (+ b) with W [N, K] declared as graph inputs `prefix.weight...` in storage format `fmt`.

    x: [..., K] float32 -> [..., N] float32. The bias, when present, is the float32 input `prefix.bias` [N].
    """
    op = g.op
    w = dequant.dequantize(g, fmt, dequant.declare(g, prefix, fmt, n, k), n, k)  # [N, K]
    y = op.MatMul(x, op.Transpose(w, perm=[1, 0]))
    if bias:
        y = op.Add(y, g.weight(f"{prefix}.bias", (n,)))
    return y


def split(g: LayerGraph, x: ir.Value, sizes: list[int]) -> list[ir.Value]:
    """Split the last dim into parts of `sizes` (a zero size gives None, for optional parts)."""
    kept = [s for s in sizes if s]
    outs = g.op.Split(x, kept, axis=-1, _outputs=len(kept)) if len(kept) > 1 else [x]
    parts = iter(outs)
    return [next(parts) if s else None for s in sizes]


def heads(g: LayerGraph, x: ir.Value, num_heads: int, head_dim: int) -> ir.Value:
    """[B, T, n·d] -> [B, T, n, d]."""
    return g.op.Reshape(x, [0, 0, num_heads, head_dim])


def repeat_heads(g: LayerGraph, x: ir.Value, group: int, head_dim: int) -> ir.Value:
    """repeat_interleave over heads: [B, T, H, D] -> [B, T, H·group, D], head h reads head h // group."""
    if group == 1:
        return x
    op = g.op
    x = op.Expand(op.Unsqueeze(x, [3]), [1, 1, 1, group, 1])  # [B, T, H, group, D]
    return op.Reshape(x, [0, 0, -1, head_dim])
