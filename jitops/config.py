"""Where jitops finds its templates, schedules and cache, and the environment variables it reads.

The cache location is checked once per process (created, and a file written and removed in it).
A location that cannot be used (below a file, read-only, full) is not an error: the process falls
back to a private temporary directory, removed at exit, and warns once naming the location and
the reason. A write that fails later (a disk filling up) makes the same switch.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_DIR = _PACKAGE_DIR.parent

# Environment variables (documented in README.md).
ENV_BACKEND = "JITOPS_BACKEND"          # cuda | hip | cpu (default: automatic)
ENV_CACHE_DIR = "JITOPS_CACHE_DIR"      # binary cache + user tuning records
ENV_DUMP_DIR = "JITOPS_DUMP_DIR"        # write every rendered source here
ENV_CPU_WARP_SIZE = "JITOPS_CPU_WARP_SIZE"
ENV_CPU_CHECK = "JITOPS_CPU_CHECK"      # bounds / deadlock checking in the emulator
ENV_CPU_CHECK_ALIGNMENT = "JITOPS_CPU_CHECK_ALIGNMENT"   # the emulator traps misaligned (vector) accesses
ENV_CPU_THREADS = "JITOPS_CPU_THREADS"  # worker threads of the emulator
ENV_BUNDLE = "JITOPS_BUNDLE"            # load a compiled bundle at import
ENV_NO_CACHE = "JITOPS_NO_DISK_CACHE"   # 1: never read or write the disk cache
ENV_BUNDLE_FALLBACK = "JITOPS_BUNDLE_FALLBACK"   # error | jit: what a bundle mismatch does
ENV_DEVICE = "JITOPS_DEVICE"            # GPU ordinal (default 0)
ENV_CPU_STACK_KB = "JITOPS_CPU_STACK_KB"  # the emulator's per-thread fiber stack (default 64 KiB)
ENV_BENCHMARK = "JITOPS_BENCHMARK"      # 1: time a few schedules on a problem's first call (benchmark_candidates)
ENV_PROGRAMMATIC_LAUNCH = "JITOPS_PROGRAMMATIC_LAUNCH"   # auto | 1 | 0: programmatic dependent launch (sm_90+)


def is_checkout() -> bool:
    """True when running from a source checkout (templates/ beside the package)."""
    return (_CHECKOUT_DIR / "templates").is_dir() and (_CHECKOUT_DIR / "pyproject.toml").is_file()


def templates_dir() -> Path:
    if is_checkout():
        return _CHECKOUT_DIR / "templates"
    return _PACKAGE_DIR / "_templates"


def schedules_dir() -> Path:
    if is_checkout():
        return _CHECKOUT_DIR / "schedules"
    return _PACKAGE_DIR / "_schedules"


def user_cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "jitops"


def configured_cache_dir() -> Path:
    """JITOPS_CACHE_DIR, else cache/ in a checkout, else the user cache dir (usable or not)."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    if is_checkout():
        return _CHECKOUT_DIR / "cache"
    return user_cache_root()


log = logging.getLogger("jitops.config")
_cache_lock = threading.Lock()
_unusable: dict[Path, str] = {}      # configured location -> why it cannot be used
_checked: set[Path] = set()
_fallback: Path | None = None


def cache_dir() -> Path:
    """The cache directory in use: the configured one, or this process's fallback when that one
    cannot be used (see cache_status)."""
    configured = configured_cache_dir()
    if configured in _checked and configured not in _unusable:
        return configured
    with _cache_lock:
        if configured not in _checked:
            reason = _probe(configured)
            _checked.add(configured)
            if reason is not None:
                _mark_unusable(configured, reason)
        return _fallback_dir() if configured in _unusable else configured


def cache_write_failed(path: Path, exc: BaseException) -> Path | None:
    """A write of `path` into the cache failed (disk full, permissions changed...): switch this
    process to its fallback directory (warning once). Returns the fallback to retry in, or None
    when the failed write was already in the fallback (nothing better to offer)."""
    configured = configured_cache_dir()
    with _cache_lock:
        if _fallback is not None and _is_within(path, _fallback):
            return None
        if configured not in _unusable:
            _checked.add(configured)
            _mark_unusable(configured, f"writing {path.name} failed: {exc}")
        return _fallback_dir()


def cache_status() -> dict[str, str | None]:
    """Which cache is in use, for `jitops info`: {'configured', 'in_use', 'reason' (None if usable)}."""
    in_use = cache_dir()
    configured = configured_cache_dir()
    return {"configured": str(configured), "in_use": str(in_use), "reason": _unusable.get(configured)}


