"""`jitops tune` and `jitops records`: the command-line side of the tuner (registered by jitops/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import JitopsError

DEFAULT_MODEL_BUDGET = 150.0
DEFAULT_OP_BUDGET = 60.0


def add_subcommands(sub: Any) -> None:
    s = sub.add_parser(
        "tune", help="tune the schedules of an ONNX model's problems (or of one op problem) on this device",
        description="Examples:  jitops tune model.onnx --input-shape image=8x3x128x128   |   "
                    "jitops tune model.onnx --dry-run --target sm_90   |   jitops tune leaky_relu x=16777216")
    s.add_argument("target_", metavar="MODEL.onnx|OP", help="an ONNX model, or an op name followed by key=value")
    s.add_argument("problem", nargs="*", help="with an op: the problem as key=value (shapes AxBxC)")
    s.add_argument("--input-shape", action="append", default=[], metavar="NAME=AxBxC",
                   help="size of a model input's dynamic dimensions (repeatable)")
    s.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help=f"time for compiling and timing, all problems together (default {DEFAULT_MODEL_BUDGET:.0f} "
                        f"for a model, {DEFAULT_OP_BUDGET:.0f} for one problem; 0: no limit)")
    s.add_argument("--dry-run", action="store_true", help="list the problems and their current schedules; no device")
    s.add_argument("--target", help="with --dry-run: an arch to list schedules for (sm_90, gfx90a, ...)")
    s.add_argument("--force", action="store_true", help="measure again even where a record for this device exists")
    s.add_argument("--no-save", action="store_true", help="do not write the winners to the user records")
    s.add_argument("--max-candidates", type=int, default=256, help="candidates per problem (default 256)")
    s.add_argument("--workers", type=int, default=None, help="compile processes (default: one per core, max 16)")
    s.add_argument("--compile-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="per-candidate compile limit (default 60)")
    s.add_argument("--no-vendor", action="store_true", help="do not time the vendor (torch) op for comparison")
    s.add_argument("--json", metavar="PATH", help="write the results to this file")
    s.set_defaults(func=cmd_tune)

    r = sub.add_parser("records", help="tuning records: list, export, merge, clear")
    rs = r.add_subparsers(dest="action", required=True)
    lst = rs.add_parser("list", help="list user and shipped records")
    lst.add_argument("--source", choices=("user", "shipped", "all"), default="all")
    _filters(lst)
    ex = rs.add_parser("export", help="write user records (e.g. to share, or as schedules/<arch>.json)")
    ex.add_argument("path")
    _filters(ex)
    mg = rs.add_parser("merge", help="merge record files into the user records")
    mg.add_argument("paths", nargs="+")
    mg.add_argument("--prefer", choices=("faster", "incoming", "existing"), default="faster",
                    help="on a conflict keep the faster measurement (default), the incoming or the existing one")
    cl = rs.add_parser("clear", help="remove user records (all, or those matching the filters)")
    _filters(cl)
    r.set_defaults(func=cmd_records)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", help="only this op")
    p.add_argument("--arch", help="only this arch (sm_90, gfx90a, cpu-w32, ...)")


# ---------------------------------------------------------------- tune

def _options(args: argparse.Namespace, default_budget: float) -> Any:
    from .tuner import TuneOptions
    budget = default_budget if args.budget is None else args.budget
    return TuneOptions(budget_s=budget or None, force=args.force, save=not args.no_save,
                       max_candidates=args.max_candidates or None, workers=args.workers,
                       compile_timeout_s=args.compile_timeout, vendor=not args.no_vendor)


def cmd_tune(args: argparse.Namespace) -> int:
    target = args.target_
    if target.endswith(".onnx") or Path(target).is_file():
        return _tune_model(args)
    if args.input_shape:
        raise JitopsError("--input-shape is for ONNX models")
    return _tune_op(args)


def _tune_op(args: argparse.Namespace) -> int:
    from ..cli import _parse_kv
    from ..ops import get_op
    from .report import summary_footer, summary_table
    from .tuner import tune_problems
    op = get_op(args.target_)
    problem = op.parse_problem(_parse_kv(args.problem))
    if args.dry_run:
        return _print_dry_run([(op.NAME, problem, 1)], [], args.target, 0)
    t0 = time.monotonic()
    results = tune_problems([(op, problem)], options=_options(args, DEFAULT_OP_BUDGET))
    print(summary_table(results))
    print(summary_footer(results, time.monotonic() - t0))
    _write_json(args.json, results, [1])
    return 0 if all(r.source != "failed" for r in results) else 1


def _tune_model(args: argparse.Namespace) -> int:
    from .model import collect, parse_input_shapes, tune_model
    from .report import summary_footer, summary_table
    shapes = parse_input_shapes(args.input_shape)
    if args.dry_run:
        problems, skipped = collect(args.target_, shapes)
        return _print_dry_run([(p.op, p.problem, p.count) for p in problems], skipped, args.target,
                              sum(len(p.nodes) for p in problems))
    report = tune_model(args.target_, shapes, _options(args, DEFAULT_MODEL_BUDGET))
    counts = [p.count for p in report.problems]
    print(f"{args.target_}: {_uses(len(report.problems), sum(counts), sum(len(p.nodes) for p in report.problems))}")
    _print_skipped(report.skipped)
    if report.results:
        print(summary_table(report.results, counts))
    print(summary_footer(report.results, report.seconds))
    _write_json(args.json, report.results, counts)
    return 0 if all(r.source != "failed" for r in report.results) else 1


def _print_skipped(skipped: Sequence[Any]) -> None:
    for s in skipped:
        print(f"  stays ONNX: {s.onnx_ops} ({', '.join(s.nodes[:3])}{'...' if len(s.nodes) > 3 else ''}): {s.reason}")


def _uses(unique: int, uses: int, nodes: int) -> str:
    return f"{unique} unique problems, {uses} uses" + (f" ({nodes} ONNX nodes)" if nodes else "")


def _print_dry_run(rows: Sequence[tuple[str, Any, int]], skipped: Sequence[Any], target: str | None,
                   nodes: int) -> int:
    from ..device import KNOWN_TARGETS
    from ..engine import select_schedule
    from ..ops import get_op
    from ..runtime import get_backend
    from .report import dry_run_table
    if target:
        if target not in KNOWN_TARGETS:
            raise JitopsError(f"--target: unknown arch '{target}' (known: {', '.join(sorted(KNOWN_TARGETS))})")
        device = KNOWN_TARGETS[target]
    else:
        device = get_backend().device
    print(f"device: {device.name} ({device.arch}); {_uses(len(rows), sum(r[2] for r in rows), nodes)}")
    _print_skipped(skipped)
    table = []
    for op_name, problem, n in rows:
        sched, origin = select_schedule(get_op(op_name), problem, device)
        table.append((op_name, problem, n, str(sched), origin))
    print(dry_run_table(table))
    return 0


def _write_json(path: str | None, results: Sequence[Any], counts: Sequence[int]) -> None:
    if not path:
        return
    rows = [{"op": r.op, "problem": r.key, "nodes": n, "source": r.source,
             "schedule": r.schedule.as_dict() if r.schedule else None, "time_us": r.time_us,
             "heuristic": r.heuristic.as_dict() if r.heuristic else None, "heuristic_us": r.heuristic_us,
             "speedup": r.speedup, "vendor_us": r.vendor_us, "seconds": r.seconds, "candidates": r.counts(),
             "error": r.error} for r, n in zip(results, counts)]
    Path(path).write_text(json.dumps(rows, indent=1) + "\n")


# ---------------------------------------------------------------- records

def _match(args: argparse.Namespace) -> Any:
    def ok(r: dict[str, Any]) -> bool:
        return (not args.op or r["op"] == args.op) and (not args.arch or r["arch"] == args.arch)
    return ok


def cmd_records(args: argparse.Namespace) -> int:
    from ..records import export_records, store, user_records_path
    st = store()
    match = _match(args) if args.action != "merge" else None
    if args.action == "list":
        rows: list[tuple[str, dict[str, Any]]] = []
        if args.source in ("user", "all"):
            rows += [("user", r) for r in st.user_records() if match(r)]
        if args.source in ("shipped", "all"):
            rows += [("shipped", r) for r in st.shipped_records() if match(r)]
        _print_records(rows)
        return 0
    if args.action == "export":
        n = export_records(Path(args.path), [r for r in st.user_records() if match(r)])
        print(f"wrote {n} records to {args.path}")
        return 0
    if args.action == "merge":
        try:
            report = st.merge([Path(p) for p in args.paths], prefer=args.prefer)
        except ValueError as exc:
            raise JitopsError(str(exc)) from exc
        print(f"merged into {user_records_path()}: {report}")
        return 0
    filtered = bool(args.op or args.arch)
    n = st.remove(match if filtered else None)
    from .. import engine
    engine.clear_prepared()
    print(f"removed {n} records from {user_records_path()}")
    return 0


def _print_records(rows: Sequence[tuple[str, dict[str, Any]]]) -> None:
    if not rows:
        print("no tuning records")
        return
    head = f"{'from':<8} {'device':<16} {'op':<11} {'problem':<48} {'time us':>9} {'speedup':>7}  schedule"
    print(head)
    print("-" * len(head))
    for source, r in sorted(rows, key=lambda x: (x[0], x[1]["arch"], x[1]["op"], x[1]["problem"])):
        prob = r["problem"].split(":", 1)[-1]
        prob = prob if len(prob) <= 48 else prob[:47] + "~"
        t = r.get("time_us")
        h = (r.get("heuristic") or {}).get("time_us")
        sp = f"{h / t:.2f}x" if isinstance(t, (int, float)) and isinstance(h, (int, float)) and t > 0 else "-"
        s = r["schedule"]
        sched = f"{s['algorithm']}({', '.join(f'{k}={v}' for k, v in sorted(s.get('params', {}).items()))})"
        print(f"{source:<8} {r.get('device', r['arch']):<16} {r['op']:<11} {prob:<48} "
              f"{(f'{t:.2f}' if isinstance(t, (int, float)) else '-'):>9} {sp:>7}  {sched}")
    print(f"{len(rows)} records", file=sys.stderr)
