"""The engine: problem -> schedule -> rendered source -> cached binary -> launch on the caller's stream.

This package of three modules is the only place where ops meet a runtime: `prepared` turns a
problem into a kept plan (schedule, compiled steps, workspaces), this module runs plans on the
caller's arrays (the public call path and its repeat paths), `pointer_runner` on raw pointers
(ONNX Runtime). Everything a repeated call needs is prepared once per (op, shapes, attributes,
backend), so a cached call costs array classification, output allocation and the launches.
The names re-exported here (select_schedule, prepare, compile_problem, run_pointers, ...) are
the engine's API for the rest of jitops.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Mapping

import numpy as np

from . import arrays
from .errors import ArgumentError
from .bound_plan import BoundPlan, NoFastPath, signature, torch_identity
from .ops import get_op
from .ops.base import Schedule, TensorSpec, frozen_items
from .pointer_runner import pointer_runner, run_pointers  # noqa: F401  (part of the engine's API)
from .prepared import (CompiledKernel, Prepared, Slot, Step, StreamScratch, _cache, alignment_error,  # noqa: F401
                       backend_scratch, bind, bind_and_launch, clear_prepared, compile_problem, generation,
                       kernel_source, misaligned, persistent_workspace, prepare, prepare_for, select_schedule)
from .runtime import current_backend
from .runtime.base import Backend

__all__ = ["run", "repeat_call", "MISS", "dispatch_table", "select_schedule", "prepare", "Prepared", "Step",
           "Slot", "kernel_source", "compile_problem", "CompiledKernel", "clear_prepared", "generation", "bind",
           "bind_and_launch", "StreamScratch", "persistent_workspace", "prepare_for", "pointer_runner", "run_pointers"]

log = logging.getLogger("jitops.engine")


# ---------------------------------------------------------------- the public call path

def _fingerprint(ref: arrays.ArrayRef) -> Any:
    """Identity of an input's contents, or None when it cannot be known cheaply (then recompute).

    torch tensors: pointer and version counter (bumped by every in-place change); host arrays:
    a hash of the contents. Shape and dtype are fixed within one prepared plan.
    """
    if ref.kind == "torch":
        return torch_identity(ref.obj)
    if ref.host:
        view = arrays.host_view(ref)
        return ("host", hashlib.blake2b(view.reshape(-1).view(np.uint8), digest_size=16).hexdigest())
    return None


def run(op_name: str, tensors: Mapping[str, Any], attrs: Mapping[str, Any], out: Mapping[str, Any] | None = None,
        schedule: Schedule | str | None = None, backend: Backend | None = None) -> Any:
    """Run an op on arrays. Returns the single output, or a tuple in the op's output order."""
    backend = backend or current_backend()
    values = tuple(tensors.values())
    try:
        key: tuple | None = (op_name, backend, schedule, tuple(attrs.values()), *map(signature, values))
        bound = _cache.bound.get(key)
        if bound:
            return bound.run(values, out)
    except TypeError:   # an unhashable attribute (a list): key it by a hashable copy
        key = (op_name, backend, schedule, _hashable(attrs), *map(signature, values))
        bound = _cache.bound.get(key)
        if bound:
            return bound.run(values, out)
    except NoFastPath:
        key = None
    result, prepared, refs = _run_general(op_name, tensors, attrs, out, schedule, backend)
    if key is not None and key not in _cache.bound:
        bound = _cache.bound[key] = _bind(prepared, backend, tensors, refs)
        if bound is not None and bound.native is not None and schedule is None:
            dispatch_table(op_name).add(backend, tuple(attrs.values()), bound.native)
    return result


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


MISS = object()   # what repeat_call (a Dispatch) returns when no native repeat call matches


def repeat_call(op_name: str, values: tuple, attrs: tuple) -> Any:
    """The public functions' first try for a call without `out` or `schedule`: an earlier call's
    native repeat path when backend, attributes and input signatures match, else MISS. `values`
    and `attrs` in the order the function passes them to run(). run() itself does not try this
    again (a miss would scan the op's native calls twice); direct callers of run() get the
    generated Python repeat path."""
    dispatch = _cache.dispatch.get(op_name)
    if dispatch is None or not dispatch:
        return MISS
    return dispatch(current_backend(), values, attrs)


