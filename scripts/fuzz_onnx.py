"""Random convolutional networks exported by torch, rewritten by jitops, run against ONNX Runtime (CPU).

Why: tests/test_onnx_models.py pins a corpus of model families; users export their own networks, whose
convolutions mix kernel sizes, strides, dilations, groups, biases, BatchNorms, activations, residual
Adds, GroupNorms and channels-last LayerNorms, and whose transformer blocks write attention, masks and
norms in more ways than a corpus lists (family "transformer": draw_transformer). Each model here is drawn
at random, exported with a symbolic batch (opset 13, 14 or 17), mapped and rewritten with no input
shapes, and run three ways at two batch sizes: ONNX Runtime on the original, on the rewrite through
its fallback bodies (no jitops library) and through the jitops kernels (the CPU emulator by default).
A model fails when a rewrite does not pass onnx.checker, when either rewritten run differs from the
original by more than the tolerance, or when anything raises. Each model's layers, the jitops node
types taken and the reasons for nodes kept are written to OUT/fuzz_onnx.jsonl.

    python3 scripts/fuzz_onnx.py [--models 30] [--seed 0] [--family conv|transformer|both] [--dtype float32|float16]
                                 [--backend cpu] [--providers CPUExecutionProvider] [--out DIR]
    (on the device, onnxruntime-gpu: scripts/device_ort_gpu.sh SHA python3 scripts/fuzz_onnx.py --backend cuda
     --providers CUDAExecutionProvider,CPUExecutionProvider ...)
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def draw_layers(rng: random.Random) -> dict:
    """A network: input channels and size, then blocks of conv [+ BN] [+ activation] [+ residual] or a norm."""
    c = rng.choice([1, 3, 4, 8])
    size = rng.choice([9, 12, 16, 20])
    layers, chans, h = [], c, size
    for _ in range(rng.randint(2, 6)):
        kind = rng.choices(["conv", "norm"], weights=[5, 1])[0]
        if kind == "norm":
            norm = rng.choice(["group", "layer_cl"])
            groups = rng.choice([g for g in (1, 2, 4) if chans % g == 0])
            layers.append({"kind": "norm", "norm": norm, "groups": groups, "affine": rng.random() < 0.8,
                           "channels": chans, "act": rng.choice([None, "relu", "leaky"])})
            continue
        k = rng.choice([1, 3, 3, 5, 7])
        cout = rng.choice([chans, chans, 4, 8, 12, 16])
        groups = 1
        if rng.random() < 0.25 and cout == chans and chans > 1:
            groups = chans                                           # depthwise
        elif rng.random() < 0.15:
            groups = rng.choice([g for g in (2, 4) if chans % g == 0 and cout % g == 0] or [1])
        stride = rng.choice([1, 1, 2])
        dilation = rng.choice([1, 1, 2]) if k > 1 else 1
        padding = rng.choice([0, dilation * (k - 1) // 2, dilation * (k - 1) // 2])
        out = (h + 2 * padding - dilation * (k - 1) - 1) // stride + 1
        if out < 1:                                                  # the image is used up: a 1x1 instead
            k, stride, dilation, padding, out = 1, 1, 1, 0, h
        h = out
        residual = stride == 1 and cout == chans and padding == dilation * (k - 1) // 2 and rng.random() < 0.4
        layers.append({"kind": "conv", "cin": chans, "cout": cout, "k": k, "stride": stride, "padding": padding,
                       "dilation": dilation, "groups": groups, "bias": rng.random() < 0.5, "bn": rng.random() < 0.5,
                       "act": rng.choice([None, "relu", "relu", "leaky", "hardswish", "sigmoid", "relu6"]),
                       "residual": residual, "act_after_add": residual and rng.random() < 0.6})
        chans = cout
    return {"cin": c, "size": size, "layers": layers, "opset": rng.choice([13, 14, 17]),
            "head": rng.choice(["mean", "flatten"])}


def draw_transformer(rng: random.Random) -> dict:
    """An encoder / decoder stack: widths, heads, pre- or post-norm, LayerNorm or a written-out RMSNorm, and the
    ways models write attention (nn.MultiheadAttention batch- or sequence-first, q / k / v projections with
    view + permute and matmul + softmax, SDPA), masks (none, a padding mask, a causal tril + masked_fill,
    SDPA's is_causal), the scale as a division or a multiplication."""
    heads = rng.choice([1, 2, 4])
    attn = rng.choice(["mha_batch_first", "mha_seq_first", "manual", "manual", "sdpa", "sdpa"])
    masks = {"mha_batch_first": [None, "padding"], "mha_seq_first": [None],
             "manual": [None, "padding", "causal_tril"], "sdpa": [None, "padding", "causal"]}[attn]
    return {"family": "transformer", "width": heads * rng.choice([8, 16]), "heads": heads,
            "blocks": rng.randint(1, 2), "norm": rng.choice(["layer", "rms"]), "prenorm": rng.random() < 0.6,
            "attn": attn, "mask": rng.choice(masks), "scale": rng.choice(["div", "mul"]),
            "opset": rng.choice([14, 17])}


def build_transformer(spec: dict):
    import torch
    nn, F = torch.nn, torch.nn.functional
    e, h = spec["width"], spec["heads"]

    class RMSNorm(nn.Module):                                     # as Hugging Face writes it
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(e) * 0.2 + 1)

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(var + 1e-6))

    def norm():
        if spec["norm"] == "rms":
            return RMSNorm()
        ln = nn.LayerNorm(e)
        with torch.no_grad():
            ln.weight.normal_(1, 0.2)
            ln.bias.normal_(0, 0.2)
        return ln

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = norm(), norm()
            self.ff = nn.Sequential(nn.Linear(e, 2 * e), nn.GELU(), nn.Linear(2 * e, e))
            if spec["attn"].startswith("mha"):
                self.mha = nn.MultiheadAttention(e, h, batch_first=spec["attn"] == "mha_batch_first")
            else:
                self.q, self.k, self.v, self.o = (nn.Linear(e, e) for _ in range(4))

        def attend(self, x, mask):
            b, s, _ = x.shape
            if spec["attn"] == "mha_batch_first":
                pad = None if mask is None else mask < 0.5
                return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
            if spec["attn"] == "mha_seq_first":
                y = x.transpose(0, 1)
                return self.mha(y, y, y, need_weights=False)[0].transpose(0, 1)
            q, k, v = (f(x).view(b, s, h, e // h).permute(0, 2, 1, 3) for f in (self.q, self.k, self.v))
            if spec["attn"] == "sdpa":
                add = None if spec["mask"] != "padding" else ((1.0 - mask[:, None, None, :]) * -10000.0)
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=add, is_causal=spec["mask"] == "causal")
            else:
                d = e // h
                scores = q @ k.transpose(-1, -2)
                scores = scores / math.sqrt(d) if spec["scale"] == "div" else scores * (d ** -0.5)
                if spec["mask"] == "padding":
                    scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
                elif spec["mask"] == "causal_tril":
                    tril = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
                    scores = scores.masked_fill(~tril, float("-inf"))
                ctx = F.softmax(scores, dim=-1) @ v
            return self.o(ctx.permute(0, 2, 1, 3).reshape(b, s, e))

        def forward(self, x, mask):
            if spec["prenorm"]:
                x = x + self.attend(self.n1(x), mask)
                return x + self.ff(self.n2(x))
            x = self.n1(x + self.attend(x, mask))
            return self.n2(x + self.ff(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(spec["blocks"])])

        def forward(self, x, mask):
            for block in self.blocks:
                x = block(x, mask)
            return x

    return Net().eval()


def build(spec: dict):
    """The torch module of a drawn network, with random BatchNorm statistics (eval mode)."""
    import torch
    nn, F = torch.nn, torch.nn.functional
    acts = {"relu": F.relu, "leaky": lambda t: F.leaky_relu(t, 0.1), "hardswish": F.hardswish,
            "sigmoid": torch.sigmoid, "relu6": F.relu6, None: lambda t: t}

    class Block(nn.Module):
        def __init__(self, layer: dict):
            super().__init__()
            self.layer = layer
            if layer["kind"] == "norm":                         # nn modules, as models write them
                make = (lambda c: nn.GroupNorm(layer["groups"], c, affine=layer["affine"])) if layer["norm"] == "group" \
                    else (lambda c: nn.LayerNorm(c, eps=1e-6, elementwise_affine=layer["affine"]))
                self.norm = make(layer["channels"])
                if layer["affine"]:
                    with torch.no_grad():
                        self.norm.weight.normal_(1, 0.2)
                        self.norm.bias.normal_(0, 0.2)
            if layer["kind"] == "conv":
                self.conv = nn.Conv2d(layer["cin"], layer["cout"], layer["k"], layer["stride"], layer["padding"],
                                      layer["dilation"], layer["groups"], layer["bias"])
                self.bn = nn.BatchNorm2d(layer["cout"]) if layer["bn"] else None
                if self.bn is not None:
                    with torch.no_grad():
                        self.bn.running_mean.normal_(0, 0.2)
                        self.bn.running_var.uniform_(0.5, 1.5)
                        self.bn.weight.normal_(1, 0.2)
                        self.bn.bias.normal_(0, 0.2)

        def forward(self, x):
            layer = self.layer
            if layer["kind"] == "norm":
                if layer["norm"] == "group":
                    y = self.norm(x)
                else:                                             # ConvNeXt's channels-last LayerNorm
                    y = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
                return acts[layer["act"]](y)
            y = self.conv(x)
            if self.bn is not None:
                y = self.bn(y)
            if layer["residual"]:
                y = acts[layer["act"]](y) if not layer["act_after_add"] else y
                y = x + y
                return acts[layer["act"]](y) if layer["act_after_add"] else y
            return acts[layer["act"]](y)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(*[Block(layer) for layer in spec["layers"]])

        def forward(self, x):
            y = self.blocks(x)
            return y.mean((2, 3)) if spec["head"] == "mean" else y.flatten(1)

    return Net().eval()


def export(spec: dict, seed: int, half: bool = False) -> bytes:
    """The network exported with a symbolic batch (and sequence); half=True: the same weights in float16."""
    import torch
    torch.manual_seed(seed)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec.get("family") == "transformer":
            net = build_transformer(spec)
            args = (torch.randn(2, 6, spec["width"]), torch.ones(2, 6))
            names, axes = ["x", "mask"], {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"},
                                          "y": {0: "batch", 1: "seq"}}
            if spec["mask"] != "padding":               # the mask input is unused: not an input of the graph
                args, names = (args[0], None), ["x"]
                axes.pop("mask")
        else:
            net = build(spec)
            args = (torch.randn(2, spec["cin"], spec["size"], spec["size"]),)
            names, axes = ["x"], {"x": {0: "batch"}, "y": {0: "batch"}}
        if half:
            net = net.half()
            args = tuple(a.half() if a is not None else None for a in args)
        torch.onnx.export(net, args, buf, input_names=names, output_names=["y"], dynamic_axes=axes,
                          opset_version=spec["opset"], dynamo=False)
    return buf.getvalue()


def feeds_of(spec: dict, batch: int, seed: int, seq: int | None = None) -> dict:
    """Inputs at `batch` (and for transformers `seq` tokens, by default 3 + 2 * batch: not the export's 6)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if spec.get("family") != "transformer":
        return {"x": rng.standard_normal((batch, spec["cin"], spec["size"], spec["size"])).astype(np.float32)}
    seq = seq or 3 + 2 * batch
    feeds = {"x": rng.standard_normal((batch, seq, spec["width"])).astype(np.float32)}
    if spec["mask"] == "padding":
        mask = np.ones((batch, seq), np.float32)
        mask[-1, seq - 2:] = 0                              # the last sequence padded by two
        feeds["mask"] = mask
    return feeds


def run_model(spec: dict, seed: int, backend: str, dtype: str = "float32",
              providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> dict:
    """float16: the half-precision export, rewritten and run against ORT on the float32 one. providers: ORT's
    for the jitops session (e.g. the CUDA provider first, with the kernels on the GPU)."""
    import onnx

    import jitops.onnx as jo
    from jitops.onnx.testing import max_rel_error, ort_session
    half = dtype == "float16"
    model32 = onnx.load_from_string(export(spec, seed))
    model = onnx.load_from_string(export(spec, seed, half=True)) if half else model32
    groups = jo.map_nodes(model)
    taken: dict = {}
    kept = []
    for g in groups:
        if g.supported:
            taken[g.op_type] = taken.get(g.op_type, 0) + 1
        else:
            kept.append(g.describe()[:300])
    rewritten = jo.rewrite(model)
    onnx.checker.check_model(rewritten)
    sess = jo.session(model, providers=list(providers), backend=backend)
    errors = {}
    import numpy as np
    for batch in (1, 3):
        feeds = feeds_of(spec, batch, seed + batch)
        try:
            ref = ort_session(model32).run(None, feeds)[0]
        except Exception:          # the export baked the sequence length in (torch's MultiheadAttention): use it
            feeds = feeds_of(spec, batch, seed + batch, seq=6)
            try:
                ref = ort_session(model32).run(None, feeds)[0]
            except Exception as exc:
                return {"status": "skipped", "error": f"the exported model itself fails at batch {batch}: "
                                                      f"{str(exc)[:300]}", "taken": taken, "kept": kept}
        if half:
            feeds = {k: v.astype(np.float16) for k, v in feeds.items()}
            try:
                ort_session(model).run(None, feeds)
            except Exception as exc:   # ORT's CPU provider lacks a float16 kernel the export needs
                return {"status": "skipped", "error": f"ORT CPU cannot run the float16 export: {str(exc)[:300]}",
                        "taken": taken, "kept": kept}
        fallback = ort_session(rewritten).run(None, feeds)[0]
        got = sess.run(None, feeds)[0]
        if fallback.shape != ref.shape or got.shape != ref.shape:
            raise AssertionError(f"batch {batch}: shapes {fallback.shape} / {got.shape}, expected {ref.shape}")
        errors[batch] = (max_rel_error(fallback.astype(np.float32), ref), max_rel_error(got.astype(np.float32), ref))
    worst = max(max(e) for e in errors.values())
    return {"status": "passed" if worst < (3e-2 if half else 1e-4) else "failed", "worst_rel_error": worst,
            "taken": taken, "kept": kept}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", default="both", choices=("conv", "transformer", "both"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                    help="float16: the half export against ORT on the float32 one")
    ap.add_argument("--backend", default="cpu", help="where the jitops kernels run: cpu (the emulator), cuda, hip")
    ap.add_argument("--providers", default="CPUExecutionProvider",
                    help="ORT's providers for the jitops session, comma-separated (e.g. CUDAExecutionProvider,"
                         "CPUExecutionProvider with --backend cuda)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(f"{args.seed}-onnx")
    failed, skipped, taken_all, kept_all = 0, 0, {}, 0
    with open(os.path.join(args.out, "fuzz_onnx.jsonl"), "a") as log:
        for i in range(args.models):
            spec = draw_transformer(rng) if args.family == "transformer" or (
                args.family == "both" and i % 2) else draw_layers(rng)
            t0 = time.time()
            try:
                result = run_model(spec, args.seed * 1009 + i, args.backend, args.dtype,
                                   tuple(args.providers.split(",")))
            except Exception as exc:   # a crash, a checker error or a shape mismatch: a failure
                result = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                          "trace": traceback.format_exc()[-1500:]}
            result["s"] = round(time.time() - t0, 1)
            log.write(json.dumps({"spec": spec} | result) + "\n")
            log.flush()
            for t, n in result.get("taken", {}).items():
                taken_all[t] = taken_all.get(t, 0) + n
            kept_all += len(result.get("kept", []))
            skipped += result["status"] == "skipped"
            if result["status"] == "failed":
                failed += 1
                print(f"[{i}] FAILED {json.dumps(spec)}\n  {result.get('error') or result.get('worst_rel_error')}",
                      flush=True)
    print("jitops nodes taken:", ", ".join(f"{t}: {n}" for t, n in sorted(taken_all.items())), f"; groups kept: {kept_all}")
    print(f"{failed} failed of {args.models} {args.dtype} models ({skipped} skipped: the export does not run there) ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
          f"kernels on {args.backend}, providers {args.providers})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
