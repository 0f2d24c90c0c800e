"""Padding masks in disguise: a [B, 1, Sq, Sk] mask whose rows are all the same, passed as [B, 1, 1, Sk].

Exporters often expand a padding mask to one row per query: transformers 5 builds BERT's mask from
position indices (Range, GatherND of attention_mask at [batch, key], And with a row of ones), older
versions Expand a [B, 1, 1, Sk] mask to [B, 1, Sq, Sk]. The attention kernels read such a mask as a row
mask (a value per score: H200, 2026-11-29, BERT-base b32 S=384 76 us) where one row per batch would do
(a padding mask, one value per key: 62 us). A mask is passed as its first row (a Slice on the rows
axis, so the node sees [.., 1, Sk] and the kernels take the padding-mask path) only when
- it is computed from graph inputs, shapes and constants alone, through the shape, index and
  elementwise ops of causal_masks (no custom op, no randomness, at most MAX_NODES nodes), and
- evaluated (onnx's reference evaluator) at each of causal_masks' probe sizes, TRIALS times with fresh
  random inputs (0 / 1 for integer and boolean inputs, as attention masks are; normal values for
  floats), its rows along the scores' query axis are identical, more than one of them.
Masks that vary by query row (causal, sliding windows, query padding) show it at the probes and keep
their rows. This is evidence from probes, as causal_masks' proof is for shapes: a mask whose rows
differ only for input values outside 0 / 1 would be taken wrongly, which no exporter writes.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .causal_masks import mask_subgraph, probe_sizes
from .graph import GraphView

log = logging.getLogger("jitops.onnx")

TRIALS = 3


def rows_alike(view: GraphView, mask: str, scores: str) -> bool:
    """True when the additive (or boolean) mask `mask`, added to `scores` [.., Sq, Sk], has Sq > 1 rows
    and they are identical at every probe (module docstring)."""
    shape = view.shape(mask)
    if shape is None or len(shape) < 2 or shape[-2] == 1:
        return False            # already one row (or unknown rank)
    key = ("rows_alike", mask, view.shape(scores))       # one probe per mask, however many layers read it
    if key not in view.proofs:
        view.proofs[key] = _rows_alike(view, mask, scores)
    return view.proofs[key]


def _rows_alike(view: GraphView, mask: str, scores: str) -> bool:
    data: list[str] = []
    nodes = mask_subgraph(view, mask, data)
    if not data or not nodes:
        return False            # shapes and constants only (causal_masks' business), or an input as it is
    produced = {o for n in nodes for o in n.output}
    shaped = list(dict.fromkeys(n.input[0] for n in nodes       # values read only by their shapes: fed zeros
                                if n.op_type == "Shape" and n.input[0] not in produced and n.input[0] not in data))
    rng = np.random.default_rng(0)
    try:
        return all(_probe(view, nodes, data, shaped, mask, scores, size, rng) for size in probe_sizes(view))
    except Exception as exc:       # noqa: BLE001 -- a probe that cannot run proves nothing; keep the mask
        log.debug("mask row probe of %s failed: %s", mask, exc)
        return False


def _random_input(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """0 / 1 for integer and boolean inputs (attention masks), normal values for floats."""
    if dtype.kind in "biu":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _probe(view: GraphView, nodes: list[Any], data: list[str], shaped: list[str], mask: str, scores: str,
           size: tuple[int, int], rng: np.random.Generator) -> bool:
    """The mask at one probe size, TRIALS times: rows along the scores' query axis all equal."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    probe = view if size == (0, 0) else view.at_size(*size)
    sq_sk = probe.static_shape(scores)
    if sq_sk is None or len(sq_sk) < 2 or sq_sk[-2] < 2:
        return False
    shapes = {name: probe.static_shape(name) for name in data + shaped}
    if any(s is None for s in shapes.values()):
        return False
    dtypes = {name: np.dtype(view.dtype(name)) if name in data else np.dtype("float32") for name in shapes}
    inits = {i: numpy_helper.from_array(view.constant(i), i) for n in nodes for i in n.input
             if i and i not in shapes and view.producer.get(i) is None and view.is_constant(i)}
    graph = helper.make_graph(nodes, "mask_rows_probe",
                              [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(dtypes[n]), s)
                               for n, s in shapes.items()],
                              [helper.make_value_info(mask, helper.TypeProto())], initializer=list(inits.values()))
    evaluator = ReferenceEvaluator(helper.make_model(graph, opset_imports=list(view.model.opset_import)))
    for _ in range(TRIALS):
        feeds = {n: _random_input(dtypes[n], s, rng) if n in data else np.zeros(s, dtypes[n])
                 for n, s in shapes.items()}
        value = np.asarray(evaluator.run(None, feeds)[0], dtype=np.float64)
        if value.ndim < 2 or value.shape[-2] != sq_sk[-2]:
            return False
        if not np.array_equal(value, np.broadcast_to(value[..., :1, :], value.shape), equal_nan=True):
            return False
    return True
