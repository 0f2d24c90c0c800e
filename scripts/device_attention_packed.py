"""Attention on q / k / v sliced out of one packed projection, read in place, on a GPU, one command.

Models hand SDPA column slices of one [B, S, (H + 2 Hk) D] projection ([B, S, H, D] storage with rows
P = (H + 2 Hk) D elements apart): timm's ViT / DeiT (`qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
.unbind(0)`), GPT-2 (`c_attn(x).split(E, 2)`, `.view(B, S, H, D).transpose(1, 2)`) and fused-qkv models
with grouped-query attention. For each model shape, fp16 and bf16, jitops on the packed views is checked
against float64 (into a NaN-poisoned output), then timed (CUDA-graph replay, and eager back-to-back
calls taking turns) four ways on the same data:

  jitops packed    jitops.attention on the packed views (in place)
  jitops dense     jitops.attention on dense [B, S, H, D] views of the same shapes (rows H * D apart)
  via copies       .contiguous() of q, k, v + jitops + the output transposed back to [B, S, H, D]:
                   what users paid before (jitops refused the views)
  SDPA packed      torch SDPA on the same packed views

    python3 scripts/device_attention_packed.py OUT            # checks, timings: OUT/attention_packed.json.gz, .md
    python3 scripts/device_attention_packed.py OUT --sanitize # compute-sanitizer memcheck + racecheck over one
                                                              # small packed case per kernel family
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time

import torch

import jitops
from jitops import arrays, engine
from jitops.bench.attention import torch_reference
from jitops.bench.timing import Timer
from jitops.ops import get_op
from jitops.ops.base import Schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_attention_layout import heads_inner, pick, sanitize, sdpa_on, via_copies  # noqa: E402

op = get_op("attention")
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}
# name, B, S, H, Hk, D, causal
MODELS = [("ViT-B/16 b8 S=197", 8, 197, 12, 12, 64, False),
          ("CLIP ViT-L/14 b8 S=257", 8, 257, 16, 16, 64, False),
          ("DeiT-S b32 S=197", 32, 197, 6, 6, 64, False),
          ("GPT-2 b4 S=1024 causal", 4, 1024, 12, 12, 64, True),
          ("Phi-3-mini b1 S=2048 causal", 1, 2048, 32, 32, 96, True),
          ("fused-qkv GQA H=32 Hk=8 b1 S=2048 causal", 1, 2048, 32, 8, 128, True)]


def packed_views(b, s, h, hk, d, dtype, extra=0, offset=0):
    """q, k, v: column slices of one [B, S, (H + 2 Hk) D + extra] projection, `offset` elements into its memory."""
    pitch = (h + 2 * hk) * d + extra
    rows = torch.randn(b * s * pitch + offset, device="cuda", dtype=dtype)[offset:].view(b, s, pitch)
    cuts, heads = (0, h * d, (h + hk) * d, (h + 2 * hk) * d), (h, hk, hk)
    return tuple(rows[..., lo:hi].unflatten(2, (n, d)).transpose(1, 2) for lo, hi, n in zip(cuts, cuts[1:], heads))


def poisoned_out(q):
    """A NaN-filled output as attention writes it for a [B, S, H, D] q: dense [B, Sq, H, D], viewed [B, H, Sq, D]."""
    b, h, s, d = q.shape
    return torch.full((b, s, h, d), float("nan"), dtype=q.dtype, device=q.device).transpose(1, 2)


def error(q, k, v, causal, schedule=None, **kw) -> float:
    """jitops on these views against float64, into a NaN-poisoned output; max |error| / max |reference|."""
    out = poisoned_out(q)
    jitops.attention(q, k, v, causal=causal, out=out, schedule=schedule, **kw)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), f"{schedule}: unwritten output elements"
    ref = torch_reference(torch, q, k, v, causal)
    return float((out.double() - ref).abs().max() / ref.abs().max())


def native_repeat(q) -> bool:
    """Whether the plan bound for q's signature repeats through the native RepeatCall."""
    fmt = arrays.memory_format(q)
    return any(b is not None and b.native is not None for key, b in engine._cache.bound.items()
               if key[0] == "attention" and any(isinstance(e, tuple) and fmt in e for e in key))


