"""Time every leaky_relu candidate schedule on a few sizes (CUDA-graph replay) against torch.
Developer tool for choosing the heuristic; prints the best few per problem and the heuristic's rank."""
from __future__ import annotations

import sys

import torch

import jitops
from jitops.bench.timing import Timer
from jitops.engine import select_schedule
from jitops.ops import get_op
from jitops.ops.base import TensorSpec


def main(sizes: list[int]) -> None:
    op = get_op("leaky_relu")
    timer = Timer(torch)
    dev = jitops.get_backend().device
    for dtype in ("float32", "float16"):
        for n in sizes:
            x = torch.randn(n, device="cuda", dtype=getattr(torch, dtype))
            out = torch.empty_like(x)
            p = op.make_problem({"x": TensorSpec((n,), dtype)}, {"alpha": 0.01})
            results = []
            for s in op.candidates(p, dev):
                jitops.leaky_relu(x, 0.01, out=out, schedule=s)
                results.append((timer.graph_us(lambda: jitops.leaky_relu(x, 0.01, out=out, schedule=s), n=20), str(s)))
            torch_us = timer.graph_us(lambda: torch.nn.functional.leaky_relu(x, 0.01), n=20)
            h, _ = select_schedule(op, p, dev)
            h_us = timer.graph_us(lambda: jitops.leaky_relu(x, 0.01, out=out), n=20)
            results.sort()
            rank = next((i for i, (_, s) in enumerate(results) if s == str(h)), -1)
            print(f"\n{dtype} n={n}: torch {torch_us:.2f} us; heuristic {h} {h_us:.2f} us (rank {rank} of {len(results)})")
            for us, s in results[:6]:
                print(f"   {us:8.2f} us  {torch_us / us:5.2f}x  {s}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1 << 20, 1 << 22, 1 << 24, 1 << 28])
