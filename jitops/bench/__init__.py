"""`jitops bench`: ops x problems against the vendor op, in the same run, on the same device.

Each op has a module here (bench/<op>.py) whose `cases(ctx)` yields Cases; every case is
checked against a float64 reference before it is timed. Ratios are vendor time / jitops time
(above 1: jitops is faster), taken from CUDA-graph replay when both sides can be captured, else
from back-to-back eager calls.
"""
from __future__ import annotations

import importlib
import json
import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .._version import __version__
from . import latency
from .timing import Timer, copy_bandwidth_gbs

log = logging.getLogger("jitops.bench")


def bench_ops() -> list[str]:
    """Ops with a benchmark, in the registry's order (derived from jitops.ops: each op's
    REGISTRATION.bench, by default bench/<op>.py), so a new op's benchmark is never left out."""
    from ..ops import bench_ops as registered
    return registered()


def _bench_module(op: str) -> str:
    from ..ops import bench_module
    name = bench_module(op)
    if name is None:
        raise ValueError(f"{op} declares no bench module (REGISTRATION.bench is None)")
    return name


@dataclass
class Context:
    torch: Any            # torch module with a GPU, or None (CPU emulator with numpy arrays)
    timer: Timer
    quick: bool
    rng: np.random.Generator
    algorithms: str = "all"   # "all": every applicable algorithm; "heuristic": the scheduler's pick only

    @property
    def on_gpu(self) -> bool:
        return self.torch is not None


@dataclass
class Case:
    op: str
    problem: str
    variant: str                       # "heuristic" or a forced algorithm
    jitops: Callable[[], Any]
    check: Callable[[], float]         # runs once, returns the error; raises AssertionError when wrong
    vendor: Callable[[], Any] | None = None
    vendor_name: str = ""
    bytes: int = 0
    flops: int = 0
    schedule: Callable[[], str] | None = None
    repeats: int = 0                   # calls per timing trial; 0: the default (50, quick 20). Slow cases set fewer


@dataclass
class Row:
    op: str
    problem: str
    variant: str
    schedule: str
    error: float
    jitops_us: float
    jitops_graph_us: float | None
    vendor: str
    vendor_us: float | None
    vendor_graph_us: float | None
    ratio: float | None = None          # vendor / jitops (> 1: jitops faster)
    gbs: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    notes: list[str] = field(default_factory=list)


def run_case(case: Case, ctx: Context, copy_gbs: float | None) -> Row:
    error = case.check()
    t = ctx.timer
    n = case.repeats or (20 if ctx.quick else 50)
    j = t.per_call_us(case.jitops, n=n)
    jg = t.graph_us(case.jitops, n=n)
    v = vg = None
    if case.vendor is not None:
        v = t.per_call_us(case.vendor, n=n)
        vg = t.graph_us(case.vendor, n=n)
    row = Row(case.op, case.problem, case.variant, case.schedule() if case.schedule else "", error, j, jg,
              case.vendor_name, v, vg)
    # Compare like with like: graph replay on both sides when both can be captured.
    both_graphs = jg is not None and (vg is not None or case.vendor is None)
    jt, vt = (jg, vg) if both_graphs else (j, v)
    if vt is not None and jt:
        row.ratio = vt / jt
    if case.bytes and jt:
        row.gbs = case.bytes / (jt * 1e-6) / 1e9
        if copy_gbs:
            row.pct_copy = 100.0 * row.gbs / copy_gbs
    if case.flops and jt:
        row.tflops = case.flops / (jt * 1e-6) / 1e12
    return row


def environment(ctx: Context, copy_gbs: float | None) -> dict[str, Any]:
    from ..runtime import get_backend
    be = get_backend()
    env = {"jitops": __version__, "backend": be.name, "device": be.device.name, "arch": be.device.arch,
           "compiler": be.compiler_id(), "date": time.strftime("%Y-%m-%d"), "host": platform.node(),
           "copy_gbs": copy_gbs}
    if be.can_launch_programmatic():
        from .. import config     # graph timings of back-to-back calls overlap launches in "auto" and "on"
        env["programmatic_launch"] = config.programmatic_launch_mode()
    if ctx.torch is not None:
        env["torch"] = ctx.torch.__version__
        env["cudnn"] = ctx.torch.backends.cudnn.version()
    return env


def format_table(rows: Iterable[Row]) -> str:
    head = f"{'op':<11} {'problem':<24} {'variant':<12} {'jitops us':>10} {'graph us':>9} {'vendor us':>10} " \
           f"{'graph us':>9} {'ratio':>6} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>7}  schedule"
    lines = [head, "-" * len(head)]

    def f(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for r in rows:
        lines.append(f"{r.op:<11} {r.problem:<24} {r.variant:<12} {f(r.jitops_us, '10.2f')} "
                     f"{f(r.jitops_graph_us, '9.2f')} {f(r.vendor_us, '10.2f')} {f(r.vendor_graph_us, '9.2f')} "
                     f"{f(r.ratio, '6.2f')} {f(r.gbs, '7.0f')} {f(r.pct_copy, '6.1f')} {f(r.tflops, '7.2f')}  "
                     f"{r.schedule}")
    return "\n".join(lines)


def make_context(quick: bool, algorithms: str = "all") -> Context:
    torch = None
    try:
        import torch as _torch
        if _torch.cuda.is_available():
            torch = _torch
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    except ImportError:
        pass
    return Context(torch, Timer(torch), quick, np.random.default_rng(0), algorithms)


def run(ops: Iterable[str] | None = None, quick: bool = False, json_path: str | None = None,
        algorithms: str = "all", echo: Callable[[str], None] = print) -> dict[str, Any]:
    ctx = make_context(quick, algorithms)
    copy_gbs = copy_bandwidth_gbs(ctx.timer) if ctx.on_gpu else None
    env = environment(ctx, copy_gbs)
    echo(f"jitops {env['jitops']} bench on {env['device']} ({env['arch']}, {env['backend']}); "
         f"device copy {copy_gbs:.0f} GB/s"
         + (f"; programmatic launch {env['programmatic_launch']}" if "programmatic_launch" in env else "") if copy_gbs else
         f"jitops {env['jitops']} bench on {env['device']} ({env['backend']}): correctness and emulator timings only")
    rows: list[Row] = []
    extras: dict[str, Any] = {}
    latency_rows: list[dict[str, Any]] = []
    for op in ops or bench_ops():
        module = importlib.import_module(_bench_module(op))
        for case in module.cases(ctx):
            try:
                row = run_case(case, ctx, copy_gbs)
            except AssertionError as exc:
                echo(f"FAILED CHECK {case.op} {case.problem} {case.variant}: {exc}")
                raise
            rows.append(row)
            echo(format_table([row]).splitlines()[-1])
        if hasattr(module, "extras"):
            extras[op] = module.extras(ctx)
        if (lat := latency.op_latency(op, module, ctx)) is not None:    # every op: one small problem
            latency_rows.append(lat)
            echo(f"{op} latency {lat['problem']}: sync {lat['sync_us']}, eager {lat['eager_us']}")
    echo("")
    echo(format_table(rows))
    report = {"environment": env, "rows": [asdict(r) for r in rows], "extras": extras, "latency": latency_rows,
              "latency_note": latency.NOTE}
    if latency_rows:
        echo(latency.markdown(report))
    for op, extra in extras.items():
        echo(f"\n{op}: " + json.dumps(extra, indent=1))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
        echo(f"\nwrote {json_path}")
    return report
