"""Eager calls on channels_last torch tensors against torch on the same tensors (issue 19's per-call
cost for the memory format the fp16 CNN path uses): host time per call of 2000 back-to-back calls,
best of 5, the two taking turns; each jitops result checked against torch first.

    python3 scripts/device_channels_last_eager.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import jitops
from jitops.bench.timing import Timer

CL = torch.channels_last


def cases() -> dict:
    dev, h = "cuda", torch.float16
    x = torch.randn(2, 320, 32, 32, device=dev, dtype=h).to(memory_format=CL)
    g, b = torch.randn(320, device=dev), torch.randn(320, device=dev)
    mean, var = torch.randn(320, device=dev), torch.rand(320, device=dev) + 0.5
    xc = torch.randn(1, 64, 56, 56, device=dev, dtype=h).to(memory_format=CL)
    w = (torch.randn(64, 64, 3, 3, device=dev, dtype=h) * 0.05).contiguous()
    wcl = w.to(memory_format=CL)
    bias = torch.randn(64, device=dev, dtype=h)
    return {
        "leaky_relu 2x320x32x32 fp16": (lambda: jitops.leaky_relu(x, 0.1), lambda: F.leaky_relu(x, 0.1)),
        "group_norm 2x320x32x32 g32 fp16": (lambda: jitops.group_norm(x, 32, g, b),
                                            lambda: F.group_norm(x, 32, g.half(), b.half())),
        "batch_norm 2x320x32x32 fp16": (lambda: jitops.batch_norm(x, mean, var, g, b),
                                        lambda: F.batch_norm(x, mean, var, g, b, False)),
        "conv2d 1x64x56x56 3x3 fp16": (lambda: jitops.conv2d(xc, w, bias, padding=1),
                                       lambda: F.conv2d(xc, w, bias, padding=1)),
        "conv2d, channels_last weights": (lambda: jitops.conv2d(xc, wcl, bias, padding=1),
                                          lambda: F.conv2d(xc, wcl, bias, padding=1)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    timer, rows = Timer(torch), []
    for name, (ours, theirs) in cases().items():
        y, want = ours(), theirs()
        err = float((y.float() - want.float()).abs().max() / want.float().abs().max())
        t = timer.eager_us({"jitops": ours, "torch": theirs})
        rows.append({"case": name, "rel_err": err, "jitops_us": round(t["jitops"], 2), "torch_us": round(t["torch"], 2),
                     "torch_over_jitops": round(t["torch"] / t["jitops"], 2),
                     "out_channels_last": bool(y.is_contiguous(memory_format=CL))})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