def dispatch_table(op_name: str) -> Any:
    """The op's Dispatch (native repeat calls, by signature): made once and kept for the process
    (the op's public function holds it; clear_prepared empties it), None without the native module."""
    dispatch = _cache.dispatch.get(op_name)
    if dispatch is None:
        from .runtime.fastlaunch import native_launcher
        module = native_launcher(quiet=True)
        if module is None:
            return None
        with _cache.lock:
            dispatch = _cache.dispatch.setdefault(op_name, module.Dispatch(MISS))
    return dispatch


def _hashable(attrs: Mapping[str, Any]) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v for v in attrs.values())


def _bind(prepared: Prepared, backend: Backend, tensors: Mapping[str, Any],
          refs: Mapping[str, arrays.ArrayRef]) -> BoundPlan | None:
    """A BoundPlan for repeat calls, or None when this call must always take the general path."""
    kinds = {r.kind for r in refs.values()}
    if len(kinds) != 1 or kinds - {"torch", "numpy"}:
        return None
    if any(r.obj is not tensors[n] for n, r in refs.items()):
        return None     # an input was copied (a channels_last tensor where the op reads C order)
    if any(r.layout and (r.kind != "torch" or r.obj.is_contiguous()) for r in refs.values()):
        return None     # a layout declared with layout= (arrays whose own shape is the storage's): the general path
    first = next(iter(refs.values()))
    if first.host and backend.name != "cpu":
        return None     # host arrays on a GPU are staged through device memory: general path
    try:
        return BoundPlan(prepared, backend, list(tensors), first.obj, tuple(tensors.values()))
    except NoFastPath:
        return None


def _run_general(op_name: str, tensors: Mapping[str, Any], attrs: Mapping[str, Any],
                 out: Mapping[str, Any] | None, schedule: Schedule | str | None,
                 backend: Backend) -> tuple[Any, Prepared, dict[str, arrays.ArrayRef]]:
    op = get_op(op_name)
    layout, op_attrs = _split_layout(op, op_name, attrs)
    layout_inputs = getattr(op, "LAYOUT_INPUTS", ())
    refs = {n: arrays.wrap(v, n, op_name, layout if n in layout_inputs else "")
            for n, v in tensors.items() if v is not None}
    if not refs:
        raise ArgumentError(op.INPUTS[0], "an array", None, op=op_name)
    as_they_are = (*layout_inputs, *getattr(op, "FORMAT_INPUTS", ()))
    op_layouts = getattr(op, "LAYOUTS", ("nhwc",))
    for n, r in list(refs.items()):
        if r.layout and (n not in as_they_are or r.layout not in op_layouts):
            if r.kind != "torch":     # a strided device array (attention's layouts): no copy method to call
                raise ArgumentError(n, "a C-contiguous device array", f"a {r.layout} ({arrays.LAYOUTS[r.layout][1]}) "
                                    f"strided one", op=op_name)
            # e.g. conv weights of a model moved to channels_last: read a contiguous copy (correct,
            # but a copy per call and no repeat path: say once how to avoid it)
            what = "channels_last" if r.layout == "nhwc" else f"{r.layout} ({arrays.LAYOUTS[r.layout][1]} storage)"
            _warn_once(f"{op_name}: '{n}' is a {what} tensor; it is copied to a contiguous one on "
                       f"every call (pass {n}.contiguous() once to avoid the copy)")
            refs[n] = arrays.wrap(r.obj.contiguous(), n, op_name, "")
    host = arrays.check_placement(refs, backend, op_name)
    call_key = (op_name, id(backend), schedule,
                tuple((n, r.shape, r.dtype, r.layout, r.pitch) for n, r in refs.items()), frozen_items(attrs))
    prepared = _cache.by_call.get(call_key)
    if prepared is None:
        specs = {n: TensorSpec(tuple(r.shape), r.dtype, r.layout, r.pitch) for n, r in refs.items()}
        specs.update({n: None for n in tensors if tensors[n] is None})
        problem = op.make_problem(specs, op_attrs)
        backend.require_device(f"run {op_name}")
        stream = 0 if host else arrays.current_stream(next(iter(refs.values())))
        prepared = prepare(op, problem, backend, schedule, stream)
        with _cache.lock:
            _cache.by_call[call_key] = prepared
    return _execute(prepared, refs, host, backend, out), prepared, refs


