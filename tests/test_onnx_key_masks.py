"""Masks whose query rows are alike (a padding mask expanded to [B, 1, Sq, Sk]) are read as their first
row (jitops/onnx/key_masks.py); masks that differ by row keep every row."""
from __future__ import annotations

import numpy as np
import pytest

import jitops.onnx as jo
from jitops.onnx.testing import check_rewrite_at_two_sizes

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _const(name, values, elem=TensorProto.INT64, dims=None):
    values = list(np.atleast_1d(values))
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, elem, [len(values)] if dims is None else dims, values))


def _model(kind: str):
    """softmax(q k^T + mask) v over q / k / v [b, 2, t, 8] (opset 17), the mask built from an input
    'am' [b, t] of 0 / 1 (1 = a real token): (1 - am) * -10000 as [b, 1, 1, t], then
    - 'expanded': Expand to [b, 1, t, t] (rows alike);
    - 'query_and_key': also hides the rows of padded queries (am[b, i] * am[b, j]: rows differ);
    - 'causal_padding': plus a causal triangle (rows differ)."""
    n = helper.make_node
    nodes = [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["s"]),
             n("Cast", ["am"], ["amf"], to=TensorProto.FLOAT), _const("one", [1.0], TensorProto.FLOAT, []),
             _const("big", [-10000.0], TensorProto.FLOAT, []), _const("ax12", [1, 2]), _const("ax13", [1, 3]),
             n("Unsqueeze", ["amf", "ax12"], ["keys"]),                         # [b, 1, 1, t]
             n("Shape", ["am"], ["am_shape"]), _const("i0", [0]), _const("i1", [1]),
             n("Gather", ["am_shape", "i0"], ["b1"]), n("Gather", ["am_shape", "i1"], ["t1"]),
             n("Concat", ["b1", "i1", "t1", "t1"], ["full"], axis=0)]           # [b, 1, t, t]
    if kind == "expanded":
        nodes += [n("Expand", ["keys", "full"], ["visible"])]
    elif kind == "query_and_key":
        nodes += [n("Unsqueeze", ["amf", "ax13"], ["queries"]),               # [b, 1, t, 1]
                  n("Mul", ["queries", "keys"], ["visible"])]
    else:
        nodes += [n("Concat", ["t1", "t1"], ["tt"], axis=0), n("Expand", ["one", "tt"], ["ones"]), n("Trilu", ["ones"], ["tri"], upper=0),
                  n("Mul", ["tri", "keys"], ["visible"])]
    nodes += [n("Sub", ["one", "visible"], ["hidden"]), n("Mul", ["hidden", "big"], ["mask"]),
              n("Add", ["s", "mask"], ["sm"]), n("Softmax", ["sm"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["y"])]
    ins = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", 2, "t", 8]) for x in "qkv"]
    ins.append(helper.make_tensor_value_info("am", TensorProto.INT64, ["b", "t"]))
    graph = helper.make_graph(nodes, "attention", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    feeds = {x: rng.standard_normal((batch, 2, seq, 8)).astype(np.float32) for x in "qkv"}
    feeds["am"] = np.ones((batch, seq), np.int64)
    feeds["am"][-1, seq // 2 + 1:] = 0
    return feeds


def _mask_producer(model) -> str:
    rw = jo.rewrite(model)
    producer = {o: node for node in rw.graph.node for o in node.output}
    (att,) = [node for node in rw.graph.node if node.domain == jo.DOMAIN]
    assert att.op_type == "MaskedAttention", att.op_type
    return producer[att.input[3]].op_type


def test_expanded_padding_mask_is_read_as_one_row():
    """The Expand over the query rows is undone by a Slice of the first row (the node sees [b, 1, 1, t]);
    the jitops kernels (emulator) and the fallback body match ORT on the original at two sizes."""
    model = _model("expanded")
    assert _mask_producer(model) == "Slice"
    check_rewrite_at_two_sizes(model, "MaskedAttention", _feeds, lambda b, s: (b, 2, s, 8), 1e-4)


@pytest.mark.parametrize("kind", ["query_and_key", "causal_padding"])
def test_masks_that_differ_by_row_keep_their_rows(kind):
    """Hiding padded queries too, or a causal triangle times the padding: the probes see rows differ."""
    model = _model(kind)
    assert _mask_producer(model) != "Slice"
    check_rewrite_at_two_sizes(model, "MaskedAttention", _feeds, lambda b, s: (b, 2, s, 8), 1e-4)
