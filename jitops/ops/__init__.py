"""Operator modules and the op registry. Each op module knows shapes, schedules and templates, and
nothing about runtimes.

The registry is `OP_MODULES` (one line per op) plus each module's own `REGISTRATION`
(`base.Registration`: its bench module, tuning problems, vendor op and ONNX types). Everything
that lists ops derives from here: `jitops bench`'s order (`bench_ops`), the shipped-schedule
problems (`jitops.tuning.shipped`), the tuner's vendor column (`jitops.tuning.vendor`) and the
ONNX op-type table (`onnx_ops`).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..errors import ArgumentError
from .base import Registration

# op name -> module: a name under jitops.ops, or a full dotted path (ops registered from outside)
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


def register(name: str, module: str | ModuleType) -> None:
    """Add (or replace) an op: `module` is a name under jitops.ops, a full dotted path, or a module."""
    _loaded.pop(name, None)
    if isinstance(module, ModuleType):
        _loaded[name] = module
        module = module.__name__
    OP_MODULES[name] = module


def unregister(name: str) -> None:
    OP_MODULES.pop(name, None)
    _loaded.pop(name, None)


def get_op(name: str) -> ModuleType:
    op = _loaded.get(name)
    if op is not None:
        return op
    module = OP_MODULES.get(name)
    if module is None:
        raise ArgumentError("op", f"one of {', '.join(op_names())}", name)
    op = importlib.import_module(module if "." in module else f"{__name__}.{module}")
    _loaded[name] = op
    return op


def op_names() -> list[str]:
    """Every registered op, sorted."""
    return sorted(OP_MODULES)


def registration(name: str) -> Registration:
    """The op's declarations (`REGISTRATION` in its module, else the defaults)."""
    return getattr(get_op(name), "REGISTRATION", None) or Registration()


def bench_module(name: str) -> str | None:
    """The dotted name of the op's bench module, or None when it declares none."""
    bench = registration(name).bench
    return None if bench is None else (bench or f"jitops.bench.{name}")


def bench_ops() -> list[str]:
    """Ops with a benchmark, in `op_names` order (a declared bench module that does not import
    fails `jitops bench` and tests/test_registry.py, never silently drops out)."""
    return [op for op in op_names() if bench_module(op) is not None]


def resolve(ref: str) -> Any:
    """The object a "module:attribute" reference names."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"'{ref}' is not a 'module:attribute' reference")
    return getattr(importlib.import_module(module), attr)


def onnx_ops() -> dict[str, str]:
    """Standard ONNX op type -> the jitops op that runs it, from every op's `onnx` declaration."""
    table: dict[str, str] = {}
    for op in op_names():
        for onnx_op in registration(op).onnx:
            if table.setdefault(onnx_op, op) != op:
                raise ValueError(f"ONNX op {onnx_op} is declared by both {table[onnx_op]} and {op}")
    return table
