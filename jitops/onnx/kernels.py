"""The Python half of the jitops ONNX Runtime kernels: one Kernel per node, run on ORT's buffers.

CPU execution provider: the inputs and outputs are host memory; they are viewed as numpy arrays
(no copy) and the op runs on the session's jitops backend: in place on the CPU emulator, with
staged copies on a GPU. CUDA / ROCm execution providers: the buffers are device memory and the op
is launched on ORT's compute stream through engine.run_pointers, with no copies at all.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import struct
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .. import engine
from ..arrays import logical_shape
from ..errors import JitopsError
from ..ops import get_op
from ..ops.base import TensorSpec
from ..runtime import current_backend, get_backend
from ..runtime.base import Backend
from ..runtime.fastlaunch import on_memory_released
from .native import JtTensor as JT_TENSOR
from .nodes import op_layout_inputs
from .optypes import OpType, head_output_shape, head_storage_shape, op_type

log = logging.getLogger("jitops.onnx")

PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider")
ELEM_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}   # numpy names bfloat16 once ml_dtypes is imported
_GPU_BACKEND = {1: "cuda", 2: "hip"}


class OutputAllocationFailed(Exception):
    """ORT refused an output; the native side holds its message."""


@dataclass
class Kernel:
    """One ORT node of a jitops type, bound to the backend its session chose."""

    type: OpType
    provider: int
    dtype: str
    node_attrs: dict[str, Any]
    backend: Backend
    calls: int = 0
    # shapes -> (op attributes, outputs as (name, spec, ORT's dims as ctypes, ORT's rank))
    plans: dict[tuple, tuple[dict[str, Any], list[tuple[str, TensorSpec, Any, int]]]] = field(default_factory=dict)
    runners: dict[tuple, Any] = field(default_factory=dict)     # GPU providers: engine.pointer_runner per shapes
    # GPU providers: the raw input array of a call (dims, types and buffer pointers) -> what compute
    # worked out for it. ORT's arena hands a node the same buffers run after run, so a repeat call
    # skips reading the tensors field by field and the plan and runner lookups (the 2-core CI machine,
    # probe backend: LayerNorm 5.5 -> 2.5 us per node call, LeakyRelu 3.7 -> 2.0).
    repeats: dict[bytes, tuple] = field(default_factory=dict)
    constant: frozenset[str] = frozenset()    # inputs that are initializers (GPU providers; ORT says so)

    @property
    def num_heads(self) -> int:
        """> 0: the head-layout tensors are the 3-D ones around the head Reshapes (optypes.head_storage_shape)."""
        return int(self.node_attrs.get("num_heads", 0)) if self.type.fixed.get("layout") else 0

    def stored(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """ORT's shape of input `name` as the op's storage shape (the 4-D one where num_heads > 0)."""
        layout = self.type.fixed.get("layout", "")
        if self.num_heads and name in op_layout_inputs(self.type.op, layout):
            return head_storage_shape(layout, shape, self.num_heads)
        return shape

    def plan(self, shapes: dict[str, tuple[int, ...] | None], dtypes: dict[str, str]
             ) -> tuple[dict, list[tuple[str, TensorSpec, Any, int]]]:
        """The op attributes and outputs (name, spec, ORT's ctypes dims, ORT's rank) for these input
        shapes (validated once per shape). ORT's dims are the storage shape, merged to [B, S, H*D]
        on a *Bshd node with num_heads: the same bytes, as the graph's Reshape wrote them."""
        key = tuple((n, s, dtypes.get(n)) for n, s in shapes.items())
        found = self.plans.get(key)
        if found is None:
            specs = self.specs(shapes, dtypes)
            attrs = self.type.op_attrs(self.node_attrs, {n: s.shape for n, s in specs.items() if s is not None})
            problem = get_op(self.type.op).make_problem(specs, attrs)
            layout = self.type.fixed.get("layout", "")
            found = (attrs, [])
            for n, s in problem.outputs().items():
                dims = head_output_shape(layout, s.storage_shape, self.num_heads) if s.layout else s.storage_shape
                found[1].append((n, s, (ctypes.c_int64 * max(1, len(dims)))(*dims), len(dims)))
            self.plans[key] = found
        return found

    def specs(self, shapes: dict[str, tuple[int, ...] | None], dtypes: dict[str, str]
              ) -> dict[str, TensorSpec | None]:
        """The op's view of ORT's tensors: on a type with a layout the op's layout inputs arrive
        stored in it (Conv2dNhwc*: N, H, W, C; *AttentionBshd: B, S, H, D; *AttentionSbhd: S, B, H, D)
        and are described by their logical shape (N, C, H, W; B, H, S, D)."""
        layout = self.type.fixed.get("layout", "")
        stored = set(op_layout_inputs(self.type.op, layout)) if layout else set()
        out: dict[str, TensorSpec | None] = {}
        for n, s in shapes.items():
            if s is None:
                out[n] = None
            elif n in stored:
                st = self.stored(n, s)
                if len(st) != 4 or (self.num_heads and len(s) != 3):    # num_heads: the 3-D tensors only
                    heads = f", or 3-D splitting into {self.num_heads} heads" if self.num_heads else ""
                    raise JitopsError(f"jitops::{self.type.name}: input '{n}' must be 4-D ({layout}{heads}), "
                                      f"got {list(s)}")
                out[n] = TensorSpec(logical_shape(st, layout), dtypes[n], layout)
            else:
                out[n] = TensorSpec(s, dtypes[n])
        return out


