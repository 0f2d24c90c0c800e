"""Operator modules. Each knows shapes, schedules and templates, and nothing about runtimes."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ArgumentError

# op name -> module under jitops.ops
OP_MODULES = {
    "leaky_relu": "leaky_relu",
}


def get_op(name: str) -> ModuleType:
    module = OP_MODULES.get(name)
    if module is None:
        raise ArgumentError("op", f"one of {', '.join(sorted(OP_MODULES))}", name)
    return importlib.import_module(f"{__name__}.{module}")


def op_names() -> list[str]:
    return sorted(OP_MODULES)
