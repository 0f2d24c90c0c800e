"""One attention call to profile with ncu: the scheduler's pick (or a forced schedule) on a model
shape, a few warm-up calls first so ncu can skip them.

    ncu --kernel-name regex:attention --launch-skip 3 --launch-count 1 --set full \\
        python3 scripts/profile_attention.py --shape 8x16x2048x64 [--causal] [--schedule fused_wgmma:groups=2,block_k=128]
"""
from __future__ import annotations

import argparse

import torch

import jitops
from jitops.ops.base import Schedule, parse_value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="8x16x2048x64", help="B x H x S x D (q, k and v alike)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--schedule", help="ALGORITHM[:name=value,...], e.g. fused_wgmma:groups=2,block_k=128")
    args = ap.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    q, k, v = (torch.randn(shape, device="cuda", dtype=getattr(torch, args.dtype)) for _ in range(3))
    sched = None
    if args.schedule:
        algorithm, _, params = args.schedule.partition(":")
        sched = Schedule.make(algorithm, **{n: parse_value(v) for n, v in
                                            (item.split("=") for item in params.split(",") if item)})
    for _ in range(4):
        out = jitops.attention(q, k, v, causal=args.causal, schedule=sched)
    torch.cuda.synchronize()
    print(out.shape, sched or "heuristic")


if __name__ == "__main__":
    main()
