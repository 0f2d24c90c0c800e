"""Models as users bring them: exported by torch with a symbolic batch, subgraphs, opsets 13-23.

The torch corpus (jitops/onnx/corpus.py, tiny widths, exported in the test) is mapped and rewritten
with no input_shapes: every Conv / norm / attention pattern must be taken, the rewritten model must
match ORT on the original at batch sizes other than the exported one, through the fallback bodies
and through the jitops kernels (CPU emulator). The onnx-helper corpus needs no torch: If/Loop
bodies, unknown ranks, a producer onnx cannot infer, and every opset from 13 to 23 ORT runs.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import importlib  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.onnx import kernels  # noqa: E402
from jitops.onnx.testing import max_rel_error, ort_session, ort_supports_opset, tensor_info  # noqa: E402

# What each corpus model must give with a symbolic batch: jitops node types taken (count each).
EXPECTED = {
    "resnet": {"Conv2dRelu": 2, "Conv2dAddRelu": 1},   # the shortcut Add + Relu in the epilogue
    "mobilenet": {"Conv2d": 3, "Conv2dLeakyRelu": 1, "Conv2dRelu": 1},
    "convnext": {"Conv2d": 2, "LayerNorm": 1},
    # the residual Adds (and a Linear's bias Add) go into the norm after them (skip_patterns.py); the
    # pre-norm ViT's first sum is read by the next residual too (the Sum type's second output)
    # nn.MultiheadAttention's head splits and merge go into the node (q, k, v, out stored [S, B, H, D])
    "vit": {"Conv2d": 1, "LayerNorm": 1, "SkipLayerNormSum": 1, "SkipBiasLayerNorm": 1, "AttentionSbhd": 1},
    # BERT and GPT split heads with view + permute: the head transposes go into the node (q, k, v,
    # out stored [B, S, H, D])
    "bert": {"MaskedAttentionBshd": 1, "SkipBiasLayerNorm": 2},
    # GPT's tril buffer + masked_fill is proved causal (causal_masks): is_causal, no mask read
    "gpt": {"RmsNorm": 1, "AttentionBshd": 1},
    # Llama: SDPA's causal Trilu mask proved causal, repeat_kv taken in (the node reads the 2 kv heads);
    # rotary embeddings between the head transposes and the node keep the plain type
    "llama": {"RmsNorm": 2, "Attention": 1},
    "groupnorm": {"Conv2d": 2, "GroupNorm": 1, "LeakyRelu": 1},
}
# Where torch.export's exporter (torch 2.13, onnxscript 0.7.2, 2026-11-26) writes them otherwise:
# its Llama keeps no traced alias of RMSNorm's float32 cast, so the second norm takes the residual Add
# (SkipRmsNormSum). (Its K^T, a flatten to 3-D + transpose + reshape back, is read through:
# attention_patterns._flat_transpose, which gives ViT its Sbhd type and Llama its repeat_kv take-in.)
EXPECTED_DYNAMO = {
    "llama": {"RmsNorm": 1, "Attention": 1, "SkipRmsNormSum": 1},
}


@pytest.fixture(scope="module")
def corpus():
    pytest.importorskip("torch")
    from jitops.onnx import corpus as c
    return c


_exported: dict = {}


def _export(corpus, name: str, opset: int | str, dtype: str = "float32"):
    """opset: an int (TorchScript exporter) or "dynamo" (torch.export's exporter; needs onnxscript)."""
    key = (name, opset, dtype)
    if key not in _exported:
        if opset == "dynamo":
            pytest.importorskip("onnxscript")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = corpus.export(name, 17 if opset == "dynamo" else opset, dtype=dtype, dynamo=opset == "dynamo")
            _exported[key] = onnx.load_from_string(data)
    return _exported[key]


def _taken(groups) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in groups:
        if p.supported:
            out[p.op_type] = out.get(p.op_type, 0) + 1
    return out


def _unfused_affine(model) -> list[str]:
    """Mul / Add nodes that apply a constant to a jitops norm's output: its affine tail, which the
    rewrite must take into the norm node (decomposed exports write gamma and beta as Mul and Add)."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    norm_outputs = {n.output[0] for n in model.graph.node
                    if n.domain == jo.DOMAIN and n.op_type.removesuffix("Sum").endswith(("LayerNorm", "RmsNorm", "GroupNorm"))}
    return [n.name for n in model.graph.node if n.op_type in ("Mul", "Add") and
            set(n.input) & norm_outputs and set(n.input) & consts]


def _feeds(corpus, name: str, batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    sizes = {"x_0": batch, "mask_0": batch}
    if seq is not None:
        sizes.update(x_1=seq, mask_1=seq)
    return corpus.example_inputs(name, seed=batch, **sizes)


@pytest.mark.parametrize("opset", [14, 17, "dynamo"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exported_model_is_taken_with_symbolic_batch_and_its_rewrite_matches(corpus, name, opset):
    model = _export(corpus, name, opset)
    assert any(d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim)    # symbolic batch
    groups = jo.map_nodes(model)
    expected = EXPECTED_DYNAMO.get(name, EXPECTED[name]) if opset == "dynamo" else EXPECTED[name]
    assert _taken(groups) == expected, [p.describe() for p in groups]
    assert all(p.supported for p in groups), [p.describe() for p in groups if not p.supported]
    assert all(p.problem is None and p.dynamic and "planned at run time" in p.describe() for p in groups)
    rewritten = jo.rewrite(model)
    onnx.checker.check_model(rewritten)
    assert sum(n.domain == jo.DOMAIN for n in rewritten.graph.node) == sum(expected.values())
    assert not _unfused_affine(rewritten), "a norm's constant scale / shift was left outside its jitops node"
    for batch, seq in ((1, None), (3, 5)):
        feeds = _feeds(corpus, name, batch, seq if name in ("bert", "gpt", "llama") else None)
        ref = ort_session(model).run(None, feeds)[0]
        got = ort_session(rewritten).run(None, feeds)[0]      # no jitops library: the fallback bodies
        assert got.shape == ref.shape and max_rel_error(got, ref) < 1e-5


# Every jitops type the corpus takes, on the emulator (MobileNet and ConvNeXt add only conv shapes: their
# rewrite is checked above, their kernels would add emulator compiles to CI).
@pytest.mark.parametrize("name", ["bert", "gpt", "groupnorm", "llama", "vit"])
def test_jitops_kernels_run_the_symbolic_model_at_two_batch_sizes(corpus, name):
    model = _export(corpus, name, 17)
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    before = {kid: k.calls for kid, k in kernels._kernels.items()}
    for batch, seq in ((1, 4), (3, 7)):
        feeds = _feeds(corpus, name, batch, seq if name in ("bert", "gpt", "llama") else None)
        ref = ort_session(model).run(None, feeds)[0]
        got = sess.run(None, feeds)[0]
        assert got.shape == ref.shape and max_rel_error(got, ref) < 2e-5, (name, batch)
    ran = {k.type.name for kid, k in kernels._kernels.items() if k.calls > before.get(kid, 0)}
    assert ran == set(EXPECTED[name]), ran
    # plans made per actual shape: two batch sizes, two plans per kernel
    assert all(len(k.plans) == 2 for kid, k in kernels._kernels.items() if k.type.name in ran and kid not in before)


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_float16_model_against_ort_float32(corpus, name):
    model16 = _export(corpus, name, 17, "float16")
    model32 = _export(corpus, name, 17)
    groups = jo.map_nodes(model16)
    assert _taken(groups) == EXPECTED[name] and all(s.dtype == "float16" for p in groups for s in p.inputs.values()
                                                    if s is not None)
    feeds32 = _feeds(corpus, name, 2, 6 if name == "bert" else None)
    feeds16 = {k: v.astype(np.float16) for k, v in feeds32.items()}
    ref = ort_session(model32).run(None, feeds32)[0]
    got = jo.session(model16, providers=["CPUExecutionProvider"], backend="cpu").run(None, feeds16)[0]
    assert got.dtype == np.float16 and max_rel_error(got, ref) < 2e-2


# ---------------------------------------------------------------- onnx helpers (no torch)

def _conv_bn_model(opset: int = 17, subgraph: str = "if"):
    """Conv -> BN -> Relu, the BN output also read inside an If / Loop body, which has its own Conv."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w2")]
    for n, v in (("g", rng.random(4) + 0.5), ("b", rng.standard_normal(4)), ("m", rng.standard_normal(4) * 0.1),
                 ("v", rng.random(4) + 0.5)):
        init.append(numpy_helper.from_array(v.astype(np.float32), n))
    init.append(numpy_helper.from_array(np.array(True), "cond"))
    body_out = tensor_info("inner", None)
    then_g = helper.make_graph([helper.make_node("Conv", ["bn", "w2"], ["inner"])], "then", [], [body_out])
    else_g = helper.make_graph([helper.make_node("Identity", ["bn"], ["inner"])], "else", [], [body_out])
    if subgraph == "if":
        sub = helper.make_node("If", ["cond"], ["side"], then_branch=then_g, else_branch=else_g)
    else:
        body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                                  helper.make_node("LeakyRelu", ["bn"], ["inner"])],
                                 "body", [tensor_info("i", [], "int64"), helper.make_tensor_value_info("c_in", 9, [])],
                                 [helper.make_tensor_value_info("c_out", 9, []), tensor_info("inner", None)])
        init.append(numpy_helper.from_array(np.array(1, np.int64), "trips"))
        sub = helper.make_node("Loop", ["trips", "cond"], ["side"], body=body)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"]), sub]
    g = helper.make_graph(nodes, "sub", [tensor_info("x", ["N", 3, 6, 6])],
                          [tensor_info("y", ["N", 4, 6, 6]), tensor_info("side", None)], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("subgraph", ["if", "loop"])
def test_values_read_inside_subgraphs_are_kept_and_subgraph_nodes_reported(subgraph):
    model = _conv_bn_model(subgraph=subgraph)
    groups = jo.map_nodes(model)
    [conv] = [p for p in groups if p.supported]
    assert conv.onnx_ops == ("Conv", "BatchNormalization")        # no Relu: 'bn' is read by the subgraph too
    inner = [p for p in groups if not p.supported]
    assert len(inner) == 1 and "subgraph of" in inner[0].reason
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    ref = ort_session(model).run(None, {"x": x})
    got = ort_session(jo.rewrite(model)).run(None, {"x": x})
    assert all(max_rel_error(a, b) < 1e-5 for a, b in zip(got, ref))


def test_unknown_rank_and_uninferable_producers_are_reasons_not_crashes():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="vendor"),        # onnx cannot infer this
             helper.make_node("LeakyRelu", ["m"], ["a"]),
             helper.make_node("Conv", ["a", "w"], ["y"]),
             helper.make_node("LayerNormalization", ["r", "s"], ["z"])]
    g = helper.make_graph(nodes, "odd", [tensor_info("x", ["N", 3, 5, 5]), tensor_info("r", None)],
                          [tensor_info("y", None), tensor_info("z", None)],
                          [numpy_helper.from_array(rng.standard_normal((2, 3, 3, 3)).astype(np.float32), "w"),
                           numpy_helper.from_array(np.ones(5, np.float32), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor", 1)])
    groups = jo.map_nodes(m)
    assert [p.onnx_ops[0] for p in groups] == ["LeakyRelu", "Conv", "LayerNormalization"]
    assert all(not p.supported and "rank" in p.reason for p in groups), [p.reason for p in groups]
    assert jo.rewrite(m).graph.node[1].op_type == "LeakyRelu"


def _opset_model(opset: int):
    """Conv+Relu, LeakyRelu, LayerNorm (the op from 17, written out before), MatMul/Softmax/MatMul, batch 'N'."""
    rng = np.random.default_rng(opset)
    c, t = 4, 9
    init = {"w": rng.standard_normal((c, 3, 3, 3)) * 0.3, "shape": np.array([0, c, t]), "s": rng.random(c) + 0.5,
            "b": rng.standard_normal(c) * 0.1, "two": np.array(2.0), "eps": np.array(1e-5),
            "scale": np.array(0.5)}
    inits = [numpy_helper.from_array(np.asarray(v, np.int64 if k == "shape" else np.float32), k)
             for k, v in init.items()]
    n = helper.make_node
    mean_kw = {"axes": [-1]} if opset < 18 else {}
    axes = [] if opset < 18 else ["axes"]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    if opset >= 17:
        ln = [n("LayerNormalization", ["tok", "s", "b"], ["ln"], axis=-1)]
    else:
        ln = [n("ReduceMean", ["tok", *axes], ["mu"], **mean_kw), n("Sub", ["tok", "mu"], ["d"]),
              n("Pow", ["d", "two"], ["d2"]), n("ReduceMean", ["d2", *axes], ["var"], **mean_kw),
              n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["nd"]),
              n("Mul", ["nd", "s"], ["sc"]), n("Add", ["sc", "b"], ["ln"])]
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("LeakyRelu", ["r"], ["lr"], alpha=0.2), n("Reshape", ["lr", "shape"], ["flat"]),
             n("Transpose", ["flat"], ["tok"], perm=[0, 2, 1]), *ln,
             n("Transpose", ["ln"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["ln", "kt"], ["qk"]),
             n("Mul", ["qk", "scale"], ["sq"]), n("Softmax", ["sq"], ["p"], axis=-1), n("MatMul", ["p", "ln"], ["y"])]
    g = helper.make_graph(nodes, "opsets", [tensor_info("x", ["N", 3, 3, 3])], [tensor_info("y", ["N", t, c])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("opset", list(range(13, 24)))
def test_every_opset_from_13_to_23(opset):
    if not ort_supports_opset(opset):
        pytest.skip(f"this onnxruntime does not run opset {opset}")
    model = _opset_model(opset)
    groups = jo.map_nodes(model)
    assert _taken(groups) == {"Conv2dRelu": 1, "LeakyRelu": 1, "LayerNorm": 1, "Attention": 1}, \
        [p.describe() for p in groups]
    rewritten = jo.rewrite(model)
    onnx.checker.check_model(rewritten)
    x = np.random.default_rng(4).standard_normal((2, 3, 3, 3)).astype(np.float32)
    ref = ort_session(model).run(None, {"x": x})[0]
    assert max_rel_error(ort_session(rewritten).run(None, {"x": x})[0], ref) < 1e-5


def test_staged_cpu_provider_warns_once_with_the_install_hint(monkeypatch):
    from jitops.onnx.testing import small_model
    session_mod = importlib.import_module("jitops.onnx.session")
    monkeypatch.setattr(kernels, "stages_through_host", lambda backend: True)
    monkeypatch.setattr(session_mod, "_warned", [False])
    with pytest.warns(RuntimeWarning, match="onnxruntime-gpu") as record:
        jo.session(small_model(), providers=["CPUExecutionProvider"], backend="cpu")
    assert "copied through host memory" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jo.session(small_model(), providers=["CPUExecutionProvider"], backend="cpu")     # once per process
    monkeypatch.setattr(session_mod, "_warned", [False])
    monkeypatch.setattr(kernels, "stages_through_host", lambda backend: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jo.session(small_model(), providers=["CPUExecutionProvider"], backend="cpu")     # emulator: no copies


@pytest.mark.parametrize("op,op_name,consts", [("LeakyRelu", "leaky_relu", {}),
                                               ("LayerNormalization", "layer_norm", {"s": np.ones(8, np.float32)})])
def test_bfloat16_nodes_are_taken_exactly_when_the_op_accepts_bfloat16(op, op_name, consts):
    from jitops.errors import JitopsError
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    from jitops.onnx.testing import single_op_model
    model = single_op_model(op, {"x": ("N", 8)}, consts, opset=17, dtype="bfloat16", output_shape=("N", 8))
    [p] = jo.map_nodes(model)
    specs = {"x": TensorSpec((4, 8), "bfloat16")}
    if consts:
        specs["gamma"] = TensorSpec((8,), "bfloat16")
    try:
        get_op(op_name).make_problem(specs, {"normalized_shape": (8,)} if consts else {"alpha": 0.01})
        accepted = True
    except JitopsError:
        accepted = False
    assert p.supported == accepted, p.describe()
    if not accepted:
        assert "bfloat16" in p.reason
    else:
        assert p.inputs["x"].dtype == "bfloat16" and all(v.dtype.name == "bfloat16" for v in p.constants.values())


def _export_net(net, shape: tuple, opset: int):
    """A torch module exported with a symbolic batch, as users export conv nets."""
    import io

    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.randn(*shape),), buf, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=opset, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def _emulator_error(model, shape: tuple) -> float:
    """The jitops session's (emulator) error against ORT on the model, at `shape` (another batch)."""
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    ref = ort_session(model).run(None, feeds)[0]
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, feeds)[0]
    return max_rel_error(got, ref)


def test_group_norm_without_affine_is_taken():
    """nn.GroupNorm(affine=False) exports its identity scale and shift as [1, 1, 1] constants: they stand for
    every channel (the pattern refused them as a gamma of one value; found by scripts/fuzz_onnx.py)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.GroupNorm(4, 16, affine=False),
                              torch.nn.LeakyReLU(0.1), torch.nn.Conv2d(16, 8, 3))
    model = _export_net(net, (2, 3, 8, 8), 17)
    assert _taken(jo.map_nodes(model)) == {"Conv2d": 2, "GroupNorm": 1, "LeakyRelu": 1}
    assert _emulator_error(model, (3, 3, 8, 8)) < 2e-5


def test_conv_after_group_norm_at_opset_13_knows_its_rank():
    """torch's GroupNorm reshapes back with Reshape(y, Shape(x)), whose output onnx's inference leaves
    without a shape at opset 13: the Conv after it stayed ONNX ("the rank ... is not known"; found by
    scripts/fuzz_onnx.py). The graph view gives such a Reshape x's shape."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.GroupNorm(4, 8), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())
    model = _export_net(net, (2, 8, 12, 12), 13)
    assert _taken(jo.map_nodes(model)) == {"GroupNorm": 1, "Conv2dRelu": 1}
    assert _emulator_error(model, (3, 8, 12, 12)) < 2e-5
