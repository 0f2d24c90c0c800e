"""jitops: JIT kernel generation for deep-learning operators on AMD and NVIDIA GPUs.

    import jitops, numpy as np
    y = jitops.leaky_relu(np.random.randn(1 << 20).astype("float32"), alpha=0.1)

The scheduler picks an algorithm per shape and device, renders HIP C++ from Jinja templates,
compiles it at run time (NVRTC, hiprtc, or the host compiler for the CPU emulator), caches the
binary on disk and launches it on the caller's arrays and stream.
"""
from __future__ import annotations

import logging

from ._version import __version__
from .api import attention, batch_norm, conv2d, group_norm, layer_norm, leaky_relu, rms_norm
from .device import DeviceInfo
from .device_array import DeviceArray, empty, to_device
from .errors import (ArgumentError, BackendUnavailable, CompileError, DeviceRequired, EmulatorFault, JitopsError,
                     LaunchError, ScheduleError)
from .ops.base import Schedule
from .runtime import get_backend, use_backend

logging.getLogger("jitops").addHandler(logging.NullHandler())

__all__ = [
    "__version__", "leaky_relu", "conv2d", "attention", "batch_norm", "group_norm", "layer_norm", "rms_norm",
    "get_backend", "use_backend", "DeviceInfo", "DeviceArray", "empty", "to_device", "Schedule",
    "JitopsError", "ArgumentError", "BackendUnavailable", "CompileError", "DeviceRequired", "EmulatorFault",
    "LaunchError", "ScheduleError",
]
