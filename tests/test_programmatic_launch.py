"""Programmatic dependent launch (CUDA sm_90+), without a GPU: the native launcher's entry that calls
cuLaunchKernelEx hands the driver cuda.h's CUlaunchConfig / CUlaunchAttribute and in auto mode carries the
attribute only inside a graph capture right after a kernel that lets it start early (checked with stand-ins
for the driver functions), the ctypes twins have the same layout, Launch.programmatic reaches the backend's
bind_launch, the switch is auto by default, and the conv2d wgmma kernels wait for the previous kernel
before their first global access. The device runs are tests/test_gpu_conv2d.py's chain test and
scripts/device_conv2d_programmatic.py."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

import jitops
from jitops import codegen, config, engine
from jitops.errors import ArgumentError
from jitops.ops import conv2d_wgmma as wg
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.runtime import cuda_driver as drv
from jitops.device import KNOWN_TARGETS
from jitops.runtime.fastlaunch import native_launcher

torch = pytest.importorskip("torch")

LAUNCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                             ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)
LAUNCH_EX_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(drv.LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p)


def test_ctypes_layouts_match_cuda_h():
    assert ctypes.sizeof(drv.LaunchAttribute) == 72          # id, 4 bytes padding, a 64-byte value union
    assert ctypes.sizeof(drv.LaunchConfig) == 56
    assert (drv.LaunchConfig.stream.offset, drv.LaunchConfig.attrs.offset, drv.LaunchConfig.count.offset) == (32, 40, 48)


CAPTURE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                              ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_void_p),
                              ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))
NODE_TYPE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
NODE_PARAMS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


class FakeDriver:
    """Stand-ins for the five driver entries the programmatic entry calls, recording what it was given."""

    def __init__(self):
        self.plain, self.ex = [], []
        self.capturing, self.deps, self.node_types, self.node_funcs = False, [], {}, {}
        self._deps_array = None

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            self.plain.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, params))
            return 0

        def launch_ex(cfg, f, params, extra):
            c = cfg.contents
            attr = c.attrs[0]
            self.ex.append({"grid": tuple(c.grid), "block": tuple(c.block), "shared": c.shared, "stream": c.stream,
                            "count": c.count, "attr": (attr.id, attr.value[0] & 0xFFFFFFFF), "f": f,
                            "params": params, "extra": extra})
            return 0

        def capture_info(stream, status, cid, graph, deps, ndeps):
            status[0] = 1 if self.capturing else 0
            self._deps_array = (ctypes.c_void_p * max(len(self.deps), 1))(*self.deps)
            deps[0] = ctypes.cast(self._deps_array, ctypes.c_void_p).value
            ndeps[0] = len(self.deps)
            return 0

        def node_type(node, out):
            out[0] = self.node_types.get(node, 0)
            return 0

        def node_params(node, out):
            out[0] = self.node_funcs.get(node, 0)
            return 0

        self.fns = (LAUNCH_FN(launch), LAUNCH_EX_FN(launch_ex), CAPTURE_FN(capture_info), NODE_TYPE_FN(node_type),
                    NODE_PARAMS_FN(node_params))

    def addresses(self):
        return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self.fns)


@pytest.fixture
def native():
    native = native_launcher()
    if native is None:
        pytest.skip("no native launcher (no host C compiler)")
    yield native
    native.programmatic_setup(0, 0, 0, 0, 0)
    native.programmatic_mode(1)


def test_native_entry_passes_the_launch_to_cuLaunchKernelEx(native):
    drv_ = FakeDriver()
    entry = LAUNCH_FN(native.programmatic_setup(*drv_.addresses()))
    native.programmatic_mode(2)                                  # always
    assert entry(0x1234, 7, 2, 1, 384, 1, 1, 200704, 0x5678, 0x9ABC, None) == 0
    assert drv_.plain == [] and drv_.ex == [
        {"grid": (7, 2, 1), "block": (384, 1, 1), "shared": 200704, "stream": 0x5678, "count": 1,
         "attr": (drv.ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1), "f": 0x1234, "params": 0x9ABC, "extra": None}]
    native.programmatic_setup(0, 0, 0, 0, 0)                    # without the driver's entries: refused
    assert entry(0x1234, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 801      # CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(ValueError):
        native.programmatic_mode(3)


def test_auto_mode_only_inside_a_capture_after_an_early_kernel(native):
    drv_ = FakeDriver()
    entry = LAUNCH_FN(native.programmatic_setup(*drv_.addresses()))
    native.programmatic_mode(1)
    native.programmatic_register(0xA000)                        # a kernel that lets dependents start early

    def launch():
        drv_.plain.clear()
        drv_.ex.clear()
        assert entry(0xB000, 1, 1, 1, 128, 1, 1, 0, 0x77, 0x88, None) == 0
        return "ex" if drv_.ex else "plain"

    assert launch() == "plain"                                   # eager: nothing known of the predecessor
    drv_.capturing = True
    drv_.deps, drv_.node_funcs = [0x51], {0x51: 0xA000}
    assert launch() == "ex"                                      # captured after an early kernel
    drv_.node_funcs = {0x51: 0xC000}
    assert launch() == "plain"                                   # after some other kernel
    drv_.node_funcs, drv_.node_types = {0x51: 0xA000}, {0x51: 3}
    assert launch() == "plain"                                   # after a node that is no kernel
    drv_.node_types = {}
    drv_.deps, drv_.node_funcs = [0x51, 0x52], {0x51: 0xA000, 0x52: 0xA000}
    assert launch() == "plain"                                   # joins two branches
    drv_.deps = []
    assert launch() == "plain"                                   # first in the capture
    native.programmatic_setup(drv_.addresses()[0], drv_.addresses()[1], 0, 0, 0)
    drv_.deps, drv_.node_funcs = [0x51], {0x51: 0xA000}
    assert launch() == "plain"                                   # a driver without the capture queries


def test_auto_by_default_and_switched(monkeypatch):
    monkeypatch.delenv(config.ENV_PROGRAMMATIC_LAUNCH, raising=False)
    monkeypatch.setattr(config, "_programmatic", [None])
    assert config.programmatic_launch_mode() == "auto"
    for raw, mode in (("1", "on"), ("off", "off"), ("auto", "auto"), ("sometimes", "auto")):
        monkeypatch.setenv(config.ENV_PROGRAMMATIC_LAUNCH, raw)
        assert config.programmatic_launch_mode() == mode
    for enabled, mode in ((False, "off"), (True, "on"), (None, "auto")):
        jitops.set_programmatic_launch(enabled)
        assert config.programmatic_launch_mode() == mode
    with pytest.raises(ArgumentError, match="enabled"):
        jitops.set_programmatic_launch("yes")


def test_launch_flag_reaches_bind_launch(probe, monkeypatch):
    op = get_op("leaky_relu")
    plain = op.plan

    def programmatic_plan(*args, **kwargs):
        plan = plain(*args, **kwargs)
        return dataclasses.replace(plan, launches=tuple(dataclasses.replace(la, programmatic=True)
                                                        for la in plan.launches))

    seen = []
    bind = type(probe).bind_launch

    def spy(self, kernel, grid, block, shared_bytes, programmatic=False):
        seen.append(programmatic)
        return bind(self, kernel, grid, block, shared_bytes, programmatic)

    monkeypatch.setattr(type(probe), "bind_launch", spy)
    engine.clear_prepared()
    jitops.leaky_relu(torch.randn(1000), 0.1)
    assert seen == [False]
    monkeypatch.setattr(op, "plan", programmatic_plan)
    engine.clear_prepared()
    jitops.leaky_relu(torch.randn(1000), 0.1)
    assert seen == [False, True]
    engine.clear_prepared()


@pytest.mark.parametrize("template", ["conv2d/wgmma_tma.hip.j2", "conv2d/wgmma.hip.j2"])
def test_conv_kernels_wait_before_their_first_global_access(template):
    op = get_op("conv2d")
    device = KNOWN_TARGETS["sm_90"]
    p = op.make_problem({"x": TensorSpec((8, 128, 28, 28), "float16", "nhwc"),
                         "w": TensorSpec((256, 128, 3, 3), "float16"), "bias": TensorSpec((256,), "float16")},
                        {"padding": 1})
    s = (wg.tma_schedule((128, 128, 4, 2, 0), 64, persistent=True) if template.endswith("tma.hip.j2")
         else wg.schedule(128, 128, 4, 0))
    launches = [la for la in op.plan(p, s, device).launches if la.template == template]
    assert launches and all(la.programmatic for la in launches)
    src = codegen.full_source(device, template, dict(launches[0].params))
    body = src[src.index("void " + launches[0].kernel):]
    wait = body.index("jt_wait_prior_grid();")
    first_access = min(i for i in (body.find(t) for t in ("jt_tma_load", "jt_copy16_async", "conv_tma_produce(", "x[",
                                                           "bias[", "residual[", "wp["))
                       if i >= 0)
    assert wait < first_access
    # the other ops' launches (pack, reductions) stay plain: they do not wait
    assert not any(la.programmatic for la in op.plan(p, s, device).launches if la.template != template)
