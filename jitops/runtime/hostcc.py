"""Build small native libraries with the host C/C++ compiler, once, into the jitops cache.

Used for the CPU emulator's runtime, the native kernel launcher and the ONNX Runtime custom-op
library. A library is keyed by its sources, flags and compiler, and written atomically, so
concurrent processes never load a half-written file. A cache directory that cannot take the file
(read-only, full) is not fatal: config switches the process to its fallback directory.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from .. import config
from ..errors import BackendUnavailable, CompileError

log = logging.getLogger("jitops.hostcc")


def find_compiler(cxx: bool = True) -> str:
    names = (os.environ.get("CXX"), "g++", "clang++", "c++") if cxx else (os.environ.get("CC"), "gcc", "clang", "cc")
    for cand in names:
        if cand and shutil.which(cand):
            return cand
    kind = "C++" if cxx else "C"
    raise BackendUnavailable(f"no host {kind} compiler found (install g++/gcc or set {'CXX' if cxx else 'CC'})")


_versions: dict[str, str] = {}


def compiler_version(compiler: str) -> str:
    if compiler not in _versions:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
        _versions[compiler] = out.splitlines()[0].strip() if out else compiler
    return _versions[compiler]


def _write_all(f, data: bytes) -> None:
    f.write(data)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `path` all at once (a temporary file renamed over it); a failure leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            _write_all(f, data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_cached(relative: str | Path, data: bytes) -> Path:
    """Write `data` at `relative` inside the cache directory in use and return its path. If the
    write fails there, the process moves to its fallback cache directory (warned once) and the
    file is written there instead; an error only when that fails too."""
    path = config.cache_dir() / relative
    try:
        write_atomic(path, data)
        return path
    except OSError as exc:
        fallback = config.cache_write_failed(path, exc)
        if fallback is None:
            raise
    path = fallback / relative
    write_atomic(path, data)
    return path


def build_library(name: str, sources: Sequence[Path], flags: Sequence[str], cxx: bool = True,
                  suffix: str = ".so") -> Path:
    """The shared library built from `sources` with `flags`; compiled only when not yet cached."""
    compiler = find_compiler(cxx)
    h = hashlib.sha256()
    for part in (compiler_version(compiler), " ".join(flags), *(Path(s).read_text() for s in sources)):
        h.update(part.encode())
        h.update(b"\0")
    relative = Path("native") / f"{name}-{h.hexdigest()[:16]}{suffix}"
    path = config.cache_dir() / relative
    if path.exists():
        return path
    with tempfile.TemporaryDirectory(prefix=f"jitops-{name}-") as tmp:
        out = Path(tmp) / f"{name}{suffix}"
        cmd = [compiler, *flags, *(str(s) for s in sources), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise CompileError("host", name, f"$ {' '.join(cmd)}\n{res.stderr}", Path(sources[0]))
        log.info("built %s", path.name)
        return write_cached(relative, out.read_bytes())
