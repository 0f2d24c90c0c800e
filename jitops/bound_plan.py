"""The repeat-call path: a prepared plan bound to one call signature (BoundPlan).

A call whose arrays look like an earlier call's (same kinds, shapes, dtypes, devices and
contiguity, same attributes) reuses a BoundPlan: no classification, validation, schedule lookup
or dictionary building, just pointers, outputs, the stream and the launches. Its three ways of
running (generated straight-line Python, the general loop, the C RepeatCall) are all built from
the plan's slot table (prepared.Step.slots); per-call scratch comes from a prepared.StreamScratch. This is what makes
a cached jitops call about as cheap as the framework's own op. Anything else (host arrays on a
GPU, CuPy, an `out` that does not match) takes the general path in engine.py.
"""
from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from .arrays import LAYOUTS, inverse_permutation, memory_format
from .ops.base import TensorSpec
from .prepared import StreamScratch, bind_and_launch, persistent_workspace
from .runtime.fastlaunch import memory_released


def torch_identity(t: Any) -> Hashable:
    """What identifies a torch tensor's contents: its memory and its version counter."""
    return ("torch", t.data_ptr(), t._version)


class NoFastPath(Exception):
    """This call cannot use the repeat-call path; take the general one."""


_torch_tensor: type | None = None


def signature(v: Any) -> Hashable:
    """What must match for a BoundPlan to be reused: kind, shape, dtype, device, memory format
    (True: C-contiguous; "nhwc" / "bshd": a 4-d view in that layout, as arrays.wrap reads it; ("bshd", P):
    a packed projection's slice with rows P elements apart)."""
    global _torch_tensor
    if _torch_tensor is not None and isinstance(v, _torch_tensor):
        return (_torch_tensor, v.shape, v.dtype, v.device, memory_format(v))
    if v is None:
        return None
    if type(v) is np.ndarray:
        return (np.ndarray, v.shape, v.dtype.num, v.flags.c_contiguous)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        _torch_tensor = torch.Tensor
        return (torch.Tensor, v.shape, v.dtype, v.device, memory_format(v))
    raise NoFastPath


