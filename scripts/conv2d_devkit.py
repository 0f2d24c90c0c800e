"""Shared helpers of the conv2d device scripts (scripts/device_conv2d.py and its sections in
scripts/conv2d_layers.py, scripts/conv2d_tf32.py): float64 reference, graph-replay timing, cases,
cuDNN and jitops timings, JSON output."""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jitops  # noqa: E402
from jitops.bench.timing import Timer  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402

op = get_op("conv2d")
timer = Timer(torch)
PEAK = 989e12          # dense fp16 / bf16 tensor peak, H100 SXM / H200
PEAK_TF32 = 494e12     # dense TF32 tensor peak, H100 SXM
TDT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
CL = torch.channels_last
T0 = time.time()


def left(budget: float) -> float:
    """Seconds left of `budget`, counted from the script's start."""
    return budget - (time.time() - T0)


def ref_f64(x, w, b, stride, pad, dil, groups, residual=None, act=None, alpha=0.01):
    """float64 convolution as padding + unfold + a matmul per group (independent of every kernel)."""
    t, l, bo, r = pad
    xp = F.pad(x.double().contiguous(), (l, r, t, bo))
    n, cin = xp.shape[:2]
    cout, cg, kh, kw = w.shape
    cols = F.unfold(xp, (kh, kw), dilation=dil, stride=stride)               # n x (cin*kh*kw) x L
    oh = (xp.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    cols = cols.reshape(n, groups, cg * kh * kw, oh * ow)
    wg = w.double().reshape(groups, cout // groups, cg * kh * kw)
    y = torch.einsum("gok,ngkl->ngol", wg, cols).reshape(n, cout, oh, ow)
    if b is not None:
        y = y + b.double()[None, :, None, None]
    if residual is not None:
        y = y + residual.double()
    if act == "relu":
        y = torch.relu(y)
    elif act == "leaky_relu":
        y = torch.where(y < 0, alpha * y, y)
    return y


def rel_err(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def graph_us(fn) -> float:
    us = timer.graph_us(fn, n=20, trials=5)
    return us if us is not None else timer.per_call_us(fn, n=20)


def dump(out_dir: str, name: str, data) -> None:
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)


def pads4(padding) -> tuple:
    if isinstance(padding, int):
        return (padding,) * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding)


def pair(v) -> tuple:
    return (v, v) if isinstance(v, int) else tuple(v)


def geo(rs: list) -> dict:
    return {"n": len(rs), "geomean": math.exp(sum(map(math.log, rs)) / len(rs)), "min": min(rs)} if rs else {}


def layer_tensors(n: int, c: int, hw: int, co: int, k: int = 1, stride: int = 1):
    """A square fp16 channels_last layer padded by k // 2: x, weights scaled by 1 / sqrt(fan-in), the float64 output."""
    x = torch.randn(n, c, hw, hw, device="cuda").half().to(memory_format=CL)
    w = (torch.randn(co, c, k, k, device="cuda") / (c * k * k) ** 0.5).half()
    return x, w, F.conv2d(x.double(), w.double(), padding=k // 2, stride=stride)


def conv_case(xs, ws, attrs, dtype, has_b=False, has_r=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    td = TDT[dtype]
    x = torch.randn(xs, device="cuda", generator=gen).to(td)
    w = (torch.randn(ws, device="cuda", generator=gen) / math.sqrt(ws[1] * ws[2] * ws[3])).to(td)
    b = torch.randn(ws[0], device="cuda", generator=gen).to(td) if has_b else None
    return x, w, b


def vendor_times(x, w, b, attrs, tf32: bool = False) -> dict:
    """cuDNN (benchmark mode) on NCHW and channels_last tensors; fp32 with or without TF32."""
    st, pd, dl, g = attrs.get("stride", 1), attrs.get("padding", 0), attrs.get("dilation", 1), attrs.get("groups", 1)
    out = {}
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        for layout in ("nchw", "nhwc"):
            xl = x.to(memory_format=CL) if layout == "nhwc" else x
            wl = w.to(memory_format=CL) if layout == "nhwc" else w
            out[layout] = graph_us(lambda: F.conv2d(xl, wl, b, st, pd, dl, g))
    finally:
        torch.backends.cudnn.allow_tf32 = False
    return out


def jitops_times(x, w, b, attrs, schedule=None, layouts=("nchw", "nhwc")) -> dict:
    out = {}
    for layout in layouts:
        xl = x.to(memory_format=CL) if layout == "nhwc" else x
        jitops.conv2d(xl, w, b, schedule=schedule, **attrs)      # compile + prepare outside the graph
        out[layout] = graph_us(lambda: jitops.conv2d(xl, w, b, schedule=schedule, **attrs))
    return out


def picked(xs, ws, attrs, dtype, layout="nhwc", has_b=False):
    spec = {"x": TensorSpec(xs, dtype, layout if layout == "nhwc" else ""), "w": TensorSpec(ws, dtype),
            "bias": TensorSpec((ws[0],), dtype) if has_b else None}
    p = op.make_problem(spec, attrs)
    return p, op.heuristic(p, jitops.get_backend().device)
