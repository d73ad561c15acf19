"""fp32 / bf16 weights -> engine formats (the recipes of NVIDIA ModelOpt and the DeepSeek/Qwen FP8 checkpoints)."""

from __future__ import annotations

import torch

from atlas.build_engine.quantize.formats import FLOAT_DTYPES, FORMATS, FP8, QTensor
from atlas.plugins_trt.quant_linear.reference import (
    E2M1_MAX, FP8_BLOCK, FP8_MAX, NVFP4_BLOCK, e2m1_encode, pack_e2m1)

E4M3_MIN_SUBNORMAL = 2.0 ** -9
_CHUNK_ELEMENTS = 1 << 25


def _div(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b rounded as IEEE division, on any device. On CUDA, torch turns a tensor divided by a Python number into
    a times the reciprocal of b (one more rounding, 1 ulp off on some values), so b goes in as a tensor on a's
    device: the GPU's scales are the CPU's bits."""
    return a / torch.tensor(b, dtype=a.dtype, device=a.device)


def quantize(w: torch.Tensor, fmt: str, device: str | torch.device = "cpu") -> QTensor:
    """W [N, K] (any float dtype) -> QTensor in fmt on `device`, where the arithmetic runs; float formats are a
    plain cast, left where W is.

    atlas-build quantizes on the GPU when it builds for one (the NVFP4 encoding's searchsorted over every element is
    slow on the CPU for multi-GB weights); every step is exact or IEEE round-to-nearest on both, so the codes and
    scales are the same bits either way (tested on the GPU)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format '{fmt}'; expected one of {', '.join(FORMATS)}.")
    if w.dim() != 2:
        raise ValueError(f"quantize expects a 2-D weight [N, K], got shape {list(w.shape)}.")
    if fmt in FLOAT_DTYPES:
        return QTensor(fmt, w.to(FLOAT_DTYPES[fmt]).contiguous())
    w = w.detach().to(device=device, dtype=torch.float32)
    if not torch.isfinite(w).all():
        raise ValueError(f"weight {list(w.shape)} holds NaN or inf; it cannot be quantized to {fmt}.")
    return {"fp8": quantize_fp8, "fp8_block": quantize_fp8_block, "nvfp4": quantize_nvfp4}[fmt](w)


def quantize_fp8(w: torch.Tensor) -> QTensor:
    """Per-output-channel E4M3: scale[n] = amax|W[n]| / 448 (1 for zero rows), q = W / scale."""
    amax = w.abs().amax(dim=1)  # [N]
    scale = torch.where(amax > 0, _div(amax, FP8_MAX), torch.ones_like(amax))
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return QTensor("fp8", q, scale)


def quantize_fp8_block(w: torch.Tensor) -> QTensor:
    """E4M3 with one fp32 scale per 128 x 128 tile: scale = amax|tile| / 448 (1 for zero tiles).

    Edge tiles (N or K not a multiple of 128) are partial; zero padding does not change their amax.
    """
    n, k = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = torch.zeros(nb * FP8_BLOCK, kb * FP8_BLOCK, device=w.device)
    padded[:n, :k] = w
    tiles = padded.view(nb, FP8_BLOCK, kb, FP8_BLOCK)
    amax = tiles.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = torch.where(amax > 0, _div(amax, FP8_MAX), torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view_as(padded)[:n, :k]
    return QTensor("fp8_block", q.to(FP8).contiguous(), scale)


def quantize_nvfp4(w: torch.Tensor) -> QTensor:
    """NVFP4 with ModelOpt's recipe (NVFP4QTensor.quantize), operation for operation:

    g = amax|W| / (6·448) per tensor; block scale s = amax|block| / (6·g), 0 -> 1, clamped to
    [2^-9, 448] and rounded to E4M3 (nearest-even); code = E2M1(W / (float(s)·g)), nearest-even, saturating.
    The clamp below keeps tiny blocks from flushing their scale to zero (ModelOpt clamps the same way).
    """
    n, k = w.shape
    if k % NVFP4_BLOCK:
        raise ValueError(
            f"nvfp4 needs K (input features) to be a multiple of {NVFP4_BLOCK}; weight [N, K] = {[n, k]}. "
            f"Keep this weight in bfloat16 or fp8."
        )
    rows = max(1, _CHUNK_ELEMENTS // k)  # rows a chunk: the encoding's int64 temporaries stay ~0.3 GB, not 8 bytes x W
    chunks = [w[r:r + rows] for r in range(0, n, rows)]
    amax = torch.stack([c.abs().amax() for c in chunks]).amax()
    g = _div(amax, E2M1_MAX * FP8_MAX) if amax > 0 else torch.tensor(1.0, device=w.device)  # zero tensor: codes 0
    packed = torch.empty(n, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(n, k // NVFP4_BLOCK, dtype=FP8, device=w.device)
    for r, chunk in zip(range(0, n, rows), chunks):
        blocks = chunk.reshape(-1, k // NVFP4_BLOCK, NVFP4_BLOCK)
        s = blocks.abs().amax(dim=-1) / (E2M1_MAX * g)  # [rows, K/16]
        s = torch.where(s == 0, torch.ones_like(s), s).clamp(E4M3_MIN_SUBNORMAL, FP8_MAX).to(FP8)
        scales[r:r + rows] = s
        packed[r:r + rows] = pack_e2m1(e2m1_encode(blocks / (s.float() * g)[..., None]).view(-1, k))
    return QTensor("nvfp4", packed, scales, g.float().expand(n).contiguous())
