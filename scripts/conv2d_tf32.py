"""fp32 conv2d on the matrix cores (precision "tf32" / "3xtf32"), sections of scripts/device_conv2d.py:
  tf32_check  the odd shapes of the "check" section in fp32, tf32 and 3xtf32, NCHW and NHWC, the
              heuristic's pick and a split-K schedule, against float64 (NaN-poisoned outputs)
  tf32_bench  the 15 benchmark problems: jitops tf32 vs cuDNN with TF32, 3xtf32 vs cuDNN without,
              3xtf32 vs jitops' exact fp32 kernels; graph replay"""
from __future__ import annotations

import math

import torch

import jitops
from jitops.bench.conv2d import PROBLEMS
from jitops.ops import conv2d_mma as mma

from conv2d_devkit import CL, PEAK_TF32, TensorSpec, dump, geo, left, op, picked, ref_f64, rel_err
from conv2d_layers import tf32_row


def section_tf32_check(out_dir: str, checks: list) -> dict:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(2)
    dev = jitops.get_backend().device
    for xs, ws, attrs, has_b, has_r in checks:
        x = torch.randn(xs, device="cuda", generator=gen)
        w = torch.randn(ws, device="cuda", generator=gen) / math.sqrt(ws[1] * ws[2] * ws[3])
        b = torch.randn(ws[0], device="cuda", generator=gen) if has_b else None
        for prec in ("tf32", "3xtf32"):
            a = {**attrs, "precision": prec}
            spec = {"x": TensorSpec(xs, "float32"), "w": TensorSpec(ws, "float32"),
                    "bias": TensorSpec((ws[0],), "float32") if has_b else None}
            p = op.make_problem(spec, a)
            r = torch.randn(p.outputs()["y"].shape, device="cuda", generator=gen) if has_r else None
            if has_r:
                spec["residual"] = p.outputs()["y"]
                p = op.make_problem(spec, a)
            ref = ref_f64(x, w, b, p.stride, p.pad, p.dilation, p.groups, r, attrs.get("activation"),
                          attrs.get("alpha", 0.01))
            schedules = [op.heuristic(p, dev, mma.ALGORITHM)]
            schedules += [s for s in mma.candidates(p, dev) if int(s["split_k"]) > 1][:1]
            tol = op.tolerance(p, schedules[0])[0]
            for layout in ("nchw", "nhwc"):
                xl = x.to(memory_format=CL) if layout == "nhwc" else x
                rl = (r.to(memory_format=CL) if layout == "nhwc" else r) if has_r else None
                for s in schedules:
                    out = torch.full(tuple(ref.shape), float("nan"), device="cuda")
                    if layout == "nhwc":
                        out = out.to(memory_format=CL)
                    try:
                        y = jitops.conv2d(xl, w, b, residual=rl, schedule=s, out=out, **a)
                        torch.cuda.synchronize()
                        nan, err = bool(torch.isnan(y).any()), rel_err(y, ref)
                    except Exception as exc:  # noqa: BLE001 - a failing case is a result too
                        print(f"check error {exc}"[:300], flush=True)
                        nan, err = True, float("inf")
                    ok = (not nan) and err <= tol
                    rows.append({"problem": p.describe(), "precision": prec, "layout": layout, "schedule": str(s),
                                 "err": err, "tol": tol, "nan": nan, "ok": ok})
                    print(f"check {'ok ' if ok else 'BAD'} {prec:7} {layout} err {err:.2e} (tol {tol:.1e}) "
                          f"{p.describe()} {s}", flush=True)
    dump(out_dir, "tf32_check", rows)
    worst = {prec: max((r["err"] for r in rows if r["precision"] == prec), default=None) for prec in ("tf32", "3xtf32")}
    return {"checked": len(rows), "failed": sum(not r["ok"] for r in rows), "max_err": worst}


def section_tf32_bench(out_dir: str, budget: float) -> dict:
    rows = []
    for cp in PROBLEMS:
        if left(budget) < 0:
            print("tf32_bench: out of time", flush=True)
            break
        xs, ws, attrs = (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}
        try:
            row = {"problem": cp.name, "flops": picked(xs, ws, attrs, "float32")[0].flops, **tf32_row(xs, ws, attrs)}
        except Exception as exc:  # noqa: BLE001
            rows.append({"problem": cp.name, "error": str(exc)[:300]})
            continue
        row["tf32_tflops"] = row["flops"] / row["tf32_us"] / 1e6
        row["tf32_peak_pct"] = 100 * row["tf32_tflops"] * 1e12 / PEAK_TF32
        rows.append(row)
        print(f"tf32 {cp.name:20} cuDNN tf32 {min(row['vendor_tf32_us'].values()):8.1f} jit tf32 {row['tf32_us']:8.1f} "
              f"({row['ratio_tf32']:.2f}, {row['tf32_tflops']:.0f} TF/s) | cuDNN fp32 "
              f"{min(row['vendor_fp32_us'].values()):8.1f} jit 3x {row['3xtf32_us']:8.1f} ({row['ratio_3xtf32']:.2f}) "
              f"highest {row['highest_us']:8.1f} | err {row['tf32_err']:.1e} {row['3xtf32_err']:.1e} "
              f"{row['highest_err']:.1e} | {row['tf32_pick']}", flush=True)
        dump(out_dir, "tf32_bench", rows)
    dump(out_dir, "tf32_bench", rows)
    return {k: geo([r[k] for r in rows if k in r]) for k in ("ratio_tf32", "ratio_3xtf32", "x3_vs_highest")}


def small_cases_tf32() -> None:
    """One small case per new kernel variant (run under compute-sanitizer): tf32 NHWC fused
    epilogue, 3xtf32 NCHW (copy + NCHW y) with split-K."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 20, 9, 11, device="cuda", generator=gen)
    w = torch.randn(24, 20, 3, 3, device="cuda", generator=gen) * 0.1
    b = torch.randn(24, device="cuda", generator=gen)
    r = torch.randn(2, 24, 9, 11, device="cuda", generator=gen)
    xc = torch.randn(2, 32, 9, 11, device="cuda", generator=gen).to(memory_format=CL)
    wc = torch.randn(24, 32, 3, 3, device="cuda", generator=gen) * 0.1
    jitops.conv2d(xc, wc, b, padding=1, residual=r.to(memory_format=CL), activation="relu", precision="tf32",
                  schedule=mma.mma_schedule(64, 64, 32, 2, 2, 4))
    jitops.conv2d(x, w, b, padding=1, residual=r, precision="3xtf32", schedule=mma.mma_schedule(64, 32, 16, 2, 1, 4,
                                                                                                 split_k=2))
    torch.cuda.synchronize()
    print("tf32 small cases done")
