"""Attention with its head transposes: the *Bshd types read Q, K, V and write the output [B, S, H, D].

Exporters split heads with Reshape + Transpose(0, 2, 1, 3) around MatMul/Softmax/MatMul and merge
them back with Transpose(0, 2, 1, 3) + Reshape. The rewrite takes those four Transposes into the
attention node (all of them or none), so they no longer run as ORT nodes, and the four Reshapes
as well where each splits (merges) E = H x D alone and is read by the pattern alone (num_heads).
Checked here: which graphs are taken and which are not, the node count, problem keys, and the
outputs of the rewritten model (jitops kernels on the emulator, and the fallback bodies without the
jitops library) against ONNX Runtime on the original model, with a symbolic batch and sequence.
"""
from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import jitops.onnx as jo  # noqa: E402
from jitops.errors import JitopsError  # noqa: E402
from jitops.onnx import kernels  # noqa: E402
from jitops.onnx.testing import (check_rewrite_at_two_sizes, count_ops, jitops_types, max_rel_error,  # noqa: E402
                                 ort_session, ort_tensors, tensor_info)

HEADS, D = 2, 8
C = HEADS * D
TOL = {"float32": 2e-5, "float16": 3e-3}


def bert_attention(dtype: str = "float32", masked: bool = True, key: str = "0231", opset: int = 17,
                   share: str = "", kv_heads: int = HEADS, split: str = "heads"):
    """x [N, S, C] -> per-head Q, K, V by Linear + Reshape + Transpose -> attention -> Transpose +
    Reshape -> [N, S, C], N and S symbolic. key: K^T as Transpose(0, 2, 3, 1) of [N, S, H, D]
    ("0231", torch's k.permute(0, 2, 3, 1) or view + transpose folded), or as Transpose(0, 2, 1, 3)
    then Transpose(0, 1, 3, 2) ("two"). share: a value a Neg node reads as well ("q", "k", "v": the
    head transposes' outputs (K^T for "0231"), "pv": the P.V product, "out": the head-merged
    output, "q4", "k4", "v4": a head split Reshape's output). kv_heads < HEADS: grouped-query
    attention. split: the head split Reshapes' target, "heads" [0, 0, H, D], "infer" [0, 0, -1, D]
    (H from a graph input "heads": unknown to the rewrite), "seq" [0, -1, H, D / 2] (S doubled: not
    a split of E alone)."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    kv = kv_heads * D
    inits = {"wq": rng.standard_normal((C, C)) * 0.3, "wk": rng.standard_normal((C, kv)) * 0.3,
             "wv": rng.standard_normal((C, kv)) * 0.3, "scale": np.array(np.sqrt(D))}
    init = [numpy_helper.from_array(np.asarray(v, dtype), k) for k, v in inits.items()]
    init += [numpy_helper.from_array(np.array(s, np.int64), k) for k, s in
             (("q_shape", {"heads": [0, 0, HEADS, D], "seq": [0, -1, HEADS, D // 2]}.get(split, [])),
              ("kv_shape", {"heads": [0, 0, kv_heads, D], "seq": [0, -1, kv_heads, D // 2]}.get(split, [])),
              ("out_shape", [0, -1, C] if split == "seq" else [0, 0, C]), ("lead", [0, 0]), ("d", [D]))]
    nodes = [n("MatMul", ["x", "wq"], ["xq"]), n("MatMul", ["x", "wk"], ["xk"]), n("MatMul", ["x", "wv"], ["xv"]),
             *([n("Concat", ["lead", "heads", "d"], ["q_shape"], axis=0), n("Identity", ["q_shape"], ["kv_shape"])]
               if split == "infer" else []),
             n("Reshape", ["xq", "q_shape"], ["q4"]), n("Reshape", ["xk", "kv_shape"], ["k4"]),
             n("Reshape", ["xv", "kv_shape"], ["v4"]),
             n("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3], name="q_heads"),
             n("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3], name="v_heads")]
    if key == "0231":
        nodes.append(n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="k_heads"))
    else:
        nodes += [n("Transpose", ["k4"], ["k"], perm=[0, 2, 1, 3], name="k_heads"),
                  n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="k_t")]
    nodes += [n("MatMul", ["q", "kt"], ["scores"]), n("Div", ["scores", "scale"], ["scaled"])]
    inputs = [tensor_info("x", ["N", "S", C], dtype)]
    if split == "infer":
        init = [t for t in init if t.name not in ("q_shape", "kv_shape")]
        inputs.append(tensor_info("heads", [1], "int64"))
    last = "scaled"
    if masked:
        nodes.append(n("Add", ["scaled", "mask"], ["masked"]))
        inputs.append(tensor_info("mask", ["N", 1, 1, "S"], dtype))
        last = "masked"
    nodes += [n("Softmax", [last], ["probs"], axis=-1), n("MatMul", ["probs", "v"], ["pv"]),
              n("Transpose", ["pv"], ["merged"], perm=[0, 2, 1, 3], name="out_heads"),
              n("Reshape", ["merged", "out_shape"], ["y"])]
    outputs = [tensor_info("y", ["N", "S", C], dtype)]
    if share:
        value = {"q": "q", "v": "v", "k": "kt" if key == "0231" else "k", "out": "merged", "pv": "pv"}.get(share, share)
        nodes.append(n("Neg", [value], ["side"]))
        outputs.append(tensor_info("side", None, dtype))
    g = helper.make_graph(nodes, "bert_attention", inputs, outputs, init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def feeds(batch: int, seq: int, dtype: str = "float32", masked: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {"x": rng.standard_normal((batch, seq, C)).astype(dtype)}
    if masked:     # BERT's padding mask: the last keys hidden
        m = np.zeros((batch, 1, 1, seq), dtype)
        m[..., -max(1, seq // 4):] = -10000.0
        out["mask"] = m
    return out


def _attention64(q, k, v, mask, scale):
    """float64 attention on [B, S, H, D] arrays (as the *Bshd types store them), same layout out."""
    q, k, v = (np.asarray(a, np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) * scale + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("key", ["0231", "two"])
@pytest.mark.parametrize("masked", [True, False])
def test_head_transposes_are_taken_into_the_node(masked, key):
    model = bert_attention(masked=masked, key=key)
    [p] = jo.map_nodes(model)
    want = "MaskedAttentionBshd" if masked else "AttentionBshd"
    assert p.supported and p.op_type == want, p.describe()
    transposes = 5 if key == "two" else 4
    assert p.onnx_ops.count("Transpose") == transposes and p.onnx_ops.count("Reshape") == 4
    # the head split Reshapes' inputs [B, S, H*D] in, the merge Reshape's output [B, S, H*D] out
    assert p.node_inputs[:3] == ("xq", "xk", "xv") and p.node_output == "y" and p.node_attrs["num_heads"] == HEADS
    # the op sees [B, H, S, D] stored as [B, S, H, D]; sizes symbolic: planned per call
    assert all(p.inputs[n].layout == "bshd" and p.inputs[n].shape == (-1, HEADS, -1, D) for n in "qkv")
    assert p.problem is None and p.dynamic
    rw = jo.rewrite(model)
    onnx.checker.check_model(rw)
    assert jitops_types(rw) == [want] and count_ops(rw, "Transpose") == 0 and count_ops(rw, "Reshape") == 0
    assert len(rw.graph.node) == len(model.graph.node) - len(p.covered) + 1


def test_static_problem_keys_say_bshd_and_match_what_the_ort_kernel_plans():
    """Tuning records and bundles are keyed by the problem map_nodes builds; the ORT kernel must
    build the same one from the [B, S, H, D] tensors it gets, or tuned schedules are not applied."""
    model = bert_attention()
    [p] = jo.supported_nodes(model, input_shapes={"x": (2, 6, C), "mask": (2, 1, 1, 6)})
    assert p.problem is not None and "bshd" in p.key and p.node_attrs["num_heads"] == HEADS, p.key
    # the same attention with its head Reshapes left in the graph (num_heads 0, 4-D tensors): one key
    [p4] = jo.supported_nodes(bert_attention(share="q4"), input_shapes={"x": (2, 6, C), "mask": (2, 1, 1, 6)})
    assert p4.op_type == p.op_type and "num_heads" not in p4.node_attrs and p4.key == p.key
    assert p.inputs["q"].shape == (2, HEADS, 6, D) and p.inputs["q"].storage_shape == (2, 6, HEADS, D)
    before = set(kernels._kernels)
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    f = feeds(2, 6)
    got = sess.run(None, f)[0]
    assert max_rel_error(got, ort_session(model).run(None, f)[0]) < TOL["float32"]
    from jitops.ops import get_op
    [k] = [k for kid, k in kernels._kernels.items() if kid not in before and k.type.name == "MaskedAttentionBshd"]
    [(plan_key, (attrs, _))] = k.plans.items()
    specs = k.specs({n: s for n, s, _ in plan_key}, {n: dt for n, _, dt in plan_key if dt})
    assert get_op("attention").make_problem(specs, attrs).key() == p.key


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("key", ["0231", "two"])
def test_rewritten_model_matches_ort_at_two_batch_sizes(dtype, key):
    check_rewrite_at_two_sizes(bert_attention(dtype, key=key), "MaskedAttentionBshd",
                               lambda batch, seq: feeds(batch, seq, dtype, seed=batch),
                               lambda batch, seq: (batch, seq, C), TOL[dtype])


def test_float16_against_a_float64_reference():
    """The fp16 rewrite against attention computed in float64 from the same fp16 weights and input."""
    model = bert_attention("float16")
    f = feeds(2, 9, "float16")
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = f["x"].astype(np.float64)
    q, k, v = ((x @ w[n]).reshape(2, 9, HEADS, D) for n in ("wq", "wk", "wv"))
    ref = _attention64(q, k, v, f["mask"].astype(np.float64), 1 / np.sqrt(D)).reshape(2, 9, C)
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, f)[0]
    assert jitops_types(jo.rewrite(model)) == ["MaskedAttentionBshd"]
    assert got.dtype == np.float16 and max_rel_error(got, ref) < 5e-3


@pytest.mark.parametrize("opset", [13, 14])
def test_fallback_body_before_castlike(opset):
    """Opsets 13-14 (no CastLike: float32 patterns only) give a body ORT runs as well."""
    model = bert_attention(opset=opset, key="two")
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["MaskedAttentionBshd"] and count_ops(rw, "Transpose") == 0
    f = feeds(2, 5)
    assert max_rel_error(ort_session(rw).run(None, f)[0], ort_session(model).run(None, f)[0]) < 1e-6


@pytest.mark.parametrize("share,key", [("q", "two"), ("k", "two"), ("k", "0231"), ("v", "two"), ("pv", "two")])
def test_a_value_read_outside_the_pattern_keeps_the_plain_type(share, key):
    """All four transposes or none: where a head transpose's output (or the P.V product) has
    another reader, every transpose stays and the node is today's [B, H, S, D] one."""
    model = bert_attention(share=share, key=key)
    [p] = jo.map_nodes(model)
    assert p.supported and p.op_type == "MaskedAttention", p.describe()
    # K^T's own transpose, as before (none when K^T itself has another reader: one is inserted)
    assert p.onnx_ops.count("Transpose") == (0 if key == "0231" else 1)
    assert all(p.inputs[n].layout == "" for n in "qkv")
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["MaskedAttention"] and {"q_heads", "v_heads", "out_heads"} <= {n.name for n in rw.graph.node}
    f = feeds(2, 5)
    for got, ref in zip(ort_session(rw).run(None, f), ort_session(model).run(None, f)):
        assert max_rel_error(got, ref) < 1e-6


