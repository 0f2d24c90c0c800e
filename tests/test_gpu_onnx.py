"""GPU: the example model through ONNX Runtime with jitops kernels on the GPU, against ORT's own CPU run.

Run on a machine with an NVIDIA GPU: `python3 -m pytest -m gpu tests/test_gpu_onnx.py -s`. The
timing test prints (and with JITOPS_REPORT_DIR writes) the end-to-end times of ORT's native CPU
run, ORT with jitops kernels, torch eager and torch with the jitops nodes.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
if hasattr(ort, "preload_dlls") and "CUDAExecutionProvider" in ort.get_available_providers():
    ort.preload_dlls()      # the CUDA EP's cuDNN / cuBLAS from the nvidia-* wheels beside torch

import jitops  # noqa: E402
import jitops.onnx as jo  # noqa: E402
from jitops.onnx.testing import max_rel_error, ort_session  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
SIZE, BATCH = 64, 4


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    backend = jitops.get_backend("cuda")
    with jitops.use_backend(backend):
        yield backend


@pytest.fixture(scope="module")
def case(gpu):
    from make_model import build_model
    model = build_model(SIZE)
    shapes = {"image": (BATCH, 3, SIZE, SIZE)}
    x = np.random.default_rng(11).standard_normal(shapes["image"]).astype(np.float32)
    ref = ort_session(model).run(None, {"image": x})[0]
    return model, jo.rewrite(model, input_shapes=shapes), x, ref


def test_ort_cpu_provider_with_jitops_on_the_gpu_matches_ort_cpu(gpu, case):
    model, rewritten, x, ref = case
    sess = jo.session(rewritten, providers=["CPUExecutionProvider"], backend=gpu)
    got = sess.run(None, {"image": x})[0]
    assert max_rel_error(got, ref) < 1e-3


def test_torch_graph_with_jitops_nodes_matches_ort_cpu(gpu, case):
    from onnx_torch import TorchGraph
    _, rewritten, x, ref = case
    with torch.no_grad():
        got = TorchGraph(rewritten)({"image": torch.from_numpy(x).cuda()})[0].cpu().numpy()
    assert max_rel_error(got, ref) < 1e-3


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="this onnxruntime has no CUDA execution provider")
def test_cuda_execution_provider_device_buffers(gpu, case):
    _, rewritten, x, ref = case
    from jitops.onnx import kernels
    before = set(kernels._kernels)
    sess = jo.session(rewritten, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    mine = [k for kid, k in kernels._kernels.items() if kid not in before]
    jitops_nodes = sum(n.domain == "jitops" for n in rewritten.graph.node)
    # Every jitops node of this session was placed on the CUDA provider (ORT's device buffers and
    # stream), none fell back to the CPU provider with staged copies.
    assert len(mine) == jitops_nodes and all(k.provider == 1 for k in mine), [(k.type.name, k.provider) for k in mine]
    got = sess.run(None, {"image": x})[0]
    assert max_rel_error(got, ref) < 1e-3
    assert all(k.calls == 1 for k in mine)
    for _ in range(3):          # repeats: where ORT hands a node the same buffers, the library's replay runs it
        again = sess.run(None, {"image": x})[0]
        assert max_rel_error(again, ref) < 1e-3
    print(f"replayed without Python: {sum(k.calls == 1 for k in mine)} of {len(mine)} jitops nodes")


def _median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def test_end_to_end_times(gpu, case):
    """Measured, printed and (JITOPS_REPORT_DIR) saved; nothing asserted about speed."""
    from onnx_torch import TorchGraph
    model, rewritten, x, _ = case
    native = ort_session(model)
    jit = jo.session(rewritten, providers=["CPUExecutionProvider"], backend=gpu)
    eager, with_jitops = TorchGraph(model), TorchGraph(rewritten)

    def torch_run(graph):
        with torch.no_grad():
            return graph({"image": torch.from_numpy(x).cuda()})[0].cpu().numpy()

    rows = {"ort_native_cpu": _median_ms(lambda: native.run(None, {"image": x})),
            "ort_jitops_cpu_ep_gpu_staged": _median_ms(lambda: jit.run(None, {"image": x})),
            "torch_eager_gpu": _median_ms(lambda: torch_run(eager)),
            "torch_graph_jitops_gpu": _median_ms(lambda: torch_run(with_jitops))}
    if "CUDAExecutionProvider" in ort.get_available_providers():
        # numpy in and out on both sides: each session copies the input up and the output down once.
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        native_cuda = ort.InferenceSession(model.SerializeToString(), providers=providers)
        jit_cuda = jo.session(rewritten, providers=providers)
        rows["ort_native_cuda_ep"] = _median_ms(lambda: native_cuda.run(None, {"image": x}))
        rows["ort_jitops_cuda_ep"] = _median_ms(lambda: jit_cuda.run(None, {"image": x}))
    report = {"device": torch.cuda.get_device_name(), "onnxruntime": ort.__version__, "torch": torch.__version__,
              "providers": ort.get_available_providers(),
              "model": f"tiny UNet {BATCH}x3x{SIZE}x{SIZE}", "median_ms": rows,
              "date": time.strftime("%Y-%m-%d")}
    print("\n" + json.dumps(report, indent=1))
    out = os.environ.get("JITOPS_REPORT_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_onnx_times.json").write_text(json.dumps(report, indent=1))
    assert all(v > 0 for v in rows.values())


@pytest.mark.parametrize("op", ["layer_norm", "conv2d"])
def test_run_pointers_on_device_buffers_and_a_stream(gpu, op):
    """The path ORT's CUDA execution provider takes: raw device pointers and ORT's stream, no copies."""
    from jitops import engine
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    rng = np.random.default_rng(5)
    if op == "layer_norm":
        inputs = {"x": rng.standard_normal((64, 256)), "gamma": rng.random(256) + 0.5, "beta": rng.standard_normal(256)}
        attrs = {"normalized_shape": (256,), "eps": 1e-5}
    else:
        inputs = {"x": rng.standard_normal((2, 8, 20, 20)), "w": rng.standard_normal((16, 8, 3, 3)), "bias": None}
        attrs = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1, "activation": "relu",
                 "alpha": 0.01}
    dev = {n: (torch.from_numpy(v.astype(np.float32)).cuda() if v is not None else None) for n, v in inputs.items()}
    expected = engine.run(op, dev, attrs)
    out = torch.empty_like(expected)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        engine.run_pointers(op, {n: ((t.data_ptr(), TensorSpec(tuple(t.shape), "float32")) if t is not None else None)
                                 for n, t in dev.items()}, attrs, {next(iter(get_op(op).make_problem(
                                     {n: (TensorSpec(tuple(t.shape), "float32") if t is not None else None)
                                      for n, t in dev.items()}, attrs).outputs())): out.data_ptr()},
                            stream.cuda_stream, backend=gpu)
    stream.synchronize()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name,dtype", [("gpt", "float32"), ("gpt", "float16"), ("llama", "float32"),
                                        ("llama", "float16")])
def test_decoder_exports_on_the_gpu_match_ort_cpu(gpu, name, dtype):
    """The corpus decoders as torch exports them (GPT: tril buffer + masked_fill; Llama: rotary,
    repeat_kv, SDPA is_causal, float16 upcast) with their attention proved causal and, for Llama,
    reading the kv heads: the GPU kernels under ORT's CPU provider match ORT's own run of the original
    at two sequence lengths (the corpus keeps 32 positions)."""
    import warnings

    from jitops.onnx import corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = onnx.load_from_string(corpus.export(name, 17, dtype=dtype))
    rw = jo.rewrite(model)
    attention = [n for n in rw.graph.node if n.domain == jo.DOMAIN and "Attention" in n.op_type]
    assert len(attention) == 1 and {a.name: a.i for a in attention[0].attribute}["is_causal"] == 1
    sess = jo.session(model, providers=["CPUExecutionProvider"], backend=gpu)
    for batch, seq in ((2, 7), (3, 31)):
        f = {k: v.astype(dtype) for k, v in corpus.example_inputs(name, seed=batch, x_0=batch, x_1=seq).items()}
        ref = ort_session(model).run(None, f)[0]
        got = sess.run(None, f)[0]
        assert got.dtype == ref.dtype and max_rel_error(got, ref) < (1e-2 if dtype == "float16" else 1e-3), (batch, seq)