_kernels: dict[int, Kernel] = {}
_next_id = [0]
_ids_lock = threading.Lock()
_lib: Any = None
_session_backend = threading.local()


def _invalidate_replays() -> None:
    """Memory a replay may name was freed or refilled (plans dropped, derived data evicted or
    recomputed, a stream's scratch released): every replay of the library is stale."""
    invalidate = getattr(_lib, "jitops_ort_invalidate", None)
    if invalidate is not None:
        invalidate()


def bind_library(lib: Any) -> None:
    global _lib
    _lib = lib
    on_memory_released(_invalidate_replays)


@contextlib.contextmanager
def session_backend(backend: Backend | None) -> Iterator[None]:
    """Kernels created inside (while ORT builds a session in this thread) run CPU-EP nodes on `backend`."""
    prev = getattr(_session_backend, "value", None)
    _session_backend.value = backend
    try:
        yield
    finally:
        _session_backend.value = prev


def kernel_count() -> int:
    return len(_kernels)


_staged = [0]


def stages_through_host(backend: Backend) -> bool:
    """A CPU-EP node on a GPU backend: every input and output is copied through host memory."""
    return backend.name in ("cuda", "hip")


def staged_kernel_count() -> int:
    """CPU-EP kernels created so far that run on a GPU with staged copies (jo.session warns about them)."""
    return _staged[0]


def _backend_for(provider: int) -> Backend:
    if provider == 0:
        return getattr(_session_backend, "value", None) or current_backend()
    name = _GPU_BACKEND[provider]
    backend = get_backend(name)
    if not backend.can_launch:
        raise JitopsError(f"{PROVIDERS[provider]} node, but the jitops {name} backend has no device")
    return backend


def create(type_name: str, provider: int, elem_type: int, attrs_json: str) -> int:
    t = op_type(type_name)
    dtype = ELEM_DTYPES.get(elem_type)
    if dtype is None:
        raise JitopsError(f"jitops::{type_name}: element type {elem_type} is not float32, float16 or bfloat16")
    node_attrs = json.loads(attrs_json)
    constant = frozenset(t.inputs[i] for i in node_attrs.pop("__constant_inputs", []) if i < len(t.inputs))
    kernel = Kernel(t, provider, dtype, node_attrs, _backend_for(provider), constant=constant)
    with _ids_lock:
        if provider == 0 and stages_through_host(kernel.backend):
            _staged[0] += 1
        _next_id[0] += 1
        kid = _next_id[0]
        _kernels[kid] = kernel
    log.debug("kernel %d: jitops::%s on %s (%s, backend %s)", kid, type_name, PROVIDERS[provider], dtype,
              kernel.backend.name)
    return kid


def _host_view(ptr: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A numpy array over ORT's host buffer (no copy)."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0 or not ptr:
        return np.empty(shape, dtype=dtype)
    size = n * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_byte * size).from_address(ptr), dtype=dtype).reshape(shape)


def _add_outputs(ptrs: dict[str, int], call: int, out_specs: list[tuple[str, TensorSpec, Any, int]]
                 ) -> dict[str, int]:
    """ptrs with ORT's output buffers of this call added by output name (0 for an empty output)."""
    for index, (name, spec, dims, rank) in enumerate(out_specs):
        ptr = _lib.jitops_ort_output(call, index, dims, rank)
        if not ptr and spec.numel:
            raise OutputAllocationFailed()
        ptrs[name] = ptr or 0
    return ptrs


MAX_REPEATS = 16    # remembered input arrays per kernel (forgotten all at once when full)


