"""Attention on a GPU, one command: every model shape of jitops.bench.attention (fp16 and bf16) checked
against float64 and timed against torch SDPA on the same tensors (CUDA-graph replay and eager, median
of trials); on sm_90 also the other matrix-core kernel (fused_mma when the scheduler picked
fused_wgmma and the reverse) on the same tensors, a small tile sweep of fused_wgmma, and
compute-sanitizer memcheck / racecheck on one small case of each new kernel path. Prints a table
last; writes JSON with --out.

    python3 scripts/device_attention.py [--out DIR] [--no-sweep] [--no-sanitize]
    python3 scripts/device_attention.py --sanitize-case      (the small cases, run under the sanitizer)
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
from jitops.bench.attention import MODELS, PADDED, sdpa_call, torch_reference
from jitops.bench.timing import Timer
from jitops.ops import get_op
from jitops.ops.attention_wgmma_fit import why_not as wgmma_why_not
from jitops.ops.base import Schedule, TensorSpec

op = get_op("attention")
TDT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SEED = (256, 128, 64)
BIG = (8, 16, 2048, 64)
BIG128 = (8, 16, 2048, 128)
def _s(**kw):
    return Schedule.make("fused_mma", **kw)


# fp16 fused_wgmma tiles timed next to the scheduler's choice (graph replay), to tune the heuristic:
# K / V by TMA or cp.async, rings of 2-4 buffers, 64- or 128-key tiles, 2 or 3 warpgroups.
def _p(block_k, ring, groups=2):
    """The warp-specialized fused_wgmma: a producer warpgroup fills a ring of `ring` K/V buffers."""
    return Schedule.make("fused_wgmma", groups=groups, block_k=block_k, stages=ring, producer=1)


def _t(block_k, ring, groups=2):
    """The warp-specialized fused_wgmma with K / V loaded by TMA (128-byte swizzle)."""
    return Schedule.make("fused_wgmma", groups=groups, block_k=block_k, stages=ring, producer=1, tma=1)


TMA64 = [_t(128, 3), _t(128, 4), _t(128, 2), _t(64, 4, 3), _t(64, 3, 3), _t(64, 3)]   # DP <= 64
TMA128 = [_t(64, 3), _t(64, 4), _t(64, 2)]                                            # DP > 64
def _pt(groups, block_k, ring=2, **extra):
    """The plain loop (no producer warpgroup) over a ring of TMA-loaded buffers, thread 0 issuing."""
    return Schedule.make("fused_wgmma", groups=groups, block_k=block_k, tma=1, **({"stages": ring} if ring != 2 else {}),
                         **extra)


def _rel(groups, block_k, ring=2):
    """The plain TMA loop without a block barrier per tile: consumer warps release buffers on mbarriers."""
    return _pt(groups, block_k, ring, release=1)


PLAIN64 = [_pt(2, 128), _rel(2, 128), _rel(2, 128, 3)]   # DP <= 64
PLAIN128 = [_pt(2, 64), _rel(2, 64), _rel(2, 64, 3)]     # DP > 64
SWEEP = {"B=8 H=16 S=2048 D=64": PLAIN64, "B=8 H=16 S=2048 causal": PLAIN64,
         "B=8 H=16 S=2048 D=128": PLAIN128, "B=8 H=16 S=2048 D=128 causal": TMA128[:1] + PLAIN128,
         "SD1.5 self D=40": PLAIN64, "SDXL self H=10 S=4096": PLAIN64,
         "Llama3-8B prefill GQA causal": TMA128[:1] + PLAIN128, "DiT-XL S=1024 D=72": PLAIN128,
         "Whisper enc H=20 S=1500": PLAIN64, "GPT-2 causal S=1024": PLAIN64,
         "Gemma-7B prefill D=256 causal": [_pt(2, 64), _rel(2, 64)],
         # decoding is memory-bound: split or not, with and without L2 prefetches (the decode rules'
         # sweeps, more shapes and tiles: scripts/device_decode_probe.py)
         "Llama3-8B decode B=16 Sk=4096": [_s(warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=sp,
                                              prefetch=pf) for sp in (1, 2, 3) for pf in (0, 256)]}


def problem_of(q_shape, kv_shape, dtype, causal):
    specs = {"q": TensorSpec(q_shape, dtype), "k": TensorSpec(kv_shape, dtype), "v": TensorSpec(kv_shape, dtype),
             "mask": None}
    return op.make_problem(specs, {"causal": causal})


def cases(dtypes=("float16", "bfloat16"), only=None):
    out = [] if only else [("B=256 S=128 D=64", SEED, SEED, "float32", False)]
    for dtype in dtypes:
        out += [("B=256 S=128 D=64", SEED, SEED, dtype, False), ("B=8 H=16 S=2048 D=64", BIG, BIG, dtype, False),
                ("B=8 H=16 S=2048 causal", BIG, BIG, dtype, True),      # and issue 16's D = 128 pair
                ("B=8 H=16 S=2048 D=128", BIG128, BIG128, dtype, False), ("B=8 H=16 S=2048 D=128 causal", BIG128, BIG128, dtype, True)]
        out += [(name, q, kv, dtype, causal) for name, q, kv, causal in MODELS if name not in PADDED]   # unmasked here
    return [c for c in out if not only or c[0] in only]


def tensors(q_shape, kv_shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(s, device="cuda", dtype=TDT[dtype], generator=g) for s in (q_shape, kv_shape, kv_shape))


def measure(timer, name, q_shape, kv_shape, dtype, causal, schedule=None, vendor=True, n=20):
    q, k, v = tensors(q_shape, kv_shape, dtype)
    p = problem_of(q_shape, kv_shape, dtype, causal)
    sched = schedule or op.heuristic(p, jitops.get_backend().device)
    out = torch.full_like(q, float("nan"))
    jitops.attention(q, k, v, causal=causal, out=out, schedule=sched)
    torch.cuda.synchronize()
    ref = torch_reference(torch, q, k, v, causal)
    scale = float(ref.abs().max())
    err = float((out.double() - ref).abs().max()) / scale
    tol = op.tolerance(p, sched)[0]
    row = {"problem": name, "dtype": dtype, "causal": causal, "schedule": str(sched), "why": sched.why,
           "algorithm": sched.algorithm,
           "error": err, "tol": tol, "ok": bool(err <= tol and not torch.isnan(out).any())}
    run = lambda: jitops.attention(q, k, v, causal=causal, out=out, schedule=sched)   # noqa: E731
    row["graph_us"] = timer.graph_us(run, n=n)
    if vendor:
        sdpa = sdpa_call(torch, q, k, v, causal)
        row["sdpa_error"] = float((sdpa().double().reshape(ref.shape) - ref).abs().max()) / scale
        row["sdpa_graph_us"] = timer.graph_us(sdpa, n=n)
        row["eager_us"] = timer.per_call_us(run, n=n)
        row["sdpa_eager_us"] = timer.per_call_us(sdpa, n=n)
        if row["graph_us"] is None or row["sdpa_graph_us"] is None:   # capture failed: eager figures
            row["graph_us"], row["sdpa_graph_us"] = row["eager_us"], row["sdpa_eager_us"]
            row["note"] = "graph capture failed; eager times"
        row["ratio"] = row["sdpa_graph_us"] / row["graph_us"]
        row["ratio_eager"] = row["sdpa_eager_us"] / row["eager_us"]
        row["tflops"] = p.flops() / (row["graph_us"] * 1e-6) / 1e12
        alt = other_kernel(p, sched)
        if alt is not None:                  # the other matrix-core kernel on the same tensors
            try:
                out.fill_(float("nan"))
                jitops.attention(q, k, v, causal=causal, out=out, schedule=alt)
                torch.cuda.synchronize()
                alt_err = float((out.double() - ref).abs().max()) / scale
                row["alt_schedule"] = str(alt)
                row["alt_ok"] = bool(alt_err <= op.tolerance(p, alt)[0] and not torch.isnan(out).any())
                row["alt_error"] = alt_err
                row["alt_graph_us"] = timer.graph_us(
                    lambda: jitops.attention(q, k, v, causal=causal, out=out, schedule=alt), n=n)
            except Exception as exc:     # reported, not fatal
                print(f"  {name} {dtype} {alt}: {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
    del ref
    torch.cuda.empty_cache()
    return row


def other_kernel(p, sched):
    """fused_mma when the scheduler chose fused_wgmma, fused_wgmma when it chose fused_mma and could
    have run it (sm_90): the comparison the heuristic is tuned on."""
    dev = jitops.get_backend().device
    if wgmma_why_not(p, dev) is not None:
        return None
    if sched.algorithm == "fused_wgmma":
        return op.heuristic(p, dev, "fused_mma")
    if sched.algorithm == "fused_mma":
        return op.heuristic(p, dev, "fused_wgmma")
    return None


def sweep(timer, rows, stop_at, only=None):
    """The SWEEP alternatives of a few fp16 shapes, graph replay, against the heuristic's time."""
    found = []
    for name, q_shape, kv_shape, dtype, causal in cases(("float16",), only):
        if dtype != "float16" or name not in SWEEP:
            continue
        if time.time() > stop_at:
            print(f"  sweep stopped at {name}: out of time", flush=True)
            break
        base = next(r for r in rows if r["problem"] == name and r["dtype"] == dtype)
        for s in SWEEP[name]:
            try:
                r = measure(timer, name, q_shape, kv_shape, dtype, causal, schedule=s, vendor=False, n=10)
            except Exception as exc:   # a candidate that does not fit is reported, not fatal
                print(f"  sweep {name} {s}: {type(exc).__name__}: {exc}", flush=True)
                continue
            if r["graph_us"] is None:
                continue
            r["vs_heuristic"] = base["graph_us"] / r["graph_us"]
            r["ratio"] = base["sdpa_graph_us"] / r["graph_us"]
            found.append(r)
            print(f"  sweep {name:<32} {r['graph_us']:9.1f} us  x{r['vs_heuristic']:.2f} of heuristic  "
                  f"sdpa ratio {r['ratio']:.2f}  err {r['error']:.1e} {'' if r['ok'] else 'WRONG'}  {s}", flush=True)
    return found


