"""Whole fp32 networks with TF32 allowed (GPU): timm vision transformers with SDPA, and with every
attention call swapped for jitops.attention(precision="tf32") (fused_tf32), the rest of the network
unchanged (its matmuls in TF32 on both sides: torch.backends.cuda.matmul.allow_tf32 = True). timm's
q, k, v are views into one packed projection, which jitops does not read in place: the swap copies them
(counted in its time).

Per model: the logits of both against the same model in float64 (relative max error), then the
forward's time as one CUDA graph replayed and eager (CUDA events, median of 20 after 5 warm-ups, the two
variants taking turns three times, best of the three medians). Eager timm forwards at these batches are
bound by the host (Python and launches), so the graph times are the GPU's.

    python3 scripts/device_attention_tf32_networks.py [--out DIR]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import timm
    import torch
    import torch.nn.functional as F

    import jitops
    sdpa = F.scaled_dot_product_attention
    calls = {"n": 0}

    def jitops_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if q.dtype != torch.float32 or dropout_p or kw:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
        calls["n"] += 1
        # timm splits one packed qkv projection: q, k, v are strided views jitops refuses (it reads C order,
        # [B, S, H, D] transposed or [S, B, H, D]), so the swap pays a copy of each; SDPA reads the views
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
        return jitops.attention(q, k, v, attn_mask, causal=is_causal, scale=scale, precision="tf32")

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    for name, batch in MODELS:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).cuda().eval()
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        with torch.no_grad():
            ref = model.double()(x.double()).float()
            model.float()

            def run(swap: bool):
                F.scaled_dot_product_attention = jitops_sdpa if swap else sdpa
                try:
                    return model(x)
                finally:
                    F.scaled_dot_product_attention = sdpa

            errs = {}
            for label, swap in (("sdpa", False), ("jitops", True)):
                calls["n"] = 0
                y = run(swap)
                torch.cuda.synchronize()
                errs[label] = float((y - ref).abs().max() / ref.abs().max())
                if swap:
                    assert calls["n"] > 0, "the model never called scaled_dot_product_attention"
            times: dict = {"sdpa": [], "jitops": []}
            graphs = {}
            for label, swap in (("sdpa", False), ("jitops", True)):      # whole forward in one CUDA graph
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        run(swap)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                F.scaled_dot_product_attention = jitops_sdpa if swap else sdpa
                try:
                    with torch.cuda.graph(g):
                        model(x)
                finally:
                    F.scaled_dot_product_attention = sdpa
                graphs[label] = g
            eager: dict = {"sdpa": [], "jitops": []}
            for _ in range(3):
                for label, swap in (("sdpa", False), ("jitops", True)):
                    for mode, store in (("graph", times), ("eager", eager)):
                        step = graphs[label].replay if mode == "graph" else (lambda s=swap: run(s))
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
        row = {"model": name, "batch": batch, "us": {k: min(v) for k, v in times.items()},
               "eager_us": {k: min(v) for k, v in eager.items()}, "err": errs, "attention_calls": calls["n"]}
        rows.append(row)
        u, e = row["us"], row["eager_us"]
        print(f"{name} b{batch}: graph replay SDPA {u['sdpa']:.0f} us, jitops tf32 attention {u['jitops']:.0f} us "
              f"({u['sdpa'] / u['jitops']:.3f}x); eager {e['sdpa']:.0f} / {e['jitops']:.0f} us "
              f"({e['sdpa'] / e['jitops']:.3f}x); error vs float64 {errs['sdpa']:.1e} / {errs['jitops']:.1e}", flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"attention_tf32_networks_{time.strftime('%H-%M')}.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "timm": timm.__version__,
                   "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
