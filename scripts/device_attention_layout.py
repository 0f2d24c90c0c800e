"""Heads-inner attention ([B, S, H, D] "bshd", [S, B, H, D] "sbhd") on a GPU, one command: every model
shape of jitops.bench.attention in fp16 (and bf16 for a few), checked against float64 and timed
(CUDA-graph replay, median of trials) five ways on the same data:

  jitops bhsd      jitops.attention on contiguous [B, H, S, D] tensors (what was timed before)
  jitops bshd      jitops.attention on x.transpose(1, 2) views of [B, S, H, D] tensors (in place)
  jitops sbhd      the same on x.permute(1, 2, 0, 3) views of [S, B, H, D] tensors (nn.MultiheadAttention)
  via copies       .contiguous() of q, k, v + jitops bhsd + the output transposed back: what a
                   model pays without the layout (the ONNX graphs' Transposes)
  SDPA bshd        torch SDPA on the same views (what torch users run)

plus compute-sanitizer memcheck / racecheck on small heads-inner cases of the new addressing
(fused_wgmma's 4-d tensor maps, fused_mma's packed heads, split merge and cluster).

    python3 scripts/device_attention_layout.py [--out DIR] [--no-sanitize]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

import jitops
from jitops import arrays
from jitops.bench.attention import MODELS, PADDED, torch_reference
from jitops.bench.timing import Timer
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

op = get_op("attention")
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BF16 = {"ViT-B/16 S=197", "Llama3-8B prefill GQA causal", "SDXL self H=10 S=4096"}


def heads_inner(shape, dtype, layout="bshd"):
    b, h, s, d = shape
    if layout == "sbhd":
        return torch.randn(s, b, h, d, device="cuda", dtype=dtype).permute(1, 2, 0, 3)
    return torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2)


def pick(q, k, v, causal):
    """The heuristic's schedule for these arrays, as the engine would describe them (layout and row pitch)."""
    specs = {}
    for n, t in (("q", q), ("k", k), ("v", v)):
        ref = arrays.wrap(t, n, "attention")
        specs[n] = TensorSpec(ref.shape, ref.dtype, ref.layout, ref.pitch)
    return op.heuristic(op.make_problem({**specs, "mask": None}, {"causal": causal}), jitops.get_backend().device)


def via_copies(q, k, v, causal):
    """What a caller pays without in-place reads: contiguous copies in, the result back to q's [B, S, H, D] order."""
    o = jitops.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
    return o.transpose(1, 2).contiguous()


def sdpa_on(q, k, v, causal):
    """torch's SDPA on the same arrays (enable_gqa where k / v have fewer heads)."""
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)


def one(timer, name, q_shape, kv_shape, causal, dtype):
    q, k, v = heads_inner(q_shape, dtype), heads_inner(kv_shape, dtype), heads_inner(kv_shape, dtype)
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    qs, ks, vs = (t.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for t in (q, k, v))   # [S, B, H, D]
    ref = torch_reference(torch, qc, kc, vc, causal)
    scale = float(ref.abs().max())
    errs = {}
    for label, args in (("bshd", (q, k, v)), ("bhsd", (qc, kc, vc)), ("sbhd", (qs, ks, vs))):
        out = jitops.attention(*args, causal=causal)
        torch.cuda.synchronize()
        errs[label] = float((out.double() - ref).abs().max()) / scale
        assert errs[label] <= TOL[dtype], (name, label, errs[label])
        if label == "bshd":
            assert out.transpose(1, 2).is_contiguous(), "the result should be a heads-inner view"
    fns = {"jitops bhsd": lambda: jitops.attention(qc, kc, vc, causal=causal),
           "jitops bshd": lambda: jitops.attention(q, k, v, causal=causal),
           "jitops sbhd": lambda: jitops.attention(qs, ks, vs, causal=causal),
           "via copies": lambda: via_copies(q, k, v, causal),
           "SDPA bshd": lambda: sdpa_on(q, k, v, causal)}
    times = {n: timer.graph_us(f) for n, f in fns.items()}
    # eager: back-to-back calls, the three taking turns trial by trial (the host path is the cost for
    # small problems; bhsd and bshd both repeat through the native RepeatCall unless tensor maps keep
    # them on the Python path)
    eager = timer.eager_us({n: fns[n] for n in ("jitops bhsd", "jitops bshd", "SDPA bshd")}, calls=500)
    row = {"name": name, "dtype": str(dtype).split(".")[-1], "q": list(q_shape), "kv": list(kv_shape), "causal": causal,
           "pick_bshd": pick(q, k, v, causal).algorithm, "pick_bhsd": pick(qc, kc, vc, causal).algorithm,
           "err": errs, "graph_us": times, "eager_us": eager}
    print(f"{name:34s} {row['dtype']:8s} bhsd {times['jitops bhsd']:8.1f}  bshd {times['jitops bshd']:8.1f} "
          f"({times['jitops bhsd'] / times['jitops bshd']:.2f}x)  sbhd {times['jitops sbhd']:8.1f}  copies {times['via copies']:8.1f}  "
          f"SDPA {times['SDPA bshd']:8.1f}  bshd/SDPA {times['SDPA bshd'] / times['jitops bshd']:.2f}x  "
          f"{row['pick_bshd']}  err {errs['bshd']:.1e}  eager bhsd / bshd / SDPA {eager['jitops bhsd']:.1f} / "
          f"{eager['jitops bshd']:.1f} / {eager['SDPA bshd']:.1f}", flush=True)
    return row


