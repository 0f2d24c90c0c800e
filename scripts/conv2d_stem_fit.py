"""Choose direct_stem's cost constants (conv2d_stem.StemCost) from a device run of
scripts/device_conv2d_stem.py: for each grid point, the heuristic's choice between the stem
kernel's best-estimated candidate and the previous pick (the other kernels' estimates, as the
heuristic sees them) is scored by the measured time it loses against the faster of the two.
No GPU needed.

  python3 scripts/conv2d_stem_fit.py [docs/data/conv2d_stem_h100_2026-11-25/run2_stem_time.json.gz]
"""
from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jitops.device import KNOWN_TARGETS  # noqa: E402
from jitops.ops import conv2d_stem as stem  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import Schedule, TensorSpec  # noqa: E402
from jitops.ops.conv2d_cost import estimate  # noqa: E402

DEFAULT = os.path.join(os.path.dirname(__file__), "..", "docs", "data", "conv2d_stem_h100_2026-11-25",
                       "run2_stem_time.json.gz")


def parse(text: str) -> Schedule:
    """A schedule from its printed form, e.g. 'direct_stem(block=128, cot=16)'."""
    alg, rest = text.split("(", 1)
    params = {}
    for part in rest.rstrip(")").split(", "):
        k, v = part.split("=")
        params[k] = int(v) if v.lstrip("-").isdigit() else v
    return Schedule.make(alg, **params)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    rows = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    op = get_op("conv2d")
    dev = dataclasses.replace(KNOWN_TARGETS["sm_90"], name="NVIDIA H100 80GB HBM3")   # the measured card's bandwidth
    data = []
    for r in rows:
        spec = {"x": TensorSpec(tuple(r["x"]), r["dtype"], "nhwc" if r["layout"] == "nhwc" else ""),
                "w": TensorSpec(tuple(r["w"]), r["dtype"]), "bias": TensorSpec((r["w"][0],), r["dtype"])}
        p = op.make_problem(spec, r["attrs"])
        data.append((r, p, estimate(p, parse(r["before"]), dev), [(parse(k), t) for k, t in r["stem_us"].items()]))
    results = []
    for ie, me, pt in itertools.product((0.35, 0.4, 0.45, 0.5, 0.55, 0.6), (0.5, 0.6, 0.7), (5.0, 10.0, 20.0)):
        stem.COST = stem.StemCost(issue_eff=ie, mem_eff=me, per_tap=pt)
        lost = err = n = 0.0
        for r, p, e_before, cands in data:
            ests = [(estimate(p, s, dev), t) for s, t in cands]
            err += sum(math.log(t / (e * 1e6)) ** 2 for e, t in ests)
            n += len(ests)
            e_stem, t_stem = min(ests)
            chosen = t_stem if e_stem < e_before else r["before_us"]
            lost += math.log(chosen / min(r["before_us"], min(t for _, t in cands)))
        results.append((math.exp(lost / len(data)), math.sqrt(err / n), (ie, me, pt)))
    results.sort()
    print(f"{len(data)} rows from {path}")
    print("pick / faster of the two (geomean), rms log error, (issue_eff, mem_eff, per_tap)")
    for g, rms, prm in results[:8]:
        print(f"  {g:.4f}  {rms:.3f}  {prm}")


if __name__ == "__main__":
    main()
