"""Normalizations as exporters write them out in standard ops, matched back into one jitops node.

- LayerNorm before opset 17 (torch): ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt
  -> Div [-> Mul(gamma)] [-> Add(beta)].
- RMSNorm as Llama-style code writes it: [Cast f32] -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt ->
  Reciprocal or Div(1, .) -> Mul(x, .) (or Div(x, Sqrt)) [-> Cast] [-> Mul(weight)].
- GroupNorm (torch before opset 18): Reshape(x, [N, G, -1]) -> InstanceNormalization(ones, zeros)
  -> Reshape(Shape(x)) [-> Mul(gamma per channel)] [-> Add(beta per channel)].

Each intermediate value must have exactly the readers the pattern expects (so nothing another
node reads is fused away); parameters must be constants.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .graph import GraphView
from .matchers import ONNX_DOMAINS, Candidate, Match, Namer


def _user(view: GraphView, value: str, op_types: tuple[str, ...]) -> Any | None:
    n = view.only_consumer(value)
    return n if n is not None and n.op_type in op_types and n.domain in ONNX_DOMAINS else None


def _other(node: Any, value: str) -> str | None:
    """The other input of a binary node that reads `value` once."""
    ins = list(node.input)
    if len(ins) != 2 or ins.count(value) != 1:
        return None
    return ins[1 - ins.index(value)]


def _axes(view: GraphView, node: Any) -> list[int] | None:
    a = view.attrs(node)
    if int(a.get("keepdims", 1)) != 1:
        return None
    if "axes" in a:
        return [int(v) for v in a["axes"]]
    if len(node.input) > 1 and node.input[1]:
        v = view.constant(node.input[1])
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]
    return None


def _trailing_axis(axes: list[int] | None, rank: int | None) -> int | None:
    """The first axis when `axes` are the last k axes (what a normalized_shape means), else None."""
    if not axes or rank is None:
        return None
    norm = sorted(a + rank if a < 0 else a for a in axes)
    if norm != list(range(rank - len(norm), rank)):
        return None
    return norm[0] - rank


def _is_const(view: GraphView, name: str, value: float) -> bool:
    v = view.scalar(name)
    return v is not None and abs(v - value) <= 1e-6 * max(1.0, abs(value))


def _square_of(view: GraphView, node: Any, value: str) -> bool:
    if node.op_type == "Pow":
        return node.input[0] == value and _is_const(view, node.input[1], 2.0)
    return node.op_type == "Mul" and list(node.input) == [value, value]


def _affine_tail(view: GraphView, value: str, covered: list[Any], want_bias: bool
                 ) -> tuple[str, str, str]:
    """[Mul(constant gamma)] [Add(constant beta)] after `value`: (output, gamma, beta) names ('' when absent)."""
    gamma, value = _constant_step(view, value, "Mul", covered)
    beta = ""
    if want_bias:
        beta, value = _constant_step(view, value, "Add", covered)
    return value, gamma, beta


def _constant_step(view: GraphView, value: str, op_type: str, covered: list[Any]) -> tuple[str, str]:
    """The constant operand of a `op_type` node that reads `value`, and that node's output (covered);
    ('', value) when no such node follows."""
    node = _user(view, value, (op_type,))
    if node is not None:
        const = _other(node, value)
        if const and view.is_constant(const):
            covered.append(node)
            return const, node.output[0]
    return "", value


def _param(view: GraphView, name: str, shape: tuple[int | None, ...], fill: float, namer: Namer,
           base: str, dtype: str, consts: dict[str, np.ndarray]) -> str | None:
    """A parameter of exactly `shape` (the normalized dims): the constant as is, squeezed of leading
    ones or broadcast (a new constant), or `fill` when absent. None when that cannot be done."""
    if None in shape:
        return None
    value = view.constant(name) if name else np.full(shape, fill, dtype=dtype)
    if value is None:
        return None
    value = np.asarray(value)
    while value.ndim > len(shape) and value.shape[0] == 1:
        value = value[0]
    try:
        value = np.broadcast_to(value, shape)
    except ValueError:
        return None
    if name and tuple(value.shape) == view.static_shape(name):
        return name
    new = namer(name or base, "param")
    consts[new] = np.ascontiguousarray(value)
    return new


def match_decomposed_layer_norm(view: GraphView, mean: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    """Trigger: the first ReduceMean (of x)."""
    x = mean.input[0]
    shape = view.shape(x)
    axis = _trailing_axis(_axes(view, mean), len(shape) if shape is not None else None)
    sub = _user(view, mean.output[0], ("Sub",))
    if axis is None or sub is None or list(sub.input) != [x, mean.output[0]]:
        return
    d = sub.output[0]
    readers = view.consumers.get(d, [])
    sq = next((n for n in readers if _square_of(view, n, d)), None)
    div = next((n for n in readers if n.op_type == "Div" and n.input[0] == d), None)
    if sq is None or div is None or len(readers) != 2 or d in view.outputs:
        return
    var = _user(view, sq.output[0], ("ReduceMean",))
    if var is None or _axes(view, var) != _axes(view, mean):
        return
    add = _user(view, var.output[0], ("Add",))
    eps_name = _other(add, var.output[0]) if add is not None else None
    eps = view.scalar(eps_name) if eps_name else None
    sqrt = _user(view, add.output[0], ("Sqrt",)) if add is not None else None
    if eps is None or sqrt is None or div.input[1] != sqrt.output[0] or view.only_consumer(sqrt.output[0]) is None:
        return
    covered = [mean, sub, sq, var, add, sqrt, div]
    out, gamma, beta = _affine_tail(view, div.output[0], covered, want_bias=True)
    norm_shape = tuple(shape[len(shape) + axis:])
    consts: dict[str, np.ndarray] = {}
    dtype = view.dtype(x)
    g = _param(view, gamma, norm_shape, 1.0, namer, x + "_gamma", dtype, consts)
    b = _param(view, beta, norm_shape, 0.0, namer, x + "_beta", dtype, consts)   # zeros when absent:
    # the fallback body before opset 17 reads B
    if g is None or b is None:
        return
    values = {n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}
    yield Candidate("LayerNorm", covered, [x, g, b], {"axis": axis, "epsilon": float(eps)}, out, consts,
                    values=values)


def match_decomposed_rms_norm(view: GraphView, sq: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    """Trigger: Pow(x, 2) (or Mul(x, x)) whose mean over the last axes feeds Add(eps) -> Sqrt."""
    x = sq.input[0]
    if not _square_of(view, sq, x):
        return
    shape = view.shape(x)
    mean = _user(view, sq.output[0], ("ReduceMean",))
    axis = _trailing_axis(_axes(view, mean), len(shape) if shape is not None else None) if mean else None
    add = _user(view, mean.output[0], ("Add",)) if mean is not None else None
    eps_name = _other(add, mean.output[0]) if add is not None else None
    eps = view.scalar(eps_name) if eps_name else None
    sqrt = _user(view, add.output[0], ("Sqrt",)) if add is not None else None
    if axis is None or eps is None or sqrt is None:
        return
    covered = [sq, mean, add, sqrt]
    inv = _user(view, sqrt.output[0], ("Reciprocal", "Div"))
    if inv is not None and inv.op_type == "Div" and inv.input[0] == x and inv.input[1] == sqrt.output[0]:
        normed = inv                                        # x / sqrt(mean + eps)
    elif inv is not None and (inv.op_type == "Reciprocal" or (inv.input[1] == sqrt.output[0]
                                                              and _is_const(view, inv.input[0], 1.0))):
        mul = _user(view, inv.output[0], ("Mul",))          # x * (1 / sqrt(...))
        if mul is None or _other(mul, inv.output[0]) != x:
            return
        covered.append(inv)
        normed = mul
    else:
        return
    covered.append(normed)
    out = normed.output[0]
    cast = _user(view, out, ("Cast",))
    # HF's hidden_states.to(float32) in front: the node reads what was cast, so it reads and writes
    # x's own dtype (statistics in float32 inside, as the kernels keep them) and a residual Add before
    # it is found (skip_patterns). A no-op cast (float32 models; torch's tracer then hands the cast
    # to every later reader of x, the next residual Add too) stays for its other readers; a real one
    # is taken where the norm alone reads it and the result is cast back (.to(input_dtype)).
    lead = view.producer.get(x)
    if lead is not None and lead.op_type == "Cast" and lead.domain in ONNX_DOMAINS and x not in view.outputs \
            and view.dtype(lead.input[0]) in ("float32", "float16", "bfloat16"):
        ids = {id(n) for n in covered}
        if view.dtype(lead.input[0]) == view.dtype(x):
            x = lead.input[0]
        elif cast is not None and view.dtype(cast.output[0]) == view.dtype(lead.input[0]) \
                and all(id(u) in ids for u in view.consumers.get(x, [])):
            covered.insert(0, lead)
            x = lead.input[0]
    if cast is not None and view.dtype(cast.output[0]) == view.dtype(x):   # .to(x.dtype)
        covered.append(cast)
        out = cast.output[0]
    out, gamma, _ = _affine_tail(view, out, covered, want_bias=False)
    consts: dict[str, np.ndarray] = {}
    g = _param(view, gamma, tuple(shape[len(shape) + axis:]), 1.0, namer, x + "_weight", view.dtype(x), consts)
    if g is None:
        return
    values = {n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}
    yield Candidate("RmsNorm", covered, [x, g], {"axis": axis, "epsilon": float(eps)}, out, consts, values=values)


def match_decomposed_group_norm(view: GraphView, inorm: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    """Trigger: InstanceNormalization over Reshape(x, [N, G, -1]) with unit scale and zero bias."""
    from .evaluate import Evaluator
    r1 = view.producer.get(inorm.input[0])
    if r1 is None or r1.op_type != "Reshape" or view.only_consumer(r1.output[0]) is None:
        return
    x = r1.input[0]
    shape = view.shape(x)
    target = Evaluator(view).value(r1.input[1])
    scale, bias = view.constant(inorm.input[1]), view.constant(inorm.input[2])
    if shape is None or len(shape) < 3 or target is None or target.size != 3 or scale is None or bias is None:
        return
    groups = int(scale.size)
    if not (np.all(scale == 1) and np.all(bias == 0)) or target[1] != groups or target[2] != -1 or \
            not (target[0] == 0 or (shape[0] is not None and target[0] == shape[0])):
        return
    r2 = _user(view, inorm.output[0], ("Reshape",))
    if r2 is None:
        return
    back = view.producer.get(r2.input[1])
    whole = back is not None and back.op_type == "Shape" and int(view.attrs(back).get("start", 0)) == 0 \
        and "end" not in view.attrs(back)
    back_ok = (whole and back.input[0] == x) or (
        view.static_shape(x) is not None and (lambda v: v is not None and tuple(v.astype(int)) == view.static_shape(x))(
            Evaluator(view).value(r2.input[1])))
    if not back_ok:
        return
    covered = [r1, inorm, r2]
    out, gamma, beta = _affine_tail(view, r2.output[0], covered, want_bias=True)
    channels = shape[1]
    for name in (gamma, beta):
        v = view.constant(name) if name else None
        if v is not None and (v.ndim < 1 or v.ndim > len(shape) - 1 or v.shape[0] != v.size
                              or any(d != 1 for d in v.shape[1:]) or len(v.shape) != len(shape) - 1):
            return                                          # not one value per channel ([C, 1, ...])
        channels = channels or (v.size if v is not None else None)
    if channels is None or channels % groups:
        return
    consts: dict[str, np.ndarray] = {}
    dtype = view.dtype(x)
    params = []
    for name, fill, what in ((gamma, 1.0, "gamma"), (beta, 0.0, "beta")):
        value = view.constant(name).reshape(-1) if name else np.full(channels, fill, dtype=dtype)
        if value.size == 1:     # one value for all channels: nn.GroupNorm(affine=False) exports ones / zeros [1, 1, 1]
            value = np.full(channels, value[0], dtype=value.dtype)
        new = namer(name or x, what)
        consts[new] = np.ascontiguousarray(value.astype(dtype))
        params.append(new)
    values = {n: (tuple(v.shape), str(v.dtype)) for n, v in consts.items()}
    eps = float(view.attrs(inorm).get("epsilon", 1e-5))
    yield Candidate("GroupNorm", covered, [x, *params], {"num_groups": groups, "epsilon": eps}, out, consts,
                    values=values)
