"""Compile the scheduler's candidates for random conv2d / attention problems offline (NVRTC, no GPU).

Why: the tuner times any candidate the scheduler offers, and a user may pin one; a candidate that does not
compile is a bug the device fuzzer (scripts/fuzz_ops.py --candidates) meets only by chance. This draws the
fuzzer's problems, takes every candidate of each (or a random sample) and compiles it for a target
(sm_90: the wgmma / TMA kernels, sm_80: the mma.sync ones), reporting each failure with its schedule.

    python3 scripts/compile_candidates_offline.py [--ops conv2d,attention] [--problems 40] [--per-problem 0 (all)]
                                                  [--target sm_90] [--seed 0] [--jobs 2]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import fuzz_ops  # noqa: E402


def specs_of(case: dict) -> tuple[str, dict, dict]:
    """(op, input specs, attributes) of a fuzz case, without arrays."""
    from jitops.ops.base import TensorSpec
    dt = case["dtype"]
    if case["op"] == "conv2d":
        c = case
        oh = (c["h"] + c["padding"][0] + c["padding"][2] - c["dilation"] * (c["kh"] - 1) - 1) // c["stride"] + 1
        ow = (c["w"] + c["padding"][1] + c["padding"][3] - c["dilation"] * (c["kw"] - 1) - 1) // c["stride"] + 1
        lay = "nhwc" if c["channels_last"] and c["cin"] > 1 and c["h"] * c["w"] > 1 else ""
        specs = {"x": TensorSpec((c["n"], c["cin"], c["h"], c["w"]), dt, lay),
                 "w": TensorSpec((c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]), dt),
                 "bias": TensorSpec((c["cout"],), dt) if c["bias"] else None,
                 "residual": TensorSpec((c["n"], c["cout"], oh, ow), dt, lay) if c["residual"] else None}
        attrs = {"stride": c["stride"], "padding": tuple(c["padding"]), "dilation": c["dilation"],
                 "groups": c["groups"], "activation": c["activation"], "alpha": 0.01, "precision": c["precision"]}
        return "conv2d", specs, attrs
    c = case
    lay = "bshd" if c["layout"] in ("bshd", "packed") else ""
    q, kv = (c["b"], c["h"], c["sq"], c["d"]), (c["b"], c["hk"], c["sk"], c["d"])
    mdt = dt if c["mask_dtype"] == "same" else "float32"
    mask = {"padding": (c["b"], 1, 1, c["sk"]), "full": (c["b"], c["h"], c["sq"], c["sk"]),
            "heads": (1, c["h"], c["sq"], c["sk"])}.get(c["mask"])
    specs = {"q": TensorSpec(q, dt, lay), "k": TensorSpec(kv, dt, lay), "v": TensorSpec(kv, dt, lay),
             "mask": TensorSpec(mask, mdt) if mask else None}
    return "attention", specs, {"causal": c["causal"], "scale": c["scale"], "precision": c["precision"]}


def compile_one(job: tuple) -> tuple[str, str, str | None]:
    """(problem, schedule, None or the compiler's message)."""
    from jitops import engine
    from jitops.errors import CompileError
    from jitops.ops import get_op
    from jitops.ops.base import Schedule
    from jitops.runtime import get_backend
    target, op_name, specs, attrs, sched = job
    backend = get_backend(target=target)
    problem = get_op(op_name).make_problem(specs, attrs)
    schedule = Schedule.make(sched["algorithm"], **sched["params"])
    try:
        engine.compile_problem(op_name, problem, backend, schedule)
        return str(problem.key()), str(schedule), None
    except CompileError as exc:
        return str(problem.key()), str(schedule), str(exc)[:1500]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="conv2d,attention")
    ap.add_argument("--problems", type=int, default=40, help="problems per op")
    ap.add_argument("--per-problem", type=int, default=0, help="candidates per problem (0: all)")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gflop", type=float, default=4.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from jitops.errors import ArgumentError, ScheduleError
    from jitops.ops import get_op
    from jitops.runtime import get_backend
    device = get_backend(target=args.target).device
    jobs, seen = [], set()
    for op_name in args.ops.split(","):
        rng = random.Random(f"{args.seed}-{op_name}-offline")
        made = 0
        while made < args.problems:
            case = fuzz_ops.DRAW[op_name](rng, True, args.max_gflop)
            name, specs, attrs = specs_of(case)
            try:
                problem = get_op(name).make_problem(specs, attrs)
                cands = get_op(name).candidates(problem, device)
            except (ArgumentError, ScheduleError, ValueError):
                continue
            made += 1
            if args.per_problem:
                cands = rng.sample(cands, min(args.per_problem, len(cands)))
            for s in cands:
                key = (str(problem.key()), str(s))
                if key not in seen:
                    seen.add(key)
                    jobs.append((args.target, name, specs, attrs, s.as_dict()))
    print(f"{len(jobs)} kernels to compile for {args.target}", flush=True)
    t0, failures = time.time(), []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, (problem, schedule, error) in enumerate(pool.map(compile_one, jobs, chunksize=4)):
            if error:
                failures.append((problem, schedule, error))
                print(f"FAILED {problem} {schedule}\n  {error.splitlines()[1] if len(error.splitlines()) > 1 else error}",
                      flush=True)
            if (i + 1) % 100 == 0:
                print(f"{i + 1}/{len(jobs)} ({time.time() - t0:.0f} s, {len(failures)} failed)", flush=True)
    print(f"{len(failures)} of {len(jobs)} candidates failed to compile for {args.target} ({time.time() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
