"""conv2d on the matrix cores, one device call: correctness, timing against cuDNN, sanitizers.

  python3 scripts/device_conv2d.py OUT_DIR [--budget SECONDS] [--skip sections]

Sections (each writes OUT_DIR/<section>.json as it finishes, so a cut-off run still reports):
  check     implicit_gemm_mma on odd shapes (channels not a multiple of 8, odd H/W, stride 2,
            dilation, groups, residual, every activation, split-K), fp16 and bf16, NCHW and NHWC,
            against a float64 convolution; NaN-poisoned outputs
  bench     the 15 benchmark problems, fp16 and bf16: cuDNN (benchmark mode) with NCHW and
            channels_last tensors, jitops' pick with NCHW and channels_last inputs, and (fp16,
            channels_last) every matrix-core candidate, for the cost model; graph replay
  layers    the conv layers of torchvision ResNet-50/18, MobileNet-V3-L, EfficientNet-B0 and
            ConvNeXt-T at batch 8 (forward hooks, random weights), fp16: jitops channels_last
            vs cuDNN at its best of NCHW / channels_last; graph replay
  tf32_check, tf32_bench   fp32 on the matrix cores (precision tf32 / 3xtf32): scripts/conv2d_tf32.py
  layers_tf32  the same layers in fp32: tf32 vs cuDNN TF32, 3xtf32 vs cuDNN fp32 and jitops' exact kernels
  resnet    ResNet-50 b8 fp16 channels_last, every conv through jitops.conv2d (BN folded, ReLU and
            the residual Add fused) against torch's own run, graph replay; output vs fp32 torch
  sanitize  compute-sanitizer memcheck and racecheck on one small case of each new kernel (started
            first, beside the check sections, which time nothing)
  ncu       shared-memory bank conflicts (ncu's MemoryWorkloadAnalysis tables) of the matrix-core
            kernel on k100_2 (128 x 128 x 32 tile)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.bench.conv2d import PROBLEMS  # noqa: E402
from jitops.ops import conv2d_mma as mma  # noqa: E402

from conv2d_devkit import (CL, PEAK, TDT, TensorSpec, conv_case, dump, geo, jitops_times, left, op, pads4,  # noqa: E402
                           picked, ref_f64, rel_err, vendor_times, graph_us)
from conv2d_layers import collect_layers, section_layers, section_layers_tf32, sweep_mma  # noqa: E402
from conv2d_resnet50 import section_resnet  # noqa: E402
from conv2d_tf32 import section_tf32_bench, section_tf32_check, small_cases_tf32  # noqa: E402


# ---------------------------------------------------------------- check

CHECKS = [  # (x, w, attrs, bias, residual)
    ((2, 3, 33, 31), (16, 3, 7, 7), dict(stride=2, padding=3, activation="relu"), True, False),   # stem, C=3
    ((3, 20, 17, 15), (24, 20, 3, 3), dict(padding=1, activation="leaky_relu", alpha=0.1), True, True),
    ((2, 64, 14, 14), (72, 64, 1, 1), dict(), False, True),
    ((2, 64, 15, 15), (128, 64, 1, 1), dict(stride=2), True, False),
    ((1, 32, 19, 21), (40, 32, 3, 3), dict(padding=2, dilation=2, activation="relu"), True, True),
    ((2, 64, 12, 12), (64, 16, 3, 3), dict(padding=1, groups=4), True, False),
    ((1, 24, 9, 9), (8, 24, 5, 5), dict(padding=(2, 1, 2, 3)), False, False),
    ((2, 512, 7, 7), (36, 512, 3, 3), dict(padding=1), True, True),                             # long K
]


def section_check(out_dir: str) -> dict:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = jitops.get_backend().device
    for xs, ws, attrs, has_b, has_r in CHECKS:
        x32 = torch.randn(xs, device="cuda", generator=gen)
        w32 = torch.randn(ws, device="cuda", generator=gen) / math.sqrt(ws[1] * ws[2] * ws[3])
        b32 = torch.randn(ws[0], device="cuda", generator=gen) if has_b else None
        spec = {"x": TensorSpec(xs, "float16"), "w": TensorSpec(ws, "float16"),
                "bias": TensorSpec((ws[0],), "float16") if has_b else None}
        p = op.make_problem(spec, attrs)
        r32 = torch.randn(p.outputs()["y"].shape, device="cuda", generator=gen) if has_r else None
        if has_r:
            spec["residual"] = p.outputs()["y"]
            p = op.make_problem(spec, attrs)
        schedules = [op.heuristic(p, dev, mma.ALGORITHM)]
        schedules += [s for s in mma.candidates(p, dev) if int(s["split_k"]) > 1][:1]
        schedules.append(mma.mma_schedule(64, 64, 32, 2, 2, 4, split_k=2))
        for dtype in ("float16", "bfloat16"):
            td = TDT[dtype]
            x, w = x32.to(td), w32.to(td)
            b = b32.to(td) if has_b else None
            r = r32.to(td) if has_r else None
            ref = ref_f64(x, w, b, p.stride, p.pad, p.dilation, p.groups, r, attrs.get("activation"),
                          attrs.get("alpha", 0.01))
            tol = op.tolerance(replace_dtype(p, dtype), schedules[0])[0]
            for layout in ("nchw", "nhwc"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                rl = (r.to(memory_format=CL) if layout == "nhwc" else r) if has_r else None
                for s in schedules:
                    y = jitops.conv2d(xl, w, b, residual=rl, schedule=s, **attrs)
                    torch.cuda.synchronize()
                    nan = bool(torch.isnan(y).any())
                    err = rel_err(y, ref)
                    fmt_ok = y.is_contiguous(memory_format=CL) if layout == "nhwc" else y.is_contiguous()
                    ok = (not nan) and err <= tol and fmt_ok
                    rows.append({"problem": p.describe(), "dtype": dtype, "layout": layout, "schedule": str(s),
                                 "err": err, "tol": tol, "nan": nan, "format_kept": fmt_ok, "ok": ok})
                    print(f"check {'ok ' if ok else 'BAD'} {dtype:8} {layout} err {err:.2e} (tol {tol:.1e}) "
                          f"{p.describe()} {s}", flush=True)
    for dtype in ("float32", "float16", "bfloat16"):      # NHWC depthwise; NCHW kernels behind transposes
        td = {"float32": torch.float32, **TDT}[dtype]
        for xs, ws, attrs, sched in (((8, 96, 29, 31), (96, 1, 3, 3), dict(padding=1, stride=2, groups=96), "depthwise"),
                                     ((2, 36, 15, 15), (36, 1, 5, 5), dict(padding=2, groups=36), "depthwise"),
                                     ((2, 20, 17, 15), (24, 20, 3, 3), dict(padding=1), None)):
            x = torch.randn(xs, device="cuda", generator=gen).to(td)
            w = (torch.randn(ws, device="cuda", generator=gen) / math.sqrt(ws[1] * ws[2] * ws[3])).to(td)
            b = torch.randn(ws[0], device="cuda", generator=gen).to(td)
            y0 = jitops.conv2d(x.to(memory_format=CL), w, b, activation="relu", schedule=sched, **attrs)
            r = torch.randn(y0.shape, device="cuda", generator=gen).to(td).to(memory_format=CL)
            y = jitops.conv2d(x.to(memory_format=CL), w, b, residual=r, activation="relu", schedule=sched, **attrs)
            torch.cuda.synchronize()
            st = attrs.get("stride", 1)
            ref = ref_f64(x, w, b, (st, st), pads4(attrs["padding"]), (1, 1), attrs.get("groups", 1), r, "relu")
            # fp32: the heuristic may pick Winograd F(4x4) for the 3x3 (its bound, docs/conv2d.md)
            tol = {"float32": 2e-4 if sched is None else 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
            err = rel_err(y, ref)
            ok = err <= tol and not bool(torch.isnan(y).any()) and y.is_contiguous(memory_format=CL)
            rows.append({"problem": f"{xs} {ws} {attrs}", "dtype": dtype, "layout": "nhwc", "schedule": str(sched),
                         "err": err, "tol": tol, "ok": ok})
            print(f"check {'ok ' if ok else 'BAD'} {dtype:8} nhwc err {err:.2e} (tol {tol:.1e}) {xs} {ws} {attrs} "
                  f"{sched or 'heuristic'}", flush=True)
    dump(out_dir, "check", rows)
    return {"checked": len(rows), "failed": sum(not r["ok"] for r in rows)}


def replace_dtype(p, dtype):
    from dataclasses import replace
    return replace(p, dtype=dtype)


# ---------------------------------------------------------------- bench

def section_bench(out_dir: str, budget: float, sweep: bool, dtypes=("float16", "bfloat16")) -> dict:
    rows = []
    for dtype in dtypes:
        for cp in PROBLEMS:
            if left(budget) < 0:
                break
            xs, ws, attrs = (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}
            x, w, b = conv_case(xs, ws, attrs, dtype)
            p, s = picked(xs, ws, attrs, dtype)
            ven = vendor_times(x, w, b, attrs)
            jit = jitops_times(x, w, b, attrs)
            p_nchw, s_nchw = picked(xs, ws, attrs, dtype, "nchw")
            ref = ref_f64(x, w, None, (1, 1), (cp.pad,) * 4, (1, 1), 1)
            err = rel_err(jitops.conv2d(x.to(memory_format=CL), w, **attrs), ref)
            row = {"problem": cp.name, "dtype": dtype, "flops": p.flops, "vendor_us": ven, "jitops_us": jit,
                   "pick_nhwc": str(s), "pick_nchw": str(s_nchw), "err": err,
                   "ratio": min(ven.values()) / jit["nhwc"], "ratio_nchw": min(ven.values()) / jit["nchw"]}
            row["tflops"] = p.flops / jit["nhwc"] / 1e6
            row["peak_pct"] = 100 * row["tflops"] * 1e12 / PEAK
            if sweep and dtype == "float16":
                cands = sweep_mma(p, x.to(memory_format=CL), w, None, attrs)
                row["mma_candidates_nhwc_us"] = cands
                best = min((v for v in cands.values() if isinstance(v, float)), default=None)
                row["best_mma_nhwc_us"] = best
            rows.append(row)
            print(f"bench {dtype:8} {cp.name:20} cuDNN nchw {ven['nchw']:8.1f} cl {ven['nhwc']:8.1f} | jitops nchw "
                  f"{jit['nchw']:8.1f} cl {jit['nhwc']:8.1f} | ratio {row['ratio']:.2f} (nchw {row['ratio_nchw']:.2f}) "
                  f"{row['tflops']:.0f} TF/s err {err:.1e} best-mma {row.get('best_mma_nhwc_us')} | {s}", flush=True)
            dump(out_dir, "bench", rows)
    return {dt: geo([r["ratio"] for r in rows if r["dtype"] == dt]) for dt in dtypes}


# ---------------------------------------------------------------- sanitizers

def small_cases() -> None:
    """One small case per new kernel (run under compute-sanitizer)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 20, 9, 11, device="cuda", generator=gen).half()
    w = torch.randn(24, 20, 3, 3, device="cuda", generator=gen).half() * 0.1
    b = torch.randn(24, device="cuda", generator=gen).half()
    r = torch.randn(2, 24, 9, 11, device="cuda", generator=gen).half()
    xc = torch.randn(2, 32, 9, 11, device="cuda", generator=gen).half().to(memory_format=CL)
    wc = torch.randn(24, 32, 3, 3, device="cuda", generator=gen).half() * 0.1
    rc = r.to(memory_format=CL)
    fused = mma.mma_schedule(64, 64, 32, 2, 2, 3)
    split = mma.mma_schedule(64, 64, 32, 2, 2, 3, split_k=2)
    jitops.conv2d(x, w, b, padding=1, residual=r, activation="relu", schedule=fused)       # NCHW copy + NCHW out
    jitops.conv2d(xc, wc, b, padding=1, residual=rc, activation="relu", schedule=fused)    # NHWC direct
    jitops.conv2d(xc, wc, b, padding=1, residual=rc, schedule=split)                       # split-K + NHWC reduce
    jitops.conv2d(x.bfloat16(), w.bfloat16(), b.bfloat16(), padding=1, schedule=fused)     # bf16
    jitops.conv2d(xc.float(), wc.float(), padding=1, residual=rc.float())                  # SIMT via NCHW transposes
    wd = torch.randn(32, 1, 3, 3, device="cuda", generator=gen).half()
    jitops.conv2d(xc, wd, padding=1, groups=32, residual=torch.randn(2, 32, 9, 11, device="cuda").half()
                  .to(memory_format=CL), schedule="depthwise")                   # NHWC depthwise
    torch.cuda.synchronize()
    print("small cases done")
    small_cases_tf32()


