"""Check and time one schedule of one problem on the device, with the tuner's own buffers.

Timing follows Triton's do_bench rather than back-to-back calls: before every timed call a
buffer of several times the L2 size is overwritten, so the call finds its inputs in device
memory as it would in a model where other layers ran in between (back-to-back calls over one
small buffer measure the L2 cache instead). Each call sits between its own pair of device
events; every call of a trial is queued before the first result is read, so the host never
stalls the device, and the flush in front of each call hides the launch latency. The result is
the median of per-call times. On the CPU emulator events are host timers and nothing is flushed.

Checking: outputs are poisoned (all bits set: NaN for floats) before the checked run, so an
element the kernel never wrote fails; the result is compared with the op's float64 reference on
the op's random inputs: max |out - ref| <= atol + rtol * max |ref| (the norm the op tests use).
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import numpy as np

from .. import engine
from ..errors import LaunchError
from ..ops.base import Schedule

log = logging.getLogger("jitops.tune")

_CHUNK = 1 << 23


def timed_warm(op: ModuleType, problem: Any, device: Any) -> bool:
    """Whether this problem is timed with its inputs left in L2 instead of behind a flush.

    An op may say so (`timed_warm_l2`) for problems whose whole traffic fits in L2 when, in a
    network, its input has just been written by the op before it (elementwise activations):
    there a flush measures a case that does not occur, and picks schedules (evict-first
    accesses, deep unrolling) that lose in the real one.
    """
    hook = getattr(op, "timed_warm_l2", None)
    return bool(hook and hook(problem, device))


def flush_size(op: ModuleType, problem: Any, backend: Any) -> int:
    """Bytes overwritten before each timed call of this problem: 0 on the emulator and for
    problems timed warm, else flush_bytes. The one rule for jitops, its records and the vendor."""
    if backend.name == "cpu" or timed_warm(op, problem, backend.device):
        return 0
    return flush_bytes(backend.device)


def flush_bytes(device: Any) -> int:
    """Four times the L2, at least 8 MiB and at most 512 MiB."""
    return int(min(max(4 * device.l2_bytes, 8 << 20), 512 << 20))


@dataclass
class Loaded:
    """A schedule's kernels loaded and bound to the bench's buffers, ready to run."""

    schedule: Schedule
    calls: list[tuple[Callable[[Any, int], None], Any]]
    zero_each_call: list[tuple[int, int]]
    allocations: list[int] = field(default_factory=list)

    def run(self, backend: Any, stream: int = 0) -> None:
        for ptr, nbytes in self.zero_each_call:
            backend.memset(ptr, 0, nbytes, stream)
        for launch, packed in self.calls:
            launch(packed, stream)


class UnfitSchedule(Exception):
    """The loaded kernel cannot run this launch on this device (found after loading)."""


def compare(got: np.ndarray, ref: np.ndarray, scale: float, rtol: float, atol: float) -> tuple[bool, float, str]:
    """(passed, max error relative to max |ref|, why it failed)."""
    g = np.ascontiguousarray(got).reshape(-1)
    r = np.asarray(ref).reshape(-1)
    if g.size != r.size:
        return False, float("inf"), f"output has {g.size} elements, reference {r.size}"
    worst = 0.0
    for s in range(0, g.size, _CHUNK):
        gd = g[s:s + _CHUNK].astype(np.float64)
        rd = r[s:s + _CHUNK].astype(np.float64, copy=False)
        finite = np.isfinite(rd)
        if not np.array_equal(np.isfinite(gd), finite):
            i = int(np.flatnonzero(np.isfinite(gd) != finite)[0]) + s
            return False, float("inf"), f"element {i} is {g[i]} where the reference is {r[i]}"
        if not finite.all():
            same = (gd[~finite] == rd[~finite]) | (np.isnan(gd[~finite]) & np.isnan(rd[~finite]))
            if not same.all():
                return False, float("inf"), "infinities or NaNs differ from the reference"
        if finite.any():
            worst = max(worst, float(np.max(np.abs(gd[finite] - rd[finite]))))
    allowed = atol + rtol * scale
    rel = worst / scale if scale > 0 else worst
    if worst > allowed:
        return False, rel, (f"max |error| {worst:.3g} > {allowed:.3g} "
                            f"(atol {atol:g} + rtol {rtol:g} x max|ref| {scale:.3g})")
    return True, rel, ""


def _with_scale(r: np.ndarray) -> tuple[np.ndarray, float]:
    """A reference array and its largest finite magnitude (what relative tolerances scale with)."""
    finite = r[np.isfinite(r)]
    return r, float(np.max(np.abs(finite))) if finite.size else 0.0


class ProblemBench:
    """Inputs, outputs, reference and L2-flush buffer of one problem on one backend."""

    def __init__(self, backend: Any, op: ModuleType, problem: Any, seed: int = 0, flush_l2: bool = True):
        self.backend, self.op, self.problem = backend, op, problem
        self._allocations: list[int] = []
        rng = np.random.default_rng(seed)
        self.host_inputs = op.random_inputs(problem, rng)
        self.ptrs: dict[str, tuple[int, int]] = {}
        for name, spec in problem.inputs().items():
            if spec is None:
                continue
            # the array's own size: a pitched input's data spans whole packed rows (random_inputs)
            arr = np.ascontiguousarray(np.asarray(self.host_inputs[name]).astype(spec.dtype, copy=False))
            ptr = self._alloc(arr.nbytes)
            if arr.nbytes:
                backend.copy_to_device(ptr, arr, arr.nbytes)
            self.ptrs[name] = (ptr, arr.nbytes)
        self.out_specs = problem.outputs()
        for name, spec in self.out_specs.items():
            self.ptrs[name] = (self._alloc(spec.nbytes), spec.nbytes)
        self.flush_size = flush_size(op, problem, backend) if flush_l2 else 0
        self.flush_ptr = self._alloc(self.flush_size) if self.flush_size else 0
        self._events: list[Any] = []
        self._reference: dict[str, tuple[np.ndarray, float]] | None = None
        self._reference_name = "float64"
        backend.synchronize()

    def _alloc(self, nbytes: int) -> int:
        ptr = self.backend.alloc(max(int(nbytes), 1))
        self._allocations.append(ptr)
        return ptr

    def close(self) -> None:
        self.backend.synchronize()
        for ptr in self._allocations:
            self.backend.free(ptr)
        self._allocations.clear()

    # ---- loading
    def load(self, schedule: Schedule) -> Loaded:
        """Load (from the binary cache the workers filled), bind buffers, run the plan's prepare launches."""
        be, dev = self.backend, self.backend.device
        prepared = engine.prepare(self.op, self.problem, be, schedule)
        for step in (*prepared.prepare_steps, *prepared.steps):
            lc, k = step.launch, step.kernel
            threads = lc.block[0] * lc.block[1] * lc.block[2]
            if k.max_threads and threads > k.max_threads:
                raise UnfitSchedule(f"{k.name}: {threads} threads per block, the compiled kernel allows "
                                    f"{k.max_threads} ({k.registers} registers per thread)")
            if k.static_shared + lc.shared_bytes > dev.shared_per_block_optin:
                raise UnfitSchedule(f"{k.name}: {k.static_shared} + {lc.shared_bytes} bytes of shared memory > "
                                    f"{dev.shared_per_block_optin}")
        ptrs = {name: ptr for name, (ptr, _) in self.ptrs.items()}
        loaded = Loaded(schedule, [], [])
        for ws in prepared.plan.workspaces:
            ptr = be.alloc(max(ws.nbytes, 1))
            loaded.allocations.append(ptr)
            if ws.zero:
                be.memset(ptr, 0, ws.nbytes)
                if not ws.persistent:
                    loaded.zero_each_call.append((ptr, ws.nbytes))
            ptrs[ws.name] = ptr
        for step in prepared.prepare_steps:   # derived workspaces: once, as for fixed weights
            engine.bind_and_launch(step, ptrs, 0)
        for step in prepared.steps:           # bound once: every timed run launches the same buffers
            engine.bind(step, ptrs)
        loaded.calls = [(step.run, step.packed) for step in prepared.steps]
        be.synchronize()
        return loaded

    def release(self, loaded: Loaded) -> None:
        self.backend.synchronize()
        for ptr in loaded.allocations:
            self.backend.free(ptr)
        loaded.allocations.clear()

    # ---- checking
    def reference(self) -> dict[str, tuple[np.ndarray, float]]:
        if self._reference is None:
            ref = self.op.reference(self.problem, self.host_inputs)
            self._reference = {name: _with_scale(np.asarray(ref[name])) for name in self.out_specs}
        return self._reference

    def _run_poisoned(self, loaded: Loaded) -> dict[str, np.ndarray]:
        """Each output of one run into buffers filled with 0xFF first (an element never written stays NaN)."""
        be = self.backend
        for name in self.out_specs:
            ptr, nbytes = self.ptrs[name]
            be.memset(ptr, 0xFF, nbytes)
        loaded.run(be)
        be.synchronize()
        out = {}
        for name, spec in self.out_specs.items():
            out[name] = np.empty(spec.shape, dtype=spec.dtype)
            if spec.nbytes:
                be.copy_to_host(out[name], self.ptrs[name][0], spec.nbytes)
        return out

    def use_output_as_reference(self, loaded: Loaded, name: str) -> None:
        """Compare later checks with this run's outputs (widened to float64) instead of op.reference."""
        self._reference = {n: _with_scale(got.astype(np.float64)) for n, got in self._run_poisoned(loaded).items()}
        self._reference_name = f"the output of {name}"

    def check(self, loaded: Loaded) -> dict[str, Any]:
        """Run once on poisoned outputs and compare with the reference (float64 unless replaced)."""
        outputs = self._run_poisoned(loaded)
        rtol, atol = self.op.tolerance(self.problem, loaded.schedule)
        result: dict[str, Any] = {"passed": True, "max_error": 0.0, "rtol": rtol, "atol": atol,
                                  "reference": self._reference_name, "inputs": "op.random_inputs, seed 0"}
        for name, got in outputs.items():
            ref, scale = self.reference()[name]
            ok, err, why = compare(got, ref, scale, rtol, atol)
            result["max_error"] = max(result["max_error"], err)
            if not ok:
                result.update(passed=False, why=f"{name}: {why}")
                break
        return result

    # ---- timing
    def _ensure_events(self, n: int) -> None:
        while len(self._events) < 2 * n:
            self._events.append(self.backend.create_event())

    def time_us(self, loaded: Loaded, reps: int, warmup: int = 1) -> list[float]:
        """Per-call device times (us) of `reps` calls, each behind an L2 flush."""
        be = self.backend
        for _ in range(warmup):
            loaded.run(be)
        self._ensure_events(reps)
        ev = self._events
        for i in range(reps):
            if self.flush_size:
                be.memset(self.flush_ptr, i & 0x7F, self.flush_size)
            be.record_event(ev[2 * i])
            loaded.run(be)
            be.record_event(ev[2 * i + 1])
        return [be.elapsed_ms(ev[2 * i], ev[2 * i + 1]) * 1e3 for i in range(reps)]


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("inf")


__all__ = ["ProblemBench", "Loaded", "UnfitSchedule", "LaunchError", "compare", "median", "flush_bytes",
           "flush_size", "timed_warm"]
