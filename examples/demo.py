"""The jitops story end to end, on a small UNet (convolutions, BatchNorm / GroupNorm / LayerNorm,
LeakyRelu and a self-attention block; examples/make_model.py):

  1. direct op calls on the model's own problems, checked against float64, with the scheduler's reasons
  2. tuning those problems (on a GPU)
  3. the ONNX rewrite: which nodes become jitops nodes (fused), which stay ONNX and why
  4. ONNX Runtime with the jitops custom ops against ORT's own kernels, and the fallback bodies
  5. a compiled bundle for this device and for GPUs that are not here (sm_90, gfx90a)
  6. the bundle reloaded in a fresh process: the model runs with zero compiles
  7. (GPU) end-to-end timings: ORT's CPU run, ORT + jitops, torch, torch + jitops

    python3 examples/demo.py                      # the GPU if there is one, else the CPU emulator
    python3 examples/demo.py --size 64 --batch 2 --tune-budget 30 --keep demo-out

On the emulator everything runs except tuning and timings (they need a GPU). Exit status 1 when
any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jitops  # noqa: E402
import jitops.onnx as jo  # noqa: E402
from jitops import config, engine  # noqa: E402
from jitops.cache import loader  # noqa: E402
from jitops.errors import BackendUnavailable, JitopsError  # noqa: E402
from jitops.ops import get_op  # noqa: E402

SUMMARY: list[tuple[str, str, str]] = []     # (step, status, detail)
FAILED: list[str] = []


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 74 - len(title)), flush=True)


def note(step: str, status: str, detail: str) -> None:
    SUMMARY.append((step, status, detail))
    if status == "FAILED":
        FAILED.append(f"{step}: {detail}")


def short(problem: Any, width: int) -> str:
    d = getattr(problem, "describe", None)
    text = d() if callable(d) else problem.key().split(":", 1)[-1]
    return text if len(text) <= width else text[:width - 1] + "~"


def rel_error(got: Any, ref: Any) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(got - ref).max(initial=0.0) / max(float(np.abs(ref).max(initial=0.0)), 1e-30))


# ---------------------------------------------------------------- 1. direct op calls

def direct_calls(problems: list, backend: Any) -> None:
    section("1. direct op calls on the model's problems, checked against float64")
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    ok = 0
    for p in problems:
        if p.op in seen:
            continue
        seen.add(p.op)
        op = get_op(p.op)
        inputs = op.random_inputs(p.problem, rng)
        ref = next(iter(op.reference(p.problem, inputs).values()))
        schedule, origin = engine.select_schedule(op, p.problem, backend.device)
        args = {n: _to_device(v, backend) for n, v in inputs.items()}
        # inputs in storage order: a layout node's (AttentionBshd: [B, S, H, D]) are declared as such
        layout = next((s.layout for s in p.problem.inputs().values() if s.layout), "")
        t0 = time.perf_counter()
        got = getattr(jitops, p.op)(**args, **p.attrs, **({"layout": layout} if layout else {}))  # the public API
        first = time.perf_counter() - t0
        got = _to_host(got, layout)
        err = rel_error(got, ref)
        rtol, atol = op.tolerance(p.problem, schedule)
        good = bool(np.allclose(np.asarray(got, np.float64), ref, rtol=rtol * 10, atol=atol * 10 + 1e-6))
        ok += good
        print(f"  jitops.{p.op:<11} {short(p.problem, 90)}")
        print(f"  {'':18} {schedule} [{origin}]  first call {first * 1e3:.0f} ms, max rel error {err:.1e} "
              f"{'ok' if good else 'FAILED'}")
        if schedule.why:
            print(f"  {'':18} why: {schedule.why[:110]}")
        if not good:
            note("direct op call", "FAILED", f"{p.op}: error {err:.1e}")
    note("1 direct op calls", "ok" if ok == len(seen) else "FAILED", f"{ok}/{len(seen)} ops match float64")


def _to_device(a: np.ndarray, backend: Any) -> Any:
    if backend.name == "cpu":
        return a
    import torch
    return torch.from_numpy(a).to("cuda")


def _to_host(a: Any, layout: str = "") -> np.ndarray:
    """A result as a host array in storage order (a torch result in a layout is a logical view)."""
    if hasattr(a, "detach"):
        from jitops.arrays import LAYOUTS
        return (a.permute(*LAYOUTS[layout][0]) if layout else a).detach().cpu().numpy()
    return np.asarray(a)


# ---------------------------------------------------------------- 2. tuning

def tune(model: Any, shapes: dict, backend: Any, budget: float) -> None:
    section("2. tuning the model's problems on this device")
    if backend.name == "cpu" or budget <= 0:
        why = "needs a GPU (it times kernels)" if backend.name == "cpu" else "--tune-budget 0"
        print(f"  skipped: {why}")
        note("2 tune", "skipped", why)
        return
    from jitops.tuning import TuneOptions
    from jitops.tuning.model import tune_model
    from jitops.tuning.report import summary_footer, summary_table
    report = tune_model(model, shapes, options=TuneOptions(budget_s=budget))
    print(textwrap.indent(summary_table(report.results, [p.count for p in report.problems]), "  "))
    print("  " + summary_footer(report.results, report.seconds).replace("\n", "\n  "))
    note("2 tune", "ok", f"{len(report.results)} problems in {report.seconds:.0f} s (records saved)")


# ---------------------------------------------------------------- 3. rewrite

def rewrite(model: Any, shapes: dict) -> Any:
    section("3. the ONNX rewrite")
    groups = jo.map_nodes(model, shapes)
    for g in groups:
        what = "+".join(g.onnx_ops)
        if g.supported:
            print(f"  {what:<34} -> jitops::{g.op_type:<18} {short(g.problem, 56)}")
        else:
            print(f"  {what:<34} stays ONNX: {g.reason[:90]}")
    rewritten = jo.rewrite(model, input_shapes=shapes)
    jit_nodes = [n for n in rewritten.graph.node if n.domain == "jitops"]
    covered = sum(len(g.nodes) for g in groups if g.supported)
    print(f"  {len(model.graph.node)} ONNX nodes -> {len(rewritten.graph.node)} nodes: {len(jit_nodes)} jitops nodes "
          f"cover {covered} ONNX nodes; {len(rewritten.functions)} fallback functions")
    note("3 rewrite", "ok", f"{covered} ONNX nodes -> {len(jit_nodes)} jitops nodes "
                            f"({sum(not g.supported for g in groups)} recognised groups stay ONNX)")
    return rewritten


# ---------------------------------------------------------------- 4. ONNX Runtime

def onnxruntime_check(model: Any, rewritten: Any, x: np.ndarray, backend: Any) -> np.ndarray:
    section("4. ONNX Runtime: jitops kernels vs ORT's own")
    import onnxruntime as ort
    from jitops.onnx.testing import ort_session
    ref = ort_session(model).run(None, {"image": x})[0]
    t0 = time.perf_counter()
    sess = jo.session(rewritten, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"image": x})[0]
    first = time.perf_counter() - t0
    err = rel_error(got, ref)
    where = "the CPU emulator" if backend.name == "cpu" else f"the {backend.name} backend ({backend.device.name}), staged"
    good = err < 1e-3
    print(f"  onnxruntime {ort.__version__}, CPU execution provider, jitops nodes on {where}")
    print(f"  output {tuple(got.shape)}: max rel error vs ORT native {err:.1e} {'ok' if good else 'FAILED'} "
          f"(first run, compiles included: {first:.1f} s)")
    note("4 ORT + jitops", "ok" if good else "FAILED", f"max rel error {err:.1e} vs ORT's kernels")
    fallback = ort_session(rewritten).run(None, {"image": x})[0]
    ferr = rel_error(fallback, ref)
    print(f"  rewritten model in plain ORT (fallback function bodies): max rel error {ferr:.1e}")
    note("4 fallback bodies", "ok" if ferr < 1e-4 else "FAILED", f"max rel error {ferr:.1e}")
    if "CUDAExecutionProvider" in ort.get_available_providers() and backend.name == "cuda":
        cuda = jo.session(rewritten, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        cerr = rel_error(cuda.run(None, {"image": x})[0], ref)
        print(f"  CUDA execution provider (ORT's device buffers and stream): max rel error {cerr:.1e}")
        note("4 ORT CUDA EP + jitops", "ok" if cerr < 1e-3 else "FAILED", f"max rel error {cerr:.1e}")
    return ref


# ---------------------------------------------------------------- 5. bundle

def this_target(backend: Any) -> str:
    d = backend.device
    return ("cpu" if d.warp_size == 32 else f"cpu-w{d.warp_size}") if backend.name == "cpu" else d.arch


def bundle(model_path: Path, shapes: dict, backend: Any, out: Path) -> list[str]:
    section("5. a compiled bundle for this device and for GPUs that are not here")
    from jitops.onnx.bundle_build import create_bundle
    targets = [this_target(backend)]
    for t in ("sm_90", "gfx90a"):
        if t in targets:
            targets[targets.index(t)] = "device"     # this GPU, planned with its own properties
            continue
        try:
            jitops.get_backend(target=t)
            targets.append(t)
        except (BackendUnavailable, JitopsError) as exc:
            print(f"  {t}: skipped ({str(exc).splitlines()[0][:90]})")
    t0 = time.perf_counter()
    manifest = create_bundle(model_path, targets, out, input_shapes=shapes)
    for t in manifest["targets"]:
        ks = [k for k in manifest["kernels"] if k["target"] == t["target"]]
        print(f"  {t['target']:<7} {len(ks):>3} kernels, {sum(k['bytes'] for k in ks) / 1024:7.0f} KiB  "
              f"{t['compiler']}")
    print(f"  {out}: manifest, kernels, rewritten model ({time.perf_counter() - t0:.1f} s)")
    note("5 bundle", "ok", f"{len(manifest['kernels'])} kernels for {', '.join(targets)}")
    return targets


# ---------------------------------------------------------------- 6. reload with zero compiles

RELOAD = """
import json, sys, time, numpy as np
t0 = time.perf_counter()
import jitops, jitops.onnx as jo
from jitops.cache import loader
b = jitops.load_bundle(sys.argv[1])
x = np.random.default_rng(int(sys.argv[4])).standard_normal(json.loads(sys.argv[3])).astype(np.float32)
sess = jo.session(str(b.model_path), providers=["CPUExecutionProvider"])
y = sess.run(None, {"image": x})[0]
seconds = time.perf_counter() - t0
from jitops.onnx.testing import max_rel_error, run_native
import onnx
err = max_rel_error(y, run_native(onnx.load(sys.argv[2]), {"image": x})[0])
print(json.dumps({"compiles": loader().stats.compiles, "bundle_hits": loader().stats.bundle_hits,
                  "disk_hits": loader().stats.disk_hits, "seconds": seconds, "error": err,
                  "target": b.target.target}))
