"""Whole timm vision transformers (GPU), fp32 with TF32 allowed or fp16 / bf16: with SDPA, and with every
attention call swapped for jitops.attention (fp32: precision="tf32", fused_tf32), the rest of the network
unchanged (fp32: its matmuls in TF32 on both sides, torch.backends.cuda.matmul.allow_tf32 = True). timm's
q, k, v are views into one packed projection: jitops reads them in place (since 2026-11-29; variant
"jitops"), and variant "jitops_copies" copies them first, as a caller had to before (counted in its time).

Per model: the logits of both against the same model in float64 (relative max error), then the
forward's time as one CUDA graph replayed and eager (CUDA events, median of 20 after 5 warm-ups, the two
variants taking turns three times, best of the three medians). Eager timm forwards at these batches are
bound by the host (Python and launches), so the graph times are the GPU's.

    python3 scripts/device_attention_tf32_networks.py [--out DIR] [--dtypes float32,float16]
        [--models vit_base_patch16_224:8,...]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MODELS = [("vit_base_patch16_224", 8), ("vit_base_patch16_224", 32), ("vit_base_patch16_224", 128),
          ("vit_large_patch16_224", 8), ("vit_large_patch16_224", 32), ("deit_small_patch16_224", 64)]


VARIANTS = ("sdpa", "jitops", "jitops_copies")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--models", default=",".join(f"{m}:{b}" for m, b in MODELS))
    args = ap.parse_args()
    import timm
    import torch
    import torch.nn.functional as F

    import jitops
    sdpa = F.scaled_dot_product_attention
    calls = {"n": 0}

    def swapped(copies: bool):
        def jitops_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
            if dropout_p or kw:
                return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
            calls["n"] += 1
            if copies:          # what a caller paid before packed views were read in place
                q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
            precision = {"precision": "tf32"} if q.dtype == torch.float32 else {}
            return jitops.attention(q, k, v, attn_mask, causal=is_causal, scale=scale, **precision)
        return jitops_sdpa

    impl = {"sdpa": sdpa, "jitops": swapped(False), "jitops_copies": swapped(True)}

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for dtype in args.dtypes.split(","):
        for item in args.models.split(","):
            name, batch = item.split(":")
            rows.append(measure(timm, torch, F, impl, calls, name, int(batch), getattr(torch, dtype)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"attention_tf32_networks_{time.strftime('%H-%M')}.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "timm": timm.__version__,
                   "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


def measure(timm, torch, F, impl: dict, calls: dict, name: str, batch: int, dtype) -> dict:
    """One model: each variant's logits against float64, then graph replay and eager times, the variants
    taking turns three times (best of the three medians of 20)."""
    sdpa = impl["sdpa"]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).cuda().eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    with torch.no_grad():
        ref = model.double()(x.double()).float()
        model.to(dtype)
        x = x.to(dtype)

        def run(label: str):
            F.scaled_dot_product_attention = impl[label]
            try:
                return model(x)
            finally:
                F.scaled_dot_product_attention = sdpa

        errs = {}
        for label in VARIANTS:
            calls["n"] = 0
            y = run(label)
            torch.cuda.synchronize()
            errs[label] = float((y.float() - ref).abs().max() / ref.abs().max())
            if label != "sdpa":
                assert calls["n"] > 0, "the model never called scaled_dot_product_attention"
        graphs = {}
        for label in VARIANTS:                                    # whole forward in one CUDA graph
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    run(label)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            F.scaled_dot_product_attention = impl[label]
            try:
                with torch.cuda.graph(g):
                    model(x)
            finally:
                F.scaled_dot_product_attention = sdpa
            graphs[label] = g
        times: dict = {k: [] for k in VARIANTS}
        eager: dict = {k: [] for k in VARIANTS}
        for _ in range(3):
            for label in VARIANTS:
                for mode, store in (("graph", times), ("eager", eager)):
                    step = graphs[label].replay if mode == "graph" else (lambda s=label: run(s))
                    for _ in range(5):
                        step()
                    ts = []
                    for _ in range(20):
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        step()
                        b.record()
                        torch.cuda.synchronize()
                        ts.append(a.elapsed_time(b) * 1e3)
                    store[label].append(sorted(ts)[len(ts) // 2])
    row = {"model": name, "batch": batch, "dtype": str(dtype).split(".")[-1], "us": {k: min(v) for k, v in times.items()},
           "eager_us": {k: min(v) for k, v in eager.items()}, "err": errs, "attention_calls": calls["n"]}
    u, e = row["us"], row["eager_us"]
    print(f"{name} b{batch} {row['dtype']}: graph SDPA / jitops / via copies {u['sdpa']:.0f} / {u['jitops']:.0f} / "
          f"{u['jitops_copies']:.0f} us ({u['sdpa'] / u['jitops']:.3f}x SDPA, {u['jitops_copies'] / u['jitops']:.3f}x "
          f"copies); eager {e['sdpa']:.0f} / {e['jitops']:.0f} / {e['jitops_copies']:.0f} us "
          f"({e['sdpa'] / e['jitops']:.3f}x, {e['jitops_copies'] / e['jitops']:.3f}x); error vs float64 "
          f"{errs['sdpa']:.1e} / {errs['jitops']:.1e} / {errs['jitops_copies']:.1e}", flush=True)
    torch.cuda.empty_cache()
    return row


if __name__ == "__main__":
    sys.exit(main())
