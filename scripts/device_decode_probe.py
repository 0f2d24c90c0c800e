"""Attention decoding on a GPU: the scheduler's pick and any fused_mma schedules given against SDPA on
the same tensors (graph replay), each checked against float64 first (output NaN-poisoned), with the
K / V bytes per second; for Llama-3 B=16 also torch's own read-only reduction and copy over the same
bytes (what "memory-bound" can reach). The sweeps behind the decode rules of
`attention_mma.decode_splits` and `attention_mma.tma_decode`.

    python3 scripts/device_decode_probe.py [--problem NAME ...] [--dtype float16 ...] [--sweep NAME]
                                           [--json FILE] [SCHEDULE ...]
    NAME: llama (B=16), llama_b1, llama_b2, llama_b4, falcon
    SCHEDULE: fused_mma parameters, e.g. warps=4,key_warps=4,block_k=64,splits=1,prefetch=256
    (pack=True and row_groups=1 are added); --sweep tma runs the built-in list of TMA ring / cluster
    schedules per problem (SWEEPS) after the given ones; --once runs the pick and SDPA three times (for ncu).
    The pick and SDPA are timed first and again last (their spread is the run's noise).
    --sanitize runs compute-sanitizer memcheck and racecheck over --sanitize-case (small cases of each
    decode kernel variant: the TMA ring, split + merge kernel, cluster merges, views off alignment).
    --final ROUNDS: the pick, the cp.async pick (the scheduler with TMA decoding off: `baseline`) and
    SDPA, taking turns ROUNDS times (medians reported), instead of the sweep.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import jitops
from jitops.bench.attention import sdpa_call, torch_reference
from jitops.bench.timing import Timer
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

PROBLEMS = {"llama": ((16, 32, 1, 128), (16, 8, 4096, 128)), "llama_b1": ((1, 32, 1, 128), (1, 8, 4096, 128)),
            "llama_b2": ((2, 32, 1, 128), (2, 8, 4096, 128)), "llama_b4": ((4, 32, 1, 128), (4, 8, 4096, 128)),
            "llama_b8": ((8, 32, 1, 128), (8, 8, 4096, 128)), "falcon": ((16, 71, 1, 64), (16, 1, 2048, 64))}

_R4 = "warps=4,key_warps=4,block_k=64,tma=1"       # 4 warps, each 16 keys of a 64-key tile
_R8 = "warps=8,key_warps=8,block_k=128,tma=1"      # 8 warps, 128-key tiles
_F = "warps=8,key_warps=4,block_k=64"              # Falcon: 2 row warps (32 of the 71 packed rows) x 4 key warps
SWEEPS = {"tma": {
    "llama": [f"{_R4},stages={s}" for s in (2, 3, 4, 6)] + [f"{_R8},stages={s}" for s in (2, 3)]
             + ["warps=4,key_warps=4,block_k=128,tma=1,stages=3", "warps=2,key_warps=2,block_k=32,tma=1,stages=8",
                f"{_R4},stages=3,splits=2,cluster=1"],
    "llama_b1": [f"{_R4},stages=4,splits=16", f"{_R4},stages=4,splits=16,cluster=1", f"{_R4},stages=2,splits=16,cluster=1",
                 f"{_R4},stages=4,splits=8,cluster=1", f"{_R4},stages=6,splits=8,cluster=1",
                 f"{_R8},stages=3,splits=8,cluster=1", "warps=4,key_warps=4,block_k=64,splits=8,cluster=1,prefetch=256",
                 f"{_R4},stages=2,splits=32"],
    "llama_b2": [f"{_R4},stages=4,splits=8,cluster=1", f"{_R4},stages=2,splits=16,cluster=1", f"{_R4},stages=2,splits=16",
                 f"{_R4},stages=4,splits=8",
                 f"{_R4},stages=6,splits=4,cluster=1", f"{_R8},stages=3,splits=8,cluster=1",
                 "warps=4,key_warps=4,block_k=64,splits=8,cluster=1,prefetch=256"],
    "llama_b4": [f"{_R4},stages=4,splits=4,cluster=1", f"{_R4},stages=6,splits=4,cluster=1",
                 f"{_R4},stages=3,splits=8,cluster=1", f"{_R4},stages=3,splits=8", f"{_R4},stages=2,splits=8,cluster=1",
                 "warps=4,key_warps=4,block_k=64,splits=4,cluster=1,prefetch=256"],
    "falcon": [f"{_F},tma=1,stages=2,splits=8", f"{_F},tma=1,stages=4,splits=8", f"{_F},tma=1,stages=4,splits=8,cluster=1",
               f"{_F},splits=8,cluster=1", f"{_F},tma=1,stages=4,splits=4,cluster=1"],
}, "tma2": {      # the second round (2026-11-26): around the first round's best of each problem
    "llama": [f"{_R4},stages=2", f"{_R8},stages=2", f"{_R4},stages=2", f"{_R8},stages=2"],
    "llama_b1": [f"{_R8},stages=3,splits=8,cluster=1", f"{_R8},stages=2,splits=8,cluster=1",
                 "warps=4,key_warps=4,block_k=128,tma=1,stages=3,splits=8,cluster=1", f"{_R8},stages=2,splits=16",
                 f"{_R4},stages=3,splits=16,cluster=1", f"{_R4},stages=2,splits=8,cluster=1"],
    "llama_b2": [f"{_R4},stages=3,splits=8,cluster=1", f"{_R4},stages=2,splits=8,cluster=1", f"{_R4},stages=4,splits=8",
                 f"{_R8},stages=2,splits=8", f"{_R8},stages=2,splits=4,cluster=1", f"{_R4},stages=2,splits=16,cluster=1",
                 f"{_R4},stages=3,splits=16"],
    "llama_b4": [f"{_R4},stages=2,splits=8,cluster=1", f"{_R4},stages=3,splits=4,cluster=1",
                 f"{_R4},stages=2,splits=4,cluster=1",
                 f"{_R8},stages=2,splits=4", f"{_R4},stages=3,splits=8", f"{_R4},stages=4,splits=4",
                 f"{_R4},stages=2,splits=6,cluster=1"],
    "falcon": [f"{_F},tma=1,stages=2,splits=8", f"{_F},tma=1,stages=2,splits=4", f"{_F},tma=1,stages=3,splits=8",
               f"{_F},tma=1,stages=2,splits=12", f"{_F},tma=1,stages=2,splits=6,cluster=1"],
}, "b8": {        # Llama-3 B=8 (64 kv heads), between the measured rules
    "llama_b8": [f"{_R4},stages=2", f"{_R8},stages=2,splits=2", f"{_R8},stages=2,splits=4",
                 f"{_R4},stages=2,splits=2,cluster=1",
                 f"{_R4},stages=2,splits=4,cluster=1", f"{_R4},stages=3,splits=2"],
}}


def parse(spec: str) -> Schedule:
    kw = {k: int(v) for k, v in (item.split("=") for item in spec.split(","))}
    return Schedule.make("fused_mma", pack=True, row_groups=1, **kw)


def baseline(problem, device) -> Schedule:
    """The scheduler's pick as it was before TMA decoding (the cp.async ring and decode_splits): the same
    device with the TMA decode rule switched off."""
    from jitops.ops import attention_mma
    saved = attention_mma.tma_decode_applies
    attention_mma.tma_decode_applies = lambda p, d: False
    try:
        return get_op("attention").heuristic(problem, device)
    finally:
        attention_mma.tma_decode_applies = saved


def final(name: str, dtype: str, rounds: int, timer: Timer, rows: list[dict]) -> None:
    """The pick against the cp.async pick and SDPA, taking turns, each output checked first."""
    import statistics
    qs, ks = PROBLEMS[name]
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(s, device="cuda", dtype=tdt, generator=g) for s in (qs, ks, ks))
    out = torch.empty_like(q)
    op = get_op("attention")
    tspecs = {n: TensorSpec(tuple(t.shape), dtype) for n, t in (("q", q), ("k", k), ("v", v))}
    problem = op.make_problem({**tspecs, "mask": None}, {"causal": False})
    device = jitops.get_backend().device
    pick, old = op.heuristic(problem, device), baseline(problem, device)
    ref = torch_reference(torch, q, k, v, False)
    errs = {}
    for label, sched in (("pick", pick), ("cp.async pick", old)):
        out.fill_(float("nan"))
        jitops.attention(q, k, v, out=out, schedule=sched)
        torch.cuda.synchronize()
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        assert err <= op.tolerance(problem, sched)[0] and not torch.isnan(out).any(), (name, dtype, label, err)
        errs[label] = err
    calls = {"SDPA": sdpa_call(torch, q, k, v, False),
             "pick": lambda: jitops.attention(q, k, v, out=out, schedule=pick),
             "cp.async pick": lambda: jitops.attention(q, k, v, out=out, schedule=old)}
    times: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(rounds):
        for n, fn in calls.items():
            times[n].append(timer.graph_us(fn, n=20))
    med = {n: statistics.median(t) for n, t in times.items()}
    kv_bytes = 2 * k.numel() * k.element_size()
    rows.append({"problem": name, "dtype": dtype, "pick": str(pick), "why": pick.why, "baseline": str(old),
                 "errors": errs, "us": times, "median_us": med, "pick_tb_s": kv_bytes / med["pick"] * 1e-6,
                 "ratio": med["SDPA"] / med["pick"], "ratio_before": med["SDPA"] / med["cp.async pick"]})
    print(f"{name:8} {dtype:8} pick {med['pick']:6.1f} us ({min(times['pick']):6.1f}-{max(times['pick']):6.1f})  "
          f"cp.async pick {med['cp.async pick']:6.1f}  SDPA {med['SDPA']:6.1f} ({min(times['SDPA']):6.1f}-"
          f"{max(times['SDPA']):6.1f})  ratio {med['SDPA'] / med['pick']:4.2f} "
          f"(was {med['SDPA'] / med['cp.async pick']:4.2f})"
          f"  {kv_bytes / med['pick'] * 1e-6:4.2f} TB/s  err {errs['pick']:.1e}  {pick}", flush=True)
    del ref
    torch.cuda.empty_cache()


def probe(name: str, dtype: str, specs: list[str], timer: Timer, once: bool, rows: list[dict]) -> None:
    qs, ks = PROBLEMS[name]
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(s, device="cuda", dtype=tdt, generator=g) for s in (qs, ks, ks))
    out = torch.empty_like(q)
    sdpa = sdpa_call(torch, q, k, v, False)
    if once:
        for _ in range(3):
            jitops.attention(q, k, v, out=out)
            sdpa()
        torch.cuda.synchronize()
        return
    op = get_op("attention")
    tspecs = {n: TensorSpec(tuple(t.shape), dtype) for n, t in (("q", q), ("k", k), ("v", v))}
    problem = op.make_problem({**tspecs, "mask": None}, {"causal": False})
    pick = op.heuristic(problem, jitops.get_backend().device)
    ref = torch_reference(torch, q, k, v, False)
    kv_bytes = 2 * k.numel() * k.element_size()

    def show(label: str, us: float | None, err: float | None = None, ok: bool = True, **extra) -> None:
        rows.append({"problem": name, "dtype": dtype, "schedule": label, "us": us, "err": err, "ok": ok,
                     "tb_s": kv_bytes / us * 1e-6 if us else None, **extra})
        text = "FAILED" if us is None else f"{us:8.1f} us  {kv_bytes / us * 1e-6:5.2f} TB/s"
        print(f"{name:8} {dtype:8} {label:96} {text}{'' if ok else '  WRONG'}", flush=True)

    def run(sched: Schedule | None, label: str) -> None:
        try:
            out.fill_(float("nan"))
            jitops.attention(q, k, v, out=out, schedule=sched)
            torch.cuda.synchronize()
            err = float((out.double() - ref).abs().max() / ref.abs().max())
            ok = bool(err <= op.tolerance(problem, sched or pick)[0] and not torch.isnan(out).any())
            us = timer.graph_us(lambda: jitops.attention(q, k, v, out=out, schedule=sched), n=20) if ok else None
            show(f"{label} err {err:.1e}", us, err, ok)
        except Exception as exc:       # a schedule that does not fit or compile: say so, go on
            show(f"{label} {type(exc).__name__}: {str(exc)[:120]}", None, None, False)

    sdpa_us = [timer.graph_us(sdpa, n=20)]
    show("SDPA", sdpa_us[0])
    run(None, f"pick {pick}")
    for spec in specs:
        run(parse(spec), str(parse(spec)))
    run(None, f"pick (again) {pick}")
    sdpa_us.append(timer.graph_us(sdpa, n=20))
    show("SDPA (again)", sdpa_us[1])
    if name == "llama" and dtype == "float16":
        kv = torch.cat([k.reshape(-1), v.reshape(-1)])
        show("torch.sum over K and V (read only)", timer.graph_us(lambda: kv.sum(dtype=torch.float32), n=20))
        dst = torch.empty_like(kv)
        show("copy of K and V (TB/s of the bytes read; twice that moved)", timer.graph_us(lambda: dst.copy_(kv), n=20))
    del ref
    torch.cuda.empty_cache()


def sanitize_case() -> None:
    """Small cases of every new decode path, each checked against float64 (exit status 1 if one is wrong)."""
    op = get_op("attention")

    def sch(**kw):
        return Schedule.make("fused_mma", pack=True, row_groups=1, **kw)
    r4 = dict(warps=4, key_warps=4, block_k=64)
    runs = [((2, 8, 1, 128), (2, 2, 700, 128), "float16", False, sch(**r4, tma=1, stages=3), False),
            ((2, 8, 1, 72), (2, 2, 600, 72), "bfloat16", "bottom_right", sch(**r4, tma=1, stages=2, splits=3), False),
            ((2, 8, 1, 128), (2, 2, 900, 128), "float16", False, sch(**r4, tma=1, stages=4, splits=4, cluster=1), False),
            ((2, 16, 2, 64), (2, 1, 500, 64), "bfloat16", "bottom_right",
             sch(warps=8, key_warps=4, block_k=64, splits=3, cluster=1), False),
            ((2, 8, 1, 128), (2, 2, 700, 128), "float16", False, sch(**r4, tma=1, stages=3, splits=2, cluster=1), True),
            ((1, 4, 1, 64), (1, 1, 1000, 64), "float16", False,
             sch(warps=8, key_warps=8, block_k=128, tma=1, stages=2), False),
            ((1, 8, 1, 128), (1, 2, 2000, 128), "bfloat16", False,          # the B=1 pick's shape: 8 splits in a cluster
             sch(warps=8, key_warps=8, block_k=128, tma=1, stages=2, splits=8, cluster=1), False)]
    bad = 0
    for q_shape, kv_shape, dtype, causal, sched, unaligned in runs:
        tdt = getattr(torch, dtype)
        q, k, v = (torch.randn(s, device="cuda", dtype=tdt) for s in (q_shape, kv_shape, kv_shape))
        if unaligned:     # the same values 2 bytes off 16-byte alignment: no tensor map, plain stores
            q, k, v = (torch.cat([t.new_zeros(1), t.reshape(-1)])[1:].view(t.shape) for t in (q, k, v))
        out = torch.full_like(q, float("nan"))
        jitops.attention(q, k, v, causal=causal, out=out, schedule=sched)
        torch.cuda.synchronize()
        kk = k.double().repeat_interleave(q_shape[1] // kv_shape[1], 1)
        vv = v.double().repeat_interleave(q_shape[1] // kv_shape[1], 1)
        s = q.double() @ kk.transpose(-1, -2) / q_shape[-1] ** 0.5
        if causal:
            i = torch.arange(q_shape[2], device="cuda")[:, None]
            j = torch.arange(kv_shape[2], device="cuda")[None, :]
            s = s.masked_fill(j > i + kv_shape[2] - q_shape[2], float("-inf"))
        ref = torch.softmax(s, -1) @ vv
        p = op.make_problem({"q": TensorSpec(q_shape, dtype), "k": TensorSpec(kv_shape, dtype),
                             "v": TensorSpec(kv_shape, dtype), "mask": None}, {"causal": causal})
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        ok = err <= op.tolerance(p, sched)[0] and not torch.isnan(out).any()
        bad += not ok
        print(f"sanitize case {q_shape} {kv_shape} {dtype} causal={causal} {sched}{' unaligned' if unaligned else ''}: "
              f"err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    sys.exit(1 if bad else 0)


def sanitize(out_dir: str | None) -> dict:
    results = {}
    for tool in ("memcheck", "racecheck"):
        t0 = time.time()
        proc = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                               __file__, "--sanitize-case"], capture_output=True, text=True, timeout=240)
        text = proc.stdout + proc.stderr
        summary = [line for line in text.splitlines() if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line
                   or "sanitize case" in line]
        results[tool] = {"rc": proc.returncode, "seconds": round(time.time() - t0, 1), "summary": summary}
        print(f"compute-sanitizer {tool}: rc {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
        for line in summary:
            print("   ", line, flush=True)
        if proc.returncode and out_dir:
            with open(f"{out_dir}/sanitizer_{tool}.txt", "w") as f:
                f.write(text[-20000:])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", nargs="+", choices=sorted(PROBLEMS), default=["llama"])
    ap.add_argument("--dtype", nargs="+", choices=("float16", "bfloat16"), default=["float16"])
    ap.add_argument("--sweep", choices=sorted(SWEEPS))
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--sanitize", metavar="DIR", nargs="?", const="", help="memcheck / racecheck (logs of failures to DIR)")
    ap.add_argument("--sanitize-case", action="store_true")
    ap.add_argument("--final", type=int, metavar="ROUNDS", help="pick vs cp.async pick vs SDPA, taking turns")
    ap.add_argument("schedules", nargs="*")
    args = ap.parse_args()
    if args.sanitize_case:
        sanitize_case()
    if args.sanitize is not None:
        sanitize(args.sanitize or None)
        return
    timer = Timer(torch)
    rows: list[dict] = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    for dtype in args.dtype:
        for name in args.problem:
            if args.final:
                final(name, dtype, args.final, timer, rows)
                continue
            specs = list(args.schedules) + (SWEEPS[args.sweep].get(name, []) if args.sweep else [])
            probe(name, dtype, specs, timer, args.once, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