def one(timer, name, b, s, h, hk, d, causal, dtype):
    q, k, v = packed_views(b, s, h, hk, d, dtype)
    dq, dk, dv = heads_inner((b, h, s, d), dtype), heads_inner((b, hk, s, d), dtype), heads_inner((b, hk, s, d), dtype)
    err = error(q, k, v, causal)
    assert err <= TOL[dtype], (name, err)
    fns = {"jitops packed": lambda: jitops.attention(q, k, v, causal=causal),
           "jitops dense": lambda: jitops.attention(dq, dk, dv, causal=causal),
           "via copies": lambda: via_copies(q, k, v, causal),
           "SDPA packed": lambda: sdpa_on(q, k, v, causal)}
    graph = {n: timer.graph_us(f) for n, f in fns.items()}
    eager = timer.eager_us({n: fns[n] for n in ("jitops packed", "via copies", "SDPA packed")}, calls=500)
    row = {"name": name, "dtype": str(dtype).split(".")[-1], "b": b, "s": s, "h": h, "hk": hk, "d": d,
           "causal": causal, "pitch": (h + 2 * hk) * d, "pick": str(pick(q, k, v, causal)),
           "native_repeat": native_repeat(q), "err": err, "graph_us": graph, "eager_us": eager}
    print(f"{name:42s} {row['dtype']:8s} packed {graph['jitops packed']:8.1f}  dense {graph['jitops dense']:8.1f}  "
          f"copies {graph['via copies']:8.1f}  SDPA {graph['SDPA packed']:8.1f}  "
          f"packed/SDPA {graph['SDPA packed'] / graph['jitops packed']:.2f}x  err {err:.1e}  eager packed / copies / "
          f"SDPA {eager['jitops packed']:.1f} / {eager['via copies']:.1f} / {eager['SDPA packed']:.1f}  "
          f"native {row['native_repeat']}", flush=True)
    return row


