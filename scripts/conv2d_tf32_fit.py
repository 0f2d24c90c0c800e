"""Fit the fp32 matrix-core factors (conv2d_mma.MmaCost.fp32_math) to a device run's tf32 sections.

  python3 scripts/conv2d_tf32_fit.py FILE [FILE ...]   (tf32_bench.json / layers_tf32.json of
        scripts/device_conv2d.py, or the .json.gz in docs/data/conv2d_tf32_h100_2026-11-23/ of a
        run that forced the matrix-core kernel: run1_*)

Per precision: (1) the time fit, the geometric mean of measured / estimated time of the timed
matrix-core pick at the nominal factor (2 for tf32, 6 for 3xtf32); (2) for multiples of that fit,
how well the heuristic's choice between the matrix-core kernel and the exact fp32 kernels goes:
picks that were not the faster of the two measured (the exact kernels timed on NCHW input) and the
total time of the picks over the total of the faster. Estimates for sm_90 (the H100 the data is from).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jitops.bench.conv2d import PROBLEMS  # noqa: E402
from jitops.ops import conv2d_mma as mma  # noqa: E402
from jitops.ops import conv2d_schedules as schedules  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import Schedule, TensorSpec  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

op = get_op("conv2d")
DEV = get_backend(target="sm_90").device
NOMINAL = {"tf32": 2.0, "3xtf32": 6.0}


def load(path: str) -> list:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [r for r in json.load(f) if "error" not in r]


def schedule_of(text: str) -> Schedule:
    params = dict(re.findall(r"(\w+)=(\w+)", text))
    return Schedule.make(text.split("(")[0], **{k: int(v) if v.isdigit() else v for k, v in params.items()})


def problems(paths: list[str]) -> list[tuple]:
    """(precision, problem, timed pick, its seconds, exact kernels' seconds) per row and precision."""
    by_name = {p.name: p for p in PROBLEMS}
    out = []
    for path in paths:
        for r in load(path):
            if "problem" in r:
                cp = by_name[r["problem"]]
                xs, ws, attrs = (cp.n, cp.cin, cp.h, cp.w), (cp.cout, cp.cin, cp.k, cp.k), {"padding": cp.pad}
            else:
                xs, ws, attrs = tuple(r["x"]), tuple(r["w"]), r["attrs"]
            for prec in NOMINAL:
                p = op.make_problem({"x": TensorSpec(xs, "float32", "nhwc"), "w": TensorSpec(ws, "float32"),
                                     "bias": None}, {**attrs, "precision": prec})
                out.append((prec, p, schedule_of(r[f"{prec}_pick"]), r[f"{prec}_us"] * 1e-6, r["highest_us"] * 1e-6))
    return out


def with_factor(prec: str, factor: float) -> None:
    mma.COST = dataclasses.replace(mma.COST, fp32_math={**mma.COST.fp32_math, prec: factor})


def main() -> None:
    rows = problems(sys.argv[1:])
    for prec, nominal in NOMINAL.items():
        mine = [r for r in rows if r[0] == prec and r[2].algorithm == mma.ALGORITHM]
        with_factor(prec, nominal)
        logs = [math.log(t / schedules.estimate(p, s, DEV)) for _, p, s, t, _ in mine]
        fit = nominal * math.exp(sum(logs) / len(logs))
        rms = (sum((x - sum(logs) / len(logs)) ** 2 for x in logs) / len(logs)) ** 0.5
        print(f"{prec}: {len(mine)} problems; time fit {fit:.2f} (rms log error {rms:.2f})")
        for mult in (0.8, 1.0, 1.2, 1.4, 1.7, 2.0, 2.5):
            with_factor(prec, fit * mult)
            chosen, best, wrong = 0.0, 0.0, 0
            for _, p, _, t, h in mine:
                pool = schedules.candidates(p, DEV)
                e_mma = min(schedules.estimate(p, s, DEV) for s in pool if s.algorithm == mma.ALGORITHM)
                e_exact = min(schedules.estimate(p, s, DEV) for s in pool if s.algorithm not in (mma.ALGORITHM, "naive"))
                c = t if e_mma < e_exact else h
                chosen, best, wrong = chosen + c, best + min(t, h), wrong + (c != min(t, h))
            print(f"  factor {fit * mult:5.2f} ({mult:.1f}x the time fit): {wrong} / {len(mine)} picks not the "
                  f"faster, total time {chosen / best:.3f}x the faster's")


if __name__ == "__main__":
    main()
