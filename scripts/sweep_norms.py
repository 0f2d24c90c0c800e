"""Sweep schedules of the normalization ops on a GPU: for each benchmark problem, many
schedules (strategy, threads per row, vectors per thread, statistics, streaming, grid cap). The
measurement is the tuner's (jitops.tuning.sweep.measure_schedules: each schedule checked against
float64, then timed per call behind an L2 flush, interleaved); torch is timed the same way
(jitops.tuning.vendor). This script only chooses the schedules and prints.

  python3 scripts/sweep_norms.py [--ops group_norm,layer_norm] [--budget 150] [--json out.json]

Prints one line per schedule as it goes and a compact table last: torch, the heuristic's pick
and the best schedule found, with GB/s and % of a device copy.
"""
from __future__ import annotations

import argparse
import importlib
import json
import time
from typing import Any

import jitops
from jitops.bench import make_context
from jitops.bench.timing import copy_bandwidth_gbs
from jitops.errors import ScheduleError
from jitops.ops import bench_module, get_op
from jitops.ops.base import ITEMSIZE, Schedule, ceil_div
from jitops.ops.norm_common import row_heuristic, vector_width
from jitops.tuning.sweep import measure_schedules
from jitops.tuning.tuner import TIMING_METHOD
from jitops.tuning.vendor import vendor_us

PIPELINE = False     # --pipeline: every shape x grid size x prefetch for the on-chip kernels


def row_schedules(problem: Any, device: Any) -> list[Schedule]:
    spec = problem.row_spec()
    w = device.warp_size
    vec = vector_width(spec.length, ITEMSIZE[spec.dtype])
    lenv = spec.length // vec
    h = row_heuristic(spec, device)
    out = [h, row_heuristic(spec, device, h.algorithm, **{**dict(h.params), "streaming": not h.get("streaming")})]
    tries: list[tuple[str, dict]] = []
    if lenv <= 16 * w:
        tries += [("warp", {"tpr": w}), ("warp", {"tpr": w, "waves": 4})]
    for items in (1, 2, 3, 4, 6, 8):
        tpr = ceil_div(ceil_div(lenv, items), w) * w
        if tpr <= 1024 and (items == 1 or tpr * (items - 1) < lenv):
            tries.append(("block", {"tpr": tpr, "items": items}))
    if spec.row_bytes > (8 << 10):
        for tpr in (256, 512, 1024):
            tries.append(("block", {"tpr": tpr, "store": "smem"}))
        for tpr in (256, 512, 1024):
            for unroll in (2, 4):
                tries.append(("stream", {"tpr": tpr, "unroll": unroll}))
    if spec.rows < 2 * device.multiprocessors:
        for chunks in (4, 8, 16, 32, 64):
            tries.append(("split", {"chunks": chunks}))
    if spec.kind == "layer":
        tries += [(h.algorithm, {**dict(h.params), "stats": s}) for s in ("welford", "sumsq")
                  if h.algorithm in ("warp", "block") or s != "two_pass"]
    if h.algorithm in ("warp", "block"):
        tries += [(h.algorithm, {**dict(h.params), "waves": wv}) for wv in (2, 8)]
    if h.algorithm in ("warp", "block") and h.get("store", "regs") == "regs":
        # Persistent grids, with and without the next row loaded ahead (--pipeline: more of them).
        shapes = [{k: h[k] for k in ("tpr", "items") if k in h.params}]
        if h.algorithm == "block":
            for items in (2, 4, 8):
                tpr = ceil_div(ceil_div(lenv, items), w) * w
                if tpr <= 1024 and {"tpr": tpr, "items": items} not in shapes:
                    shapes.append({"tpr": tpr, "items": items})
        for shape in shapes if PIPELINE else shapes[:1]:
            for per_sm in (2, 4, 6, 8, 12, 16) if PIPELINE else (4, 8):
                for prefetch in (True, False):
                    tries.append((h.algorithm, {**dict(h.params), **shape, "per_sm": per_sm, "prefetch": prefetch}))
        if spec.kind == "layer" and PIPELINE:
            tries += [(alg, {**over, "stats": "welford"}) for alg, over in tries[-12:]]
    for alg, over in tries:
        over = {k: v for k, v in over.items()}
        try:
            s = row_heuristic(spec, device, alg, **over)
            get_op(spec.op).plan(problem, s, device)
        except (ScheduleError, KeyError):
            continue
        if s not in out:
            out.append(s)
    out.append(row_heuristic(spec, device, "naive"))
    return out