class BoundPlan:
    """One prepared plan bound to a call signature; calling it runs the plan on new arrays."""

    def __init__(self, prepared: Any, backend: Any, input_names: Sequence[str], first: Any,
                 values: Sequence[Any] = ()) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        torch = sys.modules.get("torch")
        self.is_torch = torch is not None and isinstance(first, torch.Tensor)
        if self.is_torch:
            self.pointer: Callable[[Any], int] = lambda v: v.data_ptr()
        else:
            self.pointer = lambda v: v.ctypes.data
        self.alloc, self.expected, self.alloc_like, self.stream_parts = _framework(first, self.is_torch)
        stream_fn, stream_arg = self.stream_parts
        self.stream: Callable[[], int] = stream_fn if stream_arg is None else (lambda: stream_fn(stream_arg))
        out_specs: dict[str, TensorSpec] = prepared.problem.outputs()
        in_specs = prepared.problem.inputs()
        # An output shaped like an input is allocated "like" it (torch.empty_like is the cheapest).
        like = {n: k for k, n in reversed(list(enumerate(input_names))) if in_specs.get(n) is not None}
        self.outputs = [(name, spec, self.expected(spec),
                         next((like[n] for n in like if in_specs[n] == spec), None))
                        for name, spec in out_specs.items()]
        # Every slot of the plan's table resolves to a position in the per-call pointer list
        # (inputs, then outputs) or to a workspace name: (argument index, where, (bytes, item size)).
        self.io_names = list(input_names) + list(out_specs)
        self.position = position = {n: k for k, n in enumerate(self.io_names)}
        plan = prepared.plan

        def slots(step: Any) -> list:
            return [(s.index, position.get(s.buffer, s.buffer), (s.nbytes, s.itemsize)) for s in step.slots]

        # Inputs and outputs a kernel reads or writes in vectors with no unaligned path: (position,
        # bytes). A call whose array misses it takes the general path (an error, or host staging).
        self.aligned = [(position[n], need) for n, (need, _) in prepared.alignment.items() if n in position]
        self.steps = [(s, slots(s)) for s in prepared.steps]
        self.prepare_steps = [(s, slots(s)) for s in prepared.prepare_steps]
        self.temps = [w for w in plan.workspaces if not w.persistent]
        self.scratch_table = _framework_scratch(self.temps, self.alloc, self.pointer)
        # persistent workspaces (grid-barrier counters, partials) are kept per stream: prepared.persistent_workspace
        self.kept = [w for w in plan.workspaces if w.persistent and not w.derived_from]
        self.prepared = prepared
        self.derived = prepared.derived
        derived_inputs = self.derived.inputs if self.derived is not None else []
        # Positions of the derived-from inputs, in the cache's order; None: an absent optional input.
        self.fingerprint_inputs = [list(input_names).index(n) if n in input_names else None for n in derived_inputs]
        if self.prepare_steps and not self.is_torch:
            raise NoFastPath  # host inputs are fingerprinted by content: the general path does that
        self.set_sizes = backend.reads_buffer_sizes
        self.input_count = len(input_names)
        # run(inputs, out): straight-line generated code where possible, else the general loop.
        self.run: Callable[[Sequence[Any], dict | None], Any] = self._generate() or self.call
        # native(inputs): the same call in C, for calls without `out` (engine.repeat_call finds it).
        self.native: Any = self._native(values)

    def _generate(self) -> Callable | None:
        """Straight-line Python for this plan: pointers, outputs, launches, no loops or lookups.

        Only for plans without per-call workspaces or prepare steps on a GPU backend; a few
        microseconds matter when the kernel itself takes one or two.
        """
        if self.temps or self.kept or self.prepare_steps or self.derived is not None or self.set_sizes:
            return None
        position = self.position
        if any(buffer not in position for step, _ in self.steps for _, buffer, _ in step.tmaps):
            return None     # a tensor map over a workspace: the general loop (prepared.bind)
        ns: dict[str, Any] = {"signature": signature, "NoFastPath": NoFastPath, "lock": self.lock,
                              "stream_of": self.stream, "alloc": self.alloc, "alloc_like": self.alloc_like,
                              "memmove": ctypes.memmove}
        lines = ["def fast(inputs, out):"]
        ptr = "{}.data_ptr()" if self.is_torch else "{}.ctypes.data"
        need = dict(self.aligned)
        for k in range(self.input_count):
            lines.append(f"    a{k} = inputs[{k}]")
            lines.append(f"    p{k} = {ptr.format(f'a{k}')} if a{k} is not None else 0")
            if k in need:
                lines.append(f"    if p{k} % {need[k]}:\n        raise NoFastPath")
        names = []
        for j, (name, spec, expected, like) in enumerate(self.outputs):
            k = self.input_count + j
            ns[f"spec{j}"], ns[f"expected{j}"] = spec, expected
            make = f"alloc(spec{j})" if like is None else f"alloc_like(a{like})"
            lines += [f"    o{j} = out.get({name!r}) if out else None",
                      f"    if o{j} is None:",
                      f"        o{j} = {make}",
                      f"    elif signature(o{j}) != expected{j}:",
                      "        raise NoFastPath",
                      f"    p{k} = {ptr.format(f'o{j}')}"]
            if k in need:
                lines.append(f"    if p{k} % {need[k]}:\n        raise NoFastPath")
            names.append(f"o{j}")
        lines += ["    s = stream_of()", "    with lock:"]
        for n, (step, slots) in enumerate(self.steps):
            ns[f"packed{n}"] = step.packed
            for index, where, _ in slots:
                ns[f"v{n}_{index}"] = step.packed.values[index]
                lines.append(f"        v{n}_{index}.value = p{where}")
            for index, buffer, encode in step.tmaps:     # TMA maps: encoded per pointer (remembered)
                ns[f"encode{n}_{index}"] = encode
                lines.append(f"        memmove({ctypes.addressof(step.packed.values[index])}, "
                             f"encode{n}_{index}(p{position[buffer]}), 128)")
            native = getattr(step.run, "native", None)
            if native is not None:
                run, entry, handle, gx, gy, gz, bx, by, bz, shared = native
                ns[f"native{n}"], ns[f"fail{n}"] = run, step.run.fail
                lines += [f"        rc = native{n}({entry}, {handle}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {shared}, s, "
                          f"{step.packed.address})",
                          "        if rc:",
                          f"            fail{n}(rc, packed{n}, s)"]
            else:
                ns[f"run{n}"] = step.run
                lines.append(f"        run{n}(packed{n}, s)")
        result = names[0] if len(names) == 1 else "(" + ", ".join(names) + ",)"
        lines.append(f"    return {result}")
        exec(compile("\n".join(lines), "<jitops fast call>", "exec"), ns)
        return ns["fast"]

    def _native(self, values: Sequence[Any]) -> Any:
        """The repeat call as one C object (runtime/native/jitops_fastcall.c, RepeatCall), for torch
        arrays on a backend whose launches all go through the native launcher. Per-call scratch
        (per stream) and derived data (per derived-from inputs' pointers and versions, guarded by
        weak references) are remembered in C; Python is asked only on the first call on a stream
        or with new derived-from inputs. With the Dispatch in front of it, a cached call's own
        host work drops from ~3.5 to ~1.4 us on a 2-core CPU (scripts/host_overhead.py)."""
        if not self.is_torch or self.set_sizes or len(values) != self.input_count:
            return None
        if any(w.zero for w in self.temps) or bool(self.prepare_steps) != (self.derived is not None):
            return None     # zeroed per-call scratch, or prepare steps without a cache of their results
        torch = sys.modules["torch"]
        tensor = torch.Tensor
        # the memory format part of each input's signature: True (C order), "nhwc", "bshd", ("bshd", pitch)
        # or False
        formats = [None if v is None else signature(v)[-1] if isinstance(v, tensor) else False for v in values]
        if False in formats:
            return None
        expect = tuple(None if v is None else (tensor, v.shape, v.dtype, v.device, _native_format(f, torch))
                       for v, f in zip(values, formats))
        natives = [getattr(step.run, "native", None) for step, _ in self.steps]
        fails = [getattr(step.run, "fail_at", None) for step, _ in self.steps]
        if not self.steps or None in natives or None in fails:
            return None
        from .runtime.fastlaunch import native_launcher
        module = native_launcher()
        if module is None or not hasattr(module, "memory_released"):
            return None
        outputs = []
        for name, spec, _, like in self.outputs:
            outputs.append((self.alloc_like, like) if like is not None else (_partial(self.alloc, spec), -1))
        derived_names = [w.name for w in self.derived.workspaces] if self.derived is not None else []
        scratch_names = [w.name for w in self.temps] + [w.name for w in self.kept]
        if len(scratch_names) > 8 or len(derived_names) > 8:
            return None     # RepeatCall remembers at most 8 of each (FC_MAX_WS)
        n_io = self.input_count + len(outputs)
        source = {n: n_io + k for k, n in enumerate(derived_names)}
        source.update({n: n_io + len(derived_names) + k for k, n in enumerate(scratch_names)})
        steps = []
        if sum(len(step.tmaps) for step, _ in self.steps) > 8:
            return None     # RepeatCall keeps at most 8 tensor maps (FC_MAX_TMAPS)
        for (step, slots), native in zip(self.steps, natives):
            _, entry, handle, gx, gy, gz, bx, by, bz, shared = native
            maps = {index for index, _, _ in step.tmaps}
            if any(ctypes.sizeof(v) > 8 for i, v in enumerate(step.packed.values) if i not in maps):
                return None     # RepeatCall keeps 8 bytes per argument, and 128 per tensor map
            storage = bytearray(b"".join(bytes(8) if i in maps else bytes(v).ljust(8, b"\0")
                                         for i, v in enumerate(step.packed.values)))
            pointer_slots = []
            for index, where, _ in slots:
                if isinstance(where, int):
                    pointer_slots.append((index, where))
                else:
                    pointer_slots.append((index, source[where]))
            tensor_maps = []
            for index, buffer, encode in step.tmaps:     # encoded per pointer, remembered in C too
                where = self.position.get(buffer, source.get(buffer))
                if where is None:
                    return None
                tensor_maps.append((index, where, encode))
            steps.append((entry, handle, (gx, gy, gz), (bx, by, bz), shared, bytes(storage), pointer_slots,
                          tensor_maps))

        def fail(index: int, rc: int, stream: int, params: int) -> None:
            fails[index](rc, params, stream)

        stream_fn, stream_arg = self.stream_parts
        extra: list[Any] = [None, (), 0, None, 0, [(k, need) for k, need in self.aligned if k < self.input_count]]
        if derived_names:
            extra[:3] = [self._derive_for_native(derived_names, scratch_names), self.fingerprint_inputs_native,
                         len(derived_names)]
        if scratch_names:
            extra[3:5] = [self._scratch_for_native(scratch_names), len(scratch_names)]
        return module.RepeatCall(self.input_count, outputs, stream_fn, stream_arg, fail, steps, expect, *extra)

    # RepeatCall's callbacks hold the bound call weakly: RepeatCall takes no part in garbage collection,
    # so a strong reference back (bound call -> RepeatCall -> callback -> bound call) would never be freed.
    def _scratch_for_native(self, names: list[str]) -> Callable[[int], tuple[int, ...]]:
        ref = weakref.ref(self)

        def scratch(stream: int) -> tuple[int, ...]:
            bound = _alive(ref)
            with bound.lock:
                found = bound.scratch(stream)
            return tuple(found[n] for n in names)
        return scratch

    @property
    def fingerprint_inputs_native(self) -> tuple[int, ...]:
        return tuple(-1 if k is None else k for k in self.fingerprint_inputs)

    def _derive_for_native(self, derived_names: list[str], scratch_names: list[str]) -> Callable:
        """RepeatCall's question when it does not remember derived data for these inputs on this
        stream: find it in the plan's DerivedCache, or fill it (the prepare launches, on `stream`)."""
        ref = weakref.ref(self)

        def derive(inputs: tuple, ptrs: tuple, stream: int) -> tuple[bool, tuple[int, ...]]:
            bound = _alive(ref)
            ids = tuple(torch_identity(inputs[k]) if k is not None and inputs[k] is not None else None
                        for k in bound.fingerprint_inputs)
            sources = [inputs[k] for k in bound.fingerprint_inputs if k is not None and inputs[k] is not None]
            with bound.lock:
                wptrs, fresh = bound.derived.get(ids, stream, sources)
                if fresh:
                    work = bound.kept_for(stream)
                    work.update(wptrs)
                    if scratch_names:
                        work.update(bound.scratch(stream))
                    bound._launch(bound.prepare_steps, list(ptrs), work, stream)
            return True, tuple(wptrs[n] for n in derived_names)
        return derive

    def scratch(self, stream: int) -> dict[str, int]:
        """Per-call and persistent workspaces for launches on `stream` (the caller holds the lock)."""
        found = self.kept_for(stream)
        if self.temps:
            found.update(self.scratch_table.get(stream))
        return found

    def kept_for(self, stream: int) -> dict[str, int]:
        """The persistent workspaces of this stream (allocated and zeroed on its first call)."""
        return {w.name: persistent_workspace(self.prepared, w, self.backend, stream) for w in self.kept}

    def call(self, inputs: Sequence[Any], out: dict | None) -> Any:
        """The general repeat call (loops over steps, workspaces and prepare steps)."""
        pointer = self.pointer
        ptrs = [pointer(v) if v is not None else 0 for v in inputs]
        outs = []
        for name, spec, expected, like in self.outputs:
            obj = out.get(name) if out else None
            if obj is None:
                obj = self.alloc(spec) if like is None else self.alloc_like(inputs[like])
            elif signature(obj) != expected:
                raise NoFastPath   # the general path explains what is wrong with `out`
            outs.append(obj)
            ptrs.append(pointer(obj))
        for k, need in self.aligned:
            if ptrs[k] % need:
                raise NoFastPath   # the general path stages a host array or names the argument
        stream = self.stream()
        if not self.temps and not self.prepare_steps and not self.kept:
            with self.lock:
                self._launch(self.steps, ptrs, None, stream)
            return outs[0] if len(outs) == 1 else tuple(outs)
        with self.lock:
            work = self.kept_for(stream)
            if self.temps:      # the same per-stream scratch as the native path's
                work.update(self.scratch_table.get(stream))
                for w in self.temps:
                    if w.zero:
                        self.backend.memset(work[w.name], 0, w.nbytes, stream)
            if self.prepare_steps:
                fresh = True
                if self.derived is not None:
                    ids = tuple(torch_identity(inputs[k]) if k is not None and inputs[k] is not None else None
                                for k in self.fingerprint_inputs)
                    sources = [inputs[k] for k in self.fingerprint_inputs if k is not None]
                    wptrs, fresh = self.derived.get(None if None in ids else ids, stream, sources)
                    work.update(wptrs)
                if fresh:
                    self._launch(self.prepare_steps, ptrs, work, stream)
            self._launch(self.steps, ptrs, work, stream)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _launch(self, steps: list, ptrs: list, work: dict | None, stream: int) -> None:
        pointers = dict(zip(self.io_names, ptrs))
        if work:
            pointers.update(work)
        for step, _ in steps:
            bind_and_launch(step, pointers, stream)


