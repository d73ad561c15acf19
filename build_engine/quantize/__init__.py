"""Weight quantization: the engine's FP8 / FP8-block / NVFP4 formats (QTensor), quantizers from float
weights, and readers for pre-quantized ModelOpt and FP8-block checkpoints."""

from atlas.build_engine.quantize.formats import FORMATS, QTensor, combine_rows, concat_rows
from atlas.build_engine.quantize.prequantized import prequantized_format, read_linear
from atlas.build_engine.quantize.quantizer import quantize

__all__ = ["FORMATS", "QTensor", "combine_rows", "concat_rows", "prequantized_format", "quantize", "read_linear"]