def sanitize_case():
    """Small heads-inner cases of each new path, checked (run under compute-sanitizer)."""
    torch.manual_seed(0)
    hop = jitops.get_backend().device.arch.rstrip("a") == "sm_90"
    cases = [((2, 4, 70, 64), (2, 2, 150, 64), True, "fused_mma"),
             ((2, 8, 3, 128), (2, 2, 700, 128), "bottom_right",
              Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=3)),
             ((2, 8, 3, 128), (2, 2, 700, 128), "bottom_right",
              Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=3), "sbhd")]
    if hop:
        cases += [((2, 4, 150, 72), (2, 2, 200, 72), True, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1)),
                  ((2, 4, 150, 64), (2, 2, 300, 64), False,
                   Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1)),
                  ((2, 8, 3, 128), (2, 2, 700, 128), "bottom_right",
                   Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=3,
                                 tma=1, stages=3, cluster=1)),
                  ((2, 4, 150, 72), (2, 2, 200, 72), True, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1),
                   "sbhd")]
    for q_shape, kv_shape, causal, sched, *layout in cases:
        lay = layout[0] if layout else "bshd"
        q, k, v = (heads_inner(shape, torch.float16, lay) for shape in (q_shape, kv_shape, kv_shape))
        out = torch.full_like(q, float("nan"))
        jitops.attention(q, k, v, causal=causal, schedule=sched, out=out)
        torch.cuda.synchronize()
        kr, vr = k.repeat_interleave(q.shape[1] // k.shape[1], 1), v.repeat_interleave(q.shape[1] // k.shape[1], 1)
        s = q.double() @ kr.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            off = s.shape[-1] - s.shape[-2] if causal == "bottom_right" else 0
            i = torch.arange(s.shape[-2], device="cuda")[:, None]
            j = torch.arange(s.shape[-1], device="cuda")[None, :]
            s = s.masked_fill(j > i + off, float("-inf"))
        ref = torch.softmax(s, -1) @ vr.double()
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        print(f"sanitize case {lay} {q_shape} {kv_shape} causal={causal} {sched}: err {err:.2e}", flush=True)
        assert err <= 2e-3


def sanitize(out_dir, script=__file__, timeout=300):
    """compute-sanitizer memcheck and racecheck over `script --sanitize-case` (this script's cases, or
    another script's that reuses this runner)."""
    result = {}
    for tool in ("memcheck", "racecheck"):
        t0 = time.time()
        proc = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                               script, "--sanitize-case"], capture_output=True, text=True, timeout=timeout)
        lines = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                 if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line or "sanitize case" in line
                 or "Error" in line]
        result[tool] = {"rc": proc.returncode, "lines": lines[-20:]}
        print(f"compute-sanitizer {tool}: rc {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
        for line in lines[-12:]:
            print("   ", line)
        if out_dir:
            with open(os.path.join(out_dir, f"sanitizer_{tool}.txt"), "w") as f:
                f.write(proc.stdout + proc.stderr)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--sanitize-case", action="store_true")
    args = ap.parse_args()
    jitops.use_backend(jitops.get_backend("cuda"))
    if args.sanitize_case:
        sanitize_case()
        return
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    timer = Timer(torch)
    rows = []
    for name, q_shape, kv_shape, causal in (m for m in MODELS if m[0] not in PADDED):   # unmasked here
        for dtype in (torch.float16, torch.bfloat16):
            if dtype == torch.bfloat16 and name not in BF16:
                continue
            rows.append(one(timer, name, q_shape, kv_shape, causal, dtype))
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))   # noqa: E731
    summary = {
        "bshd_vs_bhsd": geo([r["graph_us"]["jitops bhsd"] / r["graph_us"]["jitops bshd"] for r in rows]),
        "sbhd_vs_bhsd": geo([r["graph_us"]["jitops bhsd"] / r["graph_us"]["jitops sbhd"] for r in rows]),
        "bshd_vs_copies": geo([r["graph_us"]["via copies"] / r["graph_us"]["jitops bshd"] for r in rows]),
        "bshd_vs_sdpa": geo([r["graph_us"]["SDPA bshd"] / r["graph_us"]["jitops bshd"] for r in rows]),
        "bhsd_vs_sdpa_bshd": geo([r["graph_us"]["SDPA bshd"] / r["graph_us"]["jitops bhsd"] for r in rows]),
        "worst_bshd_vs_sdpa": min(r["graph_us"]["SDPA bshd"] / r["graph_us"]["jitops bshd"] for r in rows)}
    print(json.dumps(summary), flush=True)
    san = {} if args.no_sanitize else sanitize(args.out)
    if args.out:
        with open(os.path.join(args.out, "attention_layout.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "rows": rows, "summary": summary, "sanitizer": san}, f, indent=1)


if __name__ == "__main__":
    main()
