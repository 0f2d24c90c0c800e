"""nn.MultiheadAttention's attention with its head splits: the *Sbhd types read Q, K, V and write
the output stored [S, B, H, D].

torch's nn.MultiheadAttention (torchvision's ViT) works on [S, B*H, D] values: each of Q, K, V is
Transpose(perm=[1, 0, 2]) to [B*H, S, D] then Reshape to [B, H, S, D], and the P.V product goes
to [S, B, H, D] through Transpose(perm=[2, 0, 1, 3]). The rewrite reads Reshape(X, [0, -1, H, D])
of each [S, B*H, D] value instead and writes that last Transpose's output, so the four transposes
(and the 4-D Reshapes) no longer run. Checked: which graphs are taken and which keep the plain
type, the node counts, problem keys, and the rewritten model's outputs (jitops kernels on the
emulator, and the fallback bodies without the jitops library) against ONNX Runtime on the original,
with a symbolic batch (and sequence).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.onnx import kernels  # noqa: E402
from jitops.onnx.testing import (check_rewrite_at_two_sizes, count_ops, jitops_types, max_rel_error,  # noqa: E402
                                 ort_session, tensor_info)

HEADS, D = 2, 8
C = HEADS * D
TOL = {"float32": 2e-5, "float16": 3e-3}


def mha_attention(dtype: str = "float32", masked: bool = False, target: str = "concat", opset: int = 17,
                  share: str = "", out_perm: tuple = (2, 0, 1, 3), split_perm: tuple = (1, 0, 2),
                  seq: int | None = None):
    """x [S, N, C] -> per-head Q, K, V as nn.MultiheadAttention writes them: MatMul, Reshape to
    [S, N*H, D], Transpose(1, 0, 2), Reshape to [N, H, S, D]; K^T = Transpose(0, 1, 3, 2) of K;
    attention; Transpose(2, 0, 1, 3) -> [S, N, H, D] -> Reshape [S, N, C]. N symbolic; S symbolic
    unless `seq` is given.

    target: the 4-D Reshapes' shape: "concat" (torch's: Concat of Shape-derived N and S with
    constant H and D; one more Shape of the [N*H, S, D] value feeds it, as torch's does),
    "const" (a constant [-1, H, seq, D]; needs `seq`), "input" (as "concat" with H a graph input:
    known at run time only).
    share: a value another node reads as well ("qt": Q's [N*H, S, D] transpose, "k4": K's [N, H, S, D]
    reshape, "v4", "pv", "out": the merged output, "shape": a Shape of Q's transpose that is a graph
    output)."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    inits = [numpy_helper.from_array((rng.standard_normal((C, C)) * 0.3).astype(dtype), w) for w in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
              (("split3", [0, -1, D]), ("out_shape", [0, 0, C]), ("h", [HEADS]), ("d", [D]), ("one", [1]))]
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(D), dtype), "scale"))
    nodes = []
    for v in "qkv":
        nodes += [n("MatMul", ["x", f"w{v}"], [f"x{v}"]), n("Reshape", [f"x{v}", "split3"], [f"{v}3"]),
                  n("Transpose", [f"{v}3"], [f"{v}t"], perm=list(split_perm), name=f"{v}_split")]
    inputs = [tensor_info("x", [seq or "S", "N", C], dtype)]
    if target in ("concat", "input"):   # [N, H, S, D]: N = Shape(x)[1], S = Shape(k's [N*H, S, D])[1]
        nodes += [n("Shape", ["x"], ["x_shape"]), n("Gather", ["x_shape", "one"], ["n"], axis=0),
                  n("Shape", ["kt"], ["kt_shape"]), n("Gather", ["kt_shape", "one"], ["s"], axis=0),
                  n("Concat", ["n", "h" if target == "concat" else "h_in", "s", "d"], ["nhsd"], axis=0)]
        if target == "input":
            inputs.append(tensor_info("h_in", [1], "int64"))
    else:
        inits.append(numpy_helper.from_array(np.array([-1, HEADS, seq, D], np.int64), "nhsd"))
    for v in "qkv":
        nodes.append(n("Reshape", [f"{v}t", "nhsd"], [f"{v}4"]))
    nodes += [n("Transpose", ["k4"], ["kT"], perm=[0, 1, 3, 2], name="k_t"),
              n("MatMul", ["q4", "kT"], ["scores"]), n("Mul", ["scores", "scale"], ["scaled"])]
    last = "scaled"
    if masked:
        nodes.append(n("Add", ["scaled", "mask"], ["masked"]))
        inputs.append(tensor_info("mask", ["N", 1, 1, seq or "S"], dtype))
        last = "masked"
    nodes += [n("Softmax", [last], ["probs"], axis=-1), n("MatMul", ["probs", "v4"], ["pv"]),
              n("Transpose", ["pv"], ["merged"], perm=list(out_perm), name="out_merge"),
              n("Reshape", ["merged", "out_shape"], ["y"])]
    outputs = [tensor_info("y", [seq or "S", "N", C], dtype)]
    if share == "shape":
        nodes.append(n("Shape", ["qt"], ["side"]))
        outputs.append(tensor_info("side", [3], "int64"))
    elif share:
        nodes.append(n("Neg", [share if share != "out" else "merged"], ["side"]))
        outputs.append(tensor_info("side", None, dtype))
    g = helper.make_graph(nodes, "mha_attention", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def feeds(batch: int, seq: int, dtype: str = "float32", masked: bool = False, seed: int = 0,
          target: str = "concat") -> dict:
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal((seq, batch, C)).astype(dtype)}
    if masked:
        m = np.zeros((batch, 1, 1, seq), dtype)
        m[..., -max(1, seq // 3):] = -10000.0
        out["mask"] = m
    if target == "input":
        out["h_in"] = np.array([HEADS], np.int64)
    return out


def _attention64(x, w, mask, scale):
    """float64 nn.MultiheadAttention core from x [S, N, C] and the in-projections: [S, N, C]."""
    s, b, _ = x.shape
    q, k, v = ((x @ w[n]).reshape(s, b, HEADS, D).transpose(1, 2, 0, 3) for n in ("wq", "wk", "wv"))
    z = q @ k.transpose(0, 1, 3, 2) * scale + mask
    p = np.exp(z - z.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).transpose(2, 0, 1, 3).reshape(s, b, C)


@pytest.mark.parametrize("target,seq", [("concat", None), ("concat", 6), ("const", 6)])
@pytest.mark.parametrize("masked", [False, True])
def test_head_splits_and_merge_are_taken_into_the_node(masked, target, seq):
    model = mha_attention(masked=masked, target=target, seq=seq)
    [p] = jo.map_nodes(model)
    want = "MaskedAttentionSbhd" if masked else "AttentionSbhd"
    assert p.supported and p.op_type == want, p.describe()
    # three split transposes, K^T's, the merge; the three 4-D Reshapes
    assert p.onnx_ops.count("Transpose") == 5 and p.onnx_ops.count("Reshape") == 3
    assert p.node_output == "merged"
    assert all(p.inputs[n].layout == "sbhd" and p.inputs[n].shape == (-1, HEADS, seq or -1, D) for n in "qkv")
    rw = jo.rewrite(model)
    onnx.checker.check_model(rw)
    assert jitops_types(rw) == [want] and count_ops(rw, "Transpose") == 0
    # the node reads each [S, N*H, D] value as it is (num_heads says how its middle axis splits)
    assert list(p.node_inputs[:3]) == ["q3", "k3", "v3"] and p.node_attrs["num_heads"] == HEADS
    [node] = [n for n in rw.graph.node if n.domain == jo.DOMAIN]
    assert {a.name: a.i for a in node.attribute if a.name == "num_heads"} == {"num_heads": HEADS}
    assert count_ops(rw, "Reshape") == count_ops(model, "Reshape") - 3     # the 4-D splits went, none inserted
    # node count: the group and the 4-D target's computation (Shape, Gathers, Concat) go, nothing comes
    target_nodes = {"concat": 5, "const": 0}[target]
    assert len(rw.graph.node) == len(model.graph.node) - len(p.covered) + 1 - target_nodes


def test_static_problem_keys_say_sbhd_and_match_what_the_ort_kernel_plans():
    """map_nodes' problem (tuning records, bundles) is the one the ORT kernel builds from the
    [S, B, H, D] tensors it gets."""
    model = mha_attention(masked=True)
    [p] = jo.supported_nodes(model, input_shapes={"x": (6, 2, C), "mask": (2, 1, 1, 6)})
    assert p.problem is not None and "sbhd" in p.key, p.key
    assert p.inputs["q"].shape == (2, HEADS, 6, D) and p.inputs["q"].storage_shape == (6, 2, HEADS, D)
    before = set(kernels._kernels)
    f = feeds(2, 6, masked=True)
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")    # its kernels live with it
    got = sess.run(None, f)[0]
    assert max_rel_error(got, ort_session(model).run(None, f)[0]) < TOL["float32"]
    from jitops.ops import get_op
    [k] = [k for kid, k in kernels._kernels.items() if kid not in before and k.type.name == "MaskedAttentionSbhd"]
    [(plan_key, (attrs, _))] = k.plans.items()
    specs = k.specs({n: s for n, s, _ in plan_key}, {n: dt for n, _, dt in plan_key if dt})
    assert specs["q"].layout == "sbhd" and specs["q"].shape == (2, HEADS, 6, D)
    assert get_op("attention").make_problem(specs, attrs).key() == p.key


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("masked", [False, True])
def test_rewritten_model_matches_ort_at_two_sizes(dtype, masked):
    check_rewrite_at_two_sizes(mha_attention(dtype, masked=masked), "MaskedAttentionSbhd" if masked else "AttentionSbhd",
                               lambda batch, seq: feeds(batch, seq, dtype, masked, seed=batch),
                               lambda batch, seq: (seq, batch, C), TOL[dtype])


def test_float16_against_a_float64_reference():
    model = mha_attention("float16", masked=True)
    f = feeds(2, 9, "float16", masked=True)
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    ref = _attention64(f["x"].astype(np.float64), w, f["mask"].astype(np.float64), 1 / np.sqrt(D))
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, f)[0]
    assert jitops_types(jo.rewrite(model)) == ["MaskedAttentionSbhd"]
    assert got.dtype == np.float16 and max_rel_error(got, ref) < 5e-3


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("opset,target,seq", [(13, "const", 5), (14, "concat", None)])
def test_fallback_body_before_castlike(opset, target, seq, dtype):
    """Opsets 13-14 (no CastLike): a body ORT runs, float16 included (the scale and -inf go to Q's type by
    Cast(to=x_type), the node's attribute). (At opset 13 onnx infers no rank for a Reshape to a computed
    target, so the pattern is not seen there at all, plain type included.)"""
    model = mha_attention(dtype, opset=opset, masked=True, target=target, seq=seq)
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["MaskedAttentionSbhd"] and count_ops(rw, "Transpose") == 0
    node = next(n for n in rw.graph.node if n.domain == "jitops")
    assert {a.name: a.i for a in node.attribute}["x_type"] == (1 if dtype == "float32" else 10)
    f = feeds(2, 5, dtype, masked=True)
    got, ref = ort_session(rw).run(None, f)[0], ort_session(model).run(None, f)[0]
    assert got.dtype == ref.dtype and max_rel_error(got, ref) < (1e-6 if dtype == "float32" else TOL[dtype])


@pytest.mark.parametrize("case", [{"share": "qt"}, {"share": "k4"}, {"share": "v4"}, {"share": "pv"},
                                  {"share": "shape"}, {"out_perm": (2, 1, 0, 3)}, {"out_perm": (0, 2, 1, 3)},
                                  {"split_perm": (0, 1, 2)}, {"target": "input"}])
def test_a_missing_piece_keeps_the_plain_type(case):
    """All or nothing: a split's value read outside the pattern (a Shape whose result outlives the
    rewrite included), another merge permutation, another split permutation or a head count known
    only at run time: today's [B, H, S, D] node, every Transpose but K^T's left in the graph, and
    the rewritten model computes what the original does."""
    model = mha_attention(**case)
    [p] = [p for p in jo.map_nodes(model) if p.op == "attention"]
    assert p.supported and p.op_type == "Attention", p.describe()
    assert p.onnx_ops.count("Transpose") == 1 and "Reshape" not in p.onnx_ops
    assert all(p.inputs[n].layout == "" for n in "qkv")
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["Attention"]
    assert {"q_split", "k_split", "v_split", "out_merge"} <= {n.name for n in rw.graph.node}
    f = feeds(2, 4, target=case.get("target", "concat"))   # S = N * H: the split_perm case's graph runs too
    for got, ref in zip(ort_session(rw).run(None, f), ort_session(model).run(None, f)):
        assert max_rel_error(got, ref) < 1e-6


def test_the_merged_output_may_have_other_readers():
    model = mha_attention(share="out")
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["AttentionSbhd"] and count_ops(rw, "Transpose") == 0
    f = feeds(2, 5)
    for got, ref in zip(ort_session(rw).run(None, f), ort_session(model).run(None, f)):
        assert max_rel_error(got, ref) < 1e-6


def test_an_attention_op_without_the_layout_keeps_the_plain_type(monkeypatch):
    """A jitops whose attention op reads no [S, B, H, D] (its LAYOUTS lack "sbhd") takes today's node."""
    from jitops.ops import get_op
    monkeypatch.setattr(get_op("attention"), "LAYOUTS", ("bshd",), raising=False)
    [p] = jo.map_nodes(mha_attention())
    assert p.supported and p.op_type == "Attention" and p.onnx_ops.count("Transpose") == 1


# ---------------------------------------------------------------- the torch corpus ViT

@pytest.fixture(scope="module")
def corpus():
    pytest.importorskip("torch")
    from jitops.onnx import corpus as c
    return c


_exported: dict = {}


def _export(corpus, opset: int | str, dtype: str = "float32"):
    """opset: an int (TorchScript exporter) or "dynamo" (torch.export's exporter; needs onnxscript)."""
    if opset == "dynamo":
        pytest.importorskip("onnxscript")
    key = (opset, dtype)
    if key not in _exported:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _exported[key] = corpus.export("vit", 17 if opset == "dynamo" else opset, dtype=dtype,
                                           dynamo=opset == "dynamo")
    return onnx.load_from_string(_exported[key])


@pytest.mark.parametrize("opset", [14, 17, "dynamo"])
def test_corpus_vit_is_rewritten_to_sbhd(corpus, opset, monkeypatch):
    model = _export(corpus, opset)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param     # symbolic batch
    [p] = [p for p in jo.map_nodes(model) if p.op == "attention"]
    assert p.op_type == "AttentionSbhd" and p.dynamic, p.describe()
    # torch.export's exporter writes K^T as a flatten to 3-D, a transpose and a reshape back: two
    # more Reshapes in the pattern (attention_patterns._flat_transpose)
    assert p.onnx_ops.count("Transpose") == 5 and p.onnx_ops.count("Reshape") == 3 + 2 * (opset == "dynamo")
    assert all(p.inputs[n].layout == "sbhd" and p.inputs[n].shape[1:] == (HEADS, 17, D) for n in "qkv")
    rw = jo.rewrite(model)
    onnx.checker.check_model(rw)
    assert count_ops(rw, "Transpose") == count_ops(model, "Transpose") - 5
    # against the plain type's rewrite: 4 more Transposes and 3 Reshapes gone, 3 Reshapes come,
    # and the exporter's Shape/Gather/Concat computations of the 4-D targets die with them
    from jitops.ops import get_op
    monkeypatch.setattr(get_op("attention"), "LAYOUTS", ("bshd",), raising=False)
    plain = jo.rewrite(model)
    assert "AttentionSbhd" not in jitops_types(plain) and "Attention" in jitops_types(plain)
    assert count_ops(plain, "Transpose") == count_ops(rw, "Transpose") + 4
    # the node reads the [S, B*H, D] values (num_heads): no Reshape is inserted for them
    assert p.node_attrs["num_heads"] == HEADS and count_ops(rw, "Reshape") == count_ops(plain, "Reshape") - 3
    # and at least the three Concats of the 4-D targets (under torch.export's exporter those stay:
    # 34 nodes against the plain rewrite's 41 with torch 2.13 / onnxscript 0.7.2)
    assert len(rw.graph.node) <= len(plain.graph.node) - 4 - 3 - 3 * (opset != "dynamo")


@pytest.mark.parametrize("opset,dtype", [(14, "float32"), (17, "float32"), (17, "float16"), ("dynamo", "float32")])
def test_corpus_vit_kernels_and_fallback_match_ort(corpus, opset, dtype):
    model = _export(corpus, opset, dtype)
    rw = jo.rewrite(model)
    assert "AttentionSbhd" in jitops_types(rw)
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    before = {kid: k.calls for kid, k in kernels._kernels.items()}
    tol = 1e-2 if dtype == "float16" else 1e-4
    for batch in (1, 3):
        f = {k: v.astype(dtype) for k, v in corpus.example_inputs("vit", seed=batch, x_0=batch).items()}
        ref = ort_session(model).run(None, f)[0]
        got = sess.run(None, f)[0]
        assert got.shape == ref.shape and max_rel_error(got, ref) < tol, (batch, max_rel_error(got, ref))
        assert max_rel_error(ort_session(rw).run(None, f)[0], ref) < tol, batch
    assert "AttentionSbhd" in {k.type.name for kid, k in kernels._kernels.items() if k.calls > before.get(kid, 0)}


def test_key_padding_mask_whose_shape_reads_a_head_split_keeps_the_split():
    """torch's nn.MultiheadAttention(batch_first=True) with a key_padding_mask computes the mask's reshape
    target from Shape(K's head split): the *Sbhd type, which takes that split into the node, left the Shape
    reading a value no node wrote any more (onnx.checker: not topologically sorted; found by
    scripts/fuzz_onnx.py). Now the candidate is refused for that reader and the plain masked type runs."""
    torch = pytest.importorskip("torch")
    import io

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(C, HEADS, batch_first=True)

        def forward(self, x, mask):
            return self.mha(x, x, x, key_padding_mask=mask < 0.5, need_weights=False)[0]

    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (torch.randn(2, 6, C), torch.ones(2, 6)), buf, input_names=["x", "mask"],
                          output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"},
                                                            "y": {0: "b", 1: "s"}}, opset_version=17, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    rewritten = jo.rewrite(model)
    onnx.checker.check_model(rewritten)
    assert jitops_types(rewritten) == ["MaskedAttention"]
    rng = np.random.default_rng(2)
    mask = np.ones((3, 6), np.float32)
    mask[2, 4:] = 0
    feeds = {"x": rng.standard_normal((3, 6, C)).astype(np.float32), "mask": mask}
    ref = ort_session(model).run(None, feeds)[0]
    assert max_rel_error(ort_session(rewritten).run(None, feeds)[0], ref) < TOL["float32"]
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, feeds)[0]
    assert max_rel_error(got, ref) < TOL["float32"]
