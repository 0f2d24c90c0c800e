"""Time every leaky_relu candidate schedule on a few sizes against torch, on a GPU: developer tool
for choosing the heuristic. The measurement is the tuner's (jitops.tuning.sweep.measure_schedules:
each schedule checked against float64, then timed per call behind an L2 flush, interleaved); torch
is timed the same way (jitops.tuning.vendor). Prints the best few per problem and the heuristic's rank.

  python3 scripts/sweep_leaky_relu.py [N ...]
"""
from __future__ import annotations

import sys

import jitops
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.prepared import select_schedule
from jitops.tuning.sweep import measure_schedules
from jitops.tuning.vendor import vendor_us


def main(sizes: list[int]) -> None:
    op = get_op("leaky_relu")
    backend = jitops.get_backend()
    for dtype in ("float32", "float16", "bfloat16"):
        for n in sizes:
            p = op.make_problem({"x": TensorSpec((n,), dtype)}, {"alpha": 0.01})
            h, _ = select_schedule(op, p, backend.device)
            timed = [m for m in measure_schedules(op, p, op.candidates(p, backend.device), backend)
                     if m.time_us is not None]
            timed.sort(key=lambda m: m.time_us)
            torch_us = vendor_us("leaky_relu", p, backend) or float("nan")
            rank = next((i for i, m in enumerate(timed) if str(m.schedule) == str(h)), -1)
            print(f"\n{dtype} n={n}: torch {torch_us:.2f} us; heuristic {h} (rank {rank} of {len(timed)})")
            for m in timed[:6]:
                print(f"   {m.time_us:8.2f} us  {torch_us / m.time_us:5.2f}x  {m.schedule}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 24])
