"""conv2d on Hopper's warpgroup MMA (implicit_gemm_wgmma), one device call: correctness against
float64, sanitizers, and graph-replay timing of every wgmma candidate against the mma.sync
kernel's pick and cuDNN (best of NCHW / channels_last) on the benchmark problems, large SD-UNet /
ResNet-50 batch-32 layers and the torchvision layers at batch 8.

  python3 scripts/device_conv2d_wgmma.py OUT_DIR [--budget SECONDS] [--skip sections] [--max-cands N]

Sections: check, sanitize, bench, big, layers (each writes OUT_DIR/<section>.json as it goes).
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
from jitops.ops import conv2d_mma as mma  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops.conv2d_cost import estimate  # noqa: E402

from conv2d_devkit import (CL, PEAK, TDT, TensorSpec, conv_case, dump, geo, graph_us, left, op, pads4, pair,  # noqa: E402
                           ref_f64, rel_err, vendor_times)
from device_conv2d import CHECKS  # noqa: E402

CHECK_TILES = ((128, 256, 4, 0, 1), (256, 128, 4, 0, 1), (192, 128, 4, 0, 1), (128, 192, 4, 0, 1), (64, 128, 4, 0, 1),
               (128, 128, 3, 0, 1), (128, 128, 4, 1, 1), (192, 128, 4, 1, 1), (64, 64, 4, 0, 2), (128, 128, 4, 1, 3),
               (128, 64, 3, 0, 1), (64, 128, 3, 0, 1), (192, 64, 3, 0, 1))
# Large layers (issue 16): SD 1.5 UNet at batch 2 (64x64 latents), ResNet-50 at batch 32.
BIG = [((2, 320, 64, 64), (320, 320, 3, 3), 1, 1), ((2, 640, 32, 32), (640, 640, 3, 3), 1, 1),
       ((2, 1280, 16, 16), (1280, 1280, 3, 3), 1, 1), ((2, 2560, 16, 16), (1280, 2560, 3, 3), 1, 1),
       ((2, 1280, 8, 8), (1280, 1280, 3, 3), 1, 1), ((2, 2560, 8, 8), (1280, 2560, 3, 3), 1, 1),
       ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1), ((32, 256, 56, 56), (64, 256, 1, 1), 1, 0),
       ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1), ((32, 512, 28, 28), (128, 512, 1, 1), 1, 0),
       ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1), ((32, 1024, 14, 14), (256, 1024, 1, 1), 1, 0),
       ((32, 512, 7, 7), (512, 512, 3, 3), 1, 1), ((32, 512, 7, 7), (2048, 512, 1, 1), 1, 0)]


def sched(t):
    return wg.schedule(*t[:4], split_k=t[4])


def section_check(out_dir: str) -> dict:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for xs, ws, attrs, has_b, has_r in CHECKS:
        for dtype in ("float16", "bfloat16", "tf32"):
            td = TDT.get(dtype, torch.float32)
            if dtype == "tf32":
                attrs = {**attrs, "precision": "tf32"}
            x = torch.randn(xs, device="cuda", generator=gen).to(td)
            w = (torch.randn(ws, device="cuda", generator=gen) / (ws[1] * ws[2] * ws[3]) ** 0.5).to(td)
            b = torch.randn(ws[0], device="cuda", generator=gen).to(td) if has_b else None
            y0 = jitops.conv2d(x, w, b, **attrs)
            r = torch.randn(y0.shape, device="cuda", generator=gen).to(td) if has_r else None
            ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)),
                          pair(attrs.get("dilation", 1)), attrs.get("groups", 1), r, attrs.get("activation"),
                          attrs.get("alpha", 0.01))
            tol = TOL[dtype]
            for layout in ("nchw", "nhwc"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                rl = (r.to(memory_format=CL) if layout == "nhwc" else r) if has_r else None
                for t in CHECK_TILES:
                    s = sched(t) if dtype != "tf32" else wg.schedule(*t[:4], split_k=t[4], bk=32)
                    try:
                        y = jitops.conv2d(xl, w, b, residual=rl, schedule=s, **attrs)
                        torch.cuda.synchronize()
                    except Exception as exc:  # noqa: BLE001
                        rows.append({"problem": f"{xs} {ws} {attrs}", "dtype": dtype, "layout": layout,
                                     "schedule": str(s), "ok": False, "error": str(exc)[:400]})
                        print(f"check ERR {dtype} {layout} {xs} {ws} {s}: {str(exc)[:300]}", flush=True)
                        continue
                    nan = bool(torch.isnan(y).any())
                    err = rel_err(y, ref)
                    fmt = y.is_contiguous(memory_format=CL) if layout == "nhwc" else y.is_contiguous()
                    ok = not nan and err <= tol and fmt
                    rows.append({"problem": f"{xs} {ws} {attrs}", "dtype": dtype, "layout": layout,
                                 "schedule": str(s), "err": err, "tol": tol, "nan": nan, "ok": ok})
                    print(f"check {'ok ' if ok else 'BAD'} {dtype:8} {layout} err {err:.2e} {xs} {ws} {t}", flush=True)
    dump(out_dir, "check", rows)
    return {"checked": len(rows), "failed": sum(not r["ok"] for r in rows)}


def small_cases() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 20, 9, 11, device="cuda", generator=gen).half()
    w = torch.randn(24, 20, 3, 3, device="cuda", generator=gen).half() * 0.1
    b = torch.randn(24, device="cuda", generator=gen).half()
    r = torch.randn(2, 24, 9, 11, device="cuda", generator=gen).half()
    xc = torch.randn(2, 32, 9, 11, device="cuda", generator=gen).half().to(memory_format=CL)
    for t in ((64, 64, 4, 0, 1), (128, 128, 4, 1, 1), (64, 64, 4, 0, 2), (128, 256, 4, 0, 1)):
        jitops.conv2d(x, w, b, padding=1, residual=r, activation="relu", schedule=sched(t))
        jitops.conv2d(xc, w.new_zeros(24, 32, 3, 3) + 0.01, None, padding=1, schedule=sched(t))
        jitops.conv2d(x.float(), w.float(), b.float(), padding=1, precision="tf32",
                      schedule=wg.schedule(*t[:4], split_k=t[4], bk=32))
    torch.cuda.synchronize()
    print("small cases done", flush=True)


def profile_case(spec: str) -> None:
    """k100_2 (16x256x32x32, 3x3, 256 channels) through one schedule, warm, then once more."""
    x = torch.randn(16, 256, 32, 32, device="cuda").half().to(memory_format=CL)
    w = torch.randn(256, 256, 3, 3, device="cuda").half() * 0.02
    s = mma.mma_schedule(128, 256, 32, 2, 4, 3) if spec == "mma" else sched(tuple(int(v) for v in spec.split(",")))
    for _ in range(2):
        jitops.conv2d(x, w, padding=1, schedule=s)
    torch.cuda.synchronize()


def sanitize_start():
    procs = {}
    for tool in ("memcheck", "racecheck", "synccheck"):
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable, __file__, "--small"]
        procs[tool] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return procs


def sanitize_finish(procs, out_dir: str) -> dict:
    res = {}
    for tool, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            text = "timeout"
        res[tool] = {"rc": proc.returncode, "tail": text[-1500:]}
        print(f"sanitize {tool}: rc {proc.returncode}; {text.strip().splitlines()[-1] if text.strip() else ''}",
              flush=True)
    dump(out_dir, "sanitize", res)
    return {k: v["rc"] for k, v in res.items()}


TOL = {"float16": 4e-3, "bfloat16": 2e-2, "tf32": 8e-3}


def timed(xl, w, b, attrs, s, ref=None, tol=0.0) -> float | str:
    """Graph-replay time of one schedule; with `ref`, its output is checked first (poisoned, then
    against float64): a wrong candidate is reported as such, never timed as a winner."""
    try:
        if ref is not None:
            y = jitops.conv2d(xl, w, b, schedule=s, **attrs)
            y.fill_(float("nan"))
            y = jitops.conv2d(xl, w, b, schedule=s, **attrs)
            err = rel_err(y, ref)
            if not err <= tol:              # NaN fails too
                print(f"  BAD candidate {s}: err {err:.2e} > {tol:.0e}", flush=True)
                return f"wrong: err {err:.3e}"
        else:
            jitops.conv2d(xl, w, b, schedule=s, **attrs)
        return graph_us(lambda: jitops.conv2d(xl, w, b, schedule=s, **attrs))
    except Exception as exc:  # noqa: BLE001 - a candidate that fails is data too
        return f"error: {exc}"[:300]


def problem_row(xs, ws, attrs, dtype, has_b, max_cands, check=True) -> dict:
    """dtype "tf32": fp32 tensors with precision "tf32", against cuDNN with TF32."""
    tf32 = dtype == "tf32"
    if tf32:
        dtype, attrs = "float32", {**attrs, "precision": "tf32"}
    x, w, b = conv_case(xs, ws, attrs, dtype, has_b)
    xl = x.to(memory_format=CL)
    spec = {"x": TensorSpec(xs, dtype, "nhwc"), "w": TensorSpec(ws, dtype),
            "bias": TensorSpec((ws[0],), dtype) if has_b else None}
    p = op.make_problem(spec, attrs)
    dev = jitops.get_backend().device
    ven = vendor_times(x, w, b, {k: v for k, v in attrs.items() if k != "precision"}, tf32=tf32)
    row = {"x": xs, "w": ws, "attrs": attrs, "dtype": "tf32" if tf32 else dtype, "flops": p.flops, "vendor_us": ven}
    ref = None
    if check:
        ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)),
                      pair(attrs.get("dilation", 1)), attrs.get("groups", 1))
    try:
        s_mma = op.heuristic(p, dev, mma.ALGORITHM)
        row["mma_pick"], row["mma_us"] = str(s_mma), timed(xl, w, b, attrs, s_mma, ref, TOL[row["dtype"]])
    except Exception as exc:  # noqa: BLE001
        row["mma_us"] = f"error: {exc}"[:200]
    row["pick"] = str(op.heuristic(p, dev))
    row["pick_us"] = timed(xl, w, b, attrs, None, ref, TOL[row["dtype"]])
    cands = sorted(wg.candidates(p, dev), key=lambda s: estimate(p, s, dev))
    cands = cands[:max_cands]
    row["wgmma_us"] = {str(s): timed(xl, w, b, attrs, s, ref, TOL[row["dtype"]]) for s in cands}
    row["wrong"] = sum(isinstance(v, str) and v.startswith("wrong") for v in row["wgmma_us"].values())
    good = {k: v for k, v in row["wgmma_us"].items() if isinstance(v, float)}
    if good:
        best = min(good, key=good.get)
        row["best_wgmma"], row["best_wgmma_us"] = best, good[best]
        vbest = min(ven.values())
        row["ratio_wgmma"] = vbest / good[best]
        row["tflops_wgmma"] = p.flops / good[best] / 1e6
        row["peak_pct"] = 100 * row["tflops_wgmma"] * 1e12 / PEAK
        if isinstance(row.get("mma_us"), float):
            row["ratio_mma"] = vbest / row["mma_us"]
        if check:
            s_best = next(s for s in cands if str(s) == best)
            row["err"] = rel_err(jitops.conv2d(xl, w, b, schedule=s_best, **attrs), ref)
    return row


def fmt(row) -> str:
    v = min(row["vendor_us"].values())
    m = row.get("mma_us")
    return (f"x={row['x']} w={row['w']} cuDNN {v:8.1f} mma {m if isinstance(m, str) else f'{m:8.1f}'} "
            f"wgmma {row.get('best_wgmma_us', float('nan')):8.1f} ratio {row.get('ratio_wgmma', 0):.2f} "
            f"(mma {row.get('ratio_mma', 0):.2f}) {row.get('tflops_wgmma', 0):.0f} TF/s err {row.get('err', -1):.1e} "
            f"{row.get('best_wgmma', '')}")


def section_list(out_dir, name, items, dtypes, budget, max_cands) -> dict:
    rows = []
    for dtype in dtypes:
        for label, xs, ws, attrs, has_b in items:
            if left(budget) < 0:
                print(f"{name}: out of time", flush=True)
                break
            try:
                row = {"label": label, **problem_row(xs, ws, attrs, dtype, has_b, max_cands)}
            except Exception as exc:  # noqa: BLE001
                row = {"label": label, "x": xs, "w": ws, "dtype": dtype, "error": str(exc)[:300]}
                print(f"{name} ERR {label} {exc}", flush=True)
                rows.append(row)
                continue
            rows.append(row)
            print(f"{name} {dtype:8} {label:18} {fmt(row)}", flush=True)
            dump(out_dir, name, rows)
    out = {}
    for dtype in dtypes:
        rs = [r for r in rows if r.get("dtype") == dtype]
        out[dtype] = {"wgmma": geo([r["ratio_wgmma"] for r in rs if "ratio_wgmma" in r]),
                      "mma": geo([r["ratio_mma"] for r in rs if "ratio_mma" in r]),
                      "best_of": geo([max(r["ratio_wgmma"], r.get("ratio_mma", 0)) for r in rs if "ratio_wgmma" in r]),
                      "pick": geo([min(r["vendor_us"].values()) / r["pick_us"] for r in rs
                                   if isinstance(r.get("pick_us"), float)]),
                      "wrong_candidates": sum(r.get("wrong", 0) for r in rs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--skip", default="")
    ap.add_argument("--max-cands", type=int, default=14)
    ap.add_argument("--dtypes", default="float16,bfloat16", help="of the bench section")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--profile", default="", help="run k100_2 once with this schedule (for ncu): wgmma tile "
                    "'bm,bn,stages,producer,split' or 'mma'")
    args = ap.parse_args()
    if args.small:
        small_cases()
        return
    if args.profile:
        profile_case(args.profile)
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    skip = set(args.skip.split(","))
    summary = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    procs = sanitize_start() if "sanitize" not in skip else None
    bud = args.budget
    bench = [(cp.name, (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}, False)
             for cp in PROBLEMS]
    big = [(f"big{i}", xs, ws, {"stride": st, "padding": pd}, False) for i, (xs, ws, st, pd) in enumerate(BIG)]

    def layers():
        from conv2d_layers import collect_layers
        out = []
        for net, (xs, ws, st, pd, dl, g, has_b) in collect_layers():
            if g == 1 or ws[1] % 8 == 0 and g < ws[0]:
                out.append((net, xs, ws, {"stride": st, "padding": pd, "dilation": dl, "groups": g}, has_b))
        print(f"layers: {len(out)}", flush=True)
        return out

    sections = (("check", lambda: section_check(args.out)),
                ("sanitize", lambda: sanitize_finish(procs, args.out) if procs else "skipped"),
                ("bench", lambda: section_list(args.out, "bench", bench, tuple(args.dtypes.split(",")), bud * 0.35,
                                               args.max_cands)),
                ("big", lambda: section_list(args.out, "big", big, ("float16",), bud * 0.55, args.max_cands)),
                ("layers", lambda: section_list(args.out, "layers", layers(), ("float16",), bud * 0.8, args.max_cands)),
                ("tf32", lambda: section_list(args.out, "tf32", bench + big, ("tf32",), bud, args.max_cands)))
    for name, fn in sections:
        if name in skip and name != "sanitize":
            continue
        t = time.time()
        try:
            summary[name] = fn()
        except Exception as exc:  # noqa: BLE001 - report and go on
            import traceback
            traceback.print_exc()
            summary[name] = f"error: {exc}"
        print(f"==== {name}: {time.time() - t:.0f} s, {left(bud):.0f} s of the budget left", flush=True)
        dump(args.out, "summary", summary)
    print("\n==== summary ====")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
