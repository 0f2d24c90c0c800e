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
from jitops.bench.conv2d import PROBLEMS, reference_f64  # noqa: E402
from jitops.bench.timing import Timer  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import Schedule  # noqa: E402

op = get_op("conv2d")

# Beyond the benchmark: common network layers (strided, grouped, depthwise, stems, batched 1x1),
# so that the fitted model is not tuned to stride-1 shapes alone. (name, x, w, attrs)
EXTRA = [
    ("resnet_stem", (1, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}),
    ("resnet_3x3_s2", (1, 128, 56, 56), (128, 128, 3, 3), {"stride": 2, "padding": 1}),
    ("resnet_1x1_s2", (1, 256, 56, 56), (512, 256, 1, 1), {"stride": 2}),
    ("resnet_b32_3x3", (32, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}),
    ("resnet_b32_1x1", (32, 256, 56, 56), (64, 256, 1, 1), {}),
    ("resnext_g32", (1, 128, 56, 56), (128, 4, 3, 3), {"padding": 1, "groups": 32}),
    ("depthwise_112", (1, 32, 112, 112), (32, 1, 3, 3), {"padding": 1, "groups": 32}),
    ("depthwise_s2_b8", (8, 144, 56, 56), (144, 1, 3, 3), {"padding": 1, "groups": 144, "stride": 2}),
    ("dilated_3x3", (1, 256, 32, 32), (256, 256, 3, 3), {"padding": 2, "dilation": 2}),
    ("unet_3x3_c512", (1, 512, 32, 32), (512, 512, 3, 3), {"padding": 1}),
]
EXTRA_TILES = [(32, 32, 8, 4, 4), (64, 32, 8, 8, 4), (32, 64, 8, 4, 8), (128, 32, 8, 8, 4),
               (128, 128, 16, 8, 8), (64, 128, 16, 8, 8), (64, 64, 16, 8, 8), (32, 128, 16, 4, 8)]


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
        if s.algorithm == "direct" and p.cout_g > 64 and not (s["th"] == 8 and s["pw"] == 2 and s["splits"] in (1, 4)):
            continue
        out.append(s)
    from jitops.ops.conv2d_schedules import direct_schedule, gemm_schedule, winograd_schedule
    from jitops.errors import ScheduleError
    extra = []
    for tile in EXTRA_TILES:
        extra.append(gemm_schedule("gemm_1x1" if p.is_pointwise else "implicit_gemm", tile))
        if p.winograd_ok:
            extra.append(winograd_schedule("winograd_4x4", tile))
        blocks = -(-p.cout_g // tile[0]) * -(-p.pixels // tile[1]) * p.groups
        if blocks < 2 * device.multiprocessors:
            extra += [gemm_schedule("split_k", tile, k) for k in (2, 4, 8)]
    if p.cout_g <= 64:
        extra += [direct_schedule(8, 32, pw, 16, 8, sp) for pw in (1, 2) for sp in (1, 4)]
        extra += [direct_schedule(2, 64, 2, 8, 8, sp) for sp in (1, 4)]
    for s in extra:
        try:
            op.plan(p, s, device)
            out.append(s)
        except ScheduleError:
            pass
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
    ap.add_argument("--no-extra", action="store_true")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    be = jitops.get_backend("cuda")
    device = be.device
    timer = Timer(torch)
    t_start = time.time()
    specs = [(cp.name, (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad})
             for cp in PROBLEMS] + ([] if args.no_extra else EXTRA)
    chosen = [sp for sp in specs if not args.problems or sp[0] in args.problems.split(",")]
    dtypes = ["float32"] + (["float16"] if args.fp16 else [])
    plan_pairs = []
    per_problem = {}
    from jitops.ops.base import TensorSpec
    for dtype in dtypes:
        for name, xs, ws, attrs in chosen:
            p = op.make_problem({"x": TensorSpec(xs, dtype), "w": TensorSpec(ws, dtype)}, attrs)
            cands = sweep_candidates(p, device) if dtype == "float32" else [op.heuristic(p, device)]
            heur = op.heuristic(p, device)
            # Most promising first, so that a problem's time budget drops the least likely ones.
            cands = [heur] + sorted((c for c in cands if c != heur), key=lambda c: op_estimate(p, c, device))
            per_problem[(name, dtype)] = (p, cands, heur, (xs, ws, attrs))
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
    a = src = dst = None   # free the device memory
    print(f"{torch.cuda.get_device_name()} fp32 GEMM {gemm_tflops:.1f} TFLOP/s, copy {copy_gbs:.0f} GB/s", flush=True)

    results = {"device": torch.cuda.get_device_name(), "sms": device.multiprocessors, "gemm_tflops": gemm_tflops,
               "copy_gbs": copy_gbs, "problems": {}}
    budget_each = args.budget / max(1, len(per_problem))
    for (name, dtype), (p, cands, heur, (xs, ws, attrs)) in per_problem.items():
        tdt = getattr(torch, dtype)
        x = torch.randn(*xs, device="cuda").to(tdt)
        w = (torch.randn(*ws, device="cuda") / (ws[1] * ws[2] * ws[3]) ** 0.5).to(tdt)
        tattrs = {k: v for k, v in attrs.items()}
        if p.winograd_ok or p.is_pointwise or (p.stride == (1, 1) and p.groups == 1 and p.dilation == (1, 1)):
            ref = reference_f64(torch, x, w, p.pad[0])
        else:
            ref = torch.nn.functional.conv2d(x.double(), w.double(), **tattrs)
        scale = float(ref.abs().max())
        out = torch.empty(ref.shape, device="cuda", dtype=tdt)
        entry = {"flops": p.flops, "rows": [], "spec": {"x": xs, "w": ws, "attrs": attrs, "dtype": dtype}}
        for bench_mode in (True, False):
            torch.backends.cudnn.benchmark = bench_mode
            fn = (lambda: torch.nn.functional.conv2d(x, w, **tattrs))
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
                jitops.conv2d(x, w, out=out, schedule=s, **tattrs)
                torch.cuda.synchronize()
                err = float((out.double() - ref).abs().max()) / scale
                row["error"] = err
                row["ok"] = bool(err <= op.tolerance(p, s)[0] and not torch.isnan(out).any())
                row["us"] = timer.graph_us(lambda: jitops.conv2d(x, w, out=out, schedule=s, **tattrs),
                                           n=10, trials=3)
            except Exception as exc:
                row["failure"] = f"{type(exc).__name__}: {exc}"[:300]
            entry["rows"].append(row)
        torch.backends.cudnn.benchmark = True
        entry["kernels_cudnn"] = kernel_times(lambda: torch.nn.functional.conv2d(x, w, **tattrs))
        timed = [r for r in entry["rows"] if r.get("ok")]
        picks = {r["text"]: Schedule.from_dict(r["schedule"]) for r in timed if r["heuristic"]}
        for alg in ("winograd_4x4", "implicit_gemm", "gemm_1x1"):
            group = [r for r in timed if r["schedule"]["algorithm"] == alg]
            if group:
                r = min(group, key=lambda r: r["us"])
                picks[r["text"]] = Schedule.from_dict(r["schedule"])
        entry["kernels_jitops"] = {text: kernel_times(lambda s=s: jitops.conv2d(x, w, out=out, schedule=s,
                                                                                 **tattrs))
                                   for text, s in picks.items()}
        results["problems"][f"{name} {dtype}"] = entry
        x = w = ref = out = None   # free the device memory before the next problem
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
