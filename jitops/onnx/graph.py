"""A read-only view of an ONNX graph for matching: shapes, dtypes, constants, producers, consumers.

Shapes come from onnx.shape_inference run on a copy of the model whose graph inputs have the
user's shapes substituted for dynamic dimensions; a dimension still unknown after that is None.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

log = logging.getLogger("jitops.onnx")

Shape = tuple[int | None, ...]

# TensorProto element types jitops cares about (others are reported by number).
ONNX_DTYPES = {1: "float32", 10: "float16", 11: "float64", 6: "int32", 7: "int64", 9: "bool", 16: "bfloat16",
               2: "uint8"}


def onnx_dtype(elem_type: int) -> str:
    return ONNX_DTYPES.get(int(elem_type), f"onnx-type-{int(elem_type)}")


def load_model(model: Any) -> Any:
    """A ModelProto from a ModelProto, a path or serialized bytes."""
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return onnx.load(str(model))


def default_opset(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def with_input_shapes(model: Any, input_shapes: Mapping[str, Sequence[int]] | None) -> Any:
    """A copy of `model` with graph input dimensions set from `input_shapes` (name -> shape)."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not input_shapes:
        return m
    known = {i.name for i in m.graph.input}
    unknown = set(input_shapes) - known
    if unknown:
        raise ValueError(f"input_shapes names {sorted(unknown)} are not graph inputs (inputs: {sorted(known)})")
    for inp in m.graph.input:
        shape = input_shapes.get(inp.name)
        if shape is None:
            continue
        dims = inp.type.tensor_type.shape.dim
        if len(dims) not in (0, len(shape)):
            raise ValueError(f"input_shapes['{inp.name}'] has rank {len(shape)}, the model's input has {len(dims)}")
        del dims[:]
        for s in shape:
            dims.add().dim_value = int(s)
    return m


class GraphView:
    """What the matchers ask of a graph: shapes, dtypes, constant values, producers, consumers."""

    def __init__(self, model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None):
        import onnx
        from onnx import numpy_helper
        self.model = model
        self.opset = default_opset(model)
        shaped = _infer(with_input_shapes(model, input_shapes))
        g = shaped.graph
        self.graph = model.graph
        self.types: dict[str, tuple[Shape | None, str]] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                continue
            shape: Shape | None = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                              for d in tt.shape.dim)
            self.types[vi.name] = (shape, onnx_dtype(tt.elem_type))
        self.initializers: dict[str, Any] = {t.name: t for t in model.graph.initializer}
        self._constants: dict[str, np.ndarray] = {}
        for name, t in self.initializers.items():
            self.types.setdefault(name, (tuple(int(d) for d in t.dims), onnx_dtype(t.data_type)))
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in model.graph.node:
            for o in node.output:
                if o:
                    self.producer[o] = node
            for i in node.input:
                if i:
                    self.consumers.setdefault(i, []).append(node)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
                value = _constant_value(node, numpy_helper)
                if value is not None:
                    self._constants[node.output[0]] = value
                    self.types.setdefault(node.output[0], (tuple(value.shape), str(value.dtype)))
        self.outputs = {o.name for o in model.graph.output}
        self._numpy_helper = numpy_helper
        self._onnx = onnx

    # ---- values
    def shape(self, name: str) -> Shape | None:
        return self.types.get(name, (None, ""))[0]

    def dtype(self, name: str) -> str:
        return self.types.get(name, (None, "unknown"))[1]

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        s = self.shape(name)
        if s is None or any(d is None for d in s):
            return None
        return tuple(int(d) for d in s)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node output, else None."""
        if name in self._constants:
            return self._constants[name]
        t = self.initializers.get(name)
        if t is None:
            return None
        value = self._numpy_helper.to_array(t)
        self._constants[name] = value
        return value

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self._constants

    def scalar(self, name: str) -> float | None:
        v = self.constant(name)
        if v is None or v.size != 1:
            return None
        return float(v.reshape(-1)[0])

    # ---- graph structure
    def only_consumer(self, name: str) -> Any | None:
        """The single node reading `name`, when it is not also a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        return users[0]

    def attrs(self, node: Any) -> dict[str, Any]:
        return {a.name: self._onnx.helper.get_attribute_value(a) for a in node.attribute}


# Ops whose output has the input's shape and type, for the cases onnx's inference leaves open
# (function ops such as GroupNormalization in some onnx versions).
SAME_AS_INPUT = {"GroupNormalization", "LayerNormalization", "RMSNormalization", "BatchNormalization",
                 "InstanceNormalization", "LeakyRelu", "Relu", "Sigmoid", "Tanh", "Gelu", "Softmax", "Erf"}


def _infer(model: Any, rounds: int = 8) -> Any:
    """onnx shape inference, then fill shape-preserving ops it left open and infer again."""
    from onnx import shape_inference
    for _ in range(rounds):
        try:
            model = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # a model onnx cannot infer (custom ops...): use what it declares
            log.warning("onnx shape inference failed (%s); using the shapes the model declares", exc)
            return model
        g = model.graph
        typed = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]
                 if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
        typed.update({t.name: None for t in g.initializer})
        added = 0
        for node in g.node:
            if node.op_type in SAME_AS_INPUT and node.domain in ("", "ai.onnx") and node.input \
                    and typed.get(node.input[0]) is not None and node.output and node.output[0] not in typed:
                vi = g.value_info.add()
                vi.CopyFrom(typed[node.input[0]])
                vi.name = node.output[0]
                typed[vi.name] = vi
                added += 1
        if not added:
            break
    return model


def _constant_value(node: Any, numpy_helper: Any) -> np.ndarray | None:
    from onnx import helper
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.name == "value":
            return numpy_helper.to_array(v)
        if a.name == "value_float":
            return np.array(v, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(v), dtype=np.float32)
        if a.name == "value_int":
            return np.array(v, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(v), dtype=np.int64)
    return None
