"""Benchmark mode, as torch.backends.cudnn.benchmark: the first call of a problem with no tuning record
times the op's shortlist (its pick and the few schedules most likely to beat it) on the device and
keeps the fastest.

    jitops.set_benchmark(True)          # or JITOPS_BENCHMARK=1 (a number >= 2: that many schedules)

Why: the cost models pick well on average but miss on some layers by 10-20% (conv2d on the H100:
SD-UNet's 640-channel 3x3 at batch 2 ran 36.0 us on the pick and 29.6 on the fourth-rated tile,
2026-11-27), and a full `jitops tune` takes minutes. Timing the op's `shortlist` (conv2d: the pick and
the next best-rated; attention: the pick's nearest neighbours; config.BENCHMARK_CANDIDATES of them) costs a few
seconds per problem, once: the winner is a
user record, so later calls and later processes use it without timing again (a full `jitops tune`
still measures such a problem: the record says it saw a shortlist only).

Each schedule's output is checked against the pick's output on the same random inputs (the op's
tolerance), not against the float64 reference, which takes seconds on large problems. Nothing is
timed while the call's stream (or the legacy stream: any capture in global mode) is being captured
into a CUDA graph: the call keeps the heuristic and says so once. Ops without `shortlist` and offline
targets are left to the heuristic (the CPU emulator times its own kernels, as it runs them).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from types import ModuleType
from typing import Any

from .. import config
from ..ops.base import Schedule

log = logging.getLogger("jitops.tune")

_lock = threading.Lock()    # one benchmark at a time (two threads' first calls of a problem time it once)
_told: set[str] = set()


def _capturing(backend: Any, stream: int | None) -> bool:
    try:
        return any(backend.capturing(s) for s in {0, stream or 0})
    except Exception:   # noqa: BLE001 - a driver that cannot say: do not risk ending someone's capture
        return True


def benchmark_schedule(op: ModuleType, problem: Any, backend: Any, stream: int | None) -> Schedule | None:
    """The fastest of the op's shortlist on this device (recorded), or None: benchmark mode off, the
    op has no shortlist, nothing to choose from, a capture in progress, or every schedule failed."""
    n = config.benchmark_candidates()
    shortlist = getattr(op, "shortlist", None)
    if n < 2 or shortlist is None or not backend.can_launch:
        return None
    if _capturing(backend, stream):
        key = f"{op.NAME} {problem.key()}"
        if key not in _told:
            _told.add(key)
            log.warning("benchmark mode: %s first runs inside a CUDA-graph capture; it keeps the heuristic's "
                        "schedule (call it once before capturing to have it timed)", key)
        return None
    schedules = shortlist(problem, backend.device, n)
    if len(schedules) < 2:
        return None
    with _lock:
        return _measure(op, problem, backend, schedules)


def _measure(op: ModuleType, problem: Any, backend: Any, schedules: list[Schedule]) -> Schedule | None:
    from ..records import store
    from . import space
    from .compile_pool import compile_missing
    from .report import describe
    from .tuner import TuneOptions, tune_candidates
    t0 = time.monotonic()
    opts = TuneOptions(budget_s=None, top_k=len(schedules), final_reps=15, reference="heuristic", progress=False)
    cands = space.from_schedules(op, problem, backend, schedules)
    outcomes = compile_missing(space.ordered_jobs([cands]), backend, min(len(cands), os.cpu_count() or 1),
                               opts.compile_timeout_s, None, progress=False)
    space.apply_compile_outcomes(cands, outcomes, backend.device)
    try:
        result = tune_candidates(op, problem, cands, backend, opts)
    except Exception as exc:   # noqa: BLE001 - the call itself goes on with the heuristic
        log.warning("benchmark mode: %s %s: timing failed (%s: %s); keeping the heuristic", op.NAME,
                    describe(problem), type(exc).__name__, exc)
        return None
    if result.schedule is None or result.record is None:
        return None
    result.record["shortlist"] = len(schedules)
    store().put([result.record])
    log.info("benchmark mode: %s %s: %s (%.2f us; the heuristic's %s us) of %d timed in %.1f s", op.NAME,
             describe(problem), result.schedule, result.time_us or 0.0,
             "-" if result.heuristic_us is None else f"{result.heuristic_us:.2f}", len(cands),
             time.monotonic() - t0)
    return result.schedule
