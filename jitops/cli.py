"""The `jitops` command (also `python -m jitops`)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Sequence

from . import __version__, config
from .errors import JitopsError


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# ---------------------------------------------------------------- info

def cmd_info(args: argparse.Namespace) -> int:
    from .cache import loader
    from .runtime import get_backend
    from .runtime.base import Backend

    print(f"jitops {__version__}")
    be: Backend = get_backend()
    d = be.device
    print(f"backend      {be.name}")
    print(f"device       {d.name}")
    print(f"arch         {d.arch}  (warp {d.warp_size}, {d.multiprocessors} multiprocessors, "
          f"shared {d.shared_per_block // 1024}/{d.shared_per_block_optin // 1024} KiB per block, "
          f"L2 {_fmt_bytes(d.l2_bytes)}, matrix cores {'yes' if d.matrix_cores else 'no'})")
    print(f"compiler     {be.compiler_id()}")
    for name, target in (("nvrtc", "sm_90"), ("hiprtc", "gfx90a")):
        if be.name == ("cuda" if name == "nvrtc" else "hip"):
            continue
        try:
            print(f"{name:<12} {get_backend(target=target).compiler_id()} (offline targets)")
        except JitopsError as exc:
            print(f"{name:<12} unavailable: {str(exc).splitlines()[0]}")
    info = loader().disk.info()
    status = config.cache_status()
    if status["reason"] is None:
        print(f"cache        {status['in_use']}")
    else:
        print(f"cache        {status['in_use']} (temporary, this process only: {status['configured']} "
              f"cannot be used: {status['reason']})")
    print(f"binaries     {info['entries']} entries, {_fmt_bytes(info['bytes'])}"
          + ("" if info["usable"] else " (cache unusable)"))
    from .runtime import fastlaunch
    launcher = fastlaunch.native_launcher()
    print(f"launcher     {'unavailable (Python repeat path)' if launcher is None else fastlaunch.origin}")
    n = config.benchmark_candidates()
    print(f"benchmark    {f'on: first calls time up to {n} schedules ({config.ENV_BENCHMARK})' if n else 'off'}")
    pdl = config.programmatic_launch_mode()
    print(f"dependent    {pdl}" + ({"auto": " (in CUDA graphs, after a jitops kernel)", "on": " (every launch)",
                                      "off": ""}[pdl] if be.can_launch_programmatic()
                                     else " (not on this device: CUDA sm_90+ only)")
          + f"  programmatic launch of the Hopper conv kernels ({config.ENV_PROGRAMMATIC_LAUNCH})")
    from .api import get_fp32_precision
    mode = get_fp32_precision()
    print(f"fp32 math    {mode}" + ("  (exact; jitops.set_fp32_precision('tf32') allows TF32 products)"
                                    if mode == "highest" else "  (conv2d and attention calls without precision=)"))
    return 0


# ---------------------------------------------------------------- compile

def _parse_kv(items: Sequence[str]) -> dict[str, str]:
    spec = {}
    for item in items:
        if "=" not in item:
            raise JitopsError(f"problem arguments are key=value (e.g. x=1x64x56x56), got '{item}'")
        k, v = item.split("=", 1)
        spec[k.strip()] = v.strip()
    return spec


def cmd_compile(args: argparse.Namespace) -> int:
    from .engine import compile_problem
    from .ops import get_op
    from .runtime import get_backend

    op = get_op(args.op)
    problem = op.parse_problem(_parse_kv(args.problem))
    targets = args.target or [None]
    print(f"{args.op}: {problem.key()}")
    for target in targets:
        be = get_backend(target=target) if target else get_backend()
        t0 = time.perf_counter()
        schedule, origin, kernels = compile_problem(args.op, problem, be, args.algorithm)
        total = time.perf_counter() - t0
        print(f"\n[{be.device.arch}] {be.name} backend, {be.compiler_id()}")
        print(f"  schedule  {schedule}  [{origin}]")
        if schedule.why:
            print(f"  why       {schedule.why}")
        for k in kernels:
            how = f"compiled in {k.compile_seconds * 1e3:.0f} ms" if k.origin == "compiled" else f"from {k.origin} cache"
            print(f"  kernel    {k.kernel:<32} {k.binary_bytes:>8} bytes  {how}  key {k.key[:12]}")
            if args.source:
                print(f"\n----- {k.template} -----\n{k.source}\n-----")
        print(f"  total     {total * 1e3:.0f} ms")
    return 0


# ---------------------------------------------------------------- cache

def cmd_cache(args: argparse.Namespace) -> int:
    from .cache import loader

    disk = loader().disk
    if args.action == "clear":
        n = disk.clear()
        print(f"removed {n} entries from {disk.directory}")
        return 0
    info = disk.info()
    print(f"location  {info['path']}")
    print(f"entries   {info['entries']}")
    print(f"size      {_fmt_bytes(info['bytes'])}")
    return 0


# ---------------------------------------------------------------- bench

def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    from .bench import latency, plot

    if args.from_report:
        report = plot.load(args.from_report)
    else:
        ops = [o for part in (args.ops or []) for o in part.split(",") if o] or None
        report = bench.run(ops, quick=args.quick, json_path=args.json, algorithms=args.algorithms)
    if args.markdown:
        print(plot.markdown(report) + latency.markdown(report))
    if args.plot:
        print(f"drew {plot.plot(report, args.plot)}")
        if (drawn := latency.plot(report, latency.plot_path(args.plot))) is not None:
            print(f"drew {drawn}")
    return 0


# ---------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jitops", description="JIT kernels for deep-learning operators.")
    p.add_argument("--version", action="version", version=f"jitops {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="backend, device, compilers and cache")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("compile", help="compile an op for a problem without running it",
                       description="Example: jitops compile leaky_relu x=1048576 dtype=float32 "
                                   "--target sm_90 --target gfx90a")
    s.add_argument("op")
    s.add_argument("problem", nargs="*", help="key=value; shapes as AxBxC")
    s.add_argument("--target", action="append", help="sm_80, sm_90, gfx90a, ... (repeatable; default: this device)")
    s.add_argument("--algorithm", help="force an algorithm instead of the scheduler's choice")
    s.add_argument("--source", action="store_true", help="print the rendered HIP source")
    s.set_defaults(func=cmd_compile)

    s = sub.add_parser("cache", help="binary cache: info or clear")
    s.add_argument("action", choices=("info", "clear"))
    s.set_defaults(func=cmd_cache)

    s = sub.add_parser("bench", help="benchmark ops against the vendor op in the same run")
    s.add_argument("--ops", action="append", help="ops to run (comma-separated or repeated)")
    s.add_argument("--quick", action="store_true", help="fewer problems")
    s.add_argument("--json", help="write results to this file")
    s.add_argument("--algorithms", choices=("all", "heuristic"), default="all",
                   help="time every applicable algorithm (default) or the scheduler's pick only")
    s.add_argument("--plot", metavar="FILE", help="draw ratios and efficiency per op (.png/.svg; needs matplotlib)")
    s.add_argument("--markdown", action="store_true", help="print per-op tables (for docs/performance.md)")
    s.add_argument("--from", dest="from_report", metavar="REPORT",
                   help="draw / tabulate an earlier --json report (.json or .json.gz) instead of running")
    s.set_defaults(func=cmd_bench)

    from .tuning.cli import add_subcommands as add_tuning_subcommands   # tune, records
    add_tuning_subcommands(sub)
    from .onnx.bundle_build import add_subcommand as add_bundle_subcommand   # bundle
    add_bundle_subcommand(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else (logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except JitopsError as exc:
        print(f"jitops: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
