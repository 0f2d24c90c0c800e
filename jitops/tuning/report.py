"""Text tables for tuning results: the model summary and the dry-run listing."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from .tuner import TuneResult


def _us(v: float | None) -> str:
    return "-" if v is None else (f"{v:.1f}" if v >= 100 else f"{v:.2f}")


def describe(problem: Any) -> str:
    """The problem's own description where it has one, else its key."""
    d = getattr(problem, "describe", None)
    return d() if callable(d) else problem.key()


def short_problem(problem: Any, width: int = 52) -> str:
    d = getattr(problem, "describe", None)
    text = describe(problem) if callable(d) else problem.key().split(":", 1)[-1]
    return text if len(text) <= width else text[:width - 1] + "~"


def geomean(values: Iterable[float]) -> float | None:
    vs = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vs) / len(vs)) if vs else None


def summary_table(results: Sequence[TuneResult], counts: Sequence[int] | None = None) -> str:
    """problem | heuristic us | tuned us | speedup | vendor us | schedule | source."""
    head = (f"{'#':>3} {'op':<11} {'problem':<52} {'n':>2} {'heur us':>9} {'tuned us':>9} {'speedup':>7} "
            f"{'vendor us':>9}  schedule [from]")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(results):
        n = counts[i] if counts else 1
        sp = r.speedup
        sched = str(r.schedule) if r.schedule is not None else f"{r.source.upper()}: {r.error}"
        lines.append(f"{i + 1:>3} {r.op:<11} {short_problem(r.problem):<52} {n:>2} {_us(r.heuristic_us):>9} "
                     f"{_us(r.time_us):>9} {('%.2fx' % sp) if sp else '-':>7} {_us(r.vendor_us):>9}  "
                     f"{sched} [{r.source}]")
    return "\n".join(lines)


def summary_footer(results: Sequence[TuneResult], seconds: float) -> str:
    tuned = [r for r in results if r.source == "tuned"]
    reused = [r for r in results if r.source.startswith("record")]
    failed = [r for r in results if r.source == "failed"]
    skipped = [r for r in results if r.source == "skipped"]
    g_all = geomean(r.speedup for r in results if r.speedup)
    slower = [r for r in results if r.speedup is not None and r.speedup < 1.0]
    vend = geomean(r.vendor_us / r.time_us for r in results if r.vendor_us and r.time_us)
    parts = [f"{len(results)} problems: {len(tuned)} tuned now, {len(reused)} from records, {len(failed)} failed"
             + (f", {len(skipped)} skipped (budget)" if skipped else "") + f"; {seconds:.1f} s"]
    if g_all:
        parts.append(f"geometric-mean speedup over the heuristic: {g_all:.3f}x "
                     f"({len(slower)} problem(s) slower than the heuristic)")
    if vend:
        parts.append(f"geometric-mean vendor time / tuned time: {vend:.3f} (above 1: jitops faster)")
    return "\n".join(parts)


def dry_run_table(rows: Sequence[tuple[str, Any, int, str, str]]) -> str:
    """rows: (op, problem, count, schedule, origin)."""
    head = f"{'#':>3} {'op':<11} {'problem':<52} {'n':>2}  schedule [from]"
    lines = [head, "-" * len(head)]
    for i, (op, problem, n, sched, origin) in enumerate(rows):
        lines.append(f"{i + 1:>3} {op:<11} {short_problem(problem):<52} {n:>2}  {sched} [{origin}]")
    return "\n".join(lines)
