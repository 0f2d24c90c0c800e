"""Rewritten models in ONNX Runtime: jitops kernels (CPU emulator) and fallback bodies vs ORT's own kernels.

Each case builds a one-op (or fused) model, runs ORT's native kernels on random inputs, then the
rewritten model twice: with the jitops custom ops (the jitops kernels run, on the emulator) and
without them (ORT inlines the fallback function bodies). CI runs this file against onnxruntime
1.22 and the newest release.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.onnx.testing import (max_rel_error, ort_session, ort_supports_opset, run_native, single_op_model,  # noqa: E402
                                 tensor_info)

RTOL = {"float32": 3e-5, "float16": 3e-3}


def _rand(rng, shape, dtype="float32", positive=False):
    a = rng.random(shape) + 0.5 if positive else rng.standard_normal(shape)
    return a.astype(dtype)


def _check(model, feeds, dtype="float32", expect_types=None, input_shapes=None):
    """Native ORT vs jitops kernels vs fallback bodies; returns the rewritten model."""
    ref = run_native(model, feeds)[0]
    rw = jo.rewrite(model, input_shapes=input_shapes)
    onnx.checker.check_model(rw)
    types = [n.op_type for n in rw.graph.node if n.domain == "jitops"]
    if expect_types is not None:
        assert types == expect_types
    got = jo.session(rw, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert max_rel_error(got, ref) <= RTOL[dtype], f"jitops kernels: {max_rel_error(got, ref):.2e}"
    fallback = ort_session(rw).run(None, feeds)[0]      # no jitops library: function bodies
    assert max_rel_error(fallback, ref) <= RTOL[dtype], f"fallback body: {max_rel_error(fallback, ref):.2e}"
    return rw


@pytest.mark.parametrize("attrs,x_shape,w_shape,bias", [
    ({"pads": [1, 2, 0, 1], "strides": [2, 1]}, (2, 4, 9, 10), (6, 4, 3, 3), True),
    ({"auto_pad": "SAME_LOWER"}, (1, 3, 10, 9), (5, 3, 4, 2), False),
    ({"pads": [2, 1, 2, 1], "dilations": [2, 1]}, (1, 3, 10, 9), (5, 3, 3, 3), False),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2], "group": 2}, (1, 4, 9, 9), (6, 2, 3, 3), True),
    ({"auto_pad": "VALID"}, (1, 3, 7, 7), (4, 3, 5, 5), True),
], ids=["pads-strides", "same_lower-even-kernel-nobias", "dilated-nobias", "same_upper-grouped", "valid-5x5"])
def test_conv(rng, attrs, x_shape, w_shape, bias):
    consts = {"w": _rand(rng, w_shape)}
    if bias:
        consts["b"] = _rand(rng, w_shape[:1])
    model = single_op_model("Conv", {"x": x_shape}, consts, attrs)
    _check(model, {"x": _rand(rng, x_shape)}, expect_types=["Conv2d"])


@pytest.mark.parametrize("act", [None, "Relu", "LeakyRelu"])
def test_conv_batchnorm_activation_fused(rng, act):
    c = 6
    inits = [numpy_helper.from_array(_rand(rng, (c, 3, 3, 3)), "w"), numpy_helper.from_array(_rand(rng, c), "b"),
             numpy_helper.from_array(_rand(rng, c, positive=True), "g"),
             numpy_helper.from_array(_rand(rng, c), "beta"), numpy_helper.from_array(_rand(rng, c), "mean"),
             numpy_helper.from_array(_rand(rng, c, positive=True), "var")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["bn"], epsilon=1e-3)]
    out = "bn"
    if act:
        nodes.append(helper.make_node(act, ["bn"], ["y"], **({"alpha": 0.2} if act == "LeakyRelu" else {})))
        out = "y"
    g = helper.make_graph(nodes, "cbr", [tensor_info("x", (2, 3, 8, 8))], [tensor_info(out, (2, c, 8, 8))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    rw = _check(model, {"x": _rand(rng, (2, 3, 8, 8))}, expect_types=["Conv2d" + (act or "")])
    assert len(rw.graph.node) == 1 and {t.name for t in rw.graph.initializer}.isdisjoint({"g", "mean", "var"})


@pytest.mark.parametrize("act", [None, "LeakyRelu"])
def test_batch_norm(rng, act):
    c = 5
    consts = {"g": _rand(rng, c, positive=True), "beta": _rand(rng, c), "mean": _rand(rng, c),
              "var": _rand(rng, c, positive=True)}
    x = _rand(rng, (2, c, 6, 7))
    if act is None:
        model = single_op_model("BatchNormalization", {"x": x.shape}, consts, {"epsilon": 1e-4}, opset=15)
        _check(model, {"x": x}, expect_types=["BatchNorm"])
        return
    nodes = [helper.make_node("BatchNormalization", ["x", *consts], ["bn"]),
             helper.make_node("LeakyRelu", ["bn"], ["y"])]
    g = helper.make_graph(nodes, "bnact", [tensor_info("x", x.shape)], [tensor_info("y", x.shape)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 8
    _check(model, {"x": x}, expect_types=["BatchNormLeakyRelu"])


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm(rng, opset):
    groups, c = 3, 6
    per = groups if opset == 18 else c        # GroupNormalization-18 takes scale/bias per group
    model = single_op_model("GroupNormalization", {"x": (2, c, 5, 4)},
                            {"s": _rand(rng, per, positive=True), "b": _rand(rng, per)},
                            {"num_groups": groups, "epsilon": 1e-3}, opset=opset)
    _check(model, {"x": _rand(rng, (2, c, 5, 4)) * 3 + 1}, expect_types=["GroupNorm"])


@pytest.mark.parametrize("axis,bias,dtype", [(-1, True, "float32"), (1, False, "float32"), (-1, True, "float16")])
def test_layer_norm(rng, axis, bias, dtype):
    shape = (3, 4, 16)
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    consts = {"s": _rand(rng, norm, dtype, positive=True)}
    if bias:
        consts["b"] = _rand(rng, norm, dtype)
    model = single_op_model("LayerNormalization", {"x": shape}, consts, {"axis": axis, "epsilon": 1e-5},
                            opset=17, dtype=dtype)
    _check(model, {"x": _rand(rng, shape, dtype)}, dtype, expect_types=["LayerNorm"])


def test_leaky_relu_default_alpha(rng):
    model = single_op_model("LeakyRelu", {"x": (3, 1000)}, {}, opset=16)
    rw = _check(model, {"x": _rand(rng, (3, 1000))}, expect_types=["LeakyRelu"])
    assert helper.get_attribute_value(rw.graph.node[0].attribute[0]) == pytest.approx(0.01)


@pytest.mark.parametrize("masked,opset,rank", [(False, 17, 4), (True, 17, 4), (True, 13, 3)])
def test_matmul_softmax_matmul_pattern(rng, masked, opset, rank):
    shape = (2, 3, 8, 16) if rank == 4 else (2, 8, 16)
    perm = [0, 1, 3, 2] if rank == 4 else [0, 2, 1]
    mshape = (2, 1, 8, 8) if rank == 4 else (2, 8, 8)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm), helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["s2"])]
    ins = [tensor_info(n, shape) for n in "qkv"]
    feeds = {n: _rand(rng, shape) for n in "qkv"}
    last = "s2"
    if masked:
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["s3"]))
        ins.append(tensor_info("mask", mshape))
        feeds["mask"] = np.where(rng.random(mshape) < 0.2, -1e4, 0.0).astype(np.float32)
        last = "s3"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "attn", ins, [tensor_info("y", shape)],
                          [numpy_helper.from_array(np.array(0.25, np.float32), "c")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    _check(model, feeds, expect_types=["MaskedAttention" if masked else "Attention"])


@pytest.mark.skipif(not ort_supports_opset(23), reason="this onnxruntime has no opset 23 (RMSNormalization, Attention)")
def test_rms_norm_opset23(rng):
    model = single_op_model("RMSNormalization", {"x": (4, 3, 32)}, {"s": _rand(rng, 32, positive=True)},
                            {"epsilon": 1e-5}, opset=23, ir_version=11)
    _check(model, {"x": _rand(rng, (4, 3, 32))}, expect_types=["RmsNorm"])


@pytest.mark.skipif(not ort_supports_opset(23), reason="this onnxruntime has no opset 23 (RMSNormalization, Attention)")
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_op_opset23(rng, causal):
    shape = (1, 2, 8, 16)
    model = single_op_model("Attention", {n: shape for n in "qkv"}, {}, {"is_causal": causal, "scale": 0.3},
                            opset=23, ir_version=11)
    _check(model, {n: _rand(rng, shape) for n in "qkv"}, expect_types=["Attention"])


@pytest.mark.skipif(not ort_supports_opset(23), reason="this onnxruntime has no opset 23 (RMSNormalization, Attention)")
@pytest.mark.parametrize("mask_shape", [(2, 1, 8, 8), (8, 8)])
def test_attention_op_opset23_boolean_mask(rng, mask_shape):
    """A boolean attn_mask (True: the key takes part; opset-23 exports of BERT / Llama with an attention
    mask write one) runs as the additive Where(mask, 0, -inf) inserted before the node."""
    from onnx import TensorProto, helper
    shape = (2, 2, 8, 16)
    model = single_op_model("Attention", {n: shape for n in "qkv"}, {}, {"scale": 0.3}, opset=23, ir_version=11,
                            node_inputs=["q", "k", "v", "m"])
    model.graph.input.append(helper.make_tensor_value_info("m", TensorProto.BOOL, mask_shape))
    mask = rng.random(mask_shape) < 0.7
    mask[..., 0] = True                              # every query sees a key
    rw = _check(model, {**{n: _rand(rng, shape) for n in "qkv"}, "m": mask}, expect_types=["MaskedAttention"])
    assert "Where" in {n.op_type for n in rw.graph.node}


def test_dynamic_model_rewritten_for_given_shapes_runs_and_kernel_errors_reach_the_caller(rng):
    model = single_op_model("Conv", {"x": ("N", 2, "H", "W")}, {"w": _rand(rng, (3, 2, 5, 5))},
                            output_shape=("N", 3, "H2", "W2"))
    rw = jo.rewrite(model, input_shapes={"x": (1, 2, 9, 9)})
    sess = jo.session(rw, providers=["CPUExecutionProvider"])
    x = _rand(rng, (2, 2, 7, 11))       # another batch and size: validated again at run time
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_native(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception) as info:   # 5x5 kernel on a 3x3 image, no padding
        sess.run(None, {"x": _rand(rng, (1, 2, 3, 3))})
    msg = str(info.value)
    assert "jitops::Conv2d (conv2d)" in msg and "ArgumentError" in msg


def test_unsupported_nodes_stay_and_the_model_is_unchanged_otherwise(rng):
    model = single_op_model("Conv", {"x": (1, 2, 4, 4, 4)}, {"w": _rand(rng, (3, 2, 3, 3, 3))})
    rw = jo.rewrite(model)
    assert [n.op_type for n in rw.graph.node] == ["Conv"] and not rw.functions
    assert all(i.domain != "jitops" for i in rw.opset_import)


def test_session_rewrites_a_plain_model_by_default(rng):
    model = single_op_model("LeakyRelu", {"x": (64,)}, {}, {"alpha": 0.5})
    x = _rand(rng, (64,))
    sess = jo.session(model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.where(x > 0, x, np.float32(0.5) * x))


def test_one_session_options_object_serves_several_sessions(rng):
    opts = ort.SessionOptions()
    model = single_op_model("LeakyRelu", {"x": (16,)}, {}, {"alpha": 0.25})
    x = _rand(rng, (16,))
    for _ in range(2):     # ORT refuses a second registration of a domain on the same options
        y = jo.session(model, providers=["CPUExecutionProvider"], options=opts).run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, np.where(x > 0, x, np.float32(0.25) * x))


def test_kernels_in_ort_look_up_the_keys_that_tuning_and_bundles_record(rng):
    """Float attributes reach the ORT kernels printed with 9 digits, the tuner and bundles read them
    from the protobuf: both must give one problem key, or tuned schedules and bundle records are
    silently not applied (and a bundle reload finds no kernel)."""
    import sys
    from pathlib import Path
    from jitops.onnx import kernels
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from make_model import build_model
    model = build_model(16)
    shapes = {"image": (1, 3, 16, 16)}
    expected = {(p.op, p.problem.key()) for p in jo.supported_nodes(model, shapes)}
    before = set(kernels._kernels)
    sess = jo.session(model, input_shapes=shapes, providers=["CPUExecutionProvider"])
    sess.run(None, {"image": rng.standard_normal(shapes["image"]).astype(np.float32)})
    from jitops.ops import get_op
    seen = set()
    for kid, k in kernels._kernels.items():
        if kid in before:
            continue
        for key, (attrs, _) in k.plans.items():
            # the op's view of ORT's tensors (a *Bshd type's q, k, v arrive stored [B, S, H, D])
            specs = k.specs({n: s for n, s, _ in key}, {n: dt for n, _, dt in key if dt})
            seen.add((k.type.op, get_op(k.type.op).make_problem(specs, attrs).key()))
    assert seen and seen == expected, sorted(seen ^ expected)
