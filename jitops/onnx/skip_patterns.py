"""The residual Add in front of a LayerNorm / RmsNorm candidate, taken into the same jitops node
(ORT's SkipLayerNormalization, which ORT's own optimizer forms when the LayerNormalization stays ONNX):

    [MatMul ->] Add(h, bias) -> Add(., r) -> LayerNormalization      (or its pre-opset-17 decomposition)

becomes jitops::Skip[Bias]LayerNorm[Sum](h, r, scale, B[, bias]) computing y = LN(h + r [+ bias]).
The Sum types also write the Add's output s = h + r [+ bias] (the next residual branch reads it in a
transformer block), so nothing of the graph is lost. Without this, a jitops LayerNorm node takes the
LayerNormalization away from ORT's fusion and the Add runs as its own kernel.

Conditions (each form is tried, most fused first; the plain norm stays the fallback):
- the Add has two inputs of the same known shape and dtype (no broadcasting: the residual is read
  element by element), its output is x of the norm;
- the bias form: one Add input is itself Add(h, c) with c a constant of the normalized length (the
  exporter's Linear bias), read by nothing else;
- with other readers of s (or s a graph output) the Sum type, and every such reader comes after
  the norm's last node in the graph order (the fused node sits there).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .graph import GraphView
from .matchers import ONNX_DOMAINS, Candidate, Match, Namer

def skip_type(base: str, bias: bool, with_sum: bool) -> str:
    """The node type of a residual form of `base` (optypes._skip_norms declares them)."""
    return f"Skip{'Bias' if bias else ''}{base}{'Sum' if with_sum else ''}"


def _add(view: GraphView, value: str) -> Any | None:
    node = view.producer.get(value)
    if node is None or node.op_type != "Add" or node.domain not in ONNX_DOMAINS or len(node.input) != 2:
        return None
    return node


def _bias_of(view: GraphView, value: str, shape: tuple, length: int, namer: Namer
             ) -> tuple[Any, str, str, dict[str, np.ndarray]] | None:
    """`value` = Add(h, c) with c a constant of `length` elements and nothing else reading `value`:
    (the Add, h, the bias name, new constants)."""
    node = _add(view, value)
    if node is None or view.only_consumer(value) is None:
        return None
    for h, c in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        const = view.constant(c)
        if const is None or view.is_constant(h) or view.shape(h) != shape or view.dtype(h) != view.dtype(value):
            continue
        if const.size != length or any(d != 1 for d in const.shape[:-1]) or const.shape[-1:] != (length,):
            continue
        if const.shape == (length,):
            return node, h, c, {}
        new = namer(c, "bias")
        return node, h, new, {new: np.ascontiguousarray(const.reshape(length))}
    return None


def with_skip(view: GraphView, cand: Candidate, base: str, namer: Namer) -> Iterator[Match]:
    """The residual forms of a norm candidate (most fused first), then the candidate itself."""
    yield from _skip_forms(view, cand, base, namer)
    yield cand


def _skip_forms(view: GraphView, cand: Candidate, base: str, namer: Namer) -> Iterator[Candidate]:
    x = cand.inputs[0]
    add = _add(view, x)
    shape = view.shape(x)
    if add is None or shape is None or not shape or shape[-1] is None:
        return
    a, b = add.input
    if a == b or view.is_constant(a) or view.is_constant(b):
        return
    if any(view.shape(v) != shape or view.dtype(v) != view.dtype(x) for v in (a, b)):
        return
    order = {id(n): i for i, n in enumerate(view.graph.node)}
    last = max(order[id(n)] for n in cand.nodes)
    others = [n for n in view.consumers.get(x, []) if all(n is not m for m in cand.nodes)]
    with_sum = bool(others) or x in view.outputs
    if any(order.get(id(n), -1) <= last for n in others):
        return      # a reader of the sum sits before the fused node: it would read a value not yet written
    extra = [x] if with_sum else []
    for h, r in ((a, b), (b, a)):
        found = _bias_of(view, h, shape, int(shape[-1]), namer)
        if found is None:
            continue
        bias_add, h_in, bias, consts = found
        values = {**cand.values, **{n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}}
        yield Candidate(skip_type(base, True, with_sum), [bias_add, add, *cand.nodes],
                        [h_in, r, *cand.inputs[1:], bias], dict(cand.attrs), cand.output,
                        {**cand.constants, **consts}, list(cand.extra_nodes), values, extra_outputs=extra)
        break
    yield Candidate(skip_type(base, False, with_sum), [add, *cand.nodes], [a, b, *cand.inputs[1:]],
                    dict(cand.attrs), cand.output, dict(cand.constants), list(cand.extra_nodes),
                    dict(cand.values), extra_outputs=extra)


def skipped(matcher: Any, base: str) -> Any:
    """`matcher` with the residual forms in front of each of its `base` candidates (when fusing)."""
    def match(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
        for m in matcher(view, node, fuse, namer):
            if fuse and isinstance(m, Candidate) and m.op_type == base:
                yield from with_skip(view, m, base, namer)
            else:
                yield m
    match.__name__ = matcher.__name__
    match.__doc__ = matcher.__doc__
    return match
