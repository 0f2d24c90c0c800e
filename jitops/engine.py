"""The engine: problem -> schedule -> rendered source -> cached binary -> launch on the caller's stream.

This is the only place where ops meet a runtime. Everything a repeated call needs (schedule,
loaded kernels, packed arguments) is prepared once per (op, shapes, attributes, backend) and kept,
so a cached call costs array classification, output allocation and the launches themselves.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np

from . import arrays, codegen
from .cache import loader
from .device import DeviceInfo
from .errors import ArgumentError
from .derived import DerivedCache
from .fastcall import BoundCall, NoFastPath, signature, torch_identity
from .ops import get_op
from .ops.base import ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, TensorSpec, frozen_items
from .records import store as record_store
from .runtime import current_backend
from .runtime.base import Backend, Kernel, PackedArgs

log = logging.getLogger("jitops.engine")


# ---------------------------------------------------------------- schedules

def select_schedule(op: ModuleType, problem: Any, device: DeviceInfo,
                    forced: Schedule | str | None = None) -> tuple[Schedule, str]:
    """The schedule to run and where it came from: forced, user/bundle/shipped record, or heuristic."""
    if isinstance(forced, Schedule):
        return forced, "forced"
    if isinstance(forced, str):
        return op.heuristic(problem, device, algorithm=forced), "forced"
    if forced is not None:
        raise ArgumentError("schedule", "a jitops Schedule or an algorithm name", type(forced).__name__, op=op.NAME)
    found = record_store().lookup(device, op.NAME, problem.key())
    if found is not None:
        try:   # a record from another jitops version may name parameters the op no longer takes
            op.plan(problem, found[0], device)
            return found
        except Exception as exc:
            log.warning("ignoring %s record for %s: %s (using the heuristic)", found[1], problem.key(), exc)
    return op.heuristic(problem, device), "heuristic"


# ---------------------------------------------------------------- prepared plans

@dataclass
class Step:
    launch: Launch
    kernel: Kernel
    packed: PackedArgs
    buffer_slots: tuple[tuple[int, str], ...]
    run: Any = None     # backend.bind_launch(...): (packed, stream) -> None


@dataclass
class Prepared:
    op: str
    problem: Any
    schedule: Schedule
    origin: str
    plan: Plan
    steps: list[Step]
    prepare_steps: list[Step]
    itemsizes: dict[str, int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    persistent: dict[str, int] = field(default_factory=dict)       # workspace name -> pointer
    derived: DerivedCache | None = None   # workspaces computed from inputs, per input identity
    backend: Any = None                   # owner of the persistent and derived memory
    # run_pointers: per-call workspaces kept per stream (stream order makes reuse safe), LRU
    stream_scratch: OrderedDict[int, dict[str, int]] = field(default_factory=OrderedDict)
    runner: Any = None                    # pointer_runner's function, made on first use


def kernel_source(device: DeviceInfo, launch: Launch) -> str:
    return codegen.full_source(device, launch.template, launch.template_params)


def _label(op: str, launch: Launch) -> str:
    return f"{op}.{launch.kernel}"


def _make_step(op: str, launch: Launch, backend: Backend, itemsizes: Mapping[str, int]) -> Step:
    source = kernel_source(backend.device, launch)
    kernel = loader().kernels(backend, source, [launch.kernel], _label(op, launch))[launch.kernel]
    kinds, names, slots = [], [], []
    for i, a in enumerate(launch.args):
        if isinstance(a, Buf):
            kinds.append("ptr")
            names.append(a.name)
            slots.append((i, a.name))
        else:
            kinds.append(a.kind)
            names.append(f"arg{i}")
    packed = PackedArgs(kinds, names)
    for i, a in enumerate(launch.args):
        if isinstance(a, Scalar):
            packed.set(i, a.value)
    run = backend.bind_launch(kernel, launch.grid, launch.block, launch.shared_bytes)
    return Step(launch, kernel, packed, tuple(slots), run)


def _itemsizes(problem: Any, plan: Plan) -> dict[str, int]:
    sizes = {n: ITEMSIZE[s.dtype] for n, s in {**problem.inputs(), **problem.outputs()}.items() if s is not None}
    sizes.update({w.name: 1 for w in plan.workspaces})
    return sizes


def prepare(op: ModuleType, problem: Any, backend: Backend, schedule: Schedule | str | None = None) -> Prepared:
    sched, origin = select_schedule(op, problem, backend.device, schedule)
    plan = op.plan(problem, sched, backend.device)
    sizes = _itemsizes(problem, plan)
    steps = [_make_step(op.NAME, l, backend, sizes) for l in plan.launches]
    prep = [_make_step(op.NAME, l, backend, sizes) for l in plan.prepare]
    log.debug("%s %s -> %s [%s]", op.NAME, problem.key(), sched, origin)
    derived = DerivedCache(plan.workspaces, backend) if any(w.derived_from for w in plan.workspaces) else None
    return Prepared(op.NAME, problem, sched, origin, plan, steps, prep, sizes, derived=derived, backend=backend)


# ---------------------------------------------------------------- running

class _Cache:
    def __init__(self) -> None:
        self.by_call: dict[tuple, Prepared] = {}         # general path: by shapes and attributes
        self.bound: dict[tuple, BoundCall | None] = {}   # repeat-call path: by call signature
        self.dispatch: dict[str, Any] = {}                 # native repeat calls (no out, no schedule): by op
        self.lock = threading.Lock()
        self.generation = 0     # bumped by clear_prepared: runners held elsewhere must be fetched anew


_cache = _Cache()


def clear_prepared() -> None:
    """Forget every prepared plan (e.g. after tuning records change) and free its device memory."""
    with _cache.lock:
        for p in _cache.by_call.values():
            if p.derived is not None:
                p.derived.release()
            if (p.persistent or p.stream_scratch) and p.backend is not None:
                p.backend.synchronize()
                for ptr in [*p.persistent.values(), *(q for ws in p.stream_scratch.values() for q in ws.values())]:
                    p.backend.free(ptr)
            p.persistent.clear()       # a runner still held somewhere allocates anew, never reuses freed memory
            p.stream_scratch.clear()
        _cache.by_call.clear()
        _cache.bound.clear()
        for d in _cache.dispatch.values():
            d.clear()
        _cache.dispatch.clear()
        _cache.generation += 1


def generation() -> int:
    """Changes whenever prepared plans are dropped: a cached pointer_runner older than this is stale."""
    return _cache.generation


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
            from .runtime.fastlaunch import native_launcher
            dispatch = _cache.dispatch.get(op_name)
            if dispatch is None:
                dispatch = _cache.dispatch[op_name] = native_launcher().Dispatch(MISS)
            dispatch.add(backend, tuple(attrs.values()), bound.native)
    return result


MISS = object()   # what repeat_call (a Dispatch) returns when no native repeat call matches


def repeat_call(op_name: str, values: tuple, attrs: tuple) -> Any:
    """The public functions' first try for a call without `out` or `schedule`: an earlier call's
    native repeat path when backend, attributes and input signatures match, else MISS. `values`
    and `attrs` in the order the function passes them to run(). run() itself does not try this
    again (a miss would scan the op's native calls twice); direct callers of run() get the
    generated Python repeat path."""
    dispatch = _cache.dispatch.get(op_name)
    if dispatch is None:
        return MISS
    return dispatch(current_backend(), values, attrs)


def _hashable(attrs: Mapping[str, Any]) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v for v in attrs.values())


def _bind(prepared: Prepared, backend: Backend, tensors: Mapping[str, Any],
          refs: Mapping[str, arrays.ArrayRef]) -> BoundCall | None:
    """A BoundCall for repeat calls, or None when this call must always take the general path."""
    kinds = {r.kind for r in refs.values()}
    if len(kinds) != 1 or kinds - {"torch", "numpy"}:
        return None
    if any(r.layout for r in refs.values()) or any(s.layout for s in prepared.problem.outputs().values()):
        return None     # memory formats other than C order: the general path allocates and checks them
    first = next(iter(refs.values()))
    if first.host and backend.name != "cpu":
        return None     # host arrays on a GPU are staged through device memory: general path
    try:
        return BoundCall(prepared, backend, list(tensors), first.obj, tuple(tensors.values()))
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
    for n, r in refs.items():
        if r.layout and n not in layout_inputs:
            raise ArgumentError(n, f"a contiguous tensor ({op_name} takes no channels_last '{n}'; call .contiguous())",
                                "a channels_last tensor", op=op_name)
    host = arrays.check_placement(refs, backend, op_name)
    call_key = (op_name, id(backend), schedule,
                tuple((n, r.shape, r.dtype, r.layout) for n, r in refs.items()), frozen_items(attrs))
    prepared = _cache.by_call.get(call_key)
    if prepared is None:
        specs = {n: TensorSpec(tuple(r.shape), r.dtype, r.layout) for n, r in refs.items()}
        specs.update({n: None for n in tensors if tensors[n] is None})
        problem = op.make_problem(specs, op_attrs)
        backend.require_device(f"run {op_name}")
        prepared = prepare(op, problem, backend, schedule)
        with _cache.lock:
            _cache.by_call[call_key] = prepared
    return _execute(prepared, refs, host, backend, out), prepared, refs


def _split_layout(op: Any, op_name: str, attrs: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The `layout` attribute is the engine's, not the op's: it says how to read the arrays the
    op declares in LAYOUT_INPUTS ("nhwc": their own shape is (N, H, W, C)). Returns it and the
    attributes the op sees."""
    if "layout" not in attrs:
        return "", attrs
    layout = attrs["layout"]
    layout = "" if layout in (None, "", "nchw") else layout
    if layout and (layout != "nhwc" or not getattr(op, "LAYOUT_INPUTS", ())):
        allowed = "None, 'nchw' or 'nhwc'" if getattr(op, "LAYOUT_INPUTS", ()) else "None"
        raise ArgumentError("layout", allowed, repr(attrs["layout"]), op=op_name)
    return layout, {k: v for k, v in attrs.items() if k != "layout"}


def _execute(p: Prepared, refs: dict[str, arrays.ArrayRef], host: bool, backend: Backend,
             out: Mapping[str, Any] | None) -> Any:
    primary = next(iter(refs.values()))
    out_specs = p.problem.outputs()
    results: dict[str, Any] = {}
    ptrs: dict[str, tuple[int, int]] = {}
    staged: list[int] = []
    copy_back: list[tuple[np.ndarray, int, int]] = []
    stream = 0 if host else arrays.current_stream(primary)
    needs_staging = host and backend.name != "cpu"

    for name, spec in out_specs.items():
        given = (out or {}).get(name)
        if given is not None:
            ref = arrays.wrap(given, f"out[{name!r}]" if len(out_specs) > 1 else "out", p.op, spec.layout)
            if tuple(ref.shape) != tuple(spec.shape) or ref.dtype != spec.dtype or ref.layout != spec.layout:
                raise ArgumentError("out", f"shape {spec.storage_shape}{' (N, H, W, C)' if spec.layout else ''} "
                                    f"and dtype {spec.dtype}",
                                    f"shape {tuple(ref.shape)} dtype {ref.dtype}", op=p.op)
            if ref.host != host:
                raise ArgumentError("out", "an array on the same side as the inputs", ref.describe(), op=p.op)
            obj, ptr = given, ref.ptr
        else:
            obj, ptr = arrays.allocate_like(primary, spec.shape, spec.dtype, backend, spec.layout)
        results[name] = obj
        if needs_staging:
            dptr = backend.alloc(spec.nbytes)
            staged.append(dptr)
            host_arr = arrays.host_storage(obj)
            copy_back.append((host_arr, dptr, spec.nbytes))
            ptr = dptr
        ptrs[name] = (ptr, spec.nbytes)

    try:
        for name, ref in refs.items():
            if needs_staging:
                dptr = backend.alloc(ref.nbytes)
                staged.append(dptr)
                if ref.nbytes:
                    backend.copy_to_device(dptr, arrays.host_view(ref), ref.nbytes)
                ptrs[name] = (dptr, ref.nbytes)
            else:
                ptrs[name] = (ref.ptr, ref.nbytes)
        for ws in p.plan.workspaces:
            if not ws.derived_from:
                ptrs[ws.name] = (_workspace(p, ws, backend, primary, staged, results, stream), ws.nbytes)
        with p.lock:
            _run_prepare_steps(p, refs, ptrs, backend, stream)
            for step in p.steps:
                _launch(step, ptrs, p.itemsizes, backend, stream)
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


def _launch(step: Step, ptrs: Mapping[str, tuple[int, int]], itemsizes: Mapping[str, int], backend: Backend,
            stream: int) -> None:
    packed = step.packed
    for index, name in step.buffer_slots:
        ptr, nbytes = ptrs[name]
        packed.set_buffer(index, ptr, nbytes, itemsizes.get(name, 1))
    step.run(packed, stream)


def _persistent(p: Prepared, ws: Any, backend: Backend, stream: int) -> int:
    """A workspace kept across calls (self-resetting counters): allocated, and zeroed, once."""
    ptr = p.persistent.get(ws.name)
    if ptr is None:
        ptr = backend.alloc(ws.nbytes)
        if ws.zero:
            backend.memset(ptr, 0, ws.nbytes, stream)
        p.persistent[ws.name] = ptr
    return ptr


def _workspace(p: Prepared, ws: Any, backend: Backend, primary: arrays.ArrayRef, staged: list[int],
               keep: dict, stream: int) -> int:
    if ws.persistent:
        return _persistent(p, ws, backend, stream)
    if primary.kind == "torch" and not primary.host:
        obj, ptr = arrays.allocate_like(primary, (ws.nbytes,), "uint8", backend)
        keep[f"__ws_{ws.name}"] = obj
    else:
        ptr = backend.alloc(ws.nbytes)
        staged.append(ptr)
    if ws.zero:
        backend.memset(ptr, 0, ws.nbytes, stream)
    return ptr


def _run_prepare_steps(p: Prepared, refs: Mapping[str, arrays.ArrayRef], ptrs: dict[str, tuple[int, int]],
                       backend: Backend, stream: int) -> None:
    """Point the derived workspaces at the copy for these inputs; fill it first if it is new."""
    if not p.prepare_steps:
        return
    identity, sources = None, []
    if p.derived is not None:
        ids = tuple(_fingerprint(refs[n]) if n in refs else None for n in p.derived.inputs)
        sources = [refs[n].obj for n in p.derived.inputs if n in refs and refs[n].kind == "torch"]
        identity = None if any(i is None for i in ids) else ids
    _prepare_for(p, identity, sources, ptrs, backend, stream)


def _prepare_for(p: Prepared, identity: Any, sources: Any, ptrs: dict[str, tuple[int, int]], backend: Backend,
                 stream: int) -> None:
    """Derived workspaces for inputs of this identity (None: unknown, recompute), filled if new."""
    fresh = True
    if p.derived is not None:
        wptrs, fresh = p.derived.get(identity, stream, sources)
        sizes = {w.name: w.nbytes for w in p.derived.workspaces}
        ptrs.update({n: (ptr, sizes[n]) for n, ptr in wptrs.items()})
    if fresh:
        for step in p.prepare_steps:
            _launch(step, ptrs, p.itemsizes, backend, stream)


# ---------------------------------------------------------------- raw device pointers (ONNX Runtime CUDA/ROCm)

def run_pointers(op_name: str, inputs: Mapping[str, tuple[int, TensorSpec] | None], attrs: Mapping[str, Any],
                 outputs: Mapping[str, int], stream: int, backend: Backend | None = None,
                 schedule: Schedule | str | None = None) -> None:
    """Run an op on raw device pointers on a given stream (a framework's buffers, e.g. ONNX Runtime's).

    inputs: name -> (device pointer, TensorSpec), or None when absent; outputs: name -> device
    pointer of the problem's output size. Nothing is allocated except the plan's workspaces.
    """
    specs = {n: (v[1] if v is not None else None) for n, v in inputs.items()}
    runner = pointer_runner(op_name, specs, attrs, backend, schedule)
    ptrs = {n: v[0] for n, v in inputs.items() if v is not None}
    ptrs.update(outputs)
    runner(ptrs, stream)


def pointer_runner(op_name: str, specs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any],
                   backend: Backend | None = None, schedule: Schedule | str | None = None) -> Callable[..., None]:
    """A function (pointers by input and output name, stream, derived_key=None) -> None that runs
    this problem.

    Everything that does not change between calls (the plan, buffer sizes, argument slots) is
    worked out here once, so a framework calling per node (ONNX Runtime's CUDA / ROCm EPs) pays
    only for writing the pointers and launching. Data derived from inputs (transformed filters,
    folded BatchNorm; the inputs are `runner.derived_inputs`) is recomputed on every call unless
    the caller passes `derived_key`: a hashable that stands for those inputs' contents (e.g. the
    buffers of initializers, which keep their contents for a session's life).
    """
    backend = backend or current_backend()
    call_key = ("pointers", op_name, id(backend), schedule, tuple(specs.items()), frozen_items(attrs))
    prepared = _cache.by_call.get(call_key)
    if prepared is None:
        backend.require_device(f"run {op_name}")
        op = get_op(op_name)
        prepared = prepare(op, op.make_problem(specs, attrs), backend, schedule)
        with _cache.lock:
            _cache.by_call[call_key] = prepared
    runner = prepared.runner
    if runner is None:
        runner = prepared.runner = _make_pointer_runner(prepared, specs, backend)
    return runner