"""


def reload(out: Path, model_path: Path, shape: tuple, seed: int, work: Path) -> None:
    section("6. the bundle reloaded in a fresh process (empty kernel cache)")
    cache = work / "fresh-cache"
    shutil.rmtree(cache, ignore_errors=True)
    if (config.cache_dir() / "native").is_dir():      # host libraries (emulator runtime, ORT library): not kernels
        shutil.copytree(config.cache_dir() / "native", cache / "native")
    env = {**os.environ, "JITOPS_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", RELOAD, str(out), str(model_path), json.dumps(list(shape)), str(seed)],
                         capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        print(textwrap.indent(res.stderr[-2000:], "  "))
        note("6 reload", "FAILED", "the fresh process failed")
        return
    r = json.loads(res.stdout.strip().splitlines()[-1])
    good = r["compiles"] == 0 and r["error"] < 1e-3
    print(f"  target {r['target']}: {r['compiles']} compiles, {r['bundle_hits']} kernels from the bundle, "
          f"{r['disk_hits']} from a disk cache; first result after {r['seconds']:.1f} s (process start included); "
          f"max rel error vs ORT native {r['error']:.1e} {'ok' if good else 'FAILED'}")
    note("6 reload", "ok" if good else "FAILED", f"{r['compiles']} compiles, {r['bundle_hits']} bundle kernels, "
                                                  f"first result {r['seconds']:.1f} s")


# ---------------------------------------------------------------- 7. timings

def timings(model: Any, rewritten: Any, x: np.ndarray, reps: int) -> None:
    section("7. end-to-end timings (numpy in, numpy out; median of runs after warm-up)")
    import torch
    from onnx_torch import TorchGraph
    from jitops.onnx.testing import ort_session
    import onnxruntime as ort

    def median_ms(fn: Any, n: int = reps) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3

    native = ort_session(model)
    sess_opts = ort.SessionOptions()
    jit = jo.session(rewritten, providers=["CPUExecutionProvider"], options=sess_opts)
    graph, jgraph = TorchGraph(model), TorchGraph(rewritten)

    def torch_run(g: Any) -> np.ndarray:
        with torch.no_grad():
            y = g({"image": torch.from_numpy(x).to("cuda")})[0]
            return y.cpu().numpy()

    rows = [("ORT native, CPU (all cores)", median_ms(lambda: native.run(None, {"image": x}))),
            ("ORT + jitops (CPU EP, GPU staged)", median_ms(lambda: jit.run(None, {"image": x}))),
            ("torch eager, GPU", median_ms(lambda: torch_run(graph))),
            ("torch graph + jitops nodes, GPU", median_ms(lambda: torch_run(jgraph)))]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        cuda_native = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        cuda_jit = jo.session(rewritten, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        rows += [("ORT native, CUDA EP", median_ms(lambda: cuda_native.run(None, {"image": x}))),
                 ("ORT + jitops, CUDA EP", median_ms(lambda: cuda_jit.run(None, {"image": x})))]
    err = rel_error(torch_run(jgraph), native.run(None, {"image": x})[0])
    base = rows[0][1]
    for name, ms in rows:
        print(f"  {name:<36} {ms:9.2f} ms   {base / ms:6.2f}x vs ORT native CPU")
    print(f"  (torch + jitops output vs ORT native: max rel error {err:.1e})")
    note("7 timings", "ok", "; ".join(f"{n}: {ms:.2f} ms" for n, ms in rows))


# ---------------------------------------------------------------- main

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, help="image size (multiple of 8; default 128 on a GPU, 32 on the emulator)")
    p.add_argument("--batch", type=int, help="batch (default 8 on a GPU, 1 on the emulator)")
    p.add_argument("--tune-budget", type=float, default=60.0, help="seconds of tuning on a GPU (0: skip)")
    p.add_argument("--reps", type=int, default=20, help="timed runs per variant")
    p.add_argument("--keep", help="write the model and the bundle here (default: a temporary directory)")
    args = p.parse_args()
    from make_model import build_model
    import onnx

    backend = jitops.get_backend()
    gpu = backend.name != "cpu"
    size, batch = args.size or (128 if gpu else 32), args.batch or (8 if gpu else 1)
    section("device")
    d = backend.device
    print(f"  jitops {jitops.__version__}; backend {backend.name}: {d.name} ({d.arch}, warp {d.warp_size}, "
          f"{d.multiprocessors} multiprocessors); compiler {backend.compiler_id()}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="jitops-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(size)
    model_path = work / "tiny_unet.onnx"
    onnx.save(model, model_path)
    shapes = {"image": (batch, 3, size, size)}
    print(f"  model: tiny UNet (examples/make_model.py), {len(model.graph.node)} ONNX nodes, input image "
          f"{shapes['image']}; work dir {work}")
    seed = 7
    x = np.random.default_rng(seed).standard_normal(shapes["image"]).astype(np.float32)
    t_start = time.perf_counter()
    problems = jo.supported_nodes(model, shapes)
    direct_calls(problems, backend)
    tune(model, shapes, backend, args.tune_budget)
    rewritten = rewrite(model, shapes)
    onnxruntime_check(model, rewritten, x, backend)
    out = work / "tiny_unet.jitops"
    bundle(model_path, shapes, backend, out)
    reload(out, model_path, shapes["image"], seed, work)
    if gpu:
        timings(model, rewritten, x, args.reps)
    else:
        section("7. timings")
        print("  skipped on the CPU emulator (run on a GPU for timings against ORT and torch)")
        note("7 timings", "skipped", "needs a GPU")

    section("summary")
    for step, status, detail in SUMMARY:
        print(f"  {step:<24} {status:<8} {detail}")
    print(f"  kernel compiles in this process: {loader().stats.compiles} "
          f"({loader().stats.compile_seconds:.1f} s); total {time.perf_counter() - t_start:.0f} s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if FAILED:
        print("\ndemo: FAILED: " + "; ".join(FAILED))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
