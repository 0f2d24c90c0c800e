"""What the ONNX rewrite's causal-mask proof and repeat_kv take-in buy on a GPU, kernel by kernel.

Before (2026-11-25 code) a causal export ran jitops attention with the exported [S, S] additive mask
(every key tile computed, the mask read per (batch, head)), and a grouped-query export ran it on K / V
that ORT's Expand had copied to every query head. Now the node runs with causal=True, on the kv heads.
This times both forms of each decoder shape on the same tensors (CUDA-graph replay, median of trials;
the Expand's copy timed as torch's expand().reshape(), which is what ORT's Expand computes), after
checking that they agree with each other and with float64.

    python3 scripts/device_onnx_attention_forms.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

# (name, B, H, Hk, S, D): GPT-2 small / medium prefill, Llama-3-8B and a Llama-1B-like prefill
SHAPES = [("gpt2_small_b8_s1024", 8, 12, 12, 1024, 64), ("gpt2_medium_b4_s1024", 4, 16, 16, 1024, 64),
          ("llama3_8b_b1_s2048", 1, 32, 8, 2048, 128), ("llama_1b_like_b4_s1024", 4, 16, 4, 1024, 64)]


def replay_us(fn) -> float:
    """Graph replay, median of 7 trials of 20 calls (the project's Timer)."""
    import torch

    from jitops.bench.timing import Timer
    us = Timer(torch).graph_us(fn, n=20, trials=7)
    if us is None:
        raise RuntimeError("CUDA graph capture failed")
    return us


def reference(q, k, v) -> "np.ndarray":
    """Causal attention in float64 on the first (batch, head) pairs' rows (GQA by head // group)."""
    qd, kd, vd = (t.double().cpu().numpy() for t in (q, k, v))
    group = qd.shape[1] // kd.shape[1]
    s = qd.shape[2]
    out = np.zeros_like(qd[:1])
    for h in range(qd.shape[1]):
        sc = qd[0, h] @ kd[0, h // group].T / np.sqrt(qd.shape[-1])
        sc[np.triu(np.ones((s, s), bool), 1)] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True))
        out[0, h] = (p / p.sum(-1, keepdims=True)) @ vd[0, h // group]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch

    import jitops
    rows = []
    for name, b, h, hk, s, d in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(b, hk, s, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, hk, s, d, device="cuda", dtype=torch.float16, generator=g)
        mask = torch.zeros(s, s, device="cuda", dtype=torch.float16)
        mask.masked_fill_(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        n = h // hk

        def expand(x):
            return x[:, :, None].expand(b, hk, n, s, d).reshape(b, h, s, d)
        ke, ve = expand(k), expand(v)
        now = jitops.attention(q, k, v, causal=True)
        before = jitops.attention(q, ke, ve, mask=mask)
        torch.cuda.synchronize()
        ref = reference(q[:1], k[:1], v[:1])
        err_now = float(np.abs(now[:1].double().cpu().numpy() - ref).max())
        err_before = float(np.abs(before[:1].double().cpu().numpy() - ref).max())
        row = {"shape": name, "B": b, "H": h, "Hk": hk, "S": s, "D": d, "err_now": err_now,
               "err_before": err_before, "ok": err_now < 2e-2 and err_before < 2e-2}
        row["now_us"] = replay_us(lambda: jitops.attention(q, k, v, causal=True))
        row["before_masked_us"] = replay_us(lambda: jitops.attention(q, ke, ve, mask=mask))
        row["expand_copy_us"] = replay_us(lambda: (expand(k), expand(v))) if n > 1 else 0.0
        row["sdpa_causal_us"] = replay_us(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, ke, ve, is_causal=True))
        row["speedup"] = (row["before_masked_us"] + row["expand_copy_us"]) / row["now_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    info = {"device": torch.cuda.get_device_name(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "rows": rows}
    with open(os.path.join(args.out, "onnx_attention_forms.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"{'shape':24} {'before+copy us':>15} {'now us':>8} {'speedup':>8} {'SDPA causal':>11}")
    for r in rows:
        print(f"{r['shape']:24} {r['before_masked_us'] + r['expand_copy_us']:15.1f} {r['now_us']:8.1f} "
              f"{r['speedup']:8.2f} {r['sdpa_causal_us']:11.1f}  ok={r['ok']}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
