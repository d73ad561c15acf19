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
    def __init__(self, ckpt: Checkpoint, plan: PrecisionPlan, prequantized: str | None):
        self.ckpt = ckpt
        self.plan = plan
        self.prequantized = prequantized
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
        if tensor_class(canonical) is not None and canonical != "embed.weight":
            self.formats[canonical.removesuffix(".weight")] = fmt
        if not isinstance(value, torch.Tensor):  # pre-quantized
            if value.fmt == fmt:
                return value.to_tensors(canonical.removesuffix(".weight"))
            value = value.dequantize()
        if fmt in FLOAT_FORMATS:
            return {canonical: value.to(TORCH_DTYPES[fmt]).contiguous()}
        from atlas.build_engine.quantize.quantizer import quantize

        try:
            qt = quantize(value.float(), fmt)
        except ValueError as e:
            cls = tensor_class(canonical)
            raise BuildError(
                f"cannot store '{canonical}' {shape} as {fmt}: {e}. Keep this class in another format, "
                f"e.g. --class-dtype {cls}=bfloat16."
            ) from None
        return qt.to_tensors(canonical.removesuffix(".weight"))


def combine_quantized(parts: list, src: WeightSource):
    """Apply a fusion to pre-quantized parts: concatenation, or a row map applied to every component."""
    from atlas.build_engine.quantize.formats import concat_rows

    if src.combine is concat:
        return concat_rows(parts)
    if len(parts) == 1:
        return parts[0].map_rows(lambda w: src.combine([w]))
    # A fusion that reorders rows within parts (Qwen3-Next's q/gate split): map each component.
    raise BuildError(
        f"the fusion of {list(src.hf_names)} reorders rows inside pre-quantized tensors, which Atlas does not "
        f"support yet; build from the unquantized checkpoint, or pass --dtype bfloat16 to dequantize."
    )
