"""Tune the benchmark problems (the bench modules' own lists) and write schedules/<arch>.json.

    python -m jitops.tuning.shipped --export schedules/sm_90.json            # on the GPU
    python -m jitops.tuning.shipped --ops leaky_relu,conv2d --budget 300

Problems are built the way the public functions build them (same attributes, so the same keys
that calls look up). Ops whose modules are not in this build are left out and named. Problems
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
from typing import Any, Iterator

from ..ops import get_op, op_names
from ..ops.base import TensorSpec

log = logging.getLogger("jitops.tune")

# conv2d: (name, N, Cin, H, W, Cout, k); seed 000 fp32 with padding k//2, seed 002 fp32 + fp16 with padding 1.
CONV_SEED000 = [("small_1", 1, 3, 64, 64, 16, 3), ("mobilenet_like", 1, 64, 56, 56, 64, 3),
                ("resnet_block", 1, 64, 56, 56, 128, 1), ("medium", 1, 32, 128, 128, 64, 3),
                ("large_batch", 8, 64, 128, 128, 128, 3), ("large_spatial", 4, 64, 256, 256, 128, 3),
                ("very_wide_pointwise", 1, 128, 32, 320, 256, 1), ("1x1_heavy_channels", 1, 512, 16, 16, 512, 1),
                ("5x5_kernel", 1, 32, 64, 64, 64, 5)]
CONV_SEED002 = [("k100_1", 16, 128, 64, 64, 27, 3), ("k100_2", 16, 256, 32, 32, 256, 3),
                ("k100_3", 16, 64, 128, 128, 64, 3), ("k100_4", 2, 1920, 32, 32, 640, 3),
                ("k100_5", 2, 640, 64, 64, 640, 3), ("k100_6", 2, 320, 64, 64, 4, 3)]


def _spec(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


def _problems(op: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, inputs, attrs) as jitops.<op>() would pass them to make_problem."""
    if op == "leaky_relu":
        for dtype in ("float32", "float16"):
            for k in range(6, 16):
                yield f"n=4^{k} {dtype}", {"x": _spec((4 ** k,), dtype)}, {"alpha": 0.01}
    elif op == "conv2d":
        rows = [(r, "float32", r[6] // 2) for r in CONV_SEED000]
        rows += [(r, dt, 1) for dt in ("float32", "float16") for r in CONV_SEED002]
        for (name, n, cin, h, w, cout, k), dtype, pad in rows:
            yield (f"{name} {dtype}", {"x": _spec((n, cin, h, w), dtype), "w": _spec((cout, cin, k, k), dtype),
                                       "bias": None},
                   {"stride": 1, "padding": pad, "dilation": 1, "groups": 1, "activation": None, "alpha": 0.01})


# The bench modules' own problem lists (the full GPU set): records tuned here are the ones
# `jitops bench` looks up.
_BENCH_SHAPES = SimpleNamespace(on_gpu=True, quick=False)


def _bench_problems(op: str) -> list[tuple[str, Any]]:
    """(name, problem) of `jitops bench --ops op` on a GPU."""
    bench = importlib.import_module(f"jitops.bench.{op}")
    if op == "attention":
        return [(f"{name} {dtype}", bench._problem(q, kv, dtype, causal))
                for name, q, kv, dtype, causal in bench.problems(_BENCH_SHAPES)]
    return bench.problems(_BENCH_SHAPES)


def benchmark_problems(ops: list[str] | None = None) -> list[tuple[str, ModuleType, Any]]:
    """(name, op module, problem) for every benchmark problem whose op is in this build."""
    present = set(op_names())
    out = []
    from ..bench import bench_ops
    for op in ops or bench_ops():
        if op not in present:
            log.warning("%s is not in this build: its benchmark problems are left out", op)
            continue
        mod = get_op(op)
        if op in ("leaky_relu", "conv2d"):
            out += [(name, mod, mod.make_problem(inputs, attrs)) for name, inputs, attrs in _problems(op)]
        else:
            out += [(name, mod, problem) for name, problem in _bench_problems(op)]
    return out


def main(argv: list[str] | None = None) -> int:
    from ..records import export_records, merge_into, record_arch, store
    from ..runtime import get_backend
    from .report import summary_footer, summary_table
    from .tuner import TuneOptions, tune_problems
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated ops (default: every benchmark op in this build)")
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