def _split_layout(op: Any, op_name: str, attrs: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The `layout` attribute is the engine's, not the op's: it says how to read the arrays the
    op declares in LAYOUT_INPUTS (one of the op's LAYOUTS, ("nhwc",) unless it says otherwise:
    their own shape is then (N, H, W, C); attention's "bshd" / "sbhd": [B, S, H, D] / [S, B, H, D]).
    Returns it and the attributes the op sees."""
    if "layout" not in attrs:
        return "", attrs
    op_layouts = getattr(op, "LAYOUTS", ("nhwc",))
    default = getattr(op, "DEFAULT_LAYOUT", "nchw")
    layout = attrs["layout"]
    layout = "" if layout in (None, "", default) else layout
    if layout and (layout not in op_layouts or not getattr(op, "LAYOUT_INPUTS", ())):
        allowed = (f"None, {', '.join(repr(x) for x in (default, *op_layouts))}"
                   if getattr(op, "LAYOUT_INPUTS", ()) else "None")
        raise ArgumentError("layout", allowed, repr(attrs["layout"]), op=op_name)
    return layout, {k: v for k, v in attrs.items() if k != "layout"}


def _execute(p: Prepared, refs: dict[str, arrays.ArrayRef], host: bool, backend: Backend,
             out: Mapping[str, Any] | None) -> Any:
    primary = next(iter(refs.values()))
    out_specs = p.problem.outputs()
    results: dict[str, Any] = {}
    ptrs: dict[str, int] = {}
    staged: list[int] = []
    copy_back: list[tuple[np.ndarray, int, int]] = []
    stream = 0 if host else arrays.current_stream(primary)
    needs_staging = host and backend.name != "cpu"

    for name, spec in out_specs.items():
        given = (out or {}).get(name)
        if given is not None:
            ref = _wrap_out(given, _out_argument(name, out_specs), p.op, spec)
            if ref is None:
                ref = arrays.wrap(given, _out_argument(name, out_specs), p.op, spec.layout)
                raise ArgumentError("out", _expected_storage(spec), f"{_shape_and_strides(given)}, dtype {ref.dtype}"
                                    f"{f', rows {ref.pitch} elements apart' if ref.pitch else ''}", op=p.op)
            if ref.host != host:
                raise ArgumentError("out", "an array on the same side as the inputs", ref.describe(), op=p.op)
            obj, ptr = given, ref.ptr
        else:
            obj, ptr = arrays.allocate_like(primary, spec.shape, spec.dtype, backend, spec.layout)
        results[name] = obj
        if needs_staging or (host and _misses(p, name, ptr)):
            dptr = backend.alloc(spec.nbytes)
            staged.append(dptr)
            host_arr = arrays.host_storage(obj)
            copy_back.append((host_arr, dptr, spec.nbytes))
            ptr = dptr
        ptrs[name] = ptr

    try:
        for name, ref in refs.items():
            if needs_staging or (host and _misses(p, name, ref.ptr)):
                dptr = backend.alloc(ref.nbytes)
                staged.append(dptr)
                if ref.nbytes:
                    backend.copy_to_device(dptr, arrays.host_view(ref), ref.nbytes)
                ptrs[name] = dptr
            else:
                ptrs[name] = ref.ptr
        for name in misaligned(p, ptrs):     # device arrays: refused here, before any launch
            raise alignment_error(p, name, ptrs[name], _out_argument(name, out_specs) if name in out_specs else name)
        with p.lock:     # workspaces too: a per-stream one is zeroed and used by one call at a time
            for ws in p.plan.workspaces:
                if not ws.derived_from:
                    ptrs[ws.name] = _workspace(p, ws, backend, primary, results, stream)
            _run_prepare_steps(p, refs, ptrs, backend, stream)
            for step in p.steps:
                bind_and_launch(step, ptrs, stream)
        for host_arr, dptr, nbytes in copy_back:
            if nbytes:
                backend.copy_to_host(host_arr, dptr, nbytes, stream)
        if needs_staging:
            backend.synchronize(stream)
    finally:
        for dptr in staged:
            backend.free(dptr)
    values = [results[n] for n in out_specs]
    return values[0] if len(values) == 1 else tuple(values)


def _wrap_out(given: Any, argument: str, op: str, spec: TensorSpec) -> arrays.ArrayRef | None:
    """A given output that is stored as `spec` says, or None. Read as declared in the spec's layout first
    (arrays whose own shape is the storage's), then as itself: a torch view whose memory is the layout's
    while it is also C-contiguous (a bshd output with one query row)."""
    for layout in dict.fromkeys((spec.layout, "")):
        ref = arrays.wrap(given, argument, op, layout)
        if (tuple(ref.shape) == tuple(spec.shape) and ref.dtype == spec.dtype and ref.pitch == spec.pitch
                and arrays.same_memory_order(spec.shape, ref.layout, spec.layout)):
            return ref
    return None


def _expected_storage(spec: TensorSpec) -> str:
    """What an output must be, memory order included (a mismatch of memory format alone would otherwise
    read as 'expected shape S, got shape S')."""
    if not spec.layout:
        return f"shape {spec.shape}, C-contiguous, dtype {spec.dtype}"
    order = arrays.LAYOUTS[spec.layout][1]
    return (f"shape {spec.shape} stored as {order}{' densely' if spec.layout == 'bshd' else ''} (a torch view in "
            f"that memory order, or an array of shape {spec.storage_shape}), dtype {spec.dtype}")


def _shape_and_strides(given: Any) -> str:
    """An array's own shape and strides in elements, as the caller sees them."""
    shape = tuple(getattr(given, "shape", ()))
    stride = getattr(given, "stride", None)
    if callable(stride):                                   # torch
        return f"shape {shape}, strides {tuple(stride())}"
    strides, itemsize = getattr(given, "strides", None), getattr(given, "itemsize", 0)
    if strides is not None and itemsize:                   # numpy / CuPy: bytes
        return f"shape {shape}, strides {tuple(st // itemsize for st in strides)}"
    return f"shape {shape}"


def _out_argument(name: str, out_specs: Mapping[str, Any]) -> str:
    """How the caller knows output `name`: `out`, or `out['sum']` where there are several."""
    return f"out[{name!r}]" if len(out_specs) > 1 else "out"


def _misses(p: Prepared, name: str, ptr: int) -> bool:
    """Whether host array `name` at `ptr` misses the alignment p's kernels need, and so is staged
    through aligned memory (as host arrays always are on a GPU): it works on every backend."""
    need = p.alignment.get(name)
    if need is None or ptr % need[0] == 0:
        return False
    log.debug("%s: '%s' is %d bytes off the %d-byte alignment of %s: staged through an aligned copy",
              p.op, name, ptr % need[0], need[0], need[1])
    return True


def _workspace(p: Prepared, ws: Any, backend: Backend, primary: arrays.ArrayRef, keep: dict,
               stream: int) -> int:
    """A workspace of this call (the caller holds the plan's lock). Per-call ones come from the
    framework's allocator for torch tensors (inside a CUDA-graph capture: the graph's pool), else
    from the plan's per-stream scratch: allocated once per stream, never freed per call (a device
    free would synchronize the device on every call)."""
    if ws.persistent:
        return persistent_workspace(p, ws, backend, stream)
    if primary.kind == "torch" and not primary.host:
        obj, ptr = arrays.allocate_like(primary, (ws.nbytes,), "uint8", backend)
        keep[f"__ws_{ws.name}"] = obj
    else:
        if p.stream_scratch is None:
            p.stream_scratch = backend_scratch(
                [w for w in p.plan.workspaces if not w.persistent and not w.derived_from], backend)
            p.backend = p.backend or backend
        ptr = p.stream_scratch.get(stream)[ws.name]
    if ws.zero:
        backend.memset(ptr, 0, ws.nbytes, stream)
    return ptr


def _run_prepare_steps(p: Prepared, refs: Mapping[str, arrays.ArrayRef], ptrs: dict[str, int],
                       backend: Backend, stream: int) -> None:
    """Point the derived workspaces at the copy for these inputs; fill it first if it is new."""
    if not p.prepare_steps:
        return
    identity, sources = None, []
    if p.derived is not None:
        ids = tuple(_fingerprint(refs[n]) if n in refs else None for n in p.derived.inputs)
        sources = [refs[n].obj for n in p.derived.inputs if n in refs and refs[n].kind == "torch"]
        identity = None if any(i is None for i in ids) else ids
    prepare_for(p, identity, sources, ptrs, backend, stream)
