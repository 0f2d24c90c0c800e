"""Scores the conv2d heuristic offline against a device sweep (scripts/device_conv2d_pool_sweep.py): for
each layer the schedule the heuristic picks now (on the sweep's device, rebuilt from its name) and what
that schedule measured there, against the fastest schedule measured and cuDNN. A change to the cost
model or the rules is judged by the network-weighted time of its picks ("regret": how much slower
than the fastest timed schedule), on layers it was not tuned on.

    PYTHONPATH=$PWD python3 scripts/conv2d_pick_regret.py SWEEP.json[.gz] [--device "NVIDIA H200"] [-v]
        [--extra POINTWISE_nhwc.json[.gz]]

A pick the sweep did not time is reported and left out of the sums; a layer in several sweeps counts once,
from the last sweep given.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import re

from jitops.ops import conv2d_wgmma as wg
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.runtime import get_backend

OP = get_op("conv2d")


def load(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def layout_of(xs) -> str:
    """The layout jitops reads a channels_last tensor of shape xs in: NCHW where that is C-contiguous too
    (1 x 1 pixels, as in squeeze-excitation layers)."""
    return "" if xs[2] * xs[3] == 1 else "nhwc"


def merge_times(rows: list, extra: list) -> list:
    """rows with the schedule times of another sweep of the same layers added where the row lacks them
    (scripts/device_conv2d_pointwise.py times one kernel's schedules on layers the pool sweeps timed
    before it existed); the row's own times stay."""
    by_shape = {(tuple(e["x"]), tuple(e["w"])): e for e in extra}
    out = []
    for r in rows:
        e = by_shape.get((tuple(r["x"]), tuple(r["w"])))
        plain = all(v in (1, 0, [1, 1], [0, 0], [0, 0, 0, 0]) for v in r["attrs"].values())
        if e is not None and plain:
            r = {**r, "times": {**e["times"], **r["times"]}}
        out.append(r)
    return out


def distinct(rows: list) -> list:
    """One row per layer (shapes and attributes): where sweeps overlap, the later one given."""
    keyed = {(tuple(r["x"]), tuple(r["w"]), json.dumps(r["attrs"], sort_keys=True)): r for r in rows}
    return list(keyed.values())


def problem(row: dict, dtype: str = "float16"):
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in row["attrs"].items()}
    xs = tuple(row["x"])
    spec = {"x": TensorSpec(xs, dtype, layout_of(xs)), "w": TensorSpec(tuple(row["w"]), dtype), "bias": None}
    return OP.make_problem(spec, attrs)


def recorded_key(schedule: str) -> str:
    """The key a sweep recorded a schedule under: sweeps before 2026-11-29 19:00 timed the TMA kernel's 1x1 tiles
    through the im2col map, which the tiled map (`a_rows`, same tile, 1.018x faster) has replaced; sweeps before
    2026-11-29 20:50 timed one-wave grids on the shallow ring their deep tile replaced (TMA_ONE_WAVE_DEEPER, 0.99-1.23x
    slower), so a deep pick is scored at its shallow source's time."""
    schedule = schedule.replace("(a_rows=1, ", "(")
    num = {k: int(v) for k, v in re.findall(r"\b(bm|bn|stages|tma|regs)=(\d+)", schedule)}
    if "tma" in num:
        tile = (num["bm"], num["bn"], num["stages"], num["tma"], num.get("regs", 0))
        schedule = re.sub(r"\bstages=\d+", f"stages={wg.tma_rated_as(tile)[2]}", schedule)
    return schedule


def score(rows: list, device, verbose: bool = False) -> tuple[dict, list]:
    """Count-weighted sums (us) of the picks, the fastest schedules and cuDNN, per network prefix, over the
    layers whose pick the sweep timed; and (layer, pick) of those it did not."""
    nets: dict = {}
    untimed = []
    for row in rows:
        p = problem(row)
        pick = str(OP.heuristic(p, device))
        times = row["times"]
        if pick not in times:
            pick = recorded_key(pick)
        if pick not in times:
            untimed.append((row["layer"], pick))
            continue
        net = row["layer"].rsplit(" ", 4)[0] if not row["layer"].startswith("big") else "large layers"
        best = min(times.values())
        s = nets.setdefault(net, {"pick": 0.0, "best": 0.0, "cudnn": 0.0, "sweep_pick": 0.0, "worst": (0.0, ""),
                                  "logs": []})
        c = row["count"]
        s["pick"] += c * times[pick]
        s["best"] += c * best
        s["cudnn"] += c * row["cudnn_us"]
        s["sweep_pick"] += c * times.get(row["pick"], times[pick])
        s["logs"].append(math.log(row["cudnn_us"] / times[pick]))
        if times[pick] / best > s["worst"][0]:
            s["worst"] = (times[pick] / best, row["layer"])
        if verbose and times[pick] > 1.03 * best:
            fastest = min(times, key=times.get)
            print(f"  {row['layer']:44s} pick {times[pick]:6.1f} best {best:6.1f} ({times[pick] / best:.2f}x) "
                  f"cuDNN {row['cudnn_us']:6.1f}\n      pick {pick[19:]}\n      best {fastest[19:]}")
    return nets, untimed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--device", default="NVIDIA H200", help="the sweep's device name (bandwidth by name)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--extra", action="append", default=[],
                    help="a sweep of some schedules on the same layers (pointwise.json): its times join the rows'")
    args = ap.parse_args()
    device = dataclasses.replace(get_backend(target="sm_90").device, name=args.device)
    rows = distinct([r for path in args.sweeps for r in load(path)])
    for path in args.extra:
        rows = merge_times(rows, load(path))
    nets, untimed = score(rows, device, args.verbose)
    for layer, pick in untimed:
        print(f"  untimed pick: {layer}: {pick}")
    total = {"pick": 0.0, "best": 0.0, "cudnn": 0.0, "sweep_pick": 0.0}
    print(f"{'network':22s} {'picks us':>9s} {'sweep us':>9s} {'best us':>9s} {'cuDNN us':>9s}  regret  "
          f"vs cuDNN (sum, geomean)  worst pick / best")
    for net, s in nets.items():
        for k in total:
            total[k] += s[k]
        geo = math.exp(sum(s["logs"]) / len(s["logs"]))
        print(f"{net:22s} {s['pick']:9.1f} {s['sweep_pick']:9.1f} {s['best']:9.1f} {s['cudnn']:9.1f}  "
              f"{s['pick'] / s['best']:.3f}x  {s['cudnn'] / s['pick']:.3f}x {geo:.3f}x  "
              f"{s['worst'][0]:.2f}x {s['worst'][1]}")
    print(f"{'all':22s} {total['pick']:9.1f} {total['sweep_pick']:9.1f} {total['best']:9.1f} {total['cudnn']:9.1f}  "
          f"{total['pick'] / total['best']:.3f}x  {total['cudnn'] / total['pick']:.3f}x")


if __name__ == "__main__":
    main()
