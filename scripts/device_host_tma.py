"""Eager host cost of calls whose kernels take TMA tensor maps (the sm_90 attention prefill picks and
the channels_last conv2d TMA picks), against torch on the same tensors: whether the repeat call runs
in the native RepeatCall, its error against float64, and the wall time per call of back-to-back eager
calls (synchronized at the end; best of 5 trials of 2000 calls). Run it in two source trees to compare
a change: `PYTHONPATH=TREE python3 TREE/scripts/device_host_tma.py --out FILE`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="host_tma.json")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import jitops
    from jitops import engine
    from jitops.bench.timing import Timer
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, dtype=torch.float16):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    cases = {}
    q, k, v = (rand(1, 8, 256, 64) for _ in range(3))
    cases["attention 1x8x256x64 fp16"] = ("attention", lambda: jitops.attention(q, k, v),
                                          lambda: F.scaled_dot_product_attention(q, k, v),
                                          lambda: F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
    q2, k2, v2 = (rand(2, 12, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    cases["attention 2x12x512x64 bf16 causal"] = (
        "attention", lambda: jitops.attention(q2, k2, v2, causal=True),
        lambda: F.scaled_dot_product_attention(q2, k2, v2, is_causal=True),
        lambda: F.scaled_dot_product_attention(q2.double(), k2.double(), v2.double(), is_causal=True))
    x = rand(4, 256, 16, 16).to(memory_format=torch.channels_last)
    w = (rand(256, 256, 3, 3) * 0.05).to(memory_format=torch.channels_last)
    cases["conv2d 4x256x16x16 3x3 fp16 channels_last"] = (
        "conv2d", lambda: jitops.conv2d(x, w, padding=1), lambda: F.conv2d(x, w, padding=1),
        lambda: F.conv2d(x.double(), w.double(), padding=1))
    rows = []
    timer = Timer(torch)
    for name, (op, ours, theirs, ref) in cases.items():
        got = ours()
        torch.cuda.synchronize()
        want = ref()
        err = float((got.double() - want).abs().max() / want.abs().max())
        natives = [b.native is not None for key, b in engine._cache.bound.items() if key[0] == op and b is not None]
        us = timer.eager_us({"jitops": ours, "torch": theirs}, calls=2000, trials=5)
        rows.append({"case": name, "rel_err": err, "native": any(natives), "eager_us": us})
        print(f"{name:42s} native={any(natives)!s:5s} err={err:.1e} jitops {us['jitops']:6.1f} us  "
              f"torch {us['torch']:6.1f} us", flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "jitops": jitops.__file__, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
