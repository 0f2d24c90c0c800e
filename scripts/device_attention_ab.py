"""Explicit fused_wgmma schedules against the scheduler's pick and SDPA on the same tensors (GPU).

Each schedule is first checked against float64 (jitops' reference, the first (batch, head) pairs)
into a NaN-filled output; then the pick, every variant and SDPA are timed with CUDA-graph replay
(median of 5 trials of 20 calls), in interleaved passes, the faster pass of each. A variant that
does not apply to a shape (a ScheduleError) is reported and skipped.

    python3 scripts/device_attention_ab.py --variant g4=groups=4,block_k=64,tma=1,stages=3,release=1 \
        [--variant wg=heuristic:fused_wgmma (the scheduler's schedule of an algorithm)] \
        [--variant ...] [--shapes "B=8 H=16 S=2048 D=128,..."] [--dtypes float16,bfloat16] [--out DIR]
        [--old-picks FILE]   (each shape's pick at an earlier commit, timed as 'old': see --help)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, q [B, H, Sq, D], kv [B, Hk, Sk, D], causal): issue 16's four, then real models' prefill.
SHAPES = [("B=8 H=16 S=2048 D=64", (8, 16, 2048, 64), (8, 16, 2048, 64), False),
          ("B=8 H=16 S=2048 D=64 causal", (8, 16, 2048, 64), (8, 16, 2048, 64), True),
          ("B=8 H=16 S=2048 D=128", (8, 16, 2048, 128), (8, 16, 2048, 128), False),
          ("B=8 H=16 S=2048 D=128 causal", (8, 16, 2048, 128), (8, 16, 2048, 128), True),
          ("Flux / SD3 D=128 S=4096", (1, 24, 4096, 128), (1, 24, 4096, 128), False),
          ("Llama3-8B prefill", (1, 32, 2048, 128), (1, 8, 2048, 128), True),
          ("SDXL self", (2, 10, 4096, 64), (2, 10, 4096, 64), False),
          ("GPT-2 causal S=1024", (8, 12, 1024, 64), (8, 12, 1024, 64), True),
          ("DiT-XL D=72", (4, 16, 1024, 72), (4, 16, 1024, 72), False),
          ("Whisper enc S=1500", (1, 20, 1500, 64), (1, 20, 1500, 64), False),
          ("BERT-base b32 S=384", (32, 12, 384, 64), (32, 12, 384, 64), False),
          ("BERT-base b8 S=384", (8, 12, 384, 64), (8, 12, 384, 64), False),
          ("BERT-large b16 S=512", (16, 16, 512, 64), (16, 16, 512, 64), False),
          ("ViT-L/16 b32 S=197", (32, 16, 197, 64), (32, 16, 197, 64), False),
          ("ViT-L/16 b8 S=197", (8, 16, 197, 64), (8, 16, 197, 64), False),
          ("ViT-B/16 b32 S=197", (32, 12, 197, 64), (32, 12, 197, 64), False),
          ("ViT-B/16 b8 S=197", (8, 12, 197, 64), (8, 12, 197, 64), False),
          ("ViT-B/16 b1 S=197", (1, 12, 197, 64), (1, 12, 197, 64), False),
          ("DeiT-S b64 S=197", (64, 6, 197, 64), (64, 6, 197, 64), False),
          ("B=16 H=12 S=160 D=64", (16, 12, 160, 64), (16, 12, 160, 64), False),
          ("B=16 H=12 S=160 D=128", (16, 12, 160, 128), (16, 12, 160, 128), False),
          ("SD1.5 self D=40", (2, 8, 4096, 40), (2, 8, 4096, 40), False),
          ("SD1.5 self D=40 B=8", (8, 8, 4096, 40), (8, 8, 4096, 40), False),
          ("SD2 self D=64 S=9216", (2, 5, 9216, 64), (2, 5, 9216, 64), False),
          ("Gemma-7B prefill D=256 causal", (1, 16, 2048, 256), (1, 16, 2048, 256), True),
          ("D=80 B=4 H=16 S=1024", (4, 16, 1024, 80), (4, 16, 1024, 80), False),
          ("D=96 B=4 H=16 S=2048", (4, 16, 2048, 96), (4, 16, 2048, 96), False),
          ("Llama-2-7B prefill B=2 S=4096 causal", (2, 32, 4096, 128), (2, 32, 4096, 128), True),
          ("Llama-2-7B prefill B=4 S=4096 causal", (4, 32, 4096, 128), (4, 32, 4096, 128), True),
          ("CLIP-L/14 b8 S=257", (8, 16, 257, 64), (8, 16, 257, 64), False),
          ("SDXL cross 64x64 (77 keys)", (2, 10, 4096, 64), (2, 10, 77, 64), False),
          ("Whisper decoder cross b8", (8, 20, 64, 64), (8, 20, 1500, 64), False),
          ("SDXL cross b8 64x64 (77 keys)", (16, 10, 4096, 64), (16, 10, 77, 64), False),
          ("SDXL cross b8 32x32 (77 keys)", (16, 20, 1024, 64), (16, 20, 77, 64), False),
          ("T5 cross (128 keys)", (8, 12, 512, 64), (8, 12, 128, 64), False),
          ("BERT-base b32 S=128", (32, 12, 128, 64), (32, 12, 128, 64), False),
          ("PixArt cross D=72 (120 keys)", (2, 16, 4096, 72), (2, 16, 120, 72), False)]


def graph_us(fn) -> float:
    """Graph replay, median of 5 trials of 20 calls (the project's Timer)."""
    import torch

    from jitops.bench.timing import Timer
    us = Timer(torch).graph_us(fn, n=20, trials=5)
    if us is None:
        raise RuntimeError("CUDA graph capture failed")
    return us


def best_of_rotations(calls: list) -> dict:
    """{label: best graph_us} over as many passes as (label, call) entries, each entry first in one."""
    times: dict = {label: [] for label, _ in calls}
    for n in range(len(calls)):
        for label, call in calls[n:] + calls[:n]:
            times[label].append(graph_us(call))
    return {label: min(ts) for label, ts in times.items()}


def first_heads_reference(q, k, v, causal: bool, dtype: str):
    """float64 output (jitops' reference) of batch 0, query heads 0 and 1, with the kv heads they read."""
    from jitops.ops import get_op
    from jitops.ops.attention_problem import reference
    from jitops.ops.base import TensorSpec
    hk = max(1, 2 * k.shape[1] // q.shape[1])     # the kv heads of q heads 0, 1 (GQA)
    sub = {"q": q[:1, :2].float().cpu().numpy(), "k": k[:1, :hk].float().cpu().numpy(),
           "v": v[:1, :hk].float().cpu().numpy()}
    p_sub = get_op("attention").make_problem({n: TensorSpec(a.shape, dtype) for n, a in sub.items()} | {"mask": None},
                                             {"causal": causal})
    return reference(p_sub, sub)["out"]


def checked_error(q, k, v, causal: bool, dtype: str, schedule, ref) -> tuple[float, bool]:
    """(max error against ref, within tolerance with the whole output finite) of one schedule, run into a
    NaN-filled output. Raises ScheduleError / CompileError where the schedule does not apply."""
    import torch

    import jitops
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=q.dtype)
    jitops.attention(q, k, v, causal=causal, out=out, schedule=schedule)
    torch.cuda.synchronize()
    err = float(np.nanmax(np.abs(out[:1, :2].double().cpu().numpy() - ref)))
    return err, bool(np.isfinite(out.float().cpu().numpy()).all()) and err < (2e-2 if dtype == "bfloat16" else 4e-3)


def parse_variant(text: str):
    """'label=key=value,key=value' -> (label, Schedule of fused_wgmma); 'label=pick:key=value,...' -> (label,
    the fields to lay over each shape's pick)."""
    from jitops.ops.base import Schedule, parse_value
    label, _, body = text.partition("=")
    if body.startswith("heuristic:"):        # the scheduler's own schedule of that algorithm
        return label, body.removeprefix("heuristic:")
    over_pick = body.startswith("pick:")
    fields = dict(item.split("=", 1) for item in body.removeprefix("pick:").split(","))
    values = {k: parse_value(v) for k, v in fields.items()}
    return label, (values if over_pick else Schedule.make("fused_wgmma", **values))


def resolve(variant, pick, p=None, device=None):
    """A variant's schedule for one shape: its own, the pick with the variant's fields laid over it,
    or (a name) the scheduler's schedule of that algorithm."""
    from jitops.ops import get_op
    from jitops.ops.base import Schedule
    if isinstance(variant, str):
        return get_op("attention").heuristic(p, device, variant)
    if isinstance(variant, dict):
        return Schedule.make(pick.algorithm, **(pick.as_dict()["params"] | variant))
    return variant


def custom_shape(name: str):
    """'B=8 H=15 S=2112 D=128 [Hk=..] [Sk=..] [causal]' -> a SHAPES entry (Sk: keys, S the default)."""
    fields = dict(re.findall(r"(\w+)=(\d+)", name))
    b, h, s, d = (int(fields[key]) for key in ("B", "H", "S", "D"))
    hk, sk = int(fields.get("Hk", h)), int(fields.get("Sk", s))
    return name, (b, h, s, d), (b, hk, sk, d), name.endswith("causal")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="label=key=value,...")
    ap.add_argument("--shapes", help="comma-separated shape names (default: all)")
    ap.add_argument("--custom", action="append", default=[],
                    help="a shape not in the list, named 'B=.. H=.. S=.. D=..' [+ ' Hk=..'] [+ ' Sk=..'] [+ ' causal'] (repeatable)")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rotate", action="store_true", help="as many passes as entries, each starting at the next one")
    ap.add_argument("--discard-first", action="store_true", help="one untimed graph timing before the passes")
    ap.add_argument("--old-picks", help="JSON {shape name: {param: value}}: each shape's earlier pick, timed as 'old'")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    import jitops
    from jitops.errors import CompileError, ScheduleError
    from jitops.ops import get_op
    from jitops.ops.base import Schedule, TensorSpec
    op = get_op("attention")
    device = jitops.get_backend().device
    variants = [parse_variant(v) for v in args.variant]
    old_picks = json.load(open(args.old_picks)) if args.old_picks else {}
    shapes = SHAPES + [custom_shape(text) for text in args.custom]
    wanted = set(args.shapes.split(",")) | set(args.custom) if args.shapes else None   # None: every shape
    rows, failures = [], 0
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for name, qs, kvs, causal in shapes:
            if wanted and name not in wanted:
                continue
            specs = {"q": TensorSpec(qs, dtype), "k": TensorSpec(kvs, dtype), "v": TensorSpec(kvs, dtype), "mask": None}
            p = op.make_problem(specs, {"causal": causal})
            pick = op.heuristic(p, device)
            scheds = [("pick", pick)] + [(label, resolve(v, pick, p, device)) for label, v in variants]
            if old_picks and name in old_picks:
                scheds.append(("old", Schedule.make("fused_wgmma", **old_picks[name])))
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(s, device="cuda", dtype=tdt, generator=g) for s in (qs, kvs, kvs))
            ref = first_heads_reference(q, k, v, causal, dtype)
            row = {"shape": name, "dtype": dtype, "schedules": {lab: str(s) for lab, s in scheds}}
            runnable = []
            for label, sched in scheds:
                try:
                    err, ok = checked_error(q, k, v, causal, dtype, sched, ref)
                except (ScheduleError, CompileError) as e:
                    row[f"{label}_skipped"] = str(e)[:2000]
                    print(f"{name} {label}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
                    continue
                row[f"{label}_err"], row[f"{label}_ok"] = err, ok
                failures += not ok
                if ok:
                    runnable.append((label, sched))
            kk, vv = k, v
            if kvs[1] != qs[1]:
                kk, vv = (t.repeat_interleave(qs[1] // kvs[1], 1) for t in (k, v))
            # (label, call): each schedule, then SDPA on the same tensors
            calls = [(label, lambda s=sched: jitops.attention(q, k, v, causal=causal, schedule=s))
                     for label, sched in runnable]
            sdpa = torch.nn.functional.scaled_dot_product_attention
            calls.append(("sdpa", lambda: sdpa(q, kk, vv, is_causal=causal)))
            if args.discard_first:
                # the first CUDA-graph timing of a process ran 5-7% faster than every later one of the same
                # kernel (D = 128, 2026-11-27 00:48): time one, keep nothing
                graph_us(calls[0][1])
            times = {label: [] for label, _ in calls}
            for n in range(len(calls) if args.rotate else args.passes):
                # --rotate: pass n starts at entry n, so each entry is timed first in one pass
                for label, call in (calls[n:] + calls[:n]) if args.rotate else calls:
                    times[label].append(graph_us(call))
            row["us"] = {key: min(ts) for key, ts in times.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_ab.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                   "rows": rows}, f, indent=1)
    labels = ["pick"] + [lab for lab, _ in variants] + (["old"] if old_picks else [])
    print(f"{'shape':30} {'dtype':9} " + " ".join(f"{lab:>9}" for lab in labels) + f" {'sdpa':>9}   vs SDPA (best)")
    for r in rows:
        us = r["us"]
        cells = " ".join(f"{us[lab]:9.1f}" if lab in us else f"{'-':>9}" for lab in labels)
        timed = [us[lab] for lab in labels if lab in us]
        ratios = (f"pick {us['sdpa'] / us['pick']:.3f}" if "pick" in us else "pick -") + \
            (f"  best {us['sdpa'] / min(timed):.3f}" if timed else "")
        print(f"{r['shape']:30} {r['dtype']:9} {cells} {us['sdpa']:9.1f}   {ratios}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