def test_the_merged_output_may_have_other_readers():
    """The node writes the head-merged value itself: it may be read by any number of nodes (then
    the merge Reshape is not the only one, and the node keeps all four Reshapes: 4-D tensors)."""
    model = bert_attention(share="out")
    [p] = jo.map_nodes(model)
    assert p.node_output == "merged" and "num_heads" not in p.node_attrs
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["MaskedAttentionBshd"] and count_ops(rw, "Transpose") == 0 and count_ops(rw, "Reshape") == 4
    f = feeds(2, 5)
    for got, ref in zip(ort_session(rw).run(None, f), ort_session(model).run(None, f)):
        assert max_rel_error(got, ref) < 1e-6


@pytest.mark.parametrize("case", ["q4", "k4", "v4", "infer", "seq", "gqa"])
def test_head_reshapes_stay_unless_all_split_exactly_h_by_d(case):
    """The node takes the Reshapes only when all of them split (merge) E alone into H x D with H
    known and K, V of Q's head count, and it is their only reader. Otherwise it is today's node:
    the same *Bshd type on the 4-D values, every Reshape left in the graph, the same outputs."""
    kw = {"q4": {"share": "q4"}, "k4": {"share": "k4"}, "v4": {"share": "v4"}, "infer": {"split": "infer"},
          "seq": {"split": "seq", "masked": False}, "gqa": {"kv_heads": 1, "key": "two"}}[case]
    model = bert_attention(**kw)
    [p] = [p for p in jo.map_nodes(model) if p.op == "attention"]
    masked = kw.get("masked", True)
    assert p.supported and p.op_type == ("Masked" if masked else "") + "AttentionBshd", p.describe()
    assert "num_heads" not in p.node_attrs and "Reshape" not in p.onnx_ops
    assert p.node_inputs[:3] == ("q4", "k4", "v4") and p.node_output == "merged"
    rw = jo.rewrite(model)
    [node] = [n for n in rw.graph.node if n.domain == jo.DOMAIN]
    assert "num_heads" not in {a.name for a in node.attribute} and count_ops(rw, "Reshape") == 4
    f = {**feeds(2, 6, masked=masked), **({"heads": np.array([HEADS])} if case == "infer" else {})}
    ref = ort_session(model).run(None, f)
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, f)
    for a, b in zip(got, ref):
        assert max_rel_error(a, b) < TOL["float32"]
    for a, b in zip(ort_session(rw).run(None, f), ref):     # the body's reshapes are identities here
        assert max_rel_error(a, b) < 1e-6


