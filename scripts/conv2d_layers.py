"""The conv layers of torchvision ResNet-50/18, MobileNet-V3-L, EfficientNet-B0 and ConvNeXt-T at
batch 8 (forward hooks, random weights): jitops against cuDNN on each distinct layer, graph replay.
Sections "layers" (fp16 channels_last vs cuDNN at its best of NCHW / channels_last; with sweep,
every matrix-core candidate for the cost model) and "layers_tf32" (fp32: jitops tf32 / 3xtf32 on
channels_last against cuDNN with and without TF32, and jitops' exact fp32 kernels)."""
from __future__ import annotations

import torch

import jitops
from jitops.ops import conv2d_mma as mma

from conv2d_devkit import (CL, conv_case, dump, geo, graph_us, jitops_times, left, pads4, pair, picked,
                           ref_f64, rel_err, vendor_times)

NETS = ("resnet50", "resnet18", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny")


def collect_layers() -> list:
    import torchvision.models as tvm
    seen, layers = set(), []
    for name in NETS:
        model = getattr(tvm, name)().eval().cuda()
        found = []

        def hook(mod, inp, _out, found=found):
            x = inp[0]
            key = (tuple(x.shape), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation, mod.groups,
                   mod.bias is not None)
            found.append(key)
        hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            model(torch.randn(8, 3, 224, 224, device="cuda"))
        for h in hs:
            h.remove()
        for key in found:
            if key not in seen:
                seen.add(key)
                layers.append((name, key))
        del model
    return layers


def sweep_mma(p, xl, w, b, attrs) -> dict:
    """Graph-replay time of every matrix-core candidate (for fitting the cost model)."""
    out = {}
    for c in mma.candidates(p, jitops.get_backend().device):
        try:
            jitops.conv2d(xl, w, b, schedule=c, **attrs)
            out[str(c)] = graph_us(lambda: jitops.conv2d(xl, w, b, schedule=c, **attrs))
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is data too
            out[str(c)] = f"error: {exc}"[:200]
    return out


def summarize_nets(rows: list, key: str = "ratio") -> dict:
    ok = [r for r in rows if key in r]
    out = {net: geo([r[key] for r in ok if r["net"] == net]) for net in sorted({r["net"] for r in ok})}
    out["all"] = geo([r[key] for r in ok])
    out["errors"] = len(rows) - len(ok)
    return out


def section_layers(out_dir: str, layers: list, budget: float, sweep: bool) -> dict:
    rows = []
    for net, (xs, ws, st, pd, dl, g, has_b) in layers:
        if left(budget) < 0:
            print("layers: out of time", flush=True)
            break
        attrs = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
        x, w, b = conv_case(xs, ws, attrs, "float16", has_b)
        try:
            p, s = picked(xs, ws, attrs, "float16", "nhwc", has_b)
            ven = vendor_times(x, w, b, attrs)
            jit = jitops_times(x, w, b, attrs, layouts=("nhwc",))
        except Exception as exc:  # noqa: BLE001
            rows.append({"net": net, "x": xs, "w": ws, "error": str(exc)[:300]})
            continue
        ratio = min(ven.values()) / jit["nhwc"]
        row = {"net": net, "x": xs, "w": ws, "attrs": attrs, "flops": p.flops, "vendor_us": ven,
               "jitops_us": jit, "ratio": ratio, "pick": str(s), "tflops": p.flops / jit["nhwc"] / 1e6}
        if sweep and mma.why_not(p) is None:
            row["mma_candidates_nhwc_us"] = sweep_mma(p, x.to(memory_format=CL), w, b, attrs)
        rows.append(row)
        print(f"layer {net:18} x={xs} w={ws} s={st} g={g}: cuDNN {min(ven.values()):7.1f} jitops {jit['nhwc']:7.1f} "
              f"ratio {ratio:.2f} {s.algorithm}", flush=True)
    dump(out_dir, "layers", rows)
    return summarize_nets(rows)


def tf32_row(xs, ws, attrs, has_b=False) -> dict:
    """fp32 timings of one problem: cuDNN with / without TF32 (best of NCHW and channels_last),
    jitops tf32 and 3xtf32 (channels_last) and "highest" (NCHW: its exact kernels' own layout);
    errors of each jitops mode against float64."""
    x, w, b = conv_case(xs, ws, attrs, "float32", has_b)
    ven_tf32 = vendor_times(x, w, b, attrs, tf32=True)
    ven_fp32 = vendor_times(x, w, b, attrs, tf32=False)
    ref = ref_f64(x, w, b, pair(attrs.get("stride", 1)), pads4(attrs.get("padding", 0)),
                  pair(attrs.get("dilation", 1)), attrs.get("groups", 1))
    row = {"vendor_tf32_us": ven_tf32, "vendor_fp32_us": ven_fp32}
    for prec, layout in (("tf32", "nhwc"), ("3xtf32", "nhwc"), ("highest", "nchw")):
        a = {**attrs, "precision": prec}
        row[f"{prec}_us"] = jitops_times(x, w, b, a, layouts=(layout,))[layout]
        xl = x.to(memory_format=CL) if layout == "nhwc" else x
        row[f"{prec}_err"] = rel_err(jitops.conv2d(xl, w, b, **a), ref)
        row[f"{prec}_pick"] = str(picked(xs, ws, a, "float32", layout, has_b)[1])
    row["ratio_tf32"] = min(ven_tf32.values()) / row["tf32_us"]             # vs cuDNN TF32
    row["ratio_3xtf32"] = min(ven_fp32.values()) / row["3xtf32_us"]         # vs cuDNN without TF32
    row["x3_vs_highest"] = row["highest_us"] / row["3xtf32_us"]
    return row


def section_layers_tf32(out_dir: str, layers: list, budget: float) -> dict:
    rows = []
    for net, (xs, ws, st, pd, dl, g, has_b) in layers:
        if left(budget) < 0:
            print("layers_tf32: out of time", flush=True)
            break
        attrs = {"stride": st, "padding": pd, "dilation": dl, "groups": g}
        p, _ = picked(xs, ws, {**attrs, "precision": "tf32"}, "float32", "nhwc", has_b)
        if mma.why_not(p) is not None:
            continue
        try:
            row = {"net": net, "x": xs, "w": ws, "attrs": attrs, "flops": p.flops, **tf32_row(xs, ws, attrs, has_b)}
        except Exception as exc:  # noqa: BLE001
            rows.append({"net": net, "x": xs, "w": ws, "error": str(exc)[:300]})
            continue
        rows.append(row)
        print(f"tf32 layer {net:18} x={xs} w={ws} s={st}: cuDNN tf32 {min(row['vendor_tf32_us'].values()):7.1f} "
              f"jit tf32 {row['tf32_us']:7.1f} ({row['ratio_tf32']:.2f}) | cuDNN fp32 "
              f"{min(row['vendor_fp32_us'].values()):7.1f} jit 3x {row['3xtf32_us']:7.1f} ({row['ratio_3xtf32']:.2f}) "
              f"highest {row['highest_us']:7.1f} | err {row['tf32_err']:.1e} {row['3xtf32_err']:.1e} "
              f"{row['highest_err']:.1e}", flush=True)
        dump(out_dir, "layers_tf32", rows)
    dump(out_dir, "layers_tf32", rows)
    return {k: summarize_nets(rows, k) for k in ("ratio_tf32", "ratio_3xtf32", "x3_vs_highest")}