def _native_format(fmt: Any, torch: Any) -> Any:
    """A signature's memory format as RepeatCall checks it (jitops_dispatch.c, jt_formats_match): None = C
    order, torch.channels_last, or for attention's layouts, which torch has no memory format for, their
    axes' memory order (the native check compares strides), with the row pitch of a packed projection's
    slice as (order, pitch): a plan bound for one pitch never runs on a dense view or another pitch."""
    if fmt is True:
        return None
    if fmt == "nhwc":
        return torch.channels_last
    if isinstance(fmt, tuple):
        layout, pitch = fmt
        return (LAYOUTS[layout][0], pitch)
    return LAYOUTS[fmt][0]


def _framework_scratch(workspaces: list[Any], alloc: Callable[[TensorSpec], Any],
                       pointer: Callable[[Any], int]) -> StreamScratch:
    """Per-call workspaces per stream through the framework's allocator, as outputs are: inside a
    CUDA-graph capture they come from the graph's pool, where a device allocation would break the
    capture. A dropped stream's copy is freed by the allocator in stream order (no synchronize);
    every RepeatCall forgets the pointers it remembered."""
    def make(ws: Any) -> tuple[int, Any]:
        owner = alloc(TensorSpec((ws.nbytes,), "uint8"))
        return pointer(owner), owner

    return StreamScratch(workspaces, make, lambda made: memory_released())


