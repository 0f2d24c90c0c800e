"""What an operator module provides, and the plain data it hands to the engine.

An op module knows shapes, schedules and templates. It never touches a driver, a cache or an
array library: it turns tensor specs + attributes into a Problem, picks Schedules for a
DeviceInfo, and describes the kernel launches of a Plan. The engine does the rest.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError

FLOAT_DTYPES = ("float32", "float16")
HALF_DTYPES = ("float16", "bfloat16")      # 16-bit floats; an op accepts bfloat16 by listing it itself
ITEMSIZE = {"float32": 4, "float16": 2, "float64": 8, "int32": 4, "int64": 8, "uint8": 1, "bfloat16": 2}
C_TYPE = {"float32": "float", "float16": "jt_half", "bfloat16": "jt_bf16"}
LAYOUTS = ("", "nhwc", "bshd", "sbhd")   # "": C-contiguous in the shape's order; the others: jitops.arrays.LAYOUTS
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TensorSpec:
    """An array as an op sees it. `shape` is the logical shape; `layout` "nhwc" marks a rank-4
    (N, C, H, W) array stored N, H, W, C (a torch channels_last tensor), "bshd" a [B, H, S, D]
    array stored [B, S, H, D] (attention), "" a C-contiguous one (arrays.LAYOUTS). `pitch`: for "bshd",
    the elements between consecutive rows of S when that is more than H * D (a slice of a packed
    q/k/v projection; 0: dense). It is part of the spec's identity (equality, problem keys)."""

    shape: tuple[int, ...]
    dtype: str
    layout: str = ""
    pitch: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def span_nbytes(self) -> int:
        """Bytes from the first element to the last: nbytes, or for a pitched [B, S, H, D] spec its rows
        with the other columns between them (what a kernel may touch: buffer sizes, bounds checks)."""
        if not self.pitch:
            return self.nbytes
        from ..arrays import span_elements
        _, _, s, d = self.shape
        return span_elements(self.shape, (s * self.pitch, d, self.pitch, 1)) * ITEMSIZE[self.dtype]

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape in memory order: (N, H, W, C) for "nhwc", [B, S, H, D] for "bshd"."""
        if self.layout:
            from ..arrays import storage_shape
            return storage_shape(self.shape, self.layout)
        return self.shape

    def __str__(self) -> str:
        text = f"{'x'.join(map(str, self.shape)) or 'scalar'}:{self.dtype}"
        text = f"{text}:{self.layout}" if self.layout else text
        return f"{text}:pitch{self.pitch}" if self.pitch else text


def frozen_items(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in mapping.items()))


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return frozen_items(v)
    return v


@dataclass(frozen=True)
class Schedule:
    """An algorithm and its parameters. `why` explains a heuristic choice (not part of identity)."""

    algorithm: str
    params: tuple[tuple[str, Any], ...] = ()
    why: str = field(default="", compare=False)

    @staticmethod
    def make(algorithm: str, why: str = "", **params: Any) -> "Schedule":
        return Schedule(algorithm, frozen_items(params), why)

    def __getitem__(self, name: str) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"schedule {self.algorithm} has no parameter '{name}'")

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "params": {k: v for k, v in self.params}}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Schedule":
        return Schedule.make(d["algorithm"], **dict(d.get("params", {})))

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.algorithm}({inner})"


@dataclass(frozen=True)
class Buf:
    """A tensor argument: an input, an output or a workspace, by name.

    align: the byte alignment the kernel needs for this buffer's address where it reads or writes
    it in vectors with no unaligned path (e.g. 16 for 8 fp16 outputs stored at once); 0 where its
    elements' own alignment does. The engine refuses (or stages) a user array that misses it: a
    GPU faults on a misaligned vector access instead of reporting it."""

    name: str
    align: int = 0


def vector_buf(name: str, elements: int, itemsize: int) -> Buf:
    """Buf `name` that a kernel accesses `elements` at a time (one jt_vec) with no unaligned path:
    its address must be a multiple of their bytes."""
    return Buf(name, align=elements * itemsize if elements > 1 else 0)


@dataclass(frozen=True)
class Scalar:
    kind: str  # i32 | u32 | i64 | u64 | f32 | f64
    value: Any


@dataclass(frozen=True)
class TensorMap:
    """A by-value tensor-map argument (Hopper TMA) describing buffer `name` as a tensor of `dims`
    elements (innermost first; `strides`: the element strides of dims 1.., dense when None: each
    the product of the sizes before), copied in boxes of `box` elements with a `swizzle` of 0, 32,
    64 or 128 bytes; the backend encodes it from the buffer's address at every bind (elements
    outside the tensor read as zeros).

    `im2col` makes it an im2col map (cuTensorMapEncodeIm2col) over a dense NHWC tensor, dims
    (C, W, H, N): (lower_w, lower_h, upper_w, upper_h, channels per pixel, pixels per load,
    stride_w, stride_h); `box` is then unused."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128
    strides: tuple[int, ...] | None = None
    im2col: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Launch:
    template: str
    kernel: str
    params: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Buf | Scalar | TensorMap, ...]
    shared_bytes: int = 0
    # The kernel waits for the stream's previous kernel (griddepcontrol.wait) before it touches global
    # memory, so it may be launched while that kernel still runs (CUDA's programmatic dependent launch).
    programmatic: bool = False

    @staticmethod
    def make(template: str, kernel: str, params: Mapping[str, Any], grid: Sequence[int], block: Sequence[int],
             args: Iterable[Buf | Scalar | TensorMap], shared_bytes: int = 0,
             programmatic: bool = False) -> "Launch":
        g = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
        b = tuple(int(v) for v in block) + (1,) * (3 - len(block))
        return Launch(template, kernel, frozen_items({**params, "kernel_name": kernel}), g, b, tuple(args),
                      int(shared_bytes), bool(programmatic))

    @property
    def template_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params}


