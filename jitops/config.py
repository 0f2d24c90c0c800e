"""Where jitops finds its templates, schedules and cache, and the environment variables it reads."""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_DIR = _PACKAGE_DIR.parent

# Environment variables (documented in README.md).
ENV_BACKEND = "JITOPS_BACKEND"          # cuda | hip | cpu (default: automatic)
ENV_CACHE_DIR = "JITOPS_CACHE_DIR"      # binary cache + user tuning records
ENV_DUMP_DIR = "JITOPS_DUMP_DIR"        # write every rendered source here
ENV_CPU_WARP_SIZE = "JITOPS_CPU_WARP_SIZE"
ENV_CPU_CHECK = "JITOPS_CPU_CHECK"      # bounds / deadlock checking in the emulator
ENV_CPU_THREADS = "JITOPS_CPU_THREADS"  # worker threads of the emulator
ENV_BUNDLE = "JITOPS_BUNDLE"            # load a compiled bundle at import
ENV_NO_CACHE = "JITOPS_NO_DISK_CACHE"   # 1: never read or write the disk cache


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


def cache_dir() -> Path:
    """JITOPS_CACHE_DIR, else cache/ in a checkout, else the user cache dir."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    if is_checkout():
        return _CHECKOUT_DIR / "cache"
    return user_cache_root()


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
