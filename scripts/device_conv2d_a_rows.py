"""The TMA conv kernel's A operand on 1x1 / stride-1 / unpadded layers: im2col map against a plain tiled map
over the input as the [pixels][channels] matrix (`a_rows`), same tiles, on the layers where cuDNN beats us
(ResNet-50's bottleneck 1x1s at batch 32 and 8), fp16 channels_last (GPU).

Each a_rows schedule is first checked against float64 (bias + residual + ReLU into a NaN-filled output); then
per layer the TMA candidates the estimate rates best (and the heuristic's pick) are timed by graph replay both
ways, with cuDNN (benchmark mode, best layout) and the names of the kernels it ran.

    python3 scripts/device_conv2d_a_rows.py [--top 6] [--out FILE.json]
    python3 scripts/device_conv2d_a_rows.py --sanitize     (memcheck / racecheck / synccheck over --small)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops.conv2d_cost import estimate  # noqa: E402

from conv2d_devkit import CL, graph_us, layer_tensors, op, picked, rel_err, vendor_times  # noqa: E402

# (batch, Cin, H = W, Cout): ResNet-50's 1x1 stride-1 layers at batch 32, the two batch-8 ones cuDNN wins most
LAYERS = ((32, 64, 56, 64), (32, 64, 56, 256), (32, 256, 56, 64), (32, 256, 56, 128), (32, 128, 28, 512),
          (32, 512, 28, 128), (32, 512, 28, 256), (32, 256, 14, 1024), (32, 1024, 14, 256), (32, 1024, 14, 512),
          (32, 512, 7, 2048), (32, 2048, 7, 512), (8, 2048, 7, 512), (8, 512, 7, 2048))
CHECKS = ((3, 40, 9, 7, 72), (2, 136, 15, 13, 200), (1, 64, 11, 11, 128))     # odd pixels, C past one chunk


def twin(s, rows: bool):
    """Schedule s reading A through the tiled map (rows) or the im2col map: the candidates carry a_rows now."""
    return wg.tma_schedule(wg.tma_tile_of(s), int(s["bk"]), persistent=wg.is_persistent(s),
                           split_k=int(s.get("split_k", 1)), a_rows=rows)


def check(dev, small: bool = False) -> int:
    """Every TMA tile with a_rows on odd shapes (small: four tiles on the first): bias + residual + ReLU
    against float64, NaN-filled output."""
    bad = 0
    for i, (n, c, h, w_, co) in enumerate(CHECKS[:1] if small else CHECKS):
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(n, c, h, w_, device="cuda", generator=g).half().to(memory_format=CL)
        w = (torch.randn(co, c, 1, 1, device="cuda", generator=g) / c ** 0.5).half()
        b = torch.randn(co, device="cuda", generator=g).half()
        r = torch.randn(n, co, h, w_, device="cuda", generator=g).half().to(memory_format=CL)
        ref = torch.relu(F.conv2d(x.double(), w.double(), b.double()) + r.double())
        p, _ = picked((n, c, h, w_), (co, c, 1, 1), {}, "float16", has_b=True)
        scheds = [wg.tma_schedule(t, wg.bk_of(p), persistent=pers, split_k=k, a_rows=True)
                  for t in wg.TMA_TILES for pers, k in ((False, 1), (True, 1), (False, 2)) if not (len(t) > 5 and k > 1)]
        if small:
            scheds = scheds[::10]
        for s in scheds:
            try:
                op.plan(p, s, dev)
            except Exception:                         # a tile the problem cannot take
                continue
            out = torch.full_like(r, float("nan"))
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation="relu")
            err = rel_err(y, ref) if not torch.isnan(y).any() else float("nan")
            if not err <= 4e-3:
                bad += 1
                print(f"FAIL {(n, c, h, w_, co)} {dict(s.params)} err {err}", flush=True)
    print(f"check: {len(CHECKS)} shapes, {bad} failed", flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "a_rows.json"))
    ap.add_argument("--small", action="store_true", help="a few checks only (what the sanitizers run)")
    ap.add_argument("--sanitize", action="store_true")
    args = ap.parse_args()
    if args.sanitize:
        rc = 0
        for tool in ("memcheck", "racecheck", "synccheck"):
            r = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", sys.executable, __file__,
                                "--small"], capture_output=True, text=True)
            summary = [ln for ln in (r.stdout + r.stderr).splitlines() if "ERROR SUMMARY" in ln or "RACECHECK" in ln
                       or "check:" in ln]
            print(f"{tool}: rc {r.returncode} {summary}", flush=True)
            rc |= r.returncode
        return rc
    torch.backends.cudnn.benchmark = True
    dev = jitops.get_backend().device
    failed = check(dev, args.small)
    if args.small:
        return 1 if failed else 0
    rows = []
    for n, c, hw, co in LAYERS:
        x, w, ref = layer_tensors(n, c, hw, co)
        p, pick = picked((n, c, hw, hw), (co, c, 1, 1), {}, "float16")
        cands = sorted(wg.tma_candidates(p, dev), key=lambda s: estimate(p, s, dev))[:args.top]
        if wg.is_tma(pick) and pick not in cands:
            cands.append(pick)
        res = {"layer": [n, c, hw, co], "pick": dict(pick.params), "im2col": {}, "rows": {}}
        for s in cands:
            for kind, sc in (("im2col", twin(s, False)), ("rows", twin(s, True))):
                y = jitops.conv2d(x, w, schedule=sc)
                err = rel_err(y, ref)
                if not err <= 4e-3:
                    failed += 1
                    print(f"FAIL {res['layer']} {kind} {dict(sc.params)} err {err}", flush=True)
                    continue
                res[kind][json.dumps(dict(s.params), sort_keys=True)] = graph_us(lambda: jitops.conv2d(x, w, schedule=sc))
        res["pick_us"] = graph_us(lambda: jitops.conv2d(x, w))
        res["cudnn"] = vendor_times(x.contiguous(), w, None, {})
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                F.conv2d(x, w.to(memory_format=CL))
            torch.cuda.synchronize()
        res["cudnn_kernels"] = sorted({e.name[:100] for e in prof.events()
                                       if e.device_type == torch.autograd.DeviceType.CUDA})
        rows.append(res)
        same = [(k, res["im2col"][k], res["rows"][k]) for k in res["im2col"] if k in res["rows"]]
        bi = min(res["im2col"].values())
        br = min(res["rows"].values())
        cud = min(res["cudnn"].values())
        print(f"{n}x{c}x{hw}->{co}: cudnn {cud:6.2f} pick {res['pick_us']:6.2f} best im2col {bi:6.2f} best rows "
              f"{br:6.2f} (rows/im2col same tile: {', '.join(f'{a / b:.3f}' for _, a, b in same)}) "
              f"| {res['cudnn_kernels']}", flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
