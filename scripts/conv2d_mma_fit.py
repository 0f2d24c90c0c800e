"""Fit the matrix-core cost model (jitops/ops/conv2d_mma.MmaCost) to sweeps of scripts/device_conv2d.py.

  python3 scripts/conv2d_mma_fit.py DIR [DIR ...]     (each DIR holds bench.json / layers.json, or
                                                       .json.gz: docs/data/conv2d_mma_h100_2026-11-23)

Every candidate timed in the sweeps (graph replay, fp16, channels_last) is one sample; the fit
minimises the squared error of log time (scipy, Nelder-Mead over the tile rates and overheads).
Prints the fitted constants and, per problem, how much slower the model's pick is than the
fastest measured candidate (the heuristic's own quality, from measured times only).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
import sys

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jitops.bench.conv2d import PROBLEMS  # noqa: E402
from jitops.ops import conv2d_mma as mma  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

op = get_op("conv2d")
DEV = get_backend(target="sm_90").device
BW, LAUNCH = 3.0e12, 2.0e-6          # H100 copy bandwidth and launch cost as conv2d_cost uses them
KEYS = [t[:5] for t in mma.TILES]


def schedule_of(text: str):
    d = dict(re.findall(r"(\w+)=(\w+)", text))
    return mma.mma_schedule(*(int(d[k]) for k in ("bm", "bn", "bk", "wm", "wn", "stages")), split_k=int(d["split_k"]))


def _load(d: str, name: str) -> list:
    """DIR/name.json (a device run's output) or DIR/name.json.gz (as kept in docs/data)."""
    for path, opener in ((os.path.join(d, f"{name}.json"), open), (os.path.join(d, f"{name}.json.gz"), gzip.open)):
        if os.path.exists(path):
            with opener(path, "rt") as f:
                return json.load(f)
    return []


def samples(dirs: list[str]) -> list[tuple[str, object, dict]]:
    """(name, problem, {schedule text: us}) for every swept problem."""
    by_name = {p.name: p for p in PROBLEMS}
    out = []
    for d in dirs:
        for r in _load(d, "bench"):
            if "mma_candidates_nhwc_us" not in r:
                continue
            cp = by_name[r["problem"]]
            p = op.make_problem({"x": TensorSpec((cp.n, cp.cin, cp.h, cp.w), "float16", "nhwc"),
                                 "w": TensorSpec((cp.cout, cp.cin, cp.k, cp.k), "float16")}, {"padding": cp.pad})
            out.append((cp.name, p, r["mma_candidates_nhwc_us"]))
        for r in _load(d, "layers"):
            if "mma_candidates_nhwc_us" not in r:
                continue
            a = r["attrs"]
            p = op.make_problem({"x": TensorSpec(tuple(r["x"]), "float16", "nhwc"),
                                 "w": TensorSpec(tuple(r["w"]), "float16"), "bias": None},
                                {"stride": tuple(a["stride"]), "padding": tuple(a["padding"]),
                                 "dilation": tuple(a["dilation"]), "groups": a["groups"]})
            out.append((f"{r['net']} {r['x']} {r['w']}", p, r["mma_candidates_nhwc_us"]))
    return out


def cost_of(v: np.ndarray) -> mma.MmaCost:
    rates = {k: float(math.exp(v[i])) for i, k in enumerate(KEYS)}
    n = len(KEYS)
    return mma.MmaCost(tile_rate=rates, overhead_k=float(math.exp(v[n])), occ_floor=min(1.0, float(math.exp(v[n + 1]))),
                       split_s=float(math.exp(v[n + 2])), split_eff=float(math.exp(v[n + 3])))


def main() -> None:
    data = samples(sys.argv[1:])
    rows = [(p, schedule_of(k), math.log(t * 1e-6)) for _, p, c in data for k, t in c.items() if isinstance(t, float)]
    print(f"{len(data)} problems, {len(rows)} timed candidates")

    def loss(v: np.ndarray) -> float:
        prm = cost_of(v)
        e = [math.log(mma.estimate(p, s, DEV, BW, LAUNCH, prm)) - lt for p, s, lt in rows]
        return float(np.mean(np.square(e)))

    c0 = mma.COST
    v0 = np.array([math.log(c0.tile_rate.get(k, 0.26)) for k in KEYS] +
                  [math.log(c0.overhead_k), math.log(c0.occ_floor), math.log(c0.split_s), math.log(c0.split_eff)])
    print(f"start: rms log error {loss(v0) ** 0.5:.3f}")
    res = minimize(loss, v0, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-3, "fatol": 1e-6})
    res = minimize(loss, res.x, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-4, "fatol": 1e-7})
    prm = cost_of(res.x)
    print(f"fitted: rms log error {loss(res.x) ** 0.5:.3f}")
    print("tile_rate = {" + ", ".join(f"{k}: {v:.3f}" for k, v in prm.tile_rate.items()) + "}")
    print(f"overhead_k={prm.overhead_k:.1f} occ_floor={prm.occ_floor:.3f} split_s={prm.split_s:.2e} "
          f"split_eff={prm.split_eff:.3f}")
    slow = []
    for name, p, c in data:
        timed = {k: t for k, t in c.items() if isinstance(t, float)}
        pick = min(timed, key=lambda k: mma.estimate(p, schedule_of(k), DEV, BW, LAUNCH, prm))
        slow.append(timed[pick] / min(timed.values()))
    print(f"model's pick vs fastest candidate: mean {np.mean(slow):.3f}x, geomean "
          f"{math.exp(np.mean(np.log(slow))):.3f}x, worst {max(slow):.2f}x over {len(slow)} problems")


if __name__ == "__main__":
    main()