def _probe(directory: Path) -> str | None:
    """None when a file can be created in `directory` (made if missing), else why not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".probe-")
        try:
            os.write(fd, b"jitops")
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def _mark_unusable(configured: Path, reason: str) -> None:
    _unusable[configured] = reason
    warn(log, f"jitops cache directory {configured} cannot be used ({reason}); this process caches in "
              f"{_fallback_dir()} instead (set {ENV_CACHE_DIR} to a writable directory to keep compiled "
              f"kernels between runs)")


class JitopsWarning(RuntimeWarning):
    """Something degraded (cache location, native parts); jitops keeps working."""


def warn(logger: logging.Logger, message: str) -> None:
    """A WARNING record, shown even where the application configured no logging: jitops' own
    NullHandler would otherwise swallow it, so then it goes out as a Python warning instead."""
    logger.warning(message)
    node: logging.Logger | None = logger
    while node is not None:
        if any(not isinstance(h, logging.NullHandler) for h in node.handlers):
            return
        node = node.parent if node.propagate else None
    import warnings
    warnings.warn(message, JitopsWarning, stacklevel=3)


def _fallback_dir() -> Path:
    """One private temporary directory per process, removed at exit."""
    global _fallback
    if _fallback is None:
        try:
            _fallback = Path(tempfile.mkdtemp(prefix="jitops-cache-"))
        except OSError:     # no writable temporary directory either: writers degrade one by one
            return configured_cache_dir()
        atexit.register(shutil.rmtree, str(_fallback), ignore_errors=True)
    return _fallback


def _is_within(path: Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def reset_cache_state() -> None:
    """Forget what was found about cache locations (tests)."""
    with _cache_lock:
        _unusable.clear()
        _checked.clear()


_programmatic: list[str | None] = [None]   # None: from the environment


def set_programmatic_launch(enabled: bool | None) -> None:
    """Programmatic dependent launch for launches bound from now on: True "on", False "off", None "auto"
    (see jitops.set_programmatic_launch)."""
    if enabled is not None and not isinstance(enabled, bool):
        from .errors import ArgumentError
        raise ArgumentError("enabled", "True, False or None (auto)", repr(enabled))
    _programmatic[0] = "auto" if enabled is None else "on" if enabled else "off"


def programmatic_launch_mode() -> str:
    """"auto" (the default), "on" or "off": set_programmatic_launch, else JITOPS_PROGRAMMATIC_LAUNCH
    (auto, 1 / on / true / yes, 0 / off / false / no; anything else is auto, warned about)."""
    if _programmatic[0] is not None:
        return _programmatic[0]
    raw = os.environ.get(ENV_PROGRAMMATIC_LAUNCH, "auto").strip().lower()
    if raw in ("1", "on", "true", "yes"):
        return "on"
    if raw in ("0", "off", "false", "no"):
        return "off"
    if raw not in ("", "auto"):
        warn(logging.getLogger("jitops"), f"{ENV_PROGRAMMATIC_LAUNCH}={raw!r} is not auto, 1 or 0: using auto")
    return "auto"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------- benchmark mode
# The setting lives here, not in jitops.tuning.benchmark (which times the shortlists): a first call
# reads it, and importing the tuner on every process's first call cost ~10 ms with benchmark mode off.
BENCHMARK_CANDIDATES = 6    # the fastest of the best six rated was within 0.2% of the fastest of all on
                            # the H100's 14 large conv2d layers (2026-11-27); four missed SD-UNet's 320-channel one
_benchmark: list[int | None] = [None]   # None: from the environment


def set_benchmark(enabled: bool | int = True) -> None:
    """Turn benchmark mode on (True, or the number of schedules to time, >= 2) or off (False / 0)."""
    if isinstance(enabled, bool) or enabled in (0, 1):
        _benchmark[0] = BENCHMARK_CANDIDATES if enabled else 0
    elif isinstance(enabled, int) and enabled >= 2:
        _benchmark[0] = enabled
    else:
        from .errors import ArgumentError
        raise ArgumentError("enabled", "True, False, or a number of schedules >= 2", repr(enabled))


def benchmark_candidates() -> int:
    """Schedules a first call times (0: benchmark mode is off): set_benchmark, else JITOPS_BENCHMARK."""
    if _benchmark[0] is not None:
        return _benchmark[0]
    raw = os.environ.get(ENV_BENCHMARK, "").strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return 0
    if raw.isdigit() and int(raw) >= 2:
        return int(raw)
    return BENCHMARK_CANDIDATES
