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
from typing import Any, Iterator

import numpy as np

from .causal_masks import causal_mask
from .graph import GraphView
from .matchers import Candidate, Match, Namer, Rejection, _extra_outputs_used, _same_domain
from .optypes import BSHD_PERM, SBHD_PERM

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
    ids, memo = {id(n) for n in chain}, {}
    if not all(id(u) in ids or u.op_type == "Shape" and _dead_with(view, u, ids, memo)
               for u in view.consumers.get(inner.output[0], [])):
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
    covered, scale, mask = [node, *guard, pv], 1.0, ""
    value = node.input[0]
    prod = view.producer.get(value)

    def step(n: Any) -> bool:
        return n is not None and _same_domain(n) and view.only_consumer(value) is not None

    extra_mask: list[Any] = []
    causal = False
    mask_consts: dict[str, np.ndarray] = {}
    mask_values: dict[str, tuple] = {}
    if step(prod) and prod.op_type == "Where":
        # masked_fill(cond, -inf) as torch exports it: the same as adding Where(cond, fill, 0).
        found_where = _where_as_additive_mask(view, prod, namer)
        if found_where is None:
            return
        mask, value, extra_mask, mask_consts, mask_values, (cond, fill, fill_first) = found_where
        causal = causal_mask(view, cond, value, where=(fill, fill_first))
        covered.append(prod)
        prod = view.producer.get(value)
    elif step(prod) and prod.op_type == "Add":
        for i in (0, 1):
            src = view.producer.get(prod.input[i])
            if _leads_to_matmul(view, prod.input[i]):
                mask, value = prod.input[1 - i], prod.input[i]
                causal = causal_mask(view, mask, value)
                covered.append(prod)
                prod = src
                break
        else:
            return
    if causal:      # a causal triangle computed from shapes: is_causal instead of reading it (causal_masks)
        log.info("attention at %s: the mask is causal (proved from shapes): is_causal=1, mask not read",
                 node.name or node.output[0])
        mask, extra_mask, mask_consts, mask_values = "", [], {}, {}
    # torch's SDPA(is_causal=True) exported from a float16 model: the scores cast to float32 before the
    # float32 causal mask, V cast to match, the output float32. The node computes in the inputs' own
    # type (float32 inside, as every attention kernel does) and a Cast after it gives the float32
    # output its readers expect. Taken where the mask went (proved causal) or there is none.
    upcast = _upcast(view, value) if step(prod) else None
    if upcast is not None:
        if mask:
            return
        covered.append(upcast)
        value = upcast.input[0]
        prod = view.producer.get(value)
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
    attrs = {"scale": float(scale * k_scale), "is_causal": int(causal)}
    op_type = "MaskedAttention" if mask else "Attention"
    v = pv.input[1]
    if upcast is not None:      # V cast from the same type; the node writes it, a Cast makes the float32 output
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
    if upcast is not None:      # the plain type only: the head transposes read the float32 output
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
                        attrs, out, constants=mask_consts, extra_nodes=extra_mask, values=mask_values)
    mha = None if heads is not None else _mha_heads(view, q, k, v, extra, pv, covered + k_nodes, namer)
    if mha is not None:
        sources, taken, out, h = mha
        yield Candidate(op_type + "Sbhd", covered + k_nodes + taken, sources + ([mask] if mask else []),
                        {**attrs, "num_heads": h}, out, constants=mask_consts, extra_nodes=extra_mask,
                        values=mask_values)
    inputs = [q, k, v] + ([mask] if mask else [])
    yield Candidate(op_type, covered + k_nodes, inputs, attrs, pv.output[0], constants=mask_consts,
                    extra_nodes=extra_mask + extra, values={**values, **mask_values})


