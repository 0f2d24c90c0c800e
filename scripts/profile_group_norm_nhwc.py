"""Where a channels_last group_norm call's time goes on a GPU (issue 18: a ~9 us floor per call
on 0.3-5 MB SD-UNet tensors, where a copy of the same tensor takes 1.5-3 us).

    python3 scripts/profile_group_norm_nhwc.py            # every GPU activity of one call, per path
    ncu --profile-from-start off ... python3 scripts/profile_group_norm_nhwc.py --ncu   # one call of each

Lists, for each path (the heuristic, the two launches, naive, torch, a same-size copy), the
kernels, copies and memsets that one call runs (torch.profiler, CUDA activities) with their
durations, and the CUDA-graph replay time of the call, so a per-call cost that is not the
kernel itself shows up by name.
"""
from __future__ import annotations

import argparse
import sys

import torch

import jitops
from jitops.bench.timing import Timer
from jitops.ops import get_op, group_norm_nhwc
from jitops.ops.base import TensorSpec

F = torch.nn.functional
CL = torch.channels_last
SHAPES = [(2, 1280, 8, 8), (2, 640, 16, 16), (2, 320, 64, 64)]


def paths(shape, dtype=torch.float16):
    c = shape[1]
    x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=CL)
    g, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
    p = TensorSpec((c,), "float32")
    prob = get_op("group_norm").make_problem({"x": TensorSpec(shape, str(dtype).split(".")[1], "nhwc"), "gamma": p,
                                              "beta": p}, {"num_groups": 32})
    dev = jitops.get_backend().device
    o = torch.empty_like(x)
    out = {"heuristic": lambda: jitops.group_norm(x, 32, g, b)}
    for alg in ("nhwc", "naive", "onchip"):
        try:
            s = group_norm_nhwc.heuristic(prob, dev, alg)
        except Exception as exc:  # noqa: BLE001 - a path that does not fit is reported, not fatal
            print(f"  {alg}: {exc}")
            continue
        out[alg] = lambda s=s: jitops.group_norm(x, 32, g, b, schedule=s)
    out["torch"] = lambda: F.group_norm(x, 32, g.to(dtype), b.to(dtype))
    out["torch_nchw"] = (lambda xc=x.contiguous(), gd=g.to(dtype), bd=b.to(dtype): F.group_norm(xc, 32, gd, bd))
    out["copy"] = lambda: o.copy_(x)
    return out


def activities(fn) -> list[tuple[str, float]]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(e.name, []).append(e.device_time)
    return [(name, sum(v) / 5, len(v) / 5) for name, v in rows.items()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", action="store_true", help="one call of each path between profiler start/stop")
    args = ap.parse_args()
    timer = Timer(torch)
    for shape in SHAPES:
        print(f"== {shape} float16 channels_last", flush=True)
        for name, fn in paths(shape).items():
            if args.ncu:
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                continue
            us = timer.graph_us(fn, n=20)
            print(f"  {name:11s} graph {us:7.2f} us per call", flush=True)
            try:
                acts = activities(fn)
            except Exception as exc:  # noqa: BLE001 - no CUPTI: the replay time still stands
                print(f"      profiler failed: {exc}")
                acts = []
            for act, t, per in acts:
                print(f"      {per:4.1f}x {t:7.2f} us  {act[:110]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
