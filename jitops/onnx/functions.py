"""Fallback bodies: each jitops node type as an ONNX function of standard ops.

A rewritten model carries one FunctionProto per jitops node type it uses (domain `jitops`), so a
runtime without the jitops library inlines the body and computes the same thing. Bodies read the
node's attributes by reference (ref_attr_name) and are written for the model's default opset:
ops that exist at that opset, with the attributes that opset defines.

Norm and attention bodies compute in float32 and return to X's type: by CastLike from opset 15, and
before it (opsets 13-14) by a Cast whose `to` is the node's own attribute `x_type` (X's element type,
which the rewrite writes on those nodes only there: `x_type_attr`), so float16 / bfloat16 nodes keep a
valid body at every opset.
"""
from __future__ import annotations

from typing import Any, Callable

from .layout import TO_NCHW, TO_NHWC
from .optypes import DOMAIN, HEAD_LAYOUTS, OP_TYPES, OpType

_ATTR_TYPES = {"int": 2, "float": 1, "string": 3, "ints": 7, "floats": 6}   # AttributeProto.AttributeType
X_TYPE = "x_type"                                   # before opset 15: X's element type, for the Cast back
_CASTS_BACK = ("layer_norm", "rms_norm", "group_norm", "attention")
_ELEM_TYPES = {"float32": 1, "float16": 10, "bfloat16": 16, "float64": 11}   # TensorProto.DataType


def _reads_x_type(op: str, opset: int) -> bool:
    """Whether a body of this op at this opset casts back by `Cast(to=x_type)` (no CastLike before 15)."""
    return opset < 15 and op in _CASTS_BACK


def x_type_attr(type_name: str, opset: int, dtype: str) -> dict[str, int]:
    """The attribute a node of this type carries for its fallback body ({} where the body needs none):
    before opset 15 norm and attention bodies cast back to X's type by `Cast(to=x_type)`."""
    return {X_TYPE: _ELEM_TYPES[dtype]} if _reads_x_type(OP_TYPES[type_name].op, opset) else {}


def _cast_back(x: str, like: str, y: str, opset: int) -> Any:
    """y = x in `like`'s type: CastLike from opset 15, before it Cast to the node's attribute x_type."""
    if opset >= 15:
        return _node("CastLike", [x, like], [y])
    return _node("Cast", [x], [y], (_ref(X_TYPE, "int", "to"),))


def _ref(name: str, kind: str, target: str | None = None) -> Any:
    """An attribute of a body node taking its value from the function's attribute `name`."""
    from onnx import AttributeProto
    a = AttributeProto()
    a.name = target or name
    a.type = _ATTR_TYPES[kind]
    a.ref_attr_name = name
    return a


def _node(op: str, inputs: list[str], outputs: list[str], refs: tuple = (), **attrs: Any) -> Any:
    from onnx import helper
    n = helper.make_node(op, inputs, outputs, **attrs)
    n.attribute.extend(refs)
    return n


def _activation(t: OpType, x: str, y: str) -> list[Any]:
    act = t.fixed.get("activation")
    if act == "relu":
        return [_node("Relu", [x], [y])]
    if act == "leaky_relu":
        return [_node("LeakyRelu", [x], [y], (_ref("alpha", "float"),))]
    return [_node("Identity", [x], [y])]


def _conv(t: OpType, opset: int) -> list[Any]:
    refs = (_ref("strides", "ints"), _ref("pads", "ints"), _ref("dilations", "ints"), _ref("group", "int"))
    nhwc = t.fixed.get("layout") == "nhwc"      # X, R and Y stored N, H, W, C: transpose around the body
    nodes = [_node("Transpose", [v], [v + "nchw"], perm=TO_NCHW) for v in ("X", "R")
             if nhwc and (v == "X" or "residual" in t.inputs)]
    x, r = ("Xnchw", "Rnchw") if nhwc else ("X", "R")
    nodes.append(_node("Conv", [x, "W", "B"], ["conv"], refs))
    if "residual" in t.inputs:      # y = act(conv + bias + residual)
        nodes.append(_node("Add", ["conv", r], ["sum"]))
    nodes += _activation(t, "sum" if "residual" in t.inputs else "conv", "Ynchw" if nhwc else "Y")
    if nhwc:
        nodes.append(_node("Transpose", ["Ynchw"], ["Y"], perm=TO_NHWC))
    return nodes


