"""Arrays that are not 16-byte aligned (views at an offset into their storage) on the emulator built
with the alignment check: there a misaligned vector access traps as it faults on a GPU (plain x86
performs it, or faults with no address), so these tests fail where a kernel would get such a pointer.

What is checked: every op family with vector accesses gives the float64 reference's result for each
moved input and `out=` (host arrays a kernel cannot take are staged through aligned memory, as on a
GPU); the same on the repeat paths (Python and native); device arrays and raw pointers (ONNX
Runtime's path) that a kernel cannot take are refused with an ArgumentError naming the argument,
before anything is launched; and without the plans' declared alignment the kernels do trap."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jitops
from jitops import arrays, engine
from jitops.errors import ArgumentError, EmulatorFault
from jitops.ops.base import TensorSpec
from jitops.runtime import use_backend
from jitops.runtime.cpu_backend import CpuBackend

from alignment_cases import CASES, check, moved, torch  # noqa: E402  (skips the module without torch)

BY_NAME = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def align_backend():
    """The checked emulator, alignment check on, matrix-core fragments in software (so the
    matrix-core conv2d kernels run)."""
    be = CpuBackend(warp_size=32, checked=True, check_alignment=True)
    be.device = dataclasses.replace(be.device, matrix_cores=True)
    yield be
    engine.clear_prepared()


@pytest.fixture
def align_emu(align_backend):
    with use_backend(align_backend):
        yield align_backend


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_moved_arrays_give_the_reference(align_emu, case):
    """Each input and output in turn one element off 16-byte alignment: the reference's result. The
    first (aligned) call binds the repeat path, so the later ones go through its check too."""
    assert check(case, "cpu", case.emulator_schedule) == []


def test_without_declared_alignment_the_kernels_trap(align_emu):
    """What the engine's check prevents: the same moved output handed to the kernels as it is."""
    case = BY_NAME["conv2d_depthwise_nhwc"]
    t = case.inputs("cpu")
    y = case.call(t, schedule=case.emulator_schedule)
    found = [p for k, p in engine._cache.by_call.items() if k[0] == "conv2d" and k[1] == id(align_emu)
             and p.schedule == case.emulator_schedule and p.problem.layout == "nhwc"]
    assert len(found) == 1 and found[0].alignment["y"][0] == 16
    found[0].alignment = {}
    with pytest.raises(EmulatorFault, match="conv2d_depthwise: misaligned access"):
        case.call(t, out=moved(torch.empty_like(y)), schedule=case.emulator_schedule)


def _depthwise_specs(dtype: str = "float16") -> dict:
    return {"x": TensorSpec((1, 16, 6, 6), dtype, "nhwc"), "w": TensorSpec((16, 1, 3, 3), dtype),
            "bias": None, "residual": None}


def _buffers(specs: dict, out_nbytes: int, shift: dict[str, int]) -> tuple[dict, list]:
    """Host buffers for raw pointers, 64-byte aligned plus `shift` bytes; (pointers, keep-alive)."""
    keep, ptrs = [], {}
    sizes = {n: s.nbytes for n, s in specs.items() if s is not None}
    sizes["y"] = out_nbytes
    for name, nbytes in sizes.items():
        buf = np.zeros(nbytes + 128, np.uint8)
        keep.append(buf)
        ptrs[name] = buf.ctypes.data + (-buf.ctypes.data % 64) + shift.get(name, 0)
    return ptrs, keep


