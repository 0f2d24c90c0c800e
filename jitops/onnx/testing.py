"""Small ONNX models and comparisons for testing the rewrite against ONNX Runtime's own kernels."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

ELEM = {"float32": 1, "float16": 10, "int64": 7, "bool": 9, "bfloat16": 16}


def tensor_info(name: str, shape: Sequence[int | str] | None, dtype: str = "float32") -> Any:
    from onnx import helper
    return helper.make_tensor_value_info(name, ELEM[dtype], list(shape) if shape is not None else None)


def single_op_model(op: str, inputs: Mapping[str, Sequence[int] | None], constants: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any] | None = None, opset: int = 21, dtype: str = "float32",
                    node_inputs: Sequence[str] | None = None, output_shape: Sequence[int | str] | None = None,
                    ir_version: int = 10) -> Any:
    """One `op` node reading graph inputs `inputs` (name -> shape) and initializers `constants`."""
    from onnx import helper, numpy_helper
    names = list(node_inputs) if node_inputs is not None else [*inputs, *constants]
    node = helper.make_node(op, names, ["y"], **dict(attrs or {}))
    graph = helper.make_graph([node], f"{op.lower()}_test", [tensor_info(n, s, dtype) for n, s in inputs.items()],
                              [tensor_info("y", output_shape, dtype)],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    if output_shape is None:    # declare the output as shape inference sees it
        from onnx import shape_inference
        inferred = shape_inference.infer_shapes(model)
        for vi in [*inferred.graph.value_info, *inferred.graph.output]:
            if vi.name == "y" and vi.type.tensor_type.HasField("shape"):
                model.graph.output[0].CopyFrom(vi)
                break
        else:   # ops onnx cannot infer here (GroupNormalization) keep their input's shape
            model.graph.output[0].CopyFrom(model.graph.input[0])
            model.graph.output[0].name = "y"
    return model


def ort_session(model: Any, providers: Sequence[str] = ("CPUExecutionProvider",)) -> Any:
    """A plain ONNX Runtime session (no jitops), graph optimizations off so ORT's kernels run as written."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=list(providers))


def run_native(model: Any, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, dict(feeds))


def ort_supports_opset(opset: int) -> bool:
    """Whether the installed onnxruntime runs models of this default-domain opset."""
    import onnxruntime as ort
    from onnx import helper
    try:
        x = tensor_info("x", [1])
        model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x],
                                                    [tensor_info("y", [1])]),
                                  opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 10
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


def jitops_types(model: Any) -> list[str]:
    """The op types of the model's jitops-domain nodes, in graph order."""
    from .optypes import DOMAIN
    return [n.op_type for n in model.graph.node if n.domain == DOMAIN]


def count_ops(model: Any, op: str) -> int:
    """How many nodes of `op` the model's graph holds."""
    return sum(n.op_type == op for n in model.graph.node)


_ELEM_TYPES = {"float32": 1, "float16": 10, "bfloat16": 16}   # ONNX TensorProto data types


def ort_tensors(arrays: Sequence[np.ndarray | None]) -> Any:
    """Host arrays as the JtTensor records ORT's callback hands kernels.compute (None: an absent
    optional input), for driving the GPU-provider branch with emulator buffers. The caller keeps
    the arrays alive."""
    from .native import JtTensor
    records = (JtTensor * len(arrays))()
    for t, a in zip(records, arrays):
        if a is None:
            t.ndim = -1
            continue
        t.data, t.ndim, t.elem_type = a.ctypes.data, a.ndim, _ELEM_TYPES[a.dtype.name]
        for d, n in enumerate(a.shape):
            t.dims[d] = n
    return records


def max_rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    return float(np.abs(got - ref).max(initial=0.0) / scale)


