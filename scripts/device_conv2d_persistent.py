"""conv2d wgmma picks and sweeps on the device, one call: compute-sanitizer (memcheck, racecheck) on
persistent tiles that loop over tiles, optionally the GPU conv2d tests, then graph-replay times
against cuDNN, every output checked against float64 (written into a NaN-filled output) before it
is timed. Kernels are compiled first, in parallel worker processes, while the sanitizers and the
tests run; nothing is timed until those have finished.

  python3 scripts/device_conv2d_persistent.py OUT_DIR --picks [--dtypes float16,bfloat16,tf32]
          [--big-dtypes ...] [--layer-dtypes tf32,bfloat16] [--sections bench,big,layers,nchw] [--old build/base]
      the heuristic's pick on the benchmark problems, the large layers (SD-UNet b2, ResNet-50
      b32) and the torchvision layers (batch 8), channels_last, against cuDNN at its best of
      NCHW and channels_last. --old DIR: a source tree whose jitops is the heuristic before this
      change (`git archive BASE jitops | tar -x -C DIR`); where its pick differs it is timed too
      ("original"). Section nchw: the TF32 layers whose algorithm the change moved, on NCHW input.
  python3 scripts/device_conv2d_persistent.py OUT_DIR --sweep [--dtypes tf32] [--sections bench,big]
      every wgmma candidate (persistent tiles included) and the pick, one run
  --pytest: also run `pytest -m gpu tests/test_gpu_conv2d.py` (beside the compiles, before timing)
  --budget SECONDS: stop timing when they are spent (the table and JSON hold what was done)

Raw results: OUT_DIR/picks.json, sweep.json, sanitize.json, pytest.log (docs/data/conv2d_*_h100_*/).
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
from jitops.ops import conv2d_wgmma as wg  # noqa: E402

from conv2d_devkit import CL, TensorSpec, conv_case, graph_us, op, pads4, pair, ref_f64, rel_err, vendor_times  # noqa: E402
from device_conv2d_wgmma import BIG, TOL  # noqa: E402

T0 = time.time()
# The persistent tiles the sanitizers run: 1 and 2 blocks per multiprocessor, and those added on 2026-11-26.
SANITIZE_TILES = ((128, 128, 3, 0), (64, 128, 4, 0), (256, 128, 4, 0), (192, 128, 5, 0), (128, 192, 4, 0),
                  (128, 128, 6, 0), (256, 64, 4, 0))


def small_cases() -> None:
    """fp16 and TF32 persistent tiles on 150-300 tiles (blocks loop), bias + residual + ReLU:
    what the sanitizers run."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for dt, extra in ((torch.float16, {}), (torch.float32, {"precision": "tf32"})):
        x = torch.randn(2, 64, 120, 160, device="cuda", generator=g).to(dt).to(memory_format=CL)
        w = (torch.randn(40, 64, 3, 3, device="cuda", generator=g) * 0.05).to(dt)
        b = torch.randn(40, device="cuda", generator=g).to(dt)
        r = torch.randn(2, 40, 120, 160, device="cuda", generator=g).to(dt).to(memory_format=CL)
        for tile in SANITIZE_TILES:
            s = wg.schedule(*tile, bk=64 if dt != torch.float32 else 32, persistent=True)
            jitops.conv2d(x, w, b, padding=1, residual=r, activation="relu", schedule=s, **extra)
    torch.cuda.synchronize()
    print("small cases done", flush=True)


