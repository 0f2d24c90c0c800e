"""Channels-last regions: fp16 / bf16 convolutions that feed each other keep NHWC between them.

ONNX activations are NCHW, but the matrix-core conv2d kernels read and write NHWC: a conv node on
NCHW data converts its input and writes NCHW back, on every node. Where jitops conv groups feed
each other (ResNet's bottlenecks once the shortcut Add is in the conv's epilogue), the values
between them can stay NHWC: one Transpose where a region is entered, one where an NCHW reader
needs the value back. A connected set of convs is switched only when that takes fewer
Transposes than it has convs (each of which would otherwise convert once).

`plan_nhwc` marks the groups (their type gains `Nhwc`, their x / residual specs the layout, so
problem keys, tuning records and bundles see what runs); `Transposes` builds the nodes the
rewrite inserts around them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from ..ops import get_op
from .graph import GraphView, consumers_of
from .matchers import Namer
from .optypes import OP_TYPES

HALF = ("float16", "bfloat16")
NHWC_TYPES = frozenset(name for name, t in OP_TYPES.items() if t.fixed.get("layout") == "nhwc")
NHWC_INPUTS = {"x": 0, "residual": 3}          # conv node input positions that may hold NHWC data
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def nhwc_type(op_type: str) -> str:
    """Conv2dAddRelu -> Conv2dNhwcAddRelu."""
    return "Conv2dNhwc" + op_type[len("Conv2d"):]


def _candidate(p: Any) -> bool:
    x = p.inputs.get("x")
    return (p.supported and p.op == "conv2d" and p.op_type not in NHWC_TYPES and x is not None
            and x.dtype in HALF and len(x.shape) == 4 and nhwc_type(p.op_type) in NHWC_TYPES)


def _nhwc_reads(p: Any) -> list[str]:
    return [p.node_inputs[i] for i in NHWC_INPUTS.values() if i < len(p.node_inputs) and p.node_inputs[i]]


def plan_nhwc(view: GraphView, problems: list[Any]) -> list[Any]:
    """`problems` with the conv groups of profitable channels-last regions switched to NHWC types."""
    convs = [p for p in problems if _candidate(p)]
    by_output = {p.node_output: p for p in convs}
    owner = {id(n): p for p in problems if p.supported for n in p.covered}
    parent = {id(p): id(p) for p in convs}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for p in convs:
        for v in _nhwc_reads(p):
            if v in by_output:
                parent[find(id(p))] = find(id(by_output[v]))
    regions: dict[int, list[Any]] = {}
    for p in convs:
        regions.setdefault(find(id(p)), []).append(p)
    switched: set[int] = set()
    for members in regions.values():
        ids = {id(p) for p in members}
        entries = {v for p in members for v in _nhwc_reads(p)
                   if v not in by_output or id(by_output[v]) not in ids}
        exits = [p for p in members if _read_as_nchw(p.node_output, view.outputs, view.consumers, owner,
                                                     lambda q: id(q) in ids)]
        if len(entries) + len(exits) < len(members):
            switched |= ids
    return [_switch(p) if id(p) in switched else p for p in problems]


def _read_as_nchw(value: str, outputs: set[str], consumers: dict[str, list[Any]], owner: dict[int, Any],
                  in_region: Callable[[Any], bool]) -> bool:
    """Whether anything but an NHWC input of a group in the region reads `value` (a graph output,
    another node, a subgraph): then the value is needed in NCHW too."""
    if value in outputs:
        return True
    for node in consumers.get(value, []):
        q = owner.get(id(node))
        if q is None or not in_region(q) or value not in _nhwc_reads(q):
            return True
    return False


def _switch(p: Any) -> Any:
    inputs = {n: (dataclasses.replace(s, layout="nhwc") if n in NHWC_INPUTS and s is not None else s)
              for n, s in p.inputs.items()}
    problem = get_op("conv2d").make_problem(inputs, p.attrs) if p.problem is not None else None
    return dataclasses.replace(p, op_type=nhwc_type(p.op_type), inputs=inputs, problem=problem)


class Transposes:
    """The Transpose nodes around NHWC groups, one per value and direction, made as the rewrite
    reaches each group (graph order, so every value exists before it is read)."""

    def __init__(self, graph: Any, problems: Iterable[Any]):
        problems = [p for p in problems if p.supported]
        used = {v for n in graph.node for v in (*n.input, *n.output)}
        used |= {t.name for t in graph.initializer} | {v.name for v in (*graph.input, *graph.output)}
        used |= {c for p in problems for c in p.constants}
        self._fresh = Namer(used=used)
        self.outputs = {o.name for o in graph.output}
        self.owner = {id(n): p for p in problems for n in p.covered}
        self.consumers = consumers_of(graph)
        self.nhwc_outputs = {p.node_output: self._fresh(p.node_output, "nhwc") for p in problems
                             if p.op_type in NHWC_TYPES}
        self.entered: dict[str, str] = {}

    def around(self, p: Any) -> tuple[list[str], str, list[Any], list[Any]]:
        """For an NHWC group: its node inputs (NHWC reads redirected), its output name, the
        Transposes to add before it (entering the region) and after it (an NCHW reader follows)."""
        from onnx import helper
        inputs, before = list(p.node_inputs), []
        for i in NHWC_INPUTS.values():
            if i >= len(inputs) or not inputs[i]:
                continue
            v = inputs[i]
            if v in self.nhwc_outputs:
                inputs[i] = self.nhwc_outputs[v]
                continue
            if v not in self.entered:
                self.entered[v] = self._fresh(v, "to_nhwc")
                before.append(helper.make_node("Transpose", [v], [self.entered[v]], perm=TO_NHWC,
                                               name=f"jitops/to_nhwc/{v}"))
            inputs[i] = self.entered[v]
        out = self.nhwc_outputs[p.node_output]
        after = [helper.make_node("Transpose", [out], [p.node_output], perm=TO_NCHW,
                                  name=f"jitops/to_nchw/{p.node_output}")] if _read_as_nchw(
            p.node_output, self.outputs, self.consumers, self.owner, lambda q: q.op_type in NHWC_TYPES) else []
        return inputs, out, before, after
