"""Fit conv2d's cost-model constants (jitops/ops/conv2d_cost.py) to a sweep from conv2d_sweep.py.

Least squares on log(estimated / measured time) over every timed candidate, then a report of
what the heuristic would pick per problem and how far that is from the fastest candidate.

Usage: python3 scripts/conv2d_fit.py docs/data/conv2d_sweep_h200_*.json.gz [--device-name "NVIDIA H200"]
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jitops.bench.conv2d import PROBLEMS, op_problem  # noqa: E402
from jitops.device import KNOWN_TARGETS  # noqa: E402
from jitops.ops import conv2d_cost as cost  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import Schedule, TensorSpec  # noqa: E402

SCALARS = ("occ_floor", "occ_warps", "overhead_slices", "gemm_mem_eff", "elem_eff", "launch_s",
           "direct_rate", "direct_load", "direct_lds", "direct_sync", "naive_rate")
BOUNDS = {"occ_floor": (0.05, 0.95), "occ_warps": (2, 40), "overhead_slices": (0, 40),
          "gemm_mem_eff": (0.2, 1.2), "elem_eff": (0.2, 1.2), "launch_s": (0.2e-6, 6e-6), "direct_rate": (0.02, 2.0),
          "direct_load": (0.1, 400), "direct_lds": (0.05, 8), "direct_sync": (0, 2000), "naive_rate": (0.005, 0.5)}


def load(paths):
    rows = []
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            d = json.load(f)
        for key, e in d["problems"].items():
            name, dtype = key.split()
            if "spec" in e:
                sp = e["spec"]
                p = get_op("conv2d").make_problem({"x": TensorSpec(tuple(sp["x"]), dtype),
                                                   "w": TensorSpec(tuple(sp["w"]), dtype)}, sp["attrs"])
            else:
                p = op_problem(next(c for c in PROBLEMS if c.name == name), dtype)
            for r in e["rows"]:
                if r.get("ok") and r.get("us"):
                    rows.append((key, p, Schedule.from_dict(r["schedule"]), r["us"] * 1e-6, e["cudnn_benchmark"]))
    return rows


def params_from(x, tiles):
    n = len(tiles)
    tile_rate = {t: float(v) for t, v in zip(tiles, x[:n])}
    matrix_rate = {t: float(v) for t, v in zip(tiles, x[n:2 * n])}
    scal = {k: float(v) for k, v in zip(SCALARS, x[2 * n:])}
    return replace(cost.PARAMS, tile_rate=tile_rate, matrix_tile_rate=matrix_rate, **scal)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--device-name", default="NVIDIA H200")
    args = ap.parse_args()
    device = replace(KNOWN_TARGETS["sm_90"], name=args.device_name, online=True)
    rows = load(args.sweeps)
    tiles = sorted({tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn")) for _, _, s, _, _ in rows
                    if "bm" in dict(s.params)} | set(cost.PARAMS.tile_rate), reverse=True)
    x0 = [cost.PARAMS.tile_rate.get(t, 0.5) for t in tiles] + \
        [cost.PARAMS.matrix_tile_rate.get(t, 0.5) for t in tiles] + [getattr(cost.PARAMS, k) for k in SCALARS]
    lo = [0.05] * 2 * len(tiles) + [BOUNDS[k][0] for k in SCALARS]
    hi = [1.2] * 2 * len(tiles) + [BOUNDS[k][1] for k in SCALARS]
    scale = np.array([1.0] * 2 * len(tiles) + [1e-6 if k == "launch_s" else 1.0 for k in SCALARS])

    def resid(z):
        prm = params_from(z * scale, tiles)
        return [math.log(cost.estimate(p, s, device, prm) / t) for _, p, s, t, _ in rows]

    fit = least_squares(resid, np.array(x0) / scale, bounds=(np.array(lo) / scale, np.array(hi) / scale))
    prm = params_from(fit.x * scale, tiles)
    r = np.array(resid(fit.x))
    print(f"{len(rows)} timed candidates; rms log error {math.sqrt((r ** 2).mean()):.3f} "
          f"(before {math.sqrt((np.array(resid(np.array(x0) / scale)) ** 2).mean()):.3f})")
    print("tile_rate = {" + ", ".join(f"{t}: {v:.3f}" for t, v in prm.tile_rate.items()) + "}")
    print("matrix_tile_rate = {" + ", ".join(f"{t}: {v:.3f}" for t, v in prm.matrix_tile_rate.items()) + "}")
    for k in SCALARS:
        print(f"{k} = {getattr(prm, k):.4g}")
    # What the heuristic would pick among the timed candidates, per problem.
    by_problem = {}
    for key, p, s, t, cud in rows:
        by_problem.setdefault(key, []).append((cost.estimate(p, s, device, prm), t, s, cud))
    regrets, ratios = [], []
    for key, items in by_problem.items():
        pick = min(items, key=lambda i: i[0])
        best = min(items, key=lambda i: i[1])
        regrets.append(pick[1] / best[1])
        ratios.append(pick[3] / (pick[1] * 1e6))
        print(f"  {key:<28} pick {pick[1] * 1e6:8.1f} us (best {best[1] * 1e6:8.1f}, x{pick[1] / best[1]:.2f})  "
              f"vs cudnn x{pick[3] / (pick[1] * 1e6):.2f}  {pick[2]}")
    print(f"mean regret x{np.mean(regrets):.3f}, worst x{max(regrets):.2f}; "
          f"geomean vs cudnn x{math.exp(np.mean(np.log(ratios))):.2f}, lowest x{min(ratios):.2f}")


if __name__ == "__main__":
    main()
