"""Workspaces derived from inputs (transformed filters, folded batch-norm parameters) are kept
per input identity: alternating weights of one shape are each transformed once, and a weight
changed in place is transformed again."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops import engine
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

from conftest import rel_error

op = get_op("conv2d")


def _prepared(schedule: str):
    entries = [p for k, p in engine._cache.by_call.items() if k[0] == "conv2d" and k[2] == schedule]
    assert entries
    return entries[-1]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_alternating_weights_are_transformed_once_each(emu, rng, kind):
    engine.clear_prepared()
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    ws = [rng.standard_normal((6, 4, 3, 3)).astype(np.float32) for _ in range(3)]
    problem = op.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec(ws[0].shape, "float32")},
                              {"padding": 1})
    refs = [op.reference(problem, {"x": x, "w": w})["y"] for w in ws]
    if kind == "torch":
        torch = pytest.importorskip("torch")
        x_in, w_in = torch.from_numpy(x), [torch.from_numpy(w) for w in ws]
    else:
        x_in, w_in = x, ws
    for _ in range(3):
        for w, ref in zip(w_in, refs):
            y = jitops.conv2d(x_in, w, padding=1, schedule="winograd_4x4")
            assert rel_error(np.asarray(y), ref) <= 1e-4
    derived = _prepared("winograd_4x4").derived
    assert derived is not None and len(derived.entries) == 3
    # In place: same memory, new contents (torch bumps its version counter; numpy is hashed).
    new = rng.standard_normal(ws[0].shape).astype(np.float32)
    if kind == "torch":
        w_in[0].copy_(torch.from_numpy(new))
    else:
        ws[0][...] = new
    y = jitops.conv2d(x_in, w_in[0], padding=1, schedule="winograd_4x4")
    assert rel_error(np.asarray(y), op.reference(problem, {"x": x, "w": new})["y"]) <= 1e-4


def test_eviction_keeps_results_right(emu, rng):
    engine.clear_prepared()
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    ws = [rng.standard_normal((6, 4, 3, 3)).astype(np.float32) for _ in range(5)]
    jitops.conv2d(x, ws[0], padding=1, schedule="winograd_2x2")
    derived = _prepared("winograd_2x2").derived
    derived.max_entries = 2
    problem = op.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec(ws[0].shape, "float32")},
                              {"padding": 1})
    for w in ws + ws[::-1]:
        y = jitops.conv2d(x, w, padding=1, schedule="winograd_2x2")
        assert rel_error(y, op.reference(problem, {"x": x, "w": w})["y"]) <= 1e-5
    assert len(derived.entries) <= 2


def test_freed_weight_memory_reused_by_a_new_tensor_is_transformed_again(emu, rng):
    """A new tensor at a freed tensor's address, with a fresh version counter, is not the old weight."""
    torch = pytest.importorskip("torch")
    engine.clear_prepared()
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    problem = op.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec((6, 4, 3, 3), "float32")},
                              {"padding": 1})
    memory = np.empty((6, 4, 3, 3), dtype=np.float32)      # one buffer, two tensors over it in turn
    for _ in range(3):
        memory[...] = rng.standard_normal(memory.shape)
        w = torch.from_numpy(memory)
        assert w._version == 0
        y = jitops.conv2d(torch.from_numpy(x), w, padding=1, schedule="winograd_2x2")
        assert rel_error(y.numpy(), op.reference(problem, {"x": x, "w": memory.copy()})["y"]) <= 1e-5
        del w, y


class _Recorder:
    """A backend that allocates nothing and records the streams it is asked to synchronize (and the
    frees); `captured` holds the streams being captured into a CUDA graph."""

    def __init__(self, syncs: list, frees: list | None = None):
        self.syncs, self.frees, self.captured = syncs, frees if frees is not None else [], set()

    def alloc(self, n): return 1
    def free(self, p): self.frees.append(p)
    def memset(self, *a): pass
    def synchronize(self, stream=0): self.syncs.append(stream)
    def capturing(self, stream=0): return stream in self.captured


def test_stale_stream_of_a_scratch_entry_is_not_waited_on(emu, rng):
    """ORT destroys a session's stream with the session: a later user on another stream must not
    synchronize the dead one (it costs a device-wide synchronize instead)."""
    from jitops.derived import DerivedCache
    from jitops.ops.base import Workspace

    calls = []
    cache = DerivedCache([Workspace("t", 64, derived_from=("w",))], _Recorder(calls))
    cache.get(None, stream=111)
    cache.get(None, stream=222)
    cache.get(("id",), stream=111)
    cache.get(("id",), stream=333)
    assert calls == [0, 0]