def _batch_norm(t: OpType, opset: int) -> list[Any]:
    extra = {"is_test": 1} if opset < 7 else {}   # BatchNormalization-6 defaults to training mode
    return [_node("BatchNormalization", ["X", "scale", "B", "mean", "var"], ["bn"], (_ref("epsilon", "float"),),
                  **extra)] + _activation(t, "bn", "Y")


def _group_norm(t: OpType, opset: int) -> list[Any]:
    refs = (_ref("num_groups", "int"), _ref("epsilon", "float"))
    if opset >= 21:
        return [_node("GroupNormalization", ["X", "scale", "B"], ["Y"], refs)]
    # Before opset 21 (GroupNormalization-18 took per-group scale and is deprecated) the body spells
    # it out: statistics per [N, G, C/G * spatial] row in float32, then the per-channel scale and bias.
    from onnx import helper
    return [
        _node("Cast", ["X"], ["xf"], to=1),
        _node("Constant", [], ["g"], (_ref("num_groups", "int", "value_int"),)),
        _node("Constant", [], ["one_shape"], value_ints=[1]),
        _node("Reshape", ["g", "one_shape"], ["g1"]),
        _node("Constant", [], ["zero"], value_ints=[0]),
        _node("Constant", [], ["minus_one"], value_ints=[-1]),
        _node("Concat", ["zero", "g1", "minus_one"], ["rows_shape"], axis=0),
        _node("Reshape", ["xf", "rows_shape"], ["rows"]),
        *_reduce_mean("rows", "mean", 2, opset),
        _node("Sub", ["rows", "mean"], ["centered"]),
        *_scale_by_std(2, opset),
        _node("Shape", ["x_shape"], ["rank"]),
        _node("Constant", [], ["two"], value_ints=[2]),
        _node("Sub", ["rank", "two"], ["tail_rank"]),
        _node("ConstantOfShape", ["tail_rank"], ["tail_ones"], value=helper.make_tensor("i1", 7, [1], [1])),
        _node("Concat", ["minus_one", "tail_ones"], ["param_shape"], axis=0),
        _node("Cast", ["scale"], ["scale_f"], to=1),
        _node("Cast", ["B"], ["bias_f"], to=1),
        _node("Reshape", ["scale_f", "param_shape"], ["scale_b"]),
        _node("Reshape", ["bias_f", "param_shape"], ["bias_b"]),
        _node("Mul", ["normed", "scale_b"], ["scaled"]),
        _node("Add", ["scaled", "bias_b"], ["yf"]),
        _cast_back("yf", "X", "Y", opset),
    ]


def _reduce_mean(x: str, y: str, axis: int, opset: int, tag: str = "") -> list[Any]:
    """ReduceMean over one axis, keepdims: axes an attribute before opset 18, an input from 18 on."""
    if opset < 18:
        return [_node("ReduceMean", [x], [y], axes=[axis], keepdims=1)]
    return [_node("Constant", [], [f"axes{axis}{tag}"], value_ints=[axis]),
            _node("ReduceMean", [x, f"axes{axis}{tag}"], [y], keepdims=1)]


def _scale_by_std(axis: int, opset: int) -> list[Any]:
    """centered / sqrt(mean(centered^2, axis) + epsilon), reshaped back to X's shape: "normed"."""
    return [_node("Mul", ["centered", "centered"], ["squared"]),
            *_reduce_mean("squared", "var", axis, opset, "_sq"),
            _node("Constant", [], ["eps"], (_ref("epsilon", "float", "value_float"),)),
            _node("Add", ["var", "eps"], ["var_eps"]),
            _node("Sqrt", ["var_eps"], ["std"]),
            _node("Div", ["centered", "std"], ["normed_rows"]),
            _node("Shape", ["X"], ["x_shape"]),
            _node("Reshape", ["normed_rows", "x_shape"], ["normed"])]


def _row_norm(opset: int, center: bool, bias: bool) -> list[Any]:
    """LayerNorm / RMSNorm over the axes from `axis` on, spelled out (before LayerNormalization-17 /
    RMSNormalization-23): rows of Flatten(x, axis) in float32, then the scale (and bias) broadcast."""
    nodes = [_node("Cast", ["X"], ["xf"], to=1), _node("Flatten", ["xf"], ["rows"], (_ref("axis", "int"),))]
    if center:
        nodes += [*_reduce_mean("rows", "mean", 1, opset), _node("Sub", ["rows", "mean"], ["centered"])]
    else:
        nodes += [_node("Identity", ["rows"], ["centered"])]
    nodes += [*_scale_by_std(1, opset),
              _node("Cast", ["scale"], ["scale_f"], to=1), _node("Mul", ["normed", "scale_f"], ["scaled"])]
    if bias:
        nodes += [_node("Cast", ["B"], ["bias_f"], to=1), _node("Add", ["scaled", "bias_f"], ["yf"])]
    else:
        nodes += [_node("Identity", ["scaled"], ["yf"])]
    return nodes + [_cast_back("yf", "X", "Y", opset)]


