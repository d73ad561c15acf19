"""Weight storage formats and their in-graph dequantization to float32.

The storage contract (what the engine's weights/*.safetensors hold for a linear prefix P, W [N, K]):
  float32 / bfloat16  P.weight [N, K] in that dtype.
  fp8                 P.weight float8_e4m3fn [N, K], P.weight_scale float32 [N];
                      W = float(weight) · scale[:, None].
  fp8_block           P.weight float8_e4m3fn [N, K], P.weight_scale float32 [ceil(N/128), ceil(K/128)];
                      W[n, k] = float(weight[n, k]) · scale[n // 128, k // 128].
  nvfp4               P.weight uint8 [N, K/2] (E2M1 code of element 2j in the low nibble, 2j+1 in the
                      high nibble), P.weight_scale float8_e4m3fn [N, K/16], P.weight_scale_2 float32 [N];
                      W[n, k] = E2M1(code) · float(weight_scale[n, k // 16]) · weight_scale_2[n].

Every format is decoded with standard ops, no custom op: Cast (float8_e4m3fn and bfloat16 -> float,
which ONNX Runtime's CPU EP implements), Mul by broadcast scales, and for nvfp4 BitwiseAnd/BitShift on
the uint8 bytes and a Gather from the 16-entry E2M1 table.

The embedding lookup is the exception: no ONNX op that selects rows (Gather, Slice, ...) accepts float8
(only Cast, Reshape, Transpose and a few others do), and casting a whole table per lookup would decode
V·H values for B·T rows. So the embedding graph takes float8 tensors as their raw bytes (uint8 inputs
marked `bytes_of: float8e4m3fn`), gathers the rows, and decodes them through a 256-entry E4M3 table.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import torch

from atlas.build_engine.onnx_export.graphs import FLOAT, INT64, LayerGraph

FORMATS = ("float32", "bfloat16", "fp8", "fp8_block", "nvfp4")
FP8_BLOCK = 128
"""fp8_block scales one 128 x 128 tile each (partial tiles at the edges)."""
NVFP4_BLOCK = 16
"""nvfp4 scales 16 consecutive elements along K each."""
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
"""Value of each 4-bit E2M1 code: bits 0-2 the magnitude, bit 3 the sign."""

E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
"""Value of each float8_e4m3fn byte (0x7F and 0xFF are NaN)."""

F8 = ir.DataType.FLOAT8E4M3FN

# How each ONNX graph decodes each format, for the manifest.
DECOMPOSITION = {
    "float32": "identity",
    "bfloat16": "Cast(bfloat16->float)",
    "fp8": "Cast(float8e4m3fn->float) * Unsqueeze(weight_scale)",
    "fp8_block": "Cast(float8e4m3fn->float) * weight_scale tiles (Unsqueeze/Expand/Reshape/Slice)",
    "nvfp4": "BitwiseAnd/BitShift(uint8) -> Gather(E2M1 table[16]) * Cast(float8e4m3fn->float) * weight_scale_2",
}


def storage(fmt: str, n: int, k: int) -> dict[str, tuple[ir.DataType, tuple[int, ...]]]:
    """Tensors that hold one [N, K] weight in `fmt`: suffix -> (dtype, shape)."""
    if fmt == "float32":
        return {"weight": (FLOAT, (n, k))}
    if fmt == "bfloat16":
        return {"weight": (ir.DataType.BFLOAT16, (n, k))}
    if fmt == "fp8":
        return {"weight": (F8, (n, k)), "weight_scale": (FLOAT, (n,))}
    if fmt == "fp8_block":
        return {"weight": (F8, (n, k)),
                "weight_scale": (FLOAT, (math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK)))}
    if fmt == "nvfp4":
        return {"weight": (ir.DataType.UINT8, (n, k // 2)), "weight_scale": (F8, (n, k // NVFP4_BLOCK)),
                "weight_scale_2": (FLOAT, (n,))}
    raise ValueError(f"unknown weight format '{fmt}'; known: {', '.join(FORMATS)}")


def check_format(fmt: str, prefix: str, k: int) -> None:
    """Raise ValueError when `fmt` is unknown or cannot hold a weight with K = `k` input features."""
    if fmt not in FORMATS:
        raise ValueError(f"'{prefix}' has unknown weight format '{fmt}'; known: {', '.join(FORMATS)}")
    if fmt == "nvfp4" and k % NVFP4_BLOCK:
        raise ValueError(f"'{prefix}' has {k} input features, not a multiple of {NVFP4_BLOCK}: it cannot be "
                         f"stored as nvfp4; choose fp8 or bfloat16 for it")


def declare(g: LayerGraph, prefix: str, fmt: str, n: int, k: int, float8_as_bytes: bool = False
            ) -> dict[str, ir.Value]:
    """Declare the graph inputs `prefix.weight`, `prefix.weight_scale`, ... of one stored weight.

    float8_as_bytes: declare float8 tensors as uint8 inputs taking their raw bytes (for dequantize_rows).
    """
    out = {}
    for suffix, (dtype, shape) in storage(fmt, n, k).items():
        if float8_as_bytes and dtype == F8:
            out[suffix] = g.input(f"{prefix}.{suffix}", ir.DataType.UINT8, shape, bytes_of=F8)
        else:
            out[suffix] = g.input(f"{prefix}.{suffix}", dtype, shape)
    return out


def dequantize(g: LayerGraph, fmt: str, t: dict[str, ir.Value], n: int, k: int) -> ir.Value:
    """The whole weight W [N, K] float32 from its stored tensors `t` (as from `declare`)."""
    op = g.op
    if fmt == "fp8_block":
        # scale [ceil(N/128), ceil(K/128)] -> one row of tile scales per output row: [N, ceil(K/128)]
        nb, kb = storage(fmt, n, k)["weight_scale"][1]
        rows = op.Expand(op.Unsqueeze(t["weight_scale"], [1]), [1, FP8_BLOCK, 1])  # [nb, 128, kb]
        rows = op.Slice(op.Reshape(rows, [nb * FP8_BLOCK, kb]), [0], [n], [0])  # [N, kb]
        t = {**t, "weight_scale": rows}
    return _decode_rows(g, fmt, t, k, lead=1)


def dequantize_rows(g: LayerGraph, fmt: str, t: dict[str, ir.Value], ids: ir.Value, k: int) -> ir.Value:
    """Rows `ids` [B, T] of W, dequantized: [B, T, K] float32 (the embedding lookup).

    t: from declare(..., float8_as_bytes=True). Only the gathered rows are decoded; every format's
    scales are per row, or per 128 rows for fp8_block.
    """
    op = g.op
    stored = storage(fmt, 1, k)
    rows = {}
    for name, value in t.items():
        index = op.Div(ids, FP8_BLOCK) if fmt == "fp8_block" and name == "weight_scale" else ids
        rows[name] = op.Gather(value, index, axis=0)  # [B, T, ...]
        if stored[name][0] == F8:  # raw e4m3 bytes -> float32
            rows[name] = op.Gather(g.constant(E4M3_VALUES, "e4m3_values"), op.Cast(rows[name], to=INT64), axis=0)
    return _decode_rows(g, fmt, rows, k, lead=2)


def _float(g: LayerGraph, x: ir.Value) -> ir.Value:
    return x if x.dtype == FLOAT else g.op.Cast(x, to=FLOAT)


def _decode_rows(g: LayerGraph, fmt: str, t: dict[str, ir.Value], k: int, lead: int) -> ir.Value:
    """Decode rows with `lead` leading dims [...] into [..., K] float32.

    t holds per-row tensors: weight [..., K] (or [..., K/2] bytes), weight_scale [...] (fp8),
    [..., ceil(K/128)] (fp8_block) or [..., K/16] (nvfp4), weight_scale_2 [...] (nvfp4). float8 tensors
    may come already decoded to float32.
    """
    op = g.op
    keep = [0] * lead  # Reshape: 0 copies a leading dim, so one graph serves any row count
    if fmt == "float32":
        return t["weight"]
    if fmt == "bfloat16":
        return _float(g, t["weight"])
    if fmt == "fp8":
        return op.Mul(_float(g, t["weight"]), op.Unsqueeze(t["weight_scale"], [-1]))
    if fmt == "fp8_block":
        tiles = op.Expand(op.Unsqueeze(t["weight_scale"], [-1]), [1] * (lead + 1) + [FP8_BLOCK])  # [..., kb, 128]
        scale = op.Slice(op.Reshape(tiles, keep + [-1]), [0], [k], [-1])  # [..., K]
        return op.Mul(_float(g, t["weight"]), scale)
    if fmt == "nvfp4":
        packed = t["weight"]  # [..., K/2] uint8
        low = op.BitwiseAnd(packed, 0x0F)  # element 2j
        high = op.BitShift(packed, 4, direction="RIGHT")  # element 2j+1
        codes = op.Concat(op.Unsqueeze(low, [-1]), op.Unsqueeze(high, [-1]), axis=-1)  # [..., K/2, 2]
        codes = op.Cast(op.Reshape(codes, keep + [k // NVFP4_BLOCK, NVFP4_BLOCK]), to=INT64)  # [..., K/16, 16]
        values = op.Gather(g.constant(E2M1_VALUES, "e2m1_values"), codes, axis=0)
        block_scale = op.Unsqueeze(_float(g, t["weight_scale"]), [-1])  # [..., K/16, 1]
        w = op.Reshape(op.Mul(values, block_scale), keep + [k])  # [..., K]
        return op.Mul(w, op.Unsqueeze(t["weight_scale_2"], [-1]))
    raise ValueError(f"unknown weight format '{fmt}'; known: {', '.join(FORMATS)}")