def small_tma_cases() -> None:
    """fp16 and TF32 TMA tiles (plain and persistent grids: blocks loop over 40-150 tiles; 3 K splits),
    bias + residual + ReLU, C = 40 (one partial chunk) and 96 (two): what the sanitizers run with --tma."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for dt, extra in ((torch.float16, {}), (torch.float32, {"precision": "tf32"})):
        for cin in (40, 96):
            x = torch.randn(2, cin, 60, 80, device="cuda", generator=g).to(dt).to(memory_format=CL)
            w = (torch.randn(72, cin, 3, 3, device="cuda", generator=g) * 0.05).to(dt)
            b = torch.randn(72, device="cuda", generator=g).to(dt)
            r = torch.randn(2, 72, 60, 80, device="cuda", generator=g).to(dt).to(memory_format=CL)
            for tile in ((128, 128, 4, 2, 0), (256, 128, 4, 2, 232), (64, 128, 4, 1, 0), (128, 128, 6, 2, 232, 1)):
                for persistent, split in ((False, 1), (True, 1)) + (((False, 3),) if len(tile) == 5 else ()):
                    s = wg.tma_schedule(tile, 64 if dt != torch.float32 else 32, persistent=persistent, split_k=split)
                    jitops.conv2d(x, w, b, padding=1, residual=r, activation="relu", schedule=s, **extra)
    torch.cuda.synchronize()
    print("small TMA cases done", flush=True)


# ---------------------------------------------------------------- problems

_LAYERS: list = []
PICKS_FIRST = False


def items(sections: list[str]) -> list:
    """(section, label, x shape, w shape, attrs, has bias)."""
    out = []
    if "bench" in sections:
        out += [("bench", cp.name, (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}, False)
                for cp in PROBLEMS]
    if "big" in sections:
        out += [("big", f"big{i}", xs, ws, {"stride": st, "padding": pd}, False) for i, (xs, ws, st, pd) in enumerate(BIG)]
    if "layers" in sections or "nchw" in sections:
        if not _LAYERS:
            from conv2d_layers import collect_layers
            _LAYERS.extend(collect_layers())
        for net, (xs, ws, st, pd, dl, g, has_b) in _LAYERS:
            if g == 1 or ws[1] % 8 == 0 and g < ws[0]:
                out.append(("layers", net, xs, ws, {"stride": tuple(st), "padding": tuple(pd), "dilation": tuple(dl),
                                                     "groups": g}, has_b))
    return out


def spec_of(xs, ws, attrs, has_b, dtype, layout="nhwc"):
    tf32 = dtype == "tf32"
    dt = "float32" if tf32 else dtype
    a = {**attrs, **({"precision": "tf32"} if tf32 else {})}
    spec = {"x": TensorSpec(tuple(xs), dt, "nhwc" if layout == "nhwc" else ""), "w": TensorSpec(tuple(ws), dt),
            "bias": TensorSpec((ws[0],), dt) if has_b else None}
    return spec, a


def problem_of(xs, ws, attrs, has_b, dtype, layout="nhwc"):
    spec, a = spec_of(xs, ws, attrs, has_b, dtype, layout)
    return op.make_problem(spec, a), a


def old_picks(tree: str, jobs: list) -> list:
    """The heuristic of another source tree (the code before a change) on the same problems, in a
    subprocess with that tree first on the path: its schedules as strings (None where it failed)."""
    code = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jitops
from jitops.device import DeviceInfo
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
assert jitops.__file__.startswith(sys.argv[1]), jitops.__file__
op = get_op("conv2d")
payload = json.load(sys.stdin)
dev = DeviceInfo(**payload["device"])
out = []
for xs, ws, attrs, has_b, dt, layout, prec in payload["problems"]:
    attrs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()}
    if prec:
        attrs["precision"] = prec
    spec = {"x": TensorSpec(tuple(xs), dt, layout), "w": TensorSpec(tuple(ws), dt),
            "bias": TensorSpec((ws[0],), dt) if has_b else None}
    try:
        out.append(str(op.heuristic(op.make_problem(spec, attrs), dev)))
    except Exception as exc:
        out.append(None)
print(json.dumps(out))
"""
    payload = {"device": jitops.get_backend().device.as_dict(),     # the same device description
               "problems": [[list(xs), list(ws), attrs, has_b, "float32" if dt == "tf32" else dt,
                             "nhwc" if layout == "nhwc" else "", "tf32" if dt == "tf32" else None]
                            for xs, ws, attrs, has_b, dt, layout in jobs]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p and os.path.abspath(p) != os.path.abspath(".")])
    res = subprocess.run([sys.executable, "-c", code, os.path.abspath(tree)], input=json.dumps(payload, default=list),
                         capture_output=True, text=True, env=env, timeout=300)
    if res.returncode:
        print(f"old picks failed: {res.stderr[-1500:]}", flush=True)
        return [None] * len(jobs)
    return json.loads(res.stdout.strip().splitlines()[-1])


def schedule_of(text: str | None):
    if not text:
        return None
    import re
    from jitops.ops.base import Schedule
    params = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in re.findall(r"(\w+)=(\w+)", text)}
    return Schedule.make(text.split("(")[0], **params)


# ---------------------------------------------------------------- compiling ahead

