"""The few-channel 1x1 stream (conv2d `pointwise_mma`) on the device, one call: every real-network layer it
applies to (torchvision nets, forward hooks, random weights; fp16 channels_last), each of its schedules
checked against float64 in a NaN-filled output and timed by graph replay beside the heuristic's pick
without it (the previous pick), the pick with it, and cuDNN (benchmark mode, best of NCHW /
channels_last); the pick also with bias + residual + relu and in bf16 (checked). Then whole networks
with every conv on jitops, the kernel off and on in alternating passes (BN / activations left to torch;
these run first), and compute-sanitizer memcheck / racecheck on small cases.

    python3 scripts/device_conv2d_pointwise.py OUT_DIR [--nets mobilenet_v3_large:32,...] [--whole NETS]
        [--budget SECONDS] [--sanitize]

Raw results: OUT_DIR/pointwise_LAYOUT.json (rewritten after every layer), OUT_DIR/whole_LAYOUT.json; --layout nchw
runs the layers and networks in torch's default format (cuDNN's figure is still its better layout; both are kept).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops import engine  # noqa: E402
from jitops.ops import conv2d_pointwise as pw  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402
from jitops.ops.conv2d_cost import estimate  # noqa: E402
from jitops.prepared import clear_prepared  # noqa: E402

from conv2d_devkit import CL, graph_us, ref_f64, rel_err, vendor_times  # noqa: E402
from conv2d_pick_regret import layout_of  # noqa: E402
from device_conv2d_pool_sweep import distinct_layers  # noqa: E402

OP = get_op("conv2d")
T0 = time.time()
TOL = {"float16": 4e-3, "bfloat16": 2e-2}
NETS = "mobilenet_v3_large:32,efficientnet_b0:32,efficientnet_b3:32,resnet50:32,densenet121:32,mobilenet_v3_large:8"


@contextlib.contextmanager
def without_pointwise():
    """The heuristic as before this kernel: it applies to nothing."""
    keep = pw.MAX_COUT
    pw.MAX_COUT = 0
    try:
        yield
    finally:
        pw.MAX_COUT = keep


def check(x, w, ref, s, attrs, b=None, r=None, act=None, dtype="float16") -> float:
    out = torch.full(tuple(ref.shape), float("nan"), dtype=x.dtype, device="cuda")
    out = out.to(memory_format=CL) if x.is_contiguous(memory_format=CL) and not x.is_contiguous() else out
    y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, **({"activation": act} if act else {}), **attrs)
    torch.cuda.synchronize()
    return rel_err(y, ref)


def layer_rows(args, device) -> list:
    rows = []
    for name, xs, ws, attrs, count in distinct_layers(args.nets):
        nchw = args.layout == "nchw"
        p = OP.make_problem({"x": TensorSpec(xs, "float16", "" if nchw else layout_of(xs)),
                             "w": TensorSpec(ws, "float16"), "bias": None}, attrs)
        if pw.why_not(p) is not None:      # a 1 x 1 image is NCHW (layout_of), which takes H * W % 8 == 0
            continue
        fmt = torch.contiguous_format if nchw else CL
        if time.time() - T0 > args.budget:
            print("budget spent", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(xs, device="cuda", dtype=torch.float16, generator=g).to(memory_format=fmt)
        w = torch.randn(ws, device="cuda", dtype=torch.float16, generator=g) * ws[1] ** -0.5
        with without_pointwise():
            old = OP.heuristic(p, device)
            t_old_est = estimate(p, old, device)
        new = OP.heuristic(p, device)
        ref = ref_f64(x, w, None, (1, 1), (0, 0, 0, 0), (1, 1), 1)
        times, errs, ests = {}, {}, {}
        for s in [old] + pw.candidates(p, device) + ([new] if new.algorithm != pw.ALGORITHM else []):
            key = str(s)
            if key in times:
                continue
            errs[key] = err = check(x, w, ref, s, attrs)
            if not err <= TOL["float16"]:
                print(f"   WRONG RESULT {name} {key}: {err:.3e}", flush=True)
                continue
            times[key] = graph_us(lambda: jitops.conv2d(x, w, schedule=s, **attrs))
            ests[key] = estimate(p, s, device) * 1e6
        # the pick with bias + residual + relu, and in bf16
        b = torch.randn(ws[0], device="cuda", dtype=torch.float16, generator=g)
        r = torch.randn((xs[0], ws[0], xs[2], xs[3]), device="cuda", dtype=torch.float16,
                        generator=g).to(memory_format=fmt)
        ref_e = ref_f64(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, residual=r, act="relu")
        sched = new if new.algorithm == pw.ALGORITHM else pw.candidates(p, device)[0]
        err_epi = check(x, w, ref_e, sched, attrs, b=b, r=r, act="relu")
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        err_bf16 = check(xb, wb, ref_f64(xb, wb, None, (1, 1), (0, 0, 0, 0), (1, 1), 1), sched, attrs)
        vendor = vendor_times(x.contiguous(), w, None, attrs)
        cudnn = min(vendor.values())
        ours = [k for k in times if pw.ALGORITHM in k]
        best = min(ours, key=times.get) if ours else str(old)
        nan = float("nan")
        row = {"layer": name, "x": xs, "w": ws, "count": count, "cudnn_us": cudnn, "cudnn": vendor, "layout": args.layout,
               "old": str(old), "new": str(new),
               "old_est_us": t_old_est * 1e6, "times": times, "errs": errs, "ests": ests,
               "err_epilogue": err_epi, "err_bf16": err_bf16}
        rows.append(row)
        ok = err_epi <= TOL["float16"] and err_bf16 <= TOL["bfloat16"]
        t_old, t_new = times.get(str(old), nan), times.get(str(new), nan)
        print(f"{name:44s} x{count} cuDNN {cudnn:6.1f}  old {t_old:6.1f}  new {t_new:6.1f} "
              f"({t_old / t_new:.2f}x, {cudnn / t_new:.2f}x cuDNN)  best pointwise "
              f"{times.get(best, nan):6.1f} {best[len(pw.ALGORITHM) + 1:]}  epilogue/bf16 {'ok' if ok else 'WRONG'} "
              f"({err_epi:.1e}, {err_bf16:.1e})  ({time.time() - T0:.0f} s)", flush=True)
        with open(os.path.join(args.out, f"pointwise_{args.layout}.json"), "w") as f:
            json.dump(rows, f, indent=1)
        clear_prepared()
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def whole(args) -> None:
    import device_conv2d_networks as nets
    from device_conv2d_networks import run_net
    if args.layout == "nchw":
        nets.CL = torch.contiguous_format           # both sides in torch's default format
    torch.backends.cudnn.benchmark = True
    rows = []
    for net in [n for n in args.whole.split(",") if n]:
        res = {"old": [], "new": []}
        for _ in range(args.passes):
            for label in ("old", "new"):
                engine.clear_prepared()
                print(f"  {label}: ", end="", flush=True)
                with (without_pointwise() if label == "old" else contextlib.nullcontext()):
                    res[label].append(run_net(net, args.batch, torch.float16))
        best = {k: min(v, key=lambda r: r["jitops_us"]) for k, v in res.items()}
        torch_us = min(min(r["torch_us"], r["torch_us_2"]) for v in res.values() for r in v)
        row = {"net": net, "batch": args.batch, "layout": args.layout, "torch_us": torch_us, "old_us": best["old"]["jitops_us"],
               "new_us": best["new"]["jitops_us"], "passes": res}
        rows.append(row)
        print(f"{net:20} b{args.batch} torch {torch_us:8.0f} us  without {row['old_us']:8.0f} us "
              f"({torch_us / row['old_us']:.3f}x)  with {row['new_us']:8.0f} us ({torch_us / row['new_us']:.3f}x)  "
              f"with / without {row['old_us'] / row['new_us']:.3f}x", flush=True)
        with open(os.path.join(args.out, f"whole_{args.layout}.json"), "w") as f:
            json.dump(rows, f, indent=1)


def small_cases() -> None:
    """One small call per code path (for compute-sanitizer): walks, padded K / N, odd Cout, epilogue, bf16."""
    dev = jitops.get_backend().device
    for (n, cin, h, w_, cout), s, dt in (((2, 16, 15, 23, 16), pw.schedule(1, 3, 2), torch.float16),
                                        ((1, 24, 9, 7, 20), pw.schedule(2, 2, 4), torch.float16),
                                        ((1, 40, 5, 7, 21), pw.schedule(4, 4, 2), torch.bfloat16),
                                        ((3, 64, 17, 19, 128), pw.schedule(1, 4, 2), torch.float16),
                                        ((5, 16, 5, 8, 16), pw.schedule(1, 3, 2), None),       # NCHW from here
                                        ((2, 24, 4, 6, 21), pw.schedule(2, 2, 1), None),
                                        ((3, 64, 8, 9, 128), pw.schedule(1, 4, 2), None)):
        fmt = CL if dt is not None else torch.contiguous_format
        dt = dt or torch.float16
        x = torch.randn(n, cin, h, w_, device="cuda", dtype=dt).to(memory_format=fmt)
        wt = torch.randn(cout, cin, 1, 1, device="cuda", dtype=dt)
        b = torch.randn(cout, device="cuda", dtype=dt)
        r = torch.randn(n, cout, h, w_, device="cuda", dtype=dt).to(memory_format=fmt)
        ref = ref_f64(x, wt, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, residual=r, act="relu")
        err = check(x, wt, ref, s, {}, b=b, r=r, act="relu")
        assert err <= TOL["bfloat16"], (n, cin, cout, s, err)
        print(f"small case {cin}->{cout} {s} on {dev.name}: error {err:.1e}", flush=True)


def sanitize(out: str) -> None:
    for tool in ("memcheck", "racecheck"):
        t0 = time.time()
        proc = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                               __file__, out, "--small"], capture_output=True, text=True, timeout=300)
        with open(os.path.join(out, f"sanitize_{tool}.txt"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        tail = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR SUMMARY" in ln or "error" in ln.lower()]
        print(f"compute-sanitizer {tool}: rc {proc.returncode} in {time.time() - t0:.0f} s  {tail[-1:] if tail else ''}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--nets", default=NETS)
    ap.add_argument("--whole", default="mobilenet_v3_large,efficientnet_b0,resnet50")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc", help="of the layers and networks")
    ap.add_argument("--small", action="store_true", help="only the small cases (what --sanitize runs)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.small:
        small_cases()
        return
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    if args.sanitize:
        sanitize(args.out)
    if args.whole:
        whole(args)
    if args.nets:
        layer_rows(args, jitops.get_backend().device)


if __name__ == "__main__":
    main()
