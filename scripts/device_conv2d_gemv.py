"""The few-pixel 1x1 kernel (gemv_1x1) on the device: every distinct 1x1 layer of at most 64 pixels in the
given torchvision networks (squeeze-and-excitation convolutions at 1 x 1; channels_last layers at 7 x 7
batch 1), each of its schedules and the heuristic's pick without it, checked against float64 in a
NaN-filled output (no bias, as the pool sweeps; fp16 / bf16 / fp32), then timed by graph replay in alternating passes, cuDNN
(benchmark mode, its better layout) beside.

    python3 scripts/device_conv2d_gemv.py OUT_DIR [--nets efficientnet_b0:32,...] [--dtypes float16,float32]

Raw results: OUT_DIR/gemv_layers.json (rows as the pool sweeps': conv2d_pick_regret.py --extra merges their times).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.ops import conv2d_gemv as gemv  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402

from conv2d_devkit import CL, graph_us, ref_f64, rel_err, vendor_times  # noqa: E402
from conv2d_pick_regret import layout_of  # noqa: E402
from device_conv2d_pool_sweep import distinct_layers  # noqa: E402

NETS = ("efficientnet_b0:32,efficientnet_b3:32,mobilenet_v3_large:32,regnet_y_1_6gf:32,efficientnet_b0:8,"
        "mobilenet_v3_large:1,resnet50:1")
TOL = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 1e-5}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--nets", default=NETS)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    op = get_op("conv2d")
    device = jitops.get_backend().device
    rows = []
    for dtype in args.dtypes.split(","):
        td = getattr(torch, dtype)
        for name, xs, ws, attrs, count in distinct_layers(args.nets):
            p = op.make_problem({"x": TensorSpec(xs, dtype, layout_of(xs)), "w": TensorSpec(ws, dtype), "bias": None},
                                attrs)
            if gemv.why_not(p) is not None or p.pixels > gemv.RATED_PIXELS:
                continue
            pick = op.heuristic(p, device)
            saved, gemv.RATED_PIXELS = gemv.RATED_PIXELS, 0
            old = op.heuristic(p, device)
            gemv.RATED_PIXELS = saved
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(xs, device="cuda", dtype=td, generator=g).to(memory_format=CL)
            w = torch.randn(ws, device="cuda", dtype=td, generator=g) * ws[1] ** -0.5
            b = None                   # as the pool sweeps time them (their times merge: conv2d_pick_regret)
            ref = ref_f64(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
            scheds = {"old": old, **{f"tn{s['tn']}w{s['warps']}": s for s in gemv.candidates(p, device)}}
            errs, times = {}, {k: [] for k in scheds}
            for label, s in scheds.items():
                out = torch.full(tuple(ref.shape), float("nan"), dtype=td, device="cuda").to(memory_format=CL)
                errs[label] = rel_err(jitops.conv2d(x, w, b, out=out, schedule=s), ref)
            for n in range(args.passes):
                order = list(scheds.items())
                for label, s in (order if n % 2 == 0 else order[::-1]):
                    times[label].append(graph_us(lambda: jitops.conv2d(x, w, b, schedule=s)))
            best = {k: min(v) for k, v in times.items()}
            pick_label = f"tn{pick['tn']}w{pick['warps']}" if pick.algorithm == gemv.ALGORITHM else "old"
            cudnn = min(vendor_times(x.contiguous(), w, b, attrs, tf32=False).values())
            row = {"layer": name, "x": list(xs), "w": list(ws), "attrs": attrs, "dtype": dtype, "count": count,
                   "pick": str(pick), "old": str(old), "errs": errs, "us": best, "pick_us": best[pick_label],
                   "cudnn_us": cudnn, "times": {str(s): best[label] for label, s in scheds.items()}}
            rows.append(row)
            ok = all(e <= TOL[dtype] for e in errs.values())
            fastest = min((k for k in best if k != "old"), key=best.get)
            print(f"{name:46s} {dtype:8s} x{count} old {best['old']:5.1f}  pick {row['pick_us']:5.1f}  "
                  f"fastest {fastest} {best[fastest]:5.1f}  cuDNN {cudnn:5.1f} us  {'ok' if ok else 'WRONG'}", flush=True)
            with open(os.path.join(args.out, "gemv_layers.json"), "w") as f:
                json.dump(rows, f, indent=1)
    for dtype in args.dtypes.split(","):
        for net in sorted({r["layer"].rsplit(" ", 4)[0] for r in rows if r["dtype"] == dtype}):
            group = [r for r in rows if r["dtype"] == dtype and r["layer"].startswith(net + " ")]
            old, new, vendor = (sum(r["count"] * v(r) for r in group) for v in
                                (lambda r: r["us"]["old"], lambda r: r["pick_us"], lambda r: r["cudnn_us"]))
            geo = math.exp(sum(math.log(r["us"]["old"] / r["pick_us"]) for r in group) / len(group))
            print(f"  {net:26s} {dtype:8s} {len(group):2} layers: {old:7.1f} -> {new:7.1f} us ({old / new:.2f}x, "
                  f"geomean {geo:.2f}x); cuDNN {vendor:7.1f} ({vendor / old:.2f}x -> {vendor / new:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
