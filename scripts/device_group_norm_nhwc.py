"""channels_last group_norm on a GPU, every path side by side (issue 18, round 3: the one-launch
kernel rewritten after the H100 profile of 2026-11-25 showed a ~10 us serial chain).

    python3 scripts/device_group_norm_nhwc.py --out DIR     # -> DIR/group_norm_nhwc.json
    python3 scripts/device_group_norm_nhwc.py --dry         # the logic on the CPU emulator

For SD-UNet / SDXL shapes x fp16 / bf16 / fp32 (fp32 gamma and beta, 32 groups): every fitting
one-launch schedule (`group_norm_onchip.options`), the two launches, naive, the default call
(records included), torch's F.group_norm on the same channels_last tensor and a same-size copy.
Each schedule is checked against float64 (output poisoned with NaN) before it is timed; times are
CUDA-graph replays of 20 back-to-back calls, median of 5.
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
from jitops.errors import ScheduleError
from jitops.ops import get_op, group_norm_nhwc, group_norm_onchip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_memops import precompile, ref_group_norm, rel_err  # noqa: E402
from device_memops2 import gn_problem  # noqa: E402

F = torch.nn.functional
CL = torch.channels_last
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float32": 4e-6, "float16": 2e-3, "bfloat16": 5e-3}
SHAPES = [(2, 320, 64, 64), (2, 320, 32, 32), (2, 640, 32, 32), (2, 640, 16, 16), (2, 1280, 16, 16),
          (2, 1280, 8, 8), (2, 960, 32, 32), (2, 1920, 16, 16), (1, 320, 64, 64), (2, 640, 64, 64),
          (2, 1280, 32, 32), (8, 320, 64, 64)]
DEV = "cuda"


PICKS_ONLY = False


def schedules(prob, device) -> dict:
    """The heuristic, the two launches, naive, and (unless --picks) of the one-launch options for
    each (slice, threads): the fewest and the most rows (one chunk where it fits, else the
    resident grids)."""
    out = {"heuristic": get_op("group_norm").heuristic(prob, device)}
    for alg in ("nhwc", "naive"):
        out[alg] = group_norm_nhwc.heuristic(prob, device, alg)
    if PICKS_ONLY:
        return out
    by_family: dict = {}
    for _, s in group_norm_onchip.options(prob, device):
        by_family.setdefault((s["slice_groups"], s["threads"]), []).append(s)
    picked = []
    for fam in by_family.values():
        fam = sorted(fam, key=lambda s: int(s["rows"]))
        picked += [fam[0]] + ([fam[-1]] if len(fam) > 1 else [])
    for i, s in enumerate(picked):
        out[f"onchip{i}"] = s
    return out


def rows(timer, device, dtypes, n_rep) -> list[dict]:
    out = []
    for dtype in dtypes:
        for shape in SHAPES:
            c = shape[1]
            x = (torch.randn(shape, device=DEV) * 2 + 0.5).to(DT[dtype]).contiguous(memory_format=CL)
            g, b = torch.randn(c, device=DEV) * 0.5 + 1, torch.randn(c, device=DEV)
            ref = ref_group_norm(x, 32, g, b, 1e-5)
            prob = gn_problem(shape, dtype)
            row = {"shape": "x".join(map(str, shape)), "dtype": dtype, "bytes": 2 * x.numel() * x.element_size(),
                   "schedules": {}}
            res = torch.empty_like(x)
            for name, s in schedules(prob, device).items():
                res.fill_(float("nan"))
                try:
                    y = jitops.group_norm(x, 32, g, b, out=res, schedule=s)
                except ScheduleError as exc:
                    row["schedules"][name] = {"schedule": str(s), "error": str(exc)}
                    continue
                err = rel_err(y, ref)
                ok = err <= TOL[dtype] and not bool(torch.isnan(y).any())
                us = timer.graph_us(lambda s=s: jitops.group_norm(x, 32, g, b, out=res, schedule=s), n=n_rep)
                res.fill_(float("nan"))
                again = rel_err(jitops.group_norm(x, 32, g, b, out=res, schedule=s), ref) <= TOL[dtype]
                row["schedules"][name] = {"schedule": str(s), "params": dict(s.params), "algorithm": s.algorithm,
                                          "ok": ok and again, "error": err, "graph_us": us}
            o = torch.empty_like(x)
            gx, bx = g.to(x.dtype), b.to(x.dtype)
            row["default_graph_us"] = timer.graph_us(lambda: jitops.group_norm(x, 32, g, b, out=res), n=n_rep)
            row["copy_graph_us"] = timer.graph_us(lambda: o.copy_(x), n=n_rep)
            row["torch_graph_us"] = timer.graph_us(lambda: F.group_norm(x, 32, gx, bx), n=n_rep)
            timed = {k: v["graph_us"] for k, v in row["schedules"].items() if v.get("ok") and v.get("graph_us")}
            best = min(timed, key=timed.get) if timed else None
            row["best"] = best
            summary = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "schedules"}
            summary.update({k: round(v, 2) for k, v in timed.items() if not k.startswith("onchip")})
            if best:
                summary["best_us"] = round(timed[best], 2)
                summary["best_sched"] = row["schedules"][best]["schedule"]
            print(json.dumps(summary), flush=True)
            out.append(row)
    return out


def precompile_all(device, dtypes) -> dict:
    cases = []
    for dtype in dtypes:
        for shape in SHAPES:
            c = shape[1]
            x = torch.empty(shape, device=DEV, dtype=DT[dtype]).contiguous(memory_format=CL)
            t = {"x": x, "gamma": torch.empty(c, device=DEV), "beta": torch.empty(c, device=DEV)}
            for s in schedules(gn_problem(shape, dtype), device).values():
                cases.append({"label": f"gn {shape} {dtype}", "spec": ("group_norm", t, {"num_groups": 32}, s)})
    return precompile(cases)


def sanitize_cases() -> None:
    """Small one-launch cases for compute-sanitizer: slices with and without a barrier, the
    per-sample barrier, the heuristic's pick; bf16 / fp16 / fp32."""
    dev = jitops.get_backend().device
    cases = [((2, 40, 6, 6), 4, torch.bfloat16, dict(threads=32, rows=4, pixels_per_block=20, slice_groups=2, vec=4)),
             ((2, 40, 6, 6), 4, torch.float16, dict(threads=64, rows=3, pixels_per_block=36, slice_groups=1, vec=2)),
             ((1, 64, 5, 5), 8, torch.float32, dict(threads=32, rows=5, pixels_per_block=10, slice_groups=8, vec=4)),
             ((2, 320, 16, 16), 32, torch.float16, None)]
    for shape, groups, dt, params in cases:
        x = torch.randn(shape, device=DEV).to(dt).contiguous(memory_format=CL)
        g, b = torch.randn(shape[1], device=DEV), torch.randn(shape[1], device=DEV)
        prob = gn_problem(shape, str(dt).split(".")[1]) if groups == 32 else None
        s = None
        if params is not None:
            from jitops.ops.base import TensorSpec
            p = TensorSpec((shape[1],), "float32")
            prob = get_op("group_norm").make_problem(
                {"x": TensorSpec(shape, str(dt).split(".")[1], "nhwc"), "gamma": p, "beta": p}, {"num_groups": groups})
            s = group_norm_nhwc.heuristic(prob, dev, "onchip", **params)
        for _ in range(2):
            y = jitops.group_norm(x, groups, g, b, schedule=s)
            err = rel_err(y, ref_group_norm(x, groups, g, b, 1e-5))
            assert err <= TOL[str(dt).split(".")[1]], (shape, err)
    torch.cuda.synchronize()
    print("sanitize cases ok", flush=True)


