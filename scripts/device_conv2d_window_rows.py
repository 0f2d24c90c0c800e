"""RGB stems on the window-rows wgmma GEMM (conv2d_mma.WindowRows) against the taps-of-8 GEMM, the
heuristic's pick and cuDNN (GPU, sm_90). `taps`: the pick's schedule without window rows.

Every schedule is first run into a NaN-filled output and checked against float64 (bias, residual and
ReLU on the odd cases); then the pick, the window-rows twins of the pick's tile (persistent and not)
and of two more tiles, and cuDNN at its best layout are timed with CUDA-graph replay, in --passes
rotated passes (each entry timed first once), the faster pass of each.

    python3 scripts/device_conv2d_window_rows.py OUT_DIR [--dtypes float16,bfloat16,float32] [--passes 3]
        (float32: precision "tf32" here, cuDNN with TF32)
    compute-sanitizer --tool memcheck python3 scripts/device_conv2d_window_rows.py --sanitize
        (a few small cases once, plain and persistent grids, NCHW and NHWC, bias + residual + ReLU)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from conv2d_devkit import conv_case, dump, graph_us, op, pads4, pair, ref_f64, rel_err  # noqa: E402

import jitops  # noqa: E402
from jitops.ops.base import Schedule, TensorSpec  # noqa: E402

CL = torch.channels_last
# (name, x, w, attrs, bias, residual + relu, layout)
CASES = [
    ("ResNet-50 stem b32", (32, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, False, False, "nhwc"),
    ("ResNet-50 stem b8", (8, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, False, False, "nhwc"),
    ("ResNet-50 stem b1", (1, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, False, False, "nhwc"),
    ("ResNet-50 stem b32 NCHW", (32, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, False, False, "nchw"),
    ("ResNet-50 stem b8 NCHW", (8, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, False, False, "nchw"),
    ("ConvNeXt stem b32", (32, 3, 224, 224), (96, 3, 4, 4), {"stride": 4}, True, False, "nhwc"),
    ("ViT-B/16 patches b32", (32, 3, 224, 224), (768, 3, 16, 16), {"stride": 16}, True, False, "nhwc"),
    ("3x3 s2 3->64 b32", (32, 3, 224, 224), (64, 3, 3, 3), {"stride": 2, "padding": 1}, True, False, "nhwc"),
    ("3x3 s2 3->32 b32 (EfficientNet)", (32, 3, 224, 224), (32, 3, 3, 3), {"stride": 2, "padding": 1}, False, False,
     "nhwc"),
    ("odd 7x7 s2, bias + residual + relu", (3, 3, 37, 53), (72, 3, 7, 7), {"stride": 2, "padding": 3}, True, True,
     "nhwc"),
    ("odd 5x5 s(1,2), 4 ch, NCHW", (2, 4, 31, 45), (40, 4, 5, 5), {"stride": (1, 2), "padding": (2, 1)}, True, True,
     "nchw"),
]


def rows_twins(p, pick, device) -> list[tuple[str, Schedule]]:
    """The window-rows twins of the pick's tile (persistent and not) and of two more tiles."""
    from jitops.ops import conv2d_wgmma as W
    out = []
    base = pick.as_dict()["params"] if pick.algorithm == W.ALGORITHM and not W.is_tma(pick) else \
        {"bm": 128, "bn": 64, "bk": W.bk_of(p), "stages": 4, "producer": 0, "split_k": 1, "math": "wgmma"}
    base = {k: v for k, v in base.items() if k not in ("persistent", "window_rows")}
    tiles = [(int(base["bm"]), int(base["bn"]), int(base["stages"])), (128, 128, 4), (64, 128, 4)]
    for bm, bn, st in dict.fromkeys(tiles):
        for persistent in (1, 0):
            prm = {**base, "bm": bm, "bn": bn, "stages": st, "window_rows": 1, **({"persistent": 1} if persistent else {})}
            s = Schedule.make(W.ALGORITHM, **prm)
            try:
                op.plan(p, s, device)
            except Exception as exc:  # noqa: BLE001 - a twin that does not plan is skipped, said why
                print(f"  skip {s}: {exc}", flush=True)
                continue
            out.append((f"rows {bm}x{bn}{' p' if persistent else ''}", s))
    return out


