"""Rewrite an ONNX model so that the nodes jitops runs become nodes of domain `jitops`.

The result is a valid ONNX model: each jitops node keeps ONNX semantics (see optypes and
matchers) and its type is also defined as a model-local function of standard ops, so the model
still runs, unchanged in meaning, in a runtime without the jitops custom ops.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterable, Mapping, Sequence

from .._version import __version__
from .functions import function_for, x_type_attr
from .graph import default_opset, load_model
from .layout import NHWC_TYPES, Transposes
from .nodes import NodeProblem, supported_nodes
from .optypes import DOMAIN, DOMAIN_VERSION, OP_TYPES

log = logging.getLogger("jitops.onnx")

MIN_IR_VERSION = 8          # model-local functions
METADATA_KEY = "jitops.rewrite"


def _jitops_node(p: NodeProblem, opset: int | None, inputs: list[str] | None = None, output: str | None = None) -> Any:
    """The node of domain jitops for a group; `opset`: the model's, where fallback bodies are added (the
    node then carries what its body reads besides the op's attributes: x_type before opset 15)."""
    from onnx import helper
    t = OP_TYPES[p.op_type]
    inputs = list(p.node_inputs if inputs is None else inputs)
    while inputs and not inputs[-1]:      # trailing absent optional inputs are left out
        inputs.pop()
    attrs = {k: v for k, v in p.node_attrs.items() if k in {a.name for a in t.attrs}}
    x = p.inputs.get("x") or p.inputs.get("q")
    if opset is not None and x is not None:
        attrs.update(x_type_attr(p.op_type, opset, x.dtype))
    name = "jitops/" + "+".join(p.nodes)
    return helper.make_node(t.name, inputs, [output or p.node_output, *p.node_extra_outputs], name=name,
                            domain=DOMAIN, **attrs)


def rewrite(model: Any, ops: Iterable[str] | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
            fuse: bool = True, fallback: bool = True, layout: str = "auto") -> Any:
    """A copy of `model` with every node group jitops supports replaced by one node in domain `jitops`.

    model: ModelProto, path or bytes. ops: restrict to these jitops ops (or ONNX op types).
    input_shapes: graph input name -> shape, for dynamic dimensions. Without them a node whose sizes
    are symbolic is still taken when its rank, dtype and kernel-family sizes are known; its ONNX
    Runtime kernel plans per actual shape at run time.
    fuse: Conv + BatchNormalization (folded into the weights) + Add (residual) + Relu/LeakyRelu,
    BatchNormalization + activation, MatMul/Softmax/MatMul attention. fallback: add the ONNX function
    bodies that let the model run without jitops (default on). layout: "auto" keeps fp16 / bf16
    activations channels-last between conv groups that feed each other (Transposes where such a
    region is entered and left, when that saves conversions: jitops.onnx.layout), "nchw" never.
    The replaced groups are `jitops.onnx.supported_nodes(model, input_shapes, ops, fuse, layout)`.
    """
    import onnx
    src = load_model(model)
    problems = supported_nodes(src, input_shapes, ops, fuse, layout)
    out = onnx.ModelProto()
    out.CopyFrom(src)
    g = out.graph
    by_last: dict[int, NodeProblem] = {}
    covered: set[int] = set()
    order = {id(n): i for i, n in enumerate(src.graph.node)}
    for p in problems:
        ids = [id(n) for n in p.covered]
        covered.update(ids)
        by_last[max(ids, key=lambda i: order[i])] = p
    new_nodes = []
    body_opset = default_opset(src) if fallback else None
    transposes = Transposes(src.graph, problems)
    for node in src.graph.node:
        if id(node) not in covered:
            new_nodes.append(node)
            continue
        p = by_last.get(id(node))
        if p is not None:   # the group's last node: its inputs all exist by now
            new_nodes.extend(p.extra_nodes)
            if p.op_type in NHWC_TYPES:
                inputs, output, before, after = transposes.around(p)
                new_nodes += [*before, _jitops_node(p, body_opset, inputs, output), *after]
            else:
                new_nodes.append(_jitops_node(p, body_opset))
            new_nodes.extend(p.after_nodes)
    del g.node[:]
    g.node.extend(_drop_orphans(new_nodes, [n for p in problems for n in p.covered], out.graph))
    _update_initializers(out, problems)
    _drop_dead_value_info(out)
    _declare_outputs(src, out, problems)
    if problems:
        # Types that replace ONNX Attention-23 nodes fall back to that op (is_causal, default scale).
        attention_op = {p.op_type for p in problems if p.onnx_ops == ("Attention",)}
        _declare_domain(out, sorted({p.op_type for p in problems}), fallback, attention_op)
    out.metadata_props.add(key=METADATA_KEY, value=json.dumps(
        {"jitops": __version__, "replaced": [{"nodes": list(p.nodes), "as": p.op_type, "key": p.key,
                                              **({"symbolic": True} if p.problem is None else {})}
                                             for p in problems]}))
    log.info("rewrite: %d node groups -> jitops (%s)", len(problems),
             ", ".join(sorted({p.op_type for p in problems})) or "none")
    return out


