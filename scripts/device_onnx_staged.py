"""Real exported models (symbolic batch) on jitops GPU kernels behind ORT's CPU execution provider.

    python3 scripts/device_onnx_staged.py --out DIR [--budget-s 110]

What it answers, on a machine with a GPU but a CPU-only onnxruntime: (1) do the symbolic-batch
rewrites of ResNet-50, ViT-B/16 and a BERT-base-style encoder compute the right thing on the GPU
kernels (max relative error against ORT's own float32 CPU run, batch sizes the export never saw);
(2) what the staged path costs against ORT's own CPU kernels (median of timed runs after a warm-up
that compiles; the first run's time is reported separately) -- the basis of jo.session's warning.
Models are started while the time budget lasts; results are written after each.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=110.0)
    ap.add_argument("--cases", default="resnet50:1,resnet50:8,vit_b_16:1,bert_base:1", help="model:batch,...")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort

    import jitops.onnx as jo
    from jitops.onnx.testing import max_rel_error
    from onnx_models import export
    start = time.perf_counter()
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    results = []
    for name, batch in cases:
        if time.perf_counter() - start > args.budget_s:
            results.append({"model": name, "batch": batch, "skipped": "time budget"})
            continue
        try:
            data, feeds = export(name, 17)
            rng = np.random.default_rng(batch)      # batch sizes the export never saw (it used 1)
            feeds = {k: (rng.standard_normal((batch, *v.shape[1:])).astype(np.float32) if k == "x"
                         else np.repeat(v[:1], batch, axis=0)) for k, v in feeds.items()}
            model = onnx.load_from_string(data)
            plain = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            ref = plain.run(None, feeds)[0]
            t_ort = timed(lambda: plain.run(None, feeds), 10)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                sess = jo.session(model, providers=["CPUExecutionProvider"])
                t_session = time.perf_counter() - t0
            t0 = time.perf_counter()
            got = sess.run(None, feeds)[0]
            t_first = time.perf_counter() - t0
            t_jit = timed(lambda: sess.run(None, feeds), 10)
            r = {"model": name, "batch": batch, "rel_error_vs_ort_fp32": max_rel_error(got, ref),
                 "ort_cpu_ms": round(t_ort, 2), "jitops_staged_ms": round(t_jit, 2),
                 "staged_over_ort": round(t_jit / t_ort, 2), "session_s": round(t_session, 2),
                 "first_run_s": round(t_first, 2), "warned": any("host memory" in str(w.message) for w in caught),
                 "jitops_nodes": sum(n.domain == "jitops" for n in jo.rewrite(model).graph.node)}
        except Exception as exc:  # reported, the other models still run
            r = {"model": name, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        results.append(r)
        print(json.dumps(r), flush=True)
        with open(os.path.join(args.out, "device_onnx.json"), "w") as f:
            json.dump({"ort": ort.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
