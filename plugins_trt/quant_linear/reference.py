"""Quantized linear references: dequantize each engine weight format, then y = x @ W.T (+ bias) in fp32.

Formats (the engine storage format; see atlas.build_engine.quantize.formats for the contract):
  fp8        weight e4m3 [N, K], weight_scale f32 [N]:
             W = weight · weight_scale[n]
  fp8_block  weight e4m3 [N, K], weight_scale f32 [⌈N/128⌉, ⌈K/128⌉]:
             W = weight · weight_scale[n//128, k//128]
  nvfp4      weight u8 [N, K/2] (two E2M1 codes a byte), weight_scale e4m3 [N, K/16], weight_scale_2 f32 [N]:
             W = E2M1(code) · weight_scale[n, k//16] · weight_scale_2[n]
  float32 / bfloat16: weight [N, K] as is.

This module depends on torch only, so the runtime can call it without the build stage.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value."""
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
"""NVFP4 block: one E4M3 scale per 16 consecutive input (K) elements."""
FP8_BLOCK = 128
"""fp8_block: one fp32 scale per 128 x 128 tile of W."""

# code -> value; bit 3 is the sign, bits 0-2 index 0, 0.5, 1, 1.5, 2, 3, 4, 6 (exponent 2 bits, mantissa 1).
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)
# Midpoints between consecutive magnitudes; a tie at bound i sits between codes i and i+1.
_E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
# Ties whose lower neighbour has an odd code (odd mantissa) round up to the even code: 0.75, 1.75, 3.5.
_E2M1_TIES_UP = _E2M1_BOUNDS[[1, 3, 5]]


# ---- E2M1 (FP4) codes ---------------------------------------------------------------------------

def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values -> E2M1 codes (uint8 0..15, same shape), round-to-nearest-even, saturating to ±6.

    The sign comes from the sign bit, so -0.0 and negatives that round to zero give code 8 (-0), as
    ModelOpt's cast does for negatives; codes therefore survive decode -> encode unchanged. NaN is undefined.
    """
    x = x.float()
    mag = x.abs()
    # searchsorted (left): number of bounds strictly below |x|, so ties land on the lower code first.
    code = torch.searchsorted(_E2M1_BOUNDS.to(x.device), mag.contiguous())
    code = code + torch.isin(mag, _E2M1_TIES_UP.to(x.device)).to(code.dtype)
    return (code | (torch.signbit(x).to(code.dtype) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> fp32 values, through the 16-entry table."""
    return E2M1_VALUES.to(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., K] (K even) -> bytes uint8 [..., K/2]; element 2i in the low nibble, 2i+1 in the high.

    This is NVIDIA ModelOpt's order, confirmed in its source: NVFP4QTensor.quantize packs
    `(q[..., 1::2] << 4) | q[..., 0::2]` and its dequantize unpacks `[..., 0::2] = byte & 0x0F`
    (modelopt/torch/quantization/qtensor/nvfp4_tensor.py); vLLM's NVFP4 test emulation
    `break_fp4_bytes` (tests/kernels/quantization/nvfp4_utils.py) reads it back as stack((low, high)).
    """
    return (codes[..., 1::2] << 4) | codes[..., 0::2]


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """bytes uint8 [..., K/2] -> codes uint8 [..., K] (inverse of pack_e2m1)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


# ---- dequantize ----------------------------------------------------------------------------------

def dequantize_fp8(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [N, K], weight_scale f32 [N] -> fp32 [N, K]."""
    return weight.float() * weight_scale.float()[:, None]


def dequantize_fp8_block(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [N, K], weight_scale f32 [⌈N/128⌉, ⌈K/128⌉] -> fp32 [N, K]."""
    n, k = weight.shape
    scale = weight_scale.float().repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return weight.float() * scale


def dequantize_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> torch.Tensor:
    """weight u8 [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 f32 [N] -> fp32 [N, K].

    E2M1 · block scale is exact in fp32 (2 + 4 significant bits), so (E2M1 · s) · g is the correctly rounded
    product; the ONNX form multiplies in the same order, so the two agree bit for bit.
    """
    n, k = weight.shape[0], weight.shape[1] * 2
    values = e2m1_decode(unpack_e2m1(weight)).view(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    w = (values * weight_scale.float()[..., None]).view(n, k)
    return w * weight_scale_2.float()[:, None]


def dequantize(fmt: str, weight: torch.Tensor, weight_scale: torch.Tensor | None = None,
               weight_scale_2: torch.Tensor | None = None) -> torch.Tensor:
    """Any engine weight format -> fp32 [N, K]."""
    if fmt in ("float32", "bfloat16"):
        return weight.float()
    if fmt == "fp8":
        return dequantize_fp8(weight, weight_scale)
    if fmt == "fp8_block":
        return dequantize_fp8_block(weight, weight_scale)
    if fmt == "nvfp4":
        return dequantize_nvfp4(weight, weight_scale, weight_scale_2)
    raise ValueError(f"unknown weight format '{fmt}' (known: float32, bfloat16, fp8, fp8_block, nvfp4)")


def quant_linear(x: torch.Tensor, qt, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(qt).T + bias, computed in fp32, returned in x's dtype.

    x: [..., K]; qt: anything with fmt, weight, weight_scale, weight_scale_2 (a QTensor); bias: [N] or None.
    Weight-only: activations are not quantized (qt.input_scale, when present, is unused).
    """
    w = dequantize(qt.fmt, qt.weight, qt.weight_scale, qt.weight_scale_2)  # [N, K]
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
