"""Causal masks that exporters compute from shapes, proved so the attention node can take is_causal.

torch's scaled_dot_product_attention(is_causal=True) exports its mask as Shape -> Expand(1) ->
Trilu -> Equal(0) -> Where(-inf, 0) -> Add, and GPT-style models slice a constant tril buffer and
masked_fill the scores with -inf. Read as an additive mask, the kernel reads Sq x Sk mask values per
(batch, head) and computes every key tile; with is_causal it skips the tiles above the diagonal
(about half of the work at prefill) and reads no mask. A mask is taken as causal only when
- it is computed from shapes and constants alone: every path up from it ends at a Shape node (of
  the model's data, or of a value computed here) or a constant, through shape, index and elementwise
  ops (_SHAPE_OPS: no data of any other value, no randomness);
- exactly one thing in it varies along the positions: one Trilu node or one constant table whose
  last two axes are triangular; and each node on the way down takes that variation from one input
  only (so no two shifted copies of the triangle make a band, as sliding-window masks do);
  or else (masks built from position indices, as transformers 5 writes them: Range, GatherND of the
  query and key indices, LessOrEqual, a packed-sequence check through CumSum) every number in it is
  small: no constant of magnitude above GENERAL_LIMIT - 3 (sentinels of 2^31 and more, and the fill
  values, aside), so the probes below, one of them at more positions than any such constant, would
  see a sliding window's or a chunk's edge;
- evaluated (onnx's reference evaluator) with every symbolic input dim at 5, then with the symbols
  at distinct sizes (12, 15, 18, ...: a bottom-right mask over different query and key lengths shows
  itself there), it is the top-left causal mask of the scores' [Sq, Sk]: 0 where key j <= query i,
  at most -1e4 (or -inf) elsewhere, the same for every batch and head.
Anything else keeps its mask (padding masks read input data; KV-cache masks are bottom-right).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .graph import GraphView

log = logging.getLogger("jitops.onnx")

PROBES = ((5, 0), (12, 3))  # (size, spread): symbol k at size + k * spread (GraphView.at_size)
GENERAL_LIMIT = 64          # masks without a single triangle: every constant below this - 3, one probe past it
HIDDEN = -1e4               # an additive mask value at or below this hides its key (exp underflows to 0)
MAX_NODES = 256

_SHAPE_OPS = {"Constant", "ConstantOfShape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape",
              "Expand", "Cast", "CastLike", "Identity", "Mul", "Add", "Sub", "Div", "Neg", "Max", "Min",
              "Not", "And", "Or", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Trilu",
              # index arithmetic of masks built from positions (transformers 5 under torch.export)
              "Range", "CumSum", "GatherND", "GatherElements", "Tile", "Mod", "Floor", "Transpose", "Flatten", "Size"}
_COMPARE = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}


def causal_mask(view: GraphView, mask: str, scores: str, where: tuple[float, bool] | None = None) -> bool:
    """True when the additive mask `mask` added to `scores` [.., Sq, Sk] is the top-left causal mask
    at every size (module docstring). where = (fill, fill_first): `mask` is instead the condition of
    masked_fill, the additive mask being Where(mask, fill, 0) (fill_first) or Where(mask, 0, fill)."""
    if where is not None and not where[0] <= HIDDEN:
        return False
    nodes = mask_subgraph(view, mask)
    if nodes is None:
        return False
    probes = probe_sizes(view)
    if not _one_triangle(view, nodes, mask):
        largest = _largest_constant(view, nodes)
        if largest + 3 > GENERAL_LIMIT or "Trilu" in {n.op_type for n in nodes}:
            return False
        if probes != ((0, 0),) and largest + 3 > max(size for size, _ in probes):
            probes += ((int(largest) + 3, 0),)
    try:
        return all(_probe(view, nodes, mask, scores, size, where) for size in probes)
    except Exception as exc:       # noqa: BLE001 -- a probe that cannot run proves nothing; keep the mask
        log.debug("causal mask probe of %s failed: %s", mask, exc)
        return False


def mask_subgraph(view: GraphView, value: str, data: list[str] | None = None) -> list[Any] | None:
    """The nodes computing `value` from constants and Shape nodes (topological order), or None when
    any path reads other data, leaves the allowed ops or runs past MAX_NODES. With `data` (a list to
    fill), graph inputs may be read as data too and are appended to it (key_masks)."""
    order: list[Any] = []
    seen: set[str] = set()
    inputs = {i.name for i in view.graph.input} - set(view.initializers) if data is not None else set()

    def visit(name: str) -> bool:
        if not name or name in seen or view.is_constant(name) and view.producer.get(name) is None:
            return True
        seen.add(name)
        if name in inputs:
            data.append(name)
            return True
        node = view.producer.get(name)
        if node is None or node.domain not in ("", "ai.onnx") or len(order) >= MAX_NODES:
            return False      # a graph input read as data, a custom op, or too large to be a mask
        if node.op_type == "Shape":
            # a Shape of a value computed from shapes too (index tensors whose sizes inference leaves
            # open): take that computation in; of anything else (the model's data), a leaf
            mark, known, data_mark = len(order), set(seen), len(data) if data is not None else 0
            if not visit(node.input[0]):
                del order[mark:]
                if data is not None:
                    del data[data_mark:]
                seen.clear()
                seen.update(known)
            order.append(node)
            return True
        if node.op_type not in _SHAPE_OPS or any(a.type in (5, 10) for a in node.attribute):
            return False
        if not all(visit(i) for i in node.input):
            return False
        order.append(node)
        return True

    return order if visit(value) else None


def _one_triangle(view: GraphView, nodes: list[Any], mask: str) -> bool:
    """Exactly one source of variation along the positions (a Trilu, or a constant of rank >= 2 whose
    last two axes hold a triangle), and every node takes position-varying data from one input at most."""
    sources = [n.output[0] for n in nodes if n.op_type == "Trilu"]
    consts = {i for n in nodes for i in n.input if i and view.is_constant(i) and view.producer.get(i) is None}
    consts |= {n.output[0] for n in nodes if n.op_type == "Constant"}
    tables = [c for c in consts if _triangular(view.constant(c))]
    varying = set(sources) | set(tables)
    if len(varying) != 1:
        return False
    for n in nodes:
        if n.op_type == "Shape":
            continue
        inputs = [i for i in n.input if i in varying]
        if n.op_type == "Trilu" and any(i in varying for i in n.input):
            return False
        if len(inputs) > 1 or n.op_type in _COMPARE and inputs and not all(
                view.is_constant(i) or i in varying for i in n.input):
            return False      # two copies of the triangle combined, or compared with something not constant
        if inputs:
            varying.update(o for o in n.output if o)
    return mask in varying


def _largest_constant(view: GraphView, nodes: list[Any]) -> float:
    """The largest magnitude of a finite constant the mask's nodes read, sentinels (2^31 and more: slice
    ends) and fill values (floats at or below HIDDEN) aside; infinity for a table (more than 64 values)."""
    largest = 0.0
    for n in nodes:
        values = [view.constant(i) for i in n.input if i and view.producer.get(i) is None and view.is_constant(i)]
        if n.op_type == "Constant":
            values.append(view.constant(n.output[0]))
        for v in values:
            if v is None or v.dtype.kind not in "iufb":
                continue
            if v.size > 64:
                return float("inf")
            x = np.asarray(v, dtype=np.float64).ravel()
            if v.dtype.kind == "f":
                x = x[x > HIDDEN]       # fills (float16's lowest, -1e9, -inf) hide keys; they are not positions
            a = np.abs(x)
            a = a[np.isfinite(a) & (a < 2.0 ** 31)]
            largest = max(largest, float(a.max(initial=0.0)))
    return largest


def _triangular(table: np.ndarray | None) -> bool:
    """A constant whose last two axes are lower (or upper) triangular and not constant: a causal table."""
    if table is None or table.ndim < 2 or min(table.shape[-2:]) < 2 or table.size > 1 << 24:
        return False
    t = np.asarray(table, dtype=np.float64).reshape(-1, *table.shape[-2:])
    lower, upper = np.tril(t), np.triu(t)
    return not np.all(t == t.reshape(-1)[0]) and (bool(np.all(lower == t)) or bool(np.all(upper == t)))


def probe_sizes(view: GraphView) -> tuple[tuple[int, int], ...]:
    """The probes: PROBES when some graph input dim is symbolic, else the one static shape (0, 0)."""
    symbolic = any(d is None for i in view.graph.input if i.name not in view.initializers
                   for d in (view.shape(i.name) or (None,)))
    return PROBES if symbolic else ((0, 0),)


def probe_views(view: GraphView) -> list[GraphView]:
    """The graph at each probe's sizes (the view itself when its inputs are static): other proofs
    from shapes (attention_heads._repeated_heads) check their dims there too."""
    return [view if size == (0, 0) else view.at_size(*size) for size in probe_sizes(view)]


def _probe(view: GraphView, nodes: list[Any], mask: str, scores: str, size: tuple[int, int],
           where: tuple[float, bool] | None) -> bool:
    """The mask evaluated with the symbolic input dims at `size` ((size, spread), GraphView.at_size;
    (0, 0): the static shapes) against the top-left causal mask of the scores' [Sq, Sk]."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    probe = view if size == (0, 0) else view.at_size(*size)      # as probe_views
    sq_sk = probe.static_shape(scores)
    if sq_sk is None or len(sq_sk) < 2:
        return False
    sq, sk = sq_sk[-2:]
    feeds: dict[str, np.ndarray] = {}
    inputs, inits = [], []
    produced = {o for n in nodes for o in n.output}
    for n in nodes:
        for i in n.input:
            if not i or i in feeds or view.producer.get(i) is not None and n.op_type != "Shape":
                continue
            if n.op_type == "Shape":
                if i in produced:
                    continue        # computed inside the probe
                shape = probe.static_shape(i)
                if shape is None:
                    return False
                feeds[i] = np.zeros(shape, dtype=np.float32)
                inputs.append(helper.make_tensor_value_info(i, 1, shape))
            elif i not in {t.name for t in inits}:
                inits.append(numpy_helper.from_array(view.constant(i), i))
    graph = helper.make_graph(nodes, "mask_probe", inputs, [helper.make_value_info(mask, helper.TypeProto())],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=list(view.model.opset_import))
    value = np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])
    if where is not None:
        fill, fill_first = where
        value = np.where(value, fill, 0.0) if fill_first else np.where(value, 0.0, fill)
    value = np.asarray(value, dtype=np.float64)
    if value.ndim < 2 or value.shape[-2:] != (sq, sk):
        return False
    rows = value.reshape(-1, sq, sk)
    if not np.all(rows == rows[:1]):
        return False      # differs between batches or heads: not a shape-only causal mask
    visible = np.tril(np.ones((sq, sk), dtype=bool))
    return bool(np.all(rows[0][visible] == 0.0) and np.all(rows[0][~visible] <= HIDDEN))