def ncu_case() -> None:
    """k100_2 once through the 128 x 128 x 32 matrix-core kernel (profiled by ncu)."""
    x = torch.randn(16, 256, 32, 32, device="cuda").half().to(memory_format=CL)
    w = torch.randn(256, 256, 3, 3, device="cuda").half() * 0.02
    jitops.conv2d(x, w, padding=1, schedule=mma.mma_schedule(128, 128, 32, 2, 2, 4))
    torch.cuda.synchronize()


def section_ncu(out_dir: str) -> dict:
    cmd = ["ncu", "--print-details", "all", "--section", "MemoryWorkloadAnalysis_Tables", "--section", "ComputeWorkloadAnalysis",
           "--kernel-name", "regex:conv2d_implicit_gemm_mma", "--launch-count", "1", sys.executable, __file__,
           "--ncu-case"]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        text, rc = proc.stdout, proc.returncode
    except Exception as exc:  # noqa: BLE001
        text, rc = f"{exc}", -1
    keep = [ln for ln in text.splitlines() if any(k in ln.lower() for k in ("bank", "shared", "wavefront", "pipe",
                                                                             "conv2d_", "issue", "executed ipc"))]
    print("ncu:\n" + "\n".join(keep[-40:]), flush=True)
    dump(out_dir, "ncu", {"rc": rc, "lines": keep, "tail": text[-4000:]})
    return {"rc": rc}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--skip", default="resnet,ncu")
    ap.add_argument("--sweep", action="store_true", help="time every matrix-core candidate (cost-model fit)")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--ncu-case", action="store_true")
    args = ap.parse_args()
    if args.small:
        small_cases()
        return
    if args.ncu_case:
        ncu_case()
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    skip = set(args.skip.split(","))
    summary = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    procs = section_sanitize_start() if "sanitize" not in skip else None
    layers: list = []
    bud = args.budget

    def get_layers() -> list:
        if not layers:
            layers.extend(collect_layers())
            print(f"layers: {len(layers)} distinct conv layers", flush=True)
        return layers

    sections = (("check", lambda: section_check(args.out)),
                ("tf32_check", lambda: section_tf32_check(args.out, CHECKS)),
                ("sanitize", lambda: section_sanitize_finish(procs, args.out) if procs else "skipped"),
                ("bench", lambda: section_bench(args.out, bud * 0.4, args.sweep)),
                ("tf32_bench", lambda: section_tf32_bench(args.out, bud * 0.55)),
                ("layers", lambda: section_layers(args.out, get_layers(), bud * 0.8, args.sweep)),
                ("layers_tf32", lambda: section_layers_tf32(args.out, get_layers(), bud)),
                ("resnet", lambda: section_resnet(args.out, graph_us, rel_err, dump)),
                ("ncu", lambda: section_ncu(args.out)))
    for name, fn in sections:
        if name in skip and name != "sanitize":
            continue
        t = time.time()
        try:
            summary[name] = fn()
        except Exception as exc:  # noqa: BLE001 - report and go on with the next section
            import traceback
            traceback.print_exc()
            summary[name] = f"error: {exc}"
        print(f"==== {name}: {time.time() - t:.0f} s, {left(bud):.0f} s of the budget left", flush=True)
        dump(args.out, "summary", summary)
    print("\n==== summary ====")
    print(json.dumps(summary, indent=1))


def section_sanitize_start():
    procs = {}
    for tool in ("memcheck", "racecheck"):
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable, __file__, "--small"]
        procs[tool] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return procs


def section_sanitize_finish(procs, out_dir: str) -> dict:
    res = {}
    for tool, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=100)
        except subprocess.TimeoutExpired:
            proc.kill()
            text = "timeout"
        res[tool] = {"rc": proc.returncode, "tail": text[-1500:]}
        print(f"sanitize {tool}: rc {proc.returncode}; {text.strip().splitlines()[-1] if text.strip() else ''}",
              flush=True)
    dump(out_dir, "sanitize", res)
    return {k: v["rc"] for k, v in res.items()}


if __name__ == "__main__":
    main()