def _make_pointer_runner(p: Prepared, specs: Mapping[str, TensorSpec | None], backend: Backend
                         ) -> Callable[..., None]:
    sizes = {n: s.nbytes for n, s in specs.items() if s is not None}
    sizes.update({n: s.nbytes for n, s in p.problem.outputs().items()})
    persistent = [ws for ws in p.plan.workspaces if ws.persistent]
    scratch_ws = [ws for ws in p.plan.workspaces if not ws.persistent and not ws.derived_from]
    slots = [(step, [(i, name, p.itemsizes.get(name, 1)) for i, name in step.buffer_slots]) for step in p.steps]

    def run(ptrs: Mapping[str, int], stream: int, derived_key: Any = None) -> None:
        full = {n: (ptr, sizes[n]) for n, ptr in ptrs.items()}
        with p.lock:
            for ws in persistent:
                full[ws.name] = (_persistent(p, ws, backend, stream), ws.nbytes)
            if scratch_ws:
                scratch = _stream_scratch(p, scratch_ws, backend, stream)
                for ws in scratch_ws:
                    full[ws.name] = (scratch[ws.name], ws.nbytes)
                    if ws.zero:
                        backend.memset(scratch[ws.name], 0, ws.nbytes, stream)
            if p.prepare_steps:     # raw pointers say nothing of their contents: redone unless keyed
                _prepare_for(p, derived_key, (), full, backend, stream)
            for step, step_slots in slots:
                packed = step.packed
                for index, name, itemsize in step_slots:
                    ptr, nbytes = full[name]
                    packed.set_buffer(index, ptr, nbytes, itemsize)
                step.run(packed, stream)

    run.derived_inputs = tuple(p.derived.inputs) if p.derived is not None and p.prepare_steps else ()  # type: ignore[attr-defined]
    return run


