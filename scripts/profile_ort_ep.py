"""Where the host time of the example model goes under ORT's CUDA EP with jitops nodes
(cProfile over repeated runs), next to ORT's own CUDA EP run. On a GPU machine with onnxruntime-gpu:
    python3 scripts/profile_ort_ep.py [--reps 50]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def main() -> None:
    import onnxruntime as ort
    import jitops.onnx as jo
    from make_model import build_model
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    model = build_model(args.size)
    shape = (args.batch, 3, args.size, args.size)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    native = ort.InferenceSession(model.SerializeToString(), providers=providers)
    jit = jo.session(model, providers=providers, input_shapes={"image": shape})
    for name, sess in (("ORT native CUDA EP", native), ("ORT + jitops CUDA EP", jit)):
        for _ in range(5):
            sess.run(None, {"image": x})
        t = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            sess.run(None, {"image": x})
            t.append(time.perf_counter() - t0)
        print(f"{name}: median {np.median(t) * 1e3:.3f} ms")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.reps):
        jit.run(None, {"image": x})
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