def _drop_orphans(nodes: list[Any], covered: list[Any], graph: Any) -> list[Any]:
    """Drop the nodes that only fed the replaced ones (an exporter's scale computed from Shape, an
    epsilon Constant...): nothing reads them any more, and ORT warns about each one left."""
    from .graph import outer_scope_reads
    producer = {o: n for n in nodes for o in n.output if o}
    candidates = [producer[i] for c in covered for i in c.input if i in producer]
    readers: dict[str, int] = {}
    for n in nodes:
        for i in {*n.input, *outer_scope_reads(n)}:
            readers[i] = readers.get(i, 0) + 1
    keep_outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    while candidates:
        n = candidates.pop()
        if id(n) in dropped or n.domain not in ("", "ai.onnx") or any(a.type in (5, 10) for a in n.attribute) \
                or any(o and (readers.get(o, 0) or o in keep_outputs) for o in n.output):
            continue
        dropped.add(id(n))
        for i in set(n.input):
            if i in readers:
                readers[i] -= 1
                if i in producer:
                    candidates.append(producer[i])
    return [n for n in nodes if id(n) not in dropped]


def _declare_outputs(src: Any, model: Any, problems: list[NodeProblem]) -> None:
    """value_info for the jitops nodes' outputs, as onnx inferred them on the source model (same
    names, same values). ORT cannot infer through a custom op: without these its fusions after a
    jitops node see unknown shapes and refuse (BiasGelu after a jitops LayerNorm -> MatMul did)."""
    from .graph import _infer
    wanted = {o for p in problems if p.op_type not in NHWC_TYPES for o in (p.node_output, *p.node_extra_outputs)}
    wanted -= {o.name for o in model.graph.output} | {vi.name for vi in model.graph.value_info}
    if not wanted:
        return
    inferred = _infer(src).graph
    for vi in inferred.value_info:
        if vi.name in wanted and vi.type.tensor_type.HasField("shape"):
            model.graph.value_info.add().CopyFrom(vi)


def _update_initializers(model: Any, problems: list[NodeProblem]) -> None:
    """Add the new constants (folded weights...) and drop initializers nothing reads any more."""
    from onnx import numpy_helper
    g = model.graph
    for p in problems:
        for name, value in p.constants.items():
            g.initializer.append(numpy_helper.from_array(value, name))
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    used |= {i for n in g.node for a in n.attribute if a.type == 5 for i in _subgraph_inputs(a.g)}
    used |= {i for n in g.node for a in n.attribute if a.type == 10 for sg in a.graphs for i in _subgraph_inputs(sg)}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def _subgraph_inputs(graph: Any) -> set[str]:
    names = set()
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            if a.type == 5:
                names |= _subgraph_inputs(a.g)
            elif a.type == 10:
                for sg in a.graphs:
                    names |= _subgraph_inputs(sg)
    return names


def _drop_dead_value_info(model: Any) -> None:
    g = model.graph
    live = {o for n in g.node for o in n.output} | {i.name for i in g.input}
    keep = [vi for vi in g.value_info if vi.name in live]
    if len(keep) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(keep)


def _declare_domain(model: Any, types: list[str], fallback: bool, attention_op: set[str]) -> None:
    from onnx import helper
    if not any(i.domain == DOMAIN for i in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    if fallback:
        opset = default_opset(model)
        have = {(f.domain, f.name) for f in model.functions}
        model.functions.extend(function_for(t, opset, t in attention_op) for t in types if (DOMAIN, t) not in have)
        model.ir_version = max(model.ir_version, MIN_IR_VERSION)
