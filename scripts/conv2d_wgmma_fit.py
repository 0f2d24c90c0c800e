"""Fit conv2d_wgmma.WgmmaCost to a device sweep (scripts/device_conv2d_wgmma.py --max-cands 40):
per-tile rates and the per-block overhead, by least squares on log(time) over every timed
candidate; then report how the fitted model's pick compares with the fastest candidate.

  python3 scripts/conv2d_wgmma_fit.py DIR [DIR ...] [--dtypes=float16,tf32] [--evaluate]
  (reads bench.json, big.json, layers.json, tf32.json; --evaluate: report the current constants)
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402
from jitops.ops.conv2d_cost import machine, PARAMS  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

op = get_op("conv2d")
# The sweeps ran on an H100: its name sets the copy bandwidth machine() charges, as on the device.
DEV = replace(get_backend(target="sm_90").device, name="NVIDIA H100 80GB HBM3")
BW = machine(DEV).bandwidth
KEYS = [t for t in wg.TILES]


def parse(s: str) -> tuple[int, ...]:
    g = dict(re.findall(r"(\w+)=(\w+)", s))
    return int(g["bm"]), int(g["bn"]), int(g["stages"]), int(g["producer"]), int(g["split_k"])


def samples(dirs: list[str], dtypes: tuple = ()) -> list[tuple]:
    out = []
    for d in dirs:
        for name in ("bench", "big", "layers", "tf32"):
            path = os.path.join(d, f"{name}.json")
            if not os.path.exists(path):
                continue
            for row in json.load(open(path)):
                if "wgmma_us" not in row:
                    continue
                attrs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in row["attrs"].items()}
                dtype = "float32" if row["dtype"] == "tf32" else row["dtype"]      # attrs hold precision "tf32"
                if dtypes and row["dtype"] not in dtypes:
                    continue
                spec = {"x": TensorSpec(tuple(row["x"]), dtype, "nhwc"), "w": TensorSpec(tuple(row["w"]), dtype),
                        "bias": None}
                p = op.make_problem(spec, attrs)
                for s, us in row["wgmma_us"].items():
                    if isinstance(us, float):
                        out.append((p, parse(s), us * 1e-6, min(row["vendor_us"].values()) * 1e-6))
    return out


def predict(prm: wg.WgmmaCost, p, t) -> float:
    s = wg.schedule(*t[:4], split_k=t[4])
    return wg.estimate(p, s, DEV, BW, PARAMS.launch_s, prm)  # as conv2d_cost.estimate calls it


def loss(x: np.ndarray, data) -> float:
    prm = to_params(x)
    return float(np.mean([(math.log(predict(prm, p, t)) - math.log(us)) ** 2 for p, t, us, _ in data]))


def loss_of(prm: wg.WgmmaCost, data) -> float:
    return float(np.mean([(math.log(predict(prm, p, t)) - math.log(us)) ** 2 for p, t, us, _ in data]))


def to_params(x: np.ndarray) -> wg.WgmmaCost:
    rates = {k: float(math.exp(v)) for k, v in zip(KEYS, x[:-3])}
    return replace(wg.COST, tile_rate=rates, overhead_k=float(math.exp(x[-3])), l2_bytes_per_s=float(math.exp(x[-2])),
                   split_s=float(math.exp(x[-1])))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dtypes = tuple(a[len("--dtypes="):].split(",") for a in sys.argv[1:] if a.startswith("--dtypes="))
    data = samples(args, dtypes[0] if dtypes else ())
    if "--evaluate" in sys.argv:                 # the current constants, no fit
        report(wg.COST, data)
        return
    print(f"{len(data)} timed candidates")
    x = np.array([math.log(wg.COST.tile_rate.get(k, 0.4)) for k in KEYS] + [math.log(wg.COST.overhead_k),
                                                                                  math.log(wg.COST.l2_bytes_per_s),
                                                                                  math.log(wg.COST.split_s)])
    step = 0.2
    best = loss(x, data)
    while step > 0.01:                     # coordinate descent in log space
        improved = False
        for i in range(len(x)):
            for d in (step, -step):
                y = x.copy()
                y[i] += d
                ly = loss(y, data)
                if ly < best:
                    x, best, improved = y, ly, True
        if not improved:
            step /= 2
    prm = to_params(x)
    print(f"rms log error {math.sqrt(best):.3f}; overhead_k {prm.overhead_k:.1f}; "
          f"L2 {prm.l2_bytes_per_s / 1e12:.2f} TB/s; split-K {prm.split_s * 1e6:.2f} us")
    for k in KEYS:
        print(f"  {k}: {prm.tile_rate[k]:.3f}")
    report(prm, data)


def report(prm: wg.WgmmaCost, data: list) -> None:
    print(f"rms log error of these constants: {math.sqrt(loss_of(prm, data)):.3f}")
    by_problem: dict = {}
    for p, t, us, ven in data:
        by_problem.setdefault(id(p), []).append((p, t, us, ven))
    ratios, vendor = [], []
    for rows in by_problem.values():
        offered = {parse(str(s)) for s in wg.candidates(rows[0][0], DEV)}
        picked = min((r for r in rows if r[1] in offered), key=lambda r: predict(prm, r[0], r[1]))
        fastest = min(r[2] for r in rows)
        ratios.append(picked[2] / fastest)
        vendor.append(picked[3] / picked[2])
        if picked[2] / fastest > 1.15 and "--verbose" in sys.argv:
            p = picked[0]
            best = min(rows, key=lambda r: r[2])
            print(f"  {picked[2] / fastest:.2f} {p.describe()}: picked {picked[1]} {picked[2] * 1e6:.1f} us, "
                  f"fastest {best[1]} {best[2] * 1e6:.1f} us")
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"model pick / fastest wgmma candidate: geomean {g:.3f}, worst {max(ratios):.2f} over {len(ratios)} problems")
    gv = math.exp(sum(map(math.log, vendor)) / len(vendor))
    print(f"vendor time / model pick's time: geomean {gv:.3f}, worst {min(vendor):.2f}")


if __name__ == "__main__":
    main()
