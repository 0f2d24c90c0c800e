"""Sweep schedules of the normalization ops on a GPU: for each benchmark problem, many
schedules (strategy, threads per row, vectors per thread, statistics, streaming, grid cap), each
checked against float64 first, timed by CUDA-graph replay; torch timed the same way.

  python3 scripts/sweep_norms.py [--ops group_norm,layer_norm] [--budget 150] [--json out.json]

Prints one line per schedule as it goes and a compact table last: torch, the heuristic's pick
and the best schedule found, with GB/s and % of a device copy.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jitops
from jitops.bench import make_context
from jitops.bench import batch_norm as bench_bn
from jitops.bench import group_norm as bench_gn
from jitops.bench import layer_norm as bench_ln
from jitops.bench import rms_norm as bench_rms
from jitops.bench.layer_norm import call, torch_inputs, torch_reference
from jitops.bench.timing import copy_bandwidth_gbs
from jitops.errors import ScheduleError
from jitops.ops import get_op
from jitops.ops.base import ITEMSIZE, Schedule, ceil_div
from jitops.ops.norm_common import row_heuristic, vector_width

PIPELINE = False     # --pipeline: every shape x grid size x prefetch for the on-chip kernels
BENCH = {"batch_norm": bench_bn, "group_norm": bench_gn, "layer_norm": bench_ln, "rms_norm": bench_rms}


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
    torch = ctx.torch
    timer = ctx.timer
    copy = copy_bandwidth_gbs(timer)
    device = jitops.get_backend().device
    print(f"{device.name}: copy {copy:.0f} GB/s", flush=True)
    t_end = time.time() + args.budget
    results, summary = [], []
    for op_name in args.ops.split(","):
        op = get_op(op_name)
        for label, problem in BENCH[op_name].problems(ctx):
            if args.only and not any(k and k in label for k in args.only.split(",")):
                continue
            ins = torch_inputs(ctx, op_name, problem)
            ref = torch_reference(op_name, problem, ins)
            scale = float(ref.abs().max())
            out = torch.empty(problem.shape, device=bench_ln.DEVICE, dtype=getattr(torch, problem.dtype))
            nbytes = op.bytes_moved(problem)
            torch_us = timer.graph_us(lambda: _torch_call(torch, op_name, problem, ins), n=20, trials=3)
            scheds = row_schedules(problem, device) if op_name != "batch_norm" else bn_schedules(problem, device)
            if time.time() > t_end:
                scheds = scheds[:1]
            rows = []
            for k, s in enumerate(scheds):
                try:
                    out.fill_(float("nan"))
                    call(op_name, problem, ins, out=out, schedule=s)
                    err = float((out.double() - ref).abs().max()) / scale
                    tol = op.tolerance(problem, s)[0]
                    if not err <= tol:
                        raise AssertionError(f"error {err:.3g} > {tol:.3g}")
                    us = timer.graph_us(lambda: call(op_name, problem, ins, out=out, schedule=s), n=20, trials=3)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"  FAIL {op_name} {label} {s}: {str(exc)[:300]}", flush=True)
                    continue
                gbs = nbytes / (us * 1e-6) / 1e9
                rows.append((us, s, err))
                results.append({"op": op_name, "problem": label, "schedule": s.as_dict(), "us": us,
                                "gbs": gbs, "pct_copy": 100 * gbs / copy, "error": err, "heuristic": k == 0,
                                "torch_us": torch_us})
                print(f"  {op_name:10} {label:30} {us:9.2f} us {100 * gbs / copy:5.1f}% {'H' if k == 0 else ' '} {s}",
                      flush=True)
            del ref
            if not rows:
                continue
            heur = rows[0] if rows[0][1] == scheds[0] else None
            best = min(rows, key=lambda r: r[0])
            summary.append((op_name, label, torch_us, heur, best, nbytes))
    print(f"\n{'op':10} {'problem':30} {'torch us':>9} {'heur us':>9} {'%copy':>6} {'x torch':>7} {'best us':>9} "
          f"{'%copy':>6}  best schedule")
    for op_name, label, tus, heur, best, nbytes in summary:
        def pct(us: float) -> float:
            return 100 * nbytes / (us * 1e-6) / 1e9 / copy
        hus = heur[0] if heur else float("nan")
        print(f"{op_name:10} {label:30} {tus:9.2f} {hus:9.2f} {pct(hus):6.1f} {tus / hus:7.2f} {best[0]:9.2f} "
              f"{pct(best[0]):6.1f}  {best[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "copy_gbs": copy, "results": results}, f, indent=1)


def _torch_call(torch: Any, op_name: str, problem: Any, ins: dict) -> Any:
    F = torch.nn.functional
    if op_name == "batch_norm":
        y = F.batch_norm(ins["x"], ins["mean"], ins["var"], ins["gamma"], ins["beta"], training=False, eps=problem.eps)
        return F.relu(y) if problem.activation == "relu" else y
    if op_name == "group_norm":
        return F.group_norm(ins["x"], problem.groups, ins["gamma"], ins["beta"], problem.eps)
    if op_name == "layer_norm":
        return F.layer_norm(ins["x"], problem.normalized_shape, ins["gamma"], ins["beta"], problem.eps)
    return F.rms_norm(ins["x"], problem.normalized_shape, ins["gamma"], problem.eps)


if __name__ == "__main__":
    main()