def main() -> None:
    global DEV, SHAPES, PICKS_ONLY
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--picks", action="store_true", help="time the scheduler's picks only (not every option)")
    args = ap.parse_args()
    PICKS_ONLY = args.picks
    if args.sanitize:
        return sanitize_cases()
    t0 = time.time()
    dtypes = ("float16", "bfloat16", "float32")
    timer = Timer(torch if not args.dry else None)
    if args.dry:
        DEV, SHAPES = "cpu", [(2, 64, 4, 4)]
        timer.graph_us = lambda fn, n=20: (fn(), 1.0)[1]
    device = jitops.get_backend().device
    name = torch.cuda.get_device_name() if not args.dry else "dry run"
    copy_gbs = copy_bandwidth_gbs(timer) if not args.dry else 1.0
    print(f"{name} {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} copy {copy_gbs:.0f} GB/s", flush=True)
    pre = precompile_all(device, dtypes) if not args.dry else {}
    data = rows(timer, device, dtypes, 20)
    report = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "copy_gbs": copy_gbs,
              "torch": torch.__version__, "precompile": pre, "rows": data}
    with open(os.path.join(args.out, "group_norm_nhwc.json"), "w") as f:
        json.dump(report, f, indent=1)
    bad = [(r["shape"], r["dtype"], k) for r in data for k, v in r["schedules"].items() if v.get("ok") is False]
    print(f"{len(data)} rows, failed checks: {bad}, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
