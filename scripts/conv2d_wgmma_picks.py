"""How good the conv2d heuristic's wgmma picks are, from device timings alone (no device needed),
and the TF32 constants of conv2d_wgmma.WgmmaCost chosen on those timings.

  python3 scripts/conv2d_wgmma_picks.py [--tree DIR] [--sweep FILE ...] [--verbose]
      per precision (fp16, bf16, TF32) and set: the heuristic's pick (every algorithm, as
      jitops runs it on an H100) against the fastest timed candidate of the problem, geometric
      mean and worst, and against cuDNN; picks that were never timed are listed, not guessed.
      --tree: evaluate another source tree's jitops (e.g. `git archive BASE | tar -x -C DIR`).
  python3 scripts/conv2d_wgmma_picks.py --tf32 [--lam 1] [--seeds 4] [--loo] [--sweep FILE ...]
      choose the TF32 constants (per-tile rates of the dense TF32 rate, non-persistent and
      persistent, the two per-block overheads and the L2 rate): least squares on log time of
      every timed wgmma candidate, weighted 1 / candidates per problem, times `lam`, plus the log
      of the pick's time over the fastest (mean + a quarter of the worst). Coordinate descent in
      log space from `seeds` starts; --loo refits without each problem in turn and scores the
      pick of the problem left out. Prints the constants for jitops/ops/conv2d_wgmma.py.

Timings (H100 80GB HBM3, graph replay, every candidate checked against float64 before it was timed):
  docs/data/conv2d_wgmma_h100_2026-11-25/run10_*.json.gz      every non-persistent wgmma candidate
      (15 benchmark problems fp16 / bf16, 14 large layers fp16, 93 torchvision layers fp16, the
      29 benchmark + large problems in TF32), the heuristic's pick of the day and mma.sync's
  docs/data/conv2d_persistent_h100_2026-11-25/run2_persist.json   every persistent tile offered
      (fp16 and TF32, 13 problems each), scaled to run 10 by the ratio of the two runs' times of
      the same non-persistent schedule (the pick of each run; the runs differ by up to 8%)
  docs/data/conv2d_persistent_h100_2026-11-25/run3_picks.json     the picks of that evening,
      used only for schedules no other run timed (the RGB stems' direct_stem)
  --sweep FILE: sweep.json(.gz) of scripts/device_conv2d_persistent.py --sweep (one run, every
      candidate), e.g. docs/data/conv2d_tf32_h100_2026-11-26/run1_sweep.json.gz (the TF32
      constants' data); a problem it holds takes its times from it alone (read up to the first
      row with a failed call: that run ran out of memory at its end).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import sys
from collections import Counter
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
if "--tree" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])
else:
    sys.path.insert(0, ROOT)

from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec, ceil_div  # noqa: E402
from jitops.ops.conv2d_cost import PARAMS, machine  # noqa: E402
from jitops.ops.conv2d_mma import channels, k_padded, needs_nhwc_copy, splits_of  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

op = get_op("conv2d")
# The timings come from an H100: its name sets the copy bandwidth conv2d_cost.machine() charges.
DEV = replace(get_backend(target="sm_90").device, name="NVIDIA H100 80GB HBM3")
BW = machine(DEV).bandwidth
WGMMA_DIR = os.path.join(ROOT, "docs/data/conv2d_wgmma_h100_2026-11-25")
PERSIST_DIR = os.path.join(ROOT, "docs/data/conv2d_persistent_h100_2026-11-25")


def canon(text: str) -> str:
    """A schedule's text with its parameters sorted (the runs printed them in different orders)."""
    params = dict(re.findall(r"(\w+)=(\w+)", text))
    return text.split("(")[0] + "(" + ", ".join(f"{k}={params[k]}" for k in sorted(params)) + ")"


def problem(x, w, attrs, dtype):
    attrs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in attrs.items() if k != "precision"}
    dt = "float32" if dtype == "tf32" else dtype
    if dtype == "tf32":
        attrs["precision"] = "tf32"
    return op.make_problem({"x": TensorSpec(tuple(x), dt, "nhwc"), "w": TensorSpec(tuple(w), dt), "bias": None}, attrs)


