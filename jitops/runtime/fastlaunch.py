"""The native launcher (native/jitops_launch.c): built with the wheel as the extension module
jitops.runtime.jitops_launch, else (a source checkout, a wheel built without a compiler) built
with the host C compiler on first use.

A Python binding spends microseconds converting eleven launch arguments; this extension calls
the driver's launch entry point directly, and runs whole repeat calls (RepeatCall, Dispatch). When
neither copy is available, backends fall back to their binding's launch and repeat calls to the
generated Python path; that is warned about once, naming what is missing.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from .. import config
from ..errors import BackendUnavailable
from .hostcc import build_library

log = logging.getLogger("jitops.launch")

_NATIVE = Path(__file__).resolve().parent / "native"
# Every file of the module (setup.py lists the same, in this order, for its digest).
_FILES = ("jitops_native.h", "jitops_launch.c", "jitops_fastcall.c", "jitops_dispatch.c",
          "jitops_programmatic.c")
_SOURCES = [_NATIVE / f for f in _FILES if f.endswith(".c")]
_PREBUILT = "jitops.runtime.jitops_launch"
_lock = threading.Lock()
_module: ModuleType | None = None
_failed = False
origin: str = ""        # where the loaded launcher came from: "prebuilt" (built with the package) or a path


_unwarned: list[str] = []   # warnings held back by a quiet first try, given by the next plain one


def native_launcher(quiet: bool = False) -> ModuleType | None:
    """The extension module with launch(entry, kernel, gx, gy, gz, bx, by, bz, shared, stream, params).

    quiet: what goes wrong is warned about only when a later call without `quiet` asks (`import
    jitops` tries quietly: a program that never launches on a GPU needs no launcher)."""
    global _module, _failed
    if _module is None and not _failed:
        with _lock:
            if _module is None and not _failed:
                _module = _prebuilt() or _compiled()
                _failed = _module is None
    if _unwarned and not quiet:
        with _lock:
            held, _unwarned[:] = list(_unwarned), []
        for message in held:
            config.warn(log, message)
    return _module


_released_listeners: list[Callable[[], None]] = []


def memory_released() -> None:
    """Memory a launcher outside Python may remember (derived data, per-stream scratch, a dropped
    plan's workspaces) was freed or refilled: every RepeatCall forgets what it remembered (the next
    call asks Python again), and so does every listener (on_memory_released)."""
    if _module is not None and hasattr(_module, "memory_released"):
        _module.memory_released()
    for tell in list(_released_listeners):
        tell()


def on_memory_released(tell: Callable[[], None]) -> None:
    """Call `tell()` at every memory_released (the ONNX Runtime library's node replays)."""
    if tell not in _released_listeners:
        _released_listeners.append(tell)


def source_digest() -> str:
    """What the module's files hash to; a prebuilt module carries the digest it was built from."""
    h = hashlib.sha256()
    for f in _FILES:
        h.update((_NATIVE / f).read_bytes())
    return h.hexdigest()[:16]


def _prebuilt() -> ModuleType | None:
    """The copy built with the wheel, when it was built from the source beside it."""
    global origin
    try:
        module = importlib.import_module(_PREBUILT)
    except ImportError:
        return None
    if getattr(module, "source_digest", None) != source_digest():
        log.debug("%s was built from other sources; not used", module.__file__)
        return None
    origin = "prebuilt"
    return module


def _compiled() -> ModuleType | None:
    """Built with the host C compiler (cached); None, warned once, when that cannot be done."""
    global origin
    include = sysconfig.get_paths()["include"]
    try:
        if not (Path(include) / "Python.h").is_file():
            raise BackendUnavailable(f"Python development headers missing (no Python.h in {include})")
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        path = build_library("jitops_launch", _SOURCES,
                             ["-O2", "-shared", "-fPIC", f"-I{include}", f'-DJITOPS_LAUNCH_DIGEST="{source_digest()}"'],
                             cxx=False, suffix=suffix)
        loader = importlib.machinery.ExtensionFileLoader("jitops_launch", str(path))
        spec = importlib.util.spec_from_file_location("jitops_launch", str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except Exception as exc:  # no compiler, no Python.h, ...: the binding's launch still works
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        _unwarned.append(f"jitops native launcher unavailable (no prebuilt copy in this installation, and "
                         f"building it failed: {reason}); kernels launch through the Python binding and "
                         f"repeat calls take the Python path (a few microseconds more per call)")
        return None
    origin = str(path)
    if not config.is_checkout():
        _unwarned.append(f"jitops native launcher: no prebuilt copy in this installation (the wheel was built "
                         f"without a C compiler?); built {path.name} with the host compiler instead")
    return module


def bind_native(module: ModuleType, entry: int, handle: int, grid: Sequence[int], block: Sequence[int],
                shared: int, fail_at: Callable[[int, int, int], None]) -> Callable[[Any, int], None]:
    """A backend's bound launch through the native launcher: launch(args: PackedArgs, stream).

    It carries what the repeat paths need (bound_plan.py): `native`, the launcher call's fixed
    arguments, for generated code and RepeatCall; `fail_at(rc, params, stream)`, the backend's retry
    or error for a launch that returned rc with the given argument block; `fail(rc, args, stream)`."""
    gx, gy, gz = (int(v) for v in grid)
    bx, by, bz = (int(v) for v in block)
    run = module.launch

    def launch(args: Any, stream: int) -> None:
        rc = run(entry, handle, gx, gy, gz, bx, by, bz, shared, stream, args.address)
        if rc:
            fail_at(rc, args.address, stream)

    launch.native = (run, entry, handle, gx, gy, gz, bx, by, bz, shared)    # type: ignore[attr-defined]
    launch.fail_at = fail_at                                                  # type: ignore[attr-defined]
    launch.fail = lambda rc, args, stream: fail_at(rc, args.address, stream)  # type: ignore[attr-defined]
    return launch
