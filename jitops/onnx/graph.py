"""A read-only view of an ONNX graph for matching: shapes, dtypes, constants, producers, consumers.

Shapes come from onnx.shape_inference run on a copy of the model whose graph inputs have the
user's shapes substituted for dynamic dimensions (large initializers' data left out: inference
needs their shapes only, and copying them made ViT-B/16's inference take 5.5 s instead of 0.03).
Reshape targets computed at run time from Shape/Gather/Concat (as torch exports them) are
evaluated here where onnx leaves them open, so a head dimension stays known under a symbolic
batch. A dimension still unknown after that is None (symbolic).
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
        self.graph = model.graph
        self.initializers: dict[str, Any] = {t.name: t for t in model.graph.initializer}
        self.types: dict[str, tuple[Shape | None, str]] = {}
        self._constants: dict[str, np.ndarray] = {}
        self._dim_params: dict[str, tuple[str | None, ...]] = {}    # symbolic dims by name, as onnx inferred them
        self._sized: dict[tuple[int, int], GraphView] = {}           # at_size's views, by (size, spread)
        self.proofs: dict[tuple, bool] = {}     # probe results by (kind, values...): once per mask, not per layer
        self._numpy_helper = numpy_helper
        self._onnx = onnx
        self._read_types(_infer(_without_large_data(with_input_shapes(model, input_shapes))))
        for name, t in self.initializers.items():
            self.types.setdefault(name, (tuple(int(d) for d in t.dims), onnx_dtype(t.data_type)))
        self.producer: dict[str, Any] = {}
        self.consumers = consumers_of(model.graph)
        for node in model.graph.node:
            for o in node.output:
                if o:
                    self.producer[o] = node
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
                value = _constant_value(node, numpy_helper)
                if value is not None:
                    self._constants[node.output[0]] = value
                    self.types.setdefault(node.output[0], (tuple(value.shape), str(value.dtype)))
        self.outputs = {o.name for o in model.graph.output}
        self._refine_reshapes()

    def _read_types(self, shaped: Any) -> None:
        g = shaped.graph
        for vi in [*g.input, *g.value_info, *g.output]:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                continue
            shape: Shape | None = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                              for d in tt.shape.dim)
            self.types[vi.name] = (shape, onnx_dtype(tt.elem_type))
            if tt.HasField("shape"):
                self._dim_params[vi.name] = tuple(d.dim_param or None for d in tt.shape.dim)

    def _refine_reshapes(self) -> None:
        """Fill the dims onnx left open on Reshape outputs whose target we can evaluate here
        (torch writes head_dim as Shape -> Gather -> Div -> Concat; onnx's data propagation stops
        at the first symbolic dim). Then shapes are carried through Transpose and same-shape ops."""
        from .evaluate import Evaluator
        ev = Evaluator(self)
        for node in self.graph.node:
            if node.domain not in ("", "ai.onnx") or not node.output:
                continue
            try:
                self._refine(node, ev)
            except (ValueError, TypeError, IndexError, KeyError) as exc:   # best effort: never a crash
                log.debug("shape refinement skipped %s: %s", node.name or node.op_type, exc)

    def _refine(self, node: Any, ev: Any) -> None:
        """One node's output dims from what is known of its inputs (None where still unknown)."""
        out = node.output[0]
        have = self.shape(out)
        if node.op_type == "Reshape" and (have is None or None in have):
            refined = _reshape_dims(self.shape(node.input[0]), ev.value(node.input[1]),
                                    int(self.attrs(node).get("allowzero", 0)))
            if refined is not None and (have is None or len(have) == len(refined)):
                self.types[out] = (_merge(have, refined), self.dtype(out))
        elif node.op_type == "Transpose" and have is not None and None in have:
            src = self.shape(node.input[0])
            perm = self.attrs(node).get("perm") or list(range(len(src or ())))[::-1]
            if src is not None and len(src) == len(have) == len(perm):
                self.types[out] = (_merge(have, tuple(src[int(p)] for p in perm)), self.dtype(out))
        elif node.op_type in SAME_AS_INPUT and have is not None and None in have:
            src = self.shape(node.input[0])
            if src is not None and len(src) == len(have):
                self.types[out] = (_merge(have, src), self.dtype(out))
        elif node.op_type in ("Mul", "Div", "Add", "Sub", "Where") and have is not None and None in have:
            shapes = [self.shape(i) for i in node.input]
            if all(sh is not None for sh in shapes):
                b = _broadcast(*shapes)
                if len(b) == len(have):
                    self.types[out] = (_merge(have, b), self.dtype(out))

    # ---- values
    def shape(self, name: str) -> Shape | None:
        return self.types.get(name, (None, ""))[0]

    def same_dim(self, a: str, i: int, b: str, j: int) -> bool:
        """True when dim i of value a is known to equal dim j of value b: both known and equal, or
        the same symbolic dim (onnx names one it cannot size once, and carries the name on)."""
        sa, sb = self.shape(a), self.shape(b)
        if sa is None or sb is None or not (-len(sa) <= i < len(sa) and -len(sb) <= j < len(sb)):
            return False
        if sa[i] is not None and sb[j] is not None:
            return sa[i] == sb[j]
        pa, pb = self._dim_params.get(a, ()), self._dim_params.get(b, ())
        return len(pa) == len(sa) and len(pb) == len(sb) and pa[i] is not None and pa[i] == pb[j]

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
        """A one-element value known before run time: a constant, or a small computation on constants
        and known dims (torch writes SDPA's scale as Sqrt(1 / Sqrt(Cast(Shape(q)[-1]))))."""
        v = self.constant(name)
        if v is None:
            from .evaluate import Evaluator
            v = Evaluator(self).value(name)
        if v is None or v.size != 1 or np.isnan(np.asarray(v, dtype=np.float64)).any():   # NaN: an unknown dim
            return None
        return float(np.asarray(v).reshape(-1)[0])

    # ---- graph structure
    def only_consumer(self, name: str) -> Any | None:
        """The single node reading `name`, when it is not also a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        return users[0]

    def attrs(self, node: Any) -> dict[str, Any]:
        return {a.name: self._onnx.helper.get_attribute_value(a) for a in node.attribute}

    def at_size(self, size: int, spread: int = 0) -> "GraphView":
        """This graph with its symbolic input dims set, shapes inferred again: the k-th distinct symbol
        (by name; an unnamed dim counts as its own) at size + k * spread. Remembered: the causal-mask
        probes ask once per size, whatever the number of attention layers."""
        views = self._sized
        if (size, spread) not in views:
            inputs = [i.name for i in self.graph.input if i.name not in self.initializers and self.shape(i.name)]
            symbols = sorted({p for n in inputs for p in self._dim_params.get(n, ()) if p})
            unnamed = iter(range(len(symbols), 1 << 20))
            shapes = {}
            for n in inputs:
                params = self._dim_params.get(n) or (None,) * len(self.shape(n))
                shapes[n] = [int(d) if d is not None else
                             size + spread * (symbols.index(p) if p else next(unnamed))
                             for d, p in zip(self.shape(n), params)]
            views[(size, spread)] = GraphView(self.model, shapes)
        return views[(size, spread)]


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
        producer = {o: n for n in g.node for o in n.output if o}
        for node in g.node:
            if node.domain not in ("", "ai.onnx") or not node.input or not node.output or node.output[0] in typed:
                continue
            like = None
            if node.op_type in SAME_AS_INPUT:
                like = typed.get(node.input[0])
            elif node.op_type == "Reshape" and len(node.input) > 1:
                # Reshape(x, Shape(y)): y's shape (torch's GroupNorm reshapes back to its input's shape so,
                # which onnx leaves open at opset 13; a Conv after it then had no known rank)
                src = producer.get(node.input[1])
                whole = src is not None and src.op_type == "Shape" and src.domain in ("", "ai.onnx") \
                    and not any(a.name == "end" or (a.name == "start" and a.i != 0) for a in src.attribute)
                data = typed.get(node.input[0])
                if whole and typed.get(src.input[0]) is not None and data is not None:
                    like = typed[src.input[0]]
            if like is not None:
                vi = g.value_info.add()
                vi.CopyFrom(like)
                vi.name = node.output[0]
                if node.op_type == "Reshape":           # the data's element type, the shape's dims
                    vi.type.tensor_type.elem_type = typed[node.input[0]].type.tensor_type.elem_type
                typed[vi.name] = vi
                added += 1
        if not added:
            break
    return model


def _merge(have: Shape | None, new: Sequence[int | None]) -> Shape:
    if have is None:
        return tuple(new)
    return tuple(h if h is not None else n for h, n in zip(have, new))


def _broadcast(*shapes: Shape) -> Shape:
    """numpy broadcasting of shapes with unknown (None) dims."""
    rank = max(len(sh) for sh in shapes)
    out: list[int | None] = []
    for i in range(rank):
        dims = [sh[i - rank + len(sh)] for sh in shapes if i - rank + len(sh) >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) == 1:
            out.append(known.pop())
        elif not known and all(d == 1 for d in dims):
            out.append(1)
        else:
            out.append(None)
    return tuple(out)


def _reshape_dims(src: Shape | None, target: np.ndarray | None, allowzero: int) -> Shape | None:
    """Reshape's output dims from a target whose entries may be NaN (unknown)."""
    if target is None or target.ndim != 1:
        return None
    out: list[int | None] = []
    for i, t in enumerate(np.asarray(target, dtype=np.float64)):
        if not np.isfinite(t):
            out.append(None)
        elif t == 0 and not allowzero:
            out.append(src[i] if src is not None and i < len(src) else None)
        else:
            out.append(int(t))
    if out.count(-1) == 1:
        i = out.index(-1)
        rest = [d for j, d in enumerate(out) if j != i]
        total = None if src is None or None in src else int(np.prod(src, dtype=np.int64))
        out[i] = total // int(np.prod(rest, dtype=np.int64)) if total is not None and None not in rest \
            and int(np.prod(rest, dtype=np.int64)) > 0 else None
    if any(d is not None and d < 0 for d in out):
        return None
    return tuple(out)


def consumers_of(graph: Any) -> dict[str, list[Any]]:
    """Value name -> the nodes that read it. A value read inside an If/Loop/Scan body is read by
    that node: never fuse it away, never rename it."""
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for i in {*node.input, *outer_scope_reads(node)}:
            if i:
                consumers.setdefault(i, []).append(node)
    return consumers


def outer_scope_reads(node: Any) -> set[str]:
    """Names a node's subgraphs (If branches, Loop/Scan bodies) read from the enclosing graph."""
    names: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []):
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                names.update(i for i in n.input if i and i not in local)
                names.update(r for r in outer_scope_reads(n) if r not in local)
            names.update(o.name for o in g.output if o.name not in local)
    return names


def _without_large_data(model: Any, limit: int = 256) -> Any:
    """The model (a copy already) with the data of large initializers dropped: shape inference reads
    only small ones (Reshape targets, axes), and copying weights through it costs seconds."""
    for t in model.graph.initializer:
        n = int(np.prod(list(t.dims), dtype=np.int64)) if t.dims else 1
        if n > limit and t.data_location == 0:
            for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                t.ClearField(f)
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
