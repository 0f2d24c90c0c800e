"""The candidates of one problem: the op's schedule space, pruned to what this device can run.

Pruning happens in three places, each as early as the information exists:
  before compiling  plan() refuses the schedule, or a launch asks for more threads, shared memory
                    or grid than the device has (DeviceInfo);
  after compiling   the compiler's resource report (ptxas -v: registers x threads over the
                    register file) says it cannot launch;
  after loading     the loaded kernel's own limits (max threads for its register use, static +
                    dynamic shared memory) -- see measure.load().
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Sequence

from ..cache import loader
from ..device import DeviceInfo
from ..engine import kernel_source
from ..ops.base import Launch, Plan, Schedule
from .compile_pool import CompileJob, CompileOutcome

log = logging.getLogger("jitops.tune")

# Candidate states, in the order a candidate moves through them.
PENDING, OK = "pending", "ok"
PRUNED, RENDER_FAILED, COMPILE_FAILED, TIMEOUT, SKIPPED = "pruned", "render_failed", "compile_failed", "timeout", \
    "skipped"
LAUNCH_FAILED, WRONG = "launch_failed", "wrong"
FAILED_STATES = (RENDER_FAILED, COMPILE_FAILED, TIMEOUT, LAUNCH_FAILED, WRONG)


@dataclass
class Candidate:
    schedule: Schedule
    is_heuristic: bool = False
    plan: Plan | None = None
    jobs: list[CompileJob] = field(default_factory=list)
    status: str = PENDING
    detail: str = ""
    screen_us: float = float("inf")
    samples: list[float] = field(default_factory=list)
    check: dict[str, Any] | None = None

    @property
    def launches(self) -> tuple[Launch, ...]:
        return (*self.plan.prepare, *self.plan.launches) if self.plan else ()

    def fail(self, status: str, detail: str) -> None:
        self.status, self.detail = status, detail
        self.screen_us = float("inf")


def _static_problem(launch: Launch, device: DeviceInfo) -> str:
    """Why a launch cannot run on this device, or ''."""
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if threads > device.max_threads_per_block:
        return f"{threads} threads per block > {device.max_threads_per_block}"
    if min(launch.block) < 1:
        return f"empty block {launch.block}"
    if launch.shared_bytes > device.shared_per_block_optin:
        return f"{launch.shared_bytes} bytes of shared memory > {device.shared_per_block_optin}"
    if launch.grid[0] > 2**31 - 1 or launch.grid[1] > 65535 or launch.grid[2] > 65535:
        return f"grid {launch.grid} beyond the device's limits"
    return ""


def _spread(items: list[Schedule]) -> list[Schedule]:
    """Reorder so that every prefix spans the list: 0, n/2, n/4, 3n/4, ..."""
    n, order, seen, step = len(items), [], set(), len(items)
    while len(order) < n:
        for i in range(0, n, max(step, 1)):
            if i not in seen:
                seen.add(i)
                order.append(i)
        step //= 2
    return [items[i] for i in order]


def thin(schedules: list[Schedule], limit: int) -> list[Schedule]:
    """At most `limit` schedules, round-robin across algorithms, each spread over its parameter range."""
    if limit <= 0 or len(schedules) <= limit:
        return schedules
    groups: OrderedDict[str, list[Schedule]] = OrderedDict()
    for s in schedules:
        groups.setdefault(s.algorithm, []).append(s)
    queues = [_spread(items) for items in groups.values()]
    out: list[Schedule] = []
    for i in range(max(len(q) for q in queues)):
        out += [q[i] for q in queues if i < len(q)]
    return out[:limit]


def build(op: ModuleType, problem: Any, backend: Any, max_candidates: int | None = None) -> list[Candidate]:
    """Candidates (heuristic first), each with its plan and compile jobs, or a reason it was pruned."""
    heuristic = op.heuristic(problem, backend.device)
    schedules = [s for s in op.candidates(problem, backend.device) if s != heuristic]
    if max_candidates:
        schedules = thin(schedules, max_candidates - 1)
    return from_schedules(op, problem, backend, [heuristic, *schedules])


def from_schedules(op: ModuleType, problem: Any, backend: Any, schedules: Sequence[Schedule]) -> list[Candidate]:
    """These schedules as candidates (the first one counts as the heuristic's), planned, with their
    compile jobs."""
    device = backend.device
    seen: set[Schedule] = set()
    out: list[Candidate] = []
    for i, s in enumerate(schedules):
        if s in seen:
            continue
        seen.add(s)
        cand = Candidate(s, is_heuristic=(i == 0))
        out.append(cand)
        try:
            cand.plan = op.plan(problem, s, device)
        except Exception as exc:   # ScheduleError, or a schedule the op cannot plan at all
            cand.fail(PRUNED, f"plan: {exc}")
            continue
        reasons = [r for r in (_static_problem(l, device) for l in cand.launches) if r]
        if reasons:
            cand.fail(PRUNED, reasons[0])
            continue
        try:
            for launch in cand.launches:
                source = kernel_source(device, launch)
                key = loader().key_for(backend, source, [launch.kernel])
                cand.jobs.append(CompileJob(key, source, (launch.kernel,), f"{op.NAME}.{launch.kernel}"))
        except Exception as exc:   # a template that does not render for these parameters
            cand.fail(RENDER_FAILED, f"render: {type(exc).__name__}: {exc}")
    return out


def apply_compile_outcomes(cands: list[Candidate], outcomes: dict[str, CompileOutcome], device: DeviceInfo) -> None:
    """Mark candidates whose sources failed or timed out, and prune on the compiler's resource report."""
    for c in cands:
        if c.status != PENDING:
            continue
        for job, launch in zip(c.jobs, c.launches):
            out = outcomes.get(job.key)
            if out is None:
                continue   # already in the binary cache: nothing was compiled
            if out.status == "timeout":
                c.fail(TIMEOUT, out.error)
                break
            if out.status == "skipped":
                if not c.is_heuristic:     # the heuristic is compiled on load, as a first call would
                    c.fail(SKIPPED, out.error)
                break
            if not out.ok:
                c.fail(COMPILE_FAILED, out.error)
                break
            res = out.resources.get(launch.kernel, {})
            threads = launch.block[0] * launch.block[1] * launch.block[2]
            regs = res.get("registers", 0)
            if regs and regs * threads > device.registers_per_multiprocessor:
                c.fail(PRUNED, f"{launch.kernel}: {regs} registers x {threads} threads > "
                               f"{device.registers_per_multiprocessor} in the register file")
                break
            smem = res.get("smem", 0) + launch.shared_bytes
            if smem > device.shared_per_block_optin:
                c.fail(PRUNED, f"{launch.kernel}: {smem} bytes of shared memory > {device.shared_per_block_optin}")
                break
            if res.get("spill_bytes"):
                c.detail = f"{launch.kernel} spills {res['spill_bytes']} bytes"


def ordered_jobs(spaces: Sequence[list[Candidate]]) -> list[CompileJob]:
    """Unique jobs: every heuristic first, then candidates round-robin across problems."""
    seen: set[str] = set()
    out: list[CompileJob] = []

    def add(c: Candidate) -> None:
        for j in c.jobs:
            if j.key not in seen:
                seen.add(j.key)
                out.append(j)

    for cands in spaces:
        if cands and cands[0].status == PENDING:
            add(cands[0])
    rest = [[c for c in cands[1:] if c.status == PENDING] for cands in spaces]
    for i in range(max((len(r) for r in rest), default=0)):
        for r in rest:
            if i < len(r):
                add(r[i])
    return out
