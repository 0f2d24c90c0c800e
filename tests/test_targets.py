"""Every template variant renders and compiles offline: NVRTC for sm_80 and sm_90, hiprtc for
gfx90a, and the host compiler for the emulator. No GPU is needed for any of this."""
from __future__ import annotations

import pytest

from jitops import engine
from jitops.errors import BackendUnavailable
from jitops.ops import get_op, op_names
from jitops.runtime import get_backend

TARGETS = ["sm_80", "sm_90", "gfx90a"]


def _backend_or_skip(target: str):
    try:
        return get_backend(target=target)
    except BackendUnavailable as exc:
        if target.startswith("gfx"):
            pytest.skip(f"hiprtc not installed here: {exc}")   # CI installs it; see .ci/run
        raise


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op_name", op_names())
def test_variants_compile_offline(op_name, target):
    backend = _backend_or_skip(target)
    assert not backend.can_launch
    op = get_op(op_name)
    seen = set()
    for problem, schedule in op.variants(backend.device):
        _, _, kernels = engine.compile_problem(op_name, problem, backend, schedule)
        for k in kernels:
            assert k.binary_bytes > 0
            seen.add(k.key)
    assert seen, f"{op_name} has no variants"


@pytest.mark.parametrize("op_name", op_names())
def test_variants_compile_for_emulator(op_name):
    backend = get_backend("cpu", warp_size=64)
    op = get_op(op_name)
    for problem, schedule in op.variants(backend.device):
        _, _, kernels = engine.compile_problem(op_name, problem, backend, schedule)
        assert all(k.binary_bytes > 0 for k in kernels)


def test_sm90_vector_loads_are_16_bytes():
    """The vectorized leaky_relu must use 128-bit global accesses (read the PTX, no GPU needed)."""
    from jitops.ops.base import Schedule, TensorSpec
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    op = get_op("leaky_relu")
    backend = get_backend(target="sm_90")
    p = op.make_problem({"x": TensorSpec((1 << 20,), "float32")}, {"alpha": 0.1})
    launch = op.plan(p, Schedule.make("vectorized", vec=4, unroll=4, block=256, waves=0), backend.device).launches[0]
    source = engine.kernel_source(backend.device, launch)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    opts = [b"-arch=compute_90", b"-std=c++17", b"-default-device"]
    assert int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) == 0
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    ptx = buf.decode()
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx
    assert "st.global.v4.f32" in ptx
