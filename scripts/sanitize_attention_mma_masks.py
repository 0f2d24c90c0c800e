"""fused_mma (the pick off Hopper, here the A100's picks run on this GPU) with masks of whole rows
([B, 1, Sq, Sk]), at D = 64 (two keys per mask load) and D = 128 (single loads), each also on a mask view
one element off (the kernel falls back to single loads), checked against float64, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitize_attention_mma_masks.py
"""
import torch

import jitops
from jitops.device import KNOWN_TARGETS
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

op = get_op("attention")
for (b, h, sq, sk, d, hk) in ((2, 4, 200, 300, 64, 2), (1, 2, 130, 256, 128, 2)):
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.float16) for _ in range(2))
    base = torch.randn(b, 1, sq, sk, device="cuda", dtype=torch.float16)
    base[-1, ..., sk // 2:] = float("-inf")
    for offset in (0, 1):
        mask = base
        if offset:
            mask = torch.empty(base.numel() + offset, device="cuda", dtype=base.dtype)[offset:].view(base.shape)
            mask.copy_(base)
        spec = {n: TensorSpec(tuple(t.shape), "float16") for n, t in (("q", q), ("k", k), ("v", v), ("mask", mask))}
        problem = op.make_problem(spec, {})
        schedule = op.heuristic(problem, KNOWN_TARGETS["sm_80"])
        out = jitops.attention(q, k, v, mask, schedule=schedule)
        torch.cuda.synchronize()
        kk, vv = (t.repeat_interleave(h // hk, 1).double() for t in (k, v))
        ref = torch.softmax(q.double() @ kk.transpose(-1, -2) / d ** 0.5 + mask.double(), -1) @ vv
        err = (out.double() - ref).abs().max().item()
        print(f"D={d} {schedule} offset {offset}: max error {err:.1e}", flush=True)
        assert err < 2e-2, err
print("sanitize cases done")
