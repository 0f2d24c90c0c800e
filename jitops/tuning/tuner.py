"""The tuner: candidates -> parallel compile -> screen -> final timing -> numeric check -> record.

For a list of problems (one call of jitops.tune, or every problem of a model):
  1. problems with a record for this exact device are answered from it (no device work);
  2. each remaining problem's candidates are planned and pruned (space.py); all their unique
     sources are compiled at once in worker processes, heuristics first, then round-robin across
     problems, so that a budget cut still leaves every problem something to choose from;
  3. per problem: every compiled candidate is timed briefly (screen), the fastest few and the
     heuristic are timed again interleaved (final), and the fastest is checked against the
     float64 reference before it may win; one that fails is out and the next is checked;
  4. a winner must beat the heuristic by more than `min_gain` (noise), else the heuristic stays;
     a close winner (less than `confirm_below` faster) is timed once more against the heuristic on
     fresh buffers and must win there too; the record keeps the winner, the heuristic's time and
     the runners-up.
A candidate that fails to render, compile (or times out), launch or check counts as infinitely
slow and is logged; the heuristic is always measured, so a failing heuristic is reported.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable

from .. import engine
from ..errors import JitopsError
from ..ops.base import Schedule
from ..records import device_key, new_record, op_space, plan_failure, store
from ..runtime import current_backend
from . import space
from .compile_pool import compile_missing
from .measure import Loaded, ProblemBench, UnfitSchedule, flush_size, median, timed_warm
from .report import describe
from .sweep import remeasure   # also imported from here by tests and scripts
from .progress import bar

log = logging.getLogger("jitops.tune")

TIMING_METHOD = "device events per call, L2 flushed before each call, median"
TIMING_WARM = "device events per call, inputs left in L2 (as just written by the op before), median"


@dataclass
class TuneOptions:
    """How hard to look. `budget_s` bounds the whole call (compile and timing), not each problem."""

    budget_s: float | None = 60.0
    compile_timeout_s: float = 60.0
    workers: int | None = None
    max_candidates: int | None = 256
    top_k: int = 4
    screen_reps: int = 5
    final_reps: int = 25
    min_gain: float = 0.02
    confirm_below: float = 1.10         # a winner less than this much faster is timed again on fresh buffers
    reference: str = "float64"          # or "heuristic": check against the heuristic schedule's output
    force: bool = False
    save: bool = True
    seed: int = 0
    vendor: bool = False
    progress: bool | None = None        # None: progress bars when stderr is a terminal


@dataclass
class CandidateResult:
    schedule: Schedule
    status: str
    time_us: float | None               # final median when it reached the final round, else screen median
    detail: str = ""
    checked: bool | None = None


@dataclass
class TuneResult:
    op: str
    key: str
    problem: Any
    device: str
    schedule: Schedule | None
    time_us: float | None
    heuristic: Schedule | None
    heuristic_us: float | None
    source: str                         # "tuned" | "record (user)" | "record (shipped)" | "failed"
    seconds: float = 0.0
    vendor_us: float | None = None
    candidates: list[CandidateResult] = field(default_factory=list)
    record: dict[str, Any] | None = None
    error: str = ""

    @property
    def speedup(self) -> float | None:
        """Heuristic time over tuned time (>= 1 by construction when tuned here)."""
        if self.time_us and self.heuristic_us:
            return self.heuristic_us / self.time_us
        return None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.candidates:
            out[c.status] = out.get(c.status, 0) + 1
        return out


# ---------------------------------------------------------------- records

def from_record(op: ModuleType, problem: Any, backend: Any) -> TuneResult | None:
    """A result from a record measured on this very device (arch and multiprocessor count), if one exists."""
    device = backend.device
    found = store().find(device, op.NAME, problem.key(), op_space(op))
    if found is None:
        return None
    rec, origin = found
    if rec.get("shortlist"):    # benchmark mode timed a few schedules: a tuning run measures them all
        return None
    if rec.get("device") != device_key(device) or rec.get("device_name", device.name) != device.name:
        # Measured on a sibling (same arch; another multiprocessor count, or an H100 for an H200):
        # the record stays usable for calls, but a tuning run measures this device.
        return None
    schedule = Schedule.from_dict(rec["schedule"])
    failure = plan_failure(op, problem, schedule, device)
    if failure is not None:
        log.warning("%s record for %s no longer plans (%s); tuning again", origin, problem.key(), failure)
        return None
    heur = rec.get("heuristic") or {}
    return TuneResult(op.NAME, problem.key(), problem, device_key(device), schedule, rec.get("time_us"),
                      Schedule.from_dict(heur["schedule"]) if "schedule" in heur else None, heur.get("time_us"),
                      f"record ({origin})", record=rec)


# ---------------------------------------------------------------- one problem

def _screen(bench: ProblemBench, cands: list[space.Candidate], opts: TuneOptions, deadline: float | None) -> None:
    """A few timed calls each; a candidate whose first call is 4x slower than the best so far stops there."""
    reps = opts.screen_reps
    best = math.inf
    with bar(total=len(cands), desc="time", unit="cand", enable=opts.progress, leave=False) as pb:
        for c in cands:
            pb.update(1)
            if c.status != space.PENDING:
                continue
            if deadline is not None and time.monotonic() > deadline and not c.is_heuristic:
                c.fail(space.SKIPPED, "not timed: tuning budget spent")
                continue
            loaded = _load(bench, c)
            if loaded is None:
                continue
            try:
                first = bench.time_us(loaded, 1, warmup=1)
                c.screen_us = first[0] if first[0] > 4 * best else median(first + bench.time_us(loaded, reps - 1, 0))
                c.status = space.OK
                best = min(best, c.screen_us)
            except JitopsError as exc:
                c.fail(space.LAUNCH_FAILED, f"{type(exc).__name__}: {exc}")
            finally:
                bench.release(loaded)
            if c.is_heuristic and c.status == space.OK:
                # More calls for short kernels, so a trial is long enough to be steady.
                reps = max(opts.screen_reps, min(4 * opts.screen_reps, int(500 / max(c.screen_us, 1.0))))


def _load(bench: ProblemBench, c: space.Candidate) -> Loaded | None:
    try:
        return bench.load(c.schedule)
    except UnfitSchedule as exc:
        c.fail(space.PRUNED, str(exc))
    except JitopsError as exc:
        status = space.COMPILE_FAILED if type(exc).__name__ == "CompileError" else space.LAUNCH_FAILED
        c.fail(status, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return None


def _final(bench: ProblemBench, finalists: list[space.Candidate], opts: TuneOptions) -> None:
    """Interleaved trials, so a clock or thermal drift touches every finalist alike."""
    loaded: dict[int, Loaded] = {}
    per_trial = 5
    try:
        for i, c in enumerate(finalists):
            lo = _load(bench, c)
            if lo is not None:
                loaded[i] = lo
        for _ in range(max(1, math.ceil(opts.final_reps / per_trial))):
            for i, lo in loaded.items():
                c = finalists[i]
                if c.status != space.OK:
                    continue
                try:
                    c.samples += bench.time_us(lo, per_trial, warmup=1)
                except JitopsError as exc:
                    c.fail(space.LAUNCH_FAILED, f"{type(exc).__name__}: {exc}")
    finally:
        for lo in loaded.values():
            bench.release(lo)


def _check(bench: ProblemBench, c: space.Candidate) -> bool:
    if c.check is not None:
        return bool(c.check["passed"])
    lo = _load(bench, c)
    if lo is None:
        return False
    try:
        c.check = bench.check(lo)
    except JitopsError as exc:
        c.check = {"passed": False, "why": f"{type(exc).__name__}: {exc}"}
    finally:
        bench.release(lo)
    if not c.check["passed"]:
        c.fail(space.WRONG, c.check.get("why", "wrong output"))
        log.info("candidate %s fails the check: %s", c.schedule, c.check.get("why"))
    return bool(c.check["passed"])


def _use_as_reference(bench: ProblemBench, c: space.Candidate) -> None:
    """Check the others against this candidate's output (benchmark mode: the float64 reference of a
    large problem takes seconds on the host); a failing run leaves the float64 reference in place."""
    lo = _load(bench, c)
    if lo is None:
        return
    try:
        bench.use_output_as_reference(lo, str(c.schedule))
    except JitopsError as exc:
        c.fail(space.LAUNCH_FAILED, f"{type(exc).__name__}: {exc}")
    finally:
        bench.release(lo)


def _final_us(c: space.Candidate) -> float:
    return median(c.samples) if c.samples else float("inf")


def tune_candidates(op: ModuleType, problem: Any, cands: list[space.Candidate], backend: Any, opts: TuneOptions,
                    deadline: float | None = None) -> TuneResult:
    """Screen, time, check and choose among compiled candidates (cands[0] is the heuristic)."""
    t0 = time.monotonic()
    device = backend.device
    heur = cands[0]
    result = TuneResult(op.NAME, problem.key(), problem, device_key(device), None, None, heur.schedule, None,
                        "failed")
    bench = ProblemBench(backend, op, problem, seed=opts.seed)
    try:
        _screen(bench, cands, opts, deadline)
        if opts.reference == "heuristic" and heur.status == space.OK:
            _use_as_reference(bench, heur)
        ranked = sorted((c for c in cands if c.status == space.OK), key=lambda c: c.screen_us)
        winner = None
        checked_heuristic = heur.status == space.OK and _check(bench, heur)
        while ranked:
            finalists = ranked[:opts.top_k]
            if checked_heuristic and heur not in finalists:
                finalists.append(heur)
            _final(bench, finalists, opts)
            for c in sorted(finalists, key=_final_us):
                if c.status == space.OK and _final_us(c) < math.inf and _check(bench, c):
                    winner = c
                    break
            if winner is not None:
                break
            ranked = [c for c in ranked if c.status == space.OK and c not in finalists]
        if not checked_heuristic:
            log.warning("%s %s: the heuristic schedule %s failed (%s: %s)", op.NAME, describe(problem),
                        heur.schedule, heur.status, heur.detail)
        if winner is None:
            result.error = "no candidate ran and passed the check"
            log.error("%s %s: %s", op.NAME, describe(problem), result.error)
            return result
        h_us = _final_us(heur) if checked_heuristic else None
        if (h_us is not None and winner is not heur and _final_us(winner) > h_us * (1.0 - opts.min_gain)):
            log.info("%s: best %s (%.2f us) is within %.0f%% of the heuristic (%.2f us): keeping the heuristic",
                     problem.key(), winner.schedule, _final_us(winner), 100 * opts.min_gain, h_us)
            winner = heur
        result.schedule, result.time_us, result.heuristic_us = winner.schedule, _final_us(winner), h_us
        result.source = "tuned"
    finally:
        bench.close()
        result.seconds = time.monotonic() - t0
        result.candidates = [CandidateResult(c.schedule, c.status,
                                             _final_us(c) if c.samples else (c.screen_us if c.screen_us < math.inf
                                                                             else None),
                                             c.detail, None if c.check is None else bool(c.check["passed"]))
                             for c in cands]
    if winner is not heur and result.heuristic_us and result.heuristic_us < result.time_us * opts.confirm_below:
        winner = _confirm(op, problem, backend, result, winner, heur, opts)
    result.record = _record(op, problem, backend, result, winner, heur, cands, opts)
    _log_failures(op, problem, cands)
    return result


def _confirm(op: ModuleType, problem: Any, backend: Any, result: TuneResult, winner: space.Candidate,
             heur: space.Candidate, opts: TuneOptions) -> space.Candidate:
    """A close win timed again against the heuristic, interleaved, on freshly allocated buffers: one
    bench's buffer placement can favour a schedule by a few percent (an fp32 depthwise 3x3 won by 5% in
    the tuner and re-measured 5% slower, H200 2026-11-29), and the heuristic should only lose to a
    schedule that wins twice."""
    try:
        w_us, h_us = remeasure(op, problem, [winner.schedule, heur.schedule], backend, reps=opts.final_reps)
    except JitopsError as exc:
        log.warning("%s %s: the confirmation run failed (%s): keeping the heuristic", op.NAME, describe(problem), exc)
    else:
        if w_us <= h_us * (1.0 - opts.min_gain):
            log.info("%s: %s confirmed (%.2f us against the heuristic's %.2f us on fresh buffers)", problem.key(),
                     winner.schedule, w_us, h_us)
            return winner
        log.info("%s: %s won by %.1f%% but not on fresh buffers (%.2f against %.2f us): keeping the heuristic",
                 problem.key(), winner.schedule, 100 * (result.heuristic_us / result.time_us - 1), w_us, h_us)
    result.schedule, result.time_us = heur.schedule, result.heuristic_us
    return heur


def _record(op: ModuleType, problem: Any, backend: Any, result: TuneResult, winner: space.Candidate,
            heur: space.Candidate, cands: list[space.Candidate], opts: TuneOptions) -> dict[str, Any]:
    others = sorted((c for c in cands if c is not winner and c.status == space.OK),
                    key=lambda c: (_final_us(c), c.screen_us))
    runners = [{"schedule": c.schedule.as_dict(), "time_us": round(_final_us(c) if c.samples else c.screen_us, 3),
                "checked": c.check is not None and bool(c.check["passed"])} for c in others[:4]]
    counts: dict[str, int] = {}
    for c in cands:
        counts[c.status] = counts.get(c.status, 0) + 1
    warm = timed_warm(op, problem, backend.device)
    rec = new_record(backend.device, op.NAME, problem.key(), winner.schedule, space=op_space(op),
                     time_us=round(result.time_us or 0.0, 3),
                     heuristic={"schedule": heur.schedule.as_dict(),
                                "time_us": None if result.heuristic_us is None else round(result.heuristic_us, 3),
                                "check_passed": heur.check is not None and bool(heur.check["passed"])},
                     runners_up=runners, check=winner.check, compiler=backend.compiler_id(),
                     timing={"method": TIMING_WARM if warm else TIMING_METHOD, "final_reps": len(winner.samples),
                             "l2_flush_bytes": flush_size(op, problem, backend)},
                     candidates=counts, tuning_seconds=round(result.seconds, 2))
    return rec


def _log_failures(op: ModuleType, problem: Any, cands: list[space.Candidate]) -> None:
    failed = [c for c in cands if c.status in space.FAILED_STATES]
    if not failed:
        return
    kinds: dict[str, int] = {}
    for c in failed:
        kinds[c.status] = kinds.get(c.status, 0) + 1
        log.info("  %s %s: %s", c.status, c.schedule, (c.detail or "").splitlines()[0] if c.detail else "")
    log.warning("%s %s: %d of %d candidates failed (%s); they count as infinitely slow (details with -v)",
                op.NAME, describe(problem), len(failed), len(cands),
                ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))


# ---------------------------------------------------------------- many problems

def tune_problems(items: Iterable[tuple[ModuleType, Any]], backend: Any = None,
                  options: TuneOptions | None = None) -> list[TuneResult]:
    """Tune each (op module, problem); one shared compile phase; records written at the end."""
    opts = options or TuneOptions()
    items = list(items)
    backend = backend or current_backend()
    backend.require_device("tune schedules")
    t0 = time.monotonic()
    deadline = t0 + opts.budget_s if opts.budget_s else None
    results: dict[int, TuneResult] = {}
    spaces: dict[int, list[space.Candidate]] = {}
    for i, (op, problem) in enumerate(items):
        if not opts.force:
            hit = from_record(op, problem, backend)
            if hit is not None:
                results[i] = hit
                continue
        spaces[i] = space.build(op, problem, backend, opts.max_candidates)
    if spaces:
        compile_deadline = t0 + 0.6 * opts.budget_s if opts.budget_s else None
        outcomes = compile_missing(space.ordered_jobs(list(spaces.values())), backend, opts.workers,
                                   opts.compile_timeout_s, compile_deadline, opts.progress)
        for cands in spaces.values():
            space.apply_compile_outcomes(cands, outcomes, backend.device)
    order = list(spaces)
    with bar(total=len(order), desc="tune", unit="problem", enable=opts.progress and len(order) > 1) as pb:
        for n, i in enumerate(order):
            op, problem = items[i]
            share = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 and n > 0:     # the first problem always gets its heuristic measured
                    results[i] = _skipped(op, problem, backend, spaces[i])
                    pb.update(1)
                    continue
                share = time.monotonic() + left / (len(order) - n)
            try:
                results[i] = r = tune_candidates(op, problem, spaces[i], backend, opts, share)
            except Exception as exc:   # the op's reference or inputs, a sticky device error: this problem only
                log.error("%s %s: tuning failed: %s: %s", op.NAME, describe(problem), type(exc).__name__, exc)
                results[i] = r = TuneResult(op.NAME, problem.key(), problem, device_key(backend.device), None, None,
                                            spaces[i][0].schedule, None, "failed",
                                            error=f"{type(exc).__name__}: {exc}"[:300])
            log.info("%s %s: %s %s us (heuristic %s us) in %.1f s", op.NAME, describe(problem), r.schedule,
                     _fmt(r.time_us), _fmt(r.heuristic_us), r.seconds)
            if opts.save and r.record:
                store().put([r.record])     # at once: an interrupted run keeps what it measured
            pb.update(1)
    if opts.save and any(r.source == "tuned" for r in results.values()):
        engine.clear_prepared()   # calls prepared before now re-select their schedule
    if opts.vendor:
        from .vendor import vendor_us
        for i, (op, problem) in enumerate(items):
            results[i].vendor_us = vendor_us(op.NAME, problem, backend)
    return [results[i] for i in range(len(items))]


def _skipped(op: ModuleType, problem: Any, backend: Any, cands: list[space.Candidate]) -> TuneResult:
    log.warning("%s %s: not tuned, the budget was spent before it (the heuristic stays)", op.NAME,
                describe(problem))
    return TuneResult(op.NAME, problem.key(), problem, device_key(backend.device), None, None, cands[0].schedule,
                      None, "skipped", error="tuning budget spent before this problem")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