@pytest.mark.parametrize("moved_name", ["x", "y"])
def test_raw_pointers_are_refused_naming_the_buffer(align_emu, moved_name):
    """run_pointers (ONNX Runtime's CUDA / ROCm path) cannot stage raw pointers: a clear error."""
    specs = _depthwise_specs()
    ptrs, keep = _buffers(specs, 16 * 36 * 2, {moved_name: 2})
    with pytest.raises(ArgumentError) as info:
        engine.run_pointers("conv2d", {n: (ptrs[n], s) if s else None for n, s in specs.items()},
                            {"padding": 1, "groups": 16}, {"y": ptrs["y"]}, 0, schedule="depthwise")
    msg = str(info.value)
    assert info.value.argument == moved_name
    assert "conv2d: argument" in msg and "aligned to 16 bytes" in msg and "2 bytes past" in msg, msg
    ptrs, keep = _buffers(specs, 16 * 36 * 2, {})
    engine.run_pointers("conv2d", {n: (ptrs[n], s) if s else None for n, s in specs.items()},
                        {"padding": 1, "groups": 16}, {"y": ptrs["y"]}, 0, schedule="depthwise")


def test_raw_pointers_to_kernels_with_an_unaligned_path_run(align_emu):
    """leaky_relu's kernel branches on alignment itself: nothing is declared, nothing refused."""
    x = (np.arange(1001, dtype=np.float16) - 500) / 100
    buf = np.zeros(2 * 1001 + 64, np.uint8)
    start = -buf.ctypes.data % 16 + 2
    y = buf[start:start + 2 * 1001].view(np.float16)
    engine.run_pointers("leaky_relu", {"x": (x.ctypes.data, TensorSpec((1001,), "float16"))}, {"alpha": 0.1},
                        {"y": y.ctypes.data}, 0)
    np.testing.assert_array_equal(y, np.where(x > 0, x, (x.astype(np.float32) * np.float32(0.1)).astype(np.float16)))


def test_device_arrays_are_refused_before_any_launch(probe):
    """The general path's branch for device arrays (never staged), on the probe backend's recorded
    launches: the error names the argument, and nothing was launched."""
    case = BY_NAME["conv2d_depthwise_nhwc"]
    t = case.inputs("cpu")
    case.call(t)                                        # the heuristic's depthwise plan
    prepared = next(p for k, p in engine._cache.by_call.items() if k[0] == "conv2d" and k[1] == id(probe))
    assert prepared.schedule.algorithm == "depthwise" and prepared.alignment["y"][0] == 16
    refs = {n: arrays.wrap(v, n, "conv2d", "") for n, v in {**t, "residual": moved(t["residual"])}.items()
            if v is not None}
    calls = probe.native.probe_last(0)[0]
    with pytest.raises(ArgumentError, match=r"argument 'residual': expected a data pointer aligned to 16 bytes"):
        engine._execute(prepared, refs, False, probe, None)       # host=False: as a device array
    assert probe.native.probe_last(0)[0] == calls


def test_native_repeat_call_hands_moved_inputs_to_the_general_path(probe):
    """An earlier call's native repeat path (RepeatCall) declines a moved input (the Dispatch
    misses); the general path stages it: the kernel gets an aligned copy, not the view."""
    case = BY_NAME["conv2d_depthwise_nhwc"]
    t = case.inputs("cpu")
    attrs = (1, 1, 1, 16, "relu", 0.01, None)            # stride, padding, dilation, groups, ...
    case.call(t)
    dispatch = engine._cache.dispatch["conv2d"]
    assert len(dispatch) == 1
    values = (t["x"], t["w"], t["bias"], t["residual"])
    assert dispatch(probe, values, attrs) is not engine.MISS
    assert _launched_x(probe) == t["x"].data_ptr()
    x = moved(t["x"])
    assert dispatch(probe, (x, *values[1:]), attrs) is engine.MISS
    case.call({**t, "x": x})
    assert _launched_x(probe) % 16 == 0 and _launched_x(probe) != x.data_ptr()


def _launched_x(probe) -> int:
    """x's pointer in the last recorded launch (the depthwise kernel's first argument)."""
    return probe.native.probe_last(1)[-1][0]


