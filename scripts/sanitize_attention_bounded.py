"""Small cases of fused_wgmma's bounded softmax step (bounded=1: no running max while probabilities
stay bounded) for compute-sanitizer: 2 warpgroups at D = 64 (released ring) and D = 128, 4 warpgroups
at D = 72, 3 warpgroups of 128-key tiles at D = 128, 4 warpgroups of 128-key tiles at D = 40; keys whose scores jump far past the running max at key 448 (the warpgroup must run S
again), with and without causal masking.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_attention_bounded.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    import torch

    import jitops
    from jitops.ops.base import Schedule
    torch.manual_seed(0)
    cases = ((64, Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1, release=1, bounded=1)),
             (128, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1, bounded=1)),
             (72, Schedule.make("fused_wgmma", groups=4, block_k=64, tma=1, stages=3, release=1, bounded=1)),
             (128, Schedule.make("fused_wgmma", groups=3, block_k=128, tma=1, release=1, bounded=1)),
             (40, Schedule.make("fused_wgmma", groups=4, block_k=128, tma=1, stages=3, release=1, bounded=1)))
    for d, sched in cases:
        q = torch.randn(1, 2, 200, d, device="cuda", dtype=torch.float16)
        k = torch.randn(1, 2, 700, d, device="cuda")
        k[:, :, 448:] *= 48
        k = k.half()
        v = torch.randn(1, 2, 700, d, device="cuda", dtype=torch.float16)
        for causal in (False, True):
            out = jitops.attention(q, k, v, causal=causal, schedule=sched)
            torch.cuda.synchronize()
            print(f"D={d} causal={causal} {sched}: finite={bool(torch.isfinite(out).all())}")


if __name__ == "__main__":
    main()
