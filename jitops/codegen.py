"""Render HIP C++ from the Jinja templates in templates/.

Templates are written once, in HIP C++, against the jitops prelude (templates/common/prelude.h.j2),
which spells what differs between HIP, CUDA and the CPU emulator. Undefined template variables
are errors (StrictUndefined), so a schedule that forgets a parameter fails loudly.

Rendered sources are remembered on disk, keyed by a hash of every template file, the template
name and its parameters: a warm start renders nothing and does not even import Jinja, and any
template edit changes the hash.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from . import config
from .device import DeviceInfo

log = logging.getLogger("jitops.codegen")

PRELUDE = "common/prelude.h.j2"


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    import jinja2
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(config.templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        auto_reload=False,
    )
    env.filters["cfloat"] = c_float_literal
    return env


def c_float_literal(value: float) -> str:
    """A float as a C literal that round-trips exactly (e.g. 0.01 -> 0.0099999998f for fp32)."""
    import math
    v = float(value)
    if math.isinf(v):
        return "jt_inf()" if v > 0 else "(-jt_inf())"
    if math.isnan(v):
        return "__builtin_nanf(\"\")"
    return f"{v!r}f" if ("." in repr(v) or "e" in repr(v)) else f"{v!r}.0f"


def render(template: str, params: Mapping[str, Any]) -> str:
    """Render one kernel template (without the prelude)."""
    try:
        return environment().get_template(template).render(**params)
    except SyntaxError as exc:
        # Jinja compiles each template to a Python module; once (H200, 2026-11-29, 8 pytest processes,
        # inside an ORT Compute) that module failed to compile and the same template rendered in the next
        # run. Cause unknown: keep the evidence, load the template afresh once, and fail with both paths
        # if it fails again.
        saved = _save_generated_module(template)
        log.warning("template %s: Jinja's generated module did not compile (%s at its line %s: %r); the "
                    "module generated now saved to %s; loading the template again", template, exc.msg, exc.lineno,
                    exc.text, saved)
        environment.cache_clear()
        try:
            return environment().get_template(template).render(**params)
        except SyntaxError as again:
            from .errors import RenderError
            raise RenderError(template, f"{again.msg} (generated line {again.lineno}: {again.text!r})",
                              _save_generated_module(template)) from again


def _save_generated_module(template: str) -> Path | None:
    """Jinja's Python module for a template, written where failed compiles go (None if that fails too)."""
    try:
        env = environment()
        source, filename, _ = env.loader.get_source(env, template)
        code = env.compile(source, template, filename, raw=True)
        folder = config.cache_dir() / "failed"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (template.replace("/", "__") + f"-{hashlib.sha256(code.encode()).hexdigest()[:12]}.py")
        path.write_text(code)
        return path
    except Exception:     # evidence only: never hide the error being reported
        log.exception("could not save Jinja's generated module of %s", template)
        return None


@functools.lru_cache(maxsize=16)
def prelude(backend: str, arch: str, warp_size: int) -> str:
    return render(PRELUDE, {"backend": backend, "arch": arch, "warp_size": warp_size})


@functools.lru_cache(maxsize=1)
def templates_fingerprint() -> str:
    """Hash of every template file: part of each rendered-source key, so any edit is a new key."""
    h = hashlib.sha256()
    root = config.templates_dir()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".j2", ".h")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def reset() -> None:
    """Forget loaded templates and rendered sources (after editing templates in-process)."""
    environment.cache_clear()
    prelude.cache_clear()
    templates_fingerprint.cache_clear()
    _rendered.clear()


_rendered: dict[str, str] = {}


def _render_full(device: DeviceInfo, template: str, params: Mapping[str, Any]) -> str:
    body = render(template, {**params, "warp_size": device.warp_size})
    return prelude(device.backend, device.arch, device.warp_size) + "\n" + body


def full_source(device: DeviceInfo, template: str, params: Mapping[str, Any]) -> str:
    """Prelude for the device's backend + the rendered kernel: what the compiler sees."""
    from .cache import loader
    key = hashlib.sha256(repr((templates_fingerprint(), template, sorted(params.items()), device.backend,
                               device.arch, device.warp_size)).encode()).hexdigest()
    source = _rendered.get(key)
    if source is None:
        disk = loader().disk if loader().disk_enabled else None
        cached = disk.get("src-" + key) if disk is not None else None
        source = cached.decode() if cached is not None else _render_full(device, template, params)
        if disk is not None and cached is None:
            disk.put("src-" + key, source.encode(), {"template": template})
        _rendered[key] = source
    dump_dir = os.environ.get(config.ENV_DUMP_DIR)
    if dump_dir:
        dump_source(Path(dump_dir), template, device, source)
    return source


def dump_source(folder: Path, template: str, device: DeviceInfo, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stem = template.replace("/", "__").replace(".hip.j2", "")
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    path = folder / f"{stem}-{device.arch}-{digest}.hip"
    if not path.exists():
        path.write_text(source)
        log.debug("rendered source dumped to %s", path)
    return path
