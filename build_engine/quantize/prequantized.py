"""Reading pre-quantized checkpoints: NVIDIA ModelOpt NVFP4 / FP8 and 128x128-block FP8 (DeepSeek, Qwen *-FP8).

Checkpoint tensors per linear `<m>` (HF names), and what they become:
  ModelOpt NVFP4  <m>.weight u8 [N, K/2], <m>.weight_scale e4m3 [N, K/16], <m>.weight_scale_2 f32 [] (per tensor),
                  <m>.input_scale f32 []       -> nvfp4, weight_scale_2 broadcast to [N]
  ModelOpt FP8    <m>.weight e4m3 [N, K], <m>.weight_scale f32 [] (per tensor; [N] or [N, 1] also read),
                  <m>.input_scale f32 []       -> fp8, weight_scale broadcast to [N] (lossless: same products)
  FP8 block       <m>.weight e4m3 [N, K], <m>.weight_scale_inv f32 [⌈N/128⌉, ⌈K/128⌉] -> fp8_block
                  (despite the name, weight_scale_inv multiplies: W = weight · weight_scale_inv, as in DeepSeek-V3's
                  weight_dequant and transformers' FP8 integration)
Modules the quantizer left in high precision (ModelOpt's exclude_modules, FP8's modules_to_not_convert, e.g.
lm_head) are read in their stored float dtype, as a float QTensor.
"""

from __future__ import annotations

import torch

from atlas.build_engine.checkpoints.base import Checkpoint
from atlas.build_engine.errors import CheckpointError, UnsupportedModelError
from atlas.build_engine.quantize.formats import FLOAT_DTYPES, FORMATS, FP8, QTensor

MODELOPT_ALGOS = {"NVFP4": "nvfp4", "FP8": "fp8"}
SUPPORTED = "ModelOpt NVFP4 or FP8, or FP8 with 128x128 blocks (quant_method 'fp8')"


