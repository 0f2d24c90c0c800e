"""Small cases of fused_wgmma's one-warpgroup plain loop, for compute-sanitizer (memcheck, racecheck,
synccheck): 128- and 64-key tiles, a partial last query tile, causal with per-warp release, GQA; the
short-prefill pick (64-key tiles, bounded step: ViT's 197 tokens); the small-grid picks (128-key tiles
with the bounded step up to DP = 64, D = 256 on a released ring); trimmed last tiles (trim=1, CLIP's 257; 77 keys of cross-attention);
blocks walking several query tiles over one key tile (q_walk); padding masks (key_mask); masks of whole rows
(row_mask).

    compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize_attention_one_wg.py
"""
import torch

import jitops
from jitops.ops.base import Schedule

for d, bk, extra in ((64, 128, {}), (64, 128, {"release": 1}), (128, 64, {}), (64, 64, {"bounded": 1}),
                     (64, 128, {"bounded": 1}), (256, 64, {"release": 1})):
    q = torch.randn(1, 4, 90, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, 300, d, device="cuda", dtype=torch.float16) for _ in range(2))
    for causal in (False, True):
        out = jitops.attention(q, k, v, causal=causal, schedule=Schedule.make("fused_wgmma", groups=1, block_k=bk,
                                                                              tma=1, **extra))
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
for d, g, bk in ((64, 1, 64), (64, 1, 128), (128, 2, 64)):        # trim=1: the last tile at its own width
    q = torch.randn(1, 4, 197, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, 197, d, device="cuda", dtype=torch.float16) for _ in range(2))
    out = jitops.attention(q, k, v, schedule=Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, bounded=1, trim=1))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
x = torch.randn(1, 12, 197, 64, device="cuda", dtype=torch.float16)   # ViT-B/16 b1: the scheduler's pick
assert torch.isfinite(jitops.attention(x, x, x)).all()
for g in (1, 2):                     # CLIP's 257 tokens: 128-key tiles, the last one of 1 key run at 16
    x = torch.randn(1, 4, 257, 64, device="cuda", dtype=torch.float16)
    out = jitops.attention(x, x, x, schedule=Schedule.make("fused_wgmma", groups=g, block_k=128, tma=1, bounded=1, trim=1))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
for d in (64, 160):                  # cross-attention over 77 keys: the scheduler's pick, one 128-key tile trimmed to 80
    q = torch.randn(1, 4, 300, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 4, 77, d, device="cuda", dtype=torch.float16) for _ in range(2))
    out = jitops.attention(q, k, v)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
for d in (64, 128):                  # 64 queries over 1030 keys (Whisper's decoder over its encoder): the pick
    q = torch.randn(1, 2, 100, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, 1030, d, device="cuda", dtype=torch.float16) for _ in range(2))
    out = jitops.attention(q, k, v)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
for g, sk, extra in ((1, 77, {"trim": 1}), (1, 128, {}), (2, 77, {"trim": 1})):   # q_walk: query tiles over one key tile
    q = torch.randn(1, 4, 500, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 2, sk, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    out = jitops.attention(q, k, v, schedule=Schedule.make("fused_wgmma", groups=g, block_k=128, tma=1, stages=1,
                                                           q_walk=3, **extra))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
for g, bk, sk, bounded in ((2, 64, 300, 0), (1, 128, 100, 0), (2, 64, 300, 1), (2, 128, 300, 1)):   # padding masks
    q = torch.randn(2, 4, 200, 64, device="cuda", dtype=torch.float16)          # ([B, 1, 1, Sk]: key_mask loads)
    k, v = (torch.randn(2, 2, sk, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    mask = torch.zeros(2, 1, 1, sk, device="cuda", dtype=torch.float16)
    mask[1, ..., sk // 2:] = float("-inf")
    if sk > 200:
        mask[0, ..., 200] = 30.0                   # past the first tile: the bounded step runs S again
    extra = {"stages": 1, "q_walk": 2, "trim": 1} if sk <= bk else {"bounded": 1, "release": 1} if bounded else {}
    out = jitops.attention(q, k, v, mask, schedule=Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, **extra))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
for bk, bounded, offset in ((64, 0, 0), (64, 1, 0), (128, 1, 0), (64, 1, 1)):   # masks of whole rows ([B, 1, Sq, Sk]:
    q = torch.randn(2, 4, 200, 64, device="cuda", dtype=torch.float16)            # row_mask; offset 1: single loads)
    k, v = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    mask = torch.randn(2, 1, 200, 300, device="cuda", dtype=torch.float16)
    mask[1, ..., 150:] = float("-inf")
    mask[0, 0, 5, 250] = 30.0
    if offset:
        mask = torch.empty(mask.numel() + offset, device="cuda", dtype=mask.dtype)[offset:].view(mask.shape).copy_(mask)
    out = jitops.attention(q, k, v, mask, schedule=Schedule.make("fused_wgmma", groups=2, block_k=bk, tma=1,
                                                                 **({"bounded": 1} if bounded else {})))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
print("sanitize cases done")