@dataclass(frozen=True)
class Workspace:
    """Device memory a plan needs besides inputs and outputs.

    persistent: kept across calls (self-resetting grid-reduction counters, transformed weights).
    zero: filled with zeros once, when allocated.
    derived_from: inputs whose contents this workspace is computed from by the plan's `prepare`
    launches; the engine re-runs them when one of those inputs changes.
    """

    name: str
    nbytes: int
    persistent: bool = False
    zero: bool = False
    derived_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...] = ()
    prepare: tuple[Launch, ...] = ()


@dataclass(frozen=True)
class Registration:
    """What jitops derives from an op beyond its functions, declared in the op module as
    `REGISTRATION = Registration(...)` (jitops.ops reads it; a module without one gets the defaults).

    References to code outside jitops/ops are "module:attribute" strings, so an op module imports
    no bench, tuning or ONNX code; tests/test_registry.py resolves every one of them.
    """

    bench: str | None = ""      # bench module with cases(ctx): "" = jitops.bench.<op>, None = no benchmark
    tuning_problems: str = ""   # "module:fn", fn() -> [(name, problem)] the shipped schedules are tuned on;
                                # "" = the bench module's problems(ctx) on a GPU, which then yields (name, problem)
    vendor: str = ""            # "module:fn", fn(problem, torch tensors, torch) -> call: the vendor op the tuner
                                # times beside jitops; "" = none
    onnx: tuple[str, ...] = ()  # standard ONNX op types jitops.onnx maps onto this op (each needs a matcher there)


class Problem(Protocol):
    """A validated op instance: shapes, dtypes and attributes. Hashable."""

    def key(self) -> str: ...
    def inputs(self) -> dict[str, TensorSpec]: ...
    def outputs(self) -> dict[str, TensorSpec]: ...