def test_head_reshapes_with_shape_readers_that_die_with_the_node():
    """A Shape of a head split's output that only feeds the replaced nodes (torch computes targets
    and scales so) does not keep the Reshapes: the rewrite's orphan pass drops it."""
    model = bert_attention()
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "three"))
    at = next(i for i, n in enumerate(g.node) if n.op_type == "Div")
    g.node[at].input[1] = "q4_sqrt"       # the scale sqrt(D) computed from q4's shape, as torch exports it
    for node in reversed([helper.make_node("Shape", ["q4"], ["q4_shape"]),
                          helper.make_node("Gather", ["q4_shape", "three"], ["q4_dim"], axis=0),
                          helper.make_node("Cast", ["q4_dim"], ["q4_d"], to=1),
                          helper.make_node("Sqrt", ["q4_d"], ["q4_sqrt"])]):
        g.node.insert(at, node)
    [p] = jo.map_nodes(model)
    assert p.node_attrs.get("num_heads") == HEADS and p.node_inputs[:3] == ("xq", "xk", "xv"), p.describe()
    rw = jo.rewrite(model)
    assert count_ops(rw, "Shape") == 0 and count_ops(rw, "Reshape") == 0
    f = feeds(2, 5)
    assert max_rel_error(ort_session(rw).run(None, f)[0], ort_session(model).run(None, f)[0]) < 1e-6