def _framework(first: Any, is_torch: bool) -> tuple[Callable, Callable, Callable, tuple]:
    """Output allocator, expected output signature, allocate-like, and the current-stream getter
    as (function, argument or None): the native call takes it apart, Python calls fn(arg)."""
    if is_torch:
        torch = sys.modules["torch"]
        from .arrays import torch_dtype
        device = first.device
        empty = torch.empty

        def alloc(spec: TensorSpec) -> Any:
            if spec.layout == "nhwc":
                return empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device, memory_format=torch.channels_last)
            if spec.layout in LAYOUTS:
                return empty(spec.storage_shape, dtype=torch_dtype(spec.dtype), device=device).permute(
                    *inverse_permutation(spec.layout))
            return empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device)

        def expected(spec: TensorSpec) -> Hashable:
            return (torch.Tensor, torch.Size(spec.shape), torch_dtype(spec.dtype), device, spec.layout or True)

        empty_like = torch.empty_like
        if device.type == "cuda":
            index = device.index or 0
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is not None:
                return alloc, expected, empty_like, (raw, index)
            return alloc, expected, empty_like, (lambda: torch.cuda.current_stream(index).cuda_stream, None)
        return alloc, expected, empty_like, (_no_stream, None)

    def alloc_np(spec: TensorSpec) -> Any:
        return np.empty(spec.shape, dtype=spec.dtype)

    def expected_np(spec: TensorSpec) -> Hashable:
        return (np.ndarray, tuple(spec.shape), np.dtype(spec.dtype).num, True)

    return alloc_np, expected_np, np.empty_like, (_no_stream, None)


def _alive(ref: weakref.ref) -> "BoundPlan":
    bound = ref()
    if bound is None:
        raise NoFastPath("this repeat call's plan was released")
    return bound


_no_stream = int     # stream 0 (int() is 0), called with no Python frame


def _partial(fn: Callable, arg: Any) -> Callable[[], Any]:
    return lambda: fn(arg)
