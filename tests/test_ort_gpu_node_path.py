"""The GPU-provider half of the jitops ORT kernels (kernels.compute with provider 1) on the probe
backend: kernels compile like the emulator's, launches are recorded, nothing runs. What is checked:
each call launches with that call's input and output pointers, whether compute takes its repeat
entry (the same input array as an earlier call) or works the call out again (new pointers, new
shapes, plans dropped since)."""
from __future__ import annotations

import ctypes

import pytest

from jitops import engine
from jitops.onnx import kernels as K
from jitops.onnx.native import JtTensor

pytest.importorskip("torch")   # the probe fixture's native launcher is built like the torch repeat path's


class FakeOrt:
    """jitops_ort_output: a new output buffer per call, as ORT's allocator may hand out."""

    def __init__(self):
        self.next, self.handed = 0x7F0000000000, []

    def jitops_ort_output(self, call, index, dims, ndim):
        self.next += 1 << 20
        self.handed.append((call, index, tuple(dims[:ndim])))
        return self.next


_alive = []


def tensors(ptrs, shapes, elem=10):
    """The input array as ORT's callback passes it: a pointer to JtTensor records."""
    arr = (JtTensor * len(shapes))()
    for t, p, shape in zip(arr, ptrs, shapes):
        t.data, t.ndim, t.elem_type = p, len(shape), elem
        for i, d in enumerate(shape):
            t.dims[i] = d
    _alive[:] = [arr]
    return ctypes.cast(arr, ctypes.POINTER(JtTensor))


@pytest.fixture
def gpu_node(probe, monkeypatch):
    fake = FakeOrt()
    monkeypatch.setattr(K, "_backend_for", lambda provider: probe)
    monkeypatch.setattr(K, "_lib", fake)
    return probe, fake


def test_repeat_calls_launch_with_their_own_pointers(gpu_node):
    probe, ort = gpu_node
    kid = K.create("LayerNorm", 1, 10, '{"axis": -1, "epsilon": 1e-5}')
    try:
        shapes = [(4, 10, 96), (96,), (96,)]
        x, g, b = 0x100000000, 0x200000000, 0x300000000

        def run(ptrs, shp=shapes, call=7):
            K.compute(kid, call, 3, tensors(ptrs, shp), 0)
            calls, kernel, grid, block, shared, stream, values = probe.native.probe_last(6)
            return calls, values, ort.next

        c1, v1, y1 = run([x, g, b])
        assert K._kernels[kid].repeats, "the input array is remembered"
        c2, v2, y2 = run([x, g, b], call=8)                  # the repeat entry
        assert c2 == c1 + 1 and y2 != y1
        assert x in v2 and g in v2 and b in v2 and y2 in v2 and y1 not in v2
        assert ort.handed[-1] == (8, 0, (4, 10, 96))
        _, v3, y3 = run([x + 4096, g, b])                    # a new input buffer: worked out again
        assert x + 4096 in v3 and x not in v3 and y3 in v3
        _, v4, y4 = run([x, g, b], [(2, 10, 96), (96,), (96,)])   # new shapes: another plan
        assert ort.handed[-1][2] == (2, 10, 96) and y4 in v4
        engine.clear_prepared()                              # plans dropped: not served from the memo
        before = len(K._kernels[kid].runners)
        _, v5, y5 = run([x, g, b])
        assert y5 in v5 and x in v5
        assert all(r[2] == engine.generation() for r in K._kernels[kid].runners) and before >= 1
    finally:
        K.destroy(kid)


def test_a_full_memo_is_forgotten_not_grown(gpu_node):
    probe, _ = gpu_node
    kid = K.create("LeakyRelu", 1, 10, '{"alpha": 0.1}')
    try:
        for i in range(K.MAX_REPEATS + 3):
            K.compute(kid, i, 1, tensors([0x100000000 + 4096 * i], [(2, 64)]), 0)
            assert probe.native.probe_last(4)[-1][0] == 0x100000000 + 4096 * i
        assert 1 <= len(K._kernels[kid].repeats) <= K.MAX_REPEATS
    finally:
        K.destroy(kid)


