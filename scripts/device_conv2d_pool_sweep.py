"""Every schedule the conv2d heuristic chooses from, timed on real networks' layers, on the device, one
call: the distinct ungrouped convolutions of torchvision networks (forward hooks, random weights) and
the 19 large benchmark layers, fp16 channels_last; per layer each schedule of the heuristic's pool
estimated within 2.5x of its pick, and every other algorithm's best-rated one, checked against float64 in
a NaN-filled output, then timed by graph replay; cuDNN (benchmark mode, best of NCHW / channels_last) beside. The data for refitting
the cost model on a device and for scoring a heuristic by what its picks lose against the fastest
schedule of the pool ("regret", scripts/conv2d_pick_regret.py).

    python3 scripts/device_conv2d_pool_sweep.py OUT_DIR [--nets resnet50:32,resnet50:8,...] [--big]
        [--budget SECONDS] [--dtype float16] [--skip EARLIER_pool_sweep.json] [--max-flops F]
        [--tma-min-flops F]

Raw results: OUT_DIR/pool_sweep.json (rewritten after every layer).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.ops import conv2d_schedules as S  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402
from jitops.ops.conv2d_cost import estimate  # noqa: E402
from jitops.prepared import clear_prepared  # noqa: E402

from conv2d_pick_regret import layout_of  # noqa: E402
from conv2d_devkit import CL, TDT, graph_us, pads4, pair, ref_f64, rel_err, vendor_times  # noqa: E402
from device_conv2d_wgmma import BIG  # noqa: E402

OP = get_op("conv2d")
T0 = time.time()
TOL = {"float16": 4e-3, "bfloat16": 2e-2}
NETS = "resnet50:32,resnet50:8,efficientnet_b0:32,inception_v3:32,densenet121:32,vgg16:8,mobilenet_v3_large:32"
SIZES = {"inception_v3": 299}
RANGE = 2.5


def network_layers(net: str, batch: int) -> list:
    """(name, x shape, w shape, attrs, count) of the distinct ungrouped convolutions of a torchvision net."""
    import torchvision.models as tvm
    kw = {"aux_logits": True, "init_weights": False} if net == "inception_v3" else {}
    model = getattr(tvm, net)(**kw).eval()
    found: dict = {}

    def hook(mod, inp, _out):
        if mod.groups != 1 or not isinstance(mod.padding, tuple):
            return
        key = ((batch, *tuple(inp[0].shape)[1:]), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation)
        found[key] = found.get(key, 0) + 1
    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    size = SIZES.get(net, 224)
    with torch.no_grad():
        model(torch.randn(1, 3, size, size))
    for h in hooks:
        h.remove()
    return [(f"{net} b{batch} {xs[1]}->{ws[0]} {ws[2]}x{ws[3]} s{st[0]} @{xs[2]}x{xs[3]}", xs, ws,
             {"stride": st, "padding": pd, "dilation": dl}, n) for (xs, ws, st, pd, dl), n in found.items()]


def distinct_layers(nets: str, seen: set | None = None) -> list:
    """network_layers of every "net:batch" in the comma-separated nets, each layer (shapes and attributes)
    once, leaving out those whose key is in seen."""
    seen = set() if seen is None else seen
    layers = []
    for item in nets.split(","):
        net, batch = item.split(":")
        for layer in network_layers(net, int(batch)):
            key = (layer[1], layer[2], str(layer[3]))
            if key not in seen:
                seen.add(key)
                layers.append(layer)
    return layers


def shortlist(p, pick, device) -> list:
    """The pick, every schedule of the pool estimated within RANGE x of it, and each other algorithm's
    best-rated schedule (the pool holds some 200-370 schedules per layer: too many to time them all)."""
    rated = [(estimate(p, s, device), s) for s in S._pool(p, device, None)]
    limit = RANGE * estimate(p, pick, device)
    out = [pick] + [s for t, s in rated if t <= limit]
    for alg in {s.algorithm for _, s in rated}:
        out.append(min((r for r in rated if r[1].algorithm == alg), key=lambda r: r[0])[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--nets", default=NETS)
    ap.add_argument("--big", action="store_true", help="the 19 large benchmark layers first")
    ap.add_argument("--budget", type=float, default=500)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--skip", default="", help="a pool_sweep.json whose layers are not timed again")
    ap.add_argument("--max-flops", type=float, default=0, help="only layers below this many flops")
    ap.add_argument("--tma-min-flops", type=float, default=None,
                    help="conv2d_wgmma.TMA_MIN_FLOPS (and its fast-memory twin) for the pools")
    args = ap.parse_args()
    if args.tma_min_flops is not None:
        from jitops.ops import conv2d_wgmma
        conv2d_wgmma.TMA_MIN_FLOPS = conv2d_wgmma.TMA_MIN_FLOPS_FAST_MEMORY = args.tma_min_flops
    os.makedirs(args.out, exist_ok=True)
    device = jitops.get_backend().device
    print(torch.cuda.get_device_name(), flush=True)
    layers = [(f"big{i}", xs, ws, {"stride": st, "padding": pd}, 1) for i, (xs, ws, st, pd) in enumerate(BIG)] \
        if args.big else []
    seen = set()
    if args.skip:
        with open(args.skip) as f:
            seen = {(tuple(r["x"]), tuple(r["w"]), str({k: tuple(v) if isinstance(v, list) else v
                                                         for k, v in r["attrs"].items()})) for r in json.load(f)}
    layers += distinct_layers(args.nets, seen)
    print(f"{len(layers)} layers", flush=True)
    rows, td = [], TDT[args.dtype]
    for name, xs, ws, attrs, count in layers:
        if time.time() - T0 > args.budget:
            print("budget spent", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(xs, device="cuda", dtype=td, generator=g).to(memory_format=CL)
        w = torch.randn(ws, device="cuda", dtype=td, generator=g) * (ws[1] * ws[2] * ws[3]) ** -0.5
        p = OP.make_problem({"x": TensorSpec(xs, args.dtype, layout_of(xs)), "w": TensorSpec(ws, args.dtype),
                             "bias": None}, attrs)
        if args.max_flops and p.flops >= args.max_flops:
            continue
        pick = OP.heuristic(p, device)
        pool = {str(s): s for s in shortlist(p, pick, device)}
        ref = ref_f64(x, w, None, pair(attrs["stride"]), pads4(attrs["padding"]), pair(attrs.get("dilation", 1)), 1)
        times, errs, failed = {}, {}, {}
        for key, s in pool.items():
            try:
                out = torch.full(tuple(ref.shape), float("nan"), dtype=td, device="cuda").to(memory_format=CL)
                y = jitops.conv2d(x, w, out=out, schedule=s, **attrs)
                torch.cuda.synchronize()
                errs[key] = err = rel_err(y, ref)
                if not err <= TOL[args.dtype]:
                    failed[key] = f"error {err:.3e}"
                    continue
                times[key] = graph_us(lambda: jitops.conv2d(x, w, schedule=s, **attrs))
            except jitops.ScheduleError as e:
                failed[key] = str(e)[:200]
        cudnn = min(vendor_times(x.contiguous(), w, None, attrs).values())
        best = min(times, key=times.get)
        rows.append({"layer": name, "x": xs, "w": ws, "attrs": attrs, "count": count, "cudnn_us": cudnn,
                     "pick": str(pick), "times": times, "errs": errs, "failed": failed})
        print(f"{name:44s} x{count} {len(times):3d} timed  cuDNN {cudnn:6.1f}  pick {times.get(str(pick), 0):6.1f}  "
              f"best {times[best]:6.1f} ({times.get(str(pick), 0) / times[best]:.2f}x)  {best[19:]}"
              + (f"  FAILED {len(failed)}" if failed else "") + f"  ({time.time() - T0:.0f} s)", flush=True)
        for key, why in failed.items():
            if why.startswith("error"):
                print(f"   WRONG RESULT {key}: {why}", flush=True)
        with open(os.path.join(args.out, "pool_sweep.json"), "w") as f:
            json.dump(rows, f, indent=1)
        clear_prepared()            # every schedule's plans, workspaces and graph pools: ~100 GB by 120 layers
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
