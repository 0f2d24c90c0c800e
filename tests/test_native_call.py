"""The native repeat-call path (runtime/native/jitops_launch.c: FastCall, Dispatch) on the probe
backend: kernels compile and load like the emulator's, launches are recorded, nothing runs. What
is checked: each repeat call launches with its own arrays' pointers and the plan's scalars; a call
whose signature differs takes the general path (and its errors); every public function finds its
repeat path (every one whose plans have no derived data); launch failures raise; clear_prepared
forgets the native calls."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import jitops
from jitops import engine
from jitops.errors import ArgumentError, LaunchError
from jitops.ops import get_op
from jitops.runtime import use_backend

torch = pytest.importorskip("torch")


@pytest.fixture
def probe():
    from jitops.runtime.probe_backend import ProbeBackend
    backend = ProbeBackend()
    engine.clear_prepared()
    with use_backend(backend):
        yield backend
    backend.native.probe_set_status(0)
    engine.clear_prepared()


def last_launch(backend, nargs):
    calls, kernel, grid, block, shared, stream, values = backend.native.probe_last(nargs)
    return calls, grid, block, values


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def test_repeat_calls_launch_with_their_own_pointers(probe):
    xs = [torch.randn(4096) for _ in range(3)]
    jitops.leaky_relu(xs[0], 0.25)                       # general path, binds
    bound = next(b for k, b in engine._cache.bound.items() if b and k[1] is probe)
    assert bound.native is not None and len(engine._cache.dispatch["leaky_relu"]) == 1
    outs = []
    for x in xs:
        before = last_launch(probe, 4)[0]
        y = jitops.leaky_relu(x, 0.25)
        calls, grid, block, values = last_launch(probe, 4)
        assert calls == before + 1
        assert values[0] == x.data_ptr() and values[1] == y.data_ptr()
        assert values[2] == 4096 and f32(values[3]) == pytest.approx(0.25)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert y.data_ptr() not in [o.data_ptr() for o in outs]      # a fresh output every call
        outs.append(y)


def test_other_signatures_take_the_general_path(probe):
    x = torch.randn(64, 32)
    jitops.leaky_relu(x, 0.1)
    jitops.leaky_relu(torch.randn(64, 33), 0.1)         # another shape: another bound call
    jitops.leaky_relu(x.half(), 0.1)                     # another dtype
    jitops.leaky_relu(x, 0.5)                            # another attribute
    assert len(engine._cache.dispatch["leaky_relu"]) == 4
    y = jitops.leaky_relu(x, 0.5)
    assert f32(last_launch(probe, 4)[3][3]) == pytest.approx(0.5)
    assert last_launch(probe, 4)[3][1] == y.data_ptr()
    with pytest.raises(ArgumentError, match="contiguous"):
        jitops.leaky_relu(x.t(), 0.1)                    # same shape class, strided: refused, not launched
    with pytest.raises(ArgumentError):
        jitops.leaky_relu(x.to(torch.int32), 0.1)


CASES = {
    "leaky_relu": lambda t: ((t(4, 100),), dict(alpha=0.2)),
    # depthwise: the direct kernel, no derived weights (plans with derived data keep the Python path)
    "conv2d": lambda t: ((t(1, 8, 12, 12), t(8, 1, 3, 3), t(8)), dict(groups=8, padding=1, activation="relu")),
    "attention": lambda t: ((t(2, 16, 32), t(2, 16, 32), t(2, 16, 32)), dict(causal=True)),
    "group_norm": lambda t: ((t(2, 8, 5, 5), 4, t(8), t(8)), dict(eps=1e-3)),
    "layer_norm": lambda t: ((t(6, 64), 64, t(64), t(64)), dict(eps=1e-3)),
    "rms_norm": lambda t: ((t(6, 64), 64, t(64)), dict(eps=1e-3)),
}


# batch_norm is missing on purpose: its plans fold the statistics into derived data, and plans
# with derived data (also conv2d with packed or Winograd weights) keep the Python repeat path.
@pytest.mark.parametrize("op_name", list(CASES))
def test_every_public_function_finds_its_repeat_path(probe, monkeypatch, op_name):
    """The tuples each public function passes to repeat_call must list inputs and attributes in
    the order engine.run registered them; a mismatch would silently cost the slow path."""
    args, kwargs = CASES[op_name](lambda *shape: torch.randn(*shape))
    fn = getattr(jitops, op_name)
    fn(*args, **kwargs)
    assert len(engine._cache.dispatch.get(op_name, ())) == 1, "no native repeat path for this problem"

    def no_general_path(*a, **k):
        raise AssertionError("engine.run called: the repeat path did not match")

    monkeypatch.setattr(engine, "run", no_general_path)
    before = last_launch(probe, 1)[0]
    y = fn(*args, **kwargs)
    assert last_launch(probe, 1)[0] > before and isinstance(y, torch.Tensor)


def test_launch_failure_raises_and_recovers(probe):
    x = torch.randn(1000)
    jitops.leaky_relu(x)
    probe.native.probe_set_status(719)
    with pytest.raises(LaunchError, match="719"):
        jitops.leaky_relu(x)
    probe.native.probe_set_status(0)
    assert jitops.leaky_relu(x).shape == x.shape


def test_clear_prepared_forgets_native_calls(probe, monkeypatch):
    x = torch.randn(1000)
    jitops.leaky_relu(x)
    engine.clear_prepared()
    assert not engine._cache.dispatch
    seen = []
    real = engine._run_general
    monkeypatch.setattr(engine, "_run_general", lambda *a, **k: seen.append(1) or real(*a, **k))
    jitops.leaky_relu(x)
    assert seen == [1]


def test_emulator_results_unchanged_by_the_probe(emu):
    """The emulator never takes the native path (it reads buffer sizes); results still match."""
    x = torch.randn(300)
    for _ in range(2):
        y = jitops.leaky_relu(x, 0.3)
        np.testing.assert_allclose(y.numpy(), np.where(x > 0, x, 0.3 * x), rtol=1e-6)
    assert "leaky_relu" not in engine._cache.dispatch
    assert get_op("leaky_relu") is not None
