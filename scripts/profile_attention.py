"""One attention call to profile with ncu: the scheduler's pick (or a forced schedule) on a model
shape, a few warm-up calls first so ncu can skip them. With --ncu DIR it runs ncu on itself and on
torch SDPA (the vendor kernel, same tensors) and writes what the 2026-11-25 analysis used: the full
details page, per-SASS-instruction counters as CSV (instructions executed and stall samples per
line), and SDPA's launch / scheduler / warp-state sections.

    python3 scripts/profile_attention.py --ncu OUT --shape 8x16x2048x64 [--causal]
        [--schedule fused_wgmma:groups=3,block_k=64,stages=4,producer=1]
    (by hand: ncu --kernel-name regex:attention --launch-skip 3 --launch-count 1 --set full \\
        python3 scripts/profile_attention.py --shape 8x16x2048x64)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

import jitops
from jitops.ops.base import Schedule, parse_value

SDPA_SECTIONS = ("LaunchStats", "SpeedOfLight", "SchedulerStats", "WarpStateStats", "ComputeWorkloadAnalysis",
                 "Occupancy", "MemoryWorkloadAnalysis")


def tensors(args: argparse.Namespace) -> tuple:
    shape = tuple(int(n) for n in args.shape.split("x"))
    return tuple(torch.randn(shape, device="cuda", dtype=getattr(torch, args.dtype)) for _ in range(3))


def run_once(args: argparse.Namespace) -> None:
    q, k, v = tensors(args)
    if args.vendor:
        for _ in range(4):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        torch.cuda.synchronize()
        print(out.shape, "sdpa")
        return
    sched = None
    if args.schedule:
        algorithm, _, params = args.schedule.partition(":")
        sched = Schedule.make(algorithm, **{n: parse_value(v) for n, v in
                                            (item.split("=") for item in params.split(",") if item)})
    for _ in range(4):
        out = jitops.attention(q, k, v, causal=args.causal, schedule=sched)
    torch.cuda.synchronize()
    print(out.shape, sched or "heuristic")


def _run(cmd: list[str], log_path: str) -> None:
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"{' '.join(cmd[:3])} ... -> {log_path} (rc {rc})", flush=True)


def profile(args: argparse.Namespace) -> None:
    """ncu over this script (jitops, then SDPA), reports written under args.ncu."""
    os.makedirs(args.ncu, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "--shape", args.shape, "--dtype", args.dtype]
    me += ["--causal"] if args.causal else []
    me += ["--schedule", args.schedule] if args.schedule else []
    rep = os.path.join(args.ncu, "jitops")
    _run(["ncu", "--set", "full", "--import-source", "no", "-f", "-o", rep, "--kernel-name", "regex:attention",
          "--launch-skip", "3", "--launch-count", "1", *me], os.path.join(args.ncu, "jitops_run.log"))
    _run(["ncu", "--import", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
         os.path.join(args.ncu, "jitops_sass.csv"))
    _run(["ncu", "--import", rep + ".ncu-rep", "--page", "details", "--print-details", "all"],
         os.path.join(args.ncu, "jitops_details.txt"))
    sections = [a for s in SDPA_SECTIONS for a in ("--section", s)]
    _run(["ncu", *sections, "--launch-skip", "3", "--launch-count", "1", *me, "--vendor"],
         os.path.join(args.ncu, "sdpa_details.txt"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8x16x2048x64", help="B x H x S x D (q, k and v alike)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--schedule", help="ALGORITHM[:name=value,...], e.g. fused_wgmma:groups=2,block_k=128")
    ap.add_argument("--vendor", action="store_true", help="run torch SDPA instead of jitops")
    ap.add_argument("--ncu", metavar="DIR", help="profile with ncu (jitops and SDPA) into DIR")
    args = ap.parse_args()
    if args.ncu:
        profile(args)
    else:
        run_once(args)


if __name__ == "__main__":
    main()