def check_rewrite_at_two_sizes(model: Any, jitops_type: str, feeds: Any, out_shape: Any, tol: float) -> None:
    """The rewrite of `model` holds one node of `jitops_type`; at (batch, seq) = (1, 5) and (3, 7) the
    jitops kernels (CPU emulator) and the rewritten model's function bodies (no jitops library) both
    match ONNX Runtime on the original, with ORT's dtype and the shape out_shape(batch, seq); and only
    kernels of that type ran. feeds(batch, seq) -> the inputs."""
    import jitops.onnx as jo
    from jitops.onnx import kernels
    rw = jo.rewrite(model)
    assert jitops_types(rw) == [jitops_type]
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend="cpu")
    before = {kid: k.calls for kid, k in kernels._kernels.items()}
    for batch, seq in ((1, 5), (3, 7)):
        f = feeds(batch, seq)
        ref = ort_session(model).run(None, f)[0]
        got = sess.run(None, f)[0]                     # jitops kernels (emulator)
        fallback = ort_session(rw).run(None, f)[0]     # no jitops library: the function bodies
        assert got.dtype == ref.dtype and got.shape == ref.shape == out_shape(batch, seq)
        assert max_rel_error(got, ref) < tol, (batch, max_rel_error(got, ref))
        assert max_rel_error(fallback, ref) < tol, (batch, max_rel_error(fallback, ref))
    ran = {k.type.name for kid, k in kernels._kernels.items() if k.calls > before.get(kid, 0)}
    assert ran == {jitops_type}


def small_model(seed: int = 0, size: int = 8, channels: int = 8) -> Any:
    """Conv+BN+Relu, GroupNorm, LeakyRelu, LayerNorm and a MatMul/Softmax/MatMul self-attention (opset 21).

    Input 'x' [1, 3, size, size]; output 'y' [1, size*size, channels]. Five jitops problems.
    """
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    c, t = channels, size * size

    def init(name: str, value: np.ndarray) -> Any:
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    inits = [init("w", rng.standard_normal((c, 3, 3, 3)) * 0.4), init("b", rng.standard_normal(c) * 0.1),
             init("bn_g", rng.uniform(0.5, 1.5, c)), init("bn_b", rng.standard_normal(c) * 0.1),
             init("bn_m", rng.standard_normal(c) * 0.1), init("bn_v", rng.uniform(0.5, 1.5, c)),
             init("gn_s", rng.uniform(0.5, 1.5, c)), init("gn_b", rng.standard_normal(c) * 0.1),
             init("ln_s", rng.uniform(0.5, 1.5, c)), init("ln_b", rng.standard_normal(c) * 0.1),
             init("scale", np.array(1.0 / np.sqrt(c))),
             numpy_helper.from_array(np.array([1, c, t], np.int64), "tokens_shape")]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
             n("BatchNormalization", ["conv", "bn_g", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn"),
             n("Relu", ["bn"], ["relu"], name="relu"),
             n("GroupNormalization", ["relu", "gn_s", "gn_b"], ["gn"], num_groups=4, name="gn"),
             n("LeakyRelu", ["gn"], ["act"], alpha=0.1, name="leaky"),
             n("Reshape", ["act", "tokens_shape"], ["flat"], name="flatten"),
             n("Transpose", ["flat"], ["tok"], perm=[0, 2, 1], name="to_tokens"),
             n("LayerNormalization", ["tok", "ln_s", "ln_b"], ["ln"], axis=-1, name="ln"),
             n("Transpose", ["ln"], ["ln_t"], perm=[0, 2, 1], name="k_t"),
             n("MatMul", ["ln", "ln_t"], ["scores"], name="qk"),
             n("Mul", ["scores", "scale"], ["scaled"], name="scale"),
             n("Softmax", ["scaled"], ["probs"], axis=-1, name="softmax"),
             n("MatMul", ["probs", "ln"], ["y"], name="pv")]
    graph = helper.make_graph(nodes, "jitops_small", [tensor_info("x", [1, 3, size, size])],
                              [tensor_info("y", [1, t, c])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model
