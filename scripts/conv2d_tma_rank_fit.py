"""Fits the TMA conv kernel's per-tile rates for fast-memory devices (the H200) to what the heuristic's picks
measure, not to the times themselves: coordinate descent over one multiplier per fp16 / bf16 tile, scoring
each setting by the count-weighted measured time of the heuristic's picks over the device's pool sweeps
(scripts/conv2d_pick_regret.py's rows). A least-squares fit of the times did not rank better (the picks
got worse, docs/performance.md "the heuristic on the H200"); this one optimizes the ranking directly.

Held out: fitted on the layers of one half of the networks, scored on the other, both ways; then fitted
on all. Layers whose current pick the sweep did not time are left out (as conv2d_pick_regret does); a
changed pick the sweep did not time costs the layer's slowest timed schedule (no reward for leaving the
measured set).

    PYTHONPATH=$PWD python3 scripts/conv2d_tma_rank_fit.py SWEEP.json.gz ... [--extra POINTWISE.json.gz]
"""
from __future__ import annotations

import argparse
import dataclasses
import math

import conv2d_pick_regret as R
from jitops.ops import conv2d_schedules as S
from jitops.ops import conv2d_wgmma as wg
from jitops.ops.conv2d_cost import estimate
from jitops.runtime import get_backend

GRID = (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3)
# the networks of the first held-out half (the rest, and the large layers, form the second)
HALF_A = ("resnet50", "efficientnet_b0", "mobilenet_v3_large", "vgg16")
LONE_SHARE = wg.TMA_LONE_SHARE


@dataclasses.dataclass
class Layer:
    """One sweep row, prepared: the pick without the TMA kernel and its estimate, the TMA schedules."""
    name: str
    count: int
    times: dict
    best_other: float
    pick_other: str
    tma: list

    def time_of(self, key: str) -> float:
        return self.times.get(key, max(self.times.values()))


def prepare(rows: list, device) -> list[Layer]:
    problems = [R.problem(row) for row in rows]
    keep = wg.tma_candidates
    wg.tma_candidates = lambda *_: []               # the heuristic's picks without the TMA kernel
    try:
        picks_other = [str(R.OP.heuristic(p, device)) for p in problems]
    finally:
        wg.tma_candidates = keep
    layers = []
    for row, p, pick_other in zip(rows, problems, picks_other):
        pool = S._pool(p, device, None)
        tma = [s for s in pool if wg.is_tma(s)]
        others = [s for s in pool if not wg.is_tma(s)]
        best_other = S._best(p, device, others)[1] if others else math.inf
        layer = Layer(row["layer"], row["count"], row["times"], best_other, pick_other,
                      [(p, s, R.recorded_key(str(s))) for s in tma])
        if pick(layer, device) in row["times"]:     # as conv2d_pick_regret: a layer whose pick was not timed is left out
            layers.append(layer)
    return layers


def pick(layer: Layer, device) -> str:
    """The heuristic's pick under the current TMA_RATE (the TMA kernel against the rest's best estimate)."""
    best, key = layer.best_other, layer.pick_other
    for p, s, k in layer.tma:
        t = estimate(p, s, device)
        if t < best:
            best, key = t, k
    return key


def total(layers: list[Layer], device) -> float:
    return sum(la.count * la.time_of(pick(la, device)) for la in layers)


def fit(layers: list[Layer], device, rounds: int = 3) -> dict:
    """wg.TMA_RATE_FAST_MEMORY_SCALE by coordinate descent over GRID per fp16 / bf16 tile, and a multiplier of
    the lone share (key "lone": a pair tile's lone blocks run at its scaled rate times TMA_LONE_SHARE), from all
    ones; a change must gain 0.1%."""
    scale = {tile: 1.0 for cls, tile in wg.TMA_RATE if cls == "16"}
    scale["lone"] = 1.0

    def score() -> float:
        wg.TMA_RATE_FAST_MEMORY_SCALE = {t: m for t, m in scale.items() if t != "lone"}
        wg.TMA_LONE_SHARE = LONE_SHARE * scale["lone"]
        return total(layers, device)
    now = score()
    for _ in range(rounds):
        moved = False
        for tile in scale:
            start = best_m = scale[tile]
            best_t = now
            for m in GRID:
                scale[tile] = m
                t = score()
                if t < best_t * 0.999:
                    best_m, best_t = m, t
            scale[tile] = best_m
            if best_m != start:
                moved, now = True, best_t
        if not moved:
            break
    score()
    return scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--device", default="NVIDIA H200")
    args = ap.parse_args()
    device = dataclasses.replace(get_backend(target="sm_90").device, name=args.device)
    rows = R.distinct([r for path in args.sweeps for r in R.load(path)])
    for path in args.extra:
        rows = R.merge_times(rows, R.load(path))
    shipped = wg.TMA_RATE_FAST_MEMORY_SCALE
    wg.TMA_RATE_FAST_MEMORY_SCALE = {}                # the picks before any scaling
    layers = prepare(rows, device)
    by_name = {row["layer"]: row for row in rows}
    mismatch = [la.name for la in layers
                if pick(la, device) != R.recorded_key(str(R.OP.heuristic(R.problem(by_name[la.name]), device)))]
    print(f"{len(layers)} of {len(rows)} layers; the fast evaluator disagrees with the heuristic on {len(mismatch)}")
    half_a = [la for la in layers if la.name.split(" ")[0] in HALF_A]
    half_b = [la for la in layers if la.name.split(" ")[0] not in HALF_A]
    best = {"a": sum(la.count * min(la.times.values()) for la in half_a),
            "b": sum(la.count * min(la.times.values()) for la in half_b)}
    before = {"a": total(half_a, device), "b": total(half_b, device)}
    for fit_on, held in (("a", "b"), ("b", "a")):
        scale = fit(half_a if fit_on == "a" else half_b, device)
        after = total(half_a if held == "a" else half_b, device)
        print(f"fitted on half {fit_on}: held-out half {held} picks {before[held]:.1f} -> {after:.1f} us "
              f"(fastest {best[held]:.1f}: regret {before[held] / best[held]:.3f}x -> {after / best[held]:.3f}x)")
        print("   ", {t: m for t, m in scale.items() if m != 1.0})
        wg.TMA_RATE_FAST_MEMORY_SCALE, wg.TMA_LONE_SHARE = {}, LONE_SHARE
    wg.TMA_RATE_FAST_MEMORY_SCALE = {}
    nets: dict = {}
    for la in layers:
        nets.setdefault(la.name.rsplit(" ", 4)[0] if not la.name.startswith("big") else "large layers", []).append(la)
    was = {net: total(group, device) for net, group in nets.items()}
    scale = fit(layers, device)
    allbest = best["a"] + best["b"]
    print(f"fitted on all: picks {before['a'] + before['b']:.1f} -> {total(layers, device):.1f} us "
          f"(fastest {allbest:.1f})")
    print("   ", {t: m for t, m in scale.items() if m != 1.0})
    for net, group in nets.items():
        fastest = sum(la.count * min(la.times.values()) for la in group)
        print(f"    {net:24s} {was[net]:8.1f} -> {total(group, device):8.1f} us (fastest {fastest:8.1f})")
    wg.TMA_RATE_FAST_MEMORY_SCALE, wg.TMA_LONE_SHARE = shipped, LONE_SHARE


if __name__ == "__main__":
    main()
