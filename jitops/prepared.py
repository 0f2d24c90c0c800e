"""Prepared plans: a problem's schedule, its compiled and loaded steps, and what running them needs.

A plan is prepared once per (op, shapes, attributes, backend) and kept in `_cache`; every way of
running one (the public call path in engine.py, the raw-pointer runners of pointer_runner.py, the
tuner) launches its steps through `launch_step`, fills derived workspaces through `prepare_for`
and takes persistent workspaces from `persistent_workspace`.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Mapping

from . import codegen
from .cache import loader
from .derived import DerivedCache
from .device import DeviceInfo
from .errors import ArgumentError
from .fastcall import BoundCall
from .ops import get_op
from .ops.base import ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule
from .records import store as record_store
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
        failure = plan_failure(op, problem, found[0], device)
        if failure is None:
            return found
        log.warning("ignoring %s record for %s: %s (using the heuristic)", found[1], problem.key(), failure)
    return op.heuristic(problem, device), "heuristic"


def plan_failure(op: ModuleType, problem: Any, schedule: Schedule, device: DeviceInfo) -> str | None:
    """Why a recorded schedule no longer plans for this problem (a record from another jitops
    version may name parameters the op no longer takes), or None when it does."""
    try:
        op.plan(problem, schedule, device)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


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


# ---------------------------------------------------------------- the cache of prepared plans

class _Cache:
    def __init__(self) -> None:
        self.by_call: dict[tuple, Prepared] = {}         # general path: by shapes and attributes
        self.bound: dict[tuple, BoundCall | None] = {}   # repeat-call path: by call signature
        self.dispatch: dict[str, Any] = {}                 # native repeat calls (no out, no schedule): by op, kept
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
        for d in _cache.dispatch.values():    # emptied, not dropped: the public functions hold them
            d.clear()
        _cache.generation += 1


def generation() -> int:
    """Changes whenever prepared plans are dropped: a cached pointer_runner older than this is stale."""
    return _cache.generation


def launch_step(step: Step, ptrs: Mapping[str, tuple[int, int]], itemsizes: Mapping[str, int], backend: Backend,
            stream: int) -> None:
    packed = step.packed
    for index, name in step.buffer_slots:
        ptr, nbytes = ptrs[name]
        packed.set_buffer(index, ptr, nbytes, itemsizes.get(name, 1))
    step.run(packed, stream)


def persistent_workspace(p: Prepared, ws: Any, backend: Backend, stream: int) -> int:
    """A workspace kept across calls (self-resetting counters): allocated, and zeroed, once."""
    ptr = p.persistent.get(ws.name)
    if ptr is None:
        ptr = backend.alloc(ws.nbytes)
        if ws.zero:
            backend.memset(ptr, 0, ws.nbytes, stream)
        p.persistent[ws.name] = ptr
    return ptr


def prepare_for(p: Prepared, identity: Any, sources: Any, ptrs: dict[str, tuple[int, int]], backend: Backend,
                 stream: int) -> None:
    """Derived workspaces for inputs of this identity (None: unknown, recompute), filled if new."""
    fresh = True
    if p.derived is not None:
        wptrs, fresh = p.derived.get(identity, stream, sources)
        sizes = {w.name: w.nbytes for w in p.derived.workspaces}
        ptrs.update({n: (ptr, sizes[n]) for n, ptr in wptrs.items()})
    if fresh:
        for step in p.prepare_steps:
            launch_step(step, ptrs, p.itemsizes, backend, stream)


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