def launch_keys(p, s) -> list:
    """(binary-cache key, source, kernel) of every launch of the schedule's plan."""
    from jitops.cache import loader
    from jitops.engine import kernel_source
    be = jitops.get_backend()
    plan = op.plan(p, s, be.device)
    out = []
    for launch in (*plan.prepare, *plan.launches):
        src = kernel_source(be.device, launch)
        out.append((loader().key_for(be, src, [launch.kernel]), src, launch.kernel))
    return out


def compiled(p, s) -> bool:
    """Whether every kernel of the schedule is in the disk cache already (a sweep skips the others
    rather than compile them one by one while timing)."""
    from jitops.cache import loader
    try:
        return all(loader().disk.get(key) is not None for key, _, _ in launch_keys(p, s))
    except Exception:  # noqa: BLE001 - it fails again, reported, when it runs
        return True


def precompile(work: list, workers: int, deadline: float | None = None) -> None:
    """Compile every kernel of these (problem, schedule) plans in parallel worker processes (the
    tuner's pool), in the given order until the deadline; later calls load them from the disk cache."""
    from jitops.tuning.compile_pool import CompileJob, compile_missing
    be = jitops.get_backend()
    jobs, seen = [], set()
    for p, s in work:
        try:
            for key, src, kernel in launch_keys(p, s):
                if key not in seen:
                    seen.add(key)
                    jobs.append(CompileJob(key, src, (kernel,), f"conv2d.{kernel}"))
        except Exception as exc:  # noqa: BLE001 - it fails again, reported, when it runs
            print(f"precompile: {s}: {exc}"[:300], flush=True)
    t = time.time()
    res = compile_missing(jobs, be, workers, 120.0, None if deadline is None else time.monotonic() + deadline - (
        time.time() - T0), progress=False)
    bad = [o for o in res.values() if not o.ok]
    print(f"precompiled {sum(o.ok for o in res.values())} of {len(jobs)} kernels in {time.time() - t:.0f} s with "
          f"{workers} workers; {sum(o.status == 'skipped' for o in res.values())} skipped at the deadline, "
          f"{sum(o.status in ('failed', 'timeout') for o in res.values())} failed", flush=True)
    for o in [o for o in bad if o.status != "skipped"][:5]:
        print(f"  {o.status}: {o.error[:300]}", flush=True)


# ---------------------------------------------------------------- timing

def checked_us(xl, w, b, attrs, s, ref, tol) -> float | str:
    """Graph-replay time of one schedule after its output, written into a NaN-filled tensor, was
    checked against float64 (a NaN left anywhere fails the check); a wrong output is never timed."""
    try:
        out = torch.full(tuple(ref.shape), float("nan"), dtype=xl.dtype, device="cuda")
        if xl.is_contiguous(memory_format=CL) and not xl.is_contiguous():
            out = out.to(memory_format=CL)
        y = jitops.conv2d(xl, w, b, schedule=s, out=out, **attrs)
        torch.cuda.synchronize()
        err = rel_err(y, ref)
        if not err <= tol:
            print(f"  BAD {s}: err {err:.2e} > {tol:.0e}", flush=True)
            return f"wrong: err {err:.3e}"
        return graph_us(lambda: jitops.conv2d(xl, w, b, schedule=s, **attrs))
    except Exception as exc:  # noqa: BLE001 - a schedule that fails is data too
        return f"error: {exc}"[:300]


def case_tensors(xs, ws, attrs, has_b, dtype):
    dt = "float32" if dtype == "tf32" else dtype
    x, w, b = conv_case(xs, ws, attrs, dt, has_b)
    ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)), pair(attrs.get("dilation", 1)),
                  attrs.get("groups", 1))
    return x, w, b, ref


def release() -> None:
    """Free what the timed plans hold (packed weights, workspaces of every stream a graph was
    captured on) and torch's cached blocks: a sweep of 135 problems ran out of the H100's 80 GB
    without this (2026-11-26)."""
    from jitops.engine import clear_prepared
    clear_prepared()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def cudnn(x, w, b, attrs, dtype) -> dict:
    return vendor_times(x, w, b, {k: v for k, v in attrs.items() if k != "precision"}, tf32=dtype == "tf32")