def test_the_library_replays_a_call_with_its_own_arguments(gpu_node):
    """The replay the library keeps after a call worked out in Python (onnx/native/jitops_ort.cc):
    the same launch (function, grid, block, shared bytes, stream) with every argument as in that
    call and the new output buffer patched in, even after another node sharing the plan launched
    with other inputs. A convolution's packed filter (derived data) is kept only for initializer
    weights: a replay then, none for weights that may change; freed memory makes replays stale."""
    from jitops.onnx import native
    probe, ort = gpu_node
    lib = native.connect()          # the real library, built here; connecting binds it: the fake comes back
    K.bind_library(ort)
    kept = []
    ort.jitops_ort_replay_new = lib.jitops_ort_replay_new
    ort.jitops_ort_keep_replay = lambda call, replay: kept.append(replay) or 0
    a = K.create("LayerNorm", 1, 10, '{"axis": -1, "epsilon": 1e-5}')
    b = K.create("LayerNorm", 1, 10, '{"axis": -1, "epsilon": 1e-5}')
    conv_attrs = '"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1'
    conv = K.create("Conv2dRelu", 1, 10, '{' + conv_attrs + ', "__constant_inputs": [1, 2]}')
    conv_fed = K.create("Conv2dRelu", 1, 10, '{' + conv_attrs + '}')      # weights computed in the graph
    stale = []
    ort.jitops_ort_invalidate = lambda: stale.append(1)
    try:
        shapes = [(4, 10, 96), (96,), (96,)]
        K.compute(a, 7, 3, tensors([0x100000000, 0x200000000, 0x300000000], shapes), 0x5000)
        calls, kernel, grid, block, shared, stream, values = probe.native.probe_last(6)
        y = ort.next
        assert len(kept) == 1 and kept[0] and stream == 0x5000 and y in values
        K.compute(b, 8, 3, tensors([0x110000000, 0x210000000, 0x310000000], shapes), 0x5000)   # the same plan
        assert probe.native.probe_last(6)[-1][0] == 0x110000000
        out = (ctypes.c_void_p * 1)(0x7F00DEAD0000)
        assert lib.jitops_ort_replay_run(kept[0], 0x5000, out) == 0
        calls2, kernel2, grid2, block2, shared2, stream2, values2 = probe.native.probe_last(6)
        assert (calls2, kernel2, grid2, block2, shared2, stream2) == (calls + 2, kernel, grid, block, shared, 0x5000)
        assert values2 == [0x7F00DEAD0000 if v == y else v for v in values]
        probe.native.probe_set_status(700)                   # a failing launch: its status comes back
        assert lib.jitops_ort_replay_run(kept[0], 0x5000, out) == 700
        probe.native.probe_set_status(0)
        assert not lib.jitops_ort_replay_new(b"\x01\x00\x00\x00", 4)          # a malformed blob: refused
        conv_in = [(1, 16, 8, 8), (16, 16, 3, 3), (16,)]
        n = len(kept)
        K.compute(conv, 9, 3, tensors([0x100000000, 0x200000000, 0x300000000], conv_in), 0x5000)
        assert len(kept) == n + 1                             # initializer weights: packed once, replayable
        K.compute(conv_fed, 10, 3, tensors([0x100000000, 0x220000000, 0x300000000], conv_in), 0x5000)
        assert len(kept) == n + 1                             # packed again every call: no replay
        from jitops.runtime.fastlaunch import memory_released
        memory_released()
        assert stale                                          # the library was told
    finally:
        for kid in (a, b, conv, conv_fed):
            K.destroy(kid)
        for replay in kept:
            lib.jitops_ort_replay_free(replay)