def _layer_norm(t: OpType, opset: int) -> list[Any]:
    if opset < 17:
        return _row_norm(opset, center=True, bias=True)
    return [_node("LayerNormalization", ["X", "scale", "B"], ["Y"], (_ref("axis", "int"), _ref("epsilon", "float")))]


def _rms_norm(t: OpType, opset: int) -> list[Any]:
    if opset < 23:
        return _row_norm(opset, center=False, bias=False)
    return [_node("RMSNormalization", ["X", "scale"], ["Y"], (_ref("axis", "int"), _ref("epsilon", "float")))]


def _skip_norm(t: OpType, opset: int) -> list[Any]:
    """Skip*Norm types: S = X + R [+ bias] in X's type (as the replaced Adds computed it), then the
    norm of S; the *Sum types return S as well."""
    if "bias" in t.inputs:
        head = [_node("Add", ["X", "R"], ["xr"]), _node("Add", ["xr", "SB"], ["S"])]
    else:
        head = [_node("Add", ["X", "R"], ["S"])]
    body = _layer_norm(t, opset) if t.op == "layer_norm" else _rms_norm(t, opset)
    for n in body:
        for i, name in enumerate(n.input):
            if name == "X":
                n.input[i] = "S"
    return head + body


def _const(name: str, values: list[int]) -> Any:
    from onnx import helper
    return _node("Constant", [], [name], value=helper.make_tensor(name, 7, [len(values)], values))


def _head_reshapes(layout: str) -> tuple[list[Any], list[Any]]:
    """Q, K, V -> Q4, K4, V4 stored 4-D, and (bshd) Y4 -> Y, for both values of num_heads in one
    body (a function cannot branch on an attribute): Reshape(X, [0, 0, H, -1]) (bshd) or
    Reshape(X, [0, -1, H, D]) (sbhd, D = X's last dim) splits the 3-D tensors when H = num_heads > 0
    and leaves 4-D ones as they are when H = 0 (a 0 copies the dim). Y goes back through
    Reshape(Y4, Shape(Q)[:-1] + [-1]): [B, S, H*D] for a 3-D Q, [B, S, H, D] for a 4-D one. The
    *Sbhd output stays 4-D either way (optypes.head_output_shape)."""
    nodes = [_node("Constant", [], ["heads0"], (_ref("num_heads", "int", "value_int"),)), _const("axis0", [0]),
             _node("Unsqueeze", ["heads0", "axis0"], ["heads"])]
    if layout == "bshd":
        nodes += [_const("lead", [0, 0]), _const("rest", [-1]),
                  _node("Concat", ["lead", "heads", "rest"], ["split_shape"], axis=0)]
    for v in ("Q", "K", "V"):
        if layout == "sbhd":
            nodes += [_node("Shape", [v], [v + "shape"]), _const(v + "last", [-1]),
                      _node("Gather", [v + "shape", v + "last"], [v + "d"], axis=0), _const(v + "lead", [0, -1]),
                      _node("Concat", [v + "lead", "heads", v + "d"], [v + "split_shape"], axis=0)]
        nodes.append(_node("Reshape", [v, "split_shape" if layout == "bshd" else v + "split_shape"], [v + "4"]))
    if layout != "bshd":
        return nodes, []
    merge = [_node("Shape", ["Q"], ["qshape"]), _const("start", [0]), _const("end", [-1]),
             _node("Slice", ["qshape", "start", "end"], ["qlead"]), _const("minus1", [-1]),
             _node("Concat", ["qlead", "minus1"], ["merge_shape"], axis=0),
             _node("Reshape", ["Y4", "merge_shape"], ["Y"])]
    return nodes, merge


def _leaky_relu(t: OpType, opset: int) -> list[Any]:
    return [_node("LeakyRelu", ["X"], ["Y"], (_ref("alpha", "float"),))]


