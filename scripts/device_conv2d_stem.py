"""direct_stem (few input channels) on the GPU, one call: every candidate checked against float64
(NaN-poisoned outputs) on real stems in fp16 / bf16 / fp32, NCHW and channels_last, with bias,
residual and ReLU; then graph-replay times of every direct_stem candidate, of the best matrix-core
(or, in fp32, exact) kernel the heuristic would take without it, and of cuDNN (best of NCHW /
channels_last; fp32 without TF32). --small runs the sanitizer cases.

  python3 scripts/device_conv2d_stem.py OUT_DIR
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from conv2d_devkit import (
    CL,
    TDT,
    conv_case,
    dump,
    geo,
    graph_us,
    op,
    pads4,
    pair,
    ref_f64,
    rel_err,
    vendor_times,
)

import jitops
from jitops.ops import conv2d_stem as stem
from jitops.ops.base import TensorSpec

# (label, x, w, attrs): the stems of torchvision / timm networks and the benchmark's small_1.
STEMS = [
    ("mobilenet_v3 b8", (8, 3, 224, 224), (16, 3, 3, 3), {"stride": 2, "padding": 1}),
    ("efficientnet_b0 b8", (8, 3, 224, 224), (32, 3, 3, 3), {"stride": 2, "padding": 1}),
    ("yolov8n 640 b1", (1, 3, 640, 640), (16, 3, 3, 3), {"stride": 2, "padding": 1}),
    ("mobilenet_v3 b1", (1, 3, 224, 224), (16, 3, 3, 3), {"stride": 2, "padding": 1}),
    ("efficientnet_b0 b32", (32, 3, 224, 224), (32, 3, 3, 3), {"stride": 2, "padding": 1}),
    ("vgg/unet 3x3 s1 b8", (8, 3, 224, 224), (64, 3, 3, 3), {"padding": 1}),
    ("resnet50 7x7 b8", (8, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}),
    ("convnext 4x4 b8", (8, 3, 224, 224), (96, 3, 4, 4), {"stride": 4}),
    ("sd vae conv_in b1", (1, 3, 512, 512), (128, 3, 3, 3), {"padding": 1}),
    ("small_1", (1, 3, 64, 64), (16, 3, 3, 3), {"padding": 1}),
]
TOL = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 2e-5}
REGRESSION_STEMS = STEMS[:3]


def check(out_dir: str) -> dict:
    rows, gen = [], torch.Generator(device="cuda").manual_seed(0)
    for label, xs, ws, attrs in STEMS[:4] + STEMS[6:8]:
        for dtype in ("float16", "bfloat16", "float32"):
            td = TDT[dtype]
            x = torch.randn(xs, device="cuda", generator=gen).to(td)
            w = (torch.randn(ws, device="cuda", generator=gen) / (ws[1] * ws[2] * ws[3]) ** 0.5).to(td)
            b = torch.randn(ws[0], device="cuda", generator=gen).to(td)
            y0 = jitops.conv2d(x, w, b, schedule=stem.schedule(8), **attrs)
            r = torch.randn(y0.shape, device="cuda", generator=gen).to(td)
            ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)), (1, 1), 1, r, "relu")
            for layout in ("nchw", "nhwc"):
                xl, rl = (x.to(memory_format=CL), r.to(memory_format=CL)) if layout == "nhwc" else (x, r)
                spec = {"x": TensorSpec(xs, dtype, "nhwc" if layout == "nhwc" else ""), "w": TensorSpec(ws, dtype)}
                for s in stem.candidates(op.make_problem(spec, attrs), jitops.get_backend().device):
                    out = torch.full_like(rl, float("nan"))
                    y = jitops.conv2d(xl, w, b, residual=rl, activation="relu", out=out, schedule=s, **attrs)
                    torch.cuda.synchronize()
                    err = rel_err(y, ref)
                    fmt = y.is_contiguous(memory_format=CL) if layout == "nhwc" else y.is_contiguous()
                    ok = bool(err <= TOL[dtype]) and fmt and y.data_ptr() == out.data_ptr()
                    rows.append({"stem": label, "dtype": dtype, "layout": layout, "schedule": str(s), "err": err,
                                 "ok": ok})
                    print(f"check {'ok ' if ok else 'BAD'} {label:20} {dtype:8} {layout} {s} err {err:.2e}", flush=True)
    dump(out_dir, "stem_check", rows)
    return {"checked": len(rows), "failed": sum(not r["ok"] for r in rows)}


def without_stem(p):
    """What the heuristic picks when direct_stem is not in the pool (the previous behaviour)."""
    dev = jitops.get_backend().device
    from jitops.ops import conv2d_schedules as cs
    from jitops.ops.conv2d_cost import estimate
    pool = [s for s in cs.candidates(p, dev) if s.algorithm not in ("naive", stem.ALGORITHM, "implicit_gemm_mma")]
    if p.dtype == "float32":
        pool = [s for s in pool if s.algorithm != "implicit_gemm_wgmma"]
    return min(pool, key=lambda s: estimate(p, s, dev))


def timing(out_dir: str) -> dict:
    rows = []
    dev = jitops.get_backend().device
    for label, xs, ws, attrs in STEMS:
        for dtype in ("float16", "bfloat16", "float32"):
            if dtype == "bfloat16" and label not in [s[0] for s in REGRESSION_STEMS]:
                continue
            x, w, b = conv_case(xs, ws, attrs, dtype, True)
            ven = vendor_times(x, w, b, attrs)
            for layout in ("nhwc", "nchw"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                spec = {"x": TensorSpec(xs, dtype, "nhwc" if layout == "nhwc" else ""), "w": TensorSpec(ws, dtype),
                        "bias": TensorSpec((ws[0],), dtype)}
                p = op.make_problem(spec, attrs)
                row = {"stem": label, "x": xs, "w": ws, "attrs": attrs, "dtype": dtype, "layout": layout,
                       "vendor_us": ven, "flops": p.flops}
                old = without_stem(p)
                ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)), (1, 1), 1)
                for s in (old, None):           # the previous pick and the heuristic's, poisoned, vs float64
                    y = jitops.conv2d(xl, w, b, schedule=s, **attrs)
                    poisoned = torch.full_like(y, float("nan"))
                    y = jitops.conv2d(xl, w, b, schedule=s, out=poisoned, **attrs)
                    err = rel_err(y, ref)
                    row["err_before" if s else "err_pick"] = err
                    if not err <= TOL[dtype]:
                        print(f"BAD {label} {dtype} {layout} {s or 'pick'}: err {err:.2e}", flush=True)
                row["before"], row["before_us"] = str(old), graph_us(lambda: jitops.conv2d(xl, w, b, schedule=old, **attrs))
                row["stem_us"] = {}
                for s in stem.candidates(p, dev):
                    jitops.conv2d(xl, w, b, schedule=s, **attrs)
                    row["stem_us"][str(s)] = graph_us(lambda: jitops.conv2d(xl, w, b, schedule=s, **attrs))
                pick = op.heuristic(p, dev)
                row["pick"] = str(pick)
                jitops.conv2d(xl, w, b, **attrs)
                row["pick_us"] = graph_us(lambda: jitops.conv2d(xl, w, b, **attrs))
                vb = min(ven.values())
                best = min(row["stem_us"].values()) if row["stem_us"] else float("nan")
                row["ratio_pick"], row["ratio_before"], row["ratio_best_stem"] = vb / row["pick_us"], \
                    vb / row["before_us"], vb / best
                rows.append(row)
                print(f"time {label:20} {dtype:8} {layout} cuDNN {vb:7.1f} before {row['before_us']:7.1f} "
                      f"stem best {best:7.1f} pick {row['pick_us']:7.1f} ({pick.algorithm} {dict(pick.params)}) "
                      f"ratio {row['ratio_before']:.2f} -> {row['ratio_pick']:.2f}", flush=True)
                dump(out_dir, "stem_time", rows)
    out = {}
    for dtype in ("float16", "bfloat16", "float32"):
        rs = [r for r in rows if r["dtype"] == dtype]
        out[dtype] = {"pick": geo([r["ratio_pick"] for r in rs]), "before": geo([r["ratio_before"] for r in rs])}
    return out


def small() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    for layout in ("nchw", "nhwc"):
        x = torch.randn(2, 3, 19, 23, device="cuda", generator=gen).half()
        r = torch.randn(2, 24, 10, 12, device="cuda", generator=gen).half()
        if layout == "nhwc":
            x, r = x.to(memory_format=CL), r.to(memory_format=CL)
        w = torch.randn(24, 3, 3, 3, device="cuda", generator=gen).half()
        b = torch.randn(24, device="cuda", generator=gen).half()
        for cot in (8, 16, 32):
            jitops.conv2d(x, w, b, stride=2, padding=1, residual=r, activation="relu", schedule=stem.schedule(cot))
    torch.cuda.synchronize()
    print("small cases done", flush=True)


def sanitize(out_dir: str) -> dict:
    res = {}
    for tool in ("memcheck", "racecheck"):
        proc = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable, __file__,
                               "--small"], capture_output=True, text=True, timeout=240)
        text = proc.stdout + proc.stderr
        res[tool] = {"rc": proc.returncode, "tail": text[-1200:]}
        print(f"sanitize {tool}: rc {proc.returncode}; {text.strip().splitlines()[-1] if text.strip() else ''}",
              flush=True)
    dump(out_dir, "stem_sanitize", res)
    return {k: v["rc"] for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    if args.small:
        small()
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    summary = {"device": torch.cuda.get_device_name(), "check": check(args.out), "sanitize": sanitize(args.out)}
    summary["time"] = timing(args.out)
    dump(args.out, "stem_summary", summary)
    print(summary, flush=True)


if __name__ == "__main__":
    main()
