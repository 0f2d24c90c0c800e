"""ncu driver for the one-launch channels_last group_norm: each listed schedule once, after a
warm-up, between cudaProfilerStart / Stop (run under `ncu --profile-from-start off`).

    ncu --profile-from-start off --set full python3 scripts/profile_group_norm_onchip.py
"""
from __future__ import annotations

import torch

import jitops
from jitops.ops import get_op, group_norm_nhwc
from jitops.ops.base import TensorSpec

CASES = [((8, 320, 64, 64), dict(threads=1024, rows=21, pixels_per_block=4096, slice_groups=1, vec=2)),
         ((2, 320, 64, 64), dict(threads=512, rows=6, pixels_per_block=306, slice_groups=8, vec=8)),
         ((2, 1280, 8, 8), dict(threads=256, rows=2, pixels_per_block=64, slice_groups=1, vec=8))]


def main() -> None:
    dev = jitops.get_backend().device
    for shape, params in CASES:
        c = shape[1]
        x = torch.randn(shape, device="cuda").half().contiguous(memory_format=torch.channels_last)
        g, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        p = TensorSpec((c,), "float32")
        prob = get_op("group_norm").make_problem({"x": TensorSpec(shape, "float16", "nhwc"), "gamma": p, "beta": p},
                                                 {"num_groups": 32})
        s = group_norm_nhwc.heuristic(prob, dev, "onchip", **params)
        for _ in range(3):
            jitops.group_norm(x, 32, g, b, schedule=s)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        jitops.group_norm(x, 32, g, b, schedule=s)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(shape, s, flush=True)


if __name__ == "__main__":
    main()
