"""The native launcher (native/jitops_launch.c), built with the host C compiler on first use.

A Python binding spends microseconds converting eleven launch arguments; this extension calls
the driver's launch entry point directly. When it cannot be built (no compiler or no Python
headers), backends fall back to their binding's launch.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from .hostcc import build_library

log = logging.getLogger("jitops.launch")

_SOURCE = Path(__file__).resolve().parent / "native" / "jitops_launch.c"
_lock = threading.Lock()
_module: ModuleType | None = None
_failed = False


def native_launcher() -> ModuleType | None:
    """The extension module with launch(entry, kernel, gx, gy, gz, bx, by, bz, shared, stream, params)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is None and not _failed:
            try:
                include = sysconfig.get_paths()["include"]
                suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
                path = build_library("jitops_launch", [_SOURCE], ["-O2", "-shared", "-fPIC", f"-I{include}"],
                                     cxx=False, suffix=suffix)
                loader = importlib.machinery.ExtensionFileLoader("jitops_launch", str(path))
                spec = importlib.util.spec_from_file_location("jitops_launch", str(path), loader=loader)
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                _module = module
            except Exception as exc:  # no compiler, no Python.h, ...: the binding's launch still works
                log.info("native launcher unavailable (%s); launching through the binding", exc)
                _failed = True
    return _module


def bind_native(module: ModuleType, entry: int, handle: int, grid: Sequence[int], block: Sequence[int],
                shared: int, fail_at: Callable[[int, int, int], None]) -> Callable[[Any, int], None]:
    """A backend's bound launch through the native launcher: launch(args: PackedArgs, stream).

    It carries what the repeat paths need (fastcall.py): `native`, the launcher call's fixed
    arguments, for generated code and FastCall; `fail_at(rc, params, stream)`, the backend's retry
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
