"""Compiled-binary cache: diskcache on disk, loaded modules in memory.

The key covers everything that changes the binary: rendered source (so a template edit is a new
key), compile options, backend, target arch, compiler version and jitops version. Entries carry a
checksum; an entry that is corrupt or that the driver refuses to load is dropped and recompiled.
diskcache is safe across processes, so two processes compiling the same kernel both succeed.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import config
from ._version import __version__
from .errors import JitopsError, LaunchError

log = logging.getLogger("jitops.cache")


def cache_key(source: str, options: Sequence[str], backend: str, arch: str, compiler: str,
              kernel_names: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (f"jitops={__version__}", f"backend={backend}", f"arch={arch}", f"compiler={compiler}",
                 "options=" + " ".join(options), "kernels=" + ",".join(kernel_names), source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class DiskCache:
    """Binaries by key. Failures of the cache itself degrade to 'miss', never to an error."""

    def __init__(self, directory: Path | None = None):
        self._explicit = directory is not None
        self.directory = Path(directory) if directory else config.cache_dir() / "binaries"
        self._cache: Any = None
        self._broken = False
        self._lock = threading.Lock()

    def _open(self) -> Any:
        if self._cache is None and not self._broken:
            with self._lock:
                if self._cache is None:
                    try:
                        import diskcache
                        self.directory.mkdir(parents=True, exist_ok=True)
                        self._cache = diskcache.Cache(str(self.directory), size_limit=4 * 2**30)
                    except Exception as exc:  # unreadable dir, corrupt database...
                        log.warning("binary cache at %s unusable (%s); compiling without it", self.directory, exc)
                        self._broken = True
        return self._cache

    def get(self, key: str) -> bytes | None:
        cache = self._open()
        if cache is None:
            return None
        try:
            entry = cache.get(key)
        except Exception as exc:
            log.warning("binary cache read failed for %s (%s); recompiling", key[:12], exc)
            return None
        if entry is None:
            return None
        try:
            binary, digest = entry["binary"], entry["sha256"]
            if hashlib.sha256(binary).hexdigest() != digest:
                raise ValueError("checksum mismatch")
        except Exception as exc:
            log.warning("binary cache entry %s is corrupt (%s); recompiling", key[:12], exc)
            self.delete(key)
            return None
        return binary

    def put(self, key: str, binary: bytes, meta: Mapping[str, Any]) -> None:
        cache = self._open()
        if cache is None:
            return
        entry = {"binary": binary, "sha256": hashlib.sha256(binary).hexdigest(), "meta": dict(meta)}
        try:
            cache.set(key, entry)
        except Exception as exc:
            self._write_failed(key, entry, exc)

    def _write_failed(self, key: str, entry: dict, exc: Exception) -> None:
        """A write failed (disk full...): the default location moves to the process's fallback
        directory (config warns once) and the entry is written there; an explicit directory, or
        the fallback itself, is given up (warned once): compiled kernels then stay in memory."""
        fallback = None if self._explicit else config.cache_write_failed(self.directory / "cache.db", exc)
        with self._lock:
            self.close()
            if fallback is None:
                log.warning("binary cache at %s: write failed (%s); compiled kernels are kept in memory only",
                            self.directory, exc)
                self._broken = True
                return
            self.directory = fallback / "binaries"
        cache = self._open()
        if cache is not None:
            try:
                cache.set(key, entry)
            except Exception as again:
                log.warning("binary cache at %s: write failed (%s); compiled kernels are kept in memory only",
                            self.directory, again)
                self.close()
                self._broken = True

    def delete(self, key: str) -> None:
        cache = self._open()
        if cache is not None:
            try:
                cache.delete(key)
            except Exception:
                pass

    def info(self) -> dict[str, Any]:
        cache = self._open()
        if cache is None:
            return {"path": str(self.directory), "entries": 0, "bytes": 0, "usable": False}
        return {"path": str(self.directory), "entries": len(cache), "bytes": int(cache.volume()), "usable": True}

    def clear(self) -> int:
        cache = self._open()
        return int(cache.clear()) if cache is not None else 0

    def close(self) -> None:
        if self._cache is not None:
            try:
                self._cache.close()
            except Exception:
                pass
            self._cache = None


@dataclass
class CacheStats:
    compiles: int = 0
    disk_hits: int = 0
    memory_hits: int = 0
    bundle_hits: int = 0
    reloads_after_bad_entry: int = 0
    compile_seconds: float = 0.0
    compiled_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CompiledBinary:
    key: str
    binary: bytes
    compile_seconds: float   # 0.0 when it came from a cache or bundle
    origin: str              # "compiled" | "disk" | "bundle"


class KernelLoader:
    """Source -> binary (compile or cache) -> loaded kernels (memory cache)."""

    def __init__(self, disk: DiskCache | None = None):
        self.disk = disk or DiskCache()
        self.stats = CacheStats()
        self._modules: dict[tuple[int, str], dict] = {}
        self._lock = threading.RLock()
        # Read-only binary sources consulted before compiling (compiled bundles).
        self.extra_sources: list[Callable[[str], bytes | None]] = []
        self.allow_compile = True
        # (compiler id, options) to key binaries with, per (backend, arch): set by jitops.load_bundle so
        # that the bundle's binaries are found where the local compiler differs or is absent.
        self.compiler_ids: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
        self.disk_enabled = not config.env_flag(config.ENV_NO_CACHE)

    def key_for(self, backend: Any, source: str, kernel_names: Sequence[str]) -> str:
        pinned = self.compiler_ids.get((backend.name, backend.device.arch))
        compiler, options = pinned or (backend.compiler_id(), backend.compile_options())
        return cache_key(source, options, backend.name, backend.device.arch, compiler, kernel_names)

    def binary(self, backend: Any, source: str, kernel_names: Sequence[str], label: str,
               key: str | None = None) -> CompiledBinary:
        """The binary for this source: from a bundle, the disk cache, or a fresh compile."""
        key = key or self.key_for(backend, source, kernel_names)
        for src in self.extra_sources:
            found = src(key)
            if found is not None:
                self.stats.bundle_hits += 1
                return CompiledBinary(key, found, 0.0, "bundle")
        if self.disk_enabled:
            found = self.disk.get(key)
            if found is not None:
                self.stats.disk_hits += 1
                return CompiledBinary(key, found, 0.0, "disk")
        return self._compile(backend, source, kernel_names, label, key)

    def _compile(self, backend: Any, source: str, kernel_names: Sequence[str], label: str, key: str) -> CompiledBinary:
        if not self.allow_compile:
            raise JitopsError(f"kernel '{label}' ({key[:12]}) is not in the loaded bundle and compiling is disabled "
                              f"(load the bundle with fallback='jit' to allow it)")
        t0 = time.perf_counter()
        binary = backend.compile(source, kernel_names, label)
        dt = time.perf_counter() - t0
        self.stats.compiles += 1
        self.stats.compile_seconds += dt
        self.stats.compiled_keys.append(key)
        log.info("compiled %s for %s in %.0f ms (%d bytes)", label, backend.device.arch, dt * 1e3, len(binary))
        if self.disk_enabled:
            self.disk.put(key, binary, {"label": label, "backend": backend.name, "arch": backend.device.arch,
                                        "compiler": backend.compiler_id(), "kernels": list(kernel_names),
                                        "seconds": dt, "created": time.time()})
        return CompiledBinary(key, binary, dt, "compiled")

    def kernels(self, backend: Any, source: str, kernel_names: Sequence[str], label: str) -> dict:
        """Loaded kernels for this source on this backend; compiles at most once per process."""
        key = self.key_for(backend, source, kernel_names)
        mem_key = (id(backend), key)
        with self._lock:
            loaded = self._modules.get(mem_key)
            if loaded is not None:
                self.stats.memory_hits += 1
                return loaded
            compiled = self.binary(backend, source, kernel_names, label, key)
            try:
                loaded = backend.load(compiled.binary, kernel_names)
            except LaunchError as exc:
                if compiled.origin == "compiled":
                    raise
                # A cached binary the driver will not take (stale, truncated...): rebuild it.
                log.warning("cached binary %s for %s failed to load (%s); recompiling", key[:12], label, exc)
                self.stats.reloads_after_bad_entry += 1
                self.disk.delete(key)
                compiled = self._compile(backend, source, kernel_names, label, key)
                loaded = backend.load(compiled.binary, kernel_names)
            self._modules[mem_key] = loaded
            return loaded



_loader: KernelLoader | None = None


def loader() -> KernelLoader:
    global _loader
    if _loader is None:
        _loader = KernelLoader()
    return _loader
