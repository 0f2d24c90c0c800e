"""The kernel plumbing under the ONNX Runtime ops, on the emulator: raw pointers, the library's ABI."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from jitops import engine
from jitops.ops.base import TensorSpec


def test_run_pointers_matches_run_on_the_same_buffers(rng):
    x = rng.standard_normal((16, 96)).astype(np.float32)
    gamma = (rng.random(96) + 0.5).astype(np.float32)
    attrs = {"normalized_shape": (96,), "eps": 1e-5}
    expected = engine.run("rms_norm", {"x": x, "gamma": gamma}, attrs)
    out = np.full_like(x, np.nan)
    engine.run_pointers("rms_norm", {"x": (x.ctypes.data, TensorSpec(x.shape, "float32")),
                                     "gamma": (gamma.ctypes.data, TensorSpec(gamma.shape, "float32"))},
                        attrs, {"y": out.ctypes.data}, stream=0)
    np.testing.assert_array_equal(out, expected)


def test_library_exports_only_the_entry_points():
    pytest.importorskip("onnxruntime")
    from jitops.onnx.native import library_path
    res = subprocess.run(["nm", "-D", "--defined-only", str(library_path())], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("no nm here")
    ours = sorted(line.split()[-1] for line in res.stdout.splitlines() if " T " in line)
    assert ours == ["RegisterCustomOps", "jitops_ort_configure", "jitops_ort_invalidate", "jitops_ort_keep_replay",
                    "jitops_ort_output", "jitops_ort_replay_free", "jitops_ort_replay_new", "jitops_ort_replay_run",
                    "jitops_ort_shutdown"]


def test_registering_the_library_without_jitops_is_a_clear_ort_error():
    ort = pytest.importorskip("onnxruntime")
    from jitops.onnx.native import library_path
    script = (f"import onnxruntime as ort\nso = ort.SessionOptions()\n"
              f"try:\n    so.register_custom_ops_library({str(library_path())!r})\n    print('no error')\n"
              f"except Exception as exc:\n    print('error:', exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout
    assert "error:" in out and "jitops.onnx.session()" in out, (ort.__version__, out)


def test_run_pointers_reuses_per_call_workspaces_per_stream(rng):
    """The CUDA / ROCm EP path: per-call workspaces (Winograd tiles here) are allocated once per
    stream and reused, not allocated, synchronized and freed on every call."""
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    attrs = {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1, "activation": None,
             "alpha": 0.01}
    ptrs = lambda w: {"x": (x.ctypes.data, TensorSpec(x.shape, "float32")),  # noqa: E731
                      "w": (w.ctypes.data, TensorSpec(w.shape, "float32")), "bias": None}
    engine.clear_prepared()
    for _ in range(3):     # new weights each call: the filter transform is redone, the tiles reused
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        expected = engine.run("conv2d", {"x": x, "w": w, "bias": None}, attrs, schedule="winograd_2x2")
        out = np.full(expected.shape, np.nan, dtype=np.float32)
        engine.run_pointers("conv2d", ptrs(w), attrs, {"y": out.ctypes.data}, stream=0, schedule="winograd_2x2")
        np.testing.assert_array_equal(out, expected)
    prepared = [p for k, p in engine._cache.by_call.items() if k[0] == "pointers"]
    assert len(prepared) == 1 and list(prepared[0].stream_scratch) == [0]
    assert prepared[0].stream_scratch[0], "this plan has per-call workspaces"
    engine.clear_prepared()


def test_gpu_provider_branch_of_the_ort_kernel_on_emulator_buffers(rng, monkeypatch):
    """What a CUDA / ROCm EP node does (ORT's buffers, ORT's stream, a cached pointer runner),
    driven with the emulator's host buffers standing in for device memory."""
    from jitops.onnx import kernels
    from jitops.onnx.native import MAX_RANK
    from jitops.onnx.testing import ort_tensors
    from jitops.onnx.optypes import op_type
    from jitops.runtime import current_backend

    x = rng.standard_normal((2, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    expected = engine.run("conv2d", {"x": x, "w": w, "bias": None},
                          {"stride": (1, 1), "padding": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1,
                           "activation": "relu", "alpha": 0.01})
    outs = []

    class FakeOrt:
        def jitops_ort_output(self, call, index, dims, ndim):
            outs.append(np.full(tuple(dims[:ndim]), np.nan, dtype=np.float32))
            return outs[-1].ctypes.data

    monkeypatch.setattr(kernels, "_lib", FakeOrt())
    k = kernels.Kernel(op_type("Conv2dRelu"), 1, "float32", {"pads": [1, 1, 1, 1], "strides": [1, 1],
                                                             "dilations": [1, 1]}, current_backend())
    kernels._kernels[-7] = k
    try:
        tensors = ort_tensors((x, w, None))       # no bias
        for call in range(2):
            kernels.compute(-7, call, 3, tensors, 0)
            np.testing.assert_allclose(outs[-1], expected, rtol=1e-5, atol=1e-5)
        assert len(k.runners) == 1 and k.calls == 2 and MAX_RANK >= 4
        stale = next(iter(k.runners.values()))
        engine.clear_prepared()          # frees the plans' memory: the kernel must not run the old runner
        kernels.compute(-7, 2, 3, tensors, 0)
        np.testing.assert_allclose(outs[-1], expected, rtol=1e-5, atol=1e-5)
        assert len(k.runners) == 1 and next(iter(k.runners.values())) is not stale
    finally:
        kernels._kernels.pop(-7, None)


@pytest.mark.parametrize("constant", [True, False])
def test_gpu_provider_keeps_data_derived_from_initializers(rng, monkeypatch, constant):
    """BatchNorm's folded scale/shift (a prepare launch) is computed once per kernel when ORT says
    the parameters are initializers, and on every run when it does not."""
    from jitops.onnx import kernels
    from jitops.onnx.testing import ort_tensors
    from jitops.onnx.optypes import op_type
    from jitops.runtime import current_backend

    x = rng.standard_normal((2, 5, 7, 3)).astype(np.float32)
    params = [(rng.random(5) + 0.5).astype(np.float32), rng.standard_normal(5).astype(np.float32),
              rng.standard_normal(5).astype(np.float32), (rng.random(5) + 0.5).astype(np.float32)]
    expected = engine.run("batch_norm", {"x": x, "mean": params[2], "var": params[3], "gamma": params[0],
                                         "beta": params[1]}, {"eps": 1e-5, "activation": None, "alpha": 0.01})
    out = np.empty_like(x)

    class FakeOrt:
        def jitops_ort_output(self, call, index, dims, ndim):
            out.fill(np.nan)
            return out.ctypes.data

    monkeypatch.setattr(kernels, "_lib", FakeOrt())
    engine.clear_prepared()
    t = op_type("BatchNorm")
    k = kernels.Kernel(t, 1, "float32", {"epsilon": 1e-5}, current_backend(),
                       constant=frozenset(t.inputs[1:]) if constant else frozenset())
    kernels._kernels[-8] = k
    try:
        tensors = ort_tensors([x, *params])
        kernels.compute(-8, 0, 5, tensors, 0)
        prepared = next(p for key, p in engine._cache.by_call.items() if key[0] == "pointers")
        assert prepared.prepare_steps, "folded batch norm has a prepare launch"
        calls = []
        for step in prepared.prepare_steps:
            run = step.run
            monkeypatch.setattr(step, "run", lambda packed, stream, run=run: (calls.append(1), run(packed, stream)))
        for call in range(1, 4):
            kernels.compute(-8, call, 5, tensors, 0)
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        assert len(calls) == (0 if constant else 3 * len(prepared.prepare_steps))
    finally:
        kernels._kernels.pop(-8, None)
        engine.clear_prepared()


def test_persistent_workspaces_are_kept_per_stream(rng):
    """Grid-reduction counters and partials (layer_norm's split path) are persistent: allocated and
    zeroed once, then reused, but once per stream: two streams running the same plan at once must
    not meet at one grid barrier or mix their partial sums."""
    x = rng.standard_normal((4, 512)).astype(np.float32)
    attrs = {"normalized_shape": (512,), "eps": 1e-5}
    expected = engine.run("layer_norm", {"x": x, "gamma": None, "beta": None}, attrs, schedule="split")
    engine.clear_prepared()
    spec = {"x": (x.ctypes.data, TensorSpec(x.shape, "float32")), "gamma": None, "beta": None}
    for stream in (1, 2, 1, 2):
        out = np.full_like(x, np.nan)
        engine.run_pointers("layer_norm", spec, attrs, {"y": out.ctypes.data}, stream=stream, schedule="split")
        np.testing.assert_array_equal(out, expected)
    prepared = [p for k, p in engine._cache.by_call.items() if k[0] == "pointers"]
    assert len(prepared) == 1
    kept = prepared[0].persistent
    assert sorted({stream for stream, _ in kept}) == [1, 2], kept
    assert {name for _, name in kept} == {"counters", "partials", "stats"}
    assert len(set(kept.values())) == len(kept), "each stream has its own copy"
    engine.clear_prepared()
    assert not prepared[0].persistent


def test_public_path_keeps_per_call_workspaces_for_non_torch_arrays(rng, monkeypatch):
    """numpy / CuPy arrays on the public path: a plan's per-call workspaces (Winograd tiles) come
    from the plan's per-stream scratch, allocated once, not allocated and freed per call (a device
    free synchronizes the whole device)."""
    from jitops.runtime import current_backend
    backend = current_backend()
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    attrs = {"padding": (1, 1, 1, 1)}
    engine.clear_prepared()
    first = engine.run("conv2d", {"x": x, "w": w, "bias": None}, attrs, schedule="winograd_2x2")
    freed = []
    monkeypatch.setattr(backend, "free", lambda ptr: freed.append(ptr))
    for _ in range(3):
        np.testing.assert_array_equal(engine.run("conv2d", {"x": x, "w": w, "bias": None}, attrs,
                                                 schedule="winograd_2x2"), first)
    assert freed == []
    prepared = [p for k, p in engine._cache.by_call.items() if k[0] == "conv2d"]
    assert len(prepared) == 1 and list(prepared[0].stream_scratch) == [0]
    monkeypatch.undo()
    engine.clear_prepared()