def _load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def _attrs_key(attrs) -> str:
    """stride, padding, dilation and groups as one string (the runs wrote ints, lists or tuples)."""
    out = []
    for name, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1)):
        v = attrs.get(name, default)
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        if name != "groups" and len(v) == 1:
            v = v * 2
        if name == "padding" and len(v) == 2:
            v = v * 2
        out.append(f"{name}={v}")
    return " ".join(out)


def _key(r):
    return tuple(r["x"]), tuple(r["w"]), r["dtype"], _attrs_key(r["attrs"])


def _find(data, r):
    """The entry of a run that wrote no attributes (run 2): the one problem with its shapes."""
    found = [k for k in data if k[:3] == (tuple(r["x"]), tuple(r["w"]), r["dtype"])]
    assert len(found) == 1, (r["x"], r["w"], found)
    return data[found[0]]


def measured(sweeps=()) -> dict:
    """(x, w, dtype) -> {"section", "label", "x", "w", "attrs", "dtype", "vendor" (best cuDNN us), "times"}."""
    data = {}
    for sec in ("bench", "big", "layers", "tf32"):
        for r in _load(os.path.join(WGMMA_DIR, f"run10_{sec}.json.gz")):
            d = data.setdefault(_key(r), {"section": "big" if r["label"].startswith("big") else sec if sec != "tf32" else "bench",
                                          "label": r["label"], "x": r["x"], "w": r["w"], "attrs": r["attrs"],
                                          "dtype": r["dtype"], "vendor": min(r["vendor_us"].values()), "times": {}})
            for s, us in r["wgmma_us"].items():
                if isinstance(us, float):
                    d["times"][canon(s)] = us
            for s, us in ((r.get("pick"), r.get("pick_us")), (r.get("mma_pick"), r.get("mma_us"))):
                if isinstance(us, float):
                    d["times"].setdefault(canon(s), us)
    for r in _load(os.path.join(PERSIST_DIR, "run2_persist.json")):
        d = _find(data, r)
        scale = d["times"].get(canon(r["pick"]), r["pick_us"]) / r["pick_us"]
        for tile, us in r["persistent"].items():
            if isinstance(us, float):
                s = wg.schedule(*json.loads(tile.replace("(", "[").replace(")", "]")), bk=32 if r["dtype"] == "tf32" else 64,
                                persistent=True)
                d["times"][canon(str(s))] = us * scale
    for r in _load(os.path.join(PERSIST_DIR, "run3_picks.json")):
        if not r["pick"].startswith(wg.ALGORITHM) and isinstance(r["pick_us"], float):
            data[_key(r)]["times"].setdefault(canon(r["pick"]), r["pick_us"])      # run 3 wrote its attributes
    for path in sweeps:
        for r in _load(path):
            if any(isinstance(us, str) and us.startswith("error") for us in r["times"].values()):
                break                   # failed calls (out of memory): this row and the later ones are suspect
            times = {canon(s): us for s, us in r["times"].items() if isinstance(us, float)}
            if not times:
                continue
            data[_key(r)] = {"section": r["section"], "label": r["label"], "x": r["x"], "w": r["w"],
                             "attrs": r["attrs"], "dtype": r["dtype"], "vendor": min(r["cudnn"].values()), "times": times}
    return data


