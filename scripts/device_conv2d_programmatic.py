"""Programmatic dependent launch for the TMA conv kernel (GPU): the kernel sets up its barriers and
prefetches its tensor maps, then waits for the stream's previous kernel (griddepcontrol.wait) before it
touches memory, so the backend launches it with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION and
its start overlaps the previous kernel's last blocks. This script checks and times it both ways, switched
in one process (jitops.set_programmatic_launch, which binds the plans again):

1. chains of dependent convolutions (each reads the last one's output; the last writes over the first's
   input), fp16 / bf16 / TF32, plain / persistent / split-K picks, eager and inside a CUDA graph, against
   the same chain in float64;
2. ResNet-50 b32's convolutions past the stem (counts, fp16 channels_last, graph replay of 20 calls and
   eager), both ways in alternating turns, cuDNN at its best layout;
3. whole ResNet-50 b32 fp16, both ways in alternating passes, graph replay and eager: torch's modules with
   every conv on jitops (BN / ReLU kernels of torch between them), and the network folded for deployment
   (BN folded into the weights, ReLU and the residual add in the convolutions: jitops kernels follow each
   other) against the same folded network on torch.

    python3 scripts/device_conv2d_programmatic.py OUT_DIR [--passes 3] [--net-passes 2] [--skip chains,layers,nets]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import jitops  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

from conv2d_devkit import CL, TDT, graph_us, rel_err, timer, vendor_times  # noqa: E402
from device_conv2d_deep_ring import RESNET50_B32  # noqa: E402

TOL = {"float16": 6e-3, "bfloat16": 3e-2, "float32": 6e-3}


def set_programmatic(mode: bool | None) -> None:
    """True: every launch; None: auto (graph captures after a jitops kernel); False: never."""
    if mode is not False and not get_backend().can_launch_programmatic():
        raise SystemExit("programmatic dependent launch is not available on this device / driver")
    jitops.set_programmatic_launch(mode)         # launches are bound again


def chain(x, ws, bs, dtype):
    """y1 = relu(conv3x3(x) + b1); y2 = conv1x1(y1) + x (residual); x <- relu(conv1x1(y2)) written over x."""
    extra = {"precision": "tf32"} if dtype == "float32" else {}
    y1 = jitops.conv2d(x, ws[0], bs[0], padding=1, activation="relu", **extra)
    y2 = jitops.conv2d(y1, ws[1], bs[1], residual=x, **extra)
    jitops.conv2d(y2, ws[2], None, activation="relu", out=x, **extra)
    return y1, y2


def chain_f64(x, ws, bs):
    y1 = torch.relu(F.conv2d(x, ws[0], bs[0], padding=1))
    y2 = F.conv2d(y1, ws[1], bs[1]) + x
    return y1, y2, torch.relu(F.conv2d(y2, ws[2]))


def check_chains(mode: bool | None) -> list[dict]:
    rows = []
    # (n, c, hw, mid): a 1-wave persistent pick, a multi-wave one, a small split-K one
    for n, c, hw, mid in ((32, 256, 14, 256), (8, 128, 28, 512), (2, 512, 7, 512)):
        for dtype in ("float16", "bfloat16", "float32"):
            td = TDT[dtype]
            g = torch.Generator(device="cuda").manual_seed(n * c)
            x0 = torch.randn(n, c, hw, hw, device="cuda", generator=g)
            ws = [torch.randn(mid, c, 3, 3, device="cuda", generator=g) / (9 * c) ** 0.5,
                  torch.randn(c, mid, 1, 1, device="cuda", generator=g) / mid ** 0.5,
                  torch.randn(c, c, 1, 1, device="cuda", generator=g) / c ** 0.5]
            bs = [torch.randn(mid, device="cuda", generator=g), torch.randn(c, device="cuda", generator=g)]
            x64, w64, b64 = x0.double(), [w.double() for w in ws], [b.double() for b in bs]
            refs = chain_f64(x64, w64, b64)
            wt, bt = [w.to(td) for w in ws], [b.to(td) for b in bs]
            for graph in (False, True):
                x = x0.to(td).to(memory_format=CL)
                if graph:
                    chain(x.clone(), wt, bt, dtype)        # compile and prepare outside the capture
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    gr = torch.cuda.CUDAGraph()
                    with torch.cuda.stream(s), torch.cuda.graph(gr, stream=s):
                        y1, y2 = chain(x, wt, bt, dtype)
                    torch.cuda.current_stream().wait_stream(s)
                    x.copy_(x0.to(td).to(memory_format=CL))
                    y1.fill_(float("nan"))
                    y2.fill_(float("nan"))
                    gr.replay()
                else:
                    y1, y2 = chain(x, wt, bt, dtype)
                torch.cuda.synchronize()
                errs = [rel_err(a, r) for a, r in zip((y1, y2, x), refs)]
                ok = all(e <= TOL[dtype] for e in errs)
                rows.append({"shape": [n, c, hw, mid], "dtype": dtype, "graph": graph, "errs": errs, "ok": ok,
                             "mode": {True: "on", None: "auto"}[mode]})
                print(f"chain ({rows[-1]['mode']}) n={n} c={c} hw={hw} mid={mid} {dtype:8s} {'graph' if graph else 'eager'}: "
                      f"errs {' '.join(f'{e:.1e}' for e in errs)} {'ok' if ok else 'WRONG'}", flush=True)
    return rows


def time_layers(passes: int) -> list[dict]:
    rows = []
    for count, n, c, hw, co, k, stride in RESNET50_B32:
        x = torch.randn(n, c, hw, hw, device="cuda").half().to(memory_format=CL)
        w = (torch.randn(co, c, k, k, device="cuda") / (c * k * k) ** 0.5).half()
        attrs = {"padding": k // 2, "stride": stride}
        t = {"off": [], "auto": [], "on": [], "off_eager": [], "auto_eager": [], "on_eager": []}
        fn = lambda: jitops.conv2d(x, w, **attrs)           # noqa: E731
        for _ in range(passes):
            for label, mode in MODES.items():
                set_programmatic(mode)
                fn()
                t[label].append(graph_us(fn))
                t[label + "_eager"].append(timer.per_call_us(fn, n=20))
        cudnn = min(vendor_times(x.contiguous(), w, None, attrs).values())
        row = {"layer": [n, c, hw, co, k, stride], "count": count, "cudnn_us": cudnn, "times": t,
               **{k: min(v) for k, v in t.items()}}
        rows.append(row)
        print(f"{str(row['layer']):28s} x{count} graph off {row['off']:6.2f} auto {row['auto']:6.2f} on {row['on']:6.2f}"
              f" us, eager {row['off_eager']:6.2f} / {row['auto_eager']:6.2f} / {row['on_eager']:6.2f}  cuDNN "
              f"{cudnn:6.2f}: {cudnn / row['off']:.3f} / {cudnn / row['auto']:.3f} / {cudnn / row['on']:.3f}x", flush=True)
    tot = {k: sum(r["count"] * r[k] for r in rows) for k in (*t, "cudnn_us")}
    print(f"ResNet-50 b32, {len(rows)} layers count-weighted: cuDNN {tot['cudnn_us']:.1f} us; graph " + ", ".join(
        f"{m} {tot[m]:.1f} ({tot['cudnn_us'] / tot[m]:.3f}x)" for m in MODES) + "; eager " + ", ".join(
        f"{m} {tot[m + '_eager']:.1f}" for m in MODES), flush=True)
    return rows


MODES = {"off": False, "auto": None, "on": True}


def folded_resnet50(dtype):
    """ResNet-50 as deployed: each BatchNorm folded into its convolution's weights and bias, ReLU and the
    residual add in the convolution; forward(x, conv) with conv(x, w, b, stride, padding, relu, residual)."""
    import torchvision.models as tvm
    from device_conv2d_networks import calibrate
    torch.manual_seed(0)
    m = tvm.resnet50().cuda()
    calibrate(m)

    def fold(conv, bn):
        s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        w = (conv.weight * s[:, None, None, None]).detach().to(dtype)
        return w, (bn.bias - bn.running_mean * s).detach().to(dtype), conv.stride, conv.padding

    stem = fold(m.conv1, m.bn1)
    blocks = [(fold(b.conv1, b.bn1), fold(b.conv2, b.bn2), fold(b.conv3, b.bn3),
               fold(b.downsample[0], b.downsample[1]) if b.downsample is not None else None)
              for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    fw, fb = m.fc.weight.detach().to(dtype), m.fc.bias.detach().to(dtype)

    def forward(x, conv):
        x = conv(x, *stem, True, None)
        x = F.max_pool2d(x, 3, 2, 1)
        for c1, c2, c3, ds in blocks:
            idt = conv(x, *ds, False, None) if ds is not None else x
            y = conv(conv(x, *c1, True, None), *c2, True, None)
            x = conv(y, *c3, True, idt)
        return F.linear(x.mean((2, 3)), fw.to(x.dtype), fb.to(x.dtype))
    return forward


def torch_conv(x, w, b, stride, padding, relu, residual):
    y = F.conv2d(x, w, b, stride, padding)
    if residual is not None:
        y = y + residual
    return torch.relu_(y) if relu else y


def jitops_conv(x, w, b, stride, padding, relu, residual):
    return jitops.conv2d(x, w, b, stride=stride, padding=padding, residual=residual,
                         **({"activation": "relu"} if relu else {}))


def nets_ab(passes: int) -> dict:
    """Whole ResNet-50 b32 fp16 both ways: torch's modules with the convolutions on jitops, and the folded
    network all on jitops convolutions (against the folded network on torch); graph replay and eager."""
    from device_conv2d_networks import calibrate, swap_convs
    import torchvision.models as tvm
    out: dict = {}
    torch.manual_seed(0)
    m32 = tvm.resnet50().cuda()
    calibrate(m32)
    x = torch.randn(32, 3, 224, 224, device="cuda").half().to(memory_format=CL)
    with torch.no_grad():
        model = tvm.resnet50().eval().cuda()
        model.load_state_dict(m32.state_dict())
        model = model.half().to(memory_format=CL)
        jit = tvm.resnet50().eval().cuda()
        jit.load_state_dict(m32.state_dict())
        jit = jit.half().to(memory_format=CL)
        swap_convs(jit)
        folded = folded_resnet50(torch.float16)
        ref = folded(x.double().contiguous(), lambda x, w, b, st, pd, relu, r: torch_conv(
            x, w.double(), b.double(), st, pd, relu, r))
        runs = {"modules": (lambda: model(x), lambda: jit(x)),
                "folded": (lambda: folded(x, torch_conv), lambda: folded(x, jitops_conv))}
        for net, (vendor, ours) in runs.items():
            res = {k: {"graph": [], "eager": []} for k in (*MODES, "torch")}
            for _ in range(passes):
                for mode, on in MODES.items():
                    set_programmatic(on)
                    y = ours()
                    torch.cuda.synchronize()
                    res[mode]["graph"].append(graph_us(ours))
                    res[mode]["eager"].append(timer.per_call_us(ours, n=5))
                res["torch"]["graph"].append(graph_us(vendor))
                res["torch"]["eager"].append(timer.per_call_us(vendor, n=5))
            best = {k: {t: min(v[t]) for t in v} for k, v in res.items()}
            err = rel_err(y, ref) if net == "folded" else rel_err(y, model(x).double())
            out[net] = {"times": res, "best": best, "err": err}
            print(f"resnet50 b32 fp16 {net}: err {err:.1e}; " + "; ".join(
                f"{k} graph {v['graph']:.0f} eager {v['eager']:.0f} us" for k, v in best.items()), flush=True)
            tg, te = best["torch"]["graph"], best["torch"]["eager"]
            print("   vs torch (graph / eager): " + ", ".join(
                f"{k} {tg / best[k]['graph']:.3f} / {te / best[k]['eager']:.3f}" for k in MODES), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--net-passes", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of: chains, layers, nets")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    out: dict = {}
    skip = set(args.skip.split(","))
    if "chains" not in skip:
        out["chains"] = []
        for mode in (True, None):
            set_programmatic(mode)
            out["chains"] += check_chains(mode)
        if not all(r["ok"] for r in out["chains"]):
            print("WRONG results: not timing", flush=True)
            json.dump(out, open(os.path.join(args.out, "programmatic.json"), "w"), indent=1)
            raise SystemExit(1)
    if "layers" not in skip:
        out["layers"] = time_layers(args.passes)
        json.dump(out, open(os.path.join(args.out, "programmatic.json"), "w"), indent=1)
    if "nets" not in skip:
        out["nets_ab"] = nets_ab(args.net_passes)
    json.dump(out, open(os.path.join(args.out, "programmatic.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
