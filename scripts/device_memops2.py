"""Issue 18, round 2, on a GPU in one command (H100 device call): one-launch NHWC group_norm on the
SD-UNet shapes (fp16 / bf16 / fp32) against torch, the two-launch path and a same-size device copy;
leaky_relu 16K-1M and channels_last against torch with the tiled / untiled schedules; tuner
records for the bf16 / channels_last rows. Every timed kernel is checked against float64 first
(output poisoned with NaN). Times are CUDA-graph replays (and eager) of back-to-back calls.

    python3 scripts/device_memops2.py --out DIR            # timings + records -> DIR/memops2.json, records.json
    python3 scripts/device_memops2.py --sanitize           # small cases of the new kernels (compute-sanitizer)
    python3 scripts/device_memops2.py --profile DIR        # leaky_relu kernels for ncu (reads DIR/memops2.json)
    python3 scripts/device_memops2.py --dry                # the logic on the CPU emulator, tiny shapes
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import jitops
from jitops.bench.timing import Timer, copy_bandwidth_gbs
from jitops.ops import get_op, group_norm_nhwc, group_norm_onchip
from jitops.ops.base import Schedule, TensorSpec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_memops import precompile, ref_group_norm, rel_err  # noqa: E402

F = torch.nn.functional
CL = torch.channels_last
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float32": 4e-6, "float16": 2e-3, "bfloat16": 5e-3}
SD = [(2, 320, 64, 64), (2, 320, 32, 32), (2, 640, 32, 32), (2, 640, 16, 16), (2, 1280, 16, 16), (2, 1280, 8, 8),
      (2, 960, 32, 32), (2, 1920, 16, 16)]
LRELU = [1 << 14, 1 << 16, 1 << 18, 1 << 20]
LRELU_CL = (2, 320, 64, 64)
DEV = "cuda"


def lrelu_schedules(dtype: str) -> list[Schedule]:
    """The untiled (grid-stride layout) and tiled schedules compared at 16K-1M elements."""
    vec = 4 if dtype == "float32" else 8
    out = []
    for tiled in (False, True):
        for unroll in ((1, 2, 4) if not tiled else (1, 2, 4, 8)):
            for block in (128, 256, 512):
                extra = {"tiled": True} if tiled else {}
                out.append(Schedule.make("vectorized", vec=vec, unroll=unroll, block=block, waves=0,
                                         streaming=False, **extra))
    return out


def gn_problem(shape, dtype):
    p = TensorSpec((shape[1],), "float32")
    return get_op("group_norm").make_problem({"x": TensorSpec(shape, dtype, "nhwc"), "gamma": p, "beta": p},
                                             {"num_groups": 32})


def check(y: torch.Tensor, ref: torch.Tensor, dtype: str) -> tuple[bool, float]:
    err = rel_err(y, ref)
    return err <= TOL[dtype] and not bool(torch.isnan(y).any()), err


def gn_rows(timer, device, copy_gbs, dtypes, n_rep, deadline):
    rows = []
    for dtype in dtypes:
        for shape in SD:
            if time.time() > deadline:
                print("budget spent: group_norm stops", flush=True)
                return rows
            c = shape[1]
            x = (torch.randn(shape, device=DEV) * 2 + 0.5).to(DT[dtype]).contiguous(memory_format=CL)
            g, b = torch.randn(c, device=DEV) * 0.5 + 1, torch.randn(c, device=DEV)
            gx, bx = g.to(x.dtype), b.to(x.dtype)
            ref = ref_group_norm(x, 32, g, b, 1e-5)
            prob = gn_problem(shape, dtype)
            heur = get_op("group_norm").heuristic(prob, device)
            scheds = {"heuristic": heur, "two_launch": group_norm_nhwc.heuristic(prob, device, "nhwc")}
            for i, (_, s) in enumerate(group_norm_onchip.options(prob, device, int(heur.get("vec", 8)))[:5]):
                if s != heur:
                    scheds[f"onchip_alt{i}"] = s
            row = {"op": "group_norm", "shape": "x".join(map(str, shape)), "dtype": dtype, "layout": "channels_last",
                   "bytes": 2 * x.numel() * x.element_size() + 8 * c, "schedules": {}}
            out = torch.empty_like(x)
            for name, s in scheds.items():
                out.fill_(float("nan"))
                y = jitops.group_norm(x, 32, g, b, out=out, schedule=s)
                ok, err = check(y, ref, dtype)
                us = timer.graph_us(lambda s=s: jitops.group_norm(x, 32, g, b, schedule=s), n=n_rep)
                row["schedules"][name] = {"schedule": str(s), "ok": ok, "error": err, "graph_us": us}
            o = torch.empty_like(x)
            row["copy_graph_us"] = timer.graph_us(lambda: o.copy_(x), n=n_rep)
            row["torch_graph_us"] = timer.graph_us(lambda: F.group_norm(x, 32, gx, bx), n=n_rep)
            row["jitops_us"] = timer.per_call_us(lambda: jitops.group_norm(x, 32, g, b), n=n_rep)
            row["torch_us"] = timer.per_call_us(lambda: F.group_norm(x, 32, gx, bx), n=n_rep)
            # after hundreds of replays: the barrier counters must still be reset (same result)
            out.fill_(float("nan"))
            row["ok_after_replays"] = check(jitops.group_norm(x, 32, g, b, out=out), ref, dtype)[0]
            h = row["schedules"]["heuristic"]["graph_us"]
            if h:
                row["ratio"] = row["torch_graph_us"] / h
                row["pct_copy"] = 100.0 * row["bytes"] / (h * 1e-6) / 1e9 / copy_gbs
                row["pct_same_size_copy"] = 100.0 * row["copy_graph_us"] / h
                two = row["schedules"]["two_launch"]["graph_us"]
                row["vs_two_launch"] = two / h
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "schedules"}), flush=True)
    return rows


def lrelu_rows(timer, n_rep, deadline):
    rows = []
    for dtype in ("float32", "float16", "bfloat16"):
        shapes = [(n,) for n in LRELU] + ([LRELU_CL] if dtype != "float32" else [])
        for shape in shapes:
            if time.time() > deadline:
                print("budget spent: leaky_relu stops", flush=True)
                return rows
            x = torch.randn(shape, device=DEV, dtype=DT[dtype])
            if len(shape) == 4:
                x = x.contiguous(memory_format=CL)
            ref = torch.where(x.double() > 0, x.double(), 0.01 * x.double())
            out = torch.empty_like(x)
            row = {"op": "leaky_relu", "shape": "x".join(map(str, shape)), "dtype": dtype, "schedules": {}}
            for name, s in [("heuristic", None)] + [(str(s), s) for s in lrelu_schedules(dtype)]:
                out.fill_(float("nan"))
                ok, err = check(jitops.leaky_relu(x, 0.01, out=out, schedule=s), ref, dtype)
                us = timer.graph_us(lambda s=s: jitops.leaky_relu(x, 0.01, schedule=s), n=n_rep)
                row["schedules"][name] = {"ok": ok, "error": err, "graph_us": us,
                                          "schedule": s.as_dict() if s is not None else None}
            row["torch_graph_us"] = timer.graph_us(lambda: F.leaky_relu(x, 0.01), n=n_rep)
            o = torch.empty_like(x)
            row["copy_graph_us"] = timer.graph_us(lambda: o.copy_(x), n=n_rep)
            row["jitops_us"] = timer.per_call_us(lambda: jitops.leaky_relu(x, 0.01), n=n_rep)
            row["torch_us"] = timer.per_call_us(lambda: F.leaky_relu(x, 0.01), n=n_rep)
            timed = {k: v["graph_us"] for k, v in row["schedules"].items() if v["ok"] and v["graph_us"]}
            if timed and row["torch_graph_us"]:
                best = min(timed, key=timed.get)
                row["best"], row["best_us"] = best, timed[best]
                row["best_schedule"] = row["schedules"][best]["schedule"]
                row["ratio_heuristic"] = row["torch_graph_us"] / timed.get("heuristic", float("inf"))
                row["ratio_best"] = row["torch_graph_us"] / timed[best]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "schedules"}), flush=True)
    return rows


def precompile_all(device) -> dict:
    """Every kernel the timings launch, compiled in parallel worker processes up front."""
    cases = []
    for dtype in ("float16", "bfloat16", "float32"):
        for shape in SD:
            c = shape[1]
            x = torch.empty(shape, device=DEV, dtype=DT[dtype]).contiguous(memory_format=CL)
            t = {"x": x, "gamma": torch.empty(c, device=DEV), "beta": torch.empty(c, device=DEV)}
            prob = gn_problem(shape, dtype)
            heur = get_op("group_norm").heuristic(prob, device)
            scheds = [None, group_norm_nhwc.heuristic(prob, device, "nhwc")]
            scheds += [s for _, s in group_norm_onchip.options(prob, device, int(heur.get("vec", 8)))[:5]]
            cases += [{"label": f"gn {shape} {dtype}", "spec": ("group_norm", t, {"num_groups": 32}, s)} for s in scheds]
        for shape in [(n,) for n in LRELU] + [LRELU_CL]:
            x = torch.empty(shape, device=DEV, dtype=DT[dtype])
            if len(shape) == 4:
                x = x.contiguous(memory_format=CL)
            for s in [None] + lrelu_schedules(dtype):
                cases.append({"label": f"lrelu {shape} {dtype}", "spec": ("leaky_relu", {"x": x}, {"alpha": 0.01}, s)})
    return precompile(cases)


def tune_records(budget: float) -> list[dict]:
    """Tuner records (jitops.tune's machinery, nothing saved) for the bf16 / channels_last rows of
    group_norm, batch_norm and leaky_relu, in priority order under one budget."""
    from jitops.tuning.tuner import TuneOptions, tune_problems
    gn, bn, lr = get_op("group_norm"), get_op("batch_norm"), get_op("leaky_relu")
    items = [(gn, gn_problem(s, d)) for d in ("float16", "bfloat16") for s in SD]
    for shape in ((256, 64, 56, 56), (8, 320, 64, 64)):
        pc = TensorSpec((shape[1],), "float32")
        for dtype, layout in (("bfloat16", ""), ("float16", "nhwc"), ("bfloat16", "nhwc")):
            items.append((bn, bn.make_problem({"x": TensorSpec(shape, dtype, layout), "mean": pc, "var": pc,
                                               "gamma": pc, "beta": pc}, {})))
    for n in LRELU + [1 << 24, 1 << 26]:
        items.append((lr, lr.make_problem({"x": TensorSpec((n,), "bfloat16")}, {"alpha": 0.01})))
    opts = TuneOptions(budget_s=budget, force=True, save=False, max_candidates=16, progress=False)
    results = tune_problems(items, options=opts)
    out = []
    for r in results:
        print(f"tune {r.key}: {r.source} {r.schedule} {r.time_us} us (heuristic {r.heuristic_us} us)", flush=True)
        if r.record:
            out.append(r.record)
    return out


def sanitize_cases() -> None:
    """Small cases of the new kernels: onchip group_norm with two blocks at the barrier (bf16,
    fp32 parameters) and the default onchip pick, tiled leaky_relu aligned and misaligned."""
    x = torch.randn(1, 40, 6, 6, device=DEV).to(torch.bfloat16).contiguous(memory_format=CL)
    g, b = torch.randn(40, device=DEV), torch.randn(40, device=DEV)
    dev = jitops.get_backend().device
    p = TensorSpec((40,), "float32")
    prob = get_op("group_norm").make_problem({"x": TensorSpec((1, 40, 6, 6), "bfloat16", "nhwc"), "gamma": p,
                                              "beta": p}, {"num_groups": 4})
    for s in (group_norm_nhwc.heuristic(prob, dev, "onchip", threads=32, rows=4, pixels_per_block=20), None):
        for _ in range(2):
            y = jitops.group_norm(x, 4, g, b, schedule=s)
            assert rel_err(y, ref_group_norm(x, 4, g, b, 1e-5)) <= 5e-3
    base = torch.randn(5000, device=DEV)
    for v in (base[:4999], base[1:]):
        y = jitops.leaky_relu(v, 0.1, schedule=Schedule.make("vectorized", vec=4, unroll=4, block=128, waves=0,
                                                             tiled=True))
        assert rel_err(y, torch.where(v.double() > 0, v.double(), 0.1 * v.double())) <= 4e-6
    torch.cuda.synchronize()
    print("sanitize cases ok", flush=True)


def profile_cases(out_dir: str) -> None:
    """For ncu (--profile-from-start off): torch's, the heuristic's and the best measured schedule's
    leaky_relu kernels at 64K and 1M fp32, 1M fp16."""
    best = {}
    path = os.path.join(out_dir, "memops2.json")
    if os.path.exists(path):
        for r in json.load(open(path))["leaky_relu"]:
            best[(r["shape"], r["dtype"])] = r.get("best_schedule")
    for n, dtype in ((1 << 16, "float32"), (1 << 20, "float32"), (1 << 20, "float16")):
        x = torch.randn(n, device=DEV, dtype=DT[dtype])
        pick = best.get((str(n), dtype))
        sched = Schedule.from_dict(pick) if pick else None
        for s in (None, sched):
            jitops.leaky_relu(x, 0.01, schedule=s)
        F.leaky_relu(x, 0.01)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        F.leaky_relu(x, 0.01)
        jitops.leaky_relu(x, 0.01)
        if sched is not None:
            jitops.leaky_relu(x, 0.01, schedule=sched)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled n={n} {dtype}: torch, heuristic, {sched}", flush=True)


def main() -> None:
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--profile", metavar="DIR")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--budget", type=float, default=75.0, help="seconds for the timings")
    ap.add_argument("--tune-budget", type=float, default=30.0)
    args = ap.parse_args()
    if args.sanitize:
        return sanitize_cases()
    if args.profile:
        return profile_cases(args.profile)
    t0 = time.time()
    timer = Timer(torch if not args.dry else None)
    if args.dry:
        global SD, LRELU, LRELU_CL
        DEV, SD, LRELU, LRELU_CL = "cpu", [(2, 64, 4, 4)], [1000], (2, 16, 3, 3)
        timer.graph_us = lambda fn, n=20: (fn(), 1.0)[1]
        timer.per_call_us = lambda fn, n=20: (fn(), 1.0)[1]
    device = jitops.get_backend().device
    copy_gbs = copy_bandwidth_gbs(timer) if not args.dry else 1.0
    name = torch.cuda.get_device_name() if not args.dry else "dry run"
    print(f"{name} {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} copy {copy_gbs:.0f} GB/s", flush=True)
    pre = precompile_all(device) if not args.dry else {}
    deadline = t0 + args.budget
    n_rep = 20
    gn = gn_rows(timer, device, copy_gbs, ("float16", "bfloat16", "float32"), n_rep, deadline)
    lr = lrelu_rows(timer, n_rep, deadline + 15)
    report = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "copy_gbs": copy_gbs,
              "torch": torch.__version__, "precompile": pre, "group_norm": gn, "leaky_relu": lr}
    with open(os.path.join(args.out, "memops2.json"), "w") as f:
        json.dump(report, f, indent=1)
    recs = tune_records(args.tune_budget) if not args.dry else []
    with open(os.path.join(args.out, "records.json"), "w") as f:
        json.dump(recs, f, indent=1)
    bad = [r for r in gn + lr if not all(s["ok"] for s in r["schedules"].values())
           or r.get("ok_after_replays") is False]
    print(f"{len(gn)} group_norm rows, {len(lr)} leaky_relu rows, {len(bad)} with a failed check, "
          f"{len(recs)} records, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