def sanitize_cases() -> None:
    """Small window-rows cases run once each (for compute-sanitizer): 7x7 stride 2 NHWC on a plain and
    a persistent grid, 5x5 stride (1, 2) NCHW, a 16x16 bf16 patch embedding; bias + residual + ReLU."""
    from jitops.ops import conv2d_wgmma as W
    for xs, ws, attrs, layout, dtype, tiles in (
            ((2, 3, 37, 53), (72, 3, 7, 7), {"stride": 2, "padding": 3}, "nhwc", "float16", ((128, 64, 4, 0, True),
                                                                                              (64, 128, 4, 0, False))),
            ((1, 4, 31, 45), (40, 4, 5, 5), {"stride": (1, 2), "padding": (2, 1)}, "nchw", "float16",
             ((128, 64, 4, 0, False),)),
            ((2, 3, 64, 48), (200, 3, 16, 16), {"stride": 16}, "nhwc", "bfloat16", ((128, 192, 4, 0, False),)),
            ((2, 3, 37, 53), (72, 3, 7, 7), {"stride": 1, "padding": 3, "precision": "tf32"}, "nhwc", "float32",
             ((128, 64, 4, 0, True),))):
        x, w, b = conv_case(xs, ws, attrs, dtype, True)
        if layout == "nhwc":
            x = x.to(memory_format=CL)
        conv_attrs = {k: v for k, v in attrs.items() if k != "precision"}
        y0 = F.conv2d(x.float(), w.float(), b.float(), pair(conv_attrs["stride"]), pads4(conv_attrs.get("padding", 0))[:2])
        res = torch.randn(y0.shape, device="cuda").to(x.dtype)
        res = res.to(memory_format=CL) if layout == "nhwc" else res
        for bm, bn, st, prod, persistent in tiles:
            s = W.schedule(bm, bn, st, prod, persistent=persistent, rows=True, bk=32 if dtype == "float32" else 64)
            jitops.conv2d(x, w, b, residual=res, activation="relu", schedule=s, **attrs)
    torch.cuda.synchronize()
    print("sanitize cases ran", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", "."))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--sanitize", action="store_true", help="the small cases once (for compute-sanitizer)")
    args = ap.parse_args()
    if args.sanitize:
        sanitize_cases()
        return 0
    torch.backends.cudnn.benchmark = True
    device = jitops.get_backend().device
    rows, failures = [], 0
    for dtype in args.dtypes.split(","):
        torch.backends.cudnn.allow_tf32 = dtype == "float32"      # fp32: TF32 on both sides
        for name, xs, ws, attrs, has_b, has_r, layout in CASES:
            if dtype == "float32":
                attrs = {**attrs, "precision": "tf32"}
            x, w, b = conv_case(xs, ws, attrs, dtype, has_b)
            xl = x.to(memory_format=CL) if layout == "nhwc" else x
            st, pd = pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0))
            oh = (xs[2] + pd[0] + pd[2] - ws[2]) // st[0] + 1
            ow = (xs[3] + pd[1] + pd[3] - ws[3]) // st[1] + 1
            res = torch.randn(xs[0], ws[0], oh, ow, device="cuda").to(x.dtype) if has_r else None
            if res is not None and layout == "nhwc":
                res = res.to(memory_format=CL)
            extra = {"residual": res, "activation": "relu"} if has_r else {}
            ref = ref_f64(x, w, b, st, pd, (1, 1), 1, res, "relu" if has_r else None)
            spec = {"x": TensorSpec(xs, dtype, "nhwc" if layout == "nhwc" else ""), "w": TensorSpec(ws, dtype),
                    "bias": TensorSpec((ws[0],), dtype) if has_b else None,
                    "residual": TensorSpec(res.shape, dtype, "nhwc" if layout == "nhwc" else "") if has_r else None}
            p = op.make_problem(spec, {**attrs, **({"activation": "relu"} if has_r else {})})
            from jitops.ops.conv2d_mma import window_rows_why_not
            if window_rows_why_not(p):
                print(f"{name} {dtype}: skipped ({window_rows_why_not(p)})", flush=True)
                continue
            pick = op.heuristic(p, device)
            entries = [("pick", pick)]
            if "window_rows" in pick.as_dict()["params"]:     # the same tile on taps of 8 channels
                entries.append(("taps", Schedule.make(pick.algorithm, **{k: v for k, v in pick.as_dict()["params"].items()
                                                                         if k != "window_rows"})))
            if pick.algorithm != "direct_stem":                 # the few-channel direct kernel, where it applies
                try:
                    entries.append(("direct_stem", op.heuristic(p, device, "direct_stem")))
                except Exception:  # noqa: BLE001 - not applicable to this problem
                    pass
            entries += rows_twins(p, pick, device)
            row = {"case": name, "dtype": dtype, "layout": layout, "schedules": {k: str(s) for k, s in entries}, "err": {}}
            calls = []
            for label, s in entries:
                out = torch.full(ref.shape, float("nan"), device="cuda", dtype=x.dtype)
                if layout == "nhwc":
                    out = out.to(memory_format=CL)
                jitops.conv2d(xl, w, b, out=out, schedule=s, **attrs, **extra)
                torch.cuda.synchronize()
                err = rel_err(out, ref)
                ok = math.isfinite(err) and err < (2e-2 if dtype == "bfloat16" else 4e-3)    # fp32: TF32 products
                row["err"][label] = err
                failures += not ok
                print(f"{name} {dtype} {label}: err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
                if ok:
                    calls.append((label, lambda s=s: jitops.conv2d(xl, w, b, schedule=s, **attrs, **extra)))
            if not has_r:
                for vl, vx in (("cudnn_nchw", x), ("cudnn_cl", x.to(memory_format=CL))):
                    wv = w if vl == "cudnn_nchw" else w.to(memory_format=CL)
                    calls.append((vl, lambda vx=vx, wv=wv: F.conv2d(vx, wv, b, st, pd[:2])))   # padding: symmetric cases
            times = {label: [] for label, _ in calls}
            for n in range(max(args.passes, 1)):
                k = n % len(calls)
                for label, call in calls[k:] + calls[:k]:
                    times[label].append(graph_us(call))
            row["us"] = {k: min(v) for k, v in times.items()}
            rows.append(row)
            us = row["us"]
            vendor = min([us[k] for k in ("cudnn_nchw", "cudnn_cl") if k in us], default=float("nan"))
            best_rows = min([v for k, v in us.items() if k.startswith("rows")], default=float("nan"))
            print(f"== {name} {dtype}: pick {us.get('pick', float('nan')):.1f} rows best {best_rows:.1f} "
                  f"cuDNN {vendor:.1f} us  ({' '.join(f'{k}={v:.1f}' for k, v in us.items())})", flush=True)
    dump(args.out, "window_rows", {"device": torch.cuda.get_device_name(),
                                   "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rows": rows})
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
