"""Tune the benchmark problems (the bench modules' own lists) and write schedules/<arch>.json.

    python -m jitops.tuning.shipped --export schedules/sm_90.json            # on the GPU
    python -m jitops.tuning.shipped --ops leaky_relu,conv2d --budget 300

The problems are the benchmark's (each op's REGISTRATION in jitops/ops says where they come from),
built the way the public functions build them (same keys that calls look up). Problems
that already have a record measured on this device (user records, or the shipped file when it
was made on the same kind of GPU) are not measured again unless --force, so a run cut short by
its budget is completed by running it again; --export writes the shipped file's records of this
arch merged with the user records (a new measurement replaces an old one).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import time
from types import ModuleType, SimpleNamespace
from typing import Any

from ..ops import bench_module, bench_ops, get_op, registration, resolve
from ..ops.base import TensorSpec

log = logging.getLogger("jitops.tune")

# The bench modules' problem lists as on a GPU (the full set): records tuned here are the ones
# `jitops bench` looks up.
_BENCH_SHAPES = SimpleNamespace(on_gpu=True, quick=False)


def op_problems(op: str) -> list[tuple[str, Any]]:
    """(name, problem) the shipped schedules of `op` are tuned on: its REGISTRATION.tuning_problems,
    else its bench module's problems(ctx) on a GPU."""
    ref = registration(op).tuning_problems
    if ref:
        return list(resolve(ref)())
    bench = bench_module(op)
    if bench is None:
        return []
    return list(importlib.import_module(bench).problems(_BENCH_SHAPES))


def benchmark_problems(ops: list[str] | None = None) -> list[tuple[str, ModuleType, Any]]:
    """(name, op module, problem) for every benchmark problem of `ops` (default: every op with a benchmark)."""
    return [(name, get_op(op), problem) for op in ops or bench_ops() for name, problem in op_problems(op)]


# Adapters for bench modules whose problems(ctx) are not (name, problem) pairs; the ops' REGISTRATION
# points here. Each reads the bench module's own lists (no copies).

def leaky_relu_problems() -> list[tuple[str, Any]]:
    """Every bench size in float32 and float16 (the bench's bf16 and channels_last rows are left untuned)."""
    from ..bench import leaky_relu as bench
    op = get_op("leaky_relu")
    return [(f"n={_power_of_4(n)} {dtype}", op.make_problem({"x": TensorSpec((n,), dtype)}, {"alpha": bench.ALPHA}))
            for dtype in ("float32", "float16") for n in bench.sizes(_BENCH_SHAPES)]


def _power_of_4(n: int) -> str:
    k = (n.bit_length() - 1) // 2
    return f"4^{k}" if 4 ** k == n else str(n)


def conv2d_problems() -> list[tuple[str, Any]]:
    """Every bench problem in float32, the K100 ones in float16 too."""
    from ..bench import conv2d as bench
    return [(f"{cp.name} {dtype}", bench.op_problem(cp, dtype)) for dtype in ("float32", "float16")
            for cp in bench.problems(_BENCH_SHAPES) if dtype == "float32" or cp.k100]


def attention_problems() -> list[tuple[str, Any]]:
    from ..bench import attention as bench
    return [(f"{name} {dtype}", bench._problem(q, kv, dtype, causal))
            for name, q, kv, dtype, causal in bench.problems(_BENCH_SHAPES)]


def main(argv: list[str] | None = None) -> int:
    from ..records import export_records, merge_into, record_arch, store
    from ..runtime import get_backend
    from .report import summary_footer, summary_table
    from .tuner import TuneOptions, tune_problems
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated ops (default: every op with a benchmark)")
    p.add_argument("--budget", type=float, default=0.0, help="seconds for all of it (0: no limit)")
    p.add_argument("--export", help="write this device's records (all of them, this arch) to this file")
    p.add_argument("--max-candidates", type=int, default=256)
    p.add_argument("--no-vendor", action="store_true")
    p.add_argument("--force", action="store_true", help="measure problems that already have a record")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    problems = benchmark_problems(args.ops.split(",") if args.ops else None)
    backend = get_backend()
    t0 = time.monotonic()
    opts = TuneOptions(budget_s=args.budget or None, force=args.force, max_candidates=args.max_candidates,
                       vendor=not args.no_vendor)
    results = tune_problems([(m, pr) for _, m, pr in problems], backend, opts)
    print(summary_table(results))
    print(summary_footer(results, time.monotonic() - t0))
    if args.export:
        arch = record_arch(backend.device)
        merged, _ = merge_into(store().shipped_records(arch), [r for r in store().user_records() if r["arch"] == arch],
                               prefer="incoming")
        n = export_records(args.export, merged)
        print(f"wrote {n} records to {args.export}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
