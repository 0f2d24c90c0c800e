"""ONNX nodes -> jitops problems: what a model would run on jitops, and why the rest would not.

    from jitops.onnx import supported_nodes
    for p in supported_nodes("model.onnx", input_shapes={"x": (1, 3, 224, 224)}):
        print(p.op, p.problem.key(), p.nodes)

This is the single source of truth for `jitops.onnx.rewrite` (which replaces exactly these
nodes), `jitops bundle` (which compiles exactly these problems) and the tuner (which tunes them).
Shapes come from onnx.shape_inference; `input_shapes` fixes dynamic input dimensions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..arrays import logical_shape
from ..errors import ArgumentError, JitopsError
from ..ops import get_op
from ..ops.base import TensorSpec
from .graph import GraphView, load_model
from .layout import plan_nhwc
from .matchers import MATCHERS, ONNX_DOMAINS, Candidate, Namer, Rejection, dies_with, onnx_to_op
from .optypes import OP_TYPES, head_storage_shape

log = logging.getLogger("jitops.onnx")


@dataclass
class NodeProblem:
    """ONNX node(s) one jitops op can run (several when fused), with the op's problem.

    `problem` is the op module's Problem (hashable, `problem.key()` names tuning records); it is
    None when the nodes cannot run on jitops, and `reason` then says why.
    """

    nodes: tuple[str, ...]                  # node names (op_type:first_output when unnamed)
    onnx_ops: tuple[str, ...]               # their ONNX op types, e.g. ("Conv", "BatchNormalization", "Relu")
    op_type: str                            # node type in domain `jitops` (optypes.OP_TYPES)
    op: str                                 # the jitops op: "conv2d", "attention", ...
    inputs: dict[str, TensorSpec | None]    # the op's tensor inputs
    attrs: dict[str, Any]                   # the op's attributes, as jitops.<op>() takes them
    problem: Any | None
    reason: str = ""
    # What the rewrite needs: the jitops node's inputs/outputs/attributes, new constants, inserted nodes.
    node_inputs: tuple[str, ...] = ()
    node_output: str = ""
    node_extra_outputs: tuple[str, ...] = ()     # outputs after node_output (the Skip*Sum norms' sum)
    node_attrs: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    extra_nodes: list[Any] = field(default_factory=list, repr=False)
    after_nodes: list[Any] = field(default_factory=list, repr=False)    # inserted after the jitops node
    covered: list[Any] = field(default_factory=list, repr=False)    # the ONNX NodeProtos replaced
    # Inputs with symbolic sizes (None per unknown dim): taken, planned per actual shape at run time;
    # `problem` is then None and `inputs` show -1 for the unknown dims.
    dynamic: dict[str, tuple[int | None, ...]] = field(default_factory=dict)

    @property
    def supported(self) -> bool:
        return self.problem is not None or (bool(self.dynamic) and not self.reason)

    @property
    def key(self) -> str:
        """The problem key (tuning records, bundles); '' when unsupported or when sizes are symbolic."""
        return self.problem.key() if self.problem is not None else ""

    def describe(self) -> str:
        what = "+".join(self.onnx_ops)
        if self.supported and self.problem is None:
            dims = ", ".join(f"{n}[{','.join('?' if d is None else str(d) for d in s)}]"
                             for n, s in self.dynamic.items())
            return f"{what} -> jitops::{self.op_type} ({self.op}), symbolic sizes {dims}: planned at run time"
        if self.supported:
            return f"{what} -> jitops::{self.op_type} ({self.op}) {self.key}"
        return f"{what} stays ONNX: {self.reason}"


def _node_id(node: Any) -> str:
    return node.name or f"{node.op_type}:{node.output[0] if node.output else '?'}"


def _wanted_ops(ops: Iterable[str] | None) -> set[str] | None:
    """`ops` as jitops op names; ONNX op types (\"Conv\") are accepted too."""
    if ops is None:
        return None
    if isinstance(ops, str):
        ops = [ops]
    known = {t.op for t in OP_TYPES.values()}
    table = onnx_to_op()
    out = set()
    for o in ops:
        name = table.get(o, o)
        if name not in known:
            raise ValueError(f"ops: '{o}' is neither a jitops op ({', '.join(sorted(known))}) "
                             f"nor a supported ONNX op ({', '.join(sorted(table))})")
        out.add(name)
    return out


PROBE = 64     # stands for a symbolic size when asking the op module whether it takes a node


def _problem(view: GraphView, cand: Candidate, order: Mapping[int, int], namer: Namer) -> NodeProblem:
    t = OP_TYPES[cand.op_type]
    cand.nodes = sorted(cand.nodes, key=lambda n: order.get(id(n), -1))
    shapes: dict[str, tuple[int | None, ...] | None] = {}
    dtypes: dict[str, str] = {}
    layout, stored = _stored_inputs(t)
    heads = int(cand.attrs.get("num_heads", 0))
    reason = "" if stored or not layout else f"this jitops' {t.op} op reads no '{layout}' layout"
    for jname, vname in zip(t.inputs, list(cand.inputs) + [""] * len(t.inputs)):
        if not vname:
            shapes[jname] = None
            if jname not in t.optional:
                reason = reason or f"input '{jname}' is missing"
            continue
        shape, dtype = cand.values.get(vname) or (view.shape(vname), view.dtype(vname))
        if shape is None:
            reason = reason or f"the rank of '{vname}' is not known (pass input_shapes=...)"
        elif jname in stored:   # the value holds the input in `layout` order; the op sees the logical shape
            given, shape = len(shape), head_storage_shape(layout, tuple(shape), heads)
            if len(shape) != 4 or (heads and given != 3):
                reason = reason or f"'{vname}' is not 4-D (jitops::{t.name} reads it as {layout}" + \
                    (f" with num_heads={heads})" if heads else ")")
            else:
                shape = logical_shape(tuple(shape), layout)
        shapes[jname], dtypes[jname] = (tuple(shape) if shape is not None else None), dtype
    dynamic = {n: s for n, s in shapes.items() if s is not None and None in s}
    specs: dict[str, TensorSpec | None] = {}
    if not reason:
        probed, reason = probe_shapes(t.op, shapes, cand.attrs)
        specs = {n: (TensorSpec(s, dtypes[n], layout if n in stored else "") if s is not None else None)
                 for n, s in probed.items()}
    if not reason:
        reason = _unify_dtypes(view, cand, t.inputs, specs, namer)
    problem, attrs = None, {}
    if not reason:
        try:
            attrs = t.op_attrs(cand.attrs, {n: s.shape for n, s in specs.items() if s is not None})
            problem = get_op(t.op).make_problem(specs, attrs)
        except (JitopsError, ValueError, KeyError, TypeError) as exc:
            reason = str(exc) + (f" (symbolic sizes probed as {PROBE})" if dynamic else "")
    if dynamic and problem is not None:
        # Sizes known only at run time: the ORT kernel plans per actual shape; no problem key here.
        attrs = {k: v for k, v in attrs.items() if k != "normalized_shape" or None not in shapes["x"]}
        specs = {n: (TensorSpec(tuple(-1 if d is None else d for d in shapes[n]), s.dtype, s.layout)
                     if s is not None else None) for n, s in specs.items()}
        problem = None
    return NodeProblem(
        nodes=tuple(_node_id(n) for n in cand.nodes), onnx_ops=tuple(n.op_type for n in cand.nodes),
        op_type=cand.op_type, op=t.op, inputs=specs, attrs=attrs, problem=problem, reason=reason,
        node_inputs=tuple(cand.inputs), node_output=cand.output, node_extra_outputs=tuple(cand.extra_outputs),
        node_attrs=dict(cand.attrs),
        constants=dict(cand.constants), extra_nodes=list(cand.extra_nodes), after_nodes=list(cand.after_nodes),
        covered=list(cand.nodes),
        dynamic={n: tuple(s) for n, s in dynamic.items()})


def _stored_inputs(t: Any) -> tuple[str, frozenset[str]]:
    """A type's fixed layout and the op inputs whose graph values are stored in it (the *Bshd
    attention types read [B, S, H, D] values, *Sbhd [S, B, H, D]); ('', {}) for the others. Empty
    inputs with a layout: the op has no such layout (its module declares no LAYOUT_INPUTS, or its
    LAYOUTS do not name it), so the pattern falls back to a plain type."""
    layout = t.fixed.get("layout", "")
    return layout, frozenset(op_layout_inputs(t.op, layout) if layout else ())


def op_layout_inputs(op_name: str, layout: str) -> tuple[str, ...]:
    """The inputs op `op_name` reads stored in `layout`; () when it has no such layout (the op's
    LAYOUTS, "nhwc" alone where it declares none, as jitops.engine reads them)."""
    op = get_op(op_name)
    return tuple(getattr(op, "LAYOUT_INPUTS", ())) if layout in getattr(op, "LAYOUTS", ("nhwc",)) else ()


def probe_shapes(op: str, shapes: Mapping[str, tuple[int | None, ...] | None], attrs: Mapping[str, Any]
                 ) -> tuple[dict[str, tuple[int, ...] | None], str]:
    """Shapes with each symbolic size replaced by a stand-in, for asking the op whether it takes the node.

    Sizes that fix the kernel family must be known: conv channels (or derivable from the weights),
    the attention head dim. A mask's unknown dims follow the scores they broadcast against.
    Returns (shapes, reason); the reason is '' when the node can be taken.
    """
    out = {n: (list(s) if s is not None else None) for n, s in shapes.items()}
    x = out.get("x")
    if op == "conv2d" and x is not None and out.get("w") is not None and len(x) == 4:
        w = out["w"]
        if x[1] is None and w[1] is not None:
            x[1] = w[1] * int(attrs.get("group", 1))
        if x[1] is None or None in w:
            return {}, "the channel count is not known (symbolic input channels, weights of unknown shape)"
    params = {"layer_norm": "gamma", "rms_norm": "gamma", "group_norm": "gamma", "batch_norm": "mean"}
    p = out.get(params.get(op, ""))
    if x is not None and p is not None and None not in p:
        if op in ("layer_norm", "rms_norm"):
            axis = int(attrs.get("axis", -1))
            axis = axis + len(x) if axis < 0 else axis
            if 0 <= axis <= len(x) and len(x) - axis == len(p):
                x[axis:] = [d if d is not None else pd for d, pd in zip(x[axis:], p)]
            r = out.get("residual")     # the Skip* norms: the residual has x's shape
            if r is not None and len(r) == len(x):
                out["residual"] = [d if d is not None else xd for d, xd in zip(r, x)]
        elif len(x) > 1 and x[1] is None and len(p) == 1:
            x[1] = p[0]
    if op == "attention":
        q, k = out["q"], out["k"]
        if q[-1] is None and k[-1] is None and (out["v"] or [None])[-1] is None:
            return {}, "the attention head dim is not known (it picks the kernel): pass input_shapes=..."
        d = next(s[-1] for s in (q, k, out["v"]) if s[-1] is not None)
        for s in (q, k, out["v"]):
            s[-1] = d if s[-1] is None else s[-1]
    filled = {n: (tuple(PROBE if d is None else d for d in s) if s is not None else None)
              for n, s in out.items() if n != "mask"}
    if op == "attention" and out.get("mask") is not None:
        q, k = filled["q"], filled["k"]
        scores = q[:-1] + (k[-2],)
        m = out["mask"]
        filled["mask"] = tuple(scores[len(scores) - len(m) + i] if d is None and len(scores) - len(m) + i >= 0
                               else (PROBE if d is None else d) for i, d in enumerate(m))
    return filled, ""


def _unify_dtypes(view: GraphView, cand: Candidate, names: Sequence[str], specs: dict[str, TensorSpec | None],
                  namer: Namer) -> str:
    """Give constant parameters the first input's dtype (ORT binds one element type per kernel).

    A float32 scale next to float16 data is cast at rewrite time when it is a constant; a
    non-constant input of another dtype keeps the node in ONNX. Returns the reason, or ''.
    """
    first = specs.get(names[0])
    if first is None:
        return ""
    for i, jname in enumerate(names[1:], start=1):
        spec = specs.get(jname)
        if spec is None or spec.dtype == first.dtype:
            continue
        vname = cand.inputs[i]
        value = cand.constants.get(vname)
        if value is None:
            value = view.constant(vname)
        if value is None or first.dtype not in ("float32", "float16", "bfloat16"):
            return (f"input '{jname}' is {spec.dtype} while '{names[0]}' is {first.dtype} "
                    f"(mixed dtypes are taken only for constant parameters)")
        new = namer(vname, first.dtype)
        cand.constants[new] = np.asarray(value).astype(_numpy_dtype(first.dtype))
        cand.inputs[i] = new
        specs[jname] = TensorSpec(spec.shape, first.dtype)
    return ""


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


def map_nodes(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
              ops: Iterable[str] | None = None, fuse: bool = True, layout: str = "auto") -> list[NodeProblem]:
    """Every node group jitops recognises, supported or not (unsupported ones carry `reason`).

    model: ModelProto, path or bytes. input_shapes: {graph input name: shape} for dynamic dims.
    ops: restrict to these jitops ops (or ONNX op types), default all. fuse: Conv+BatchNorm+activation,
    BatchNorm+activation and MatMul/Softmax/MatMul attention patterns (default on).
    Groups are disjoint and in graph order; nodes jitops has no op for are not listed.
    layout: "auto" runs fp16 / bf16 conv groups that feed each other on channels-last data
    (jitops.onnx.layout; their types become Conv2dNhwc*), "nchw" keeps every node NCHW.
    """
    if layout not in ("auto", "nchw"):
        raise ArgumentError("layout", "'auto' or 'nchw'", repr(layout), op="jitops.onnx")
    proto = load_model(model)
    view = GraphView(proto, input_shapes)
    wanted = _wanted_ops(ops)
    namer = Namer(view)
    taken: set[int] = set()
    order = {id(n): i for i, n in enumerate(proto.graph.node)}
    out: list[NodeProblem] = []
    table = onnx_to_op()
    for node in proto.graph.node:
        matcher = MATCHERS.get(node.op_type)
        if matcher is None or node.domain not in ONNX_DOMAINS or id(node) in taken:
            if node.domain in ONNX_DOMAINS:
                out.extend(_in_subgraphs(node, wanted))
            continue
        if wanted is not None and table[node.op_type] not in wanted:
            continue
        try:
            picked = _pick(view, node, fuse, namer, order, taken)
        except Exception as exc:   # a model we did not foresee: leave the node to ONNX, say why
            log.warning("jitops could not analyse node %s: %s: %s", _node_id(node), type(exc).__name__, exc)
            picked = _rejected(Rejection([node], node.op_type, f"jitops could not analyse this node "
                                                               f"({type(exc).__name__}: {exc})"))
        if picked is None:
            continue
        if picked.supported:
            taken.update(id(n) for n in picked.covered)
        out.append(picked)
    log.info("%d jitops candidates, %d supported", len(out), sum(p.supported for p in out))
    return plan_nhwc(view, out) if layout == "auto" else out


def _pick(view: GraphView, node: Any, fuse: bool, namer: Namer, order: Mapping[int, int], taken: set[int]
          ) -> NodeProblem | None:
    """The most fused candidate of `node` that jitops takes, else the reason of the least fused one."""
    matcher = MATCHERS[node.op_type]
    first_failure: NodeProblem | None = None
    for match in matcher(view, node, fuse, namer):
        if any(id(n) in taken for n in match.nodes):
            continue
        if isinstance(match, Rejection):
            first_failure = first_failure or _rejected(match)
            continue
        outliving = _outliving_reader(view, match)
        if outliving is not None:
            first_failure = first_failure or _rejected(Rejection(
                match.nodes, node.op_type, f"a value it replaces is still read by {_node_id(outliving)}"))
            continue
        result = _problem(view, match, order, namer)
        if result.supported:
            return result
        # Keep the reason of the least fused form: it is the one that says why nothing fits.
        first_failure = result if first_failure is None or len(result.covered) <= len(first_failure.covered) \
            else first_failure
    return first_failure


def _outliving_reader(view: GraphView, cand: Candidate) -> Any | None:
    """A node outside the match that would still read a value the match replaces once the rewrite drops
    what only fed the match (rewrite._drop_orphans), or None. The patterns check their own pieces; this
    catches what they missed: torch's nn.MultiheadAttention computes a padding mask's shape from
    Shape(K's head split), and that mask, an input of the node, outlived the transpose it read."""
    covered = {id(n) for n in cand.nodes}
    produced = {cand.output, *cand.extra_outputs, *(o for n in cand.after_nodes for o in n.output)}
    keep = {i for i in cand.inputs if i} | {i for n in cand.extra_nodes for i in n.input}
    memo: dict[int, bool] = {}
    for n in cand.nodes:
        for o in n.output:
            if not o or o in produced:
                continue
            for reader in view.consumers.get(o, []):
                if id(reader) not in covered and not dies_with(view, reader, covered, memo, keep):
                    return reader
    return None


# Single-node types worth reporting when they sit in a subgraph (patterns there are not looked for).
_REPORTED_IN_SUBGRAPHS = {"Conv", "BatchNormalization", "GroupNormalization", "LayerNormalization",
                          "RMSNormalization", "LeakyRelu", "Attention"}


def _in_subgraphs(node: Any, wanted: set[str] | None) -> list[NodeProblem]:
    """Recognised nodes inside If / Loop / Scan bodies: reported, left to ONNX."""
    found = []
    for a in node.attribute:
        for g in ([a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []):
            for inner in g.node:
                if inner.op_type in _REPORTED_IN_SUBGRAPHS and inner.domain in ONNX_DOMAINS and (
                        wanted is None or onnx_to_op()[inner.op_type] in wanted):
                    found.append(_rejected(Rejection([inner], inner.op_type, f"inside the {a.name} subgraph of "
                                                     f"{node.op_type} '{_node_id(node)}' (subgraphs are not "
                                                     f"rewritten)")))
                found.extend(_in_subgraphs(inner, wanted))
    return found


def _rejected(r: Rejection) -> NodeProblem:
    op = onnx_to_op().get(r.onnx_op, "")
    return NodeProblem(nodes=tuple(_node_id(n) for n in r.nodes), onnx_ops=tuple(n.op_type for n in r.nodes),
                       op_type="", op=op, inputs={}, attrs={}, problem=None, reason=r.reason, covered=list(r.nodes))


def supported_nodes(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                    ops: Iterable[str] | None = None, fuse: bool = True, layout: str = "auto") -> list[NodeProblem]:
    """The node groups of `model` that jitops runs: exactly what `rewrite` replaces with the same arguments.

    Each NodeProblem has `.op` (jitops op name), `.problem` (its Problem; `.key` its record key),
    `.inputs` / `.attrs` (what jitops.<op>() would be called with) and `.nodes` (ONNX node names).
    Use `map_nodes` to also see the recognised nodes that stay ONNX, each with its `reason`.
    """
    return [p for p in map_nodes(model, input_shapes, ops, fuse, layout) if p.supported]
