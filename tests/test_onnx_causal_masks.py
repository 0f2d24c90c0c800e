"""Causal masks computed from shapes become is_causal (jitops/onnx/causal_masks.py); every other mask stays."""
from __future__ import annotations

import numpy as np
import pytest

import jitops.onnx as jo
from jitops.onnx.testing import check_rewrite_at_two_sizes, jitops_types

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _const(name, values, elem=TensorProto.INT64, dims=None):
    values = list(np.atleast_1d(values))
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, elem, [len(values)] if dims is None else dims, values))


def _triangle(kind: str) -> list:
    """Nodes making 'tri' from the shapes of q [b, 2, tq, 8] and k [b, 2, tk, 8]: ones [tq, tk]
    through Trilu (kind picks which triangle, or a band of two)."""
    nodes = [helper.make_node("Shape", ["q"], ["qs"]), helper.make_node("Shape", ["k"], ["ks"]),
             _const("at2", [2]), _const("at3", [3]),
             helper.make_node("Slice", ["qs", "at2", "at3"], ["tq"]),
             helper.make_node("Slice", ["ks", "at2", "at3"], ["tk"]),
             helper.make_node("Concat", ["tq", "tk"], ["qk_shape"], axis=0),
             _const("one", [1.0], TensorProto.FLOAT, []), helper.make_node("Expand", ["one", "qk_shape"], ["ones"])]
    if kind == "bottom_right":     # key j visible to query i when j <= i + tk - tq (a KV cache's mask)
        nodes += [helper.make_node("Sub", ["tk", "tq"], ["diag1"]), _const("scalar", [], dims=[0]),
                  helper.make_node("Reshape", ["diag1", "scalar"], ["diag"]),
                  helper.make_node("Trilu", ["ones", "diag"], ["tri"], upper=0)]
    elif kind == "anti":           # hides the keys below the diagonal instead
        nodes.append(helper.make_node("Trilu", ["ones"], ["tri"], upper=1))
    elif kind in ("band", "wide_band"):   # a sliding window of 3 (or 4096, wider than any probe): two triangles
        window = -2 if kind == "band" else -4095
        nodes += [helper.make_node("Trilu", ["ones"], ["lower"], upper=0), _const("window", [window], dims=[]),
                  helper.make_node("Trilu", ["lower", "window"], ["tri"], upper=1)]
    else:
        nodes.append(helper.make_node("Trilu", ["ones"], ["tri"], upper=0))
    return nodes


