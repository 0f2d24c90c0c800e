"""Small cases of fused_tf32 (fp32 attention, TF32 products) for compute-sanitizer (memcheck,
racecheck, synccheck): tile shapes (4 / 8 warps x 32 / 64 keys, one or two row groups per warp), padded D (40 -> 48, 72 -> 80),
D = 256, both causal diagonals, a full mask and a padding mask, GQA, a partial last query and key
tile, [B, S, H, D] views, and inputs off 16-byte alignment (plain loads). Each output is checked
against float64 too.

    compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize_attention_tf32.py [--wgmma]

On sm_90 the wgmma form (wgmma=1: 1-3 consumer warpgroups, 32-128-key tiles, rings of 2-4, D = 20 /
42 / 64 / 72) runs too; --wgmma runs only its cases.
"""
import sys

import torch

import jitops
from jitops.ops.attention_problem import TF32_TOLERANCE
from jitops.ops.base import Schedule


def reference(q, k, v, mask, causal):
    qd, kd, vd = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], 1), \
        v.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5
    if mask is not None:
        s = s + mask.double()
    if causal:
        sq, sk = s.shape[-2:]
        off = sk - sq if causal == "bottom_right" else 0
        s = s.masked_fill(torch.arange(sk, device="cuda")[None] > torch.arange(sq, device="cuda")[:, None] + off,
                          float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ vd


def check(q, k, v, mask=None, causal=False, schedule=None):
    if q.is_contiguous():                                      # NaN-filled: every element must be written
        out = torch.full(q.shape, float("nan"), device="cuda")
        jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule, precision="tf32")
    else:
        out = jitops.attention(q, k, v, mask, causal=causal, schedule=schedule, precision="tf32")
    torch.cuda.synchronize()
    ref = reference(q, k, v, mask, causal)
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err <= TF32_TOLERANCE, (q.shape, k.shape, causal, schedule, err)


ONLY_WGMMA = "--wgmma" in sys.argv                             # the wgmma form's cases alone
flat = torch.randn(1 + 2 * 4 * 50 * 64, device="cuda")          # off 16-byte alignment: plain loads
u = flat[1:].view(2, 4, 50, 64)
if not ONLY_WGMMA:
    for w, bk, g in ((4, 32, 1), (4, 64, 1), (8, 32, 1), (8, 64, 1), (4, 32, 2), (8, 32, 2)):
        for d in (40, 64, 72):
            q = torch.randn(1, 4, 150, d, device="cuda")
            k, v = (torch.randn(1, 2, 130, d, device="cuda") for _ in range(2))
            for causal in (False, "top_left", "bottom_right"):
                check(q, k, v, causal=causal, schedule=Schedule.make("fused_tf32", warps=w, block_k=bk, row_groups=g))
    q = torch.randn(1, 2, 100, 256, device="cuda")
    k, v = (torch.randn(1, 2, 90, 256, device="cuda") for _ in range(2))
    check(q, k, v, causal=True)
    q = torch.randn(2, 4, 77, 64, device="cuda")
    k, v = (torch.randn(2, 4, 100, 64, device="cuda") for _ in range(2))
    check(q, k, v, mask=torch.randn(77, 100, device="cuda"))
    padding = torch.zeros(2, 1, 1, 100, device="cuda")
    padding[1, ..., 60:] = float("-inf")
    check(q, k, v, mask=padding)
    x = torch.randn(2, 70, 4, 128, device="cuda")                  # [B, S, H, D] storage read in place
    check(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2), causal=True)
    check(u, u, u)
if jitops.get_backend().device.hopper:                           # the wgmma form (sm_90a)
    for g, bk, st in ((1, 32, 2), (2, 64, 2), (3, 32, 3), (2, 32, 4), (1, 64, 3)):
        sched = Schedule.make("fused_tf32", wgmma=1, groups=g, block_k=bk, stages=st)
        for d in (20, 42, 64, 72):
            q = torch.randn(1, 4, 150, d, device="cuda")
            k, v = (torch.randn(1, 2, 130, d, device="cuda") for _ in range(2))
            for causal in (False, "top_left", "bottom_right"):
                check(q, k, v, causal=causal, schedule=sched)
        check(q, k, v, mask=torch.randn(150, 130, device="cuda"), schedule=sched)
        x = torch.randn(2, 70, 4, 64, device="cuda")
        check(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2), causal=True, schedule=sched)
        check(u, u, u, schedule=sched)
print("sanitize_attention_tf32: ok")
