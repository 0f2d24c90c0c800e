"""Whole torchvision networks with every conv swapped for jitops.conv2d (BN / ReLU left to torch on both
sides), under a set of the conv2d heuristic's H200 rules and without them, in alternating passes in one
process (the faster pass of each kept), against torch (cuDNN): what the rules change end to end, beside the
per-layer sweeps they were chosen on (scripts/device_conv2d_pool_sweep.py). With --layers, first every
distinct layer of those networks whose pick the rules change: both picks checked against float64 in a
NaN-filled output and timed by graph replay in alternating turns, cuDNN beside.

    python3 scripts/device_conv2d_rules_ab.py OUT_DIR [--rules h200_rules|rank_fit|gemv|a_rows|deep_ring|strided_1x1] [--nets resnet50,...]
        [--batch 32] [--dtypes float16] [--passes 2] [--layers resnet50:32,resnet101:32,...]

h200_rules (2026-11-29 11:00): without them TMA_LONE_SHARE 0.5 (a lone block charged two waves),
TMA_MARGIN_WHOLE = TMA_MARGIN, TMA_WIDE_FILTER_MIN_COUT 0, TMA_MIN_FLOPS_FAST_MEMORY = TMA_MIN_FLOPS.
rank_fit (2026-11-29 14:10): without it no TMA_RATE_FAST_MEMORY_SCALE (scripts/conv2d_tma_rank_fit.py).
gemv (2026-11-29 16:00): without it conv2d_gemv.RATED_PIXELS 0 (the few-pixel 1x1 kernel never taken).
a_rows (2026-11-29 19:30): without it TMA_A_ROWS False (1x1 stride-1 layers read A through the im2col map).
deep_ring (2026-11-29 20:50): without it no TMA_ONE_WAVE_DEEPER (one-wave grids keep the shallow rings).
strided_1x1 (2026-11-29 20:57): without it a strided 1x1 filter is charged the whole input (STRIDED_1X1_MIN_PIXEL_BYTES inf).
Raw results: OUT_DIR/rules_ab.json, OUT_DIR/layers_ab_DTYPE.json.
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
from jitops import engine  # noqa: E402
from jitops.ops import conv2d_gemv as gemv  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402

from device_conv2d_networks import run_net  # noqa: E402

# name: (module, its constants without the rules, with them)
RULES = {
    "h200_rules": (wg, {"TMA_LONE_SHARE": 0.5, "TMA_MARGIN_WHOLE": wg.TMA_MARGIN, "TMA_WIDE_FILTER_MIN_COUT": 0,
                    "TMA_MIN_FLOPS_FAST_MEMORY": wg.TMA_MIN_FLOPS},
                   {"TMA_LONE_SHARE": wg.TMA_LONE_SHARE, "TMA_MARGIN_WHOLE": wg.TMA_MARGIN_WHOLE,
                    "TMA_WIDE_FILTER_MIN_COUT": wg.TMA_WIDE_FILTER_MIN_COUT,
                    "TMA_MIN_FLOPS_FAST_MEMORY": wg.TMA_MIN_FLOPS_FAST_MEMORY}),
    "rank_fit": (wg, {"TMA_RATE_FAST_MEMORY_SCALE": {}},
                 {"TMA_RATE_FAST_MEMORY_SCALE": wg.TMA_RATE_FAST_MEMORY_SCALE}),
    "gemv": (gemv, {"RATED_PIXELS": 0}, {"RATED_PIXELS": gemv.RATED_PIXELS}),
    "a_rows": (wg, {"TMA_A_ROWS": False}, {"TMA_A_ROWS": wg.TMA_A_ROWS}),
    "deep_ring": (wg, {"TMA_ONE_WAVE_DEEPER": {}}, {"TMA_ONE_WAVE_DEEPER": wg.TMA_ONE_WAVE_DEEPER}),
    "strided_1x1": (wg, {"STRIDED_1X1_MIN_PIXEL_BYTES": math.inf},
                    {"STRIDED_1X1_MIN_PIXEL_BYTES": wg.STRIDED_1X1_MIN_PIXEL_BYTES}),
}
TOL = {"float16": 4e-3, "bfloat16": 2e-2}


def apply(consts: tuple) -> None:
    """consts: (module, {name: value})."""
    module, values = consts
    for k, v in values.items():
        setattr(module, k, v)
    engine.clear_prepared()                 # picks are made again under these constants


def layers_ab(nets: str, old: tuple, new: tuple, out_dir: str, dtype: str = "float16") -> None:
    """Every distinct layer whose channels_last pick (fp16 or bf16) the rules change: both picks checked and timed."""
    import jitops
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    from conv2d_devkit import CL, graph_us, pads4, pair, ref_f64, rel_err, vendor_times
    from device_conv2d_pool_sweep import distinct_layers
    op = get_op("conv2d")
    device = jitops.get_backend().device
    rows, same = [], 0
    for name, xs, ws, attrs, count in distinct_layers(nets):
        p = op.make_problem({"x": TensorSpec(xs, dtype, "nhwc"), "w": TensorSpec(ws, dtype), "bias": None},
                            attrs)
        apply(old)
        s_old = op.heuristic(p, device)
        apply(new)
        s_new = op.heuristic(p, device)
        if s_old == s_new:
            same += 1
            continue
        g = torch.Generator(device="cuda").manual_seed(0)
        td = getattr(torch, dtype)
        x = torch.randn(xs, device="cuda", dtype=td, generator=g).to(memory_format=CL)
        w = torch.randn(ws, device="cuda", dtype=td, generator=g) * (ws[1] * ws[2] * ws[3]) ** -0.5
        ref = ref_f64(x, w, None, pair(attrs["stride"]), pads4(attrs["padding"]), pair(attrs["dilation"]), 1)
        errs, times = {}, {"old": [], "new": []}
        for label, s in (("old", s_old), ("new", s_new)):
            out = torch.full(tuple(ref.shape), float("nan"), dtype=x.dtype, device="cuda").to(memory_format=CL)
            errs[label] = rel_err(jitops.conv2d(x, w, out=out, schedule=s, **attrs), ref)
        for _ in range(2):
            for label, s in (("old", s_old), ("new", s_new)):
                times[label].append(graph_us(lambda: jitops.conv2d(x, w, schedule=s, **attrs)))
        cudnn = min(vendor_times(x.contiguous(), w, None, attrs).values())
        row = {"layer": name, "dtype": dtype, "count": count, "old": str(s_old), "new": str(s_new), "errs": errs,
               "old_us": min(times["old"]), "new_us": min(times["new"]), "times": times, "cudnn_us": cudnn}
        rows.append(row)
        ok = all(e <= TOL[dtype] for e in errs.values())
        print(f"{name:44s} x{count} old {row['old_us']:6.1f} new {row['new_us']:6.1f} us "
              f"({row['old_us'] / row['new_us']:.2f}x)  cuDNN {cudnn:6.1f}  {'ok' if ok else 'WRONG'}", flush=True)
        with open(os.path.join(out_dir, f"layers_ab_{dtype}.json"), "w") as f:
            json.dump(rows, f, indent=1)
    nets_seen = sorted({r["layer"].rsplit(" ", 4)[0] for r in rows})
    for net in nets_seen:
        group = [r for r in rows if r["layer"].startswith(net + " ")]
        t_old, t_new = (sum(r["count"] * r[k] for r in group) for k in ("old_us", "new_us"))
        print(f"  {net:24s} {len(group):2} changed layers: {t_old:7.1f} -> {t_new:7.1f} us ({t_old / t_new:.3f}x)")
    print(f"  {len(rows)} layers changed, {same} unchanged", flush=True)
    apply(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--nets", default="resnet50,densenet121,efficientnet_b0,mobilenet_v3_large")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rules", choices=sorted(RULES), default="rank_fit")
    ap.add_argument("--layers", default="", help="net:batch,...: time the layers whose picks change first")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    module, old_values, new_values = RULES[args.rules]
    old, new = (module, old_values), (module, new_values)
    if args.layers:
        for dtype in [d for d in args.dtypes.split(",") if d]:
            layers_ab(args.layers, old, new, args.out, dtype)
    rows = []
    for dtype in [d for d in args.dtypes.split(",") if d]:
        for net in [n for n in args.nets.split(",") if n]:
            res = {"old": [], "new": []}
            for _ in range(args.passes):
                for label, consts in (("old", old), ("new", new)):
                    apply(consts)
                    print(f"  {label}: ", end="", flush=True)
                    res[label].append(run_net(net, args.batch, getattr(torch, dtype)))
            best = {k: min(v, key=lambda r: r["jitops_us"]) for k, v in res.items()}
            torch_us = min(min(r["torch_us"], r["torch_us_2"]) for v in res.values() for r in v)
            row = {"net": net, "dtype": dtype, "batch": args.batch, "rules": args.rules, "torch_us": torch_us,
                   "old_us": best["old"]["jitops_us"], "new_us": best["new"]["jitops_us"], "passes": res}
            rows.append(row)
            print(f"{net:20} b{args.batch} {dtype:8} torch {torch_us:8.0f} us  without {row['old_us']:8.0f} us "
                  f"({torch_us / row['old_us']:.3f}x)  with {row['new_us']:8.0f} us ({torch_us / row['new_us']:.3f}x)"
                  f"  with / without {row['old_us'] / row['new_us']:.3f}x", flush=True)
            with open(os.path.join(args.out, "rules_ab.json"), "w") as f:
                json.dump(rows, f, indent=1)
    apply(new)


if __name__ == "__main__":
    main()
