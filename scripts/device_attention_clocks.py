"""Sustained runs of the attention pick and SDPA with the SM clock and board power sampled (GPU).

Why: short graph timings (the tuner's) put issue 16's D = 128 pick at 0.98x SDPA, the steady-state A/B
at 0.87-0.91x. This script runs each kernel alone for a few seconds (CUDA-graph replays of 20 calls,
each replay timed by events) while `nvidia-smi -lms 50` samples clocks, power and throttle reasons,
then the two interleaved replay by replay, and reports per phase: the first replays' time, the
settled time, the SM clock and power while settled, and cycles per call (time x clock).

    python3 scripts/device_attention_clocks.py [--shapes "B=8 H=16 S=2048 D=128,..."] [--seconds 2.5] [--out DIR]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from device_attention_ab import checked_error, custom_shape, first_heads_reference  # noqa: E402

SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def run_phase(graphs: dict, seconds: float, n: int = 20) -> list[tuple[str, float, float]]:
    """Replay the graphs in turn for `seconds`; [(label, host time at the end, us per call)]."""
    import torch
    samples = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        for label, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append((label, time.time(), start.elapsed_time(end) * 1e3 / n))
    return samples


def read_smi(path: str) -> list[dict]:
    """nvidia-smi CSV rows -> [{t, sm_mhz, mem_mhz, watts, temp, reasons}]."""
    rows = []
    with open(path) as f:
        for rec in csv.reader(f):
            if len(rec) < 6:
                continue
            try:
                t = time.mktime(time.strptime(rec[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S")) + \
                    float("0." + rec[0].strip().split(".")[1])
                rows.append({"t": t, "sm_mhz": float(rec[1].split()[0]), "mem_mhz": float(rec[2].split()[0]),
                             "watts": float(rec[3].split()[0]), "temp": float(rec[4]), "reasons": rec[5].strip()})
            except (ValueError, IndexError):
                continue
    return rows


def summarize(samples, smi, label: str) -> dict:
    """First replays, settled (last second) time, clocks and power over the settled window."""
    mine = [(t, us) for lab, t, us in samples if lab == label]
    if not mine:
        return {}
    t_last = mine[-1][0]
    settled = [us for t, us in mine if t >= t_last - 1.0]
    clocks = [r for r in smi if t_last - 1.0 <= r["t"] <= t_last]
    out = {"first_us": statistics.mean(us for _, us in mine[:5]), "settled_us": statistics.median(settled),
           "replays": len(mine)}
    if clocks:
        mhz = statistics.mean(r["sm_mhz"] for r in clocks)
        out |= {"sm_mhz": mhz, "watts": statistics.mean(r["watts"] for r in clocks),
                "temp": max(r["temp"] for r in clocks), "reasons": sorted({r["reasons"] for r in clocks}),
                "kcycles_per_call": out["settled_us"] * mhz / 1e3}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="B=8 H=16 S=2048 D=128,B=8 H=15 S=2112 D=128,B=8 H=16 S=2048 D=64")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--idle", type=float, default=1.5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    import jitops
    from jitops.bench.timing import capture_graph
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    os.makedirs(args.out, exist_ok=True)
    smi_path = os.path.join(args.out, "smi.csv")
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader", "-lms", "50"],
                           stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL)
    op, device = get_op("attention"), jitops.get_backend().device
    tdt = getattr(torch, args.dtype)
    phases, failures = [], 0
    try:
        for name in args.shapes.split(","):
            _, qs, kvs, causal = custom_shape(name.strip())
            specs = {"q": TensorSpec(qs, args.dtype), "k": TensorSpec(kvs, args.dtype),
                     "v": TensorSpec(kvs, args.dtype), "mask": None}
            pick = op.heuristic(op.make_problem(specs, {"causal": causal}), device)
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(s, device="cuda", dtype=tdt, generator=g) for s in (qs, kvs, kvs))
            ref = first_heads_reference(q, k, v, causal, args.dtype)
            err, ok = checked_error(q, k, v, causal, args.dtype, pick, ref)
            failures += not ok
            print(f"{name}: pick {pick}, error {err:.2e} ({'ok' if ok else 'FAILED'})", flush=True)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            graphs = {"pick": capture_graph(torch, lambda: jitops.attention(q, k, v, causal=causal, schedule=pick), 20),
                      "sdpa": capture_graph(torch, lambda: sdpa(q, k, v, is_causal=causal), 20)}
            for phase, which in (("pick alone", ["pick"]), ("sdpa alone", ["sdpa"]),
                                 ("interleaved", ["pick", "sdpa"]), ("sdpa alone, again", ["sdpa"]),
                                 ("pick alone, again", ["pick"])):
                time.sleep(args.idle)
                t0 = time.time()
                samples = run_phase({w: graphs[w] for w in which}, args.seconds)
                phases.append({"shape": name, "phase": phase, "t0": t0, "samples": samples})
            del graphs
    finally:
        time.sleep(0.3)
        smi.terminate()
        smi.wait()
    rows = read_smi(smi_path)
    report = []
    for ph in phases:
        for label in sorted({lab for lab, _, _ in ph["samples"]}):
            s = summarize(ph["samples"], rows, label)
            report.append({"shape": ph["shape"], "phase": ph["phase"], "label": label} | s)
            print(f"{ph['shape']:24} {ph['phase']:18} {label:5} first {s['first_us']:7.1f} us  settled "
                  f"{s['settled_us']:7.1f} us  {s.get('sm_mhz', 0):6.0f} MHz  {s.get('watts', 0):5.0f} W  "
                  f"{s.get('temp', 0):3.0f} C  {s.get('kcycles_per_call', 0):7.1f} kcycles  {s.get('reasons')}",
                  flush=True)
    with open(os.path.join(args.out, "clocks.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "report": report, "phases": phases, "smi": rows}, f)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
