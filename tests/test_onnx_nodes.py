"""ONNX node mapping (no ONNX Runtime): which nodes jitops takes, with which problems, and why not."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.onnx.testing import single_op_model, tensor_info  # noqa: E402


def _conv_model(attrs=None, w_shape=(8, 4, 3, 3), x_shape=(1, 4, 9, 9), bias=True, opset=21):
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal(w_shape).astype(np.float32)}
    if bias:
        consts["b"] = rng.standard_normal(w_shape[0]).astype(np.float32)
    return single_op_model("Conv", {"x": x_shape}, consts, attrs or {}, opset=opset)


def test_conv_defaults_and_problem_key():
    [p] = jo.supported_nodes(_conv_model())
    assert p.op == "conv2d" and p.op_type == "Conv2d"
    assert p.node_attrs == {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    assert p.attrs["padding"] == (0, 0, 0, 0) and p.attrs["activation"] is None
    assert p.inputs["x"].shape == (1, 4, 9, 9) and p.inputs["bias"].shape == (8,)
    assert p.key == p.problem.key() and p.key.startswith("conv2d:")


@pytest.mark.parametrize("auto_pad,stride,want", [
    ("SAME_UPPER", 2, [1, 1, 1, 1]),     # 9 -> 5 outputs: total pad 2
    ("SAME_UPPER", 1, [1, 1, 1, 1]),
    ("VALID", 1, [0, 0, 0, 0]),
])
def test_conv_auto_pad(auto_pad, stride, want):
    [p] = jo.supported_nodes(_conv_model({"auto_pad": auto_pad, "strides": [stride, stride]}))
    assert p.node_attrs["pads"] == want


def test_conv_same_lower_puts_the_odd_pixel_first():
    # 10 wide, k=4, stride 1: total pad 3 -> SAME_UPPER (1, 2), SAME_LOWER (2, 1)
    up = jo.supported_nodes(_conv_model({"auto_pad": "SAME_UPPER"}, (8, 4, 4, 4), (1, 4, 10, 10)))[0]
    low = jo.supported_nodes(_conv_model({"auto_pad": "SAME_LOWER"}, (8, 4, 4, 4), (1, 4, 10, 10)))[0]
    assert up.node_attrs["pads"] == [1, 1, 2, 2] and low.node_attrs["pads"] == [2, 2, 1, 1]


def test_dynamic_shapes_need_input_shapes():
    model = _conv_model({"auto_pad": "SAME_UPPER"}, x_shape=("N", 4, "H", "W"))
    [p] = jo.map_nodes(model)
    assert not p.supported and "input_shapes" in p.reason
    [p] = jo.supported_nodes(model, input_shapes={"x": (2, 4, 9, 9)})
    assert p.inputs["x"].shape == (2, 4, 9, 9)


def test_conv3d_is_reported_not_taken():
    [p] = jo.map_nodes(_conv_model(w_shape=(8, 4, 3, 3, 3), x_shape=(1, 4, 5, 5, 5)))
    assert not p.supported and "2-D" in p.reason
    assert jo.supported_nodes(_conv_model(w_shape=(8, 4, 3, 3, 3), x_shape=(1, 4, 5, 5, 5))) == []


def _chain(act: str | None, bn_attrs=None, const_bn=True):
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")]
    bn_vals = [rng.random(6) + 0.5, rng.standard_normal(6), rng.standard_normal(6), rng.random(6) + 0.5]
    names = ["g", "beta", "mean", "var"]
    inputs = [tensor_info("x", (1, 3, 8, 8))]
    for n, v in zip(names, bn_vals):
        if const_bn:
            inits.append(numpy_helper.from_array(v.astype(np.float32), n))
        else:
            inputs.append(tensor_info(n, (6,)))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", *names], ["bn"], **(bn_attrs or {}))]
    out = "bn"
    if act:
        nodes.append(helper.make_node(act, ["bn"], ["y"], **({"alpha": 0.3} if act == "LeakyRelu" else {})))
        out = "y"
    g = helper.make_graph(nodes, "chain", inputs, [tensor_info(out, (1, 6, 8, 8))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("act,op_type", [(None, "Conv2d"), ("Relu", "Conv2dRelu"), ("LeakyRelu", "Conv2dLeakyRelu")])
def test_conv_bn_activation_fuse_into_one_conv(act, op_type):
    [p] = jo.supported_nodes(_chain(act))
    assert p.op_type == op_type and p.onnx_ops[:2] == ("Conv", "BatchNormalization")
    assert p.attrs["activation"] == {None: None, "Relu": "relu", "LeakyRelu": "leaky_relu"}[act]
    assert set(p.constants) == {p.node_inputs[1], p.node_inputs[2]}     # folded weights and bias
    if act == "LeakyRelu":
        assert p.attrs["alpha"] == pytest.approx(0.3)


def test_bn_fold_numerics():
    model = _chain(None)
    [p] = jo.supported_nodes(model)
    w_f, b_f = (p.constants[n].astype(np.float64) for n in p.node_inputs[1:3])
    vals = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    k = vals["g"] / np.sqrt(vals["var"] + 1e-5)
    np.testing.assert_allclose(w_f, vals["w"] * k[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(b_f, vals["beta"] - vals["mean"] * k, rtol=1e-5, atol=1e-6)


def test_no_fold_without_constant_bn_parameters_or_when_fuse_is_off():
    groups = jo.supported_nodes(_chain("Relu", const_bn=False))
    assert [p.op_type for p in groups] == ["Conv2d", "BatchNormRelu"]
    groups = jo.supported_nodes(_chain("Relu"), fuse=False)
    assert [p.op_type for p in groups] == ["Conv2d", "BatchNorm"]     # no Relu type: stays ONNX


def test_training_batch_norm_is_refused():
    groups = jo.map_nodes(_chain(None, {"training_mode": 1}))
    bn = [p for p in groups if "BatchNormalization" in p.onnx_ops]
    assert [p.op_type for p in groups if p.supported] == ["Conv2d"]
    assert bn and not bn[0].supported and "training" in bn[0].reason


def test_ops_filter_accepts_jitops_and_onnx_names():
    m = _chain("Relu", const_bn=False)
    assert [p.op for p in jo.supported_nodes(m, ops=["batch_norm"])] == ["batch_norm"]
    assert [p.op for p in jo.supported_nodes(m, ops=["Conv"])] == ["conv2d"]
    with pytest.raises(ValueError, match="neither a jitops op"):
        jo.supported_nodes(m, ops=["Gemm"])


def test_group_norm_opset18_scale_is_expanded_per_channel():
    rng = np.random.default_rng(2)
    consts = {"s": rng.random(2).astype(np.float32), "b": rng.random(2).astype(np.float32)}
    [p] = jo.supported_nodes(single_op_model("GroupNormalization", {"x": (1, 6, 4, 4)}, consts, {"num_groups": 2},
                                             opset=18))
    s_new = p.constants[p.node_inputs[1]]
    np.testing.assert_array_equal(s_new, np.repeat(consts["s"], 3))
    [p21] = jo.supported_nodes(single_op_model("GroupNormalization", {"x": (1, 6, 4, 4)},
                                               {"s": np.ones(6, np.float32), "b": np.zeros(6, np.float32)},
                                               {"num_groups": 2}, opset=21))
    assert p21.constants == {} and p21.inputs["gamma"].shape == (6,)


def test_layer_norm_axis_and_broadcast_scale():
    [p] = jo.supported_nodes(single_op_model("LayerNormalization", {"x": (2, 3, 4, 5)},
                                             {"s": np.full((1, 5), 2.0, np.float32)}, {"axis": -2}))
    assert p.attrs["normalized_shape"] == (4, 5) and p.inputs["gamma"].shape == (4, 5)


def test_attention_pattern_is_matched_with_scale_and_mask():
    q, k = tensor_info("q", (2, 4, 8, 16)), tensor_info("k", (2, 4, 8, 16))
    v, mask = tensor_info("v", (2, 4, 8, 16)), tensor_info("mask", (2, 1, 8, 8))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "c"], ["s2"]),
             helper.make_node("Add", ["mask", "s2"], ["s3"]),
             helper.make_node("Softmax", ["s3"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "attn", [q, k, v, mask], [tensor_info("y", (2, 4, 8, 16))],
                          [numpy_helper.from_array(np.array(4.0, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    [p] = jo.supported_nodes(m)
    assert p.op_type == "MaskedAttention" and len(p.onnx_ops) == 6 and p.extra_nodes == []
    assert p.node_attrs["scale"] == pytest.approx(0.25) and p.node_inputs == ("q", "k", "v", "mask")
    assert jo.supported_nodes(m, fuse=False) == []


def test_mixed_dtype_constants_are_cast_to_the_data_dtype():
    consts = {"s": np.ones(8, np.float32), "b": np.zeros(8, np.float32)}
    model = single_op_model("LayerNormalization", {"x": (4, 8)}, consts, dtype="float16")
    [p] = jo.supported_nodes(model)
    assert p.inputs["gamma"].dtype == "float16" and all(v.dtype == np.float16 for v in p.constants.values())
    # a non-constant float32 parameter next to float16 data stays ONNX
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "s"], ["y"])], "ln",
                          [tensor_info("x", (4, 8), "float16"), tensor_info("s", (8,))],
                          [tensor_info("y", (4, 8), "float16")])
    [q] = jo.map_nodes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    assert not q.supported and "mixed dtypes" in q.reason


def test_head_split_and_sdpa_scale_are_known_under_a_symbolic_batch():
    """torch's head split: Reshape(x, Concat(Shape(x)[0], H, Shape(x)[1], Shape(x)[2] / H)); onnx's data
    propagation loses the head dim at the symbolic batch, the rewrite's evaluator keeps it."""
    from jitops.onnx.graph import GraphView
    n = helper.make_node
    c = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "i2": np.array(2, np.int64),
         "heads": np.array([4], np.int64), "h": np.array(4, np.int64), "ax0": np.array([0], np.int64),
         "one": np.array(1.0, np.float32), "m1": np.array([-1], np.int64), "big": np.array([2**62], np.int64)}
    nodes = [n("Shape", ["x"], ["s"]), n("Gather", ["s", "i0"], ["b"]), n("Gather", ["s", "i1"], ["t"]),
             n("Gather", ["s", "i2"], ["c"]), n("Div", ["c", "h"], ["d"]),
             n("Unsqueeze", ["b", "ax0"], ["b1"]), n("Unsqueeze", ["t", "ax0"], ["t1"]),
             n("Unsqueeze", ["d", "ax0"], ["d1"]), n("Concat", ["b1", "heads", "t1", "d1"], ["target"], axis=0),
             n("Reshape", ["x", "target"], ["q"]),
             n("Shape", ["q"], ["qs"]), n("Slice", ["qs", "m1", "big"], ["last"]), n("Cast", ["last"], ["lf"], to=1),
             n("Sqrt", ["lf"], ["r"]), n("Div", ["one", "r"], ["inv"]), n("Sqrt", ["inv"], ["s4"])]
    g = helper.make_graph(nodes, "split", [tensor_info("x", ["B", 6, 32])], [tensor_info("s4", None)],
                          [numpy_helper.from_array(v, k) for k, v in c.items()])
    view = GraphView(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert view.shape("q") == (None, 4, 6, 8)
    assert view.scalar("s4") == pytest.approx(8 ** -0.25)
    assert view.scalar("d") is not None and view.scalar("b") is None      # the batch stays unknown


def test_a_matcher_that_fails_leaves_its_node_to_onnx_with_the_error(monkeypatch):
    from jitops.onnx import matchers

    def broken(view, node, fuse, namer):
        raise IndexError("list index out of range")
        yield  # pragma: no cover

    monkeypatch.setitem(matchers.MATCHERS, "Conv", broken)
    model = _conv_model()
    [p] = jo.map_nodes(model)
    assert not p.supported and "could not analyse" in p.reason and "IndexError" in p.reason
    assert jo.rewrite(model).graph.node[0].op_type == "Conv"