def table(rows) -> str:
    lines = ["| model shape | dtype | jitops packed | jitops dense bshd | via copies | SDPA packed | packed / SDPA | "
             "eager packed | eager copies | eager SDPA | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g, e = r["graph_us"], r["eager_us"]
        lines.append(f"| {r['name']} | {r['dtype']} | {g['jitops packed']:.1f} | {g['jitops dense']:.1f} | "
                     f"{g['via copies']:.1f} | {g['SDPA packed']:.1f} | {g['SDPA packed'] / g['jitops packed']:.2f}x | "
                     f"{e['jitops packed']:.1f} | {e['via copies']:.1f} | {e['SDPA packed']:.1f} | {r['err']:.1e} |")
    return "\n".join(lines) + "\n"


def summary(rows) -> dict:
    def geo(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    def ratio(a, b):
        return [r["graph_us"][a] / r["graph_us"][b] for r in rows]
    return {"packed_vs_dense": geo(ratio("jitops dense", "jitops packed")),
            "packed_vs_copies": geo(ratio("via copies", "jitops packed")),
            "packed_vs_sdpa": geo(ratio("SDPA packed", "jitops packed")),
            "worst_packed_vs_sdpa": min(ratio("SDPA packed", "jitops packed")),
            "eager_packed_vs_copies": geo([r["eager_us"]["via copies"] / r["eager_us"]["jitops packed"] for r in rows]),
            "eager_packed_vs_sdpa": geo([r["eager_us"]["SDPA packed"] / r["eager_us"]["jitops packed"] for r in rows])}


def sanitize_case():
    """One small packed case per kernel family (and the paths the pitch changes: packed GQA decode rows,
    split merge, TMA rings and clusters, pitches off 16 bytes), each checked against float64."""
    torch.manual_seed(0)
    hop = jitops.get_backend().device.arch.rstrip("a") == "sm_90"
    decode = dict(warps=4, row_groups=1, block_k=64, key_warps=4, pack=True)
    fp16, fp32 = torch.float16, torch.float32
    # (B, Sq, Sk, H, Hk, D, dtype, extra pitch, causal, schedule, attention keywords)
    cases = [(2, 70, 150, 4, 2, 64, fp16, 0, True, "fused_mma", {}),
             (2, 70, 150, 4, 2, 64, fp16, 4, True, "fused_mma", {}),
             (2, 3, 700, 8, 2, 128, fp16, 0, "bottom_right", Schedule.make("fused_mma", **decode, splits=3), {}),
             (2, 40, 90, 4, 2, 64, fp32, 0, True, "fused", {}),
             (2, 40, 90, 4, 2, 64, fp32, 1, True, "fused", {}),
             (2, 40, 90, 4, 2, 32, fp32, 0, False, "three_stage", {}),
             (2, 40, 90, 4, 2, 32, fp32, 0, True, "naive", {}),
             (2, 40, 90, 4, 2, 64, fp32, 0, True, None, {"precision": "tf32"})]
    if hop:
        cases += [(2, 150, 200, 4, 2, 72, fp16, 0, True, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1), {}),
                  (2, 150, 200, 4, 2, 72, fp16, 4, True, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1), {}),
                  (2, 150, 300, 4, 2, 64, fp16, 0, False,
                   Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1), {}),
                  (2, 3, 700, 8, 2, 128, fp16, 0, "bottom_right",
                   Schedule.make("fused_mma", **decode, splits=3, tma=1, stages=3, cluster=1), {})]
    for b, sq, sk, h, hk, d, dtype, extra, causal, sched, kw in cases:
        q = packed_views(b, sq, h, hk, d, dtype, extra)[0]
        _, k, v = packed_views(b, sk, h, hk, d, dtype, extra)
        err = error(q, k, v, causal, sched, **kw)
        print(f"sanitize case {q.shape} {k.shape} pitch {(h + 2 * hk) * d + extra} {dtype} causal={causal} {sched} "
              f"{kw}: err {err:.2e}", flush=True)
        assert err <= (4e-3 if kw.get("precision") == "tf32" else TOL[dtype])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="", help="folder for attention_packed.json.gz and .md")
    ap.add_argument("--sanitize", action="store_true", help="compute-sanitizer over the packed cases instead")
    ap.add_argument("--sanitize-case", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    assert jitops.get_backend().name == "cuda", "needs the CUDA backend (a CUDA GPU, or JITOPS_BACKEND=cuda)"
    if args.sanitize_case:
        sanitize_case()
        return
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    if args.sanitize:
        result = sanitize(args.out, os.path.abspath(__file__), timeout=280)
        if args.out:
            with open(os.path.join(args.out, "sanitizer.json"), "w") as f:
                json.dump(result, f, indent=1)
        sys.exit(max(r["rc"] for r in result.values()))
    torch.manual_seed(0)
    timer = Timer(torch)
    rows = [one(timer, name, b, s, h, hk, d, causal, dtype)
            for name, b, s, h, hk, d, causal in MODELS for dtype in (torch.float16, torch.bfloat16)]
    summ = summary(rows)
    print(json.dumps(summ), flush=True)
    text = table(rows)
    print(text)
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "torch": torch.__version__}
        with gzip.open(os.path.join(args.out, "attention_packed.json.gz"), "wt") as f:
            json.dump({**meta, "rows": rows, "summary": summ}, f, indent=1)
        with open(os.path.join(args.out, "attention_packed.md"), "w") as f:
            f.write(f"{meta['device']}, {meta['date']}, graph replay and eager calls, us\n\n{text}\n"
                    f"{json.dumps(summ, indent=1)}\n")


if __name__ == "__main__":
    main()
