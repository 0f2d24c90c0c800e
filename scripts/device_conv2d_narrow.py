"""conv2d's 160-channel TMA tiles on the device, one call: Stable Diffusion's 320-channel layers (SD 1.5 /
SDXL UNet first level at 64 x 64 / 96 x 96 / 128 x 128 latents, batch 1-8; the up blocks' 640 / 960 -> 320;
the 320 -> 640 first conv of the second level; 960 -> 320 1x1 shortcuts) and the large 640 / 1280-channel
layers, which 160-wide tiles divide in fewer tiles in fp16 / bf16 / fp32 with TF32,
channels_last: the heuristic's pick with the narrow tiles and without them (the pick before 2026-11-29),
each checked against float64 in a NaN-filled output first, then timed by graph replay in alternating passes
(the faster of two kept), beside cuDNN (benchmark mode, its best of NCHW / channels_last).

    python3 scripts/device_conv2d_narrow.py OUT_DIR [--dtypes float16,bfloat16,float32] [--networks [--batch 32]]

--networks: instead, every distinct conv layer of torchvision networks (forward hooks, random weights) whose
pick the narrow tiles change (offered only where 160-wide tiles pad Cout less than 128-wide ones), timed the
same way (a pick that loses there is a regression). Raw results: OUT_DIR/narrow.json, OUT_DIR/networks.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402

from conv2d_devkit import CL, TDT, graph_us, pads4, ref_f64, rel_err, vendor_times  # noqa: E402

OP = get_op("conv2d")
# (name, x shape, w shape, padding)
LAYERS = [("SD1.5 b2 64x64 320->320 3x3", (2, 320, 64, 64), (320, 320, 3, 3), 1),
          ("SD1.5 b1 64x64 320->320 3x3", (1, 320, 64, 64), (320, 320, 3, 3), 1),
          ("SD1.5 b4 64x64 320->320 3x3", (4, 320, 64, 64), (320, 320, 3, 3), 1),
          ("SD1.5 b8 64x64 320->320 3x3", (8, 320, 64, 64), (320, 320, 3, 3), 1),
          ("SD2 b2 96x96 320->320 3x3", (2, 320, 96, 96), (320, 320, 3, 3), 1),
          ("SDXL b2 128x128 320->320 3x3", (2, 320, 128, 128), (320, 320, 3, 3), 1),
          ("SD1.5 up b2 64x64 640->320 3x3", (2, 640, 64, 64), (320, 640, 3, 3), 1),
          ("SD1.5 up b2 64x64 960->320 3x3", (2, 960, 64, 64), (320, 960, 3, 3), 1),
          ("SD1.5 up b2 64x64 960->320 1x1", (2, 960, 64, 64), (320, 960, 1, 1), 0),
          ("SD1.5 b2 32x32 320->640 3x3", (2, 320, 32, 32), (640, 320, 3, 3), 1),
          # 640 / 1280 output channels: 160-wide tiles divide them too (4 / 8 tiles instead of 5 / 10)
          ("k100_4 2x1920x32x32 -> 640 3x3", (2, 1920, 32, 32), (640, 1920, 3, 3), 1),
          ("k100_5 / big SD 2x640x64x64 -> 640 3x3", (2, 640, 64, 64), (640, 640, 3, 3), 1),
          ("big1 SD 2x640x32x32 -> 640 3x3", (2, 640, 32, 32), (640, 640, 3, 3), 1),
          ("big2 SD 2x1280x16x16 -> 1280 3x3", (2, 1280, 16, 16), (1280, 1280, 3, 3), 1),
          ("big3 SD 2x2560x16x16 -> 1280 3x3", (2, 2560, 16, 16), (1280, 2560, 3, 3), 1)]
TOL = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 4e-3}


def old_pick(p, device):
    """The heuristic's schedule without the narrow tiles (main before them)."""
    saved = wg.TMA_TILES
    wg.TMA_TILES = tuple(t for t in saved if t not in wg.NARROW_TILES)
    try:
        return OP.heuristic(p, device)
    finally:
        wg.TMA_TILES = saved


NETS = (("resnet50", 224), ("efficientnet_b0", 224), ("efficientnet_b3", 300), ("inception_v3", 299),
        ("regnet_y_1_6gf", 224), ("mobilenet_v3_large", 224), ("densenet121", 224), ("convnext_tiny", 224))


