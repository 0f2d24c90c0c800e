"""Pictures and tables of a `jitops bench` report: per op, jitops against the vendor per problem.

People would rather look than read: `jitops bench --plot FILE.png` (or `--from REPORT.json` to draw
an earlier run) draws, per op, the speed ratio (vendor time / jitops time, > 1: jitops faster) and
the achieved fraction of the device's copy bandwidth (memory-bound rows) or its TFLOP/s (matrix
rows). `markdown(report)` gives the same as tables for docs/performance.md. matplotlib is an
optional extra (`pip install jitops[plot]`).
"""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from ..errors import JitopsError


def load(path: str | Path) -> dict[str, Any]:
    """A report written by `jitops bench --json` (plain or .gz)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        report = json.load(f)
    if "rows" not in report:
        raise JitopsError(f"{path} is not a jitops bench report (no 'rows')")
    return report


def best_rows(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per op, one row per problem: the scheduler's pick ("heuristic") where the report has it,
    else the fastest variant timed."""
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in report["rows"]:
        key = (r["op"], r["problem"])
        old = chosen.get(key)
        if old is None or (r["variant"] == "heuristic" and old["variant"] != "heuristic") or \
                (old["variant"] != "heuristic" and _time(r) < _time(old)):
            chosen[key] = r
    per_op: dict[str, list[dict[str, Any]]] = {}
    for (op, _), r in chosen.items():
        per_op.setdefault(op, []).append(r)
    return per_op


def _time(row: dict[str, Any]) -> float:
    t = row.get("jitops_graph_us") or row.get("jitops_us")
    return t if t else math.inf


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def markdown(report: dict[str, Any]) -> str:
    """Per-op tables (problem, schedule verbatim, jitops us, vendor us, ratio, % copy, TFLOP/s) with
    the environment line and each op's geometric mean and worst ratio."""
    env = report.get("environment", {})
    out = [f"Device: {env.get('device', '?')} ({env.get('arch', '?')}), jitops {env.get('jitops', '?')}, "
           f"torch {env.get('torch', '-')}, cuDNN {env.get('cudnn', '-')}, date {env.get('date', '?')}; "
           f"times in us, graph replay where both sides capture; ratio = vendor / jitops."]
    for op, rows in best_rows(report).items():
        ratios = [r["ratio"] for r in rows if r.get("ratio")]
        gm = geomean(ratios)
        summary = f" — geomean {gm:.2f}x, worst {min(ratios):.2f}x" if gm else ""
        out += ["", f"### {op}{summary}", "",
                "| problem | jitops us | vendor us | ratio | % copy | TFLOP/s | schedule |", "|---|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            vt = r.get("vendor_graph_us") or r.get("vendor_us")
            out.append(f"| {r['problem']} | {_fmt(_time(r), '.2f')} | {_fmt(vt, '.2f')} | {_fmt(r.get('ratio'), '.2f')} | "
                       f"{_fmt(r.get('pct_copy'), '.1f')} | {_fmt(r.get('tflops'), '.1f')} | `{r.get('schedule', '')}` |")
    return "\n".join(out)


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """Draw the report to `path` (PNG/SVG/PDF by suffix): per op a row of two panels."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise JitopsError("jitops bench --plot needs matplotlib (pip install 'jitops[plot]')") from exc
    per_op = best_rows(report)
    if not per_op:
        raise JitopsError("the report has no rows to draw")
    height = sum(max(1.5, 0.32 * len(rows) + 0.8) for rows in per_op.values())
    fig, axes = plt.subplots(len(per_op), 2, figsize=(13, height), squeeze=False,
                             gridspec_kw={"height_ratios": [max(1.5, 0.32 * len(r)) for r in per_op.values()]})
    for (op, rows), (ax_r, ax_e) in zip(per_op.items(), axes):
        names = [r["problem"] for r in rows]
        y = list(range(len(rows)))
        ratios = [r.get("ratio") or 0.0 for r in rows]
        ax_r.barh(y, ratios, color=["tab:green" if v >= 1 else "tab:red" for v in ratios])
        ax_r.axvline(1.0, color="black", lw=0.8)
        ax_r.set_yticks(y, names, fontsize=7)
        ax_r.invert_yaxis()
        gm = geomean(ratios)
        ax_r.set_title(f"{op}: vendor / jitops time" + (f" (geomean {gm:.2f}x)" if gm else ""), fontsize=9)
        pct = [r.get("pct_copy") for r in rows]
        if any(v is not None for v in pct):
            ax_e.barh(y, [v or 0.0 for v in pct], color="tab:blue")
            ax_e.set_xlim(0, max(100.0, 1.05 * max(v or 0.0 for v in pct)))   # > 100: served from L2
            ax_e.set_title(f"{op}: % of device copy bandwidth", fontsize=9)
        else:
            ax_e.barh(y, [r.get("tflops") or 0.0 for r in rows], color="tab:purple")
            ax_e.set_title(f"{op}: TFLOP/s", fontsize=9)
        ax_e.set_yticks(y, [""] * len(y))
        ax_e.invert_yaxis()
    env = report.get("environment", {})
    fig.suptitle(f"jitops {env.get('jitops', '')} on {env.get('device', '?')}, {env.get('date', '')}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
