"""A / B of the scheduler's fused_wgmma pick against the 2026-11-26 candidates (overlap=1 in the plain TMA
loop, the setmaxnreg producer with 128-key tiles) and SDPA on the same tensors, in alternating rounds
(graph replay, median of trials per round), fp16 and bf16; each schedule checked against float64 first.

    python3 scripts/device_fa3_ab.py [--rounds 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from device_attention import BIG128, _ov, _pr, op, problem_of, tensors  # noqa: E402
from jitops.bench.attention import sdpa_call, torch_reference  # noqa: E402
from jitops.bench.timing import Timer  # noqa: E402

SHAPES = [("B=8 H=16 S=2048 D=128", BIG128, BIG128, False)]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    timer = Timer(torch)
    dev = jitops.get_backend().device
    print(f"{dev.name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    rows = []
    for name, qs, kvs, causal in SHAPES:
        for dtype in ("float16", "bfloat16"):
            q, k, v = tensors(qs, kvs, dtype)
            p = problem_of(qs, kvs, dtype, causal)
            pick = op.heuristic(p, dev)
            scheds = {"pick": pick, "overlap128": _ov(128), "regs128": _pr(128)}
            ref = torch_reference(torch, q, k, v, causal)
            scale = float(ref.abs().max())
            out = torch.empty_like(q)
            ok = {}
            for label, s in scheds.items():
                out.fill_(float("nan"))
                jitops.attention(q, k, v, causal=causal, out=out, schedule=s)
                torch.cuda.synchronize()
                err = float((out.double() - ref).abs().max()) / scale
                ok[label] = bool(err <= op.tolerance(p, s)[0] and not torch.isnan(out).any())
            del ref
            sdpa = sdpa_call(torch, q, k, v, causal)
            times = {label: [] for label in [*scheds, "sdpa"]}
            for _ in range(args.rounds):
                for label, s in scheds.items():
                    times[label].append(timer.graph_us(
                        lambda s=s: jitops.attention(q, k, v, causal=causal, out=out, schedule=s), n=20))
                times["sdpa"].append(timer.graph_us(sdpa, n=20))
            row = {"problem": name, "dtype": dtype, "ok": ok, "times_us": times,
                   "schedules": {label: str(s) for label, s in scheds.items()}}
            rows.append(row)
            base = times["pick"]
            for label, t in times.items():
                gains = " ".join(f"{b / x:.3f}" for b, x in zip(base, t))
                print(f"{name} {dtype:<8} {label:<11} " + " ".join(f"{x:7.1f}" for x in t)
                      + f"  pick/this {gains}  {'ok' if ok.get(label, True) else 'WRONG'}", flush=True)
            torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fa3_ab.json"), "w") as f:
            json.dump({"device": dev.name, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
