"""leaky_relu: y = x if x > 0 else alpha * x, elementwise, fp32, fp16 or bf16.

Any memory format: the kernel walks the dense storage, so a channels_last tensor (or an array
declared layout="nhwc") runs the same kernel and its output keeps that format.

Memory-bound: the schedule's job is to keep enough 16-byte accesses in flight. Choices: vector
width, vectors per thread (loads issued before use), block size, a grid-stride cap for huge
tensors, 32- or 64-bit indexing. `naive` (one thread per element) is the seeds' baseline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError, ScheduleError
from .base import (C_TYPE, FLOAT_DTYPES, ITEMSIZE, INT32_MAX, Buf, Launch, Plan, Scalar, Schedule, TensorSpec,
                   ceil_div, index_type, parse_shape, problem_key, require_dtype)

NAME = "leaky_relu"
INPUTS = ("x",)
LAYOUT_INPUTS = ("x",)      # elementwise: any dense memory format, kept by the output
DTYPES = FLOAT_DTYPES + ("bfloat16",)
ALGORITHMS = ("vectorized", "naive")
TILED_MAX_BYTES = 6 << 20        # tensors up to this size (per side) take the tiled schedule (measured to 5 MB)
TEMPLATES = {"naive": "leaky_relu/naive.hip.j2", "vectorized": "leaky_relu/vectorized.hip.j2"}


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(tuning_problems="jitops.tuning.shipped:leaky_relu_problems",
                            vendor="jitops.tuning.vendor:torch_leaky_relu", onnx=("LeakyRelu",))


@dataclass(frozen=True)
class LeakyReluProblem:
    shape: tuple[int, ...]
    dtype: str
    alpha: float
    layout: str = ""          # "nhwc": a channels_last (N, C, H, W) tensor; the kernel does not care

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def inputs(self) -> dict[str, TensorSpec]:
        return {"x": TensorSpec(self.shape, self.dtype, self.layout)}

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(self.shape, self.dtype, self.layout)}

    def key(self) -> str:
        # Records key on the element count: leaky_relu does not care about the shape or the layout.
        return problem_key(NAME, {"x": TensorSpec((self.numel,), self.dtype)}, {})

    def bytes_moved(self) -> int:
        return 2 * self.numel * ITEMSIZE[self.dtype]


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> LeakyReluProblem:
    x = inputs.get("x")
    if x is None:
        raise ArgumentError("x", "a tensor", None, op=NAME)
    require_dtype(NAME, "x", x, DTYPES)
    alpha = attrs.get("alpha", 0.01)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
        raise ArgumentError("alpha", "a real number", repr(alpha), op=NAME)
    alpha = float(alpha)
    if not np.isfinite(alpha):
        raise ArgumentError("alpha", "a finite number", alpha, op=NAME)
    return LeakyReluProblem(tuple(int(s) for s in x.shape), x.dtype, alpha, x.layout)


def parse_problem(spec: Mapping[str, str]) -> LeakyReluProblem:
    shape = parse_shape(spec.get("x", "1048576"))
    extra = set(spec) - {"x", "dtype", "alpha"}
    if extra:
        raise ArgumentError(sorted(extra)[0], "one of x, dtype, alpha", op=NAME)
    return make_problem({"x": TensorSpec(shape, spec.get("dtype", "float32"))},
                        {"alpha": float(spec.get("alpha", 0.01))})


def _vectorized(problem: LeakyReluProblem, device: DeviceInfo, vec: int, unroll: int, block: int,
                waves: int, why: str = "", streaming: bool = False, tiled: bool = False) -> Schedule:
    extra = {"tiled": True} if tiled else {}
    return Schedule.make("vectorized", why=why, vec=vec, unroll=unroll, block=block, waves=waves,
                         streaming=streaming, **extra)


def heuristic(problem: LeakyReluProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    algorithm = algorithm or "vectorized"
    if algorithm not in ALGORITHMS:
        raise ScheduleError(f"leaky_relu has no algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    n = problem.numel
    if algorithm == "naive":
        return Schedule.make("naive", why="one thread per element (baseline)", block=256)
    vec = 16 // ITEMSIZE[problem.dtype]
    if problem.bytes_moved() // 2 <= TILED_MAX_BYTES:
        # H100, 2026-11-23 (scripts/device_memops2.py, graph replay, 16K-2.6M elements, 3 dtypes,
        # 21 schedules each): torch's geometry in contiguous tiles per block was the best fixed
        # rule, 0.96-1.03x torch (geomean 0.99) where the untiled pick below ran 0.91-1.03x:
        # fp32 128 threads x 2 vectors, 16-bit types 256 threads x 1 vector. ncu (1M fp32): the
        # old pick ran 256 blocks (0.24 waves) of 4 vectors per thread, 4.10 us vs torch's 3.52 us;
        # the tiled one 1024 blocks of 128 threads like torch's, 3.62 us.
        block, unroll = (128, 2) if problem.dtype == "float32" else (256, 1)
        blocks = ceil_div(n, vec * unroll * block)
        why = (f"{n} elements of {problem.dtype}: 16-byte accesses ({vec} elements), {unroll} per thread, "
               f"{block} threads per block, a contiguous tile per block ({blocks} blocks)")
        return _vectorized(problem, device, vec, unroll, block, 0, why, tiled=True)
    block = 256
    resident_blocks = device.multiprocessors * device.resident_blocks(block)
    # Measured on an H200 (scripts/sweep_leaky_relu.py and jitops bench, 2026-11-22): one pass over
    # the tensor; several vectors per thread pay only where one vector per thread would fill the
    # device about once (~1M fp32 elements); streaming (evict-first) accesses pay only when the
    # data cannot stay in L2 anyway, and cost a third at sizes that fit (4M fp32: 8.4 vs 5.7 us).
    one_per_thread = ceil_div(n, vec * block)
    # Hot-L2 sweep (2026-11-23): 4 vectors per thread also win up to ~4 resident waves (4M fp32:
    # 5.70 vs 6.11 us with one).
    unroll = 4 if resident_blocks // 2 <= one_per_thread <= 4 * resident_blocks else 1
    # Evict-first accesses (H200 tuner sweeps over every candidate, 2026-11-29, fp16 / bf16 / fp32, 8M-268M
    # elements): the fastest at 64 MB moved (1.3x L2), 2-6% slower than plain ones from 128 MB on (2.6x L2).
    streaming = not fits_in_l2(problem, device) and problem.bytes_moved() <= STREAMING_MAX_L2 * device.l2_bytes
    waves = 0
    why = (f"{n} elements of {problem.dtype}: 16-byte accesses ({vec} elements), {unroll} per thread, "
           f"{block} threads per block, one pass over {ceil_div(one_per_thread, unroll)} blocks"
           + (", streaming loads/stores (data used once)" if streaming else ""))
    return _vectorized(problem, device, vec, unroll, block, waves, why, streaming)


# The heuristic streams only data moved between one and this many L2s (see heuristic).
STREAMING_MAX_L2 = 2


def fits_in_l2(problem: LeakyReluProblem, device: DeviceInfo) -> bool:
    """Input and output fit in L2 together: in a network the input is still there from the op
    that wrote it, and evict-first (streaming) accesses only cost."""
    return problem.bytes_moved() <= device.l2_bytes


# The tuner times problems that fit in L2 with their input there (measure.timed_warm).
timed_warm_l2 = fits_in_l2


def candidates(problem: LeakyReluProblem, device: DeviceInfo) -> list[Schedule]:
    out = [heuristic(problem, device, "naive")]
    max_vec = 16 // ITEMSIZE[problem.dtype]
    # Evict-first accesses only for data that cannot stay in L2: in a network (and in the bench's
    # back-to-back calls) the input of an elementwise op that fits in L2 was just written there by
    # its producer, and streaming then costs up to a third (4M fp32 on an H200: 7.9 vs 5.8 us).
    stream_options = (False,) if fits_in_l2(problem, device) else (False, True)
    for vec in sorted({max_vec, max_vec // 2}):
        for unroll in (1, 2, 4, 8):
            for block in (128, 256, 512):
                for waves in (0, 4, 8, 16):
                    for streaming in stream_options:
                        out.append(_vectorized(problem, device, vec, unroll, block, waves, streaming=streaming))
    # tiled: a contiguous tile per block, no bounds checks in full tiles (one pass, no grid stride)
    for unroll in (1, 2, 4, 8):
        for block in (128, 256, 512):
            out.append(_vectorized(problem, device, max_vec, unroll, block, 0, tiled=True))
    return out


def plan(problem: LeakyReluProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    n = problem.numel
    ctype = C_TYPE[problem.dtype]
    if n == 0:
        return Plan(launches=())
    if schedule.algorithm == "naive":
        block = int(schedule["block"])
        grid = ceil_div(n, block)
        if grid > INT32_MAX:
            raise ScheduleError(f"naive leaky_relu cannot cover {n} elements with one thread each")
        idx = _index(schedule, n + block)
        params = {"ctype": ctype, "index_type": idx, "block": block}
    elif schedule.algorithm == "vectorized":
        vec, unroll, block, waves = (int(schedule[k]) for k in ("vec", "unroll", "block", "waves"))
        if vec * ITEMSIZE[problem.dtype] > 16 or 16 % (vec * ITEMSIZE[problem.dtype]):
            raise ScheduleError(f"vector of {vec} {problem.dtype} is not a power-of-two access of at most 16 bytes")
        if block > device.max_threads_per_block or block % device.warp_size:
            raise ScheduleError(f"block of {block} threads does not fit {device.name}")
        full = ceil_div(n, vec * unroll * block)
        tiled = bool(schedule.get("tiled", False))
        if tiled and waves:
            raise ScheduleError("tiled leaky_relu covers the tensor in one pass: waves must be 0")
        cap = waves * device.multiprocessors * device.resident_blocks(block)
        grid = max(1, min(full, cap) if waves else full)
        idx = _index(schedule, n + grid * block * unroll * vec + 16)
        params = {"ctype": ctype, "index_type": idx, "block": block, "vec": vec, "unroll": unroll,
                  "grid_stride": bool(waves) and cap < full, "streaming": bool(schedule.get("streaming", False)),
                  "tiled": tiled}
    else:
        raise ScheduleError(f"leaky_relu has no algorithm '{schedule.algorithm}'")
    args = (Buf("x"), Buf("y"), Scalar("i32" if idx == "int" else "i64", n), Scalar("f32", problem.alpha))
    launch = Launch.make(TEMPLATES[schedule.algorithm], f"leaky_relu_{schedule.algorithm}", params,
                         (grid,), (block,), args)
    return Plan(launches=(launch,))


def _index(schedule: Schedule, largest_offset: int) -> str:
    """32-bit indexing when every offset fits, unless the schedule forces 64-bit (index="int64")."""
    return "jt_int64" if schedule.get("index") == "int64" else index_type(largest_offset)


def variants(device: DeviceInfo) -> list[tuple[LeakyReluProblem, Schedule]]:
    """Problems and schedules that together reach every branch of every template (compile checks)."""
    out = []
    for dtype in ("float32", "float16"):
        p = make_problem({"x": TensorSpec((1 << 20,), dtype)}, {"alpha": 0.1})
        vec = 16 // ITEMSIZE[dtype]
        out.append((p, heuristic(p, device, "naive")))
        out.append((p, _vectorized(p, device, vec, 4, 256, 0)))
        out.append((p, _vectorized(p, device, vec, 2, 128, 1, streaming=True)))      # grid-stride, streaming
        out.append((p, Schedule.make("vectorized", vec=vec, unroll=1, block=256, waves=0, index="int64")))
    out.append((p, _vectorized(p, device, 8, 4, 128, 0, streaming=True, tiled=True)))   # tiled, fp16
    # bf16 / NHWC: the same template with jt_bf16 (the row-norm and group-norm variants compile
    # bf16 vectors; the emulator tests run this one), so no extra compile here (CI time)
    return out


def reference(problem: LeakyReluProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = np.asarray(inputs["x"], dtype=np.float64)
    return {"y": np.where(x > 0, x, problem.alpha * x)}


def random_inputs(problem: LeakyReluProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x in storage order ((N, H, W, C) for "nhwc"): what the kernel and the reference see."""
    shape = problem.inputs()["x"].storage_shape
    return {"x": rng.standard_normal(shape).astype(problem.dtype)}


def tolerance(problem: LeakyReluProblem, schedule: Schedule) -> tuple[float, float]:
    # One multiply, rounded once to the output type: half an ulp relative, 2^-24 (fp32), 2^-11
    # (fp16), 2^-8 = 3.9e-3 (bf16: 8 significant bits).
    return {"float32": (1e-6, 0.0), "float16": (1e-3, 1e-6), "bfloat16": (5e-3, 1e-6)}[problem.dtype]


def bytes_moved(problem: LeakyReluProblem) -> int:
    return problem.bytes_moved()