_STREAMS_KEPT = 4


def _stream_scratch(p: Prepared, workspaces: list[Any], backend: Backend, stream: int) -> dict[str, int]:
    """The per-call `workspaces` of `p` for launches on `stream`, allocated once per stream.

    Calls on one stream run in order, so the next call may reuse what the last one used without
    waiting: no allocation, synchronize and free per call (each of which stalled ONNX Runtime's
    stream). Other streams get their own copies; the least recently used beyond a few is freed
    after a device-wide synchronize (its stream may be gone by then).
    """
    found = p.stream_scratch.get(stream)
    if found is not None:
        p.stream_scratch.move_to_end(stream)
        return found
    if len(p.stream_scratch) >= _STREAMS_KEPT:
        _, old = p.stream_scratch.popitem(last=False)
        backend.synchronize()
        for ptr in old.values():
            backend.free(ptr)
    found = {ws.name: backend.alloc(ws.nbytes) for ws in workspaces}
    p.stream_scratch[stream] = found
    p.backend = p.backend or backend
    return found


# ---------------------------------------------------------------- compile without running

@dataclass
class CompiledKernel:
    kernel: str
    template: str
    key: str
    binary_bytes: int
    compile_seconds: float
    origin: str
    source: str


def compile_problem(op_name: str, problem: Any, backend: Backend,
                    schedule: Schedule | str | None = None) -> tuple[Schedule, str, list[CompiledKernel]]:
    """Compile every kernel a problem needs for `backend` (which may be an offline target)."""
    op = get_op(op_name)
    sched, origin = select_schedule(op, problem, backend.device, schedule)
    plan = op.plan(problem, sched, backend.device)
    out = []
    for launch in (*plan.prepare, *plan.launches):
        source = kernel_source(backend.device, launch)
        built = loader().binary(backend, source, [launch.kernel], _label(op_name, launch))
        out.append(CompiledKernel(launch.kernel, launch.template, built.key, len(built.binary),
                                  built.compile_seconds, built.origin, source))
    return sched, origin, out