class OpModule(Protocol):
    """The functions each module in jitops/ops/ defines."""

    NAME: str
    INPUTS: tuple[str, ...]         # positional tensor inputs, in order (optional ones may be None)
    REGISTRATION: Registration      # optional: benchmark, tuning problems, vendor op, ONNX types

    def make_problem(self, inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> Problem: ...
    def parse_problem(self, spec: Mapping[str, str]) -> Problem: ...
    def heuristic(self, problem: Any, device: DeviceInfo, algorithm: str | None = None) -> Schedule: ...
    def candidates(self, problem: Any, device: DeviceInfo) -> list[Schedule]: ...
    def plan(self, problem: Any, schedule: Schedule, device: DeviceInfo) -> Plan: ...
    def reference(self, problem: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...
    def random_inputs(self, problem: Any, rng: np.random.Generator) -> dict[str, np.ndarray]: ...
    def tolerance(self, problem: Any, schedule: Schedule) -> tuple[float, float]: ...


# ---- fp32 math on the matrix cores: one policy for every op with products (conv2d, attention) ----

FP32_PRECISIONS = ("highest", "tf32", "3xtf32")   # exact fp32, TF32 products, three TF32 products
# What precision=None means: jitops.set_fp32_precision's process-wide mode (it also drops the prepared
# plans, which were keyed by the call's None). Resolved when a problem is made, so problem keys carry
# the actual mode.
DEFAULT_FP32_PRECISION = ["highest"]


def resolve_precision(op: str, value: Any, dtype: str) -> str:
    """A call's `precision` as its problem records it: None -> the process default; always "highest"
    for 16-bit inputs (exact on the matrix cores already)."""
    precision = DEFAULT_FP32_PRECISION[0] if value is None else value
    if precision not in FP32_PRECISIONS:
        raise ArgumentError("precision", f"one of {', '.join(map(repr, FP32_PRECISIONS))} (or None)", repr(precision),
                            op=op)
    return precision if dtype == "float32" else "highest"


# ---- helpers shared by op modules ----

def require_dtype(op: str, name: str, spec: TensorSpec, allowed: Sequence[str] = FLOAT_DTYPES) -> None:
    if spec.dtype not in allowed:
        raise ArgumentError(name, f"dtype in {{{', '.join(allowed)}}}", spec.dtype, op=op)


def require_same_dtype(op: str, name: str, spec: TensorSpec, like: TensorSpec, like_name: str) -> None:
    if spec.dtype != like.dtype:
        raise ArgumentError(name, f"the dtype of '{like_name}' ({like.dtype})", spec.dtype, op=op)


def require_rank(op: str, name: str, spec: TensorSpec, ranks: Sequence[int] | int) -> None:
    ranks = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if len(spec.shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ArgumentError(name, f"a tensor of rank {want}", f"shape {spec.shape}", op=op)


def index_type(*extents: int) -> str:
    """32-bit indexing when every offset fits (seed 003), else 64-bit."""
    return "int" if max(extents, default=0) <= INT32_MAX else "jt_int64"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(v: int, m: int) -> int:
    return ceil_div(v, m) * m


def parse_shape(text: str) -> tuple[int, ...]:
    """'1x64x56x56' -> (1, 64, 56, 56)."""
    try:
        dims = tuple(int(p) for p in str(text).lower().split("x"))
    except ValueError as exc:
        raise ArgumentError("shape", "dimensions written AxBxC (e.g. 1x64x56x56)", text) from exc
    if any(d < 0 for d in dims):
        raise ArgumentError("shape", "non-negative dimensions", text)
    return dims


def parse_value(text: str) -> Any:
    """CLI attribute values: ints, floats, lists 'a,b', booleans, else the string."""
    t = str(text)
    if "," in t:
        return tuple(parse_value(p) for p in t.split(","))
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def problem_key(op: str, inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in inputs.items() if v is not None]
    parts += [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(attrs.items())]
    return f"{op}:" + ";".join(parts)
