"""Prepared plans: a problem's schedule, its compiled and loaded steps, and what running them needs.

A plan is prepared once per (op, shapes, attributes, backend) and kept in `_cache`. Each step
carries its slot table (`Step.slots`: which kernel argument takes which buffer, of what size and
item size, and whether it is a workspace), worked out here once. Every way of running a plan
writes pointers through `bind` / `bind_and_launch` (the public call path in engine.py, the
raw-pointer runners of pointer_runner.py, the tuner) or is built from the slot table (the repeat
paths of bound_plan.py: generated Python and the C RepeatCall); per-call workspaces kept per
stream come from one `StreamScratch`, persistent ones (kept per stream too: self-resetting
grid-barrier counters and partials must not be shared by launches running at once on two
streams) from `persistent_workspace`, derived ones through `prepare_for`.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

from . import codegen, config
from .cache import loader
from .derived import DerivedCache
from .device import DeviceInfo
from .errors import ArgumentError
from .ops import get_op
from .ops.base import ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, TensorMap
from .records import op_space, plan_failure, store as record_store
from .runtime.base import Backend, Kernel, PackedArgs
from .runtime.fastlaunch import memory_released

if TYPE_CHECKING:
    from .bound_plan import BoundPlan

log = logging.getLogger("jitops.engine")


# ---------------------------------------------------------------- schedules

def select_schedule(op: ModuleType, problem: Any, device: DeviceInfo, forced: Schedule | str | None = None,
                    backend: Backend | None = None, stream: int | None = None) -> tuple[Schedule, str]:
    """The schedule to run and where it came from: forced, user/bundle/shipped record, benchmark mode
    (given the backend that will run it and the call's stream), or heuristic."""
    if isinstance(forced, Schedule):
        return forced, "forced"
    if isinstance(forced, str):
        return op.heuristic(problem, device, algorithm=forced), "forced"
    if forced is not None:
        raise ArgumentError("schedule", "a jitops Schedule or an algorithm name", type(forced).__name__, op=op.NAME)
    found = record_store().lookup(device, op.NAME, problem.key(), op_space(op))
    if found is not None:
        failure = plan_failure(op, problem, found[0], device)
        if failure is None:
            return found
        log.warning("ignoring %s record for %s: %s (using the heuristic)", found[1], problem.key(), failure)
    if backend is not None and backend.can_launch and config.benchmark_candidates():
        from .tuning.benchmark import benchmark_schedule   # the tuner is imported only in benchmark mode
        timed = benchmark_schedule(op, problem, backend, stream)
        if timed is not None:
            return timed, "benchmark"
    return op.heuristic(problem, device), "heuristic"


# ---------------------------------------------------------------- prepared plans

class Slot(NamedTuple):
    """One pointer argument of a step: kernel argument `index` takes buffer `buffer` (an input,
    output or workspace name) of `nbytes` bytes and `itemsize`-byte elements."""
    index: int
    buffer: str
    nbytes: int
    itemsize: int
    workspace: bool


@dataclass
class Step:
    launch: Launch
    kernel: Kernel
    packed: PackedArgs
    slots: tuple[Slot, ...]
    run: Any = None     # backend.bind_launch(...): (packed, stream) -> None
    tmaps: tuple = ()   # (argument index, buffer name, encode(ptr) -> 128 bytes): TMA tensor maps


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
    persistent: dict[tuple[int, str], int] = field(default_factory=dict)  # (stream, workspace) -> pointer
    derived: DerivedCache | None = None   # workspaces computed from inputs, per input identity
    backend: Any = None                   # owner of the persistent and derived memory
    stream_scratch: "StreamScratch | None" = None   # run_pointers' per-call workspaces, per stream
    runner: Any = None                    # pointer_runner's function, made on first use
    alignment: dict[str, tuple[int, str]] = field(default_factory=dict)  # buffer -> (bytes, kernel): required_alignment


def kernel_source(device: DeviceInfo, launch: Launch) -> str:
    return codegen.full_source(device, launch.template, launch.template_params)


def _label(op: str, launch: Launch) -> str:
    return f"{op}.{launch.kernel}"


def _make_step(op: str, launch: Launch, backend: Backend, sizes: Mapping[str, tuple[int, int]],
               workspaces: set[str]) -> Step:
    source = kernel_source(backend.device, launch)
    kernel = loader().kernels(backend, source, [launch.kernel], _label(op, launch))[launch.kernel]
    kinds, names, slots, tmaps = [], [], [], []
    for i, a in enumerate(launch.args):
        if isinstance(a, Buf):
            kinds.append("ptr")
            names.append(a.name)
            slots.append(Slot(i, a.name, *sizes[a.name], a.name in workspaces))
        elif isinstance(a, TensorMap):
            kinds.append("tmap")
            names.append(f"{a.name}_map")
            tmaps.append((i, a.name, _map_encoder(backend, a)))
        else:
            kinds.append(a.kind)
            names.append(f"arg{i}")
    packed = PackedArgs(kinds, names)
    for i, a in enumerate(launch.args):
        if isinstance(a, Scalar):
            packed.set(i, a.value)
    run = backend.bind_launch(kernel, launch.grid, launch.block, launch.shared_bytes, launch.programmatic)
    return Step(launch, kernel, packed, tuple(slots), run, tuple(tmaps))


def _map_encoder(backend: Backend, spec: TensorMap) -> Any:
    """ptr -> the 128 bytes of spec's tensor map over ptr, remembering the last few pointers (a plan
    runs on the same buffers call after call; encoding costs a driver call). TMA needs 16-byte
    aligned tensors and strides: for others the map is left empty and the kernel takes its plain-load
    path (it tests the same alignment; a packed projection's pitch may leave rows off 16 bytes)."""
    memo: dict[int, bytes] = {}
    itemsize = ITEMSIZE[spec.dtype]
    strides_aligned = all(s * itemsize % 16 == 0 for s in spec.strides or ())

    def encode(ptr: int) -> bytes:
        if ptr % 16 or not strides_aligned:
            return bytes(128)
        blob = memo.get(ptr)
        if blob is None:
            if len(memo) >= 16:
                memo.clear()
            blob = memo[ptr] = (backend.im2col_map(ptr, spec.dtype, spec.dims, spec.im2col, spec.swizzle)
                                if spec.im2col else
                                backend.tensor_map(ptr, spec.dtype, spec.dims, spec.box, spec.swizzle, spec.strides))
        return blob
    return encode


def _buffer_sizes(problem: Any, plan: Plan) -> dict[str, tuple[int, int]]:
    """(bytes, item size) of every buffer a plan names: inputs, outputs, workspaces."""
    sizes = {n: (s.span_nbytes, ITEMSIZE[s.dtype]) for n, s in {**problem.inputs(), **problem.outputs()}.items()
             if s is not None}
    sizes.update({w.name: (w.nbytes, 1) for w in plan.workspaces})
    return sizes


def required_alignment(problem: Any, plan: Plan) -> dict[str, tuple[int, str]]:
    """Input or output -> (bytes, kernel): the address alignment the plan's kernels need of it
    beyond its elements' own (Buf.align: vector accesses with no unaligned path), the largest over
    its launches. Workspaces are left out: the engine allocates them aligned."""
    io = {n for n, spec in {**problem.inputs(), **problem.outputs()}.items() if spec is not None}
    need: dict[str, tuple[int, str]] = {}
    for launch in (*plan.prepare, *plan.launches):
        for a in launch.args:
            if isinstance(a, Buf) and a.name in io and a.align > need.get(a.name, (1, ""))[0]:
                need[a.name] = (a.align, launch.kernel)
    return need


def misaligned(p: Prepared, pointers: Mapping[str, int]) -> list[str]:
    """The buffers whose pointers miss the alignment p's kernels need (a modulo per such buffer)."""
    return [name for name, (need, _) in p.alignment.items() if pointers.get(name, 0) % need]


def alignment_error(p: Prepared, name: str, ptr: int, argument: str | None = None) -> ArgumentError:
    """What a caller is told for an array whose address a vector kernel cannot use (on a GPU the
    launch would fault and take the context with it)."""
    need, kernel = p.alignment[name]
    return ArgumentError(argument or name, f"a data pointer aligned to {need} bytes (the {p.schedule.algorithm} "
                         f"kernel {kernel} accesses it {need} bytes at a time)",
                         f"one {ptr % need} bytes past a {need}-byte boundary (a view at an offset into its "
                         f"storage?); pass an aligned array: a fresh one, or a copy (torch: .clone())", op=p.op)


def prepare(op: ModuleType, problem: Any, backend: Backend, schedule: Schedule | str | None = None,
            stream: int | None = None) -> Prepared:
    """The problem's plan on this backend, loaded; `stream`: the first call's (benchmark mode times
    nothing while it is being captured)."""
    sched, origin = select_schedule(op, problem, backend.device, schedule, backend, stream)
    plan = op.plan(problem, sched, backend.device)
    sizes = _buffer_sizes(problem, plan)
    workspaces = {w.name for w in plan.workspaces}
    steps = [_make_step(op.NAME, l, backend, sizes, workspaces) for l in plan.launches]
    prep = [_make_step(op.NAME, l, backend, sizes, workspaces) for l in plan.prepare]
    log.debug("%s %s -> %s [%s]", op.NAME, problem.key(), sched, origin)
    derived = DerivedCache(plan.workspaces, backend) if any(w.derived_from for w in plan.workspaces) else None
    itemsizes = {n: size[1] for n, size in sizes.items()}
    return Prepared(op.NAME, problem, sched, origin, plan, steps, prep, itemsizes, derived=derived, backend=backend,
                    alignment=required_alignment(problem, plan))


# ---------------------------------------------------------------- the cache of prepared plans

class _Cache:
    def __init__(self) -> None:
        self.by_call: dict[tuple, Prepared] = {}         # general path: by shapes and attributes
        self.bound: dict[tuple, BoundPlan | None] = {}   # repeat-call path: by call signature
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
            if p.stream_scratch is not None:
                p.stream_scratch.clear()
            if p.persistent and p.backend is not None:
                p.backend.synchronize()
                for ptr in p.persistent.values():
                    p.backend.free(ptr)
            p.persistent.clear()       # a runner still held somewhere allocates anew, never reuses freed memory
        _cache.by_call.clear()
        _cache.bound.clear()
        for d in _cache.dispatch.values():    # emptied, not dropped: the public functions hold them
            d.clear()
        _cache.generation += 1
    memory_released()       # launchers outside Python (ONNX Runtime replays) forget the freed workspaces


def generation() -> int:
    """Changes whenever prepared plans are dropped: a cached pointer_runner older than this is stale."""
    return _cache.generation


def bind(step: Step, pointers: Mapping[str, int]) -> None:
    """Write the step's pointer arguments (by buffer name) into its argument block, with the sizes
    of its slot table; the one place that does (the repeat paths are built from the same table)."""
    packed = step.packed
    for slot in step.slots:
        packed.set_buffer(slot.index, pointers[slot.buffer], slot.nbytes, slot.itemsize)
    for index, buffer, encode in step.tmaps:
        ctypes.memmove(ctypes.addressof(packed.values[index]), encode(pointers[buffer]), 128)


def bind_and_launch(step: Step, pointers: Mapping[str, int], stream: int) -> None:
    bind(step, pointers)
    step.run(step.packed, stream)


class StreamScratch:
    """A plan's per-call workspaces, kept per stream: calls on one stream run in order, so each may
    reuse what the last one used (no allocation, synchronize or free per call). The least recently
    used stream's copy beyond `keep` is handed to `release` (which frees it in a way safe for its
    allocator). `alloc(workspace) -> (pointer, owner)`: the owner is kept alive with the pointer."""

    def __init__(self, workspaces: list[Any], alloc: Callable[[Any], tuple[int, Any]],
                 release: Callable[[list[tuple[int, Any]]], None], keep: int = 4) -> None:
        self.workspaces, self.alloc, self.release, self.keep = workspaces, alloc, release, keep
        self._by_stream: OrderedDict[int, tuple[dict[str, int], list[tuple[int, Any]]]] = OrderedDict()

    def get(self, stream: int) -> dict[str, int]:
        """Workspace name -> pointer for launches on `stream` (the caller holds the plan's lock)."""
        found = self._by_stream.get(stream)
        if found is not None:
            self._by_stream.move_to_end(stream)
            return found[0]
        if len(self._by_stream) >= self.keep:
            self.release(self._by_stream.popitem(last=False)[1][1])
        made = [self.alloc(w) for w in self.workspaces]
        ptrs = {w.name: ptr for w, (ptr, _) in zip(self.workspaces, made)}
        self._by_stream[stream] = (ptrs, made)
        return ptrs

    def clear(self) -> None:
        while self._by_stream:
            self.release(self._by_stream.popitem(last=False)[1][1])

    def __len__(self) -> int:
        return len(self._by_stream)

    def __iter__(self) -> Any:
        """The streams it keeps workspaces for, least recently used first."""
        return iter(list(self._by_stream))

    def __getitem__(self, stream: int) -> dict[str, int]:
        return self._by_stream[stream][0]


def backend_scratch(workspaces: list[Any], backend: Backend) -> StreamScratch:
    """Per-call workspaces per stream from the backend's allocator (raw-pointer runners, and the
    public call path for arrays other than torch tensors). Each stream's copy is allocated once (no
    allocation, synchronize and free per call: each of those stalled ONNX Runtime's stream); one
    dropped (the least recently used beyond a few, or clear_prepared) is freed after a device-wide
    synchronize, since its stream may be gone by then."""
    def release(made: list[tuple[int, Any]]) -> None:
        backend.synchronize()
        for ptr, _ in made:
            backend.free(ptr)

    return StreamScratch(workspaces, lambda ws: (backend.alloc(ws.nbytes), None), release)


def persistent_workspace(p: Prepared, ws: Any, backend: Backend, stream: int) -> int:
    """A workspace kept across calls on `stream` (self-resetting counters, partials), allocated and
    zeroed once per stream: launches on one stream run in order, launches on two streams may run
    at once and must not meet at one grid barrier. The memory lives until clear_prepared (a stream
    handle may be reused by a later stream; that one then takes over the same, idle, copy)."""
    key = (stream, ws.name)
    ptr = p.persistent.get(key)
    if ptr is None:
        ptr = backend.alloc(ws.nbytes)
        if ws.zero:
            backend.memset(ptr, 0, ws.nbytes, stream)
        p.persistent[key] = ptr
        p.backend = p.backend or backend
    return ptr


def prepare_for(p: Prepared, identity: Any, sources: Any, ptrs: dict[str, int], backend: Backend,
                stream: int) -> None:
    """Derived workspaces for inputs of this identity (None: unknown, recompute), filled if new."""
    fresh = True
    if p.derived is not None:
        wptrs, fresh = p.derived.get(identity, stream, sources)
        ptrs.update(wptrs)
    if fresh:
        for step in p.prepare_steps:
            bind_and_launch(step, ptrs, stream)


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