def _model(kind: str, fill: float = float("-inf"), masked_fill: bool = False):
    """softmax(q k^T + mask) v over q [b, 2, tq, 8], k / v [b, 2, tk, 8] (opset 17), the mask a
    Where(tri == 0, fill, 0) added to the scores, or (masked_fill) Where(tri == 0, fill, scores);
    kind 'data' reads the mask from an input instead."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"])]
    tk = "tk" if kind == "bottom_right" else "tq"
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", 2, "tq", 8])]
    ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 2, tk, 8]) for n in "kv"]
    if kind == "data":
        ins.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, ["tq", tk]))
        nodes.append(helper.make_node("Add", ["s", "m"], ["sm"]))
    else:
        nodes += _triangle(kind) + [_const("zero", [0.0], TensorProto.FLOAT, []),
                                    _const("fill", [fill], TensorProto.FLOAT, []),
                                    helper.make_node("Equal", ["tri", "zero"], ["hidden"])]
        if masked_fill:
            nodes.append(helper.make_node("Where", ["hidden", "fill", "s"], ["sm"]))
        else:
            nodes += [helper.make_node("Where", ["hidden", "fill", "zero"], ["mask"]),
                      helper.make_node("Add", ["s", "mask"], ["sm"])]
    nodes += [helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attention", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _is_causal(model) -> list[tuple[str, int]]:
    rw = jo.rewrite(model)
    return [(n.op_type, {a.name: a.i for a in n.attribute}.get("is_causal")) for n in rw.graph.node
            if n.domain == "jitops"]


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    return {n: rng.standard_normal((batch, 2, seq, 8)).astype(np.float32) for n in "qkv"}


@pytest.mark.parametrize("masked_fill", [False, True])
def test_causal_triangle_becomes_is_causal(masked_fill):
    """The triangle from Trilu over the shapes is proved causal: the node reads no mask, and the jitops
    kernels (CPU emulator) and the fallback body (is_causal in standard ops) both match ORT on the
    original model at two sizes."""
    model = _model("causal", masked_fill=masked_fill)
    assert _is_causal(model) == [("Attention", 1)]
    check_rewrite_at_two_sizes(model, "Attention", _feeds, lambda b, s: (b, 2, s, 8), 1e-4)


@pytest.mark.parametrize("kind,fill", [("band", float("-inf")), ("wide_band", float("-inf")),
                                       ("anti", float("-inf")), ("causal", -1.0),
                                       ("data", 0.0), ("bottom_right", float("-inf"))])
def test_other_masks_stay_masks(kind, fill):
    """A sliding window (two triangles), the other triangle, a fill too shallow to hide a key, a mask
    read from an input, and a bottom-right (KV cache) triangle: not top-left causal at every size, so
    the node keeps reading the mask. The 4096-key window looks causal at the probes' sizes: only the
    rule of one triangle keeps it. The bottom-right one passes the probe with every dim equal and
    fails the one with distinct query and key lengths."""
    assert _is_causal(_model(kind, fill)) == [("MaskedAttention", 0)]


def test_torch_sdpa_causal_export():
    """torch's SDPA(is_causal=True) as the TorchScript exporter writes it (Shape -> Expand -> Trilu ->
    Equal -> Where -> Add), with Llama's grouped-query repeat_kv (Expand + Reshape) before it. The
    jitops kernels (emulator) and the fallback body (which repeats the kv heads itself) match ORT."""
    torch = pytest.importorskip("torch")
    import io

    class GQA(torch.nn.Module):
        def __init__(self, e: int = 32, h: int = 4, hk: int = 2):
            super().__init__()
            self.h, self.hk, self.d = h, hk, e // h
            self.q, self.kv, self.o = (torch.nn.Linear(e, h * self.d), torch.nn.Linear(e, 2 * hk * self.d),
                                       torch.nn.Linear(h * self.d, e))

        def forward(self, x):
            b, t, _ = x.shape
            q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
            k, v = (z.view(b, t, self.hk, self.d).transpose(1, 2) for z in self.kv(x).chunk(2, -1))
            n = self.h // self.hk
            k, v = (z[:, :, None].expand(b, self.hk, n, t, self.d).reshape(b, self.h, t, self.d) for z in (k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, self.h * self.d))

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(GQA().eval(), (torch.randn(2, 6, 32),), buf, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "b", 1: "t"}}, opset_version=17, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    # the head transposes go in too (the scale's Shape(q) dies with the pattern), and repeat_kv's
    # Unsqueeze -> Expand -> Reshape: the node reads the 2 kv heads (grouped-query)
    assert _is_causal(model) == [("AttentionBshd", 1)]
    rw = jo.rewrite(model)
    ops = {n.op_type for n in rw.graph.node}
    assert not ops & {"Trilu", "Expand", "Transpose"}, ops      # the mask's, repeat_kv's and the heads' nodes went
    assert jitops_types(rw) == ["AttentionBshd"]

    def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(batch + seq).standard_normal((batch, seq, 32)).astype(np.float32)}
    check_rewrite_at_two_sizes(model, "AttentionBshd", feeds, lambda b, s: (b, s, 32), 1e-4)


@pytest.mark.parametrize("batch_from_expand", [False, True])
def test_repeat_kv_taken_only_where_it_repeats_heads(batch_from_expand):
    """K, V = Reshape(Expand(Unsqueeze(X, 2), [B, 2, 2, S, 8]), [B, 4, S, 8]) of X [B, 2, S, 8]: the
    node reads X (grouped-query, 2 query heads per kv head) and the result matches ORT. When the
    Expand also broadcasts X's batch of 1 up to Q's batch, that is not repeat_kv: the copy stays."""
    xb = 1 if batch_from_expand else "b"
    nodes, ins = [], [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2 if batch_from_expand else "b", 4, "t", 8])]
    for n in "kv":
        ins.append(helper.make_tensor_value_info(n + "x", TensorProto.FLOAT, [xb, 2, "t", 8]))
        nodes += [helper.make_node("Unsqueeze", [n + "x", "axis2"], [n + "5"]),
                  helper.make_node("Shape", ["q"], [n + "qs"]), _const(n + "a", [0]), _const(n + "b", [1]),
                  _const(n + "c", [2]), _const(n + "d", [3]),
                  helper.make_node("Slice", [n + "qs", n + "a", n + "b"], [n + "B"]),
                  helper.make_node("Slice", [n + "qs", n + "c", n + "d"], [n + "S"]),
                  _const(n + "mid", [2, 2]), _const(n + "dim", [8]), _const(n + "heads", [4]),
                  helper.make_node("Concat", [n + "B", n + "mid", n + "S", n + "dim"], [n + "target"], axis=0),
                  helper.make_node("Expand", [n + "5", n + "target"], [n + "e"]),
                  helper.make_node("Concat", [n + "B", n + "heads", n + "S", n + "dim"], [n + "shape4"], axis=0),
                  helper.make_node("Reshape", [n + "e", n + "shape4"], [n])]
    nodes = [_const("axis2", [2])] + nodes + [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "gqa", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rw = jo.rewrite(model)
    assert jitops_types(rw) == ["Attention"]
    assert ("Expand" in {n.op_type for n in rw.graph.node}) == batch_from_expand
    if not batch_from_expand:
        def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
            rng = np.random.default_rng(batch + seq)
            return {"q": rng.standard_normal((batch, 4, seq, 8)).astype(np.float32),
                    **{n: rng.standard_normal((batch, 2, seq, 8)).astype(np.float32) for n in ("kx", "vx")}}
        check_rewrite_at_two_sizes(model, "Attention", feeds, lambda b, s: (b, 4, s, 8), 1e-4)


def test_float16_sdpa_causal_export_computes_in_float16():
    """torch's SDPA(is_causal=True) exported from float16 tensors casts the scores and V to float32
    (its causal mask is float32) and returns float32: the node computes in float16 on the original
    inputs, proves the mask causal, and a Cast after it gives the float32 output. Both the kernels
    (emulator) and the fallback body match ORT on the original within float16 rounding."""
    torch = pytest.importorskip("torch")
    import io

    class SDPA(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    buf = io.BytesIO()
    x = torch.randn(1, 2, 8, 16).half()
    torch.onnx.export(SDPA(), (x, x, x), buf, input_names=list("qkv"), output_names=["y"], opset_version=17,
                      dynamo=False, dynamic_axes={n: {0: "b", 2: "t"} for n in "qkvy"})
    model = onnx.load_from_string(buf.getvalue())
    rw = jo.rewrite(model)
    assert [n.op_type for n in rw.graph.node] == ["Attention", "Cast"]
    assert _is_causal(model) == [("Attention", 1)]

    def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(batch * 10 + seq)
        return {n: rng.standard_normal((batch, 2, seq, 16)).astype(np.float16) for n in "qkv"}
    check_rewrite_at_two_sizes(model, "Attention", feeds, lambda b, s: (b, 2, s, 16), 2e-3)


def test_float16_llama_export():
    """The corpus Llama exported in float16: its attention (upcast by the exporter, causal, grouped-
    query) is one node, and the model's kernels match ORT on the original at two sizes."""
    pytest.importorskip("torch")
    import warnings

    from jitops.onnx import corpus
    from jitops.onnx.testing import max_rel_error, ort_session
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = onnx.load_from_string(corpus.export("llama", 17, dtype="float16"))
    rw = jo.rewrite(model)
    assert [t for t in jitops_types(rw) if "Attention" in t] == ["Attention"]
    assert _is_causal(model).count(("Attention", 1)) == 1 and "Expand" not in {n.op_type for n in rw.graph.node}
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    for batch, seq in ((1, 5), (2, 9)):
        f = {k: v.astype(np.float16) for k, v in corpus.example_inputs("llama", seed=batch, x_0=batch, x_1=seq).items()}
        ref = ort_session(model).run(None, f)[0]
        assert max_rel_error(sess.run(None, f)[0], ref) < 1e-2, batch
        assert max_rel_error(ort_session(rw).run(None, f)[0], ref) < 1e-2, batch


