"""Issue 18 on a GPU, one command: bf16 and channels_last rows of leaky_relu, batch_norm,
group_norm, layer_norm and rms_norm against torch on the same tensors (float64 check first, output
poisoned with NaN; CUDA-graph replay and eager, medians), the row norms' persistent-grid +
prefetch option on fp16 64 MB problems, leaky_relu 16K-1M, and compute-sanitizer memcheck /
racecheck on one small case of each new kernel (`--sanitize` runs only those cases).

    python3 scripts/device_memops.py [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import jitops
from jitops.bench.timing import Timer, copy_bandwidth_gbs
from jitops.ops import get_op
from jitops.ops.norm_common import row_heuristic

F = torch.nn.functional
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CL = torch.channels_last


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def ref_group_norm(x, g, gamma, beta, eps):
    n, c = x.shape[:2]
    r = x.double().reshape(n, g, -1)
    y = (r - r.mean(-1, keepdim=True)) / (r.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return y.reshape(x.shape) * gamma.double().view(1, c, 1, 1) + beta.double().view(1, c, 1, 1)


def ref_rows(x, kind, gamma, beta, eps):
    xd = x.double()
    if kind == "rms":
        y = xd / (xd.square().mean(-1, keepdim=True) + eps).sqrt()
    else:
        y = (xd - xd.mean(-1, keepdim=True)) / (xd.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    y = y * gamma.double()
    return y + beta.double() if beta is not None else y


TOL = {"float32": 4e-6, "float16": 2e-3, "bfloat16": 5e-3}


# Shapes: full on the GPU; `--dry` (a CPU run of this script's logic on the emulator) uses small ones.
FULL = dict(lrelu=(1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 24, 1 << 26), lrelu_cl=(2, 320, 64, 64),
            bn=((256, 64, 56, 56), (8, 320, 64, 64)),
            gn_sd=[(2, 320, 64, 64), (2, 320, 32, 32), (2, 640, 32, 32), (2, 640, 16, 16), (2, 1280, 16, 16),
                   (2, 1280, 8, 8), (2, 960, 32, 32), (2, 1920, 16, 16)],
            gn_both=[(2, 320, 64, 64), (256, 64, 56, 56), (8, 320, 64, 64)],
            rows=((4096, 4096), (8192, 1024), (8192, 2048), (8192, 4096)),
            prefetch=((4096, 4096), (8192, 2048)),
            sweep=[(2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 16, 16)])
DRY = dict(lrelu=(1000, 4096), lrelu_cl=(2, 40, 4, 4), bn=((2, 16, 5, 5), (2, 24, 3, 3)),
           gn_sd=[(2, 64, 4, 4), (2, 96, 3, 3)], gn_both=[(2, 64, 4, 4)], rows=((64, 256), (32, 512)),
           prefetch=((512, 256), (256, 512)), sweep=[(2, 64, 4, 4)])
SHAPES = FULL
DEV = "cuda"


def cases(quick: bool):
    """(op, label, jitops fn, torch fn, float64 reference fn, out tensor, out-writing jitops fn, bytes, dtype)."""
    dev = DEV
    out = []

    def add(op, label, j, v, ref, poison, j_out, nbytes, dtype, spec=None):
        # the same tensors copied by torch: the bandwidth a memory-bound op can reach at this size
        x = poison
        cp = lambda x=x: x.clone(memory_format=torch.preserve_format)
        out.append(dict(op=op, label=label, j=j, v=v, ref=ref, poison=poison, j_out=j_out, bytes=nbytes, dtype=dtype,
                        copy=cp, spec=spec))

    # leaky_relu: bf16 vs fp16 vs fp32 over sizes (16K-1M is the leftover), and channels_last
    for dtype in ("float16", "bfloat16", "float32"):
        for n in SHAPES["lrelu"]:
            x = torch.randn(n, device=dev, dtype=DT[dtype])
            o = torch.empty_like(x)
            add("leaky_relu", f"n={n}", lambda x=x: jitops.leaky_relu(x, 0.01), lambda x=x: F.leaky_relu(x, 0.01),
                lambda x=x: torch.where(x.double() > 0, x.double(), 0.01 * x.double()), o,
                lambda x=x, o=o: jitops.leaky_relu(x, 0.01, out=o), 2 * n * x.element_size(), dtype,
                ("leaky_relu", {"x": x}, {"alpha": 0.01}, None))
    for dtype in ("float16", "bfloat16"):
        x = torch.randn(SHAPES["lrelu_cl"], device=dev, dtype=DT[dtype]).contiguous(memory_format=CL)
        o = torch.empty_like(x)
        add("leaky_relu", "2x320x64x64 channels_last", lambda x=x: jitops.leaky_relu(x, 0.01),
            lambda x=x: F.leaky_relu(x, 0.01), lambda x=x: torch.where(x.double() > 0, x.double(), 0.01 * x.double()),
            o, lambda x=x, o=o: jitops.leaky_relu(x, 0.01, out=o), 2 * x.numel() * x.element_size(), dtype,
            ("leaky_relu", {"x": x}, {"alpha": 0.01}, None))
    # batch_norm: fp32 parameters; NCHW bf16 vs fp16, channels_last fp16 / bf16
    for shape in SHAPES["bn"]:
        c = shape[1]
        m, v = torch.randn(c, device=dev) * 0.3, torch.rand(c, device=dev) + 0.5
        g, b = torch.randn(c, device=dev) * 0.5 + 1, torch.randn(c, device=dev) * 0.3
        for dtype in ("float16", "bfloat16"):
            for fmt in ("nchw", "channels_last"):
                x = torch.randn(shape, device=dev, dtype=DT[dtype]) * 2 + 0.5
                if fmt == "channels_last":
                    x = x.contiguous(memory_format=CL)
                o = torch.empty_like(x)
                shp = (1, c, 1, 1)
                add("batch_norm", f"{'x'.join(map(str, shape))} {fmt}",
                    lambda x=x, m=m, v=v, g=g, b=b: jitops.batch_norm(x, m, v, g, b),
                    lambda x=x, m=m, v=v, g=g, b=b: F.batch_norm(x, m, v, g, b, training=False),
                    lambda x=x, m=m, v=v, g=g, b=b, shp=shp: (x.double() - m.double().view(shp)) /
                    (v.double().view(shp) + 1e-5).sqrt() * g.double().view(shp) + b.double().view(shp),
                    o, lambda x=x, m=m, v=v, g=g, b=b, o=o: jitops.batch_norm(x, m, v, g, b, out=o),
                    2 * x.numel() * x.element_size() + 16 * c, dtype,
                    ("batch_norm", {"x": x, "mean": m, "var": v, "gamma": g, "beta": b}, {}, None))
    # group_norm: SD-UNet shapes channels_last (fp16, bf16), and NCHW bf16 vs fp16
    sd = SHAPES["gn_sd"]
    for shape in sd + [s for s in SHAPES["gn_both"] if s not in sd]:
        c = shape[1]
        groups = 32
        g, b = torch.randn(c, device=dev) * 0.5 + 1, torch.randn(c, device=dev)
        fmts = ("channels_last", "nchw") if shape in SHAPES["gn_both"] else ("channels_last",)
        for dtype in ("float16", "bfloat16"):
            for fmt in fmts:
                x = torch.randn(shape, device=dev, dtype=DT[dtype]) * 2 + 0.5
                if fmt == "channels_last":
                    x = x.contiguous(memory_format=CL)
                o = torch.empty_like(x)
                gx, bx = g.to(x.dtype), b.to(x.dtype)      # torch: parameters in x's dtype, converted once
                add("group_norm", f"{'x'.join(map(str, shape))} G=32 {fmt}",
                    lambda x=x, g=g, b=b: jitops.group_norm(x, groups, g, b),
                    lambda x=x, gx=gx, bx=bx: F.group_norm(x, groups, gx, bx),
                    lambda x=x, g=g, b=b: ref_group_norm(x, groups, g, b, 1e-5), o,
                    lambda x=x, g=g, b=b, o=o: jitops.group_norm(x, groups, g, b, out=o),
                    2 * x.numel() * x.element_size() + 8 * c, dtype,
                    ("group_norm", {"x": x, "gamma": g, "beta": b}, {"num_groups": groups}, None))
    # layer_norm / rms_norm: bf16 vs fp16 (fp32 parameters for bf16 as models keep them)
    for kind in ("layer", "rms"):
        for shape in SHAPES["rows"]:
            h = shape[1]
            for dtype in ("float16", "bfloat16"):
                x = torch.randn(shape, device=dev, dtype=DT[dtype]) * 2 + 0.5
                pt = torch.float32 if dtype == "bfloat16" else DT[dtype]
                g = (torch.randn(h, device=dev) * 0.5 + 1).to(pt)
                b = torch.randn(h, device=dev).to(pt) if kind == "layer" else None
                o = torch.empty_like(x)
                # torch gets its parameters in x's dtype, converted once here (not in the timed call)
                gx, bx = g.to(x.dtype), (b.to(x.dtype) if b is not None else None)
                if kind == "layer":
                    j = lambda x=x, g=g, b=b, h=h: jitops.layer_norm(x, h, g, b)
                    jo = lambda x=x, g=g, b=b, o=o, h=h: jitops.layer_norm(x, h, g, b, out=o)
                    v = lambda x=x, gx=gx, bx=bx, h=h: F.layer_norm(x, (h,), gx, bx)
                else:
                    j = lambda x=x, g=g, h=h: jitops.rms_norm(x, h, g)
                    jo = lambda x=x, g=g, o=o, h=h: jitops.rms_norm(x, h, g, out=o)
                    v = lambda x=x, gx=gx, h=h: F.rms_norm(x, (h,), gx)
                eps = 1e-5 if kind == "layer" else 1e-6
                ref = lambda x=x, g=g, b=b, kind=kind, eps=eps: ref_rows(x, kind, g, b, eps)
                add(f"{kind}_norm", f"{shape[0]}x{h}", j, v, ref, o, jo, 2 * x.numel() * x.element_size() + 8 * h,
                    dtype,
                    (f"{kind}_norm", {"x": x, "gamma": g, "beta": b}, {"normalized_shape": h}, None))
    return out


def prefetch_cases():
    """layer_norm / rms_norm fp16 64 MB: the heuristic against persistent grid + next-row prefetch."""
    dev = DEV
    device = jitops.get_backend().device
    out = []
    for name in ("layer_norm", "rms_norm"):
        op = get_op(name)
        for shape in SHAPES["prefetch"]:
            h = shape[1]
            x = torch.randn(shape, device=dev, dtype=torch.float16)
            g = torch.randn(h, device=dev, dtype=torch.float16)
            b = torch.randn(h, device=dev, dtype=torch.float16)
            from jitops.ops.base import TensorSpec
            p = TensorSpec((h,), "float16")
            ins = {"x": TensorSpec(shape, "float16"), "gamma": p}
            if name == "layer_norm":
                ins["beta"] = p
            prob = op.make_problem(ins, {"normalized_shape": h})
            base = op.heuristic(prob, device)
            scheds = [("heuristic", base)]
            for per_sm in (2, 4, 8):
                try:
                    s = row_heuristic(prob.row_spec(), device, base.algorithm,
                                      **{**dict(base.params), "per_sm": per_sm, "prefetch": True})
                    op.plan(prob, s, device)
                    scheds.append((f"per_sm={per_sm}+prefetch", s))
                except Exception as exc:  # noqa: BLE001 - report what does not apply
                    scheds.append((f"per_sm={per_sm}+prefetch: {exc}", None))
            for label, s in scheds:
                if s is None:
                    out.append(dict(op=name, label=f"{shape[0]}x{h} {label}", skip=True))
                    continue
                if name == "layer_norm":
                    j = lambda x=x, g=g, b=b, s=s, h=h: jitops.layer_norm(x, h, g, b, schedule=s)
                else:
                    j = lambda x=x, g=g, s=s, h=h: jitops.rms_norm(x, h, g, schedule=s)
                out.append(dict(op=name, label=f"{shape[0]}x{h} fp16 {label}", j=j, sched=str(s),
                                spec=(name, {"x": x, "gamma": g, "beta": b}, {"normalized_shape": h}, s),
                                ref=lambda x=x, g=g, b=b, name=name: ref_rows(
                                    x, "layer" if name == "layer_norm" else "rms", g,
                                    b if name == "layer_norm" else None, 1e-5 if name == "layer_norm" else 1e-6),
                                bytes=2 * x.numel() * 2 + 4 * h, dtype="float16"))
    return out


def sweep_cases():
    """group_norm NHWC fp16 on SD-UNet shapes: the heuristic's parameters and neighbours (block
    threads, pixels per block, loads in flight), to set the heuristic from."""
    from jitops.ops import group_norm_nhwc
    from jitops.ops.base import TensorSpec
    device = jitops.get_backend().device
    op = get_op("group_norm")
    out = []
    for shape in SHAPES["sweep"]:
        c = shape[1]
        x = (torch.randn(shape, device=DEV, dtype=torch.float16) * 2 + 0.5).contiguous(memory_format=CL)
        g, b = torch.randn(c, device=DEV) * 0.5 + 1, torch.randn(c, device=DEV)
        p = TensorSpec((c,), "float32")
        prob = op.make_problem({"x": TensorSpec(shape, "float16", "nhwc"), "gamma": p, "beta": p}, {"num_groups": 32})
        base = group_norm_nhwc.heuristic(prob, device)
        ppb = int(base["pixels_per_block"])
        seen = set()
        for threads in (128, 256, 512):
            for unroll in (2, 4, 8):
                for f in (0.5, 1, 2, 4):
                    try:
                        s = group_norm_nhwc.heuristic(prob, device, "nhwc", threads=threads, unroll=unroll,
                                                      pixels_per_block=max(1, int(ppb * f)))
                        op.plan(prob, s, device)
                    except Exception:  # noqa: BLE001 - shapes a parameter set cannot run
                        continue
                    if s in seen or (unroll != 4 and f != 1):
                        continue
                    seen.add(s)
                    out.append(dict(op="group_norm_sweep", label=f"{'x'.join(map(str, shape))} fp16 channels_last "
                                    f"threads={threads} unroll={unroll} ppb={max(1, int(ppb * f))}",
                                    j=lambda x=x, g=g, b=b, s=s: jitops.group_norm(x, 32, g, b, schedule=s),
                                    ref=lambda x=x, g=g, b=b: ref_group_norm(x, 32, g, b, 1e-5), sched=str(s),
                                    heuristic=s == base, bytes=2 * x.numel() * 2 + 8 * c, dtype="float16",
                                    spec=("group_norm", {"x": x, "gamma": g, "beta": b}, {"num_groups": 32}, s)))
    return out


def precompile(all_cases) -> dict:
    """Every kernel the cases will launch, compiled up front by parallel worker processes into the
    disk cache (the first calls then only load): NVRTC one kernel at a time in this process would
    take most of the device budget."""
    from jitops import arrays
    from jitops.cache import loader
    from jitops.engine import kernel_source, select_schedule
    from jitops.ops.base import TensorSpec
    from jitops.tuning.compile_pool import CompileJob, CompilePool
    backend = jitops.get_backend()
    jobs = {}
    for case in all_cases:
        if not case.get("spec"):
            continue
        op_name, tensors, attrs, forced = case["spec"]
        op = get_op(op_name)
        specs = {}
        for n in op.INPUTS:
            t = tensors.get(n)
            if t is None:
                specs[n] = None
            else:
                r = arrays.wrap(t, n, op_name)
                specs[n] = TensorSpec(tuple(r.shape), r.dtype, r.layout)
        try:
            problem = op.make_problem(specs, attrs)
            sched, _ = select_schedule(op, problem, backend.device, forced)
            plan = op.plan(problem, sched, backend.device)
        except Exception as exc:  # noqa: BLE001 - the timed call reports it
            print(f"precompile: {case['label']}: {exc}", flush=True)
            continue
        for launch in (*plan.prepare, *plan.launches):
            source = kernel_source(backend.device, launch)
            key = loader().key_for(backend, source, [launch.kernel])
            jobs[key] = CompileJob(key, source, (launch.kernel,), f"{op_name}.{launch.kernel}")
    t0 = time.time()
    with CompilePool(backend, timeout_s=120) as pool:
        outcomes = pool.run(list(jobs.values()))
    bad = {k: o.error[:200] for k, o in outcomes.items() if not o.ok}
    print(f"precompiled {len(jobs)} kernels in {time.time() - t0:.1f} s, {len(bad)} failed", flush=True)
    return {"kernels": len(jobs), "seconds": time.time() - t0, "failed": bad}


def sanitize_cases() -> None:
    """One small case of each new kernel (NHWC group-norm stats + apply, NHWC batch-norm apply,
    bf16 leaky_relu / row norm), checked, for compute-sanitizer."""
    dev = DEV
    x = torch.randn(2, 40, 6, 6, device=dev, dtype=torch.bfloat16).contiguous(memory_format=CL)
    g, b = torch.randn(40, device=dev), torch.randn(40, device=dev)
    from jitops.ops.base import Schedule
    for s in (None, Schedule.make("nhwc", vec=8, threads=5, unroll=2, pixels_per_block=5, apply_block=256,
                                  apply_unroll=2)):
        for _ in range(2):
            y = jitops.group_norm(x, 4, g, b, schedule=s)
            assert rel_err(y, ref_group_norm(x, 4, g, b, 1e-5)) <= 5e-3
    m, v = torch.randn(40, device=dev), torch.rand(40, device=dev) + 0.5
    y = jitops.batch_norm(x, m, v, g, b)
    shp = (1, 40, 1, 1)
    ref = (x.double() - m.double().view(shp)) / (v.double().view(shp) + 1e-5).sqrt() * g.double().view(shp) + \
        b.double().view(shp)
    assert rel_err(y, ref) <= 5e-3
    y = jitops.leaky_relu(x, 0.1)
    assert rel_err(y, torch.where(x.double() > 0, x.double(), 0.1 * x.double())) <= 5e-3
    r = torch.randn(33, 200, device=dev, dtype=torch.bfloat16)
    y = jitops.layer_norm(r, 200, g.new_ones(200), g.new_zeros(200))
    assert rel_err(y, ref_rows(r, "layer", g.new_ones(200), g.new_zeros(200), 1e-5)) <= 5e-3
    if DEV == "cuda":
        torch.cuda.synchronize()
    print("sanitize cases ok")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds for the timing part")
    ap.add_argument("--dry", action="store_true", help="CPU emulator, small shapes, no timings (checks this script)")
    args = ap.parse_args()
    global SHAPES, DEV
    if args.dry:
        SHAPES, DEV = DRY, "cpu"
    if args.sanitize:
        sanitize_cases()
        return
    t0 = time.time()
    timer = Timer(torch if not args.dry else None)
    copy = copy_bandwidth_gbs(timer) if not args.dry else 1.0
    if args.dry:
        timer.graph_us = lambda fn, n=50: (fn(), 1.0)[1]
        timer.per_call_us = lambda fn, n=50: (fn(), 1.0)[1]
    name = torch.cuda.get_device_name() if not args.dry else "dry run"
    print(f"{name} {time.strftime('%Y-%m-%d')} copy {copy:.0f} GB/s", flush=True)
    rows = []
    n = 20 if args.quick else 50
    order = {"group_norm": 0, "batch_norm": 1, "layer_norm": 2, "rms_norm": 2, "leaky_relu": 3}
    all_cases = sorted(cases(args.quick), key=lambda c: order[c["op"]]) + prefetch_cases() + sweep_cases()
    pre = precompile(all_cases)
    for case in all_cases:
        if case.get("skip"):
            rows.append({"op": case["op"], "label": case["label"], "skipped": True})
            continue
        if time.time() - t0 > args.budget:
            print("budget spent: stopping timings", flush=True)
            break
        row = {"op": case["op"], "label": case["label"], "dtype": case["dtype"]}
        try:
            if "poison" in case:
                case["poison"].fill_(float("nan"))
                case["j_out"]()
                y = case["poison"]
            else:
                y = case["j"]()
            row["error"] = err = rel_err(y, case["ref"]())
            row["ok"] = err <= TOL[case["dtype"]] and not bool(torch.isnan(y).any())
            if "poison" in case:
                row["same_format"] = bool(case["j"]().stride() == y.stride())
            row["jitops_graph_us"] = timer.graph_us(case["j"], n=n)
            row["jitops_us"] = timer.per_call_us(case["j"], n=n)
            if case.get("copy") is not None:
                row["copy_graph_us"] = cg = timer.graph_us(case["copy"], n=n)
                if cg and row["jitops_graph_us"]:
                    row["pct_same_size_copy"] = 100.0 * cg / row["jitops_graph_us"]
            if case.get("v") is not None:
                row["torch_graph_us"] = timer.graph_us(case["v"], n=n)
                row["torch_us"] = timer.per_call_us(case["v"], n=n)
                jt, vt = row["jitops_graph_us"], row["torch_graph_us"]
                if jt and vt:
                    row["ratio"] = vt / jt
            jt = row["jitops_graph_us"] or row["jitops_us"]
            row["pct_copy"] = 100.0 * case["bytes"] / (jt * 1e-6) / 1e9 / copy
            if "sched" in case:
                row["schedule"] = case["sched"]
            if "heuristic" in case:
                row["heuristic"] = case["heuristic"]
        except Exception as exc:  # noqa: BLE001 - one failing row must not hide the others
            row["exception"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "copy_gbs": copy, "torch": torch.__version__, "precompile": pre, "rows": rows}
    with open(os.path.join(args.out, "memops.json"), "w") as f:
        json.dump(report, f, indent=1)
    bad = [r for r in rows if r.get("ok") is False or "exception" in r]
    print(f"{len(rows)} rows, {len(bad)} failed checks or exceptions, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
