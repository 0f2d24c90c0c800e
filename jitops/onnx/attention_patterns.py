"""Attention as ONNX writes it: the Attention-23 op, and MatMul -> scale -> mask -> Softmax -> MatMul.

The pattern is matched from its Softmax outwards: the scores MatMul(Q, K^T) with a constant scale
on the scores, on Q or on K^T (torch's SDPA puts sqrt(scale) on both, computed from Shape(q); it
is evaluated at rewrite time), an additive mask (Add) or a masked_fill (Where with a constant
fill, taken as the additive mask Where(cond, fill, 0)), then MatMul with V.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .graph import GraphView
from .matchers import Candidate, Match, Namer, Rejection, _extra_outputs_used, _same_domain


def match_attention_op(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    """ONNX Attention (opset 23+), 4-D inputs, no KV cache, softcap or extra outputs."""
    a = view.attrs(node)
    ins = list(node.input) + [""] * 6
    q_shape = view.shape(ins[0])
    problems = [
        (q_shape is not None and len(q_shape) != 4, "3-D Q/K/V with q_num_heads (only 4-D [B, H, S, D] inputs)"),
        (bool(ins[4] or ins[5]), "past_key / past_value (KV cache)"),
        (len(node.input) > 6 and bool(node.input[6]), "nonpad_kv_seqlen"),
        (float(a.get("softcap", 0.0)) != 0.0, "softcap"),
        (_extra_outputs_used(view, node), "present_key / present_value / qk_matmul_output outputs"),
        (bool(ins[3]) and view.dtype(ins[3]) == "bool", "a boolean attn_mask (jitops takes an additive mask)"),
    ]
    for bad, what in problems:
        if bad:
            yield Rejection([node], "Attention", f"not supported: {what}")
            return
    attrs: dict[str, Any] = {"is_causal": int(a.get("is_causal", 0))}
    if "scale" in a:
        attrs["scale"] = float(a["scale"])
    if ins[3]:
        yield Candidate("MaskedAttention", [node], ins[:4], attrs, node.output[0])
    else:
        yield Candidate("Attention", [node], ins[:3], attrs, node.output[0])


def _scalar_operand(view: GraphView, node: Any) -> tuple[str, float] | None:
    """For Mul/Div with one scalar constant operand: (the other input, the constant)."""
    for i in (0, 1):
        c = view.scalar(node.input[1 - i])
        if c is not None and (node.op_type == "Mul" or i == 0):
            return node.input[i], c
    return None


def _leads_to_matmul(view: GraphView, value: str) -> bool:
    """True when `value` is MatMul(...) or a constant-scaled MatMul(...): the scores side of an Add."""
    prod = view.producer.get(value)
    if prod is not None and prod.op_type in ("Mul", "Div") and _same_domain(prod):
        found = _scalar_operand(view, prod)
        prod = view.producer.get(found[0]) if found else None
    return prod is not None and prod.op_type == "MatMul" and _same_domain(prod)


def _key_input(view: GraphView, kt: str, namer: Namer) -> tuple[str, float, list[Any], list[Any], dict] | None:
    """K (not transposed) for MatMul(Q, K^T): (name, scale factor, covered nodes, new nodes, new values)."""
    from onnx import helper
    scale, covered = 1.0, []
    prod = view.producer.get(kt)
    if prod is not None and prod.op_type == "Mul" and _same_domain(prod) and view.only_consumer(kt):
        found = _scalar_operand(view, prod)
        if found is not None:
            kt, c = found
            scale *= c
            covered.append(prod)
            prod = view.producer.get(kt)
    shape = view.shape(kt)
    if shape is None or len(shape) not in (3, 4):
        return None
    rank = len(shape)
    swapped = tuple(shape[:-2]) + (shape[-1], shape[-2])
    if prod is not None and prod.op_type == "Transpose" and _same_domain(prod) and view.only_consumer(kt):
        pa = view.attrs(prod)
        perm = [int(p) for p in pa["perm"]] if "perm" in pa else list(range(rank))[::-1]
        perm = perm[:-2] + [perm[-1], perm[-2]]
        covered.append(prod)
        if perm == list(range(rank)):
            return prod.input[0], scale, covered, [], {}
        name = namer(kt, "k")
        return name, scale, covered, [helper.make_node("Transpose", [prod.input[0]], [name], perm=perm,
                                                       name=namer(kt, "k_transpose"))], {name: (swapped, view.dtype(kt))}
    name = namer(kt, "k")
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return name, scale, covered, [helper.make_node("Transpose", [kt], [name], perm=perm,
                                                   name=namer(kt, "k_transpose"))], {name: (swapped, view.dtype(kt))}


def match_softmax_attention(view: GraphView, node: Any, fuse: bool, namer: Namer) -> Iterator[Match]:
    """MatMul(Q, K^T) -> [Mul|Div by a constant] -> [Add mask] -> Softmax(last axis) -> MatMul(., V)."""
    if not fuse or view.opset < 13:
        return
    shape = view.shape(node.input[0])
    if shape is None:
        return
    axis = int(view.attrs(node).get("axis", -1))
    if axis not in (-1, len(shape) - 1):
        return
    pv = view.only_consumer(node.output[0])
    if pv is None or pv.op_type != "MatMul" or not _same_domain(pv) or pv.input[0] != node.output[0]:
        return
    covered, scale, mask = [node, pv], 1.0, ""
    value = node.input[0]
    prod = view.producer.get(value)

    def step(n: Any) -> bool:
        return n is not None and _same_domain(n) and view.only_consumer(value) is not None

    extra_mask: list[Any] = []
    mask_consts: dict[str, np.ndarray] = {}
    mask_values: dict[str, tuple] = {}
    if step(prod) and prod.op_type == "Where":
        # masked_fill(cond, -inf) as torch exports it: the same as adding Where(cond, fill, 0).
        found_where = _where_as_additive_mask(view, prod, namer)
        if found_where is None:
            return
        mask, value, extra_mask, mask_consts, mask_values = found_where
        covered.append(prod)
        prod = view.producer.get(value)
    elif step(prod) and prod.op_type == "Add":
        for i in (0, 1):
            src = view.producer.get(prod.input[i])
            if _leads_to_matmul(view, prod.input[i]):
                mask, value = prod.input[1 - i], prod.input[i]
                covered.append(prod)
                prod = src
                break
        else:
            return
    if step(prod) and prod.op_type in ("Mul", "Div"):
        found = _scalar_operand(view, prod)
        if found is None:
            return
        value, c = found
        scale *= c if prod.op_type == "Mul" else 1.0 / c
        covered.append(prod)
        prod = view.producer.get(value)
    if not step(prod) or prod.op_type != "MatMul":
        return
    covered.append(prod)
    q = prod.input[0]
    qp = view.producer.get(q)
    if qp is not None and qp.op_type == "Mul" and _same_domain(qp) and view.only_consumer(q) is not None:
        found = _scalar_operand(view, qp)
        if found is not None:
            q, c = found
            scale *= c
            covered.append(qp)
    key = _key_input(view, prod.input[1], namer)
    if key is None:
        return
    k, k_scale, k_nodes, extra, values = key
    dtype = view.dtype(q)
    if view.opset < 15 and dtype != "float32":
        yield Rejection(covered, "MatMul/Softmax/MatMul", "a float16 attention pattern needs opset >= 15 "
                        "(its fallback body casts the scale with CastLike)")
        return
    attrs = {"scale": float(scale * k_scale), "is_causal": 0}
    op_type = "MaskedAttention" if mask else "Attention"
    inputs = [q, k, pv.input[1]] + ([mask] if mask else [])
    yield Candidate(op_type, covered + k_nodes, inputs, attrs, pv.output[0], constants=mask_consts,
                    extra_nodes=extra_mask + extra, values={**values, **mask_values})


def _where_as_additive_mask(view: GraphView, where: Any, namer: Namer) -> tuple | None:
    """Where(cond, fill, scores) or Where(cond, scores, fill) with a constant scalar fill:
    (mask name, scores value, inserted nodes, new constants, new value types), or None."""
    from onnx import helper
    cond, a, b = where.input
    for fill, scores, fill_first in ((a, b, True), (b, a, False)):
        f = view.scalar(fill)
        if f is None or not _leads_to_matmul(view, scores):
            continue
        dtype = view.dtype(scores)
        if dtype not in ("float32", "float16"):
            return None
        zero, fill_c, mask = namer(where.output[0], "zero"), namer(where.output[0], "fill"), \
            namer(where.output[0], "mask")
        consts = {zero: np.zeros((), dtype=dtype), fill_c: np.array(f, dtype=dtype)}
        branches = [fill_c, zero] if fill_first else [zero, fill_c]
        node = helper.make_node("Where", [cond, *branches], [mask], name=namer(where.output[0], "mask_where"))
        shape = view.shape(cond)
        return mask, scores, [node], consts, {mask: (shape, dtype)} if shape is not None else {}
    return None
