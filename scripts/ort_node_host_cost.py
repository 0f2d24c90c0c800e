"""Host work of one ORT GPU-provider node call (jitops.onnx.kernels.compute, provider 1), on any
machine: the probe backend stands in for the GPU (kernels compile like the emulator's, launches are
recorded, nothing runs) and a fake ORT hands out output buffers. Prints microseconds per call, best
of 5 x 2000 repeat calls with the same buffers (as ORT's arena gives a node run after run).

    python3 scripts/ort_node_host_cost.py
"""
from __future__ import annotations

import ctypes
import time

import jitops.onnx.kernels as kernels
from jitops.onnx.native import JtTensor
from jitops.runtime.probe_backend import ProbeBackend

CASES = {   # type, attributes, input shapes (fp16), constant (initializer) inputs
    "LayerNorm": ('{"axis": -1, "epsilon": 1e-5, "__constant_inputs": [1, 2]}', [(16, 197, 768), (768,), (768,)]),
    "LeakyRelu": ('{"alpha": 0.1}', [(1, 64, 56, 56)]),
    "Conv2dRelu": ('{"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1, '
                   '"__constant_inputs": [1, 2]}', [(1, 64, 56, 56), (64, 64, 3, 3), (64,)]),
}


class FakeOrt:
    def __init__(self) -> None:
        self.next = 0x7F0000000000

    def jitops_ort_output(self, call: int, index: int, dims: object, ndim: int) -> int:
        self.next += 1 << 20
        return self.next


def main() -> None:
    probe = ProbeBackend()
    kernels._backend_for = lambda provider: probe
    kernels.bind_library(FakeOrt())
    for name, (attrs, shapes) in CASES.items():
        kid = kernels.create(name, 1, 10, attrs)
        arr = (JtTensor * len(shapes))()
        for i, (t, shape) in enumerate(zip(arr, shapes)):
            t.data, t.ndim, t.elem_type = 0x100000000 * (i + 1), len(shape), 10
            for j, d in enumerate(shape):
                t.dims[j] = d
        inputs = ctypes.cast(arr, ctypes.POINTER(JtTensor))
        kernels.compute(kid, 0, len(shapes), inputs, 0)          # plan and compile
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                kernels.compute(kid, 0, len(shapes), inputs, 0)
            best = min(best, (time.perf_counter() - t0) / 2000 * 1e6)
        print(f"{name:<12} {best:6.2f} us per node call")
        kernels.destroy(kid)


if __name__ == "__main__":
    main()