def _repeated_heads(view: GraphView, value: str, readers: set[int]) -> tuple[str, list[Any]] | None:
    """Llama's repeat_kv as exporters write it: `value` [B, H, S, D] = Reshape(Expand(Unsqueeze(X, 2),
    [B, Hk, n, S, D])) of X [B, Hk, S, D], read by one node of the pattern (node ids `readers`; other
    readers only Shapes that die with it, as the causal mask's did): the node
    can read X itself (grouped-query attention, query head h reads kv head h // n, as repeat_kv laid
    them out), and the copy no longer runs: (X, [Unsqueeze, Expand, Reshape]). Hk, H and D must be
    known and the Expand must keep X's batch and sequence dims: checked on the shapes inferred with
    the symbolic input dims at the causal-mask probes' sizes (a batch broadcast would show there)."""
    reshape = view.producer.get(value)
    users, memo = view.consumers.get(value, []), {}
    if reshape is None or reshape.op_type != "Reshape" or not _same_domain(reshape) or value in view.outputs \
            or sum(id(u) in readers for u in users) != 1 \
            or not all(id(u) in readers or u.op_type == "Shape" and _dead_with(view, u, readers, memo) for u in users):
        return None
    expand = view.producer.get(reshape.input[0])
    if expand is None or expand.op_type != "Expand" or not _same_domain(expand) \
            or view.only_consumer(expand.output[0]) is not reshape:
        return None
    unsqueeze = view.producer.get(expand.input[0])
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or not _same_domain(unsqueeze) \
            or view.only_consumer(unsqueeze.output[0]) is not expand:
        return None
    axes = view.constant(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else view.attrs(unsqueeze).get("axes")
    x = unsqueeze.input[0]
    xs, ys = view.shape(x), view.shape(value)
    if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([2], [-3]) or xs is None \
            or ys is None or len(xs) != 4 or len(ys) != 4:
        return None
    hk, d, h = xs[1], xs[3], ys[1]
    if hk is None or d is None or h is None or ys[3] != d or h <= hk or h % hk:
        return None
    from .causal_masks import probe_views
    for probe in probe_views(view):
        px, pe, py = probe.static_shape(x), probe.shape(expand.output[0]), probe.static_shape(value)
        if px is None or py is None or pe is None or len(pe) != 5 \
                or (pe[0], pe[1], pe[3], pe[4]) != (px[0], hk, px[2], d) or py != (px[0], h, px[2], d):
            return None
    return x, [unsqueeze, expand, reshape]


def _perm(view: GraphView, transpose: Any) -> list[int] | None:
    """A Transpose's permutation (ONNX's default reverses the axes), None when the rank is unknown."""
    a = view.attrs(transpose)
    if "perm" in a:
        return [int(p) for p in a["perm"]]
    shape = view.shape(transpose.input[0])
    return None if shape is None else list(range(len(shape)))[::-1]


def _from_bshd(view: GraphView, value: str, pattern: set[int]) -> Any | None:
    """The Transpose(perm=[0, 2, 1, 3]) of a 4-D value that makes `value` [B, H, S, D] out of
    [B, S, H, D], when one node of the pattern (ids in `pattern`) reads it and any other reader is a
    Shape that dies with the pattern (torch's SDPA computes its scale from Shape(q)); else None."""
    prod = view.producer.get(value)
    users, memo = view.consumers.get(value, []), {}
    if prod is None or prod.op_type != "Transpose" or not _same_domain(prod) or value in view.outputs \
            or sum(id(u) in pattern for u in users) != 1 \
            or not all(id(u) in pattern or u.op_type == "Shape" and _dead_with(view, u, pattern, memo) for u in users):
        return None
    shape = view.shape(prod.input[0])
    return prod if shape is not None and len(shape) == 4 and _perm(view, prod) == list(BSHD_PERM) else None


def _head_transposes(view: GraphView, q: str, k: str, v: str, k_extra: list[Any], pv: Any, pattern: list[Any]
                     ) -> tuple[list[str], list[Any], str] | None:
    """When Q, K and V come from [B, S, H, D] values through head transposes read by the pattern
    alone, and the output goes back to [B, S, H, D] through one, the node can read and write those
    values itself (saving four Transpose launches): ([q, k, v] sources, the Transposes, the output).

    K arrives as _key_input left it: a [B, H, S, D] value (then one more head transpose to look
    through), or a Transpose it would insert, which is the head transpose itself when K^T was
    Transpose(X, perm=[0, 2, 3, 1]) of a 4-D X. None when any piece is missing: all or nothing.
    """
    ids = {id(n) for n in pattern}
    q_t, v_t = _from_bshd(view, q, ids), _from_bshd(view, v, ids)
    if k_extra:
        x = k_extra[0].input[0]
        if len(k_extra) != 1 or len(view.shape(x) or ()) != 4 or _perm(view, k_extra[0]) != list(BSHD_PERM):
            return None
        k_src, k_ts = x, []
    else:
        k_t = _from_bshd(view, k, ids)
        if k_t is None:
            return None
        k_src, k_ts = k_t.input[0], [k_t]
    out_t = view.only_consumer(pv.output[0])
    if q_t is None or v_t is None or out_t is None or out_t.op_type != "Transpose" or not _same_domain(out_t):
        return None
    out_shape = view.shape(pv.output[0])
    if out_shape is None or len(out_shape) != 4 or _perm(view, out_t) != list(BSHD_PERM):
        return None
    return [q_t.input[0], k_src, v_t.input[0]], [q_t, *k_ts, v_t, out_t], out_t.output[0]


def _head_split(view: GraphView, x4: str) -> tuple[str, Any, int, int] | None:
    """The head split Reshape([B, S, H*D] -> [B, S, H, D]) that makes the 4-D `x4`: (its 3-D input,
    the Reshape, H, D). None unless H and D are known, the last axis alone is split (B and S the
    same dims on both sides, known or the same symbolic dim) and E = H * D."""
    reshape = view.producer.get(x4)
    if reshape is None or reshape.op_type != "Reshape" or not _same_domain(reshape) or x4 in view.outputs:
        return None
    x, src, out = reshape.input[0], view.shape(reshape.input[0]), view.shape(x4)
    if src is None or out is None or len(src) != 3 or len(out) != 4:
        return None
    _, _, h, d = out
    if h is None or d is None or src[2] != h * d or not (view.same_dim(x, 0, x4, 0) and view.same_dim(x, 1, x4, 1)):
        return None
    return x, reshape, h, d


def _head_reshapes(view: GraphView, sources: list[str], out: str, pattern: list[Any]
                   ) -> tuple[list[str], list[Any], str, int] | None:
    """When the *Bshd node's Q, K and V ([B, S, H, D]) are head split Reshapes of [B, S, E] values
    (_head_split) and its output's only reader merges the heads back to [B, S, E], the node reads
    and writes the 3-D values (num_heads = H; the same bytes): ([q, k, v] 3-D sources, the Reshapes,
    the merged output, H). K and V must have Q's head count (GQA keeps its Reshapes); all or none."""
    split = [_head_split(view, x4) for x4 in sources]
    if None in split:
        return None
    # the 4-D values are read by the replaced nodes alone, or by Shape chains that die with them
    gone, memo = {id(n) for n in pattern} | {id(r) for _, r, _, _ in split}, {}
    if not all(id(u) in gone or (u.op_type == "Shape" and _dead_with(view, u, gone, memo))
               for x4 in sources for u in view.consumers.get(x4, [])):
        return None
    h, dv = split[0][2], split[2][3]
    merge = view.only_consumer(out)
    if any(found[2] != h for found in split) or merge is None or merge.op_type != "Reshape" \
            or not _same_domain(merge) or out in view.outputs or len(view.consumers.get(out, [])) != 1:
        return None
    y, q = merge.output[0], split[0][0]
    shape = view.shape(y)
    if shape is None or len(shape) != 3 or shape[2] != h * dv or not (view.same_dim(y, 0, q, 0)
                                                                       and view.same_dim(y, 1, q, 1)):
        return None
    reshapes = list({id(r): r for _, r, _, _ in split}.values()) + [merge]
    return [x for x, _, _, _ in split], reshapes, y, h


def _from_sbhd(view: GraphView, value: str, pattern: set[int]) -> tuple[str, list[Any], list[Any], int, int] | None:
    """nn.MultiheadAttention's head split: `value` [B, H, S, D] is Reshape(Transpose(X, perm=[1, 0, 2]))
    of a 3-D X [S, B*H, D], the Transpose read by the Reshape and the Reshape by one node of the
    pattern (other readers only Shape nodes, which must die with the pattern: _dead_with). Then
    Reshape(X, [S, B, H, D]) holds the same numbers in [S, B, H, D] order: (X, [Transpose, Reshape],
    the Shape readers, H, D). None unless H and D are known and the Reshape only splits the leading
    axis (its S and D those of its input; a symbolic S must be symbolic on both sides)."""
    reshape = view.producer.get(value)
    if reshape is None or reshape.op_type != "Reshape" or not _same_domain(reshape) or value in view.outputs:
        return None
    users = view.consumers.get(value, [])
    if sum(id(u) in pattern for u in users) != 1:
        return None
    t = view.producer.get(reshape.input[0])
    if t is None or t.op_type != "Transpose" or not _same_domain(t) or t.output[0] in view.outputs:
        return None
    shape_readers = [u for u in users if id(u) not in pattern] + \
        [u for u in view.consumers.get(t.output[0], []) if u is not reshape]
    if any(u.op_type != "Shape" or not _same_domain(u) for u in shape_readers):
        return None
    src, out = view.shape(t.output[0]), view.shape(value)
    if src is None or out is None or len(src) != 3 or len(out) != 4 or _perm(view, t) != [1, 0, 2]:
        return None
    _, h, s, d = out
    if h is None or d is None or src[2] != d or s != src[1]:
        return None
    return t.input[0], [t, reshape], shape_readers, h, d


def _dead_with(view: GraphView, node: Any, gone: set[int], memo: dict[int, bool]) -> bool:
    """True when everything `node` computes is read only by nodes in `gone` (the replaced ones),
    directly or through nodes of which the same holds: then the rewrite's orphan pass drops it, as
    it drops the Shape -> Gather -> Concat chains torch computes reshape targets and scales with."""
    if id(node) not in memo:
        memo[id(node)] = False      # a cycle or a repeat visit in progress: not dead
        readers = [u for o in node.output if o for u in view.consumers.get(o, [])]
        memo[id(node)] = bool(readers) and _same_domain(node) and not any(a.type in (5, 10) for a in node.attribute) \
            and not any(o in view.outputs for o in node.output) \
            and all(id(u) in gone or _dead_with(view, u, gone, memo) for u in readers)
    return memo[id(node)]


def _mha_heads(view: GraphView, q: str, k: str, v: str, k_extra: list[Any], pv: Any, pattern: list[Any], namer: Namer
               ) -> tuple[list[str], list[Any], str, int] | None:
    """When Q, K and V are nn.MultiheadAttention's head splits of [S, B*H, D] values (_from_sbhd)
    and the output's only reader is Transpose(perm=[2, 0, 1, 3]) to [S, B, H, D], the node reads
    each X as it is ([S, B*H, D] holds the bytes of [S, B, H, D]: num_heads = H tells the split) and
    writes that Transpose's output: the head transposes and the merge run inside it. Returns
    (sources, covered Transposes and Reshapes, output, H); None when any piece is missing (K must
    be one of the splits as it is: _key_input took K^T's transpose), the head counts differ or a
    Shape of a replaced value would outlive the rewrite."""
    ids = {id(n) for n in pattern}
    found = [_from_sbhd(view, x, ids) for x in (q, k, v)]
    out_t = view.only_consumer(pv.output[0])
    if k_extra or None in found or out_t is None or out_t.op_type != "Transpose" or not _same_domain(out_t) \
            or len(view.shape(pv.output[0]) or ()) != 4 or _perm(view, out_t) != list(SBHD_PERM):
        return None
    if len({h for _, _, _, h, _ in found}) != 1:
        return None
    covered = [n for _, pieces, _, _, _ in found for n in pieces] + [out_t]
    gone, memo = ids | {id(n) for n in covered}, {}
    if not all(_dead_with(view, u, gone, memo) for _, _, readers, _, _ in found for u in readers):
        return None
    return [x for x, _, _, _, _ in found], covered, out_t.output[0], found[0][3]


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
