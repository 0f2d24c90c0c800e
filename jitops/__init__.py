"""jitops: JIT kernel generation for deep-learning operators on AMD and NVIDIA GPUs.

    import jitops, numpy as np
    y = jitops.leaky_relu(np.random.randn(1 << 20).astype("float32"), alpha=0.1)

The scheduler picks an algorithm per shape and device, renders HIP C++ from Jinja templates,
compiles it at run time (NVRTC, hiprtc, or the host compiler for the CPU emulator), caches the
binary on disk and launches it on the caller's arrays and stream.
"""
from __future__ import annotations

import logging
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING, Any as _Any

# Before the imports below: importing api loads the native launcher, which may already warn.
logging.getLogger("jitops").addHandler(logging.NullHandler())

from ._version import __version__  # noqa: E402
from .bundle import Bundle, BundleMismatch, load_bundle
from .api import attention, batch_norm, conv2d, group_norm, layer_norm, leaky_relu, rms_norm
from .api import get_fp32_precision, set_fp32_precision
from .device import DeviceInfo
from .device_array import DeviceArray, empty, to_device
from .errors import (ArgumentError, BackendUnavailable, CompileError, DeviceRequired, EmulatorFault, JitopsError,
                     LaunchError, RenderError, ScheduleError)
from .ops.base import Schedule
from .runtime import get_backend, use_backend

if TYPE_CHECKING:
    from .tuning import TuneResult


def tune(op: "str | _ModuleType", problem: "_Any" = None, **kwargs: "_Any") -> "TuneResult":
    """Tune one op problem on this device and record the winner; see jitops.tuning.tune."""
    from .tuning import tune as _tune
    return _tune(op, problem, **kwargs)


def set_benchmark(enabled: bool | int = True) -> None:
    """Benchmark mode, as torch.backends.cudnn.benchmark: a problem's first call (with no tuning record)
    times the op's best-rated schedules (True: 6; or this many) and keeps the fastest as a user record.
    Off by default; JITOPS_BENCHMARK=1 turns it on too. See jitops.tuning.benchmark."""
    from .config import set_benchmark as _set
    _set(enabled)


def set_programmatic_launch(enabled: bool | None = True) -> None:
    """Programmatic dependent launch (CUDA, sm_90+): conv2d's Hopper kernels start before the stream's
    previous kernel ends, set up while it finishes and wait for it on the device. It pays after a kernel
    that lets them start early (jitops' own): ResNet-50 b32's convolutions chained 2-3% faster on an H200,
    the folded network 1.9%; after other libraries' kernels it cost 1.3% (docs/performance.md). None
    (auto, the default): only inside CUDA-graph captures, where the launch's predecessor is known to be
    such a kernel; True: every launch (eager chains of jitops ops); False: never.
    JITOPS_PROGRAMMATIC_LAUNCH=auto|1|0 sets the same. Plans prepared before are bound again."""
    from .config import set_programmatic_launch as _set
    from .engine import clear_prepared
    _set(enabled)
    clear_prepared()

__all__ = [
    "__version__", "leaky_relu", "conv2d", "attention", "batch_norm", "group_norm", "layer_norm", "rms_norm",
    "get_backend", "use_backend", "DeviceInfo", "DeviceArray", "empty", "to_device", "Schedule",
    "JitopsError", "ArgumentError", "BackendUnavailable", "CompileError", "DeviceRequired", "EmulatorFault",
    "LaunchError", "RenderError", "ScheduleError", "tune", "set_benchmark", "set_programmatic_launch", "load_bundle", "Bundle", "BundleMismatch",
    "set_fp32_precision", "get_fp32_precision",
]

if __import__("os").environ.get("JITOPS_BUNDLE"):   # JITOPS_BUNDLE=DIR: load a compiled bundle now
    from .bundle import load_from_env as _load_bundle_from_env
    _load_bundle_from_env()