def test_a_missing_piece_keeps_the_plain_type():
    """Q given as [N, H, S, D] (no head transpose), or an output transpose that does not merge the
    heads back: the plain type, with the other transposes left in the graph."""
    model = bert_attention()
    q_t = next(n for n in model.graph.node if n.name == "q_heads")
    model.graph.node.remove(q_t)
    model.graph.input.append(tensor_info("q", ["N", HEADS, "S", D]))
    [p] = jo.map_nodes(model)
    assert p.op_type == "MaskedAttention" and p.onnx_ops.count("Transpose") == 1
    rw = jo.rewrite(model)     # K^T's transpose becomes the [N, H, S, D] one the plain type reads
    assert {"v_heads", "out_heads"} <= {n.name for n in rw.graph.node} and count_ops(rw, "Transpose") == 3
    model = bert_attention()
    out_t = next(n for n in model.graph.node if n.name == "out_heads")
    out_t.attribute[0].CopyFrom(helper.make_attribute("perm", [0, 1, 2, 3]))
    [p] = jo.map_nodes(model)
    assert p.op_type == "MaskedAttention" and p.node_output == "pv"


def test_an_attention_op_without_the_layout_keeps_the_plain_type(monkeypatch):
    """A jitops whose attention op reads no [B, S, H, D] (no LAYOUT_INPUTS) takes today's node."""
    from jitops.ops import get_op
    monkeypatch.delattr(get_op("attention"), "LAYOUT_INPUTS")
    [p] = jo.map_nodes(bert_attention())
    assert p.supported and p.op_type == "MaskedAttention" and p.onnx_ops.count("Transpose") == 1