def run_sweep(args, probs, out_rows) -> None:
    for sec, label, xs, ws, attrs, has_b, dtype, p, a, pick, old in probs:
        if time.time() - T0 > args.budget:
            print("sweep: out of time", flush=True)
            return
        x, w, b, ref = case_tensors(xs, ws, attrs, has_b, dtype)
        xl = x.to(memory_format=CL)
        cands = [s for s in wg.candidates(p, jitops.get_backend().device)]
        if pick not in cands:
            cands.append(pick)
        if dtype != "tf32":             # other precisions: the persistent tiles beside the pick
            cands = [s for s in cands if wg.is_persistent(s) or s == pick]
        if args.tma:                    # the TMA kernel's tiles beside the pick
            cands = wg.tma_candidates(p, jitops.get_backend().device) + [pick]
        skipped = [s for s in cands if s != pick and not compiled(p, s)]
        cands = [s for s in cands if s not in skipped]
        row = {"section": sec, "label": label, "dtype": dtype, "x": list(xs), "w": list(ws), "attrs": attrs,
               "cudnn": cudnn(x, w, b, attrs, dtype), "pick": str(pick),
               "times": {str(s): checked_us(xl, w, b, a, s, ref, TOL[dtype]) for s in cands}}
        row["not_compiled"] = [str(s) for s in skipped]
        good = {k: v for k, v in row["times"].items() if isinstance(v, float)}
        row["fastest"] = min(good, key=good.get) if good else None
        out_rows.append(row)
        bad = sum(isinstance(v, str) for v in row["times"].values())
        pk = row["times"].get(str(pick))
        print(f"sweep {dtype:8} {label:20} {len(good)} timed, {bad} wrong/failed; cuDNN {min(row['cudnn'].values()):8.1f} "
              f"pick {pk if isinstance(pk, str) else f'{pk:8.1f}'} fastest {good.get(row['fastest'], float('nan')):8.1f} "
              f"{row['fastest']}", flush=True)
        json.dump(out_rows, open(os.path.join(args.out, "sweep.json"), "w"), indent=1)
        del x, w, b, ref, xl
        release()


def run_picks(args, probs, out_rows) -> None:
    for sec, label, xs, ws, attrs, has_b, dtype, p, a, pick, old in probs:
        if time.time() - T0 > args.budget:
            print("picks: out of time", flush=True)
            return
        nchw = sec == "nchw"
        x, w, b, ref = case_tensors(xs, ws, attrs, has_b, dtype)
        xl = x if nchw else x.to(memory_format=CL)
        row = {"section": sec, "label": label, "dtype": dtype, "x": list(xs), "w": list(ws), "attrs": attrs,
               "layout": "nchw" if nchw else "nhwc", "pick": str(pick), "cudnn": cudnn(x, w, b, attrs, dtype)}
        row["cudnn_nhwc"] = row["cudnn"]["nhwc"]
        row["cudnn_best"] = min(row["cudnn"].values())
        row["pick_us"] = checked_us(xl, w, b, a, pick, ref, TOL[dtype])
        if old is not None and str(old) != str(pick):
            row["original"] = str(old)
            row["original_us"] = checked_us(xl, w, b, a, old, ref, TOL[dtype])
        if isinstance(row["pick_us"], float):
            row["vs_cudnn"] = row["cudnn_best"] / row["pick_us"]
            row["tflops"] = p.flops / row["pick_us"] / 1e6
        out_rows.append(row)
        o = row.get("original_us")
        print(f"pick {dtype:8} {sec:6} {label:20} {str(xs):20} {str(ws):20} cuDNN {row['cudnn_best']:8.1f} "
              f"pick {row['pick_us'] if isinstance(row['pick_us'], str) else format(row['pick_us'], '8.1f')} "
              f"x{row.get('vs_cudnn', 0):.2f}" + (f" (before {o if isinstance(o, str) else format(o, '.1f')})" if o else "")
              + f" {str(pick)[len(wg.ALGORITHM) + 1:] if str(pick).startswith(wg.ALGORITHM) else str(pick)}", flush=True)
        json.dump(out_rows, open(os.path.join(args.out, "picks.json"), "w"), indent=1)
        del x, w, b, ref, xl
        release()


def geo(vals) -> str:
    vals = [v for v in vals if v and v > 0]
    if not vals:
        return "    -"
    return f"{math.exp(sum(map(math.log, vals)) / len(vals)):.3f}x ({len(vals)}, lowest {min(vals):.2f})"


