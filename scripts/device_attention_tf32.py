"""fp32 attention with TF32 products (fused_tf32) against the exact fp32 pick and SDPA (GPU).

Per shape (fp32, real models' prefill): every fused_tf32 candidate and the exact pick (precision
"highest") are checked against float64 (the first two query heads of batch 0, NaN-filled output,
error relative to max |reference|), then timed with CUDA-graph replay (median of 5 trials of 20
calls) in rotated passes, best pass of each, beside torch SDPA in fp32 (its default backend) and
SDPA's math backend with TF32 matmuls allowed (what a torch user gets from allow_tf32).

    python3 scripts/device_attention_tf32.py [--shapes NAME,...] [--wgmma] [--passes N] [--out DIR]

--wgmma times the pick, the mma.sync tiles of SHORTLIST_TILES and every wgmma=1 candidate (sm_90);
--passes N times N rotated passes instead of one per schedule; --picks times only the two picks and SDPA.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, q [B, H, Sq, D], kv [B, Hk, Sk, D], causal, padding mask)
SHAPES = [("B=256 S=128 D=64 (seed)", (256, 1, 128, 64), (256, 1, 128, 64), False, False),
          ("BERT-base b8 S=384", (8, 12, 384, 64), (8, 12, 384, 64), False, False),
          ("BERT-base b8 S=384 padding mask", (8, 12, 384, 64), (8, 12, 384, 64), False, True),
          ("BERT-base b1 S=128", (1, 12, 128, 64), (1, 12, 128, 64), False, False),
          ("ViT-B/16 b8 S=197", (8, 12, 197, 64), (8, 12, 197, 64), False, False),
          ("Whisper enc S=1500", (1, 20, 1500, 64), (1, 20, 1500, 64), False, False),
          ("B=8 H=16 S=2048 D=64", (8, 16, 2048, 64), (8, 16, 2048, 64), False, False),
          ("B=8 H=16 S=2048 D=128 causal", (8, 16, 2048, 128), (8, 16, 2048, 128), True, False),
          ("Llama3-8B prefill", (1, 32, 2048, 128), (1, 8, 2048, 128), True, False),
          ("SD1.5 self D=40", (2, 8, 4096, 40), (2, 8, 4096, 40), False, False),
          ("D=80 B=4 H=16 S=1024", (4, 16, 1024, 80), (4, 16, 1024, 80), False, False),
          ("Gemma-7B prefill D=256 causal", (1, 16, 2048, 256), (1, 16, 2048, 256), True, False),
          ("D=256 B=2 H=8 S=2048", (2, 8, 2048, 256), (2, 8, 2048, 256), False, False)]


def graph_us(fn) -> float:
    import torch

    from jitops.bench.timing import Timer
    us = Timer(torch).graph_us(fn, n=20, trials=5)
    if us is None:
        raise RuntimeError("CUDA graph capture failed")
    return us


def label_of(s) -> str:
    if int(s.get("wgmma", 0)):
        return f"tf32 wgmma {s.get('groups')}wg x {s.get('block_k')} s{s.get('stages')}"
    return f"tf32 {s.get('warps')}w{'x2' if s.get('row_groups') else ''} x {s.get('block_k')}"


def tile_of(s) -> tuple:
    return (int(s.get("warps", 0)), int(s.get("block_k", 0)), int(s.get("row_groups", 1)))


def reference(q, k, v, mask, causal):
    """float64 output of batch 0, query heads 0 and 1 (jitops' reference)."""
    from jitops.ops import get_op
    from jitops.ops.attention_problem import reference as ref
    from jitops.ops.base import TensorSpec
    hk = max(1, 2 * k.shape[1] // q.shape[1])
    sub = {"q": q[:1, :2].cpu().numpy(), "k": k[:1, :hk].cpu().numpy(), "v": v[:1, :hk].cpu().numpy()}
    specs = {n: TensorSpec(a.shape, "float32") for n, a in sub.items()}
    if mask is not None:
        sub["mask"] = mask[:1].cpu().numpy()
    specs["mask"] = TensorSpec(tuple(mask[:1].shape), "float32") if mask is not None else None
    p = get_op("attention").make_problem(specs, {"causal": causal})
    return ref(p, sub)["out"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help="comma-separated shape names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--wgmma", action="store_true", help="the pick, the shortlist tiles and the wgmma=1 candidates")
    ap.add_argument("--passes", type=int, default=0, help="rotated timing passes (default: one per schedule)")
    ap.add_argument("--picks", action="store_true", help="only the picks (TF32 and exact) beside SDPA")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import jitops
    from jitops.errors import CompileError, ScheduleError
    from jitops.ops import get_op
    from jitops.ops.attention_problem import TF32_TOLERANCE
    from jitops.ops.attention_tf32 import SHORTLIST_TILES
    from jitops.ops.base import TensorSpec
    op = get_op("attention")
    device = jitops.get_backend().device
    wanted = set(args.shapes.split(",")) if args.shapes else None
    rows, failures = [], 0
    for name, qs, kvs, causal, padded in SHAPES:
        if wanted and name not in wanted:
            continue
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(s, device="cuda", generator=g) for s in (qs, kvs, kvs))
        mask = None
        if padded:      # BERT's padding mask: the last quarter of each sequence's keys hidden, per batch
            mask = torch.zeros((qs[0], 1, 1, kvs[2]), device="cuda")
            mask[..., 3 * kvs[2] // 4:] = float("-inf")
        specs = {"q": TensorSpec(qs, "float32"), "k": TensorSpec(kvs, "float32"), "v": TensorSpec(kvs, "float32"),
                 "mask": TensorSpec(tuple(mask.shape), "float32") if mask is not None else None}
        p_tf32 = op.make_problem(specs, {"causal": causal, "precision": "tf32"})
        p_exact = op.make_problem(specs, {"causal": causal, "precision": "highest"})
        pick = op.heuristic(p_tf32, device)
        scheds = [("tf32 pick", "tf32", pick)]
        scheds += [(label_of(s), "tf32", s) for s in op.candidates(p_tf32, device)
                   if s.algorithm == "fused_tf32" and s != pick and not args.picks
                   and (not args.wgmma or int(s.get("wgmma", 0)) or tile_of(s) in SHORTLIST_TILES)]
        scheds.append(("exact pick", "highest", op.heuristic(p_exact, device)))
        ref = reference(q, k, v, mask, causal)
        scale = float(np.abs(ref).max())
        row = {"shape": name, "q": qs, "kv": kvs, "causal": causal, "mask": padded, "gflop": p_tf32.flops() / 1e9,
               "schedules": {lab: str(s) for lab, _, s in scheds}}
        calls = []
        for label, precision, sched in scheds:
            out = torch.full(qs, float("nan"), device="cuda")
            try:
                jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=sched, precision=precision)
            except (ScheduleError, CompileError) as e:
                row[f"{label}_skipped"] = str(e)[:500]
                print(f"{name} {label}: {type(e).__name__}: {str(e)[:500]}", flush=True)
                continue
            torch.cuda.synchronize()
            err = float(np.nanmax(np.abs(out[:1, :2].double().cpu().numpy() - ref))) / scale
            finite = bool(torch.isfinite(out).all())
            tol = TF32_TOLERANCE if precision == "tf32" else 2e-5
            ok = finite and err <= tol
            row[f"{label}_err"], row[f"{label}_ok"] = err, ok
            failures += not ok
            if ok:
                calls.append((label, lambda s=sched, pr=precision, o=out: jitops.attention(
                    q, k, v, mask, causal=causal, out=o, schedule=s, precision=pr)))
        kk, vv = k, v
        if kvs[1] != qs[1]:
            kk, vv = (t.repeat_interleave(qs[1] // kvs[1], 1) for t in (k, v))

        def sdpa():
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal)

        def sdpa_math_tf32():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal)

        calls.append(("sdpa", sdpa))
        torch.backends.cuda.matmul.allow_tf32 = True
        calls.append(("sdpa math tf32", sdpa_math_tf32))
        times: dict = {label: [] for label, _ in calls}
        for n in range(args.passes or len(calls)):
            n %= len(calls)
            for label, call in calls[n:] + calls[:n]:
                times[label].append(graph_us(call))
        torch.backends.cuda.matmul.allow_tf32 = False
        row["us"] = {label: min(ts) for label, ts in times.items()}
        rows.append(row)
        best = min((t, lab) for lab, t in row["us"].items() if lab.startswith("tf32"))
        line = (f"{name}: tf32 pick {row['us'].get('tf32 pick', float('nan')):.1f} us "
                f"({p_tf32.flops() / row['us'].get('tf32 pick', float('nan')) / 1e6:.0f} TFLOP/s, err "
                f"{row.get('tf32 pick_err', float('nan')):.1e}); best tf32 {best[1]} {best[0]:.1f}; exact "
                f"{row['us'].get('exact pick', float('nan')):.1f}; sdpa {row['us']['sdpa']:.1f}; "
                f"sdpa math tf32 {row['us']['sdpa math tf32']:.1f}")
        print(line, flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"attention_tf32_{time.strftime('%H-%M')}.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump({"device": device.name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"wrote {path}; {failures} check failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
