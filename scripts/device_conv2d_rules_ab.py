"""Whole torchvision networks with every conv swapped for jitops.conv2d (BN / ReLU left to torch on both
sides), under the conv2d heuristic's H200 rules of 2026-11-29 and without them, in alternating passes in
one process (the faster pass of each kept), against torch (cuDNN): what the rules change end to end,
beside the per-layer pool sweeps they were chosen on (scripts/device_conv2d_pool_sweep.py).

    python3 scripts/device_conv2d_rules_ab.py OUT_DIR [--nets resnet50,densenet121,...] [--batch 32]
        [--dtypes float16] [--passes 2]

Without the rules: TMA_LONE_SHARE 0.5 (a lone block charged two waves), TMA_MARGIN_WHOLE = TMA_MARGIN,
TMA_WIDE_FILTER_MIN_COUT 0, TMA_MIN_FLOPS_FAST_MEMORY = TMA_MIN_FLOPS. Raw results: OUT_DIR/rules_ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from jitops import engine  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402

from device_conv2d_networks import run_net  # noqa: E402

NEW = {"TMA_LONE_SHARE": wg.TMA_LONE_SHARE, "TMA_MARGIN_WHOLE": wg.TMA_MARGIN_WHOLE,
       "TMA_WIDE_FILTER_MIN_COUT": wg.TMA_WIDE_FILTER_MIN_COUT, "TMA_MIN_FLOPS_FAST_MEMORY": wg.TMA_MIN_FLOPS_FAST_MEMORY}
OLD = {"TMA_LONE_SHARE": 0.5, "TMA_MARGIN_WHOLE": wg.TMA_MARGIN, "TMA_WIDE_FILTER_MIN_COUT": 0,
       "TMA_MIN_FLOPS_FAST_MEMORY": wg.TMA_MIN_FLOPS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--nets", default="resnet50,densenet121,efficientnet_b0,mobilenet_v3_large")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    rows = []
    for dtype in args.dtypes.split(","):
        for net in args.nets.split(","):
            res = {"old": [], "new": []}
            for _ in range(args.passes):
                for label, consts in (("old", OLD), ("new", NEW)):
                    for k, v in consts.items():
                        setattr(wg, k, v)
                    engine.clear_prepared()                 # picks are made again under these constants
                    print(f"  {label}: ", end="", flush=True)
                    res[label].append(run_net(net, args.batch, getattr(torch, dtype)))
            best = {k: min(v, key=lambda r: r["jitops_us"]) for k, v in res.items()}
            torch_us = min(min(r["torch_us"], r["torch_us_2"]) for v in res.values() for r in v)
            row = {"net": net, "dtype": dtype, "batch": args.batch, "torch_us": torch_us,
                   "old_us": best["old"]["jitops_us"], "new_us": best["new"]["jitops_us"], "passes": res}
            rows.append(row)
            print(f"{net:20} b{args.batch} {dtype:8} torch {torch_us:8.0f} us  old rules {row['old_us']:8.0f} us "
                  f"({torch_us / row['old_us']:.3f}x)  new rules {row['new_us']:8.0f} us ({torch_us / row['new_us']:.3f}x)"
                  f"  new / old {row['old_us'] / row['new_us']:.3f}x", flush=True)
            with open(os.path.join(args.out, "rules_ab.json"), "w") as f:
                json.dump(rows, f, indent=1)
    for k, v in NEW.items():
        setattr(wg, k, v)


if __name__ == "__main__":
    main()
