"""The residual Add (and the Linear's bias Add) in front of a LayerNorm / RmsNorm taken into one jitops
node (skip_patterns.py): rewritten transformer-block fragments in ONNX Runtime (CPU EP) with the jitops
kernels (emulator) and with the fallback bodies, against ORT's own run of the original model; every
output compared (the sum the next residual branch reads included)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.onnx.testing import max_rel_error, ort_session, ort_supports_opset, run_native, tensor_info  # noqa: E402

RTOL = {"float32": 3e-5, "float16": 4e-3}
B, S, D = 2, 5, 48


def _init(name, value):
    return numpy_helper.from_array(np.ascontiguousarray(value), name)


def _ln_nodes(x, y, opset, prefix="ln"):
    """LayerNormalization (opset >= 17) or torch's pre-17 decomposition of it."""
    if opset >= 17:
        return [helper.make_node("LayerNormalization", [x, "gamma", "beta"], [y], axis=-1, epsilon=1e-5)]
    p = prefix
    return [helper.make_node("ReduceMean", [x], [f"{p}_m"], axes=[-1]),
            helper.make_node("Sub", [x, f"{p}_m"], [f"{p}_d"]),
            helper.make_node("Pow", [f"{p}_d", "two"], [f"{p}_sq"]),
            helper.make_node("ReduceMean", [f"{p}_sq"], [f"{p}_v"], axes=[-1]),
            helper.make_node("Add", [f"{p}_v", "eps"], [f"{p}_ve"]),
            helper.make_node("Sqrt", [f"{p}_ve"], [f"{p}_s"]),
            helper.make_node("Div", [f"{p}_d", f"{p}_s"], [f"{p}_n"]),
            helper.make_node("Mul", [f"{p}_n", "gamma"], [f"{p}_g"]),
            helper.make_node("Add", [f"{p}_g", "beta"], [y])]


