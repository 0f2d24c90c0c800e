"""Whole torchvision networks with every nn.Conv2d swapped for jitops.conv2d, against the same
network in torch (cuDNN, benchmark mode), fp16 or bf16, channels_last (or NCHW with --layout nchw,
on both sides: torch's default memory format), random weights, CUDA-graph replay of the whole
forward. Nothing else changes: BatchNorm, activations, pooling and the
classifier stay torch modules on both sides, so the ratio is what the convolutions alone give
a user who swaps them in. Outputs are compared with the fp32 network (torch, no TF32), whose
BatchNorm statistics are first calibrated on random batches (calibrate) so that outputs are not
all zero or inf.

  python3 scripts/device_conv2d_networks.py OUT_DIR [--nets resnet50,mobilenet_v3_large] [--batch 8]
      [--layout nchw] [--layers]
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
import jitops  # noqa: E402
from conv2d_devkit import graph_us, picked, rel_err  # noqa: E402

NETS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "regnet_y_1_6gf")
# Input sizes other than 224 (as device_conv2d_pool_sweep.SIZES: the sweeps' layers are these networks' layers;
# Inception-v3's auxiliary head, run in train mode by calibrate, also needs 299)
SIZES = {"inception_v3": 299}
CL = torch.channels_last          # the memory format of both sides (--layout nchw: torch.contiguous_format)


class JitConv(torch.nn.Module):
    """An nn.Conv2d's weights and attributes, run by jitops.conv2d."""

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(f"{conv}: only zero padding given as numbers")
        self.weight, self.bias = conv.weight, conv.bias
        self.attrs = {"stride": conv.stride, "padding": conv.padding, "dilation": conv.dilation,
                      "groups": conv.groups}

    def forward(self, x):
        return jitops.conv2d(x, self.weight, self.bias, **self.attrs)


def swap_convs(module: torch.nn.Module) -> int:
    n = 0
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Conv2d):
            setattr(module, name, JitConv(child))
            n += 1
        else:
            n += swap_convs(child)
    return n