def test_grouped_query_attention():
    """One kv head for two query heads (MatMul broadcasts it in the original)."""
    model = bert_attention(kv_heads=1, key="two")
    [p] = jo.map_nodes(model)
    assert p.op_type == "MaskedAttentionBshd" and p.inputs["k"].shape == (-1, 1, -1, D)
    f = feeds(2, 6)
    got = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu").run(None, f)[0]
    ref = ort_session(model).run(None, f)[0]
    assert max_rel_error(got, ref) < TOL["float32"]
    assert max_rel_error(ort_session(jo.rewrite(model)).run(None, f)[0], ref) < 1e-6


def test_gpu_provider_branch_reads_and_writes_bshd_buffers(monkeypatch):
    """What a CUDA / ROCm EP node of a *Bshd type does (ORT's [B, S, H, D] buffers, a pointer
    runner on ORT's stream, outputs allocated by ORT with the storage dims), driven with the
    emulator's host buffers standing in for device memory."""
    from jitops.onnx.optypes import op_type
    from jitops.runtime import current_backend
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 5, HEADS, D)).astype(np.float32) for _ in "qkv")
    mask = np.where(rng.random((2, 1, 1, 5)) < 0.3, -1e4, 0.0).astype(np.float32)
    outs = []

    class FakeOrt:
        def jitops_ort_output(self, call, index, dims, ndim):
            outs.append(np.full(tuple(dims[:ndim]), np.nan, dtype=np.float32))
            return outs[-1].ctypes.data

    monkeypatch.setattr(kernels, "_lib", FakeOrt())
    kern = kernels.Kernel(op_type("MaskedAttentionBshd"), 1, "float32", {"scale": 0.3}, current_backend())
    kernels._kernels[-11] = kern
    try:
        tensors = ort_tensors((q, k, v, mask))
        for call in range(2):       # the second call: the remembered runner
            kernels.compute(-11, call, 4, tensors, 0)
            assert outs[-1].shape == (2, 5, HEADS, D)
            assert max_rel_error(outs[-1], _attention64(q, k, v, mask, np.float32(0.3))) < 2e-6
        assert kern.calls == 2 and len(kern.runners) == 1
    finally:
        kernels._kernels.pop(-11, None)


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_gpu_provider_branch_with_num_heads_reads_and_writes_3d_buffers(monkeypatch, layout):
    """num_heads > 0 on the CUDA / ROCm branch: ORT's 3-D buffers ([B, S, H*D]; sbhd [S, B*H, D])
    go to the pointer runner as they are, ORT allocates the output with the merged dims ([B, S, H*D];
    sbhd stays [S, B, H, D]) and the replay blob records those dims; the problem is the one of the
    4-D node (num_heads 0), so tuning records and bundles are shared."""
    from jitops.onnx.optypes import op_type
    from jitops.ops import get_op
    from jitops.runtime import current_backend
    rng = np.random.default_rng(6)
    b, s = 2, 5
    q4, k4, v4 = (rng.standard_normal((b, s, HEADS, D) if layout == "bshd" else (s, b, HEADS, D))
                  .astype(np.float32) for _ in "qkv")
    mask = np.where(rng.random((b, 1, 1, s)) < 0.3, -1e4, 0.0).astype(np.float32)
    as_bshd = (lambda a: a) if layout == "bshd" else (lambda a: a.transpose(1, 0, 2, 3))
    ref = as_bshd(_attention64(as_bshd(q4), as_bshd(k4), as_bshd(v4), mask, np.float32(0.3)))
    flat = (lambda a: a.reshape(b, s, C)) if layout == "bshd" else (lambda a: a.reshape(s, b * HEADS, D))
    outs, dims = [], []

    class FakeOrt:
        def jitops_ort_output(self, call, index, d, ndim):
            dims.append(tuple(d[:ndim]))
            outs.append(np.full(dims[-1], np.nan, dtype=np.float32))
            return outs[-1].ctypes.data

    monkeypatch.setattr(kernels, "_lib", FakeOrt())
    name = "MaskedAttention" + layout.capitalize()
    keys = []
    for kid, heads, arrays in ((-12, HEADS, [flat(a) for a in (q4, k4, v4)]), (-13, 0, [q4, k4, v4])):
        kern = kernels.Kernel(op_type(name), 1, "float32", {"scale": 0.3, "num_heads": heads}, current_backend())
        kernels._kernels[kid] = kern
        try:
            tensors = ort_tensors((*arrays, mask))
            kernels.compute(kid, 0, 4, tensors, 0)
        finally:
            kernels._kernels.pop(kid, None)
        want = (b, s, C) if heads and layout == "bshd" else ref.shape
        assert dims[-1] == want and max_rel_error(outs[-1].reshape(ref.shape), ref) < 2e-6
        [(plan_key, (attrs, out_specs))] = kern.plans.items()
        assert [rank for _, _, _, rank in out_specs] == [len(want)]
        # the replay blob's output dims are ORT's (what the C++ side hands ORT on a replay)
        blob = kernels.replay_blob([], out_specs)
        assert blob[:8] == struct.pack("<II", 1, len(want)) and blob[8:8 + 8 * len(want)] == struct.pack(
            f"<{len(want)}q", *want)
        specs = kern.specs({n: sh for n, sh, _ in plan_key}, {n: dt for n, _, dt in plan_key if dt})
        keys.append(get_op("attention").make_problem(specs, attrs).key())
    assert keys[0] == keys[1] and layout in keys[0]
    # num_heads says the tensors are 3-D: a 4-D one (or one that does not split) is an error, not a guess
    kern = kernels.Kernel(op_type(name), 1, "float32", {"scale": 0.3, "num_heads": HEADS}, current_backend())
    shapes = {"q": q4.shape, "k": q4.shape, "v": q4.shape, "mask": mask.shape}
    with pytest.raises(JitopsError, match="heads"):
        kern.specs(shapes, dict.fromkeys(shapes, "float32"))
    with pytest.raises(JitopsError, match="heads"):
        kern.specs({**shapes, "q": (b, s, C + 1) if layout == "bshd" else (s, b * HEADS + 1, D)},
                   dict.fromkeys(shapes, "float32"))


