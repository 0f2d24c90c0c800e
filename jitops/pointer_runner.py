"""Raw device pointers on a caller's stream: how ONNX Runtime's CUDA / ROCm kernels run a plan.

Everything that does not change between calls (the plan, buffer sizes, argument slots) is worked
out once per problem; a call writes pointers and launches. Per-call workspaces are kept per stream.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .ops import get_op
from .ops.base import Schedule, TensorSpec, frozen_items
from .prepared import Prepared, _cache, persistent_workspace, prepare, prepare_for
from .runtime import current_backend
from .runtime.base import Backend


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
                full[ws.name] = (persistent_workspace(p, ws, backend, stream), ws.nbytes)
            if scratch_ws:
                scratch = _stream_scratch(p, scratch_ws, backend, stream)
                for ws in scratch_ws:
                    full[ws.name] = (scratch[ws.name], ws.nbytes)
                    if ws.zero:
                        backend.memset(scratch[ws.name], 0, ws.nbytes, stream)
            if p.prepare_steps:     # raw pointers say nothing of their contents: redone unless keyed
                prepare_for(p, derived_key, (), full, backend, stream)
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
