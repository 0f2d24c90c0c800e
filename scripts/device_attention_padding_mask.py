"""Attention with a padding mask (an additive [B, 1, 1, Sk] mask: 0 on real keys, -inf on padding, as ONNX
exports of BERT / T5 pass it) on the GPU: the scheduler's pick, other plain tiles, query walks over one key
tile (q_walk, which the scheduler takes only without a mask), and SDPA with the same mask, fp16. Every schedule is checked
against float64 on the first two heads of batch 0 into a NaN-filled output, then timed (graph replay, each
entry first in one pass).

    python3 scripts/device_attention_padding_mask.py [--out DIR] [--finfo-min] [--pick-only] [--mma]
        [--variants "release=1;groups=1"] [--shapes "BERT-base b32 S=384,..."]

--finfo-min pads with the dtype's lowest finite value instead of -inf (Hugging Face exports); --pick-only
times the scheduler's pick and SDPA alone (A/B of two trees in separate processes); --mma takes the A100's
(sm_80) pick, fused_mma on mma.sync, as the pick (run on this GPU); --variants times the pick with these
parameters changed or added beside it (';' between variants, with --pick-only too); --shapes takes some shapes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from device_attention_ab import best_of_rotations  # noqa: E402

import jitops  # noqa: E402
from jitops.device import KNOWN_TARGETS  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.errors import ScheduleError  # noqa: E402
from jitops.ops.base import Schedule, TensorSpec, parse_value  # noqa: E402

SHAPES = [("BERT-base b32 S=128", (32, 12, 128, 64), 128), ("BERT-base b64 S=128", (64, 12, 128, 64), 128),
          ("BERT-base b32 S=384", (32, 12, 384, 64), 384), ("BERT-large b16 S=512", (16, 16, 512, 64), 512),
          ("T5 cross b8 (512 over 128)", (8, 12, 512, 64), 128), ("SDXL-like b8 (4096 over 77)", (16, 10, 4096, 64), 77),
          ("BERT-base b8 S=384", (8, 12, 384, 64), 384), ("D=96 b8 H=16 S=1024", (8, 16, 1024, 96), 1024),
          ("D=128 b8 H=16 S=1024", (8, 16, 1024, 128), 1024), ("D=256 b2 H=16 S=1024", (2, 16, 1024, 256), 1024)]


def reference(q, k, v, mask):
    """float64 softmax(Q K^T / sqrt(D) + mask) V of batch 0, heads 0 and 1."""
    qd, kd, vd = (t[:1, :2].double() for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask[:1].double()
    return torch.softmax(s, dim=-1) @ vd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--finfo-min", action="store_true", help="pad with the dtype's lowest finite value, not -inf")
    ap.add_argument("--pick-only", action="store_true", help="time the pick and SDPA only")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name")
    ap.add_argument("--mma", action="store_true", help="the A100's pick (fused_mma) as the pick")
    ap.add_argument("--variants", default="", help="the pick with these parameters: 'name=value,...;...'")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    args = ap.parse_args()
    pad = torch.finfo(torch.float16).min if args.finfo_min else float("-inf")
    op = get_op("attention")
    device = jitops.get_backend().device
    rows, bad = [], 0
    wanted = set(filter(None, args.shapes.split(",")))
    for name, qs, sk in SHAPES:
        if wanted and name not in wanted:
            continue
        kvs = (*qs[:2], sk, qs[3])
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(s, device="cuda", dtype=torch.float16, generator=g) for s in (qs, kvs, kvs))
        lengths = torch.randint(sk // 2, sk + 1, (qs[0],), device="cuda", generator=g)     # real keys per batch
        mask = torch.zeros(qs[0], 1, 1, sk, device="cuda", dtype=torch.float16)
        mask = mask.masked_fill(torch.arange(sk, device="cuda").view(1, 1, 1, sk) >= lengths.view(-1, 1, 1, 1), pad)
        spec = {"q": TensorSpec(qs, "float16"), "k": TensorSpec(kvs, "float16"), "v": TensorSpec(kvs, "float16"),
                "mask": TensorSpec(tuple(mask.shape), "float16")}
        pick = op.heuristic(op.make_problem(spec, {}), KNOWN_TARGETS["sm_80"] if args.mma else device)
        tiles = [("g2k64", Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1)),
                 ("g1k128", Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1)),
                 ("g2k128", Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1))]
        tiles += [(f"g{g}k{bk}b", Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, bounded=1))
                  for g, bk in ((2, 64), (2, 128), (1, 128))]
        scheds = [("pick", pick)] + ([] if args.pick_only else [t for t in tiles if t[1] != pick] + [
            (f"walk{w}", Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, stages=1, q_walk=w,
                                       **({"trim": 1} if sk % 128 else {})))
            for w in (2, 4, 8) if w <= -(-qs[2] // 64)])
        for variant in filter(None, args.variants.split(";")):
            params = {k: v for k, v in pick.as_dict()["params"].items() if k != "why"}
            params.update({k: parse_value(v) for k, v in (kv.split("=") for kv in variant.split(","))})
            scheds.append((variant, Schedule.make(pick.algorithm, **params)))
        ref = reference(q, k, v, mask)
        calls, row = [], {"shape": name, "pick": str(pick)}
        for label, sched in scheds:
            out = torch.full_like(q, float("nan"))
            try:
                jitops.attention(q, k, v, mask, out=out, schedule=sched)
            except ScheduleError as e:
                print(f"{name} {label}: {e}", flush=True)
                continue
            torch.cuda.synchronize()
            err = float((out[:1, :2].double() - ref).abs().max())
            ok = bool(torch.isfinite(out).all()) and err < 4e-3
            bad += not ok
            row[f"{label}_err"] = err
            if ok:
                calls.append((label, lambda s=sched: jitops.attention(q, k, v, mask, schedule=s)))
        calls.append(("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
        row["us"] = best_of_rotations(calls)
        rows.append(row)
        print(f"{name:30} " + "  ".join(f"{lab} {us:7.1f}" for lab, us in row["us"].items())
              + f"   pick {row['pick']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"attention_padding_mask{args.tag}.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
