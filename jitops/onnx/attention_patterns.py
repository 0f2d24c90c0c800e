"""Attention as ONNX writes it: the Attention-23 op, and MatMul -> scale -> mask -> Softmax -> MatMul.

The pattern is matched from its Softmax outwards: the scores MatMul(Q, K^T) with a constant scale
on the scores, on Q or on K^T (torch's SDPA puts sqrt(scale) on both, computed from Shape(q); it
is evaluated at rewrite time), an additive mask (Add) or a masked_fill (Where with a constant
fill, taken as the additive mask Where(cond, fill, 0)), then MatMul with V. Where Q, K and V
come from [B, S, H, D] values through head transposes and the output goes back through one (as
exporters write multi-head attention), the *Bshd types take those transposes in as well, and the
head split / merge Reshapes ([B, S, H*D] <-> [B, S, H, D]) around them where all four qualify
(num_heads = H: the node reads and writes the 3-D tensors, one fewer ORT node each). Where they
come from [S, B*H, D] values through Transpose + Reshape and the output goes to [S, B, H, D]
(torch's nn.MultiheadAttention, as torchvision's ViT uses it), the *Sbhd types take those and
read the [S, B*H, D] values as they are (num_heads = H).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .causal_masks import causal_mask
from .key_masks import rows_alike
from .graph import GraphView
from .matchers import Candidate, Match, Namer, Rejection, _extra_outputs_used, _same_domain
from .attention_heads import _head_reshapes, _head_transposes, _mha_heads, _perm, _readers_die_with, _repeated_heads

log = logging.getLogger("jitops.onnx")


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
        (bool(ins[3]) and view.dtype(ins[3]) == "bool" and view.dtype(ins[0]) not in ("float32", "float16"),
         f"a boolean attn_mask with {view.dtype(ins[0])} inputs (taken with float16 / float32)"),
    ]
    for bad, what in problems:
        if bad:
            yield Rejection([node], "Attention", f"not supported: {what}")
            return
    attrs: dict[str, Any] = {"is_causal": int(a.get("is_causal", 0))}
    if "scale" in a:
        attrs["scale"] = float(a["scale"])
    if ins[3]:
        mask, extra, consts, values = _attention_op_mask(view, ins[3], ins[0], node, namer)
        yield Candidate("MaskedAttention", [node], [*ins[:3], mask], attrs, node.output[0], constants=consts,
                        extra_nodes=extra, values=values)
    else:
        yield Candidate("Attention", [node], ins[:3], attrs, node.output[0])


def _attention_op_mask(view: GraphView, mask: str, q: str, node: Any, namer: Namer
                       ) -> tuple[str, list[Any], dict[str, np.ndarray], dict[str, tuple]]:
    """The Attention op's attn_mask as the jitops node takes it: its first row where the query rows are
    alike (key_masks; the fallback body broadcasts it back to a row per query), and a boolean mask (True:
    the key takes part) as the additive Where(mask, 0, -inf) in Q's type. (mask, inserted nodes, their
    constants, their value types.)"""
    from onnx import helper
    anchor = node.name or node.output[0]
    extra: list[Any] = []
    consts: dict[str, np.ndarray] = {}
    values: dict[str, tuple] = {}
    boolean = view.dtype(mask) == "bool"
    if rows_alike(view, mask, q):
        mask, row, consts, values = _first_row(view, mask, anchor, namer, {})
        extra.append(row)
    if boolean:
        dtype = view.dtype(q)
        shape = _value_type(view, mask, values)[0]
        zero, hidden, additive = (namer(anchor, n) for n in ("mask_zero", "mask_hidden", "mask_additive"))
        consts.update({zero: np.zeros((), dtype=dtype), hidden: np.array(-np.inf, dtype=dtype)})
        extra.append(helper.make_node("Where", [mask, zero, hidden], [additive], name=namer(anchor, "mask_where")))
        values[additive] = (shape, dtype)
        mask = additive
    return mask, extra, consts, values


def _scalar_operand(view: GraphView, node: Any) -> tuple[str, float] | None:
    """For Mul/Div with one scalar constant operand: (the other input, the constant)."""
    for i in (0, 1):
        c = view.scalar(node.input[1 - i])
        if c is not None and (node.op_type == "Mul" or i == 0):
            return node.input[i], c
    return None


def _upcast(view: GraphView, value: str) -> Any | None:
    """The Cast making `value` float32 from float16 / bfloat16, read by one node: None otherwise."""
    prod = view.producer.get(value)
    if prod is None or prod.op_type != "Cast" or not _same_domain(prod) or view.only_consumer(value) is None:
        return None
    low = view.dtype(prod.input[0])
    return prod if view.dtype(value) == "float32" and low in ("float16", "bfloat16") else None


def _leads_to_matmul(view: GraphView, value: str) -> bool:
    """True when `value` is MatMul(...) or a constant-scaled MatMul(...) (or such a value of float16 /
    bfloat16 cast to float32): the scores side of an Add."""
    cast = _upcast(view, value)
    if cast is not None:
        value = cast.input[0]
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
    flat = _flat_transpose(view, kt)
    if flat is not None:
        return flat[0], scale, covered + flat[1], [], {}
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


def _flat_transpose(view: GraphView, kt: str) -> tuple[str, list[Any]] | None:
    """K^T as torch.export's exporter writes it for SDPA: Reshape(Transpose(Reshape(K, [-1, S, D]),
    perm 0,2,1), [..., D, S]) of a 4-D K [.., S, D]: (K, the three nodes). The leading dims must come
    back as they were (each the same dim of K and of K^T, known or the same symbol), the middle
    values read by the chain alone (or by Shapes that die with it: the exporter sizes the last
    Reshape from Shape(flat))."""
    outer = view.producer.get(kt)
    if outer is None or outer.op_type != "Reshape" or not _same_domain(outer) or not view.only_consumer(kt):
        return None
    t = view.producer.get(outer.input[0])
    if t is None or t.op_type != "Transpose" or not _same_domain(t) or _perm(view, t) != [0, 2, 1] \
            or view.only_consumer(t.output[0]) is not outer:
        return None
    inner = view.producer.get(t.input[0])
    if inner is None or inner.op_type != "Reshape" or not _same_domain(inner):
        return None
    chain = [outer, t, inner]
    if not _readers_die_with(view, inner.output[0], {id(n) for n in chain}):
        return None
    k = inner.input[0]
    ks, kts, flat = view.shape(k), view.shape(kt), view.shape(inner.output[0])
    if ks is None or kts is None or flat is None or len(ks) != 4 or len(kts) != 4 or len(flat) != 3:
        return None
    same = all(view.same_dim(k, i, kt, i) for i in range(2)) and view.same_dim(k, 2, kt, 3) \
        and ks[3] is not None and ks[3] == kts[2] and view.same_dim(k, 2, inner.output[0], 1) \
        and flat[2] == ks[3]
    return (k, [*chain]) if same else None


def _nan_guard(view: GraphView, probs: str) -> list[Any]:
    """torch.export's SDPA decomposition zeroes the rows a mask hides entirely: Where(IsNaN(p), 0, p)
    after the Softmax. The kernels give such rows 0 themselves: [IsNaN, Where] when `probs` is read by
    exactly those two, else []."""
    users = view.consumers.get(probs, [])
    isnan = next((u for u in users if u.op_type == "IsNaN" and _same_domain(u)), None)
    where = next((u for u in users if u.op_type == "Where" and _same_domain(u)), None)
    if len(users) != 2 or isnan is None or where is None or probs in view.outputs \
            or view.only_consumer(isnan.output[0]) is not where:
        return []
    zero = view.scalar(where.input[1])
    return [isnan, where] if list(where.input[::2]) == [isnan.output[0], probs] and zero == 0.0 else []


@dataclass
class _Scores:
    """The scores side of the pattern, from the Softmax's input up to MatMul(Q, K^T)."""

    matmul: Any                         # MatMul(Q, K^T)
    covered: list[Any]                  # the nodes between it and the Softmax
    scale: float                        # a constant factor on the scores
    mask: str = ""                      # the additive mask's value ('' none or proved causal)
    causal: bool = False
    upcast: Any | None = None           # the Cast of float16 / bfloat16 scores to float32 (SDPA's causal export)
    extra_mask: list[Any] = field(default_factory=list)        # Where(cond, fill, 0) for masked_fill
    mask_consts: dict[str, np.ndarray] = field(default_factory=dict)
    mask_values: dict[str, tuple] = field(default_factory=dict)


