"""Operator modules. Each knows shapes, schedules and templates, and nothing about runtimes."""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from ..errors import ArgumentError

# op name -> module under jitops.ops (one op per module)
OP_MODULES = {
    "leaky_relu": "leaky_relu",
    "conv2d": "conv2d",
    "attention": "attention",
    "batch_norm": "batch_norm",
    "group_norm": "group_norm",
    "layer_norm": "layer_norm",
    "rms_norm": "rms_norm",
}


_loaded: dict[str, ModuleType] = {}


def get_op(name: str) -> ModuleType:
    op = _loaded.get(name)
    if op is not None:
        return op
    module = OP_MODULES.get(name)
    if module is None:
        raise ArgumentError("op", f"one of {', '.join(op_names())}", name)
    try:
        op = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module}":
            raise
        raise ArgumentError("op", f"an op available in this build ({', '.join(op_names())})", name) from exc
    _loaded[name] = op
    return op


def op_names() -> list[str]:
    """The ops whose modules are present."""
    here = Path(__file__).resolve().parent
    return sorted(n for n, m in OP_MODULES.items() if (here / f"{m}.py").is_file())
