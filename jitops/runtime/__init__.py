"""Backend selection: an NVIDIA GPU -> cuda, else an AMD GPU -> hip, else the CPU emulator.

CUDA is tried first because its probe is cheap (a driver call) while hip-python's import is not;
a machine with GPUs of both vendors picks NVIDIA unless JITOPS_BACKEND says otherwise.

`JITOPS_BACKEND` overrides the automatic choice. `get_backend(name, target=...)` with an explicit
target arch gives a compile-only backend that works with no device present.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Iterator

from .. import config
from ..device import KNOWN_TARGETS, backend_of_target
from ..errors import BackendUnavailable
from .base import Backend, Kernel, PackedArgs

log = logging.getLogger("jitops.runtime")

BACKENDS = ("cuda", "hip", "cpu")
_instances: dict[tuple, Backend] = {}
_lock = threading.Lock()
_local = threading.local()


def _create(name: str, target: str | None, options: dict[str, Any]) -> Backend:
    if name == "cuda":
        from .cuda_backend import CudaBackend
        return CudaBackend(target=target, **options)
    if name == "hip":
        from .hip_backend import HipBackend
        return HipBackend(target=target, **options)
    if name == "cpu":
        if target not in (None, "cpu"):
            raise BackendUnavailable(f"cpu backend has no target '{target}'")
        from .cpu_backend import CpuBackend
        return CpuBackend(**options)
    raise BackendUnavailable(f"unknown backend '{name}': expected one of {', '.join(BACKENDS)}")


def _detect() -> str:
    """The backend for the GPU in this machine, or 'cpu'."""
    for name in ("cuda", "hip"):
        try:
            if _cached(name, None, {}).can_launch:
                return name
        except BackendUnavailable as exc:
            log.debug("%s backend not available: %s", name, exc)
    return "cpu"


def _cached(name: str, target: str | None, options: dict[str, Any]) -> Backend:
    if name == "cpu":
        options = dict(options)
        if "warp_size" not in options:
            options["warp_size"] = int(os.environ.get(config.ENV_CPU_WARP_SIZE) or 32)
        if "checked" not in options:
            options["checked"] = config.env_flag(config.ENV_CPU_CHECK)
        if "check_alignment" not in options:
            options["check_alignment"] = config.env_flag(config.ENV_CPU_CHECK_ALIGNMENT)
    key = (name, target, tuple(sorted(options.items())))
    with _lock:
        inst = _instances.get(key)
        if inst is None:
            inst = _create(name, target, dict(options))
            _instances[key] = inst
        return inst


_default: tuple[tuple, Backend] | None = None


def _env_key() -> tuple:
    """The variables the default backend depends on (the emulator's only when it is the emulator)."""
    name = os.environ.get(config.ENV_BACKEND) or None
    if name == "cpu" or (name is None and _default is not None and _default[1].name == "cpu"):
        return (name, os.environ.get(config.ENV_CPU_WARP_SIZE), os.environ.get(config.ENV_CPU_CHECK),
                os.environ.get(config.ENV_CPU_CHECK_ALIGNMENT))
    return (name,)


def current_backend() -> Backend:
    """get_backend() with no arguments, for the per-call hot path.

    The default is resolved once; JITOPS_BACKEND set later in the process is seen by
    get_backend() (which re-resolves it), not by this function until then.
    """
    current = getattr(_local, "backend", None)
    if current is not None:
        return current
    d = _default
    if d is not None:
        return d[1]
    return get_backend()


def get_backend(name: str | None = None, target: str | None = None, **options: Any) -> Backend:
    """The backend to use: by name, by compile target (offline), or the automatic choice.

    `get_backend("cpu", warp_size=64)` emulates a wave64 device; `get_backend(target="gfx90a")`
    compiles for MI200 without one. With no arguments: the backend set by `use_backend`, else
    `JITOPS_BACKEND`, else the GPU in this machine, else the CPU emulator.
    """
    global _default
    if name is None and target is None and not options:
        current = getattr(_local, "backend", None)
        if current is not None:
            return current
        env = _env_key()
        if _default is not None and _default[0] == env:
            return _default[1]
        inst = _cached(env[0] or _detect(), None, {})
        _default = (env, inst)
        return inst
    if name is None:
        name = backend_of_target(target) if target is not None else (os.environ.get(config.ENV_BACKEND) or _detect())
    return _cached(name, target, options)


@contextlib.contextmanager
def use_backend(backend: Backend | str, **options: Any) -> Iterator[Backend]:
    """Run ops on `backend` inside the block (this thread only)."""
    inst = backend if isinstance(backend, Backend) else get_backend(backend, **options)
    prev = getattr(_local, "backend", None)
    _local.backend = inst
    try:
        yield inst
    finally:
        _local.backend = prev


def known_targets() -> list[str]:
    return sorted(KNOWN_TARGETS)


__all__ = ["Backend", "Kernel", "PackedArgs", "get_backend", "current_backend", "use_backend", "known_targets",
           "BACKENDS"]
