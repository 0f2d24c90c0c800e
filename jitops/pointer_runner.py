"""Raw device pointers on a caller's stream: how ONNX Runtime's CUDA / ROCm kernels run a plan.

Everything that does not change between calls (the plan, buffer sizes, argument slots) is worked
out once per problem (the plan's slot table); a call writes pointers and launches through the
engine's one bind_and_launch. Per-call workspaces are kept per stream (prepared.StreamScratch).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .ops import get_op
from .ops.base import Schedule, TensorSpec, frozen_items
from .prepared import (Prepared, _cache, alignment_error, backend_scratch, bind_and_launch, persistent_workspace,
                       prepare, prepare_for)
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
    persistent = [ws for ws in p.plan.workspaces if ws.persistent]
    scratch_ws = [ws for ws in p.plan.workspaces if not ws.persistent and not ws.derived_from]
    if scratch_ws and p.stream_scratch is None:
        p.stream_scratch = backend_scratch(scratch_ws, backend)
        p.backend = p.backend or backend

    aligned = tuple((name, need) for name, (need, _) in p.alignment.items())

    def run(ptrs: Mapping[str, int], stream: int, derived_key: Any = None, replay: list | None = None) -> None:
        for name, need in aligned:      # a GPU faults on a misaligned vector access: say so first
            if ptrs.get(name, 0) % need:
                raise alignment_error(p, name, ptrs[name])
        full = dict(ptrs)
        with p.lock:
            for ws in persistent:
                full[ws.name] = persistent_workspace(p, ws, backend, stream)
            if scratch_ws:
                full.update(p.stream_scratch.get(stream))
                for ws in scratch_ws:
                    if ws.zero:
                        backend.memset(full[ws.name], 0, ws.nbytes, stream)
            if p.prepare_steps:     # raw pointers say nothing of their contents: redone unless keyed
                prepare_for(p, derived_key, (), full, backend, stream)
            for step in p.steps:
                bind_and_launch(step, full, stream)
            if replay is not None and run.replayable:   # type: ignore[attr-defined]
                replay.extend(_launch_record(step) for step in p.steps)

    run.derived_inputs = tuple(p.derived.inputs) if p.derived is not None and p.prepare_steps else ()  # type: ignore[attr-defined]
    # Whether a call's launches can be made again as they were, with other output buffers only (a
    # replay, onnx/native/jitops_ort.cc): every launch through the native launcher, no scratch zeroed
    # per call, derived data kept per key (prepare steps with a derived cache; the caller passes the
    # key), no tensor map over an output. Whatever frees or refills memory a replay names (derived
    # data, a stream's scratch, clear_prepared) calls fastlaunch.memory_released.
    outputs = set(p.problem.outputs())
    run.replayable = (all(getattr(step.run, "native", None) is not None for step in p.steps)  # type: ignore[attr-defined]
                      and not any(ws.zero for ws in scratch_ws)
                      and (not p.prepare_steps or p.derived is not None)
                      and not any(buffer in outputs for step in p.steps for _, buffer, _ in step.tmaps))
    return run


def _launch_record(step: Any) -> tuple:
    """(native launcher call, argument values as bytes, argument index -> buffer name) of a step
    as it was just launched (its arguments bound)."""
    return (step.run.native, [bytes(v) for v in step.packed.values],
            {slot.index: slot.buffer for slot in step.slots})
