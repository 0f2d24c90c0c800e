"""Which ONNX nodes (and small patterns of nodes) one jitops op can run, with ONNX semantics.

Each matcher looks at one node and yields Candidates, most fused first, or a Rejection saying
why the node cannot be taken. Conv folds a following inference BatchNormalization into its
weights and takes a following Relu / LeakyRelu as its epilogue; BatchNormalization takes the
activation too; MatMul -> [Mul|Div] -> [Add mask] -> Softmax -> MatMul becomes one attention.
Opset differences handled here: Conv auto_pad, BatchNormalization is_test/spatial/training_mode,
GroupNormalization's per-group (18) vs per-channel (21) scale, Softmax's default axis.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator

import numpy as np

from .graph import GraphView

ONNX_DOMAINS = ("", "ai.onnx")


@dataclass
class Candidate:
    """A replacement: one jitops node of `op_type` for the ONNX `nodes`, writing `output`."""

    op_type: str
    nodes: list[Any]
    inputs: list[str]                       # value names in op-type input order ('' = absent)
    attrs: dict[str, Any]
    output: str
    constants: dict[str, np.ndarray] = field(default_factory=dict)   # new initializers
    extra_nodes: list[Any] = field(default_factory=list)             # inserted before the jitops node
    values: dict[str, tuple[tuple[int, ...] | None, str]] = field(default_factory=dict)  # new value types
    extra_outputs: list[str] = field(default_factory=list)           # the node's outputs after `output`
    after_nodes: list[Any] = field(default_factory=list)             # inserted after the jitops node


@dataclass
class Rejection:
    nodes: list[Any]
    onnx_op: str
    reason: str


Match = Candidate | Rejection
Matcher = Callable[[GraphView, Any, bool, "Namer"], Iterator[Match]]


class Namer:
    """Fresh value names that collide with nothing in the graph."""

    def __init__(self, view: GraphView | None = None, used: set[str] | None = None):
        self.used = set(used or ())
        if view is not None:
            self.used |= set(view.types) | set(view.initializers) | set(view.producer)
            for node in view.graph.node:
                self.used.update(node.input)

    def __call__(self, base: str, suffix: str) -> str:
        name, k = f"{base}__jitops_{suffix}", 1
        while name in self.used:
            k += 1
            name = f"{base}__jitops_{suffix}{k}"
        self.used.add(name)
        return name


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _extra_outputs_used(view: GraphView, node: Any) -> bool:
    return any(o and (o in view.outputs or view.consumers.get(o)) for o in node.output[1:])


def _same_domain(node: Any) -> bool:
    return node.domain in ONNX_DOMAINS


def dies_with(view: GraphView, node: Any, gone: set[int], memo: dict[int, bool], alive: Collection[str] = ()) -> bool:
    """True when everything `node` computes is read only by nodes in `gone` (the replaced ones), directly
    or through nodes of which the same holds, and none of it is a graph output or a value in `alive` (what
    the replacement still reads): then the rewrite's orphan pass drops it, as it drops the Shape -> Gather
    -> Concat chains torch computes reshape targets and scales with. `memo` is per (gone, alive)."""
    if id(node) not in memo:
        memo[id(node)] = False      # a cycle or a repeat visit in progress: not dead
        readers = [u for o in node.output if o for u in view.consumers.get(o, [])]
        memo[id(node)] = bool(readers) and _same_domain(node) and not any(a.type in (5, 10) for a in node.attribute) \
            and not any(o in view.outputs or o in alive for o in node.output) \
            and all(id(u) in gone or dies_with(view, u, gone, memo, alive) for u in readers)
    return memo[id(node)]


# ---------------------------------------------------------------- activations (epilogues)

def _activation(view: GraphView, value: str) -> tuple[Any, str, dict[str, Any]] | None:
    """A Relu / LeakyRelu that is the only reader of `value`: (node, variant suffix, attrs)."""
    user = view.only_consumer(value)
    if user is None or not _same_domain(user) or user.input[0] != value:
        return None
    if user.op_type == "Relu":
        return user, "Relu", {}
    if user.op_type == "LeakyRelu":
        return user, "LeakyRelu", {"alpha": float(view.attrs(user).get("alpha", 0.01))}
    return None


def _with_activation(view: GraphView, cand: Candidate, fuse: bool) -> Iterator[Candidate]:
    if fuse:
        act = _activation(view, cand.output)
        if act is not None:
            node, suffix, attrs = act
            yield Candidate(cand.op_type + suffix, cand.nodes + [node], cand.inputs, {**cand.attrs, **attrs},
                            node.output[0], cand.constants, cand.extra_nodes, cand.values)
    yield cand


# ---------------------------------------------------------------- Conv (+ BatchNormalization) (+ Add) (+ activation)

def _residual_add(view: GraphView, cand: Candidate) -> Candidate | None:
    """Conv2d[+BN] -> Add(., r) as Conv2dAdd with r as the residual input, when the Add is the only
    reader of the conv's output and r has the output's shape (no broadcasting): C, H, W known and
    equal; the batch either known and equal or symbolic on both sides (the same batch flows through
    the network; a mismatch would be refused by conv2d at run time, never computed wrong)."""
    add = view.only_consumer(cand.output)
    if add is None or add.op_type != "Add" or not _same_domain(add) or len(add.input) != 2:
        return None
    other = add.input[1] if add.input[0] == cand.output else add.input[0]
    if other == cand.output or not other:
        return None
    out, r = view.shape(cand.output), view.shape(other)
    if out is None or r is None or len(out) != 4 or len(r) != 4 or view.dtype(other) != view.dtype(cand.output):
        return None
    if None in out[1:] or tuple(out[1:]) != tuple(r[1:]) or out[0] != r[0]:
        return None
    return Candidate(cand.op_type + "Add", cand.nodes + [add], cand.inputs + [other], dict(cand.attrs),
                     add.output[0], cand.constants, cand.extra_nodes, cand.values)


def _with_residual(view: GraphView, cand: Candidate, fuse: bool) -> Iterator[Candidate]:
    """The residual forms first (most fused), then the conv with its activation alone."""
    added = _residual_add(view, cand) if fuse else None
    if added is not None:
        yield from _with_activation(view, added, fuse)
    yield from _with_activation(view, cand, fuse)


def _conv_pads(view: GraphView, node: Any, a: dict[str, Any], kernel: tuple[int, ...], strides: list[int],
               dilations: list[int]) -> list[int] | str:
    auto_pad = _s(a.get("auto_pad", "NOTSET"))
    if auto_pad == "NOTSET":
        pads = [int(p) for p in a.get("pads", [0] * 4)]
        return pads if len(pads) == 4 else f"pads {pads} is not 4 values"
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad '{auto_pad}' is not an ONNX value"
    shape = view.static_shape(node.input[0])
    if shape is None:
        return "auto_pad SAME_* needs the input's spatial size (pass input_shapes=...)"
    begin, end = [], []
    for size, k, s, d in zip(shape[2:], kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        # SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the beginning.
        b = small if auto_pad == "SAME_UPPER" else total - small
        begin.append(b)
        end.append(total - b)
    return begin + end


def _bn_inference(view: GraphView, node: Any) -> str:
    """'' when a BatchNormalization runs in inference mode with one used output, else why not."""
    a = view.attrs(node)
    if int(a.get("training_mode", 0)):
        return "BatchNormalization in training mode (training_mode=1)"
    if view.opset < 7 and not int(a.get("is_test", 0)):
        return "BatchNormalization-6 with is_test=0 (training mode)"
    if view.opset < 9 and not int(a.get("spatial", 1)):
        return "BatchNormalization with spatial=0 (per-element statistics)"
    if _extra_outputs_used(view, node):
        return "BatchNormalization's running statistics outputs are used"
    return ""


def _fold_bn(view: GraphView, conv: Any, bn: Any, namer: Namer) -> tuple[str, str, dict[str, np.ndarray]] | None:
    """Conv weights and bias with an inference BatchNormalization folded in, or None (not constant)."""
    w = view.constant(conv.input[1])
    b_name = conv.input[2] if len(conv.input) > 2 else ""
    b = view.constant(b_name) if b_name else None
    params = [view.constant(n) for n in bn.input[1:5]]
    if w is None or (b_name and b is None) or any(p is None for p in params) or _bn_inference(view, bn):
        return None
    scale, shift, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
    eps = float(view.attrs(bn).get("epsilon", 1e-5))
    cout = w.shape[0]
    if any(p.size != cout for p in (scale, shift, mean, var)):
        return None
    k = scale / np.sqrt(var + eps)
    w_f = (w.astype(np.float64) * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    b0 = b.astype(np.float64).reshape(-1) if b is not None else np.zeros(cout)
    b_f = ((b0 - mean) * k + shift).astype(w.dtype)
    w_name, b_name_new = namer(conv.input[1], "bnfold_w"), namer(conv.input[1], "bnfold_b")
    return w_name, b_name_new, {w_name: w_f, b_name_new: b_f}


def match_conv(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    a = view.attrs(node)
    x_shape, w_shape = view.shape(node.input[0]), view.shape(node.input[1])
    if (x_shape is not None and len(x_shape) != 4) or (w_shape is not None and len(w_shape) != 4):
        yield Rejection([node], "Conv", "only 2-D convolution (4-D NCHW input, OIHW weights) is supported")
        return
    kernel = tuple(int(k) for k in a.get("kernel_shape", [])) or (
        tuple(int(d) for d in w_shape[2:]) if w_shape and None not in w_shape[2:] else None)
    if kernel is None:
        yield Rejection([node], "Conv", "the kernel size is unknown (no kernel_shape, weights of unknown shape)")
        return
    strides = [int(s) for s in a.get("strides", [1, 1])]
    dilations = [int(d) for d in a.get("dilations", [1, 1])]
    pads = _conv_pads(view, node, a, kernel, strides, dilations)
    if isinstance(pads, str):
        yield Rejection([node], "Conv", pads)
        return
    bias = node.input[2] if len(node.input) > 2 else ""
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": int(a.get("group", 1))}
    plain = Candidate("Conv2d", [node], [node.input[0], node.input[1], bias], attrs, node.output[0])
    if fuse:
        bn = view.only_consumer(node.output[0])
        if (bn is not None and bn.op_type == "BatchNormalization" and _same_domain(bn)
                and bn.input[0] == node.output[0]):
            folded = _fold_bn(view, node, bn, namer)
            if folded is not None:
                w_name, b_name, consts = folded
                fused = Candidate("Conv2d", [node, bn], [node.input[0], w_name, b_name], attrs, bn.output[0],
                                  consts, values={n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()})
                yield from _with_residual(view, fused, fuse)
    yield from _with_residual(view, plain, fuse)


# ---------------------------------------------------------------- normalizations and LeakyRelu

def match_batch_norm(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    why = _bn_inference(view, node)
    if why:
        yield Rejection([node], "BatchNormalization", why)
        return
    eps = float(view.attrs(node).get("epsilon", 1e-5))
    yield from _with_activation(view, Candidate("BatchNorm", [node], list(node.input[:5]), {"epsilon": eps},
                                                node.output[0]), fuse)


def _affine_param(view: GraphView, name: str, want: tuple[int, ...] | None, namer: Namer, what: str
                  ) -> tuple[str, dict[str, np.ndarray], str]:
    """A scale/bias of exactly shape `want`: as is, or a constant broadcast at rewrite time."""
    if not name:
        return "", {}, ""
    shape = view.static_shape(name)
    if want is None or shape == want:
        return name, {}, ""
    value = view.constant(name)
    if value is None:
        return name, {}, f"{what} of shape {shape} would need broadcasting to {want} and is not a constant"
    new = namer(name, "expanded")
    return new, {new: np.ascontiguousarray(np.broadcast_to(value, want))}, ""


def _stash_ok(view: GraphView, node: Any) -> str:
    stash = int(view.attrs(node).get("stash_type", 1))
    return "" if stash == 1 else f"stash_type={stash} (jitops keeps statistics in float32)"


def _trailing_norm(view: GraphView, node: Any, onnx_op: str, op_type: str, n_params: int, namer: Namer
                   ) -> Iterator[Match]:
    a = view.attrs(node)
    why = _stash_ok(view, node) or ("Mean/InvStdDev outputs are used" if _extra_outputs_used(view, node) else "")
    if why:
        yield Rejection([node], onnx_op, why)
        return
    axis = int(a.get("axis", -1))
    x_shape = view.static_shape(node.input[0])
    want = None
    if x_shape is not None:
        axis_p = axis + len(x_shape) if axis < 0 else axis
        want = tuple(x_shape[axis_p:])
    inputs, consts, values = [node.input[0]], {}, {}
    for i, what in zip(range(1, 1 + n_params), ("scale", "bias")):
        name = node.input[i] if len(node.input) > i else ""
        new, c, why = _affine_param(view, name, want, namer, what)
        if why:
            yield Rejection([node], onnx_op, why)
            return
        inputs.append(new)
        consts.update(c)
    values = {n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}
    yield Candidate(op_type, [node], inputs, {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5))},
                    node.output[0], consts, values=values)


def match_layer_norm(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    yield from _trailing_norm(view, node, "LayerNormalization", "LayerNorm", 2, namer)


def match_rms_norm(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    yield from _trailing_norm(view, node, "RMSNormalization", "RmsNorm", 1, namer)


def match_group_norm(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    a = view.attrs(node)
    why = _stash_ok(view, node)
    if why:
        yield Rejection([node], "GroupNormalization", why)
        return
    groups = int(a["num_groups"])
    attrs = {"num_groups": groups, "epsilon": float(a.get("epsilon", 1e-5))}
    inputs, consts = [node.input[0], node.input[1], node.input[2]], {}
    if view.opset < 21:
        # GroupNormalization-18: scale and bias per group; jitops (and opset 21) take them per channel.
        x_shape = view.shape(node.input[0])
        channels = x_shape[1] if x_shape and len(x_shape) > 1 else None
        values = [view.constant(n) for n in node.input[1:3]]
        if channels is None or any(v is None for v in values):
            yield Rejection([node], "GroupNormalization", "GroupNormalization-18 has per-group scale and bias; "
                            "jitops needs them per channel (constant scale/bias and a known channel count)")
            return
        for i, v in enumerate(values):
            new = namer(node.input[1 + i], "per_channel")
            consts[new] = np.repeat(np.asarray(v).reshape(-1), int(channels) // groups)
            inputs[1 + i] = new
    values_t = {n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}
    yield Candidate("GroupNorm", [node], inputs, attrs, node.output[0], consts, values=values_t)


def match_leaky_relu(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    yield Candidate("LeakyRelu", [node], [node.input[0]], {"alpha": float(view.attrs(node).get("alpha", 0.01))},
                    node.output[0])


# Pattern matchers live in their own modules and import the types above.
from .attention_patterns import match_attention_op, match_softmax_attention  # noqa: E402
from .patterns import match_decomposed_group_norm, match_decomposed_layer_norm, match_decomposed_rms_norm  # noqa: E402
from .skip_patterns import skipped  # noqa: E402

MATCHERS: dict[str, Matcher] = {
    "Conv": match_conv,
    "BatchNormalization": match_batch_norm,
    "GroupNormalization": match_group_norm,
    # the norms with the residual Add in front (ORT's SkipLayerNormalization; skip_patterns.py)
    "LayerNormalization": skipped(match_layer_norm, "LayerNorm"),
    "RMSNormalization": skipped(match_rms_norm, "RmsNorm"),
    "LeakyRelu": match_leaky_relu,
    "Attention": match_attention_op,
    "Softmax": match_softmax_attention,
    # as exporters write them in standard ops (patterns.py)
    "ReduceMean": skipped(match_decomposed_layer_norm, "LayerNorm"),
    "Pow": skipped(match_decomposed_rms_norm, "RmsNorm"),
    "Mul": skipped(match_decomposed_rms_norm, "RmsNorm"),
    "InstanceNormalization": match_decomposed_group_norm,
}



def onnx_to_op() -> dict[str, str]:
    """ONNX op type -> the jitops op that runs it (for the `ops=` filter): derived from the ops'
    REGISTRATION.onnx; tests/test_registry.py checks it names exactly the types MATCHERS serves."""
    from ..ops import onnx_ops
    return onnx_ops()