def table(picks: list, sweep: list) -> None:
    print("\n==== summary (graph replay; cuDNN at its best of NCHW / channels_last) ====")
    for dtype in ("float16", "bfloat16", "tf32"):
        for sec in ("bench", "big", "layers", "nchw"):
            rs = [r for r in picks if r["dtype"] == dtype and r["section"] == sec and "vs_cudnn" in r]
            if not rs:
                continue
            changed = [r for r in rs if isinstance(r.get("original_us"), float)]
            line = f"picks {dtype:8} {sec:6} vs cuDNN {geo([r['vs_cudnn'] for r in rs])}"
            if changed:
                line += (f"; {len(changed)} changed picks: {geo([r['original_us'] / r['pick_us'] for r in changed])} "
                         f"over the old pick")
            print(line)
    for dtype in ("float16", "bfloat16", "tf32"):
        rs = [r for r in sweep if r["dtype"] == dtype and r.get("fastest")]
        if rs:
            ratios = [r["times"][r["pick"]] / r["times"][r["fastest"]] for r in rs if isinstance(r["times"].get(r["pick"]), float)]
            print(f"sweep {dtype:8} {len(rs)} problems: pick / fastest {geo(ratios)}; fastest vs cuDNN "
                  f"{geo([min(r['cudnn'].values()) / r['times'][r['fastest']] for r in rs])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--picks", action="store_true")
    ap.add_argument("--small", action="store_true", help="(what the sanitizers run)")
    ap.add_argument("--small-tma", action="store_true", help="(what the sanitizers run with --tma)")
    ap.add_argument("--tma", action="store_true", help="sweeps time the TMA kernel's tiles and the pick; "
                    "the sanitizers run the TMA kernel (memcheck, racecheck, synccheck)")
    ap.add_argument("--pytest-k", default="", help="pytest -k expression for --pytest")
    ap.add_argument("--dtypes", default="float16,bfloat16,tf32", help="of the benchmark problems")
    ap.add_argument("--big-dtypes", default="float16,bfloat16,tf32")
    ap.add_argument("--layer-dtypes", default="tf32,bfloat16")
    ap.add_argument("--sections", default="bench,big,layers")
    ap.add_argument("--sweep-dtypes", default="tf32")
    ap.add_argument("--sweep-sections", default="bench,big")
    ap.add_argument("--old", default="", help="a source tree with the heuristic before the change")
    ap.add_argument("--picks-first", action="store_true", help="time the picks before the sweeps")
    ap.add_argument("--pytest", action="store_true")
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--compile-deadline", type=float, default=None, help="seconds from the start")
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--pytest-cap", type=float, default=240.0, help="seconds from the start the tests may take")
    args = ap.parse_args()
    global PICKS_FIRST
    PICKS_FIRST = args.picks_first
    if args.small:
        small_cases()
        return
    if args.small_tma:
        small_tma_cases()
        return
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    bg = {}
    if not args.no_sanitize:
        for tool in ("memcheck", "racecheck") + (("synccheck",) if args.tma else ()):
            bg[tool] = subprocess.Popen(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable,
                                         __file__, "--small-tma" if args.tma else "--small"],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if args.pytest:
        log = open(os.path.join(args.out, "pytest.log"), "w")
        bg["pytest"] = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                         "--durations=15", "tests/test_gpu_conv2d.py",
                                         *(["-k", args.pytest_k] if args.pytest_k else [])],
                                        stdout=log, stderr=subprocess.STDOUT)

    picks_probs, sweep_probs, work = plan_work(args)
    precompile(work, args.workers, args.compile_deadline)
    results = {}
    for name, proc in bg.items():        # nothing is timed while these share the GPU
        cap = args.pytest_cap
        left = max(30.0, cap - (time.time() - T0))
        try:
            text, _ = proc.communicate(timeout=left) if name != "pytest" else (None, proc.wait(timeout=left))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            text = "timeout"
        if name == "pytest":
            tail = open(os.path.join(args.out, "pytest.log")).read().strip().splitlines()
            results[name] = {"rc": proc.returncode, "tail": tail[-40:]}
            print(f"pytest: rc {proc.returncode}: {tail[-1] if tail else ''}", flush=True)
        else:
            results[name] = {"rc": proc.returncode, "tail": (text or "")[-2000:]}
            print(f"sanitize {name}: rc {proc.returncode}: {text.strip().splitlines()[-1] if text and text.strip() else ''}",
                  flush=True)
    json.dump(results, open(os.path.join(args.out, "sanitize.json"), "w"), indent=1)
    print(f"==== {time.time() - T0:.0f} s: timing starts", flush=True)
    sweep_rows, pick_rows = [], []
    for mode, entries in phases(picks_probs, sweep_probs):
        (run_sweep if mode == "sweep" else run_picks)(args, entries, sweep_rows if mode == "sweep" else pick_rows)
    print(f"==== {time.time() - T0:.0f} s: done", flush=True)
    table(pick_rows, sweep_rows)


