"""Where the attention node's Q, K, V and output come from: the head layouts it can read in place.

The MatMul/Softmax/MatMul pattern (attention_patterns.py) works on [B, H, S, D] values. Exporters
make them from [B, S, H, D] projections through head transposes (and [B, S, H*D] reshapes), from
nn.MultiheadAttention's [S, B*H, D] values, and repeat grouped-query K / V heads (Llama's
repeat_kv): the functions here find those producers, so the node can read the projections as they
are stored and the transposes, reshapes and copies no longer run. Each returns None (or gives up)
unless the whole chain is read by the pattern alone, or by Shapes that die with it.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .graph import GraphView
from .matchers import Namer, _same_domain, dies_with
from .optypes import BSHD_PERM, SBHD_PERM

log = logging.getLogger("jitops.onnx")


def _perm(view: GraphView, transpose: Any) -> list[int] | None:
    """A Transpose's permutation (ONNX's default reverses the axes), None when the rank is unknown."""
    a = view.attrs(transpose)
    if "perm" in a:
        return [int(p) for p in a["perm"]]
    shape = view.shape(transpose.input[0])
    return None if shape is None else list(range(len(shape)))[::-1]


def _readers_die_with(view: GraphView, value: str, gone: set[int], memo: dict[int, bool] | None = None) -> bool:
    """Every reader of `value` is a node in `gone` (ids) or a Shape that dies with them (matchers.dies_with)."""
    memo = {} if memo is None else memo
    return all(id(u) in gone or u.op_type == "Shape" and dies_with(view, u, gone, memo)
               for u in view.consumers.get(value, []))


def _read_by_pattern(view: GraphView, value: str, pattern: set[int]) -> bool:
    """`value` is no graph output, one node of the pattern (ids) reads it, and any other reader is a
    Shape that dies with the pattern."""
    return value not in view.outputs and sum(id(u) in pattern for u in view.consumers.get(value, [])) == 1 \
        and _readers_die_with(view, value, pattern)


def _from_bshd(view: GraphView, value: str, pattern: set[int]) -> Any | None:
    """The Transpose(perm=[0, 2, 1, 3]) of a 4-D value that makes `value` [B, H, S, D] out of
    [B, S, H, D], when one node of the pattern (ids in `pattern`) reads it and any other reader is a
    Shape that dies with the pattern (torch's SDPA computes its scale from Shape(q)); else None."""
    prod = view.producer.get(value)
    if prod is None or prod.op_type != "Transpose" or not _same_domain(prod) or not _read_by_pattern(view, value, pattern):
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
    if not all(_readers_die_with(view, x4, gone, memo) for x4 in sources):
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
    pattern (other readers only Shape nodes, which must die with the pattern: matchers.dies_with). Then
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
    if not all(dies_with(view, u, gone, memo) for _, _, readers, _, _ in found for u in readers):
        return None
    return [x for x, _, _, _, _ in found], covered, out_t.output[0], found[0][3]


def _repeated_heads(view: GraphView, value: str, readers: set[int]) -> tuple[str, list[Any]] | None:
    """Llama's repeat_kv as exporters write it: `value` [B, H, S, D] = Reshape(Expand(Unsqueeze(X, 2),
    [B, Hk, n, S, D])) of X [B, Hk, S, D], read by one node of the pattern (node ids `readers`; other
    readers only Shapes that die with it, as the causal mask's did): the node
    can read X itself (grouped-query attention, query head h reads kv head h // n, as repeat_kv laid
    them out), and the copy no longer runs: (X, [Unsqueeze, Expand, Reshape]). Hk, H and D must be
    known and the Expand must keep X's batch and sequence dims: checked on the shapes inferred with
    the symbolic input dims at the causal-mask probes' sizes (a batch broadcast would show there)."""
    reshape = view.producer.get(value)
    if reshape is None or reshape.op_type != "Reshape" or not _same_domain(reshape) \
            or not _read_by_pattern(view, value, readers):
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
    try:
        probes = probe_views(view)
    except Exception as exc:       # noqa: BLE001 -- shapes that cannot be inferred again prove nothing
        log.debug("repeat_kv probe of %s failed: %s", value, exc)
        return None
    for probe in probes:
        px, pe, py = probe.static_shape(x), probe.shape(expand.output[0]), probe.static_shape(value)
        if px is None or py is None or pe is None or len(pe) != 5 \
                or (pe[0], pe[1], pe[3], pe[4]) != (px[0], hk, px[2], d) or py != (px[0], h, px[2], d):
            return None
    return x, [unsqueeze, expand, reshape]