def _position_mask_model(window: int | None):
    """A mask built from position indices, as transformers 5 writes it under torch.export: q_idx =
    Range(0, tq), kv_idx = Range(0, tk), visible = kv_idx <= q_idx [and q_idx - kv_idx < window],
    Where(visible, 0, float32's lowest) added to the scores."""
    nodes = [helper.make_node("Shape", ["q"], ["qs"]), _const("at2", 2, dims=[]),
             helper.make_node("Gather", ["qs", "at2"], ["tq"], axis=0),
             helper.make_node("Shape", ["k"], ["ks"]), helper.make_node("Gather", ["ks", "at2"], ["tk"], axis=0),
             _const("zero_i", 0, dims=[]), _const("one_i", 1, dims=[]),
             helper.make_node("Range", ["zero_i", "tq", "one_i"], ["q_idx0"]),
             helper.make_node("Range", ["zero_i", "tk", "one_i"], ["kv_idx"]),
             _const("last", [1]), helper.make_node("Unsqueeze", ["q_idx0", "last"], ["q_idx"]),
             helper.make_node("LessOrEqual", ["kv_idx", "q_idx"], ["causal"])]
    visible = "causal"
    if window is not None:
        nodes += [helper.make_node("Sub", ["q_idx", "kv_idx"], ["dist"]), _const("window", window, dims=[]),
                  helper.make_node("Less", ["dist", "window"], ["near"]),
                  helper.make_node("And", ["causal", "near"], ["visible"])]
        visible = "visible"
    nodes += [_const("zero", [0.0], TensorProto.FLOAT, []), _const("lowest", [-3.4028235e38], TensorProto.FLOAT, []),
              helper.make_node("Where", [visible, "zero", "lowest"], ["mask"]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "mask"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 2, "t", 8]) for n in "qkv"]
    graph = helper.make_graph(nodes, "positions", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("window", [None, 3, 4096])
def test_masks_from_position_indices(window):
    """kv_idx <= q_idx over Range indices is proved causal (no Trilu, no table: every constant is
    small, and the probes run past them); with a sliding window of 3 the probes see its edge, and a
    window of 4096 is a constant too large to probe past: both stay masks."""
    model = _position_mask_model(window)
    if window is None:
        assert _is_causal(model) == [("Attention", 1)]
        check_rewrite_at_two_sizes(model, "Attention", _feeds, lambda b, s: (b, 2, s, 8), 1e-4)
    else:
        assert _is_causal(model) == [("MaskedAttention", 0)]