def bn_schedules(problem: Any, device: Any) -> list[Schedule]:
    op = get_op("batch_norm")
    h = op.heuristic(problem, device)
    vec = 16 // ITEMSIZE[problem.dtype]
    out = [h]
    for unroll in (1, 2, 4):
        for block in (256, 512):
            for streaming in (True, False):
                s = Schedule.make("folded", vec=vec, unroll=unroll, block=block, waves=0, streaming=streaming)
                if s not in out:
                    out.append(s)
    out += [Schedule.make("folded", vec=vec, unroll=u, block=256, waves=wv, streaming=True)
            for u in (1, 4) for wv in (4, 16)]
    out.append(op.heuristic(problem, device, "naive"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="group_norm,layer_norm,batch_norm,rms_norm")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds; later problems get heuristic + torch only")
    ap.add_argument("--only", default="", help="comma-separated substrings: sweep only problems whose label has one")
    ap.add_argument("--json")
    ap.add_argument("--pipeline", action="store_true", help="sweep persistent grids and next-row prefetch widely")
    args = ap.parse_args()
    global PIPELINE
    PIPELINE = args.pipeline
    ctx = make_context(quick=False, algorithms="heuristic")
    copy = copy_bandwidth_gbs(ctx.timer)
    backend = jitops.get_backend()
    device = backend.device
    print(f"{device.name}: copy {copy:.0f} GB/s; times: {TIMING_METHOD}", flush=True)
    t_end = time.time() + args.budget
    results, summary = [], []
    for op_name in args.ops.split(","):
        op = get_op(op_name)
        for label, problem in importlib.import_module(bench_module(op_name)).problems(ctx):
            if args.only and not any(k and k in label for k in args.only.split(",")):
                continue
            nbytes = op.bytes_moved(problem)
            torch_us = vendor_us(op_name, problem, backend)
            scheds = row_schedules(problem, device) if op_name != "batch_norm" else bn_schedules(problem, device)
            if time.time() > t_end:
                scheds = scheds[:1]
            rows = []
            for k, m in enumerate(measure_schedules(op, problem, scheds, backend, reps=20)):
                if m.time_us is None:
                    print(f"  FAIL {op_name} {label} {m.schedule}: {m.detail[:300]}", flush=True)
                    continue
                gbs = nbytes / (m.time_us * 1e-6) / 1e9
                rows.append((m.time_us, m.schedule, m.max_error, k == 0))
                results.append({"op": op_name, "problem": label, "schedule": m.schedule.as_dict(), "us": m.time_us,
                                "gbs": gbs, "pct_copy": 100 * gbs / copy, "error": m.max_error, "heuristic": k == 0,
                                "torch_us": torch_us})
                print(f"  {op_name:10} {label:30} {m.time_us:9.2f} us {100 * gbs / copy:5.1f}% "
                      f"{'H' if k == 0 else ' '} {m.schedule}", flush=True)
            if rows:
                heur = rows[0] if rows[0][3] else None
                summary.append((op_name, label, torch_us, heur, min(rows, key=lambda r: r[0]), nbytes))
    print(f"\n{'op':10} {'problem':30} {'torch us':>9} {'heur us':>9} {'%copy':>6} {'x torch':>7} {'best us':>9} "
          f"{'%copy':>6}  best schedule")
    for op_name, label, tus, heur, best, nbytes in summary:
        def pct(us: float) -> float:
            return 100 * nbytes / (us * 1e-6) / 1e9 / copy
        hus = heur[0] if heur else float("nan")
        print(f"{op_name:10} {label:30} {tus or float('nan'):9.2f} {hus:9.2f} {pct(hus):6.1f} "
              f"{(tus or float('nan')) / hus:7.2f} {best[0]:9.2f} {pct(best[0]):6.1f}  {best[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "copy_gbs": copy, "timing": TIMING_METHOD, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
