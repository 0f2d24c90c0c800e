"""Probe: which part of the overlap variant of fused_wgmma costs time (consumer loop, copy warps,
barrier-tracked copies). B=8 H=16 S=2048 D=64 fp16, graph replay, checked against float64."""
import torch
import jitops
from jitops.bench.attention import torch_reference
from jitops.bench.timing import Timer
from jitops.ops.base import Schedule

timer = Timer(torch)
g = torch.Generator(device="cuda").manual_seed(0)
shape = (8, 16, 2048, 64)
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
ref = torch_reference(torch, q, k, v, False)
out = torch.empty_like(q)
def S(groups, bk, ring, o=0, w=4, a=0, rows=0, pp=0):
    return Schedule.make("fused_wgmma", groups=groups, block_k=bk, stages=ring, producer=1, overlap=o,
                         copy_warps=w, async_full=a, copy_rows=rows, pingpong=pp)


cases = [S(2, 128, 3), S(3, 64, 4), S(2, 128, 3, 0, 4, 1),
         S(2, 128, 3, 1, 4, 1, 0, 1), S(2, 128, 4, 1, 4, 1, 0, 1), S(2, 96, 3, 1, 4, 1, 0, 1),
         S(2, 64, 3, 1, 4, 1, 0, 1), S(3, 64, 4, 1, 4, 1, 0, 1), S(3, 64, 3, 1, 4, 1, 0, 1)]
for s in cases:
    out.fill_(float("nan"))
    jitops.attention(q, k, v, out=out, schedule=s)
    torch.cuda.synchronize()
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    us = timer.graph_us(lambda: jitops.attention(q, k, v, out=out, schedule=s), n=10)
    print(f"{us:8.1f} us  err {err:.1e}  {s}", flush=True)
