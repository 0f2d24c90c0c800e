"""Small values known before run time: what exporters compute from shapes and constants.

torch writes a Reshape's target as Shape -> Gather -> (Div) -> Unsqueeze -> Concat and SDPA's scale
as Sqrt(1 / Sqrt(Cast(Shape(q)[-1]))). With a symbolic batch, onnx's data propagation gives up on
the whole target at the first unknown entry; here an unknown dim is a NaN that stays in its own
element, so the head dimension and the scale are still known. Only small tensors (shape vectors,
scalars) are evaluated; anything else is None.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

MAX_ELEMENTS = 64
MAX_DEPTH = 24


def _arr(v: Any) -> np.ndarray:
    return np.asarray(v, dtype=np.float64)


def _slice(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    data, starts, ends = args[0], args[1], args[2]
    if starts is None or ends is None:
        return None
    axes = args[3] if len(args) > 3 and args[3] is not None else np.arange(len(starts))
    steps = args[4] if len(args) > 4 and args[4] is not None else np.ones(len(starts))
    if data is None or data.ndim != 1 or not all(np.isfinite(a).all() for a in (starts, ends, axes, steps)):
        return None
    if len(starts) != 1 or int(axes[0]) not in (0, -1):
        return None
    start, end, step = (int(max(min(v, 2**62), -2**62)) for v in (starts[0], ends[0], steps[0]))
    return data[slice(start, end, step)]


def _gather(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    data, idx = args
    axis = int(view.attrs(node).get("axis", 0))
    if data is None or idx is None or data.ndim != 1 or axis != 0 or not np.isfinite(idx).all():
        return None
    return data[idx.astype(np.int64)]


def _concat(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    if any(a is None for a in args):
        return None
    return np.concatenate([a.reshape(-1) for a in args])


def _unsqueeze(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    x = args[0]
    axes = args[1] if len(args) > 1 else view.attrs(node).get("axes")
    if x is None or axes is None:
        return None
    out = x
    for a in sorted(int(v) for v in np.asarray(axes).reshape(-1)):
        out = np.expand_dims(out, a if a >= 0 else a + out.ndim + 1)
    return out


def _squeeze(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    if args[0] is None:
        return None
    return args[0].reshape([d for d in args[0].shape if d != 1])


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def run(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
        if args[0] is None or args[1] is None:
            return None
        with np.errstate(all="ignore"):
            out = fn(args[0], args[1])
        return np.floor(out) if node.op_type == "Div" and _is_int(view, node.output[0]) else out
    return run


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def run(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
        if args[0] is None:
            return None
        with np.errstate(all="ignore"):
            return fn(args[0])
    return run


def _is_int(view: Any, name: str) -> bool:
    return view.dtype(name).startswith(("int", "uint"))


def _cast(view: Any, node: Any, args: list[np.ndarray | None]) -> np.ndarray | None:
    x = args[0]
    if x is None:
        return None
    to = int(view.attrs(node).get("to", 1))
    if to in (6, 7):   # int32 / int64: truncate, NaN stays unknown
        return np.trunc(x)
    if to == 10:
        return x.astype(np.float16).astype(np.float64)
    if to == 1:
        return x.astype(np.float32).astype(np.float64)
    return x


OPS: dict[str, Callable[[Any, Any, list[np.ndarray | None]], np.ndarray | None]] = {
    "Identity": _unary(lambda x: x), "Cast": _cast, "Sqrt": _unary(np.sqrt), "Reciprocal": _unary(lambda x: 1.0 / x),
    "Neg": _unary(np.negative), "Mul": _binary(np.multiply), "Div": _binary(np.divide), "Add": _binary(np.add),
    "Sub": _binary(np.subtract), "Pow": _binary(np.power), "Slice": _slice, "Gather": _gather, "Concat": _concat,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
}


class Evaluator:
    """Values of small tensors computed from constants and the known dims of shapes; NaN = unknown dim."""

    def __init__(self, view: Any):
        self.view = view
        self.memo: dict[str, np.ndarray | None] = {}

    def value(self, name: str, depth: int = 0) -> np.ndarray | None:
        if not name:
            return None
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = None      # cycles (not in a valid graph) and deep chains end as unknown
        result = self._compute(name, depth)
        if result is not None and result.size > MAX_ELEMENTS:
            result = None
        self.memo[name] = result
        return result

    def _compute(self, name: str, depth: int) -> np.ndarray | None:
        view = self.view
        shape = view.shape(name)
        if shape is not None and None not in shape and int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
            return None
        const = view.constant(name)
        if const is not None:
            return _arr(const) if const.dtype.kind in "fiub" else None
        node = view.producer.get(name)
        if node is None or depth > MAX_DEPTH or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Shape":
            src = view.shape(node.input[0])
            if src is None:
                return None
            dims = _arr([np.nan if d is None else d for d in src])
            a = view.attrs(node)
            return dims[int(a.get("start", 0)): a.get("end", None)]
        fn = OPS.get(node.op_type)
        if fn is None or node.output[0] != name:
            return None
        args = [self.value(i, depth + 1) if i else None for i in node.input]
        try:
            return fn(view, node, args)
        except (ValueError, TypeError, IndexError, OverflowError):   # best effort: unknown, never a crash
            return None