def test_a_stage_of_many_same_shape_layers_keeps_every_weight():
    """RegNetY-1.6GF has 34 convs of one shape: each keeps its derived copy (no eviction, so no
    device synchronize on the way: a synchronize ends a CUDA-graph capture)."""
    from jitops.derived import DerivedCache
    from jitops.ops.base import Workspace

    syncs = []
    cache = DerivedCache([Workspace("packed_w", 225792, derived_from=("w",))], _Recorder(syncs))
    for rounds in range(3):
        fresh = [cache.get(("w", k), stream=7)[1] for k in range(64)]
        assert all(fresh) if rounds == 0 else not any(fresh)
    assert syncs == [] and len(cache.entries) == 64


def test_no_synchronize_or_free_inside_a_graph_capture(caplog):
    """Past the byte budget inside a capture the cache grows (one warning) instead of evicting: a
    synchronize or a free would end the capture. The first miss after it evicts back to the budget;
    a stream hand-over seen inside it is waited for at the next use outside."""
    from jitops.derived import DerivedCache
    from jitops.ops.base import Workspace

    syncs, frees = [], []
    backend = _Recorder(syncs, frees)
    cache = DerivedCache([Workspace("t", 100, derived_from=("w",))], backend, max_bytes=300)
    for k in range(3):
        cache.get(("w", k), stream=5)
    backend.captured.add(7)
    with caplog.at_level("WARNING", logger="jitops.derived"):
        for k in range(3, 6):
            assert cache.get(("w", k), stream=7)[1]
        assert not cache.get(("w", 0), stream=7)[1]          # filled on stream 5, used in the capture
    assert syncs == [] and frees == [] and cache.bytes == 600 and len(cache.entries) == 6
    assert sum("CUDA-graph capture" in r.message for r in caplog.records) == 1
    backend.captured.clear()
    cache.get(("w", 0), stream=7)                             # outside: the hand-over is waited for now
    assert syncs == [0]
    cache.get(("w", 6), stream=7)                             # a miss: back under the budget
    assert syncs == [0, 0] and cache.bytes <= 300 and len(frees) == 4 and ("w", 6) in cache.entries


def test_backends_report_stream_capture_from_the_driver(monkeypatch):
    """capturing(): the driver's capture status of the stream (active or invalidated: True), and True
    for the implicit-capture error (the legacy stream while another stream captures globally),
    where a synchronize or a free would end the capture; any other error raises. CUDA through
    cuStreamIsCapturing, HIP through hip-python's hipStreamIsCapturing (fakes of both)."""
    import ctypes
    from jitops.errors import LaunchError
    from jitops.runtime import cuda_backend, cuda_driver
    from jitops.runtime.hip_backend import HipBackend

    answers = {}

    class FakeLibcuda:
        def cuStreamIsCapturing(self, stream, status):
            code, value = answers[stream]
            ctypes.cast(status, ctypes.POINTER(ctypes.c_int))[0] = value
            return code

        def cuGetErrorName(self, code, out):       # the error's name and text: left empty
            return 0

        cuGetErrorString = cuGetErrorName

    monkeypatch.setattr(cuda_driver, "libcuda", lambda: FakeLibcuda())
    cuda = object.__new__(cuda_backend.CudaBackend)
    answers.update({1: (0, 0), 2: (0, 1), 3: (0, 2), 4: (cuda_driver.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 0), 5: (1, 0)})
    assert [cuda.capturing(s) for s in (1, 2, 3, 4)] == [False, True, True, True]
    with pytest.raises(LaunchError, match="cuStreamIsCapturing failed: CUDA_ERROR_1"):
        cuda.capturing(5)

    class FakeHip:
        def hipStreamIsCapturing(self, stream):
            return answers[stream]

        def hipGetErrorString(self, err):
            return b"invalid value"

    hip = object.__new__(HipBackend)
    hip.hip = FakeHip()
    assert [hip.capturing(s) for s in (1, 2, 3, 4)] == [False, True, True, True]
    with pytest.raises(LaunchError, match="hipStreamIsCapturing failed: invalid value"):
        hip.capturing(5)
