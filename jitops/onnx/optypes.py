"""The node types of ONNX domain `jitops`: the one contract between rewrite, kernels and fallbacks.

A rewritten model holds nodes like `jitops::Conv2dRelu(X, W, B)` with ONNX-style attributes
(strides, pads, ...). This table says, for each type, which jitops op runs it, how its inputs map
to the op's inputs, which attributes it carries, and how those become the op's attributes. The
rewrite writes nodes from it, the ONNX Runtime kernels read nodes with it, and the fallback
function bodies implement the same attributes with standard ONNX ops.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

DOMAIN = "jitops"
DOMAIN_VERSION = 1
BSHD_PERM = (0, 2, 1, 3)     # [B, S, H, D] <-> [B, H, S, D] (its own inverse): the "bshd" attention types
SBHD_PERM = (2, 0, 1, 3)     # [B, H, S, D] -> [S, B, H, D]: the "sbhd" types (nn.MultiheadAttention's order)
# Attention's storage layouts: the logical [B, H, S, D] axes in storage order (as jitops.arrays.LAYOUTS).
HEAD_LAYOUTS = {"bshd": BSHD_PERM, "sbhd": SBHD_PERM}


def head_storage_shape(layout: str, shape: tuple, num_heads: int) -> tuple:
    """The 4-D storage shape of a head-layout input given as the tensor before its head Reshape
    (num_heads > 0): bshd [B, S, H*D] -> [B, S, H, D], sbhd [S, B*H, D] -> [S, B, H, D]; the same
    bytes, so the op reads ORT's buffer as it is. None (symbolic) dims stay None; num_heads 0 or a
    shape that does not split: returned as it is (the caller's rank check reports it)."""
    shape = tuple(shape)
    if num_heads <= 0 or len(shape) != 3:
        return shape
    a, b, c = shape
    if layout == "bshd" and (c is None or c % num_heads == 0):
        return (a, b, num_heads, None if c is None else c // num_heads)
    if layout == "sbhd" and (b is None or b % num_heads == 0):
        return (a, None if b is None else b // num_heads, num_heads, c)
    return shape


def head_output_shape(layout: str, storage: tuple, num_heads: int) -> tuple:
    """ORT's shape of a head-layout output stored `storage` (4-D): with num_heads > 0 a *Bshd node
    writes the merged [B, S, H*D] its Reshape made; an *Sbhd output stays [S, B, H, D] (the merge
    after it is torch's [S*B, E], a Reshape left in the graph: attention_patterns._mha_heads)."""
    if num_heads > 0 and layout == "bshd":
        b, s, h, d = storage
        return (b, s, h * d)
    return tuple(storage)


@dataclass(frozen=True)
class Attr:
    """One node attribute: ONNX kind ('int', 'ints', 'float', 'string') and default (None: required)."""

    name: str
    kind: str
    default: Any = None


@dataclass(frozen=True)
class OpType:
    """A node type in domain `jitops` and how it maps onto a jitops op."""

    name: str
    op: str
    inputs: tuple[str, ...]                 # jitops input names, in node input order
    optional: frozenset[str] = frozenset()  # inputs that may be absent
    attrs: tuple[Attr, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)   # op attributes implied by the type
    outputs: tuple[str, ...] = ("y",)

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(f"jitops::{self.name} has no attribute '{name}'")

    def with_defaults(self, node_attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The node's attributes over the defaults, floats as the float32 values ONNX stores.

        Every path must see the same numbers, because they end up in problem keys (tuning records,
        bundles): the ONNX protobuf gives float32 values widened exactly, ORT's kernel info gives
        them printed with 9 digits, a default is written in decimal. Rounding all of them to
        float32 makes 1e-5, 9.99999975e-06 and 9.999999747378752e-06 one key.
        """
        out = {a.name: a.default for a in self.attrs if a.default is not None}
        out.update({k: v for k, v in node_attrs.items() if k in {a.name for a in self.attrs}})
        for a in self.attrs:
            if a.name in out and a.kind == "float":
                out[a.name] = _float32(out[a.name])
            elif a.name in out and a.kind == "floats":
                out[a.name] = [_float32(v) for v in out[a.name]]
        return out

    def op_attrs(self, node_attrs: Mapping[str, Any], input_shapes: Mapping[str, Sequence[int] | None]
                 ) -> dict[str, Any]:
        """The jitops op's attributes (as jitops.<op>() takes them) for a node of this type."""
        a = self.with_defaults(node_attrs)
        return _CONVERT[self.op](self, a, input_shapes)


def _float32(v: Any) -> float:
    return struct.unpack("f", struct.pack("f", float(v)))[0]


def _conv(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    return {"stride": tuple(int(v) for v in a["strides"]), "padding": tuple(int(v) for v in a["pads"]),
            "dilation": tuple(int(v) for v in a["dilations"]), "groups": int(a["group"]),
            "activation": t.fixed.get("activation"), "alpha": float(a.get("alpha", 0.01))}


def _batch_norm(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    return {"eps": float(a["epsilon"]), "activation": t.fixed.get("activation"),
            "alpha": float(a.get("alpha", 0.01))}


def _group_norm(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    return {"num_groups": int(a["num_groups"]), "eps": float(a["epsilon"])}


def _trailing(a: Mapping[str, Any], shapes: Mapping[str, Any]) -> tuple[int, ...]:
    x = tuple(shapes["x"])
    axis = int(a["axis"])
    axis = axis + len(x) if axis < 0 else axis
    return x[axis:]


def _row_norm(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    """layer_norm and rms_norm: the dims from `axis` on are normalized (the Skip* types: of
    x + residual [+ bias], with the sum as a second output in the *Sum types)."""
    out = {"normalized_shape": _trailing(a, shapes), "eps": float(a["epsilon"])}
    if "return_sum" in t.fixed:
        out["return_sum"] = bool(t.fixed["return_sum"])
    return out


def _leaky_relu(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    return {"alpha": float(a["alpha"])}


def _attention(t: OpType, a: Mapping[str, Any], shapes: Mapping[str, Any]) -> dict[str, Any]:
    scale = a.get("scale")
    return {"causal": bool(int(a.get("is_causal", 0))), "scale": None if scale is None else float(scale)}


# jitops op -> attribute conversion (tests/test_registry.py: one for every op a node type names)
_CONVERT = {"conv2d": _conv, "batch_norm": _batch_norm, "group_norm": _group_norm, "layer_norm": _row_norm,
            "rms_norm": _row_norm, "leaky_relu": _leaky_relu, "attention": _attention}

_CONV_ATTRS = (Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1))
_BN_INPUTS = ("x", "gamma", "beta", "mean", "var")   # ONNX order: X, scale, B, input_mean, input_var
_ALPHA = Attr("alpha", "float", 0.01)


def _variants(base: str, op: str, inputs: tuple[str, ...], optional: frozenset[str],
              attrs: tuple[Attr, ...], **fixed: Any) -> list[OpType]:
    """The plain type and its fused-activation variants (epilogue relu / leaky_relu)."""
    return [OpType(base, op, inputs, optional, attrs, {"activation": None, **fixed}),
            OpType(base + "Relu", op, inputs, optional, attrs, {"activation": "relu", **fixed}),
            OpType(base + "LeakyRelu", op, inputs, optional, attrs + (_ALPHA,),
                   {"activation": "leaky_relu", **fixed})]


_NORM_ATTRS = (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5))


def _skip_norms(base: str, op: str, params: tuple[str, ...], optional: frozenset[str]) -> list[OpType]:
    """Skip[Bias]<base>[Sum]: the norm of x + residual [+ bias] (ONNX Add [Add] -> norm, ORT's
    SkipLayerNormalization), the sum as a second output in the Sum types (its other readers)."""
    out = []
    for bias in (False, True):
        for with_sum in (False, True):
            name = f"Skip{'Bias' if bias else ''}{base}{'Sum' if with_sum else ''}"
            out.append(OpType(name, op, ("x", "residual", *params, *(("bias",) if bias else ())), optional,
                              _NORM_ATTRS, {"return_sum": with_sum}, ("y", "sum") if with_sum else ("y",)))
    return out


# num_heads > 0: q, k, v (and the *Bshd output) are the 3-D tensors around the head Reshapes, whose
# bytes are those of the 4-D storage (head_storage_shape); 0: the 4-D storage itself.
_HEAD_ATTRS = (Attr("scale", "float"), Attr("is_causal", "int", 0), Attr("num_heads", "int", 0))


OP_TYPES: dict[str, OpType] = {t.name: t for t in [
    *_variants("Conv2d", "conv2d", ("x", "w", "bias"), frozenset({"bias"}), _CONV_ATTRS),
    # Conv (+ BatchNormalization) + Add of a same-shaped tensor (+ activation): ResNet's shortcut.
    *_variants("Conv2dAdd", "conv2d", ("x", "w", "bias", "residual"), frozenset({"bias"}), _CONV_ATTRS),
    # The same on channels-last data (x, residual and y stored N, H, W, C): inside NHWC regions (layout.py).
    *_variants("Conv2dNhwc", "conv2d", ("x", "w", "bias"), frozenset({"bias"}), _CONV_ATTRS, layout="nhwc"),
    *_variants("Conv2dNhwcAdd", "conv2d", ("x", "w", "bias", "residual"), frozenset({"bias"}), _CONV_ATTRS,
               layout="nhwc"),
    *_variants("BatchNorm", "batch_norm", _BN_INPUTS, frozenset(), (Attr("epsilon", "float", 1e-5),)),
    OpType("GroupNorm", "group_norm", ("x", "gamma", "beta"), frozenset(),
           (Attr("num_groups", "int"), Attr("epsilon", "float", 1e-5))),
    OpType("LayerNorm", "layer_norm", ("x", "gamma", "beta"), frozenset({"beta"}),
           (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5))),
    OpType("RmsNorm", "rms_norm", ("x", "gamma"), frozenset(),
           (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5))),
    *_skip_norms("LayerNorm", "layer_norm", ("gamma", "beta"), frozenset({"beta"})),
    *_skip_norms("RmsNorm", "rms_norm", ("gamma",), frozenset()),
    OpType("LeakyRelu", "leaky_relu", ("x",), frozenset(), (_ALPHA,)),
    # Two attention types: a function body cannot skip an absent mask, so the masked one is its own type.
    OpType("Attention", "attention", ("q", "k", "v"), frozenset(),
           (Attr("scale", "float"), Attr("is_causal", "int", 0)), outputs=("out",)),
    OpType("MaskedAttention", "attention", ("q", "k", "v", "mask"), frozenset(),
           (Attr("scale", "float"), Attr("is_causal", "int", 0)), outputs=("out",)),
    # The same with q, k, v and the output stored [B, S, H, D]: the head transposes an exporter
    # writes around attention are taken into the node (attention_patterns.py).
    OpType("AttentionBshd", "attention", ("q", "k", "v"), frozenset(),
           _HEAD_ATTRS, {"layout": "bshd"}, outputs=("out",)),
    OpType("MaskedAttentionBshd", "attention", ("q", "k", "v", "mask"), frozenset(),
           _HEAD_ATTRS, {"layout": "bshd"}, outputs=("out",)),
    # Stored [S, B, H, D]: torch's nn.MultiheadAttention, whose head splits and merge go into the node.
    OpType("AttentionSbhd", "attention", ("q", "k", "v"), frozenset(),
           _HEAD_ATTRS, {"layout": "sbhd"}, outputs=("out",)),
    OpType("MaskedAttentionSbhd", "attention", ("q", "k", "v", "mask"), frozenset(),
           _HEAD_ATTRS, {"layout": "sbhd"}, outputs=("out",)),
]}


def op_type(name: str) -> OpType:
    try:
        return OP_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown jitops node type '{name}' (known: {', '.join(sorted(OP_TYPES))})") from None
