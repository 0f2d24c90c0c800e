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
