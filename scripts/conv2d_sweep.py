"""Time every conv2d candidate schedule on the benchmark problems (one GPU call), for tuning.

Compiles all kernel sources first in parallel worker processes (offline sm_XX target, same cache
keys as the device), then for each problem: cuDNN (benchmark on and off, no TF32), and each
candidate checked against a float64 reference and timed by CUDA-graph replay. Writes JSON and
prints a compact table: best time per algorithm, the heuristic's pick and cuDNN.

Usage: python3 scripts/conv2d_sweep.py OUT.json [--budget SECONDS] [--problems a,b] [--fp16]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jitops  # noqa: E402
from jitops import engine  # noqa: E402
from jitops.bench.conv2d import PROBLEMS, op_problem, reference_f64  # noqa: E402
from jitops.bench.timing import Timer  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import Schedule  # noqa: E402

op = get_op("conv2d")


def sweep_candidates(p, device):
    """The tuning space, trimmed: splits only where the unsplit grid is under two waves."""
    out = []
    for s in op.candidates(p, device):
        if s.algorithm == "split_k" and int(s["split_k"]) not in (2, 3, 4, 6, 8, 16):
            continue
        if s.algorithm == "split_k":
            bm, bn = int(s["bm"]), int(s["bn"])
            blocks = -(-p.cout_g // bm) * -(-p.pixels // bn) * p.groups
            if blocks >= 2 * device.multiprocessors:
                continue
        if s.algorithm == "direct" and p.cout_g > 64:
            continue
        out.append(s)
    return out


def _compile_one(args):
    target, launch = args
    from jitops.cache import loader
    from jitops.runtime import get_backend
    be = get_backend(target=target)
    src = engine.kernel_source(be.device, launch)
    try:
        loader().binary(be, src, [launch.kernel], f"conv2d.{launch.kernel}")
        return None
    except Exception as exc:  # report, keep going
        return f"{launch.kernel}: {exc}"[:500]


def precompile(pairs, device, workers=14):
    launches = {}
    for p, s in pairs:
        plan = op.plan(p, s, device)
        for l in (*plan.prepare, *plan.launches):
            launches[engine.kernel_source(device, l)] = l
    t0 = time.time()
    with ProcessPoolExecutor(workers) as ex:
        errors = [e for e in ex.map(_compile_one, [(device.arch, l) for l in launches.values()]) if e]
    print(f"compiled {len(launches)} sources in {time.time() - t0:.1f} s; {len(errors)} errors", flush=True)
    for e in errors[:5]:
        print("  ", e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--problems", default="")
    ap.add_argument("--fp16", action="store_true")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    be = jitops.get_backend("cuda")
    device = be.device
    timer = Timer(torch)
    t_start = time.time()
    chosen = [cp for cp in PROBLEMS if not args.problems or cp.name in args.problems.split(",")]
    dtypes = ["float32"] + (["float16"] if args.fp16 else [])
    plan_pairs = []
    per_problem = {}
    for dtype in dtypes:
        for cp in chosen:
            p = op_problem(cp, dtype)
            cands = sweep_candidates(p, device) if dtype == "float32" else [op.heuristic(p, device)]
            heur = op.heuristic(p, device)
            if heur not in cands:
                cands.insert(0, heur)
            per_problem[(cp.name, dtype)] = (p, cands, heur)
            plan_pairs += [(p, s) for s in cands]
    precompile(plan_pairs, device)

    # Device ceilings: fp32 GEMM (no TF32) and copy bandwidth.
    a = torch.randn(8192, 8192, device="cuda")
    us = timer.per_call_us(lambda: a @ a, n=5, trials=3)
    gemm_tflops = 2 * 8192 ** 3 / (us * 1e-6) / 1e12
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    us = timer.per_call_us(lambda: dst.copy_(src), n=10, trials=3)
    copy_gbs = 2 * src.numel() * 4 / (us * 1e-6) / 1e9
    del a, src, dst
    print(f"{torch.cuda.get_device_name()} fp32 GEMM {gemm_tflops:.1f} TFLOP/s, copy {copy_gbs:.0f} GB/s", flush=True)

    results = {"device": torch.cuda.get_device_name(), "sms": device.multiprocessors, "gemm_tflops": gemm_tflops,
               "copy_gbs": copy_gbs, "problems": {}}
    budget_each = args.budget / max(1, len(per_problem))
    for (name, dtype), (p, cands, heur) in per_problem.items():
        cp = next(c for c in PROBLEMS if c.name == name)
        tdt = getattr(torch, dtype)
        x = torch.randn(cp.n, cp.cin, cp.h, cp.w, device="cuda").to(tdt)
        w = (torch.randn(cp.cout, cp.cin, cp.k, cp.k, device="cuda") / (cp.cin * cp.k * cp.k) ** 0.5).to(tdt)
        ref = reference_f64(torch, x, w, cp.pad)
        scale = float(ref.abs().max())
        out = torch.empty(ref.shape, device="cuda", dtype=tdt)
        entry = {"flops": p.flops, "rows": []}
        for bench_mode in (True, False):
            torch.backends.cudnn.benchmark = bench_mode
            fn = (lambda: torch.nn.functional.conv2d(x, w, padding=cp.pad))
            entry["cudnn_benchmark" if bench_mode else "cudnn_default"] = timer.graph_us(fn, n=10, trials=3)
        t_problem = time.time()
        for s in cands:
            if time.time() - t_problem > budget_each and s != heur:
                entry.setdefault("skipped", 0)
                entry["skipped"] += 1
                continue
            row = {"schedule": s.as_dict(), "text": str(s), "heuristic": s == heur,
                   "estimate_us": op_estimate(p, s, device)}
            try:
                out.fill_(float("nan"))
                jitops.conv2d(x, w, padding=cp.pad, out=out, schedule=s)
                torch.cuda.synchronize()
                err = float((out.double() - ref).abs().max()) / scale
                row["error"] = err
                row["ok"] = bool(err <= op.tolerance(p, s)[0] and not torch.isnan(out).any())
                row["us"] = timer.graph_us(lambda: jitops.conv2d(x, w, padding=cp.pad, out=out, schedule=s),
                                           n=10, trials=3)
            except Exception as exc:
                row["failure"] = f"{type(exc).__name__}: {exc}"[:300]
            entry["rows"].append(row)
        torch.backends.cudnn.benchmark = True
        entry["kernels_cudnn"] = kernel_times(lambda: torch.nn.functional.conv2d(x, w, padding=cp.pad))
        timed = [r for r in entry["rows"] if r.get("ok")]
        picks = {r["text"]: Schedule.from_dict(r["schedule"]) for r in timed if r["heuristic"]}
        for alg in ("winograd_4x4", "implicit_gemm", "gemm_1x1"):
            group = [r for r in timed if r["schedule"]["algorithm"] == alg]
            if group:
                r = min(group, key=lambda r: r["us"])
                picks[r["text"]] = Schedule.from_dict(r["schedule"])
        entry["kernels_jitops"] = {text: kernel_times(lambda s=s: jitops.conv2d(x, w, padding=cp.pad, out=out,
                                                                                 schedule=s))
                                   for text, s in picks.items()}
        results["problems"][f"{name} {dtype}"] = entry
        del x, w, ref, out
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print_table(results)
    print(f"sweep took {time.time() - t_start:.0f} s", flush=True)


def kernel_times(fn, calls=5):
    """Average device time per call of each kernel launched by fn (CUPTI through torch.profiler)."""
    try:
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        out = {}
        for evt in prof.key_averages():
            t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
            if t:
                out[evt.key[:90]] = round(t / calls, 2)
        return out
    except Exception as exc:  # profiling is a bonus
        return {"error": str(exc)[:200]}


def op_estimate(p, s, device):
    from jitops.ops.conv2d_schedules import estimate
    return estimate(p, s, device) * 1e6


def print_table(results):
    for name, e in results["problems"].items():
        rows = [r for r in e["rows"] if r.get("us")]
        bad = [r for r in e["rows"] if not r.get("ok", False)]
        cud = e["cudnn_benchmark"]
        print(f"\n{name}: cudnn {cud:.1f} us (default {e['cudnn_default']:.1f}); {len(rows)} timed, "
              f"{len(bad)} failed/wrong, {e.get('skipped', 0)} skipped")
        best = {}
        for r in rows:
            alg = r["schedule"]["algorithm"]
            if r.get("ok") and (alg not in best or r["us"] < best[alg]["us"]):
                best[alg] = r
        for alg, r in sorted(best.items(), key=lambda kv: kv[1]["us"]):
            print(f"  {alg:<13} {r['us']:9.1f} us  x{cud / r['us']:5.2f}  est {r['estimate_us']:8.1f}  {r['text']}")
        for k, v in e.get("kernels_cudnn", {}).items():
            print(f"    cudnn kernel {v:9.1f} us  {k}")
        for text, ks in e.get("kernels_jitops", {}).items():
            print(f"    kernels of {text}: " + ", ".join(f"{k.split('(')[0]} {v}" for k, v in ks.items()))
        h = next((r for r in e["rows"] if r["heuristic"]), None)
        if h:
            print(f"  HEURISTIC     {h.get('us', float('nan')):9.1f} us  est {h['estimate_us']:8.1f}  {h['text']}")
        for r in bad[:3]:
            print(f"  BAD {r['text']}: {r.get('error')} {r.get('failure', '')}")


if __name__ == "__main__":
    main()
