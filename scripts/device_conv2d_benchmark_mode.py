"""conv2d benchmark mode (jitops.set_benchmark) on the device, one call: the large benchmark and
real-network layers in fp16 / bf16 channels_last, each timed (graph replay) on the heuristic's pick
and on what benchmark mode chose, with the first call's wall time (compiling and timing the
shortlist), every output checked against float64 in a NaN-filled tensor; cuDNN (benchmark mode, its
best of NCHW / channels_last) beside; then whole torchvision networks with every conv swapped for
jitops.conv2d, heuristic and benchmark mode, against torch.

  python3 scripts/device_conv2d_benchmark_mode.py OUT_DIR [--dtypes float16,bfloat16] [--nets resnet50]
      [--batch 32] [--budget SECONDS]


Run it with a fresh JITOPS_CACHE_DIR: benchmark mode's choices are user records, and a second run
reads them instead of timing (its first calls then measure loading, not benchmarking).
Raw results: OUT_DIR/layers.json, OUT_DIR/networks.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops import engine  # noqa: E402
from jitops.bench.conv2d import PROBLEMS  # noqa: E402
from jitops.ops import get_op  # noqa: E402

from conv2d_devkit import CL, conv_case, geo, graph_us, pads4, pair, picked, ref_f64, rel_err, vendor_times  # noqa: E402
from device_conv2d_wgmma import BIG, TOL  # noqa: E402

T0 = time.time()
OP = get_op("conv2d")


def layers() -> list:
    out = [(cp.name, (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad})
           for cp in PROBLEMS if cp.name in ("k100_2", "k100_4", "k100_5", "large_spatial", "large_batch")]
    return out + [(f"big{i}", xs, ws, {"stride": st, "padding": pd}) for i, (xs, ws, st, pd) in enumerate(BIG)]


def checked_call(x, w, attrs, ref, tol) -> tuple[float, float]:
    """(wall seconds of one call into a NaN-filled output, its error against float64)."""
    out = torch.full(tuple(ref.shape), float("nan"), dtype=x.dtype, device="cuda").to(memory_format=CL)
    torch.cuda.synchronize()
    t = time.time()
    y = jitops.conv2d(x, w, out=out, **attrs)
    torch.cuda.synchronize()
    wall = time.time() - t
    err = rel_err(y, ref)
    if not err <= tol:
        raise AssertionError(f"error {err:.3e} > {tol}")
    return wall, err


def run_layers(args) -> list:
    rows = []
    dev = jitops.get_backend().device
    for dtype in args.dtypes.split(","):
        for label, xs, ws, attrs in layers():
            if time.time() - T0 > args.budget:
                print("layers: out of time", flush=True)
                return rows
            x, w, b, = conv_case(xs, ws, attrs, dtype)[:3]
            ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)), (1, 1), 1)
            xl = x.to(memory_format=CL)
            p, pick = picked(xs, ws, attrs, dtype)
            row = {"label": label, "dtype": dtype, "x": xs, "w": ws, "attrs": attrs, "pick": str(pick),
                   "cudnn": vendor_times(x, w, b, attrs)}
            try:
                jitops.set_benchmark(False)
                engine.clear_prepared()
                row["heuristic_first_s"], row["heuristic_err"] = checked_call(xl, w, attrs, ref, TOL[dtype])
                jitops.set_benchmark(True)
                engine.clear_prepared()
                row["benchmark_first_s"], row["benchmark_err"] = checked_call(xl, w, attrs, ref, TOL[dtype])
                sched, origin = engine.select_schedule(OP, p, dev)
                row["benchmark_pick"], row["origin"] = str(sched), origin
                # both schedules in turn, twice, the faster pass of each (long kernels drift by 5-9%
                # between timings of one process, so one timing each would compare drifts)
                times = {"heuristic_us": [], "benchmark_us": []}
                for _ in range(2):
                    for k, s in (("heuristic_us", pick), ("benchmark_us", sched)):
                        times[k].append(graph_us(lambda: jitops.conv2d(xl, w, schedule=s, **attrs)))
                row.update({k: min(v) for k, v in times.items()})
                row["same_schedule"] = sched == pick
            except Exception as exc:  # noqa: BLE001 - a failure is a result too
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            rows.append(row)
            cud = min(row["cudnn"].values())
            if "error" in row:
                print(f"{dtype:8} {label:14} ERROR {row['error']}", flush=True)
            else:
                print(f"{dtype:8} {label:14} cuDNN {cud:7.1f}  heuristic {row['heuristic_us']:7.1f} "
                      f"({cud / row['heuristic_us']:.2f}x)  benchmark {row['benchmark_us']:7.1f} "
                      f"({cud / row['benchmark_us']:.2f}x)  first call {row['benchmark_first_s']:.1f} s "
                      f"[{row['origin']}{', same' if row['same_schedule'] else ''}] {row['benchmark_pick'][:100]}",
                      flush=True)
            json.dump(rows, open(os.path.join(args.out, "layers.json"), "w"), indent=1)
    return rows


def run_networks(args) -> list:
    from device_conv2d_networks import run_net
    rows = []
    for dtype in args.dtypes.split(","):
        for name in args.nets.split(","):
            for mode in (False, True):
                if time.time() - T0 > args.budget:
                    print("networks: out of time", flush=True)
                    return rows
                jitops.set_benchmark(mode)
                engine.clear_prepared()
                try:
                    r = run_net(name, args.batch, getattr(torch, dtype))
                except Exception as exc:  # noqa: BLE001
                    r = {"net": name, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:400]}
                    print(f"{name} {dtype}: ERROR {r['error']}", flush=True)
                rows.append({**r, "benchmark_mode": mode})
                json.dump(rows, open(os.path.join(args.out, "networks.json"), "w"), indent=1)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--nets", default="resnet50")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--budget", type=float, default=480.0)
    ap.add_argument("--skip-layers", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    rows = [] if args.skip_layers else run_layers(args)
    for dtype in args.dtypes.split(","):
        done = [r for r in rows if r["dtype"] == dtype and "error" not in r]
        if done:
            h = geo([min(r["cudnn"].values()) / r["heuristic_us"] for r in done])
            m = geo([min(r["cudnn"].values()) / r["benchmark_us"] for r in done])
            g = geo([r["heuristic_us"] / r["benchmark_us"] for r in done])
            print(f"{dtype}: {len(done)} layers: vs cuDNN heuristic {h['geomean']:.3f}x (lowest {h['min']:.2f}), "
                  f"benchmark mode {m['geomean']:.3f}x (lowest {m['min']:.2f}); benchmark / heuristic "
                  f"{g['geomean']:.3f}x (lowest {g['min']:.2f}); first calls "
                  f"{sum(r['benchmark_first_s'] for r in done):.0f} s in all", flush=True)
    run_networks(args)
    print(f"==== {time.time() - T0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
