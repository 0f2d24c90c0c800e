"""The persistent wgmma conv2d grid on the device, one call: compute-sanitizer (memcheck, racecheck)
on blocks that loop over tiles, then graph-replay times against cuDNN (channels_last), every output
checked against float64 (NaN-poisoned) before it is timed.

  python3 scripts/device_conv2d_persistent.py OUT_DIR --sweep [--dtypes float16,tf32]
      every persistent candidate of the benchmark problems and the large layers, beside the pick
  python3 scripts/device_conv2d_persistent.py OUT_DIR --picks [--dtypes float16,tf32]
      the heuristic's pick against its non-persistent original where the pick is persistent,
      on the benchmark problems, the large layers and the torchvision layers (fp16)

Raw results: OUT_DIR/sweep.json or OUT_DIR/picks.json (docs/data/conv2d_persistent_h100_2026-11-25/).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.bench.conv2d import PROBLEMS  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402

from conv2d_devkit import CL, TensorSpec, conv_case, geo, op, pads4, pair, ref_f64, vendor_times  # noqa: E402
from device_conv2d_wgmma import BIG, TOL, timed  # noqa: E402


def small_cases() -> None:
    """fp16 and TF32 persistent tiles with 1 and 2 blocks per multiprocessor on 300 tiles (blocks
    loop), bias + residual + ReLU: what the sanitizers run."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for dt, extra in ((torch.float16, {}), (torch.float32, {"precision": "tf32"})):
        x = torch.randn(2, 64, 120, 160, device="cuda", generator=g).to(dt).to(memory_format=CL)
        w = (torch.randn(40, 64, 3, 3, device="cuda", generator=g) * 0.05).to(dt)
        b = torch.randn(40, device="cuda", generator=g).to(dt)
        r = torch.randn(2, 40, 120, 160, device="cuda", generator=g).to(dt).to(memory_format=CL)
        for tile in ((128, 128, 3, 0), (64, 128, 4, 0), (256, 128, 4, 0)):
            s = wg.schedule(*tile, bk=64 if dt != torch.float32 else 32, persistent=True)
            jitops.conv2d(x, w, b, padding=1, residual=r, activation="relu", schedule=s, **extra)
    torch.cuda.synchronize()
    print("small cases done", flush=True)


def items(with_layers: bool) -> list:
    out = [("bench", cp.name, (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}, False)
           for cp in PROBLEMS]
    out += [("big", f"big{i}", xs, ws, {"stride": st, "padding": pd}, False) for i, (xs, ws, st, pd) in enumerate(BIG)]
    if with_layers:
        from conv2d_layers import collect_layers
        for net, (xs, ws, st, pd, dl, g, has_b) in collect_layers():
            if g == 1 or ws[1] % 8 == 0 and g < ws[0]:
                out.append(("layers", net, xs, ws, {"stride": st, "padding": pd, "dilation": dl, "groups": g}, has_b))
    return out


def case(sec, xs, ws, attrs, has_b, dtype):
    tf32 = dtype == "tf32"
    dt = "float32" if tf32 else dtype
    a = {**attrs, **({"precision": "tf32"} if tf32 else {})}
    x, w, b = conv_case(xs, ws, attrs, dt, has_b)
    spec = {"x": TensorSpec(xs, dt, "nhwc"), "w": TensorSpec(ws, dt), "bias": TensorSpec((ws[0],), dt) if has_b else None}
    return x, w, b, a, op.make_problem(spec, a)


def measure(args) -> list:
    dev = jitops.get_backend().device
    rows, t0 = [], time.time()
    for dtype in args.dtypes.split(","):
        for sec, label, xs, ws, attrs, has_b in items(args.picks):
            if time.time() - t0 > args.budget:
                print("out of time", flush=True)
                return rows
            if dtype == "tf32" and sec == "layers":
                continue
            x, w, b, a, p = case(sec, xs, ws, attrs, has_b, dtype)
            pick = op.heuristic(p, dev)
            if args.picks and sec == "layers" and not wg.is_persistent(pick):
                continue                        # picks this change did not touch
            xl = x.to(memory_format=CL)
            ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)),
                          pair(attrs.get("dilation", 1)), attrs.get("groups", 1))
            row = {"section": sec, "label": label, "dtype": dtype, "x": xs, "w": ws, "attrs": attrs,
                   "cudnn_nhwc": vendor_times(x, w, b, attrs, tf32=dtype == "tf32")["nhwc"], "pick": str(pick),
                   "pick_us": timed(xl, w, b, a, None, ref, TOL[dtype])}
            if args.picks and wg.is_persistent(pick):
                orig = wg.schedule(*wg.tile_of(pick), bk=int(pick["bk"]))
                row["original_us"] = timed(xl, w, b, a, orig, ref, TOL[dtype])
            if args.sweep:
                row["persistent_us"] = {str(wg.tile_of(s)): timed(xl, w, b, a, s, ref, TOL[dtype])
                                        for s in wg.candidates(p, dev) if wg.is_persistent(s)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("attrs",)}), flush=True)
            json.dump(rows, open(os.path.join(args.out, "picks.json" if args.picks else "sweep.json"), "w"), indent=1)
    return rows


def summary(rows: list, dtypes: str) -> None:
    for dtype in dtypes.split(","):
        rs = [r for r in rows if r["dtype"] == dtype and isinstance(r["pick_us"], float)
              and isinstance(r.get("original_us"), float)]
        if rs:
            print(f"{dtype}: {len(rs)} persistent picks, {geo([r['original_us'] / r['pick_us'] for r in rs])} over the "
                  f"original; vs cuDNN {geo([r['cudnn_nhwc'] / r['original_us'] for r in rs])} -> "
                  f"{geo([r['cudnn_nhwc'] / r['pick_us'] for r in rs])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--picks", action="store_true")
    ap.add_argument("--small", action="store_true", help="(what the sanitizers run)")
    ap.add_argument("--dtypes", default="float16,tf32")
    ap.add_argument("--budget", type=float, default=300.0)
    args = ap.parse_args()
    if args.small:
        small_cases()
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    procs = {tool: subprocess.Popen(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable,
                                     __file__, "--small"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for tool in ("memcheck", "racecheck")}
    for tool, proc in procs.items():          # before the timings: the sanitized runs share the GPU
        text, _ = proc.communicate(timeout=300)
        print(f"sanitize {tool}: rc {proc.returncode}: {text.strip().splitlines()[-1] if text.strip() else ''}", flush=True)
    rows = measure(args)
    summary(rows, args.dtypes)


if __name__ == "__main__":
    main()