def geo(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def evaluate(data: dict, verbose: bool = False, over: float = 1.05) -> dict:
    """Per (dtype, section): the heuristic's pick / the fastest timed candidate and cuDNN / the pick."""
    out = {}
    for key, d in sorted(data.items(), key=lambda kv: (kv[1]["dtype"], kv[1]["section"])):
        p = problem(d["x"], d["w"], d["attrs"], d["dtype"])
        pick = canon(str(op.heuristic(p, DEV)))
        row = out.setdefault((d["dtype"], d["section"]), {"ratio": [], "vendor": [], "untimed": []})
        best = min(d["times"].values())
        if pick not in d["times"]:
            row["untimed"].append(f"{d['label']} {d['x']} {d['w']}: {pick}")
            continue
        row["ratio"].append(d["times"][pick] / best)
        row["vendor"].append(d["vendor"] / d["times"][pick])
        if verbose and d["times"][pick] / best > over:
            fastest = min(d["times"], key=d["times"].get)
            print(f"  {d['dtype']:8} {d['label']:20} {str(d['x']):20} {str(d['w']):20} pick {d['times'][pick]:7.1f} us "
                  f"{pick[len(wg.ALGORITHM):]} | fastest {best:7.1f} {fastest[len(wg.ALGORITHM):]}")
    return out


def report(data: dict, verbose: bool) -> None:
    res = evaluate(data, verbose)
    print(f"{'dtype':9}{'set':8}{'timed':>6}{'pick/fastest':>14}{'worst':>7}{'cuDNN/pick':>12}{'lowest':>8}  untimed picks")
    for (dtype, sec), r in sorted(res.items()):
        if not r["ratio"]:
            continue
        print(f"{dtype:9}{sec:8}{len(r['ratio']):6}{geo(r['ratio']):14.3f}{max(r['ratio']):7.2f}{geo(r['vendor']):12.3f}"
              f"{min(r['vendor']):8.2f}  {len(r['untimed'])}")
        if verbose:
            for u in r["untimed"]:
                print(f"      untimed: {u}")
    for dtype in ("float16", "bfloat16", "tf32"):
        rs = [v for (dt, _), r in res.items() if dt == dtype for v in r["ratio"]]
        if rs:
            print(f"{dtype:9}{'all':8}{len(rs):6}{geo(rs):14.3f}{max(rs):7.2f}")


# ---------------------------------------------------------------- the TF32 constants

class Tf32Fit:
    """Every timed TF32 wgmma candidate as the terms of wg.estimate, so that the constants can be
    varied without re-planning: t = launch + max(W (K + overhead) / share, bytes / L2, DRAM) + extra."""

    def __init__(self, data: dict):
        self.tiles = list(wg.TILES) + [("p",) + t for t in wg.PERSISTENT_TILES]
        rows, self.groups, self.sections = [], [], []
        for d in data.values():
            if d["dtype"] != "tf32":
                continue
            p = problem(d["x"], d["w"], d["attrs"], "tf32")
            idx, where = [], {}
            for s in wg.candidates(p, DEV):
                us = d["times"].get(canon(str(s)))
                if us is not None:
                    where[canon(str(s))] = len(rows)
                    idx.append(len(rows))
                    rows.append(self.terms(p, s) + (us * 1e-6, len(self.groups), -1))
            for s in wg.candidates(p, DEV):       # the persistent twin the heuristic would run instead
                twin = wg.persistent_twin(p, s, DEV)
                if canon(str(s)) in where and twin is not None and canon(str(twin)) in where:
                    rows[where[canon(str(s))]] = rows[where[canon(str(s))]][:-1] + (where[canon(str(twin))],)
            if idx:
                self.groups.append((d["label"], np.array(idx), min(rows[i][7] for i in idx)))
                self.sections.append(d["section"])
        r = np.array(rows)
        self.ti = r[:, 0].astype(int)
        self.w, self.k, self.bytes, self.dram, self.fixed, self.extra, self.t = (r[:, i] for i in range(1, 8))
        self.g = r[:, 8].astype(int)
        self.twin = np.where(r[:, 9] >= 0, r[:, 9], np.arange(len(r))).astype(int)
        self.pers = np.array([isinstance(self.tiles[i][0], str) for i in self.ti])
        # Each set (benchmark problems, large layers, torchvision layers) weighs the same, and each
        # problem the same within its set.
        count = Counter(self.sections)
        self.problem_weight = np.array([1.0 / count[sec] for sec in self.sections])
        self.weight = np.array([self.problem_weight[g] / len(self.groups[g][1]) for g in self.g])
        counts = Counter(self.ti.tolist())
        self.free = [i for i in range(len(self.tiles)) if counts.get(i)] + [len(self.tiles) + j for j in range(3)]

    def terms(self, p, s):
        bm, bn, stages, producer = wg.tile_of(s)
        pers = wg.is_persistent(s)
        splits, per = splits_of(p, s)
        blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout_g, bn) * p.groups * splits
        if pers:
            resident = wg.persistent_blocks(bm, bn, stages, DEV)
        else:
            threads = wg.threads_of(bm, producer)
            resident = max(1, min(DEV.shared_per_multiprocessor // wg.shared_bytes(bm, bn, stages),
                                  DEV.registers_per_multiprocessor // (threads * (bn // 2 + 70))))
        waves = ceil_div(blocks, DEV.multiprocessors * resident) * resident
        bk, isz = wg.bk_of(p), p.itemsize
        cs, _ = channels(p)
        x_bytes = p.n * p.h * p.w * cs * isz
        y_bytes = p.n * p.cout * p.oh * p.ow * isz * (2 if p.has_residual else 1)
        dram = (x_bytes + y_bytes + p.cout * k_padded(p, bk) * isz) / BW
        extra = 0.0
        if needs_nhwc_copy(p, s):
            extra += PARAMS.launch_s + (p.n * p.cin * p.h * p.w * isz + x_bytes) / (0.8 * BW)
        if splits > 1:
            extra += wg.COST.split_s + (splits * p.cout * p.pixels * 4 + y_bytes) / (0.688 * BW)
        tile = (bm, bn, stages, producer)
        ti = self.tiles.index(("p",) + tile if pers else tile)
        rows = (p.pixels * ceil_div(p.cout_g, bn) + p.cout_g * ceil_div(p.pixels, bm)) * p.groups * splits
        return (ti, waves * 2.0 * bm * bn / (4096 * 1.83e9 / 2), per * bk, rows * per * bk * isz, dram,
                PARAMS.launch_s, extra)

    def current(self) -> np.ndarray:
        """The constants in jitops/ops/conv2d_wgmma.py."""
        c = wg.COST
        x = [math.log(c.tf32_persistent_rate.get(t[1:], wg.UNRATED_TF32) if t[0] == "p"
                      else c.tf32_rate.get(t, wg.UNRATED_TF32)) for t in self.tiles]
        return np.array(x + [math.log(c.tf32_overhead_k), math.log(c.tf32_persistent_overhead_k),
                             math.log(c.tf32_l2_bytes_per_s)])

    def start(self) -> np.ndarray:
        """Where the fit starts (fixed, so that the result depends on the data alone): every timed
        tile at half the rate, 150 K elements of overhead, 8 TB/s from L2."""
        x = [math.log(0.5) if i in self.free else math.log(wg.UNRATED_TF32) for i in range(len(self.tiles))]
        return np.array(x + [math.log(150.0), math.log(150.0), math.log(8e12)])

    def estimate(self, x) -> np.ndarray:
        n = len(self.tiles)
        share = np.minimum(np.exp(x[:n]), 1.0)[self.ti]
        overhead = np.where(self.pers, math.exp(x[n + 1]), math.exp(x[n]))
        compute = np.maximum(self.w * (self.k + overhead) / share, self.bytes / math.exp(x[n + 2]))
        return self.fixed + np.maximum(compute, self.dram) + self.extra

    def pick_logs(self, x, groups=None) -> np.ndarray:
        e = self.estimate(x)
        return np.array([math.log(self.t[self.twin[idx[np.argmin(e[idx])]]] / best)
                         for g, (_, idx, best) in enumerate(self.groups) if groups is None or g in groups])

    def rms(self, x, groups=None) -> float:
        m = np.ones(len(self.t), bool) if groups is None else np.isin(self.g, list(groups))
        err = (np.log(self.estimate(x)[m]) - np.log(self.t[m])) ** 2
        return math.sqrt(float((err * self.weight[m]).sum() / self.weight[m].sum()))

    def objective(self, x, lam, groups=None) -> float:
        logs = self.pick_logs(x, groups)
        w = self.problem_weight if groups is None else self.problem_weight[sorted(groups)]
        return float((logs * w).sum() / w.sum()) + 0.25 * logs.max() + lam * self.rms(x, groups) ** 2

    def fit(self, x0, lam, groups=None, seed=0, rounds=3):
        rng = random.Random(seed)
        x, best = x0.copy(), self.objective(x0, lam, groups)
        for rnd in range(rounds):
            for step in (0.4, 0.2, 0.1, 0.05, 0.025):
                better = True
                while better:
                    better = False
                    for i in rng.sample(self.free, len(self.free)):
                        for dx in (step, -step):
                            y = x.copy()
                            y[i] += dx
                            v = self.objective(y, lam, groups)
                            if v < best - 1e-9:
                                x, best, better = y, v, True
            if rnd < rounds - 1:         # a random kick, then descend again
                x = x + np.array([rng.gauss(0, 0.1) if i in self.free else 0.0 for i in range(len(x))])
                best = self.objective(x, lam, groups)
        return x, best

    def constants(self, x) -> str:
        n = len(self.tiles)
        rate = {t: round(min(1.0, math.exp(x[i])), 3) for i, t in enumerate(self.tiles) if i in self.free and t[0] != "p"}
        prate = {t[1:]: round(min(1.0, math.exp(x[i])), 3) for i, t in enumerate(self.tiles) if i in self.free and t[0] == "p"}
        return (f"TF32_RATE = {rate}\nTF32_PERSISTENT_RATE = {prate}\nTF32_OVERHEAD_K = {math.exp(x[n]):.1f}\n"
                f"TF32_PERSISTENT_OVERHEAD_K = {math.exp(x[n + 1]):.1f}\nTF32_L2_BYTES_PER_S = {math.exp(x[n + 2]):.3g}")


def fit_tf32(data: dict, lam: float, seeds: int, loo: bool) -> None:
    f = Tf32Fit(data)
    xc = f.current()
    logs = f.pick_logs(xc)
    print(f"{len(f.t)} timed TF32 candidates on {len(f.groups)} problems; {len(f.free) - 3} tiles rated")
    print(f"current constants: pick / fastest {math.exp(logs.mean()):.3f}, worst {math.exp(logs.max()):.3f}, "
          f"rms {f.rms(xc):.3f}")
    x0 = f.start()
    x, _ = min((f.fit(x0, lam, seed=s) for s in range(seeds)), key=lambda r: r[1])
    logs = f.pick_logs(x)
    print(f"fitted (lam {lam}): pick / fastest {math.exp(logs.mean()):.3f}, worst {math.exp(logs.max()):.3f}, "
          f"rms {f.rms(x):.3f}")
    print(f.constants(x))
    if loo:
        out = []
        for g in range(len(f.groups)):
            xg, _ = f.fit(x, lam, groups=set(range(len(f.groups))) - {g}, rounds=1)
            out.append(f.pick_logs(xg, {g})[0])
            print(f"  left out {f.groups[g][0]:20} its pick / fastest {math.exp(out[-1]):.3f}", flush=True)
        print(f"leave-one-out: pick / fastest {math.exp(np.mean(out)):.3f}, worst {math.exp(max(out)):.3f}")


def main() -> None:
    args = sys.argv[1:]
    sweeps = [args[i + 1] for i, a in enumerate(args) if a == "--sweep"]
    data = measured(sweeps)
    if "--tf32" in args:
        lam = float(args[args.index("--lam") + 1]) if "--lam" in args else 1.0
        seeds = int(args[args.index("--seeds") + 1]) if "--seeds" in args else 4
        fit_tf32(data, lam, seeds, "--loo" in args)
    else:
        report(data, "--verbose" in args)


if __name__ == "__main__":
    main()