def _quantization_config(config: dict) -> dict | None:
    """config.json's quantization_config, or an hf_quant_config.json dict passed as the config itself."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("quantization"), dict):
        qc = config
    return qc


def prequantized_format(config: dict) -> str | None:
    """Engine format the checkpoint's weights are stored in ("nvfp4", "fp8", "fp8_block"), or None if unquantized.

    config: config.json content (its quantization_config), or hf_quant_config.json content
    ({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", ...}}).
    """
    qc = _quantization_config(config)
    if not qc:
        return None
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else None
    method = str(qc.get("quant_method") or ("modelopt" if inner is not None else "")).lower()
    if method == "modelopt":
        fields = {**qc, **(inner or {})}
        algo = fields.get("quant_algo")
        if algo is None:
            return None  # e.g. KV-cache-only quantization: the weights are plain
        fmt = MODELOPT_ALGOS.get(str(algo).upper())
        if fmt is None:
            raise UnsupportedModelError(
                f"ModelOpt quant_algo '{algo}' is not supported; Atlas reads {SUPPORTED}. Export the model "
                f"with quant_algo NVFP4 or FP8, or build from the unquantized checkpoint with --quantize."
            )
        group = fields.get("group_size")
        if fmt == "nvfp4" and group not in (None, 16):
            raise UnsupportedModelError(f"ModelOpt NVFP4 with group_size {group} is not supported; NVFP4 uses 16.")
        return fmt
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is None or list(block) != [128, 128]:
            raise UnsupportedModelError(
                f"FP8 checkpoint with weight_block_size {block} is not supported; Atlas reads 128x128-block FP8 "
                f"(weight_scale_inv per tile), as the DeepSeek and Qwen FP8 releases use."
            )
        if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
            raise UnsupportedModelError(f"FP8 checkpoint with fmt '{qc['fmt']}' is not supported; Atlas reads e4m3.")
        return "fp8_block"
    raise UnsupportedModelError(
        f"the checkpoint is quantized with quant_method '{qc.get('quant_method')}', which Atlas cannot read; "
        f"it reads {SUPPORTED}. Build from the unquantized checkpoint instead (with --quantize for FP8/NVFP4)."
    )


def read_linear(ckpt: Checkpoint, hf_weight_name: str, fmt: str) -> QTensor:
    """One linear weight of a pre-quantized checkpoint, e.g. 'model.layers.0.self_attn.q_proj.weight', as a QTensor.

    fmt: prequantized_format(config). A weight stored as a float tensor (a module left unquantized) comes back
    as a float QTensor in its dtype (float16 -> float32, losslessly). Missing scales raise CheckpointError.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format '{fmt}'; expected one of {', '.join(FORMATS)}.")
    if not hf_weight_name.endswith(".weight"):
        raise ValueError(f"read_linear takes a '<module>.weight' name, got '{hf_weight_name}'.")
    base = hf_weight_name.removesuffix(".weight")
    names = set(ckpt.tensor_names())
    weight = ckpt.get(hf_weight_name)
    if weight.dtype.is_floating_point and weight.dtype.itemsize >= 2:
        if fmt in FLOAT_DTYPES:
            return QTensor(fmt, weight.to(FLOAT_DTYPES[fmt]).contiguous())
        stored = "bfloat16" if weight.dtype == torch.bfloat16 else "float32"
        return QTensor(stored, weight.to(FLOAT_DTYPES[stored]).contiguous())

    def need(suffix: str) -> torch.Tensor:
        name = f"{base}.{suffix}"
        if name not in names:
            raise CheckpointError(
                f"tensor '{name}' is missing from {ckpt.source}: '{hf_weight_name}' is stored {_dtype(weight)} "
                f"and a {fmt} weight needs its {suffix}. The checkpoint is incomplete or not the format its "
                f"config declares; re-download or re-export it."
            )
        return ckpt.get(name)

    def per_row(t: torch.Tensor, n: int, what: str) -> torch.Tensor:
        if t.numel() == 1:
            return t.float().reshape(1).expand(n).contiguous()
        if t.numel() == n:
            return t.float().reshape(n).contiguous()
        raise CheckpointError(
            f"'{base}.{what}' has shape {list(t.shape)}; expected one value per tensor or one per output row "
            f"({n}) for '{hf_weight_name}' {list(weight.shape)}. The checkpoint is corrupt or of another format."
        )

    n = weight.shape[0]
    try:
        if fmt == "nvfp4":
            _expect(weight, (torch.uint8, torch.int8), hf_weight_name, "packed E2M1 bytes (uint8)")
            scale = need("weight_scale")
            _expect(scale, (FP8, torch.uint8), f"{base}.weight_scale", "float8_e4m3fn block scales")
            input_scale = None
            if f"{base}.input_scale" in names:
                input_scale = per_row(ckpt.get(f"{base}.input_scale"), 1, "input_scale").reshape(())
            return QTensor("nvfp4", weight.view(torch.uint8).contiguous(), scale.view(FP8).contiguous(),
                           per_row(need("weight_scale_2"), n, "weight_scale_2"), input_scale)
        if fmt == "fp8":
            _expect(weight, (FP8,), hf_weight_name, "float8_e4m3fn")
            return QTensor("fp8", weight.contiguous(), per_row(need("weight_scale"), n, "weight_scale"))
        if fmt == "fp8_block":
            _expect(weight, (FP8,), hf_weight_name, "float8_e4m3fn")
            return QTensor("fp8_block", weight.contiguous(), need("weight_scale_inv").float().contiguous())
    except ValueError as e:
        raise CheckpointError(f"'{hf_weight_name}' in {ckpt.source}: {e}") from None
    raise CheckpointError(
        f"'{hf_weight_name}' in {ckpt.source} is stored {_dtype(weight)}, which is not a {fmt} weight."
    )


def _dtype(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def _expect(t: torch.Tensor, dtypes: tuple[torch.dtype, ...], name: str, what: str):
    if t.dtype not in dtypes:
        raise CheckpointError(
            f"'{name}' is {_dtype(t)}, but the checkpoint's config declares a format that stores {what} there. "
            f"The config and the weights disagree; re-download or re-export the checkpoint."
        )