# ---------------------------------------------------------------- the torch corpus

@pytest.fixture(scope="module")
def corpus():
    pytest.importorskip("torch")
    from jitops.onnx import corpus as c
    return c


def _export(corpus, name: str, dtype: str = "float32"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx.load_from_string(corpus.export(name, 17, dtype=dtype))


@pytest.mark.parametrize("name,want,gone", [("bert", "MaskedAttentionBshd", 4), ("gpt", "AttentionBshd", 4),
                                            ("vit", "AttentionSbhd", 5)])
def test_corpus_exports(corpus, name, want, gone):
    """BERT and GPT split heads with view + permute / transpose: their four transposes go (GPT's tril
    buffer + masked_fill is proved causal: AttentionBshd with is_causal, causal_masks). The ViT's
    nn.MultiheadAttention works on [B * H, S, D] values (other permutations): the *Sbhd type, which
    takes K^T's transpose, the three head splits' and the merge's (test_onnx_attention_mha.py)."""
    model = _export(corpus, name)
    [p] = [p for p in jo.map_nodes(model) if p.op == "attention"]
    assert p.op_type == want and p.onnx_ops.count("Transpose") == gone, p.describe()
    # num_heads: BERT / GPT's three head splits and the merge; the ViT's three 4-D splits (its
    # [S * B, E] merge stays: the *Sbhd output is 4-D)
    assert p.node_attrs["num_heads"] == 2 and p.onnx_ops.count("Reshape") == (3 if name == "vit" else 4)
    rw = jo.rewrite(model)
    assert count_ops(rw, "Transpose") == count_ops(model, "Transpose") - gone
    assert count_ops(rw, "Reshape") == count_ops(model, "Reshape") - p.onnx_ops.count("Reshape")
    assert len(rw.graph.node) <= len(model.graph.node) - len(p.covered) + 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_corpus_kernels_and_fallback_match_ort(corpus, name, dtype):
    model = _export(corpus, name, dtype)
    rw = jo.rewrite(model)
    want = {"bert": "MaskedAttentionBshd", "gpt": "AttentionBshd"}[name]    # GPT's causal mask: is_causal
    assert want in jitops_types(rw)
    # HF's RMSNorm (cast to float32, rsqrt, cast back): one node in the model's dtype, float16 too
    # (its two Casts go into the node; float32's no-op cast stays where torch's tracer gave it to the
    # residual Add as well)
    assert name != "gpt" or "RmsNorm" in jitops_types(rw) and count_ops(rw, "Cast") <= (dtype == "float32")
    [node] = [n for n in rw.graph.node if n.op_type == want]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs.get("num_heads") == 2 and attrs["is_causal"] == (name == "gpt")     # the 3-D tensors
    tol = 1e-2 if dtype == "float16" else 1e-4
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    for batch, seq in ((1, 4), (2, 7)):
        f = corpus.example_inputs(name, seed=batch, x_0=batch, x_1=seq, mask_0=batch, mask_1=seq)
        f = {k: v.astype(dtype) for k, v in f.items()}
        ref = ort_session(model).run(None, f)[0]
        assert max_rel_error(sess.run(None, f)[0], ref) < tol, (name, batch)
        assert max_rel_error(ort_session(rw).run(None, f)[0], ref) < tol, (name, batch)


def test_torch_graph_runs_the_demo_models_bshd_attention_as_ort_does():
    """examples/onnx_torch.py's TorchGraph (jitops nodes on torch tensors, the demo's torch path)
    holds a *Bshd node's output in storage order [B, S, H, D], as ORT does: the demo model splits
    heads the exporters' way, so its attention is an AttentionBshd node."""
    import sys
    from pathlib import Path
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from make_model import build_model
    from onnx_torch import TorchGraph
    model = build_model(16)
    rw = jo.rewrite(model, input_shapes={"image": (1, 3, 16, 16)})
    assert "AttentionBshd" in jitops_types(rw)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    y = TorchGraph(rw, device="cpu")({"image": torch.from_numpy(x)})[0]
    ref = ort_session(model).run(None, {"image": x})[0]
    assert tuple(y.shape) == ref.shape and max_rel_error(y.numpy(), ref) < 2e-5