def _scores_side(view: GraphView, softmax: Any, namer: Namer) -> _Scores | None:
    """[MatMul(Q, K^T)] -> [Cast to float32] -> [Mul|Div by a constant] -> [Add mask | masked_fill] ->
    the Softmax's input, each step read by the next alone; None when the chain is something else. A
    mask computed from shapes that is proved causal (causal_masks) is dropped for is_causal."""
    value = softmax.input[0]
    prod = view.producer.get(value)
    sc = _Scores(None, [], 1.0)
    mask_source = ""      # the value the mask is computed from: the Where's condition, or the added mask

    def step(n: Any) -> bool:
        return n is not None and _same_domain(n) and view.only_consumer(value) is not None

    if step(prod) and prod.op_type == "Where":
        # masked_fill(cond, -inf) as torch exports it: the same as adding Where(cond, fill, 0).
        found_where = _where_as_additive_mask(view, prod, namer)
        if found_where is None:
            return None
        sc.mask, value, sc.extra_mask, sc.mask_consts, sc.mask_values, (mask_source, fill, fill_first) = found_where
        sc.causal = causal_mask(view, mask_source, value, where=(fill, fill_first))
        sc.covered.append(prod)
        prod = view.producer.get(value)
    elif step(prod) and prod.op_type == "Add":
        for i in (0, 1):
            if _leads_to_matmul(view, prod.input[i]):
                sc.mask, value = prod.input[1 - i], prod.input[i]
                mask_source = sc.mask
                sc.causal = causal_mask(view, sc.mask, value)
                sc.covered.append(prod)
                prod = view.producer.get(value)
                break
        else:
            return None
    if sc.causal:   # a causal triangle computed from shapes: is_causal instead of reading it (causal_masks)
        log.info("attention at %s: the mask is causal (proved from shapes): is_causal=1, mask not read",
                 softmax.name or softmax.output[0])
        sc.mask, sc.extra_mask, sc.mask_consts, sc.mask_values = "", [], {}, {}
    elif sc.mask and rows_alike(view, mask_source, value):
        # a padding mask expanded over the query rows (key_masks): its first row instead
        sc.mask, node, consts, values = _first_row(view, sc.mask, softmax.name or softmax.output[0], namer,
                                                   sc.mask_values)
        sc.extra_mask.append(node)
        sc.mask_consts.update(consts)
        sc.mask_values.update(values)
    # torch's SDPA(is_causal=True) exported from a float16 model: the scores cast to float32 before the
    # float32 causal mask, V cast to match, the output float32. The node computes in the inputs' own
    # type (float32 inside, as every attention kernel does) and a Cast after it gives the float32
    # output its readers expect. Taken where the mask went (proved causal) or there is none.
    sc.upcast = _upcast(view, value) if step(prod) else None
    if sc.upcast is not None:
        if sc.mask:
            return None
        sc.covered.append(sc.upcast)
        value = sc.upcast.input[0]
        prod = view.producer.get(value)
    if step(prod) and prod.op_type in ("Mul", "Div"):
        found = _scalar_operand(view, prod)
        if found is None:
            return None
        value, c = found
        sc.scale *= c if prod.op_type == "Mul" else 1.0 / c
        sc.covered.append(prod)
        prod = view.producer.get(value)
    if not step(prod) or prod.op_type != "MatMul":
        return None
    sc.matmul = prod
    sc.covered.append(prod)
    return sc


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
    probs, guard = node.output[0], _nan_guard(view, node.output[0])
    if guard:
        probs = guard[-1].output[0]
    pv = view.only_consumer(probs)
    if pv is None or pv.op_type != "MatMul" or not _same_domain(pv) or pv.input[0] != probs:
        return
    sc = _scores_side(view, node, namer)
    if sc is None:
        return
    covered, scale, mask, prod = [node, *guard, pv, *sc.covered], sc.scale, sc.mask, sc.matmul
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
    attrs = {"scale": float(scale * k_scale), "is_causal": int(sc.causal)}
    op_type = "MaskedAttention" if mask else "Attention"
    v = pv.input[1]
    if sc.upcast is not None:      # V cast from the same type; the node writes it, a Cast makes the float32 output
        v_cast = _upcast(view, v)
        if v_cast is None or view.dtype(v_cast.input[0]) != dtype or view.dtype(k) != dtype:
            return
        covered.append(v_cast)
        v = v_cast.input[0]
        from onnx import helper
        low = namer(pv.output[0], "low")
        after = [helper.make_node("Cast", [low], [pv.output[0]], to=1, name=namer(pv.output[0], "upcast"))]
        low_values = {low: (view.shape(pv.output[0]), dtype)}
        log.info("attention at %s: computed in %s (the export's float32 upcast), its output cast after",
                 node.name or node.output[0], dtype)
    if not extra:       # Llama's repeat_kv before K and V: the node reads the kv heads (grouped-query)
        gone = {id(n) for n in covered + k_nodes}
        rk = _repeated_heads(view, k, gone)
        rv = _repeated_heads(view, v, gone) if rk else None
        if rk and rv:
            (k, k_repeat), (v, v_repeat) = rk, rv
            k_nodes = k_nodes + k_repeat + v_repeat
    if sc.upcast is not None:      # the plain type only: the head transposes read the float32 output
        yield Candidate(op_type, covered + k_nodes, [q, k, v], attrs, low, extra_nodes=extra,
                        values={**values, **low_values}, after_nodes=after)
        return
    heads = _head_transposes(view, q, k, v, extra, pv, covered + k_nodes)
    if heads is not None:
        sources, transposes, out = heads
        pattern = covered + k_nodes + transposes
        split = _head_reshapes(view, sources, out, pattern)
        if split is not None:
            sources, reshapes, out, h = split
            pattern, attrs = pattern + reshapes, {**attrs, "num_heads": h}
        yield Candidate(op_type + "Bshd", pattern, sources + ([mask] if mask else []),
                        attrs, out, constants=sc.mask_consts, extra_nodes=sc.extra_mask, values=sc.mask_values)
    mha = None if heads is not None else _mha_heads(view, q, k, v, extra, pv, covered + k_nodes, namer)
    if mha is not None:
        sources, taken, out, h = mha
        yield Candidate(op_type + "Sbhd", covered + k_nodes + taken, sources + ([mask] if mask else []),
                        {**attrs, "num_heads": h}, out, constants=sc.mask_consts, extra_nodes=sc.extra_mask,
                        values=sc.mask_values)
    inputs = [q, k, v] + ([mask] if mask else [])
    yield Candidate(op_type, covered + k_nodes, inputs, attrs, pv.output[0], constants=sc.mask_consts,
                    extra_nodes=sc.extra_mask + extra, values={**values, **sc.mask_values})


