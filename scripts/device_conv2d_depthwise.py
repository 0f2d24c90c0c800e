"""Depthwise conv2d layers of real networks on a GPU: every depthwise output tile (and the direct
kernel, the NCHW pick before the depthwise kernel read NCHW) against cuDNN on the same tensors,
NCHW and channels_last, each checked against float64 with the output NaN-poisoned first, then timed
by CUDA-graph replay. The sweep behind `conv2d_depthwise.heuristic`.

    python3 scripts/device_conv2d_depthwise.py OUT_DIR [--nets mobilenet_v3_large,efficientnet_b0,convnext_tiny]
        [--dtypes float16,bfloat16,float32] [--batch 8] [--picks] [--sanitize]

--picks times only the heuristic's pick; --sanitize runs a few small cases once (for compute-sanitizer).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from conv2d_devkit import CL, TDT, graph_us, pads4, picked, ref_f64, rel_err  # noqa: E402

import jitops  # noqa: E402
from jitops.ops import conv2d_depthwise  # noqa: E402
from jitops.ops.conv2d_schedules import direct_schedule  # noqa: E402

NETS = ("mobilenet_v3_large", "efficientnet_b0", "convnext_tiny")
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5}


def depthwise_layers(nets: list[str], batch: int) -> list[dict]:
    """Distinct depthwise convs (groups = in = out channels) of the networks, by forward hooks."""
    import torchvision.models as tvm
    seen, out = set(), []
    for name in nets:
        model = getattr(tvm, name)().eval().cuda()

        def hook(mod, inp, _o, name=name):
            key = (tuple(inp[0].shape), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation, mod.groups)
            if mod.groups == mod.in_channels == mod.out_channels and key not in seen:
                seen.add(key)
                out.append({"net": name, "x": key[0], "w": key[1], "attrs": {
                    "stride": key[2], "padding": key[3], "dilation": key[4], "groups": key[5]}})
        hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            model(torch.randn(batch, 3, 224, 224, device="cuda"))
        for h in hs:
            h.remove()
    return out


def check_and_time(x, w, attrs, schedule, ref) -> dict:
    y = jitops.conv2d(x, w, None, schedule=schedule, **attrs)
    y.fill_(float("nan"))
    jitops.conv2d(x, w, None, schedule=schedule, out=y, **attrs)
    torch.cuda.synchronize()
    err = rel_err(y.float(), ref) if not torch.isnan(y).any() else float("inf")
    return {"err": err, "us": graph_us(lambda: jitops.conv2d(x, w, None, schedule=schedule, out=y, **attrs))}


def sweep(layers: list[dict], dtypes: list[str], picks_only: bool, save) -> list[dict]:
    rows = []
    dev = jitops.get_backend().device
    for lay in layers:
        xs, ws, attrs = lay["x"], lay["w"], lay["attrs"]
        for dtype in dtypes:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(xs, device="cuda", generator=g).to(TDT[dtype])
            w = (torch.randn(ws, device="cuda", generator=g) / math.sqrt(ws[2] * ws[3])).to(TDT[dtype])
            ref = ref_f64(x, w, None, attrs["stride"], pads4(attrs["padding"]), attrs["dilation"], attrs["groups"])
            cudnn = {}
            for layout in ("nchw", "nhwc"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                wl = w.to(memory_format=CL) if layout == "nhwc" else w
                st, pd, dl, gr = attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"]
                cudnn[layout] = graph_us(lambda: F.conv2d(xl, wl, None, st, pd, dl, gr))
            for layout in ("nchw", "nhwc"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                p, pick = picked(xs, ws, attrs, dtype, layout)
                scheds = [pick] if picks_only else conv2d_depthwise.candidates(p) + [pick]
                if layout == "nchw" and not picks_only:
                    scheds.append(direct_schedule(8, 32 if p.ow > 16 else 16, 2, 1, 1))   # the pick before
                seen = set()
                for s in scheds:
                    if str(s) in seen:
                        continue
                    seen.add(str(s))
                    r = check_and_time(xl, w, attrs, s, ref)
                    rows.append({"net": lay["net"], "x": xs, "w": ws, "attrs": attrs, "dtype": dtype,
                                 "layout": layout, "schedule": str(s), "pick": str(s) == str(pick), **r,
                                 "ok": r["err"] <= TOL[dtype], "cudnn_us": cudnn[layout],
                                 "cudnn_best_us": min(cudnn.values())})
                pk = next(r for r in rows[-len(seen):] if r["pick"])
                best = min((r for r in rows[-len(seen):] if r["ok"]), key=lambda r: r["us"], default=pk)
                print(f"{lay['net'][:12]:12} x={xs} k={ws[2]}x{ws[3]} s={attrs['stride'][0]} {dtype:8} {layout}: "
                      f"pick {pk['us']:6.1f} ({pk['schedule'][10:]}) best {best['us']:6.1f} ({best['schedule'][10:]}) "
                      f"cuDNN {cudnn[layout]:6.1f} / best {min(cudnn.values()):6.1f}  pick ratio "
                      f"{min(cudnn.values()) / pk['us']:.2f}", flush=True)
        save(rows)
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print("WRONG:", r, flush=True)
    return rows


def summary(rows: list[dict]) -> None:
    def gm(v):
        return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
    for dtype in sorted({r["dtype"] for r in rows}):
        for layout in ("nchw", "nhwc"):
            picks = [r for r in rows if r["pick"] and r["dtype"] == dtype and r["layout"] == layout]
            if not picks:
                continue
            key = lambda r: (str(r["x"]), str(r["w"]), str(r["attrs"]))  # noqa: E731
            best = {}
            for r in rows:
                if r["dtype"] == dtype and r["layout"] == layout and r["ok"]:
                    best[key(r)] = min(best.get(key(r), 1e9), r["us"])
            print(f"{dtype:8} {layout}: {len(picks)} layers, pick vs cuDNN same layout "
                  f"{gm([r['cudnn_us'] / r['us'] for r in picks]):.3f} (min "
                  f"{min(r['cudnn_us'] / r['us'] for r in picks):.2f}), vs cuDNN best layout "
                  f"{gm([r['cudnn_best_us'] / r['us'] for r in picks]):.3f}, pick / fastest tile "
                  f"{gm([r['us'] / best[key(r)] for r in picks]):.3f} (worst "
                  f"{max(r['us'] / best[key(r)] for r in picks):.2f})", flush=True)


def sanitize_cases() -> None:
    """Small cases of every branch for compute-sanitizer: both layouts, bf16's word loads (NHWC),
    tiles past the edges, bias, residual, activation, stride."""
    for layout, dtype in (("nchw", torch.float16), ("nhwc", torch.float16), ("nhwc", torch.bfloat16)):
        for (xs, ws, attrs), tile in ((((2, 24, 9, 11), (24, 1, 3, 3), {"padding": 1, "groups": 24}), (2, 4)),
                                      (((1, 16, 13, 12), (16, 1, 5, 5), {"padding": 2, "stride": 2, "groups": 16}), (2, 2)),
                                      (((1, 8, 10, 9), (8, 1, 7, 7), {"padding": 3, "groups": 8}), (4, 4))):
            x = torch.randn(xs, device="cuda", dtype=dtype)
            x = x.to(memory_format=CL) if layout == "nhwc" else x
            w = torch.randn(ws, device="cuda", dtype=dtype)
            b = torch.randn(ws[0], device="cuda", dtype=dtype)
            y = jitops.conv2d(x, w, b, schedule=conv2d_depthwise.schedule(*tile), **attrs)
            jitops.conv2d(x, w, b, residual=y.clone(), activation="relu", schedule=conv2d_depthwise.schedule(*tile),
                          **attrs)
    torch.cuda.synchronize()
    print("sanitize cases ran", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--picks", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    if args.sanitize:
        sanitize_cases()
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    layers = depthwise_layers(args.nets.split(","), args.batch)
    print(f"{len(layers)} depthwise layers", flush=True)
    path = os.path.join(args.out, f"depthwise_{'picks' if args.picks else 'sweep'}.json")

    def save(rows: list[dict]) -> None:         # after every layer: a run cut short keeps its rows
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, f)
    summary(sweep(layers, args.dtypes.split(","), args.picks, save))


if __name__ == "__main__":
    main()
