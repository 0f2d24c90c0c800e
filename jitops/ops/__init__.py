"""Operator modules. Each knows shapes, schedules and templates, and nothing about runtimes."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ArgumentError

# op name -> module under jitops.ops
OP_MODULES = {
    "leaky_relu": "leaky_relu",
}


_loaded: dict[str, ModuleType] = {}


def get_op(name: str) -> ModuleType:
    op = _loaded.get(name)
    if op is not None:
        return op
    module = OP_MODULES.get(name)
    if module is None:
        raise ArgumentError("op", f"one of {', '.join(sorted(OP_MODULES))}", name)
    op = _loaded[name] = importlib.import_module(f"{__name__}.{module}")
    return op


def op_names() -> list[str]:
    return sorted(OP_MODULES)