def phases(picks_probs: list, sweep_probs: list) -> list:
    """What is timed, most wanted first: the TF32 sweep of the benchmark and large problems, the
    picks, the TF32 sweep of the torchvision layers, the other precisions' persistent sweep."""
    first = [e for e in sweep_probs if e[6] == "tf32" and e[0] != "layers"]
    layers = [e for e in sweep_probs if e[6] == "tf32" and e[0] == "layers"]
    rest = [e for e in sweep_probs if e[6] != "tf32"]
    if PICKS_FIRST:
        return [("picks", picks_probs), ("sweep", first), ("sweep", layers), ("sweep", rest)]
    return [("sweep", first), ("picks", picks_probs), ("sweep", layers), ("sweep", rest)]


def plan_work(args):
    """The problems of each mode with their picks (and the old heuristic's), and the plans to compile."""
    dev = jitops.get_backend().device
    plan_items = []
    sec_pick = [s for s in args.sections.split(",") if s != "nchw"]
    base = items(sorted(set(sec_pick) | ({"layers"} if "nchw" in args.sections else set())) if args.picks else [])
    dtypes = {"bench": args.dtypes, "big": args.big_dtypes, "layers": args.layer_dtypes}
    for sec, label, xs, ws, attrs, has_b in base:
        if sec in sec_pick:
            for dtype in dtypes[sec].split(","):
                plan_items.append(("picks", sec, label, xs, ws, attrs, has_b, dtype, "nhwc"))
        if "nchw" in args.sections and sec in ("bench", "layers"):
            plan_items.append(("nchw?", "nchw", label, xs, ws, attrs, has_b, "tf32", "nchw"))
    if args.sweep:
        for sec, label, xs, ws, attrs, has_b in items(args.sweep_sections.split(",")):
            for dtype in args.sweep_dtypes.split(","):
                plan_items.append(("sweep", sec, label, xs, ws, attrs, has_b, dtype, "nhwc"))
    olds = old_picks(args.old, [(it[3], it[4], it[5], it[6], it[7], it[8]) for it in plan_items]) if args.old \
        else [None] * len(plan_items)
    picks_probs, sweep_probs = [], []
    for it, old in zip(plan_items, olds):
        mode, sec, label, xs, ws, attrs, has_b, dtype, layout = it
        p, a = problem_of(xs, ws, attrs, has_b, dtype, layout)
        pick = op.heuristic(p, dev)
        old_s = schedule_of(old)
        if mode == "nchw?":             # only the TF32 layers whose algorithm the change moved
            if old_s is None or old_s.algorithm == pick.algorithm:
                continue
            mode = "picks"
        if mode == "sweep" and dtype != "tf32" and sec == "layers":
            continue                    # other precisions: the persistent sweep of bench and big only
        entry = (sec, label, xs, ws, attrs, has_b, dtype, p, a, pick, old_s)
        (sweep_probs if mode == "sweep" else picks_probs).append(entry)
    work = []                           # compiled in the order they are timed
    for mode, entries in phases(picks_probs, sweep_probs):
        for sec, label, xs, ws, attrs, has_b, dtype, p, a, pick, old_s in entries:
            work.append((p, pick))
            if old_s is not None and str(old_s) != str(pick):
                work.append((p, old_s))
            if mode == "sweep" and args.tma:
                work += [(p, s) for s in wg.tma_candidates(p, dev)]
            elif mode == "sweep":
                work += [(p, s) for s in wg.candidates(p, dev) if dtype == "tf32" or wg.is_persistent(s)]
    print(f"{len(picks_probs)} picks, {len(sweep_probs)} sweep problems; "
          f"{sum(1 for e in picks_probs if e[10] is not None and str(e[10]) != str(e[9]))} picks changed", flush=True)
    return picks_probs, sweep_probs, work


if __name__ == "__main__":
    main()