def calibrate(model: torch.nn.Module, size: int = 224, batches: int = 2) -> None:
    """BatchNorm running statistics from random inputs (cumulative over a few batches in train mode):
    with torchvision's initial statistics (mean 0, variance 1) the activations of MobileNet / EfficientNet
    shrink or overflow layer by layer in fp16 and both outputs come out all zero or inf, which makes the
    error check vacuous; with batch statistics every layer sees unit-scale inputs, as trained weights do."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, size, size, device="cuda"))
    model.eval()


def run_net(name: str, batch: int, dtype: torch.dtype) -> dict:
    import torchvision.models as tvm
    torch.manual_seed(0)
    model32 = getattr(tvm, name)().cuda()
    size = SIZES.get(name, 224)
    calibrate(model32, size)
    x32 = torch.randn(batch, 3, size, size, device="cuda")
    with torch.no_grad():
        ref = model32(x32).double()
        model = getattr(tvm, name)().eval().cuda()
        model.load_state_dict(model32.state_dict())
        model = model.to(dtype).to(memory_format=CL)
        jit = getattr(tvm, name)().eval().cuda()
        jit.load_state_dict(model32.state_dict())
        jit = jit.to(dtype).to(memory_format=CL)
        convs = swap_convs(jit)
        x = x32.to(dtype).to(memory_format=CL)
        t0 = time.time()
        y_j = jit(x)                                   # compiles every distinct layer
        torch.cuda.synchronize()
        first_s = time.time() - t0
        y_t = model(x)
        res = {"net": name, "batch": batch, "dtype": str(dtype).split(".")[-1], "convs": convs,
               "first_call_s": first_s, "err_torch_vs_fp32": rel_err(y_t, ref),
               "err_jitops_vs_fp32": rel_err(y_j, ref), "err_jitops_vs_torch": rel_err(y_j, y_t.double()),
               "ref_max_abs": float(ref.abs().max())}
        res["torch_us"] = graph_us(lambda: model(x))
        res["jitops_us"] = graph_us(lambda: jit(x))
        res["torch_us_2"] = graph_us(lambda: model(x))     # the vendor side again: the run's spread
    res["ratio"] = min(res["torch_us"], res["torch_us_2"]) / res["jitops_us"]
    print(f"{name:20} b{batch} {res['dtype']:8} {convs:3} convs  torch {res['torch_us']:8.0f} / "
          f"{res['torch_us_2']:8.0f} us  jitops {res['jitops_us']:8.0f} us  ratio {res['ratio']:.2f}  "
          f"first call {first_s:.1f} s  err vs fp32: torch {res['err_torch_vs_fp32']:.1e} "
          f"jitops {res['err_jitops_vs_fp32']:.1e} (max |out| {res['ref_max_abs']:.2g})", flush=True)
    return res


def per_layer(name: str, batch: int, dtype: torch.dtype) -> list[dict]:
    """Each distinct conv of the network: jitops' pick against cuDNN on the same channels_last
    tensors (graph replay), slowest ratio first, with how many times the forward runs it (the totals
    weigh each layer by that count: the convolutions' share of the whole-network ratio)."""
    import torch.nn.functional as F
    import torchvision.models as tvm
    model = getattr(tvm, name)().eval().cuda().to(dtype).to(memory_format=CL)
    counts, layers = {}, []

    def hook(mod, inp, _out):
        key = (tuple(inp[0].shape), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation, mod.groups)
        if key not in counts:
            layers.append((key, mod))
        counts[key] = counts.get(key, 0) + 1
    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        size = SIZES.get(name, 224)
        model(torch.randn(batch, 3, size, size, device="cuda", dtype=dtype).to(memory_format=CL))
    for h in hs:
        h.remove()
    rows = []
    with torch.no_grad():
        for (xs, ws, st, pd, dl, g), mod in layers:
            x = torch.randn(xs, device="cuda", dtype=dtype).to(memory_format=CL)
            w, b = mod.weight, mod.bias
            attrs = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
            jitops.conv2d(x, w, b, **attrs)
            t_j = graph_us(lambda: jitops.conv2d(x, w, b, **attrs))
            t_v = graph_us(lambda: F.conv2d(x, w, b, st, pd, dl, g))
            _, s = picked(xs, ws, attrs, str(dtype).split(".")[-1], "nhwc" if CL == torch.channels_last else "",
                          b is not None)
            rows.append({"x": xs, "w": ws, "attrs": attrs, "jitops_us": t_j, "cudnn_us": t_v, "ratio": t_v / t_j,
                         "pick": str(s), "count": counts[(xs, ws, st, pd, dl, g)]})
    rows.sort(key=lambda r: r["ratio"])
    t_j, t_v = (sum(r["count"] * r[k] for r in rows) for k in ("jitops_us", "cudnn_us"))
    print(f"  {name} b{batch} {dtype}: {sum(r['count'] for r in rows)} convs, {len(rows)} distinct; weighted by count "
          f"jitops {t_j:.0f} us, cuDNN {t_v:.0f} us, ratio {t_v / t_j:.3f}", flush=True)
    for r in rows[:20]:
        print(f"  {r['count']:2}x {name} x={r['x']} w={r['w']} s={r['attrs']['stride']} g={r['attrs']['groups']}: jitops "
              f"{r['jitops_us']:7.1f} cuDNN {r['cudnn_us']:7.1f} ratio {r['ratio']:.2f} {r['pick'][:70]}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--layers", action="store_true", help="time each distinct conv of the networks instead")
    ap.add_argument("--layout", choices=("channels_last", "nchw"), default="channels_last")
    args = ap.parse_args()
    global CL
    if args.layout == "nchw":
        CL = torch.contiguous_format
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    if args.layers:
        for name in args.nets.split(","):
            rows += [{"net": name, **r} for r in per_layer(name, args.batch, getattr(torch, args.dtypes))]
        with open(os.path.join(args.out, f"network_layers_{args.layout}.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
        return
    for dt in args.dtypes.split(","):
        for name in args.nets.split(","):
            try:
                rows.append(run_net(name, args.batch, getattr(torch, dt)))
            except Exception as exc:  # noqa: BLE001 - a network that fails is a result too
                print(f"{name} {dt}: ERROR {exc}", flush=True)
                rows.append({"net": name, "dtype": dt, "error": str(exc)[:400]})
            with open(os.path.join(args.out, f"networks_{args.layout}.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