def _value_type(view: GraphView, name: str, values: dict[str, tuple]) -> tuple:
    """(shape, dtype) of a value: from `values` where the rewrite inserted it, else from the graph."""
    return values[name] if name in values else (view.shape(name), view.dtype(name))


def _first_row(view: GraphView, mask: str, anchor: str, namer: Namer, values: dict[str, tuple]
               ) -> tuple[str, Any, dict[str, np.ndarray], dict[str, tuple]]:
    """The mask's first row along the query axis (rows proved alike by key_masks): (its name, the Slice,
    the Slice's constants, its value type). The node then sees a padding mask [.., 1, Sk], which the
    kernels read once per key. `values`: types of values inserted before it (the mask may be one)."""
    from onnx import helper
    shape, dtype = _value_type(view, mask, values)
    name = namer(anchor, "mask_row")
    starts, ends, axes = (namer(anchor, f"mask_row_{n}") for n in ("starts", "ends", "axes"))
    consts = {starts: np.array([0], np.int64), ends: np.array([1], np.int64), axes: np.array([-2], np.int64)}
    node = helper.make_node("Slice", [mask, starts, ends, axes], [name], name=namer(anchor, "mask_row_slice"))
    log.info("attention at %s: the mask's rows are alike (a padding mask expanded over the queries): its "
             "first row is read, one value per key", anchor)
    return name, node, consts, ({name: ((*shape[:-2], 1, shape[-1]), dtype)} if shape is not None else {})


def _where_as_additive_mask(view: GraphView, where: Any, namer: Namer) -> tuple | None:
    """Where(cond, fill, scores) or Where(cond, scores, fill) with a constant scalar fill:
    (mask name, scores value, inserted nodes, new constants, new value types, (cond, fill, fill
    first)), or None."""
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
        return (mask, scores, [node], consts, {mask: (shape, dtype)} if shape is not None else {},
                (cond, f, fill_first))
    return None
