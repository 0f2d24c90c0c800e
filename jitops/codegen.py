"""Render HIP C++ from the Jinja templates in templates/.

Templates are written once, in HIP C++, against the jitops prelude (templates/common/prelude.h.j2),
which spells what differs between HIP, CUDA and the CPU emulator. Undefined template variables
are errors (StrictUndefined), so a schedule that forgets a parameter fails loudly.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Mapping

import jinja2

from . import config
from .device import DeviceInfo

log = logging.getLogger("jitops.codegen")

PRELUDE = "common/prelude.h.j2"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
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
    return environment().get_template(template).render(**params)


@functools.lru_cache(maxsize=16)
def prelude(backend: str, arch: str, warp_size: int) -> str:
    return environment().get_template(PRELUDE).render(backend=backend, arch=arch, warp_size=warp_size)


def full_source(device: DeviceInfo, template: str, params: Mapping[str, Any]) -> str:
    """Prelude for the device's backend + the rendered kernel: what the compiler sees."""
    body = render(template, {**params, "warp_size": device.warp_size})
    source = prelude(device.backend, device.arch, device.warp_size) + "\n" + body
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
