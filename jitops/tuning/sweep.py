"""Time a given list of schedules of one problem the way the tuner does (device events per call,
L2 flushed, interleaved trials), each first checked against the float64 reference: the
measurement behind scripts/sweep_norms.py and the GPU tests' re-measurement of a tuned record."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Sequence

from ..errors import JitopsError
from ..ops.base import Schedule
from ..runtime import current_backend
from .measure import Loaded, ProblemBench, UnfitSchedule, median


@dataclass
class Measured:
    schedule: Schedule
    time_us: float | None = None       # median per call; None: it did not plan, compile, run or pass
    max_error: float | None = None     # against float64, relative to the output's scale (None: not checked)
    detail: str = ""                   # why it has no time


def measure_schedules(op: ModuleType, problem: Any, schedules: Sequence[Schedule], backend: Any = None,
                      reps: int = 30, check: bool = True) -> list[Measured]:
    """Each schedule loaded (and with `check`, run once on poisoned outputs and compared with the
    float64 reference), then every one that passed timed in interleaved trials of 5 calls."""
    backend = backend or current_backend()
    bench = ProblemBench(backend, op, problem)
    out = [Measured(s) for s in schedules]
    loaded: dict[int, Loaded] = {}
    samples: dict[int, list[float]] = {}
    try:
        for i, m in enumerate(out):
            try:
                lo = bench.load(m.schedule)
            except (UnfitSchedule, JitopsError) as exc:
                m.detail = f"{type(exc).__name__}: {exc}"
                continue
            loaded[i], samples[i] = lo, []
            if check:
                result = bench.check(lo)
                m.max_error = result["max_error"]
                if not result["passed"]:
                    m.detail = result.get("why", "wrong output")
                    bench.release(loaded.pop(i))
        for _ in range(max(1, reps // 5)):
            for i, lo in list(loaded.items()):
                try:
                    samples[i] += bench.time_us(lo, 5, warmup=1)
                except JitopsError as exc:
                    out[i].detail = f"{type(exc).__name__}: {exc}"
                    bench.release(loaded.pop(i))
        for i in loaded:
            out[i].time_us = median(samples[i])
    finally:
        for lo in loaded.values():
            bench.release(lo)
        bench.close()
    return out


def remeasure(op: ModuleType, problem: Any, schedules: Sequence[Schedule], backend: Any = None,
              reps: int = 30) -> list[float]:
    """Median times (us) of `schedules` on this problem, interleaved, measured afresh (to verify a
    tuning); inf for one that does not run."""
    found = measure_schedules(op, problem, schedules, backend, reps, check=False)
    return [m.time_us if m.time_us is not None else float("inf") for m in found]