def network_layers(batch: int) -> list:
    """(name, x shape, w shape, padding) of the distinct ungrouped, unstrided, undilated convolutions of NETS."""
    import torchvision.models as tvm
    seen, out = set(), []
    for net, size in NETS:
        model = getattr(tvm, net)(**({"aux_logits": True, "init_weights": False} if net == "inception_v3" else {}))
        model = model.eval()
        found = []

        def hook(mod, inp, _out, found=found):
            if mod.groups == 1 and mod.stride == (1, 1) and mod.dilation == (1, 1) and mod.padding[0] == mod.padding[1] \
                    and mod.kernel_size[0] == mod.kernel_size[1]:
                found.append((tuple(inp[0].shape), tuple(mod.weight.shape), mod.padding[0]))
        hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            model(torch.randn(1, 3, size, size))
        for h in hooks:
            h.remove()
        for xs, ws, pad in found:
            key = ((batch, *xs[1:]), ws, pad)
            if key not in seen:
                seen.add(key)
                out.append((f"{net} {xs[1]}->{ws[0]} {ws[2]}x{ws[3]} @{xs[2]}x{xs[3]}", *key))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--networks", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = jitops.get_backend().device
    print(torch.cuda.get_device_name(), flush=True)
    rows = []
    layers = network_layers(args.batch) if args.networks else LAYERS
    out_name = "networks.json" if args.networks else "narrow.json"
    if args.networks:
        print(f"{len(layers)} distinct layers at batch {args.batch}", flush=True)
    for dtype in args.dtypes.split(","):
        extra = {"precision": "tf32"} if dtype == "float32" else {}
        for name, xs, ws, pad in layers:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(xs, device="cuda", dtype=TDT[dtype], generator=g).to(memory_format=CL)
            w = (torch.randn(ws, device="cuda", dtype=TDT[dtype], generator=g) * (ws[1] * ws[2] * ws[3]) ** -0.5)
            spec = {"x": TensorSpec(xs, dtype, "nhwc"), "w": TensorSpec(ws, dtype), "bias": None}
            p = OP.make_problem(spec, {"padding": pad, **extra})
            picks = {"new": OP.heuristic(p, device), "old": old_pick(p, device)}
            if args.networks and str(picks["new"]) == str(picks["old"]):
                continue                                          # unchanged: nothing to compare
            ref = ref_f64(x, w, None, (1, 1), pads4(pad), (1, 1), 1)
            row = {"layer": name, "dtype": dtype, "picks": {k: str(s) for k, s in picks.items()}}
            for label, s in picks.items():
                out = torch.full(tuple(ref.shape), float("nan"), dtype=x.dtype, device="cuda").to(memory_format=CL)
                y = jitops.conv2d(x, w, out=out, schedule=s, padding=pad, **extra)
                torch.cuda.synchronize()
                row[f"{label}_err"] = err = rel_err(y, ref)
                assert err <= TOL[dtype], (name, dtype, label, s, err)
            times = {k: [] for k in picks}
            for _ in range(2):
                for label, s in picks.items():
                    times[label].append(graph_us(lambda: jitops.conv2d(x, w, schedule=s, padding=pad, **extra)))
            row.update({f"{k}_us": min(v) for k, v in times.items()})
            cudnn = vendor_times(x.contiguous(), w, None, {"padding": pad}, tf32=dtype == "float32")
            row["cudnn"] = cudnn
            best = min(cudnn.values())
            flops = 2 * xs[0] * xs[2] * xs[3] * ws[0] * ws[1] * ws[2] * ws[3]
            row["tflops_new"] = flops / row["new_us"] / 1e6
            rows.append(row)
            same = " (same)" if row["picks"]["new"] == row["picks"]["old"] else ""
            print(f"{dtype:9s} {name:34s} cuDNN {best:7.1f}  old {row['old_us']:7.1f} ({best / row['old_us']:.2f}x)  "
                  f"new {row['new_us']:7.1f} ({best / row['new_us']:.2f}x, {row['tflops_new']:.0f} TFLOP/s){same}  "
                  f"{row['picks']['new']}", flush=True)
            json.dump(rows, open(os.path.join(args.out, out_name), "w"), indent=1)
    for dtype in args.dtypes.split(","):
        sel = [r for r in rows if r["dtype"] == dtype]
        if not sel:
            print(f"{dtype}: no layer changed its pick")
            continue
        gm = lambda key: math.exp(sum(math.log(min(r["cudnn"].values()) / r[key]) for r in sel) / len(sel))  # noqa: E731
        gain = math.exp(sum(math.log(r["old_us"] / r["new_us"]) for r in sel) / len(sel))
        print(f"{dtype}: {len(sel)} layers vs cuDNN: old {gm('old_us'):.3f}x, new {gm('new_us'):.3f}x; new / old {gain:.3f}x")


if __name__ == "__main__":
    main()
