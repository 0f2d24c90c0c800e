"""Deeper TMA rings (GPU): the TMA conv kernel's one-block-per-multiprocessor tiles with as many stages as
shared memory holds (64 x 128 / 64 x 64 / 128 x 64 with 8, 128 x 128 with 7, 64 x 160 with 8), against every
current TMA candidate (what the tuner offers) on ResNet-50 b32's convolutions (with their counts), its b16 / b8
7 x 7 and 14 x 14 layers and the large 3x3 layers of issue 16; fp16 channels_last, graph replay, cuDNN at its
best layout. A 64 x 128 tile with 8 stages ran 2048 -> 512 at 7 x 7 b32 in 8.5 us against 9.2 (4 stages) and
10.0 (6) in the cluster runs of 2026-11-29 (docs/data/conv2d_cluster_h200_2026-11-29/sem_and_stages.txt).

Every deeper schedule is first checked against float64 (fp16 / bf16 / TF32, bias + residual + ReLU into
NaN-filled outputs, odd shapes; plain, persistent, split-K).

    python3 scripts/device_conv2d_deep_ring.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402

from conv2d_devkit import CL, TDT, graph_us, layer_tensors, op, rel_err, vendor_times  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402

# (count in ResNet-50, batch, Cin, H = W, Cout, kernel, stride): its convolutions past the stem at batch 32
RESNET50_B32 = (
    (1, 32, 64, 56, 64, 1, 1), (3, 32, 64, 56, 64, 3, 1), (4, 32, 64, 56, 256, 1, 1), (2, 32, 256, 56, 64, 1, 1),
    (1, 32, 256, 56, 128, 1, 1), (1, 32, 128, 56, 128, 3, 2), (4, 32, 128, 28, 512, 1, 1),
    (1, 32, 256, 56, 512, 1, 2), (3, 32, 512, 28, 128, 1, 1), (3, 32, 128, 28, 128, 3, 1),
    (1, 32, 512, 28, 256, 1, 1), (1, 32, 256, 28, 256, 3, 2), (6, 32, 256, 14, 1024, 1, 1),
    (1, 32, 512, 28, 1024, 1, 2), (5, 32, 1024, 14, 256, 1, 1), (5, 32, 256, 14, 256, 3, 1),
    (1, 32, 1024, 14, 512, 1, 1), (1, 32, 512, 14, 512, 3, 2), (3, 32, 512, 7, 2048, 1, 1),
    (1, 32, 1024, 14, 2048, 1, 2), (2, 32, 2048, 7, 512, 1, 1), (2, 32, 512, 7, 512, 3, 1))
# (x shape, w shape, padding, stride): odd pixel counts, a channel tile past Cout, one K tile per split
CHECKS = (((3, 40, 9, 7), (200, 40, 1, 1), 0, 1), ((2, 136, 15, 13), (112, 136, 3, 3), 1, 1),
          ((1, 256, 11, 11), (232, 256, 1, 1), 0, 1), ((2, 200, 13, 9), (72, 200, 3, 3), 1, 2))
TOL = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 4e-3}
DEEPER = {(64, 128, 4, 1, 0): (64, 128, 8, 1, 0), (64, 128, 6, 1, 0): (64, 128, 8, 1, 0),
          (64, 64, 4, 1, 0): (64, 64, 8, 1, 0), (128, 64, 6, 2, 0): (128, 64, 8, 2, 0),
          (128, 64, 3, 2, 0): (128, 64, 8, 2, 0), (128, 128, 6, 2, 0): (128, 128, 7, 2, 0),
          (128, 128, 4, 2, 0): (128, 128, 7, 2, 0), (64, 160, 4, 1, 0): (64, 160, 8, 1, 0)}
OTHERS = ((1, 16, 2048, 7, 512, 1, 1), (1, 16, 512, 7, 2048, 1, 1), (1, 16, 512, 7, 512, 3, 1),
          (1, 16, 1024, 14, 256, 1, 1), (1, 8, 2048, 7, 512, 1, 1), (1, 8, 512, 7, 2048, 1, 1),
          (1, 8, 512, 7, 512, 3, 1), (1, 8, 1024, 14, 256, 1, 1),
          (1, 16, 256, 32, 256, 3, 1), (1, 2, 1920, 32, 640, 3, 1), (1, 2, 640, 64, 640, 3, 1),
          (1, 2, 640, 32, 640, 3, 1), (1, 2, 1280, 16, 1280, 3, 1), (1, 2, 2560, 16, 1280, 3, 1),
          (1, 2, 320, 64, 320, 3, 1))


def problem(xs, ws, dtype, pad, stride=1, bias=False, residual=None):
    spec = {"x": TensorSpec(xs, dtype, "nhwc"), "w": TensorSpec(ws, dtype),
            "bias": TensorSpec((ws[0],), dtype) if bias else None}
    if residual is not None:
        spec["residual"] = TensorSpec(residual, dtype, "nhwc")
    attrs = {"padding": pad, "stride": stride, **({"precision": "tf32"} if dtype == "float32" else {})}
    return op.make_problem(spec, {**attrs, **({"activation": "relu"} if residual is not None else {})})


def deeper(s):
    tile = wg.tma_tile_of(s)
    if tile not in DEEPER:
        return None
    return wg.tma_schedule(DEEPER[tile], int(s["bk"]), persistent=wg.is_persistent(s),
                           split_k=int(s.get("split_k", 1)), a_rows=bool(int(s.get("a_rows", 0))))


def check(dev) -> int:
    bad = n = 0
    for dtype in ("float16", "bfloat16", "float32"):
        extra = {"precision": "tf32"} if dtype == "float32" else {}
        for i, (xs, ws, pad, st) in enumerate(CHECKS):
            g = torch.Generator(device="cuda").manual_seed(i)
            x = torch.randn(*xs, device="cuda", generator=g).to(TDT[dtype]).to(memory_format=CL)
            w = (torch.randn(*ws, device="cuda", generator=g) / (ws[1] * ws[2] * ws[3]) ** 0.5).to(TDT[dtype])
            b = torch.randn(ws[0], device="cuda", generator=g).to(TDT[dtype])
            ref = F.conv2d(x.double(), w.double(), b.double(), padding=pad, stride=st)
            r = torch.randn(*ref.shape, device="cuda", generator=g).to(TDT[dtype]).to(memory_format=CL)
            ref = torch.relu(ref + r.double())
            p = problem(xs, ws, dtype, pad, st, bias=True, residual=tuple(ref.shape))
            for tile in sorted(set(DEEPER.values())):
                for pers, k in ((False, 1), (True, 1), (False, 2)):
                    s = wg.tma_schedule(tile, wg.bk_of(p), persistent=pers, split_k=k, a_rows=p.is_pointwise)
                    try:
                        op.plan(p, s, dev)
                    except Exception:
                        continue
                    out = torch.full_like(r, float("nan"))
                    y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, padding=pad, stride=st,
                                      activation="relu", **extra)
                    err = rel_err(y, ref) if not torch.isnan(y).any() else float("nan")
                    n += 1
                    if not err <= TOL[dtype]:
                        bad += 1
                        print(f"FAIL {dtype} {xs} {ws} {dict(s.params)} err {err}", flush=True)
    print(f"check: {n} deeper schedules, {bad} failed", flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "deep_ring.json"))
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = jitops.get_backend().device
    failed = check(dev)
    rows = []
    for count, n, c, hw, co, k, st in RESNET50_B32 + OTHERS:
        pad = k // 2
        x, w, ref = layer_tensors(n, c, hw, co, k, st)
        p = problem((n, c, hw, hw), (co, c, k, k), "float16", pad, st)
        pick = op.heuristic(p, dev)
        res = {"layer": [n, c, hw, co, k, st], "count": count, "resnet50_b32": n == 32, "pick": dict(pick.params),
               "old": {}, "new": {}}
        old = wg.tma_candidates(p, dev)
        new = {d for d in map(deeper, old) if d is not None} - set(old)
        for kind, scheds in (("old", old + ([pick] if pick not in old else [])), ("new", sorted(new, key=str))):
            for s in scheds:
                try:
                    op.plan(p, s, dev)
                except Exception:
                    continue
                y = jitops.conv2d(x, w, schedule=s, padding=pad, stride=st)
                err = rel_err(y, ref)
                if not err <= 4e-3:
                    failed += 1
                    print(f"FAIL {res['layer']} {dict(s.params)} err {err}", flush=True)
                    continue
                res[kind][json.dumps(dict(s.params), sort_keys=True)] = graph_us(
                    lambda: jitops.conv2d(x, w, schedule=s, padding=pad, stride=st))
        res["pick_us"] = graph_us(lambda: jitops.conv2d(x, w, padding=pad, stride=st))
        res["cudnn"] = vendor_times(x.contiguous(), w, None, {"padding": pad, "stride": st})
        rows.append(res)
        bo = min(res["old"].values(), default=res["pick_us"])
        bn = min(res["new"].items(), key=lambda kv: kv[1], default=("-", float("inf")))
        cud = min(res["cudnn"].values())
        print(f"{count}x {n}x{c}x{hw}->{co} k{k}s{st}: cudnn {cud:6.2f} pick {res['pick_us']:6.2f} old best {bo:6.2f} "
              f"new best {bn[1]:6.2f} ({bo / bn[1]:.3f}x; {bn[0]}) vs cudnn {cud / min(bo, bn[1]):.3f}", flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    net = [r for r in rows if r["resnet50_b32"]]
    cud = sum(r["count"] * min(r["cudnn"].values()) for r in net)
    for label, key in (("pick", lambda r: r["pick_us"]), ("best old", lambda r: min(r["old"].values())),
                       ("best of all", lambda r: min([*r["old"].values(), *r["new"].values()]))):
        ours = sum(r["count"] * key(r) for r in net)
        print(f"ResNet-50 b32 convs past the stem, count-weighted: cuDNN {cud:.1f} us, {label} {ours:.1f} us "
              f"({cud / ours:.3f}x)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
