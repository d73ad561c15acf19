"""One canonical tensor from its checkpoint sources: read, combine (fusions), check, store in its format.

Float checkpoints are combined in float and then quantized as a whole (one NVFP4 global scale for a
fused [q|k|v]). Pre-quantized checkpoints (ModelOpt NVFP4 / FP8, FP8 128x128 blocks) are combined in
their own format, component by component, so nothing is re-rounded; when the engine asks for another
format they are dequantized first.
"""

from __future__ import annotations

import torch

from atlas.build_engine.checkpoints import Checkpoint
from atlas.build_engine.errors import BuildError, CheckpointError
from atlas.build_engine.families.base import WeightSource, concat
from atlas.build_engine.precision import FLOAT_FORMATS, PrecisionPlan, tensor_class

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Converter:
    def __init__(self, ckpt: Checkpoint, plan: PrecisionPlan, prequantized: str | None, keep_source: bool = False,
                 device: str = "cpu"):
        self.ckpt = ckpt
        self.device = device
        """Where weights are quantized (quantize's device: the GPU when the build has one)."""
        self.plan = plan
        self.prequantized = prequantized
        self.keep_source = keep_source
        """Pre-quantized checkpoint built with --dtype auto: each linear keeps the checkpoint's format
        (quantized ones theirs, excluded float ones the float base), unless a class override says otherwise."""
        self.names = set(ckpt.tensor_names())
        self.formats: dict[str, str] = {}
        """canonical linear prefix -> storage format (recorded in the manifest for the runtime)."""

    def _is_quantized_source(self, hf_name: str) -> bool:
        stem = hf_name.removesuffix(".weight")
        return self.prequantized is not None and (
            f"{stem}.weight_scale" in self.names or f"{stem}.weight_scale_inv" in self.names)

    def _read(self, canonical: str, src: WeightSource):
        """The combined source: a float tensor, or a QTensor for pre-quantized linear weights."""
        quantized = [self._is_quantized_source(n) for n in src.hf_names]
        try:
            if any(quantized):
                from atlas.build_engine.quantize.prequantized import read_linear

                parts = [read_linear(self.ckpt, n, self.prequantized) for n in src.hf_names]
                return combine_quantized(parts, src)
            return src.combine([self.ckpt.get(n) for n in src.hf_names])
        except RuntimeError as e:
            raise CheckpointError(
                f"cannot form '{canonical}' from {list(src.hf_names)} of {self.ckpt.source}: {e}. The tensors' "
                f"shapes do not fit the config."
            ) from None

    def convert(self, canonical: str, src: WeightSource, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        value = self._read(canonical, src)
        logical = tuple(value.shape)
        if logical != shape:
            raise CheckpointError(
                f"'{canonical}' (from {', '.join(src.hf_names)}) has shape {logical}, but the config implies "
                f"{shape}; config.json and the weights of {self.ckpt.source} disagree."
            )
        fmt = self.plan.format_of(canonical, len(shape))
        cls = tensor_class(canonical)
        if self.keep_source and cls not in (None, "embed") and cls not in self.plan.overrides:
            fmt = self.plan.float_base if isinstance(value, torch.Tensor) else value.fmt
        if cls is not None:
            self.formats[canonical.removesuffix(".weight")] = fmt
        if not isinstance(value, torch.Tensor):  # pre-quantized
            if value.fmt == fmt:
                return value.to_tensors(canonical.removesuffix(".weight"))
            value = value.dequantize()
        if fmt in FLOAT_FORMATS:
            return {canonical: value.to(TORCH_DTYPES[fmt]).contiguous()}
        from atlas.build_engine.quantize.quantizer import quantize

        try:
            qt = quantize(value, fmt, self.device)
        except ValueError as e:
            raise BuildError(
                f"cannot store '{canonical}' {shape} as {fmt}: {e}. Keep this class in another format, "
                f"e.g. --class-dtype {cls}=bfloat16."
            ) from None
        return {name: t.cpu() for name, t in qt.to_tensors(canonical.removesuffix(".weight")).items()}


def combine_quantized(parts: list, src: WeightSource):
    """Apply a fusion to pre-quantized parts as a row map on every component (weights and scales)."""
    from atlas.build_engine.quantize.formats import combine_rows, concat_rows

    return concat_rows(parts) if src.combine is concat else combine_rows(parts, src.combine)