def sanitize_case():
    """Small cases reaching each new path: padded D (fast epilogue), D=256 with causal, decoding with
    packed heads, key-splitting warps, split-KV + merge and a 4-deep copy ring, MQA packed into
    prefill tiles with a 3-deep ring, bf16."""
    dev = jitops.get_backend().device
    runs = [((1, 2, 70, 40), (1, 2, 90, 40), "float16", False, None),
            ((1, 2, 40, 256), (1, 2, 50, 256), "float16", True, None),
            ((2, 8, 1, 128), (2, 2, 600, 128), "float16", False,
             Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=2,
                           stages=4)),
            ((2, 12, 1, 64), (2, 1, 700, 64), "float16", False,
             Schedule.make("fused_mma", warps=2, row_groups=1, block_k=64, pack=True, splits=3, stages=3)),
            ((2, 8, 3, 72), (2, 1, 300, 72), "bfloat16", "bottom_right",
             Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=3))]
    if wgmma_why_not(problem_of((1, 2, 130, 64), (1, 2, 130, 64), "float16", False), dev) is None:
        # fused_wgmma: partial tiles at both ends, padded D, GQA, causal Sq != Sk, bf16, 3 warpgroups
        runs += [((1, 2, 130, 64), (1, 2, 200, 64), "float16", False, Schedule.make("fused_wgmma", groups=2, block_k=64)),
                 ((1, 2, 130, 64), (1, 2, 330, 64), "float16", True,
                  Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3)),
                 ((1, 4, 200, 80), (1, 1, 270, 80), "bfloat16", "bottom_right",
                  Schedule.make("fused_wgmma", groups=3, block_k=64, stages=3)),
                 ((1, 4, 90, 40), (1, 2, 150, 40), "bfloat16", "bottom_right",
                  Schedule.make("fused_wgmma", groups=2, block_k=128)),
                 ((1, 2, 200, 72), (1, 1, 300, 72), "float16", True, Schedule.make("fused_wgmma", groups=3, block_k=64)),
                 # the producer warpgroup: more tiles than ring buffers (the free barriers wrap), a
                 # warpgroup past the last row, causal with each warpgroup stopping early, bf16 GQA
                 ((1, 2, 90, 40), (1, 2, 700, 40), "float16", False, _p(128, 2)),
                 ((1, 2, 130, 64), (1, 2, 330, 64), "float16", True, _p(64, 3)),
                 ((1, 4, 200, 80), (1, 1, 600, 80), "bfloat16", "bottom_right", _p(64, 4)),
                 ((1, 2, 250, 64), (1, 2, 500, 64), "float16", True, _p(64, 3, 3)),
                 # TMA loads: partial 64-column blocks (D = 40, 72), rows past Sk, the ring wrapping
                 ((1, 2, 90, 40), (1, 2, 700, 40), "float16", False, _t(128, 2)),
                 ((1, 4, 200, 72), (1, 1, 600, 72), "bfloat16", "bottom_right", _t(64, 3)),
                 ((1, 2, 250, 64), (1, 2, 500, 64), "float16", True, _t(64, 4, 3)),
                 # TMA schedules on K / V off 16-byte alignment: the producer's swizzled plain stores
                 ((1, 2, 250, 72), (1, 2, 500, 72), "float16", True, _t(64, 3), "unaligned"),
                 ((1, 2, 250, 64), (1, 2, 700, 64), "bfloat16", False, _t(128, 3), "unaligned"),
                 # the plain loop with TMA loads (D = 256's pick): aligned and not, causal, GQA
                 ((1, 4, 200, 256), (1, 2, 330, 256), "float16", True, _pt(2, 64)),
                 ((1, 2, 130, 72), (1, 1, 400, 72), "bfloat16", "bottom_right", _pt(3, 64), "unaligned"),
                 ((1, 4, 200, 128), (1, 1, 700, 128), "float16", True, _pt(2, 64, 3)),
                 ((1, 2, 250, 64), (1, 2, 900, 64), "bfloat16", False, _pt(2, 128, 4), "unaligned"),
                 # release=1: buffers released per warp on mbarriers (causal: warpgroups at different tiles)
                 ((1, 4, 200, 128), (1, 1, 700, 128), "float16", True, _rel(2, 64)),
                 ((1, 2, 250, 64), (1, 2, 900, 64), "float16", "bottom_right", _rel(3, 64, 3)),
                 ((1, 2, 130, 72), (1, 1, 400, 72), "bfloat16", False, _rel(2, 64), "unaligned")]
    bad = 0
    for q_shape, kv_shape, dtype, causal, sched, *how in runs:
        q, k, v = tensors(q_shape, kv_shape, dtype)
        if how:     # the same values 2 bytes off 16-byte alignment
            q, k, v = (torch.cat([t.new_zeros(1), t.reshape(-1)])[1:].view(t.shape) for t in (q, k, v))
            assert k.data_ptr() % 16 and v.data_ptr() % 16
        out = torch.full_like(q, float("nan"))
        jitops.attention(q, k, v, causal=causal, out=out, schedule=sched)
        torch.cuda.synchronize()
        if causal == "bottom_right":   # reference with the bottom-right diagonal
            off = kv_shape[2] - q_shape[2]
            kk = k.double().repeat_interleave(q_shape[1] // kv_shape[1], 1)
            vv = v.double().repeat_interleave(q_shape[1] // kv_shape[1], 1)
            s = q.double() @ kk.transpose(-1, -2) / q_shape[-1] ** 0.5
            i = torch.arange(q_shape[2], device="cuda")[:, None]
            j = torch.arange(kv_shape[2], device="cuda")[None, :]
            ref = torch.softmax(s.masked_fill(j > i + off, float("-inf")), -1) @ vv
        else:
            ref = torch_reference(torch, q, k, v, bool(causal))
        p = problem_of(q_shape, kv_shape, dtype, causal)
        sched = sched or op.heuristic(p, dev)
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        ok = err <= op.tolerance(p, sched)[0] and not torch.isnan(out).any()
        bad += not ok
        print(f"sanitize case {q_shape} {kv_shape} {dtype} causal={causal} {sched}{' unaligned' if how else ''}: err {err:.2e} "
              f"{'ok' if ok else 'WRONG'}", flush=True)
    sys.exit(1 if bad else 0)


def sanitize(out_dir):
    results = {}
    for tool in ("memcheck", "racecheck", "synccheck"):
        t0 = time.time()
        proc = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                               __file__, "--sanitize-case"], capture_output=True, text=True, timeout=240)
        text = proc.stdout + proc.stderr
        summary = [line for line in text.splitlines() if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line
                   or "SYNCCHECK SUMMARY" in line or "sanitize case" in line]
        results[tool] = {"rc": proc.returncode, "seconds": round(time.time() - t0, 1), "summary": summary}
        print(f"compute-sanitizer {tool}: rc {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
        for line in summary:
            print("   ", line, flush=True)
        if proc.returncode and out_dir:
            with open(os.path.join(out_dir, f"sanitizer_{tool}.txt"), "w") as f:
                f.write(text[-20000:])
    return results


def best_table(rows, found):
    """Per fp16 problem: the heuristic's time and the fastest sweep alternative (same run)."""
    lines = [f"{'problem (fp16)':<34} {'heuristic us':>12} {'best us':>9} {'best/SDPA':>9}  best schedule"]
    for r in rows:
        if r["dtype"] != "float16":
            continue
        alts = [f for f in found if f["problem"] == r["problem"] and f["ok"]]
        best = min(alts, key=lambda f: f["graph_us"]) if alts else None
        if best is None or best["graph_us"] >= r["graph_us"]:
            best = r
        lines.append(f"{r['problem']:<34} {r['graph_us']:12.1f} {best['graph_us']:9.1f} "
                     f"{r['sdpa_graph_us'] / best['graph_us']:9.2f}  {best['schedule']}")
    return "\n".join(lines)


def table(rows):
    lines = [f"{'problem':<34} {'dtype':<8} {'jitops us':>10} {'SDPA us':>9} {'ratio':>6} {'eager':>6} "
             f"{'TFLOP/s':>8} {'err':>8} {'other us':>9}  schedule / other kernel"]
    for r in rows:
        alt = r.get("alt_graph_us")
        alt_s = f"{alt:9.1f}" if alt else f"{'-':>9}"
        lines.append(f"{r['problem']:<34} {r['dtype']:<8} {r['graph_us']:10.1f} {r['sdpa_graph_us']:9.1f} "
                     f"{r['ratio']:6.2f} {r['ratio_eager']:6.2f} {r['tflops']:8.1f} {r['error']:8.1e} {alt_s}  "
                     f"{'' if r['ok'] else 'WRONG '}{r['schedule']}"
                     + (f" / {'' if r.get('alt_ok') else 'WRONG '}{r.get('alt_schedule')}" if "alt_schedule" in r else ""))
    for dtype in ("float16", "bfloat16"):
        sel = [r["ratio"] for r in rows if r["dtype"] == dtype]
        if sel:
            lines.append(f"geomean {dtype} (graph replay, {len(sel)} shapes): "
                         f"{math.exp(sum(map(math.log, sel)) / len(sel)):.3f}x; min {min(sel):.2f}x")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--sanitize-case", action="store_true")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which the sweep stops")
    ap.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated")
    ap.add_argument("--only", help="comma-separated problem names (default: every shape)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if args.out:
        os.makedirs(args.out, exist_ok=True)       # the sanitizer logs and the JSON report go there
    if args.sanitize_case:
        sanitize_case()
    timer = Timer(torch)
    dev = jitops.get_backend().device
    print(f"{dev.name} ({dev.arch}, {dev.multiprocessors} SMs), torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    start = time.time()
    rows, failed = [], []
    for case in cases(tuple(args.dtypes.split(",")), only):
        t0 = time.time()
        try:
            r = measure(timer, *case)
        except Exception as exc:    # reported and counted, the other shapes still run
            print(f"{case[0]} {case[3]}: FAILED {type(exc).__name__}: {exc}", flush=True)
            failed.append(f"{case[0]} {case[3]}: {exc}")
            continue
        rows.append(r)
        print(f"{r['problem']:<34} {r['dtype']:<8} {r['graph_us']:9.1f} us  sdpa {r['sdpa_graph_us']:9.1f}  "
              f"x{r['ratio']:.2f} (eager x{r['ratio_eager']:.2f})  err {r['error']:.1e} "
              f"{'ok' if r['ok'] else 'WRONG'}  {r['schedule']}  [{time.time() - t0:.1f} s]"
              + (f"  other {r['alt_graph_us']:.1f} us {'ok' if r['alt_ok'] else 'WRONG'} {r['alt_schedule']}"
                 if r.get("alt_graph_us") else ""), flush=True)
    san = {} if args.no_sanitize else sanitize(args.out)
    found = [] if args.no_sweep else sweep(timer, rows, start + args.deadline, only)
    if found:
        print("\n" + best_table(rows, found), flush=True)
    print("\n" + table(rows), flush=True)
    if args.out:
        with open(os.path.join(args.out, "attention.json"), "w") as f:
            json.dump({"device": dev.name, "torch": torch.__version__, "rows": rows, "sweep": found,
                       "sanitizer": san, "failed": failed}, f, indent=1)
    for line in failed:
        print("FAILED", line)
    sys.exit(0 if all(r["ok"] for r in rows) and not failed else 1)


if __name__ == "__main__":
    main()
