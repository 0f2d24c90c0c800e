"""Channels-last regions in rewritten models (jitops.onnx.layout) and the fused residual Add.

fp16 conv groups that feed each other run on NHWC data with one Transpose in and one out; the
results must equal ORT's float32 run of the same model (jitops kernels on the emulator, and the
fallback bodies without the jitops library), and nothing changes where a region would not pay.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.errors import ArgumentError  # noqa: E402
from jitops.onnx.testing import max_rel_error, ort_session, run_native  # noqa: E402

FP16_RTOL = 3e-3      # fp16 storage between three convs (fp32 accumulation) against an fp32 run


def chain_model(dtype=np.float16, c=8, hw=6, extra_output=False, convs=3):
    """x -> (Conv+Relu) x (convs-1) -> Conv -> Add(x) -> Relu -> y: convs that feed each other."""
    rng = np.random.default_rng(0)
    et = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    inits, nodes, v = [], [], "x"
    for i in range(convs):
        w = (rng.standard_normal((c, c, 3, 3)) / (3 * np.sqrt(c))).astype(dtype)
        b = (rng.standard_normal(c) * 0.1).astype(dtype)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [v, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        if i < convs - 1:
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
            v = f"r{i}"
    nodes += [helper.make_node("Add", [f"c{convs - 1}", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    shape = ["batch", c, hw, hw]
    outputs = [helper.make_tensor_value_info("y", et, shape)]
    if extra_output:        # an NCHW reader in the middle of the region: the graph itself
        outputs.append(helper.make_tensor_value_info("r0", et, shape))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", et, shape)], outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _jitops_types(model):
    return [n.op_type for n in model.graph.node if n.domain == jo.DOMAIN]


def _transposes(model):
    return [n for n in model.graph.node if n.op_type == "Transpose"]


@pytest.mark.parametrize("extra_output", [False, True])
def test_fp16_conv_chain_runs_channels_last_and_matches_fp32(extra_output):
    convs = 3 + extra_output        # 1 Transpose in + 2 out must stay below the convs' conversions
    m16, m32 = (chain_model(dt, extra_output=extra_output, convs=convs) for dt in (np.float16, np.float32))
    rw = jo.rewrite(m16)
    onnx.checker.check_model(rw)
    assert _jitops_types(rw) == ["Conv2dNhwcRelu"] * (convs - 1) + ["Conv2dNhwcAddRelu"]
    # One Transpose into the region (x feeds the first conv and the residual), one out per NCHW reader.
    assert len(_transposes(rw)) == 2 + extra_output
    x = np.random.default_rng(1).standard_normal((2, 8, 6, 6)).astype(np.float32)
    refs = run_native(m32, {"x": x})
    feeds = {"x": x.astype(np.float16)}
    for name, outs in (("jitops kernels", jo.session(rw, providers=["CPUExecutionProvider"]).run(None, feeds)),
                       ("fallback bodies", ort_session(rw).run(None, feeds))):
        for got, ref in zip(outs, refs):
            assert got.dtype == np.float16 and got.shape == ref.shape, name
            assert max_rel_error(got.astype(np.float32), ref) <= FP16_RTOL, name


def test_regions_only_where_they_save_conversions():
    assert not any("Nhwc" in t for t in _jitops_types(jo.rewrite(chain_model(np.float32))))   # fp32: NCHW kernels
    assert not any("Nhwc" in t for t in _jitops_types(jo.rewrite(chain_model(), layout="nchw")))
    # Two convs between one entry and one exit: two Transposes would replace two conversions.
    two = chain_model()
    del two.graph.node[0:2]
    two.graph.node[0].input[0] = "x"
    rw = jo.rewrite(two)
    assert _jitops_types(rw) == ["Conv2dRelu", "Conv2dAddRelu"] and not _transposes(rw)


def test_nhwc_problems_carry_the_layout_in_their_keys():
    groups = jo.supported_nodes(chain_model(), input_shapes={"x": (4, 8, 6, 6)})
    assert [p.op_type for p in groups] == ["Conv2dNhwcRelu", "Conv2dNhwcRelu", "Conv2dNhwcAddRelu"]
    assert all(p.inputs["x"].layout == "nhwc" and "nhwc" in p.key for p in groups)
    assert groups[2].inputs["residual"].layout == "nhwc"


def test_bad_layout_names_the_argument():
    with pytest.raises(ArgumentError, match="layout"):
        jo.rewrite(chain_model(), layout="nhcw")


def test_residual_add_is_fused_only_without_broadcasting():
    m = chain_model(np.float32)
    rw = jo.rewrite(m)
    assert _jitops_types(rw) == ["Conv2dRelu", "Conv2dRelu", "Conv2dAddRelu"]
    # A per-channel Add broadcasts: not a residual of the conv's shape, so it stays ONNX.
    bias = numpy_helper.from_array(np.ones((8, 1, 1), np.float32), "chan")
    m.graph.initializer.append(bias)
    add = next(n for n in m.graph.node if n.op_type == "Add")
    add.input[1] = "chan"
    assert _jitops_types(jo.rewrite(m)) == ["Conv2dRelu", "Conv2dRelu", "Conv2d"]


def test_torch_graph_runs_the_nhwc_nodes_as_ort_does():
    """examples/onnx_torch.py's TorchGraph (jitops nodes on torch tensors) holds an NHWC node's
    value in storage order (N, H, W, C), so the Transpose out of the region gives NCHW again."""
    import sys
    from pathlib import Path
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from onnx_torch import TorchGraph
    rw = jo.rewrite(chain_model())
    assert "Conv2dNhwcAddRelu" in _jitops_types(rw)
    x = np.random.default_rng(2).standard_normal((2, 8, 6, 6)).astype(np.float16)
    y = TorchGraph(rw, device="cpu")({"x": torch.from_numpy(x)})[0]
    want = jo.session(rw, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert tuple(y.shape) == want.shape == (2, 8, 6, 6)
    assert np.array_equal(y.numpy(), want)