def compute(kid: int, call: int, n_inputs: int, inputs: Any, stream: int) -> None:
    k = _kernels[kid]
    if k.provider != 0:
        raw = ctypes.string_at(inputs, n_inputs * ctypes.sizeof(JT_TENSOR))
        hit = k.repeats.get(raw)
        if hit is not None and hit[0] == engine.generation():
            _, runner, base, out_specs, derived_key = hit
            k.calls += 1
            runner(_add_outputs(dict(base), call, out_specs), stream or 0, derived_key)
            return
    names = k.type.inputs
    shapes: dict[str, tuple[int, ...] | None] = {}
    dtypes: dict[str, str] = {}
    ptrs: dict[str, int] = {}
    for i, name in enumerate(names):
        t = inputs[i]
        if t.ndim < 0:
            shapes[name] = None
            continue
        shapes[name] = tuple(t.dims[:t.ndim])
        dtypes[name] = ELEM_DTYPES.get(t.elem_type, f"onnx-type-{t.elem_type}")
        ptrs[name] = t.data or 0
    attrs, out_specs = k.plan(shapes, dtypes)
    out_ptrs = _add_outputs({}, call, out_specs)
    k.calls += 1
    if k.provider == 0:
        tensors = {n: (_host_view(ptrs[n], k.stored(n, shapes[n]), dtypes[n]) if shapes[n] is not None else None)
                   for n in names}
        outs = {name: _host_view(out_ptrs[name], s.storage_shape, s.dtype) for name, s, _, _ in out_specs}
        layout = k.type.fixed.get("layout")
        engine.run(k.type.op, tensors, {**attrs, "layout": layout} if layout else attrs, out=outs, backend=k.backend)
    else:
        key = (tuple(shapes.values()), tuple(dtypes.values()), engine.generation())
        runner = k.runners.get(key)
        if runner is None:      # new shapes, or plans dropped since (e.g. tuning records changed)
            specs = k.specs(shapes, dtypes)
            k.runners = {r: f for r, f in k.runners.items() if r[2] == key[2]}
            runner = k.runners[key] = engine.pointer_runner(k.type.op, specs, attrs, k.backend)
        derived = runner.derived_inputs
        # Initializers keep buffer and contents while this kernel lives: key derived data by this
        # kernel and their pointers (another session's buffers at the same address are another key).
        derived_key = (kid, tuple(ptrs.get(n, 0) for n in derived)) if derived and k.constant.issuperset(
            n for n in derived if shapes.get(n) is not None) else None
        if len(k.repeats) >= MAX_REPEATS:
            k.repeats.clear()
        k.repeats[raw] = (key[2], runner, dict(ptrs), out_specs, derived_key)
        ptrs.update(out_ptrs)
        keep = getattr(_lib, "jitops_ort_keep_replay", None)
        # derived data is kept (and a replay may skip its prepare launches) only under a derived key
        launches: list | None = [] if keep is not None and runner.replayable and all(out_ptrs.values()) and (
            derived_key is not None or not derived) else None
        runner(ptrs, stream or 0, derived_key, launches)
        if launches:
            blob = replay_blob(launches, out_specs)
            keep(call, _lib.jitops_ort_replay_new(blob, len(blob)))


def replay_blob(launches: list, out_specs: list[tuple[str, TensorSpec, Any, int]]) -> bytes:
    """A call's launches (pointer_runner's records) in the form the library replays them
    (onnx/native/jitops_ort.cc, struct Replay): the outputs' dims, then per launch the launcher's
    entry, function, grid, block and shared bytes, the argument values, and which arguments hold
    which output's pointer."""
    index = {name: i for i, (name, _, _, _) in enumerate(out_specs)}
    out = [struct.pack("<I", len(out_specs))]
    for _, spec, dims, rank in out_specs:
        out.append(struct.pack(f"<I{rank}q", rank, *dims[:rank]))
    out.append(struct.pack("<I", len(launches)))
    for (_, entry, function, gx, gy, gz, bx, by, bz, shared), values, buffers in launches:
        out.append(struct.pack("<QQ7II", entry, function, gx, gy, gz, bx, by, bz, shared, len(values)))
        out += [struct.pack("<I", len(v)) + v for v in values]
        patches = [(arg, index[name]) for arg, name in buffers.items() if name in index]
        out.append(struct.pack("<I", len(patches)))
        out += [struct.pack("<II", arg, o) for arg, o in patches]
    return b"".join(out)


def destroy(kid: int) -> None:
    with _ids_lock:
        _kernels.pop(kid, None)


# ---- ctypes entry points: never let an exception escape into ONNX Runtime

def create_callback(type_name: bytes, provider: int, elem_type: int, attrs_json: bytes, out_id: Any,
                    err: int, errlen: int) -> int:
    from .native import write_error
    try:
        out_id[0] = create(type_name.decode(), int(provider), int(elem_type), attrs_json.decode())
        return 0
    except Exception as exc:  # becomes the ORT status of session creation
        write_error(err, errlen, _message(exc))
        return 1


def compute_callback(kid: int, call: int, n_inputs: int, inputs: Any, stream: int, err: int, errlen: int) -> int:
    from .native import write_error
    try:
        compute(int(kid), call, int(n_inputs), inputs, stream or 0)
        return 0
    except OutputAllocationFailed:
        return 1          # the native side reports ORT's own message
    except Exception as exc:  # becomes the ORT status of session.run
        k = _kernels.get(int(kid))
        where = f"jitops::{k.type.name} ({k.type.op})" if k else "jitops kernel"
        write_error(err, errlen, f"{where}: {_message(exc)}")
        return 1


def destroy_callback(kid: int) -> None:
    try:
        destroy(int(kid))
    except Exception:
        pass


def _message(exc: BaseException) -> str:
    if isinstance(exc, JitopsError):
        return f"{type(exc).__name__}: {exc}"
    log.debug("jitops kernel failed:\n%s", traceback.format_exc())
    return f"{type(exc).__name__}: {exc}"
