"""Attention decoding on a GPU: the scheduler's pick and any fused_mma schedules given against SDPA on
the same tensors (graph replay), each checked against float64 first, with the K / V bytes per
second; for Llama-3 B=16 also torch's own read-only reduction and copy over the same bytes (what
"memory-bound" can reach). The sweeps behind the decode rules of `attention_mma.decode_splits`.

    python3 scripts/device_decode_probe.py [--problem llama|llama_b1|llama_b2|llama_b4|falcon] [SCHEDULE ...]
    SCHEDULE: fused_mma parameters, e.g. warps=4,key_warps=4,block_k=64,splits=1,prefetch=256
    (pack=True and row_groups=1 are added); --once runs the pick and SDPA three times (for ncu).
"""
from __future__ import annotations

import argparse

import torch

import jitops
from jitops.bench.attention import sdpa_call, torch_reference
from jitops.bench.timing import Timer
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

PROBLEMS = {"llama": ((16, 32, 1, 128), (16, 8, 4096, 128)), "llama_b1": ((1, 32, 1, 128), (1, 8, 4096, 128)),
            "llama_b2": ((2, 32, 1, 128), (2, 8, 4096, 128)), "llama_b4": ((4, 32, 1, 128), (4, 8, 4096, 128)),
            "falcon": ((16, 71, 1, 64), (16, 1, 2048, 64))}


def parse(spec: str) -> Schedule:
    kw = {k: int(v) for k, v in (item.split("=") for item in spec.split(","))}
    return Schedule.make("fused_mma", pack=True, row_groups=1, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", choices=sorted(PROBLEMS), default="llama")
    ap.add_argument("--once", action="store_true")
    ap.add_argument("schedules", nargs="*")
    args = ap.parse_args()
    qs, ks = PROBLEMS[args.problem]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.float16, generator=g) for s in (qs, ks, ks))
    out = torch.empty_like(q)
    sdpa = sdpa_call(torch, q, k, v, False)
    if args.once:
        for _ in range(3):
            jitops.attention(q, k, v, out=out)
            sdpa()
        torch.cuda.synchronize()
        return
    op = get_op("attention")
    specs = {n: TensorSpec(tuple(t.shape), "float16") for n, t in (("q", q), ("k", k), ("v", v))}
    pick = op.heuristic(op.make_problem({**specs, "mask": None}, {"causal": False}), jitops.get_backend().device)
    timer = Timer(torch)
    ref = torch_reference(torch, q, k, v, False)
    kv_bytes = 2 * k.numel() * k.element_size()

    def show(name: str, us: float) -> None:
        print(f"{name:100} {us:8.1f} us  {kv_bytes / us * 1e-6:5.2f} TB/s", flush=True)

    for sched in [None] + [parse(s) for s in args.schedules]:
        out.fill_(float("nan"))
        jitops.attention(q, k, v, out=out, schedule=sched)
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        ok = err <= op.tolerance(op.make_problem({**specs, "mask": None}, {}), sched or pick)[0]
        label = f"{'pick ' if sched is None else ''}{sched or pick} err {err:.1e}{'' if ok else ' WRONG'}"
        show(label, timer.graph_us(lambda: jitops.attention(q, k, v, out=out, schedule=sched), n=20))
    show("SDPA", timer.graph_us(sdpa, n=20))
    if args.problem == "llama":
        kv = torch.cat([k.reshape(-1), v.reshape(-1)])
        show("torch.sum over K and V (read only)", timer.graph_us(lambda: kv.sum(dtype=torch.float32), n=20))
        dst = torch.empty_like(kv)
        show("copy of K and V (TB/s of the bytes read; twice that moved)", timer.graph_us(lambda: dst.copy_(kv), n=20))


if __name__ == "__main__":
    main()