def block_model(rng, dtype="float32", opset=17, bias=True, sum_read=True, reader_first=False):
    """h = x W [+ b]; s = h + x; y = LN(s); out = y W2 + s (the next residual reads s) when sum_read."""
    w = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(dtype)
    inits = [_init("w", w), _init("gamma", (1 + 0.3 * rng.standard_normal(D)).astype(dtype)),
             _init("beta", (0.2 * rng.standard_normal(D)).astype(dtype)),
             _init("b", (0.5 * rng.standard_normal(D)).astype(dtype)),
             _init("w2", (rng.standard_normal((D, D)) / np.sqrt(D)).astype(dtype)),
             _init("two", np.array(2.0, dtype)), _init("eps", np.array(1e-5, dtype))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["h"]))
    nodes.append(helper.make_node("Add", ["h" if bias else "mm", "x"], ["s"]))
    outputs = [tensor_info("y", (B, S, D), dtype)]
    readers = []
    if sum_read:
        readers = [helper.make_node("MatMul", ["y", "w2"], ["f"]), helper.make_node("Add", ["f", "s"], ["out"])]
        outputs.append(tensor_info("out", (B, S, D), dtype))
    if reader_first:        # a reader of s before the norm in the node order
        readers = [helper.make_node("Mul", ["s", "two"], ["s2"])]
        outputs.append(tensor_info("s2", (B, S, D), dtype))
        nodes += readers + _ln_nodes("s", "y", opset)
    else:
        nodes += _ln_nodes("s", "y", opset) + readers
    g = helper.make_graph(nodes, "block", [tensor_info("x", (B, S, D), dtype)], outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(model, feeds, dtype, expect_types):
    refs = run_native(model, feeds)
    rw = jo.rewrite(model)
    onnx.checker.check_model(rw)
    types = [n.op_type for n in rw.graph.node if n.domain == "jitops"]
    assert types == expect_types
    for name, outs in (("jitops kernels", jo.session(rw, providers=["CPUExecutionProvider"]).run(None, feeds)),
                       ("fallback bodies", ort_session(rw).run(None, feeds))):
        assert len(outs) == len(refs)
        for got, ref in zip(outs, refs):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            err = max_rel_error(got, ref)
            assert err <= RTOL[dtype], f"{name}: {err:.2e}"
    return rw


@pytest.mark.parametrize("opset,dtype", [(17, "float32"), (17, "float16"), (13, "float32"), (13, "float16"),
                                         (14, "float16")])
def test_bias_residual_layer_norm_with_sum(rng, opset, dtype):
    model = block_model(rng, dtype, opset)
    feeds = {"x": (rng.standard_normal((B, S, D)) * 2 + 0.5).astype(dtype)}
    rw = _check(model, feeds, dtype, ["SkipBiasLayerNormSum"])
    node = next(n for n in rw.graph.node if n.domain == "jitops")
    assert list(node.output) == ["y", "s"] and list(node.input)[:2] == ["mm", "x"]
    assert not any(n.op_type in ("Add", "LayerNormalization", "ReduceMean") and "s" in n.output
                   for n in rw.graph.node)


def test_residual_only(rng):
    """No bias Add, no other reader of the sum: one output."""
    model = block_model(rng, bias=False, sum_read=False)
    _check(model, {"x": rng.standard_normal((B, S, D)).astype(np.float32)}, "float32", ["SkipLayerNorm"])


def test_reader_before_the_norm_keeps_the_add(rng):
    """The sum is read before the norm's position: the fused node could not write it in time, so
    the Adds stay ONNX and the norm alone is taken."""
    model = block_model(rng, sum_read=False, reader_first=True)
    rw = _check(model, {"x": rng.standard_normal((B, S, D)).astype(np.float32)}, "float32", ["LayerNorm"])
    assert sum(n.op_type == "Add" for n in rw.graph.node) == 2


def test_map_nodes_names_the_fused_nodes(rng):
    p = [q for q in jo.map_nodes(block_model(rng)) if q.supported]
    assert [q.op_type for q in p] == ["SkipBiasLayerNormSum"]
    assert p[0].onnx_ops == ("Add", "Add", "LayerNormalization")
    assert set(p[0].inputs) == {"x", "residual", "gamma", "beta", "bias"} and p[0].attrs["return_sum"] is True
    assert jo.map_nodes(block_model(rng), fuse=False)[0].op_type == "LayerNorm"


@pytest.mark.skipif(not ort_supports_opset(23), reason="this onnxruntime has no opset 23 (RMSNormalization)")
def test_residual_rms_norm_opset23(rng):
    inits = [_init("gamma", (1 + 0.3 * rng.standard_normal(D)).astype(np.float32))]
    nodes = [helper.make_node("Add", ["a", "r"], ["s"]),
             helper.make_node("RMSNormalization", ["s", "gamma"], ["y"], epsilon=1e-5),
             helper.make_node("Mul", ["s", "y"], ["out"])]
    g = helper.make_graph(nodes, "rms", [tensor_info("a", (B, S, D)), tensor_info("r", (B, S, D))],
                          [tensor_info("out", (B, S, D))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    feeds = {n: rng.standard_normal((B, S, D)).astype(np.float32) for n in ("a", "r")}
    _check(model, feeds, "float32", ["SkipRmsNormSum"])


def test_jitops_outputs_keep_their_shapes_for_ort(rng):
    """The rewrite declares the jitops nodes' outputs (value_info as onnx inferred them on the source):
    ORT cannot infer through a custom op, and its fusions after one need the shapes."""
    rw = jo.rewrite(block_model(rng))
    declared = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in rw.graph.value_info}
    assert declared.get("s") == [B, S, D]


def test_ort_still_fuses_bias_gelu_after_a_jitops_node(tmp_path):
    """ORT's own optimizer on the rewritten tiny BERT block (CPU EP): the MLP's Add(bias) + Gelu after
    the jitops norm still becomes BiasGelu (it did not before the outputs were declared)."""
    pytest.importorskip("torch")
    import warnings
    from jitops.onnx import corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = onnx.load_from_string(corpus.export("bert", 17))
    rw = jo.rewrite(model)
    assert "SkipBiasLayerNorm" in {n.op_type for n in rw.graph.node}
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    jo.session(rw, providers=["CPUExecutionProvider"], rewrite=False, options=opts, backend="cpu")
    fused = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert "BiasGelu" in fused, sorted(fused)


def test_residual_decomposed_rms_norm(rng):
    """Llama's "h = x + attn; rms_norm(h)" as exporters write RMSNorm out, h read again after the norm."""
    inits = [_init("gamma", (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)),
             _init("two", np.array(2.0, np.float32)), _init("eps", np.array(1e-6, np.float32))]
    nodes = [helper.make_node("Add", ["a", "r"], ["s"]),
             helper.make_node("Pow", ["s", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rt"]),
             helper.make_node("Reciprocal", ["rt"], ["inv"]),
             helper.make_node("Mul", ["s", "inv"], ["n"]),
             helper.make_node("Mul", ["n", "gamma"], ["y"]),
             helper.make_node("Add", ["s", "y"], ["out"])]
    g = helper.make_graph(nodes, "rms", [tensor_info("a", (B, S, D)), tensor_info("r", (B, S, D))],
                          [tensor_info("out", (B, S, D))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {n: rng.standard_normal((B, S, D)).astype(np.float32) for n in ("a", "r")}
    _check(model, feeds, "float32", ["SkipRmsNormSum"])


def test_half_norm_below_opset_15_casts_back_by_its_x_type(rng):
    """fp16 at opset 13 (no CastLike): the node carries x_type (float16's 10) and its fallback body returns to
    X's type by Cast(to=x_type); at opset 17 neither exists (CastLike)."""
    rw = jo.rewrite(block_model(rng, "float16", 13))
    node = next(n for n in rw.graph.node if n.domain == "jitops")
    assert {a.name: a.i for a in node.attribute}.get("x_type") == 10
    body = next(f for f in rw.functions if f.name == node.op_type)
    assert "x_type" in list(body.attribute)
    casts = [n for n in body.node if n.op_type == "Cast" and any(a.ref_attr_name == "x_type" for a in n.attribute)]
    assert len(casts) == 1 and not [n for n in body.node if n.op_type == "CastLike"]
    rw17 = jo.rewrite(block_model(rng, "float16", 17))
    node17 = next(n for n in rw17.graph.node if n.domain == "jitops")
    assert "x_type" not in {a.name for a in node17.attribute}
