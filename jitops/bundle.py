"""Compiled op bundles: the kernels a model needs, compiled ahead of time, loaded with no compiler.

    jitops bundle model.onnx --target sm_90 --target gfx90a -o model.jitops     # build (no GPU needed)
    bundle = jitops.load_bundle("model.jitops")                                # or JITOPS_BUNDLE=model.jitops
    sess = jitops.onnx.session(bundle.model_path)                              # runs with zero compiles

A bundle directory holds manifest.json (jitops version, targets with their compiler and options,
per-kernel keys and checksums, the schedule records used), kernels/<key>.bin, the rewritten
model.onnx and, for hosts without a compiler, the ONNX Runtime custom-op library. Loading checks
the jitops version and that the active device is one of the targets; a mismatch is an error, or
with fallback="jit" a warning and ordinary JIT compilation. While a strict bundle is loaded,
compiling is disabled, so a kernel missing from it is an error that names it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import JitopsError

log = logging.getLogger("jitops.bundle")

FORMAT = 1
MANIFEST = "manifest.json"
MODEL = "model.onnx"
FALLBACKS = ("error", "jit")


class BundleMismatch(JitopsError):
    """The bundle was built for another jitops version or device than this one."""


@dataclass(frozen=True)
class Target:
    """One compile target of a bundle, as recorded in its manifest."""

    target: str
    backend: str
    arch: str
    warp_size: int
    compiler: str
    options: tuple[str, ...]
    device: str = ""

    def matches(self, backend: Any) -> bool:
        d = backend.device
        return (self.backend, self.arch, self.warp_size) == (backend.name, d.arch, d.warp_size)

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "backend": self.backend, "arch": self.arch, "warp_size": self.warp_size,
                "compiler": self.compiler, "options": list(self.options), "device": self.device}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Target":
        return Target(d["target"], d["backend"], d["arch"], int(d["warp_size"]), d["compiler"],
                      tuple(d.get("options", ())), d.get("device", ""))


def target_of(backend: Any, name: str) -> Target:
    d = backend.device
    return Target(name, backend.name, d.arch, d.warp_size, backend.compiler_id(), tuple(backend.compile_options()),
                  d.name)


def read_manifest(path: str | Path) -> dict[str, Any]:
    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise JitopsError(f"{folder} is not a jitops bundle (no {MANIFEST}); make one with `jitops bundle`") from None
    except ValueError as exc:
        raise JitopsError(f"{folder / MANIFEST} is not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise JitopsError(f"{folder} is bundle format {manifest.get('format')}, this jitops reads format {FORMAT}")
    return manifest


@dataclass
class Bundle:
    """A loaded bundle: its binaries answer the kernel loader, its records choose the schedules."""

    path: Path
    manifest: dict[str, Any]
    target: Target | None
    fallback: str
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)   # key -> manifest entry (this target)
    hits: int = 0
    _installed: bool = False

    @property
    def model_path(self) -> Path:
        """The rewritten model the bundle was built from (run it with jitops.onnx.session)."""
        return self.path / MODEL

    @property
    def targets(self) -> list[Target]:
        return [Target.from_dict(t) for t in self.manifest["targets"]]

    def lookup(self, key: str) -> bytes | None:
        """The binary for a cache key, checked against its manifest checksum; None when absent."""
        entry = self.kernels.get(key)
        if entry is None:
            return None
        data = (self.path / entry["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise JitopsError(f"bundle {self.path}: {entry['file']} does not match its checksum (corrupt copy?)")
        self.hits += 1
        return data

    def install(self) -> None:
        from .cache import loader
        from .records import store
        if self.target is None or self._installed:
            return
        ld = loader()
        ld.extra_sources.append(self.lookup)
        ld.compiler_ids[(self.target.backend, self.target.arch)] = (self.target.compiler, self.target.options)
        ld.allow_compile = self.fallback == "jit"
        store().extra.extend(self._records())
        self._installed = True
        _loaded.append(self)

    def unload(self) -> None:
        """Stop answering from this bundle; compiling is allowed again."""
        from .cache import loader
        from .records import store
        if not self._installed:
            return
        ld = loader()
        if self.lookup in ld.extra_sources:
            ld.extra_sources.remove(self.lookup)
        ld.compiler_ids.pop((self.target.backend, self.target.arch), None)
        ld.allow_compile = True
        mine = {id(r) for r in self._records()}
        store().extra[:] = [r for r in store().extra if id(r) not in mine]
        self._installed = False
        if self in _loaded:
            _loaded.remove(self)

    def _records(self) -> list[dict[str, Any]]:
        """The schedule records of this bundle's matching target (the manifest's own dicts)."""
        if self.target is None:
            return []
        return [r for r in self.manifest.get("records", []) if r.get("target") == self.target.target]

    def native_library(self) -> Path | None:
        """The prebuilt ONNX Runtime custom-op library, when the bundle carries one for these sources."""
        entry = self.manifest.get("native")
        if not entry:
            return None
        from .onnx.native import sources_digest
        if entry.get("sources") != sources_digest():
            return None
        path = self.path / entry["file"]
        return path if path.is_file() else None


_loaded: list[Bundle] = []


def loaded_bundles() -> list[Bundle]:
    return list(_loaded)


def load_bundle(path: str | Path, fallback: str = "error", backend: Any = None) -> Bundle:
    """Load a bundle for the active backend (or `backend`): its kernels then load with zero compiles.

    fallback="error" (default): a jitops version or device mismatch raises BundleMismatch, and any
    kernel not in the bundle is an error instead of a compile. fallback="jit": a mismatch warns and
    the bundle is ignored; kernels it lacks are compiled as usual.
    """
    from .runtime import current_backend
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    folder = Path(path).expanduser().resolve()
    manifest = read_manifest(folder)
    be = backend or current_backend()
    bundle = Bundle(folder, manifest, None, fallback)
    problem = _mismatch(manifest, be)
    if problem:
        message = f"jitops bundle {folder}: {problem}"
        if fallback == "error":
            raise BundleMismatch(message + " (load it with fallback='jit', or JITOPS_BUNDLE_FALLBACK=jit, "
                                 "to compile instead)")
        warnings.warn(message + "; compiling kernels just in time instead", RuntimeWarning, stacklevel=2)
        log.warning("%s; falling back to JIT compilation", message)
        return bundle
    bundle.target = next(Target.from_dict(t) for t in manifest["targets"] if Target.from_dict(t).matches(be))
    bundle.kernels = {k["key"]: k for k in manifest.get("kernels", []) if k["target"] == bundle.target.target}
    bundle.install()
    log.info("bundle %s: %d kernels for %s loaded", folder, len(bundle.kernels), bundle.target.target)
    return bundle


def _mismatch(manifest: dict[str, Any], backend: Any) -> str:
    if manifest.get("jitops") != __version__:
        return f"built by jitops {manifest.get('jitops')}, this is jitops {__version__}"
    targets = [Target.from_dict(t) for t in manifest.get("targets", [])]
    if not any(t.matches(backend) for t in targets):
        d = backend.device
        have = ", ".join(f"{t.target} ({t.backend}, warp {t.warp_size})" for t in targets) or "none"
        return (f"built for {have}; the active device is {d.arch} ({backend.name}, warp {d.warp_size}, "
                f"{d.name})")
    return ""


def load_from_env() -> Bundle | None:
    """JITOPS_BUNDLE=DIR (and JITOPS_BUNDLE_FALLBACK=error|jit): load that bundle."""
    from . import config
    path = os.environ.get(config.ENV_BUNDLE)
    if not path:
        return None
    return load_bundle(path, fallback=os.environ.get(config.ENV_BUNDLE_FALLBACK, "error"))
