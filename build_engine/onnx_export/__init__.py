"""ONNX export of the canonical layer types: one graph per type, weights and state as graph inputs.

Entry point: export_onnx(config, out_dir, weight_formats) -> manifest fragment. See export.py for
the graph contract, dequant.py for the weight storage formats, layers.py for each graph's interface.
"""

from atlas.build_engine.onnx_export.dequant import FORMATS
from atlas.build_engine.onnx_export.export import LAYER_TYPES, export_onnx, graph_formats, layer_types, linear_prefixes
from atlas.build_engine.onnx_export.graphs import IR_VERSION, OPSET

__all__ = ["FORMATS", "IR_VERSION", "LAYER_TYPES", "OPSET", "export_onnx", "graph_formats", "layer_types",
           "linear_prefixes"]
