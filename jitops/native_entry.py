"""The public functions as native entries: a repeat call reaches its C dispatch with no Python frame.

An Entry (runtime/native/jitops_dispatch.c) stands in for a public function of api.py. It binds
the call's arguments to the function's parameters, sorts them into the inputs and attributes the
op's Dispatch is keyed by (the tuples the function would pass to engine.repeat_call), reads the
current backend and runs the matching native repeat call; every other call goes to the Python
function unchanged (its errors, its general path). help(), inspect.signature() and pickling see
the Python function. Without the native module the Python functions are the public ones.

How a parameter is sorted follows from the signature: `out`, `schedule` and `layout` belong to
the engine (only None stays on the native path), a parameter annotated `Any` is an array (an
input), any other is an attribute; both in signature order, as api.py lists them to repeat_call
(tests/test_native_entry.py holds every function to that).
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

log = logging.getLogger("jitops.engine")

ENGINE_KEYWORDS = ("out", "schedule", "layout")
INPUT, ATTRIBUTE, NONE_ONLY = 0, 1, 2
_REQUIRED = object()


def roles(fn: Callable) -> tuple[tuple[str, ...], int, tuple[Any, ...], bytes]:
    """(names, how many may be positional, defaults or _REQUIRED, role per parameter) of `fn`."""
    names, defaults, kinds = [], [], []
    positional = 0
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"{fn.__name__}: a native entry takes named parameters only ({p.name})")
        if p.kind == p.POSITIONAL_OR_KEYWORD:
            positional += 1
        names.append(p.name)
        defaults.append(_REQUIRED if p.default is p.empty else p.default)
        if p.name in ENGINE_KEYWORDS:
            kinds.append(NONE_ONLY)
        elif p.annotation in ("Any", Any):
            kinds.append(INPUT)
        else:
            kinds.append(ATTRIBUTE)
    return tuple(names), positional, tuple(defaults), bytes(kinds)


def split(fn: Callable, *args: Any, **kwargs: Any) -> tuple[tuple, tuple] | None:
    """The (inputs, attributes) an entry for `fn` hands its Dispatch for this call, or None when
    it hands the call to `fn` (the Python model of the C code, for tests)."""
    names, positional, defaults, kinds = roles(fn)
    if len(args) > positional or any(k not in names for k in kwargs) or any(n in kwargs for n in names[:len(args)]):
        return None
    values = [args[i] if i < len(args) else kwargs.get(n, defaults[i]) for i, n in enumerate(names)]
    if any(v is _REQUIRED for v in values) or any(v is not None for v, k in zip(values, kinds) if k == NONE_ONLY):
        return None
    return (tuple(v for v, k in zip(values, kinds) if k == INPUT),
            tuple(v for v, k in zip(values, kinds) if k == ATTRIBUTE))


def native_entry(fn: Callable) -> Callable:
    """`fn` as an Entry for the op of its name, or `fn` itself without the native module."""
    from . import engine
    from . import runtime
    dispatch = engine.dispatch_table(fn.__name__)
    if dispatch is None:
        return fn
    from .runtime.fastlaunch import native_launcher
    names, positional, defaults, kinds = roles(fn)
    entry = native_launcher(quiet=True).Entry(fn, dispatch, names, positional, defaults, _REQUIRED, kinds,
                                              runtime._local, vars(runtime), runtime.current_backend)
    return functools.update_wrapper(entry, fn)


def native_entries(*fns: Callable) -> tuple[Callable, ...]:
    """native_entry of each, or the functions themselves when anything about that goes wrong."""
    try:
        return tuple(native_entry(fn) for fn in fns)
    except Exception as exc:    # a broken cache location, an old prebuilt module, ...: Python still works
        log.warning("public functions stay in Python (no native entries): %s", exc)
        return fns