def _attention(t: OpType, opset: int, attention_op: bool = False) -> list[Any]:
    masked = "mask" in t.inputs
    refs = (_ref("scale", "float"), _ref("is_causal", "int"))
    layout = t.fixed.get("layout", "")
    if layout in HEAD_LAYOUTS:
        # Q, K, V and Y stored [B, S, H, D] or [S, B, H, D]: the transposes to and from [B, H, S, D]
        # that the node took in (or stand for its head reshapes), around the plain body.
        perm = list(HEAD_LAYOUTS[layout])
        plain = OP_TYPES[t.name.removesuffix(layout.capitalize())]
        split, merge = _head_reshapes(layout)
        head = [_node("Transpose", [v + "4"], [v + "bhsd"], perm=[perm.index(i) for i in range(4)])
                for v in ("Q", "K", "V")]
        body = _attention(plain, opset, attention_op)
        for n in body:
            n.input[:] = [v + "bhsd" if v in ("Q", "K", "V") else v for v in n.input]
            n.output[:] = ["Ybhsd" if v == "Y" else v for v in n.output]
        return split + head + body + [_node("Transpose", ["Ybhsd"], ["Y4" if merge else "Y"], perm=perm)] + merge
    if opset >= 23 and attention_op:
        # ONNX Attention where the nodes replaced Attention-23 nodes (4-D; is_causal, default scale);
        # the MatMul pattern's nodes may be 3-D, which Attention-23 takes only with head counts. The mask
        # broadcast to a row per query first: the rewrite may pass one row of a mask whose rows are alike
        # (key_masks), and ORT's CPU Attention kernel wants Sq rows.
        if not masked:
            return [_node("Attention", ["Q", "K", "V"], ["Y"], refs)]
        return [_node("Shape", ["Q"], ["q_dims"]), _const("rows_axis", [2]), _const("one_col", [1]),
                _node("Gather", ["q_dims", "rows_axis"], ["q_rows"], axis=0),
                _node("Concat", ["q_rows", "one_col"], ["rows_shape"], axis=0),
                _node("Expand", ["mask", "rows_shape"], ["mask_rows"]),
                _node("Attention", ["Q", "K", "V", "mask_rows"], ["Y"], refs)]
    # Otherwise (before opset 23 only the MatMul/Softmax/MatMul pattern is rewritten): explicit scale,
    # and is_causal (a mask the rewrite proved causal, causal_masks) as keys j > i hidden.
    # Grouped-query K and V (fewer heads than Q: the rewrite took repeat_kv in) are repeated first.
    nodes = _repeat_kv_heads() + [_node("Einsum", ["Q", "Kq"], ["qk"], equation="...qd,...kd->...qk"),
             _node("Constant", [], ["scale32"], (_ref("scale", "float", "value_float"),))]
    nodes.append(_cast_back("scale32", "Q", "scale", opset))
    nodes.append(_node("Mul", ["qk", "scale"], ["unmasked"]))
    nodes += _causal_hiding("unmasked", "scores", opset)
    if masked:
        nodes.append(_node("Add", ["scores", "mask"], ["masked"]))
    nodes += [_node("Softmax", ["masked" if masked else "scores"], ["probs"], axis=-1),
              _node("MatMul", ["probs", "Vq"], ["Y"])]
    return nodes


def _repeat_kv_heads() -> list[Any]:
    """Kq, Vq = K, V with each head repeated n = Q heads / K heads times in a row (kv head h // n
    for query head h; n = 1 without grouped-query attention, and for 3-D [B*H, S, D] inputs):
    Reshape(Expand(Unsqueeze(X, -3), [n, 1, 1]), X's dims before the heads + [-1, S, D])."""
    nodes = [_const("heads_axis", [-3]), _const("ones2", [1, 1]), _const("lead_end", [-3]), _const("tail_start", [-2]),
             _const("zero1", [0]), _const("big", [1 << 62]), _const("minus1_1", [-1]),
             _node("Shape", ["Q"], ["q_dims"]), _node("Shape", ["K"], ["k_dims"]),
             _node("Gather", ["q_dims", "heads_axis"], ["q_heads"], axis=0),
             _node("Gather", ["k_dims", "heads_axis"], ["k_heads"], axis=0),
             _node("Div", ["q_heads", "k_heads"], ["repeats"]),
             _node("Concat", ["repeats", "ones2"], ["expand_shape"], axis=0),
             _node("Slice", ["k_dims", "zero1", "lead_end"], ["k_lead"]),
             _node("Slice", ["k_dims", "tail_start", "big"], ["k_tail"]),
             _node("Concat", ["k_lead", "minus1_1", "k_tail"], ["repeated_shape"], axis=0)]
    for x in ("K", "V"):
        nodes += [_node("Unsqueeze", [x, "heads_axis"], [x + "5"]),
                  _node("Expand", [x + "5", "expand_shape"], [x + "x"]),
                  _node("Reshape", [x + "x", "repeated_shape"], [x + "q"])]
    return nodes


