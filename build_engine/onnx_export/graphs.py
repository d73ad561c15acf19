"""One layer graph under construction: its named inputs and outputs, and the step that seals it.

Graphs are written with onnxscript's GraphBuilder (`g.op.MatMul(a, b)` appends a node and infers
its output type; Python scalars become constants of the matching type). Everything a layer reads
that is not a config constant — weights, activations, per-sequence state — is a graph input, so one
graph serves every layer of its type; constants end up as Constant nodes, and a sealed graph has no
initializers at all.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript import GraphBuilder

OPSET = 21
"""Default-domain opset of every graph. float8 types need >= 19 (Cast, Reshape, Scan with float8);
ONNX Runtime implements opset 21 since 1.18 (here 1.32, the GPU box 1.30), and every op used here is
at its current version in 21 or unchanged since."""
IR_VERSION = 10
"""IR version 10 goes with opset 21 (ONNX 1.16); ONNX Runtime >= 1.18 loads it."""

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64

Dim = int | str
"""A static size, or the name of a dynamic one ("B", "T", "S_past", "S")."""


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as the manifest records it."""

    name: str
    dtype: str
    """ONNX element type name in lower case: float, bfloat16, float8e4m3fn, uint8, int64."""
    shape: tuple[Dim, ...]
    bytes_of: str | None = None
    """Set on a uint8 input that takes the raw bytes of a tensor stored in this dtype (float8e4m3fn):
    feed the stored buffer reinterpreted as uint8, no conversion."""

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        return d | ({"bytes_of": self.bytes_of} if self.bytes_of else {})


def _dtype_name(dtype: ir.DataType) -> str:
    return dtype.name.lower()


def _spec(value: ir.Value, bytes_of: ir.DataType | None = None) -> TensorSpec:
    dims = tuple(d if isinstance(d, int) else str(d) for d in value.shape.dims)
    return TensorSpec(value.name, _dtype_name(value.dtype), dims, bytes_of and _dtype_name(bytes_of))


class LayerGraph:
    """Builds one graph: `input`/`output` declare its interface, `op` appends nodes."""

    def __init__(self, name: str):
        self.graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name=name)
        self.builder = GraphBuilder(self.graph)
        self.op = self.builder.op
        self._inputs: dict[str, ir.Value] = {}
        self._constants: dict[str, ir.Value] = {}
        self._bytes_of: dict[str, ir.DataType] = {}

    def input(self, name: str, dtype: ir.DataType, shape: tuple[Dim, ...],
              bytes_of: ir.DataType | None = None) -> ir.Value:
        """Declare a graph input. Asking twice for one name returns the same input (shapes must agree).

        bytes_of: the input is uint8 holding the raw bytes of a tensor stored in that dtype.
        """
        if bytes_of is not None:
            self._bytes_of[name] = bytes_of
        if name in self._inputs:
            known = self._inputs[name]
            if known.dtype != dtype or tuple(known.shape.dims) != tuple(ir.Shape(shape).dims):
                raise AssertionError(f"input '{name}' declared twice with different types or shapes")
            return known
        value = self.builder.input(name, dtype, list(shape))
        self._inputs[name] = value
        return value

    def weight(self, name: str, shape: tuple[int, ...]) -> ir.Value:
        """A float32 parameter that is not a linear weight (norms, conv taps, A_log, dt_bias, biases)."""
        return self.input(name, FLOAT, shape)

    def output(self, value: ir.Value, name: str, shape: tuple[Dim, ...]) -> None:
        """Declare `value` a graph output under `name` with the contract's shape."""
        if value.is_graph_input() or value.is_graph_output():
            value = self.op.Identity(value)
        value.shape = ir.Shape(list(shape))
        self.builder.add_output(value, name)

    def constant(self, array: np.ndarray, name: str) -> ir.Value:
        """A named constant tensor (lookup tables, inverse frequencies), made once per graph."""
        if name not in self._constants:
            self._constants[name] = self.op.Constant(value=ir.tensor(array, name=name), _outputs=[name])
        return self._constants[name]

    @contextlib.contextmanager
    def scope(self, name: str):
        """Prefix the names of values made inside (Netron shows `v_attn.MatMul_12`)."""
        self.builder.push_module(name)
        try:
            yield
        finally:
            self.builder.pop_module()

    def inputs(self) -> list[TensorSpec]:
        return [_spec(v, self._bytes_of.get(v.name)) for v in self.graph.inputs]

    def outputs(self) -> list[TensorSpec]:
        return [_spec(v) for v in self.graph.outputs]

    def to_proto(self) -> onnx.ModelProto:
        """Seal the graph: constants become Constant nodes, the model must pass the full checker."""
        _constants_to_nodes(self.graph)
        proto = ir.to_proto(ir.Model(self.graph, ir_version=IR_VERSION, producer_name="atlas-build"))
        onnx.checker.check_model(proto, full_check=True)
        return proto


def _constants_to_nodes(graph: ir.Graph) -> None:
    """Turn the builder's constant initializers (promoted Python scalars) into Constant nodes.

    Initializers would also work in ONNX Runtime, but then "every initializer is a config constant"
    is something a reader has to check; with none, a graph's inputs are visibly all it reads.
    """
    nodes = []
    for name, value in list(graph.initializers.items()):
        graph.initializers.pop(name)
        nodes.append(ir.Node("", "Constant", inputs=[], outputs=[value], name=f"const_{name}",
                             attributes=[ir.AttrTensor("value", value.const_value)]))
    if nodes:
        graph.insert_before(graph.node(0), nodes)
