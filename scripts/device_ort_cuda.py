"""Real exported models end to end on ONNX Runtime's CUDA execution provider: ORT's own kernels
against the same model rewritten for jitops (`jo.session`), in one run (issue 17).

    python3 scripts/device_ort_cuda.py --out DIR [--budget-s 200] [--cases resnet50:1,...] [--dtypes float32,float16]

Needs onnxruntime-gpu (scripts/device_ort_gpu.sh installs the carried wheel). Each case exports the
torchvision model (or the BERT-base-style encoder) with a symbolic batch, builds both sessions on
the CUDA EP, binds inputs and outputs to device memory (io_binding, so no host copies are timed on
either side), checks both outputs against ORT's float32 CPU run of the float32 export, and times
the median of `--reps` runs after warm-ups (the first jitops run compiles). fp32 runs with TF32
off on both sides (ORT's `use_tf32=0`, jitops' exact fp32 kernels); fp16 runs the half export.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BERT_SEQ = 128


def feeds_for(name: str, batch: int, dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    if name == "bert_base":
        mask = np.ones((batch, BERT_SEQ), dtype)
        mask[:, -7:] = 0
        return {"x": rng.standard_normal((batch, BERT_SEQ, 768)).astype(dtype), "mask": mask}
    return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(dtype)}


def timed_session(ort, sess, feeds: dict[str, np.ndarray], reps: int, warmup: int) -> tuple[float, np.ndarray, float]:
    """Median ms of run_with_iobinding with device-resident inputs and outputs; the first run's seconds."""
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    binding.bind_output(sess.get_outputs()[0].name, "cuda")
    t0 = time.perf_counter()
    sess.run_with_iobinding(binding)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sess.run_with_iobinding(binding)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, binding.copy_outputs_to_cpu()[0], first


def run_case(ort, name: str, batch: int, dtype: str, reps: int, ops: list[str] | None = None) -> dict:
    import onnx

    import jitops.onnx as jo
    from jitops.onnx.testing import max_rel_error
    from onnx_models import export
    data32, _ = export(name, 17)
    data = data32 if dtype == "float32" else export(name, 17, dtype=dtype, device="cuda")[0]
    feeds = feeds_for(name, batch, dtype)
    ref = ort.InferenceSession(data32, providers=["CPUExecutionProvider"]).run(
        None, {k: v.astype(np.float32) for k, v in feeds.items()})[0]
    cuda = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    native = ort.InferenceSession(data, providers=cuda)
    t_native, y_native, _ = timed_session(ort, native, feeds, reps, 3)
    t0 = time.perf_counter()
    jit = jo.session(onnx.load_from_string(data), providers=cuda, **({"ops": ops} if ops else {}))
    t_session = time.perf_counter() - t0
    t_jit, y_jit, first = timed_session(ort, jit, feeds, reps, 3)
    rewritten = jo.rewrite(onnx.load_from_string(data), ops=ops)
    return {"model": name, "batch": batch, "dtype": dtype, "ops": ops or "all",
            "jitops_nodes": sum(n.domain == "jitops" for n in rewritten.graph.node),
            "ort_cuda_ms": round(t_native, 3), "jitops_cuda_ms": round(t_jit, 3),
            "speedup": round(t_native / t_jit, 3),
            "err_ort_vs_fp32": max_rel_error(y_native.astype(np.float32), ref),
            "err_jitops_vs_fp32": max_rel_error(y_jit.astype(np.float32), ref),
            "err_jitops_vs_ort": max_rel_error(y_jit.astype(np.float32), y_native.astype(np.float32)),
            "session_s": round(t_session, 2), "first_run_s": round(first, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cases", default="resnet50:1,resnet50:8,vit_b_16:1,vit_b_16:8,bert_base:8")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--json", default="device_ort_cuda.json", help="file name under --out")
    ap.add_argument("--ops", action="append", help="take only these jitops ops (repeatable; default: all); "
                    "'--ops all --ops attention --ops layer_norm' runs a case once per entry, to attribute time")
    args = ap.parse_args()
    import onnxruntime as ort
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()      # the CUDA EP's cuDNN / cuBLAS from the nvidia-* wheels beside torch
    print("onnxruntime", ort.__version__, ort.get_available_providers(), flush=True)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("no CUDA execution provider", flush=True)
        return 1
    start = time.perf_counter()
    results = []
    for case in args.cases.split(","):
        name, batch = case.split(":")[0], int(case.split(":")[1])
        for dtype, ops in [(d, o) for d in args.dtypes.split(",") for o in ([None if o == "all" else [o] for o in args.ops] if args.ops else [None])]:
            if time.perf_counter() - start > args.budget_s:
                r = {"model": name, "batch": batch, "dtype": dtype, "skipped": "time budget"}
            else:
                try:
                    r = run_case(ort, name, batch, dtype, args.reps, ops)
                except Exception as exc:  # reported; the other cases still run
                    r = {"model": name, "batch": batch, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:1500]}
            results.append(r)
            print(json.dumps(r), flush=True)
            with open(os.path.join(args.out, args.json), "w") as f:
                json.dump({"ort": ort.__version__, "results": results}, f, indent=1)
    print("\nmodel       batch dtype    ORT CUDA ms  jitops ms  speedup  err jitops/ORT  jitops ops")
    for r in results:
        if "speedup" in r:
            print(f"{r['model']:<11} {r['batch']:>5} {r['dtype']:<8} {r['ort_cuda_ms']:>11} {r['jitops_cuda_ms']:>10}"
                  f" {r['speedup']:>8} {r['err_jitops_vs_ort']:>10.2e}  {r['ops']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