def _causal_hiding(x: str, y: str, opset: int) -> list[Any]:
    """y = x with the keys above the top-left diagonal at -inf where is_causal, else x: a function
    cannot branch on an attribute, so the hidden set is And(j > i, is_causal). Range and Greater
    (opset 13, the lowest the rewrite takes)."""
    from onnx import TensorProto, helper

    def scalar(name: str, value: float, elem: int = TensorProto.INT64) -> Any:
        return _node("Constant", [], [name], value=helper.make_tensor(name, elem, [], [value]))

    nodes = [scalar("row_axis", -2), scalar("col_axis", -1), scalar("zero_i", 0), scalar("one_i", 1),
             _const("last_axis", [-1]), _node("Shape", [x], ["xshape"]),
             _node("Gather", ["xshape", "row_axis"], ["sq"], axis=0),
             _node("Gather", ["xshape", "col_axis"], ["sk"], axis=0),
             _node("Range", ["zero_i", "sq", "one_i"], ["row_ids"]),
             _node("Range", ["zero_i", "sk", "one_i"], ["cols"]),
             _node("Unsqueeze", ["row_ids", "last_axis"], ["rows"]),
             _node("Greater", ["cols", "rows"], ["above"]),
             _node("Constant", [], ["causal_i"], (_ref("is_causal", "int", "value_int"),)),
             _node("Cast", ["causal_i"], ["causal_b"], to=TensorProto.BOOL),
             _node("And", ["above", "causal_b"], ["hidden"]),
             scalar("neg_inf32", float("-inf"), TensorProto.FLOAT)]
    return nodes + [_cast_back("neg_inf32", x, "neg_inf", opset), _node("Where", ["hidden", "neg_inf", x], [y])]


# The function's formal input names, by jitops input name (ONNX's own spellings where it has one).
_FORMAL = {"x": "X", "w": "W", "bias": "B", "gamma": "scale", "beta": "B", "mean": "mean", "var": "var",
           "q": "Q", "k": "K", "v": "V", "mask": "mask", "residual": "R"}
_BODIES: dict[str, Callable[[OpType, int], list[Any]]] = {
    "conv2d": _conv, "batch_norm": _batch_norm, "group_norm": _group_norm, "layer_norm": _layer_norm,
    "rms_norm": _rms_norm, "leaky_relu": _leaky_relu, "attention": _attention}


def function_for(type_name: str, opset: int, attention_op: bool = False) -> Any:
    """The FunctionProto (domain jitops) implementing node type `type_name` at default-domain `opset`
    (`attention_op`: the attention nodes of this type replaced ONNX Attention-23 nodes)."""
    from onnx import helper
    t = OP_TYPES[type_name]
    skip = "residual" in t.inputs and t.op in ("layer_norm", "rms_norm")
    inputs = [("SB" if skip and n == "bias" else _FORMAL[n]) for n in t.inputs]   # B is beta there
    if t.op == "attention":
        body = _attention(t, opset, attention_op)
    else:
        body = _skip_norm(t, opset) if skip else _BODIES[t.op](t, opset)
    outputs = ["Y", "S"] if "sum" in t.outputs else ["Y"]
    # num_heads has a default in the body (ONNX functions' attribute defaults): nodes without it read 4-D tensors
    defaults = [helper.make_attribute(a.name, a.default) for a in t.attrs if a.name == "num_heads"]
    typed = [X_TYPE] if _reads_x_type(t.op, opset) else []
    return helper.make_function(DOMAIN, t.name, inputs, outputs, body, [helper.make_opsetid("", opset)],
                                attributes=[a.name for a in t.attrs if a.name != "num_heads"] + typed,
                                attribute_protos=defaults,
                                doc_string=f"jitops::{t.name} ({t.op}) in standard ONNX ops: the fallback "
                                           f"where the jitops custom ops are not registered")
