"""Every template variant renders and compiles offline: NVRTC for sm_80 and sm_90, hiprtc for
gfx90a, and the host compiler for the emulator. No GPU is needed for any of this."""
from __future__ import annotations

import pytest

from jitops import engine
from jitops.errors import BackendUnavailable
from jitops.ops import get_op, op_names
from jitops.runtime import get_backend

from conftest import nvrtc_ptx

TARGETS = ["sm_80", "sm_90", "gfx90a", "gfx942"]


def _backend_or_skip(target: str):
    try:
        return get_backend(target=target)
    except BackendUnavailable as exc:
        if target.startswith("gfx"):
            pytest.skip(f"no HIP compiler for {target} here: {exc}")   # CI installs them; see scripts/setup.sh
        raise


def representatives(variants: list, target: str) -> list:
    """Every variant, except for gfx942: one per template family (algorithm). gfx942 takes the same HIP
    source and wave64 logic as gfx90a, whose hiprtc compile covers every branch; its clang compile costs
    about 1.3 s a kernel on a 2-core CI machine (200 s for every variant, 2026-11-29)."""
    if target != "gfx942":
        return variants
    firsts: dict = {}
    for problem, schedule in variants:
        firsts.setdefault(schedule.algorithm, (problem, schedule))
    return list(firsts.values())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op_name", op_names())
def test_variants_compile_offline(op_name, target):
    backend = _backend_or_skip(target)
    assert not backend.can_launch
    op = get_op(op_name)
    seen = set()
    for problem, schedule in representatives(op.variants(backend.device), target):
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
    pytest.importorskip("cuda.bindings.nvrtc")
    op = get_op("leaky_relu")
    backend = get_backend(target="sm_90")
    p = op.make_problem({"x": TensorSpec((1 << 20,), "float32")}, {"alpha": 0.1})
    launch = op.plan(p, Schedule.make("vectorized", vec=4, unroll=4, block=256, waves=0), backend.device).launches[0]
    source = engine.kernel_source(backend.device, launch)
    ptx, _ = nvrtc_ptx(source, b"-arch=compute_90", b"-std=c++17", b"-default-device")
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx
    assert "st.global.v4.f32" in ptx


@pytest.mark.parametrize("target", ["gfx90a", "gfx942"])
def test_hip_code_objects_name_their_target(target):
    """A real AMDGPU code object for the requested ISA (hiprtc for gfx90a, clang for gfx942)."""
    from jitops.ops.base import TensorSpec
    backend = _backend_or_skip(target)
    op = get_op("leaky_relu")
    p = op.make_problem({"x": TensorSpec((4096,), "float16")}, {"alpha": 0.1})
    _, _, kernels = engine.compile_problem("leaky_relu", p, backend)
    from jitops.cache import loader
    binary = loader().disk.get(kernels[0].key)
    assert binary[:4] == b"\x7fELF"
    assert f"amdgcn-amd-amdhsa--{target}".encode() in binary
    assert b"leaky_relu_vectorized" in binary