def test_host_arrays_repeat_calls_stage_moved_arrays(align_emu):
    """numpy arrays on the emulator: the bound repeat call (made by the first, aligned, call) takes
    a moved residual to the general path, which stages it (NCHW depthwise rows as vectors)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 6, 16)).astype(np.float16)
    w = (rng.standard_normal((16, 1, 3, 3)) / 3).astype(np.float16)
    r = rng.standard_normal((1, 16, 6, 16)).astype(np.float16)
    ref = jitops.conv2d(x, w, padding=1, groups=16, residual=r, schedule="naive")
    for _ in range(2):
        np.testing.assert_allclose(jitops.conv2d(x, w, padding=1, groups=16, residual=r), ref, rtol=2e-3, atol=2e-3)
    bound = [b for k, b in engine._cache.bound.items() if b and k[0] == "conv2d" and k[1] is align_emu]
    assert len(bound) == 2 and all(b.prepared.alignment for b in bound if b.prepared.schedule.algorithm != "naive")
    buf = np.empty(r.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 16 + 2
    rm = buf[start:start + r.nbytes].view(np.float16).reshape(r.shape)
    rm[...] = r
    assert rm.ctypes.data % 16 == 2
    np.testing.assert_allclose(jitops.conv2d(x, w, padding=1, groups=16, residual=rm), ref, rtol=2e-3, atol=2e-3)


def _declared(problem, schedule, device) -> dict[str, int]:
    from jitops.ops import get_op
    from jitops.prepared import required_alignment
    plan = get_op("conv2d").plan(problem, schedule, device)
    return {n: need for n, (need, _) in required_alignment(problem, plan).items()}


def test_hopper_wgmma_plans_declare_their_vectors():
    """The sm_90 kernels the emulator cannot run (wgmma), by their plans: x read in place by 16-byte
    cp.async chunks (NHWC) or 2 x CHUNK bytes of pixels (the NCHW 1x1 kernel), y and residual by
    16-byte epilogue stores (8-byte halves where H * W % 8 == 4), bias in the NHWC epilogue."""
    from jitops.device import KNOWN_TARGETS
    from jitops.ops.conv2d import make_problem
    from jitops.ops.conv2d_wgmma import schedule
    dev = KNOWN_TARGETS["sm_90"]

    def problem(layout: str, hw: int, k: int) -> object:
        x = (2, 64, hw, hw)
        return make_problem({"x": TensorSpec(x, "float16", layout), "w": TensorSpec((64, 64, k, k), "float16"),
                             "bias": TensorSpec((64,), "float16"), "residual": TensorSpec(x, "float16", layout)},
                            {"padding": k // 2, "activation": "relu"})
    every = {"x": 16, "bias": 16, "residual": 16, "y": 16}
    assert _declared(problem("nhwc", 8, 3), schedule(128, 128, 4, 0), dev) == every
    assert _declared(problem("nhwc", 8, 3), schedule(128, 128, 3, 0, persistent=True), dev) == every
    assert _declared(problem("", 8, 3), schedule(128, 128, 4, 0), dev) == {"residual": 16, "y": 16}   # x copied
    assert _declared(problem("", 6, 3), schedule(128, 128, 4, 0), dev) == {}      # 36 pixels: scalar stores
    assert _declared(problem("", 8, 1), schedule(128, 64, 4, 0, b_nchw=True), dev) == {"x": 16, "residual": 16, "y": 16}
    assert _declared(problem("", 6, 1), schedule(128, 64, 4, 0, b_nchw=True), dev) == {"x": 8, "residual": 8, "y": 8}
    split = _declared(problem("nhwc", 8, 3), schedule(128, 128, 4, 0, split_k=2), dev)
    assert split == {"x": 16}                   # the split-K reduction stores y one element at a time


def test_cases_cover_the_refusing_kernels():
    """Every conv2d kernel that declares an alignment has a case here (and in the GPU test)."""
    assert {c.name for c in CASES if c.may_refuse} >= {"conv2d_depthwise_nchw", "conv2d_depthwise_nhwc",
                                                        "conv2d_stem_nhwc", "conv2d_mma_nhwc", "conv2d_mma_nchw_1x1"}
