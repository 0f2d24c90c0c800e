"""Small attention calls (a few waves of blocks or less: batch 1-8 encoders) on each candidate kernel, graph
replay and eager, against SDPA on the same tensors (GPU).

Eager is what a batch-1 program pays per call, so each candidate is timed as the scheduler's pick
would run: the op's heuristic is made to return it, the prepared plans are dropped, and the public
function then takes its native repeat path (the row records whether it did). Every schedule is first
checked against float64 into a NaN-filled output.

    python3 scripts/device_attention_small.py [--dtypes float16,bfloat16] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, [B, H, S, D]): self-attention without a mask, q, k and v of one shape
SHAPES = [("ViT-B/16 b1 S=197", (1, 12, 197, 64)),
          ("ViT-B/16 b2 S=197", (2, 12, 197, 64)),
          ("ViT-B/16 b4 S=197", (4, 12, 197, 64)),
          ("ViT-L/16 b1 S=197", (1, 16, 197, 64)),
          ("DeiT-S b1 S=197", (1, 6, 197, 64)),
          ("BERT-base b1 S=128", (1, 12, 128, 64)),
          ("BERT-base b4 S=128", (4, 12, 128, 64)),
          ("seed 1x8x128x64", (1, 8, 128, 64)),
          ("S=160 D=128 b1", (1, 12, 160, 128)),
          ("BERT-base b1 S=384", (1, 12, 384, 64)),
          ("S=197 D=256 b1", (1, 8, 197, 256)),
          ("BERT-base b8 S=128", (8, 12, 128, 64)),
          ("BERT-base b32 S=128", (32, 12, 128, 64)),
          ("BERT-base b8 S=384", (8, 12, 384, 64)),
          ("Whisper enc S=1500", (1, 20, 1500, 64))]

VARIANTS = {"fused_mma": "heuristic:fused_mma",
            "wg_1x64": dict(groups=1, block_k=64, tma=1, bounded=1),
            "wg_1x128": dict(groups=1, block_k=128, tma=1, bounded=1),
            "wg_2x64": dict(groups=2, block_k=64, tma=1, bounded=1),
            "wg_2x128": dict(groups=2, block_k=128, tma=1, bounded=1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--shapes", help="comma-separated shape names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    import jitops
    import jitops.ops.attention as attention_op
    from jitops import engine
    from jitops.bench.timing import Timer
    from jitops.errors import CompileError, ScheduleError
    from jitops.ops.base import Schedule, TensorSpec
    from jitops.prepared import clear_prepared
    from device_attention_ab import checked_error, first_heads_reference

    device = jitops.get_backend().device
    timer = Timer(torch)
    heuristic = attention_op.heuristic
    sdpa = torch.nn.functional.scaled_dot_product_attention
    wanted = set(args.shapes.split(",")) if args.shapes else None
    rows, failures = [], 0
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for name, shape in SHAPES:
            if wanted and name not in wanted:
                continue
            specs = {n: TensorSpec(shape, dtype) for n in "qkv"} | {"mask": None}
            p = attention_op.make_problem(specs, {"causal": False})
            scheds = {"pick": heuristic(p, device)}
            for label, v in VARIANTS.items():
                try:
                    scheds[label] = (heuristic(p, device, v.removeprefix("heuristic:")) if isinstance(v, str)
                                     else Schedule.make("fused_wgmma", **v))
                except ScheduleError as e:
                    print(f"{name} {label}: {e}", flush=True)
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(shape, device="cuda", dtype=tdt, generator=g) for _ in range(3))
            ref = first_heads_reference(q, k, v, False, dtype)
            row = {"shape": name, "dtype": dtype, "schedules": {k_: str(s) for k_, s in scheds.items()},
                   "graph_us": {}, "eager_us": {}, "native": {}, "err": {}}
            for label, sched in scheds.items():
                try:
                    err, ok = checked_error(q, k, v, False, dtype, sched, ref)
                except (ScheduleError, CompileError) as e:
                    print(f"{name} {label}: {type(e).__name__}: {str(e)[:500]}", flush=True)
                    continue
                row["err"][label] = err
                if not ok:
                    failures += 1
                    print(f"FAIL {name} {label}: err {err}", flush=True)
                    continue
                row["graph_us"][label] = min(timer.graph_us(lambda s=sched: jitops.attention(q, k, v, schedule=s),
                                                            n=20, trials=5) for _ in range(2))
                # eager as the pick: the heuristic returns this schedule, the public function goes native
                attention_op.heuristic = (lambda pr, dev, algorithm=None, s=sched:
                                          s if algorithm is None else heuristic(pr, dev, algorithm))
                clear_prepared()
                try:
                    jitops.attention(q, k, v)
                    torch.cuda.synchronize()
                    row["native"][label] = any(b is not None and b.native is not None
                                               for key, b in engine._cache.bound.items() if key[0] == "attention")
                    row["eager_us"][label] = timer.eager_us({label: lambda: jitops.attention(q, k, v)},
                                                            calls=2000, trials=5)[label]
                finally:
                    attention_op.heuristic = heuristic
                    clear_prepared()
            row["graph_us"]["sdpa"] = min(timer.graph_us(lambda: sdpa(q, k, v), n=20, trials=5) for _ in range(2))
            row["eager_us"]["sdpa"] = timer.eager_us({"sdpa": lambda: sdpa(q, k, v)}, calls=2000, trials=5)["sdpa"]
            rows.append(row)
            print(f"{name:22s} {dtype:9s} " + "  ".join(
                f"{lab} {row['graph_us'][lab]:.1f}/{row['eager_us'].get(lab, float('nan')):.1f}"
                f"{'' if row['native'].get(lab, True) else '(py)'}" for lab in row["graph_us"]), flush=True)
    with open(os.path.join(args.out, "attention_small.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "rows": rows}, f, indent=1)
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
