"""attention cases: the seed shape B=256, S=128, D=64 (fp32, fp32 with TF32 products, fp16) and B=8, H=16,
S=2048, D=64 (fp16; fp32 with TF32 in the full run),
plus the attention layers of real models (MODELS, fp16 and bf16; BERT with the padding mask its ONNX exports
pass, PADDED), against
torch.nn.functional.scaled_dot_product_attention on the same tensors (enable_gqa for grouped
heads); every algorithm when asked; each case checked against a float64 reference (torch on the GPU)
before it is timed.

`python -m jitops.bench.attention --sweep` times every candidate schedule of these problems with
CUDA-graph replay, next to SDPA, for tuning the scheduler.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Iterator

import numpy as np

import jitops

from ..errors import ScheduleError
from ..ops import get_op
from ..ops.base import Schedule, TensorSpec
from . import Case, Context

OP = "attention"

# (name, q shape [B, H, Sq, D], kv shape [B, Hk, Sk, D], causal): the attention layers of real models.
MODELS: tuple[tuple[str, tuple, tuple, bool], ...] = (
    ("ViT-B/16 S=197", (8, 12, 197, 64), (8, 12, 197, 64), False),
    ("CLIP ViT-L/14 S=257", (8, 16, 257, 64), (8, 16, 257, 64), False),
    ("BERT-base S=128", (32, 12, 128, 64), (32, 12, 128, 64), False),
    ("SD1.5 self D=40", (2, 8, 4096, 40), (2, 8, 4096, 40), False),
    ("SD1.5 cross Sk=77 D=40", (2, 8, 4096, 40), (2, 8, 77, 40), False),
    ("SDXL cross Sk=77 H=10 S=4096", (2, 10, 4096, 64), (2, 10, 77, 64), False),
    ("Whisper decoder cross Sq=64 Sk=1500", (8, 20, 64, 64), (8, 20, 1500, 64), False),
    ("SDXL self H=10 S=4096", (2, 10, 4096, 64), (2, 10, 4096, 64), False),
    ("Whisper enc H=20 S=1500", (1, 20, 1500, 64), (1, 20, 1500, 64), False),
    ("Llama3-8B prefill GQA causal", (1, 32, 2048, 128), (1, 8, 2048, 128), True),
    ("Llama3-8B decode B=16 Sk=4096", (16, 32, 1, 128), (16, 8, 4096, 128), False),
    ("Llama3-8B decode B=1 Sk=4096", (1, 32, 1, 128), (1, 8, 4096, 128), False),     # single-stream serving
    ("Falcon-7B decode MQA Sk=2048", (16, 71, 1, 64), (16, 1, 2048, 64), False),
    ("GPT-2 causal S=1024", (8, 12, 1024, 64), (8, 12, 1024, 64), True),
    ("DiT-XL S=1024 D=72", (4, 16, 1024, 72), (4, 16, 1024, 72), False),
    ("Gemma-7B prefill D=256 causal", (1, 16, 2048, 256), (1, 16, 2048, 256), True),
    ("Llama-2-7B prefill B=2 S=4096 causal", (2, 32, 4096, 128), (2, 32, 4096, 128), True),
    ("B=8 H=16 S=2048 D=128", (8, 16, 2048, 128), (8, 16, 2048, 128), False),          # issue 16's D = 128 pair
    ("B=8 H=16 S=2048 D=128 causal", (8, 16, 2048, 128), (8, 16, 2048, 128), True),
    ("BERT-base S=384", (32, 12, 384, 64), (32, 12, 384, 64), False),
    ("BERT-base S=384 padding mask", (32, 12, 384, 64), (32, 12, 384, 64), False),
    ("BERT-large S=512 padding mask", (16, 16, 512, 64), (16, 16, 512, 64), False),
)
# Rows that pass an additive [B, 1, 1, Sk] padding mask (-inf past each batch's length, lengths Sk/2..Sk),
# as ONNX exports of BERT do: jitops and SDPA both take it.
PADDED = frozenset(name for name, *_ in MODELS if name.endswith("padding mask"))
# fp32 rows run with precision "tf32" (fused_tf32: TF32 products on the matrix cores; SDPA in fp32 beside).
TF32 = frozenset(("B=256 S=128 D=64 TF32", "B=8 H=16 S=2048 D=64 TF32"))


def problems(ctx: Context) -> list[tuple[str, tuple, tuple, str, bool]]:
    """(name, q shape, kv shape, dtype, causal)."""
    if not ctx.on_gpu:
        return [("B=2 S=64 D=64", (2, 64, 64), (2, 64, 64), "float32", False),
                ("B=2 S=64 D=64", (2, 64, 64), (2, 64, 64), "float16", False)]
    seed = (256, 128, 64)
    big = (8, 16, 2048, 64)
    out = [("B=256 S=128 D=64", seed, seed, "float32", False),
           ("B=256 S=128 D=64 TF32", seed, seed, "float32", False),
           ("B=256 S=128 D=64", seed, seed, "float16", False),
           ("B=8 H=16 S=2048 D=64", big, big, "float16", False)]
    if not ctx.quick:
        out.append(("B=8 H=16 S=2048 causal", big, big, "float16", True))
        out.append(("B=8 H=16 S=2048 D=64 TF32", big, big, "float32", False))
        for dtype in ("float16", "bfloat16"):
            out.extend((name, q, kv, dtype, causal) for name, q, kv, causal in MODELS)
    return out


def _precision(name: str) -> str:
    return "tf32" if name in TF32 else "highest"


def _problem(q_shape: tuple, kv_shape: tuple, dtype: str, causal: bool, padded: bool = False,
             precision: str = "highest") -> Any:
    mask = TensorSpec((kv_shape[0], 1, 1, kv_shape[2]), dtype) if padded else None
    specs = {"q": TensorSpec(q_shape, dtype), "k": TensorSpec(kv_shape, dtype), "v": TensorSpec(kv_shape, dtype),
             "mask": mask}
    return get_op(OP).make_problem(specs, {"causal": causal, "scale": None, "precision": precision})


def padding_mask(torch: Any, kv_shape: tuple, dtype: Any) -> Any:
    """[B, 1, 1, Sk]: 0 on each batch's first L keys, -inf after (L random in Sk/2..Sk, seeded)."""
    b, sk = kv_shape[0], kv_shape[2]
    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = torch.randint(sk // 2, sk + 1, (b,), device="cuda", generator=g)
    keys = torch.arange(sk, device="cuda").view(1, 1, 1, sk)
    return torch.zeros(b, 1, 1, sk, device="cuda", dtype=dtype).masked_fill(keys >= lengths.view(-1, 1, 1, 1), float("-inf"))


def _variants(ctx: Context, problem: Any) -> list[str]:
    if ctx.algorithms == "heuristic":
        return ["heuristic"]
    op = get_op(OP)
    device = jitops.get_backend().device
    out = ["heuristic"]
    for algorithm in op.ALGORITHMS:
        try:
            op.heuristic(problem, device, algorithm)
        except ScheduleError:
            continue
        out.append(algorithm)
    return out


def _repeats(problem: Any, variant: str) -> int:
    """Fewer calls per trial for the slow baselines on big problems (0: the harness default)."""
    gflop = problem.flops() / 1e9
    if variant == "naive" and gflop > 10:
        return 1
    if variant in ("naive", "three_stage") and gflop > 1:
        return 5
    return 0


def _four_d(*tensors: Any) -> tuple:
    """[B, S, D] as [B, 1, S, D] views. SDPA's fused kernels want 4-D inputs: on the 3-D seed tensors
    torch 2.11 took 88 / 120 us (fp32 / fp16) on an H200, far from BENCHMARKS.md's 44 / 16.5 us.
    We compare with its faster path; the sweep prints both."""
    return tuple(t.unsqueeze(1) if t.dim() == 3 else t for t in tensors)


def torch_reference(torch: Any, q: Any, k: Any, v: Any, causal: bool | str, mask: Any = None) -> Any:
    """softmax(q k^T / sqrt(D) + mask) v in float64 on the GPU (causal: top-left, as SDPA, or "bottom_right",
    KV-cache decoding's diagonal), kv heads shared
    by groups of query heads; a few heads at a time (the scores of SD 1.5 are 2 GiB in float64). A mask
    is [B, 1, 1, Sk] (a padding mask) or None."""
    if q.dim() == 4 and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    qf, kf, vf = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    heads = qf.shape[0] // q.shape[0]
    # per flattened (batch, head): its batch's mask row
    mf = None if mask is None else mask.double().reshape(q.shape[0], 1, 1, -1).repeat_interleave(heads, dim=0)
    out = torch.empty(qf.shape, dtype=torch.float64, device=q.device)
    step = max(1, (1 << 27) // (q.shape[-2] * k.shape[-2]))
    for i in range(0, qf.shape[0], step):
        s = qf[i:i + step].double() @ kf[i:i + step].double().transpose(-1, -2) / q.shape[-1] ** 0.5
        if mf is not None:
            s = s + mf[i:i + step].reshape(-1, 1, s.shape[-1])
        if causal:
            n, m = s.shape[-2:]
            diagonal = m - n if causal == "bottom_right" else 0
            s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool, device=s.device).tril(diagonal), float("-inf"))
        out[i:i + step] = torch.softmax(s, dim=-1) @ vf[i:i + step].double()
        del s
    return out.reshape(q.shape)


def sdpa_call(torch: Any, q: Any, k: Any, v: Any, causal: bool, mask: Any = None) -> Callable[[], Any]:
    """SDPA on the same tensors: 4-D views of 3-D ones, enable_gqa when kv heads are shared."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q4, k4, v4 = _four_d(q, k, v)
    if mask is not None:
        return lambda: sdpa(q4, k4, v4, attn_mask=mask)
    if k4.shape[1] != q4.shape[1]:
        return lambda: sdpa(q4, k4, v4, is_causal=causal, enable_gqa=True)
    return lambda: sdpa(q4, k4, v4, is_causal=causal)


def _case_gpu(ctx: Context, name: str, q_shape: tuple, kv_shape: tuple, dtype: str, causal: bool, variant: str,
              problem: Any) -> Case:
    torch = ctx.torch
    tdt = getattr(torch, dtype)
    q = torch.randn(q_shape, device="cuda", dtype=tdt)
    k = torch.randn(kv_shape, device="cuda", dtype=tdt)
    v = torch.randn(kv_shape, device="cuda", dtype=tdt)
    mask = padding_mask(torch, kv_shape, tdt) if name in PADDED else None
    out = torch.empty_like(q)
    schedule = None if variant == "heuristic" else variant
    precision = problem.precision

    def check() -> float:
        out.fill_(float("nan"))
        jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule, precision=precision)
        ref = torch_reference(torch, q, k, v, causal, mask)
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        rtol, _ = _tolerance(problem, schedule)
        assert err <= rtol and not torch.isnan(out).any(), f"error {err:.3g} > {rtol} (or NaN left in output)"
        del ref
        return err

    return Case(OP, f"{name} {dtype}", variant,
                jitops=lambda: jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule,
                                                precision=precision),
                check=check, vendor=sdpa_call(torch, q, k, v, causal, mask), vendor_name="torch.sdpa",
                bytes=problem.bytes_moved(), flops=problem.flops(),
                schedule=lambda: _schedule_text(problem, schedule), repeats=_repeats(problem, variant))


def _case_cpu(ctx: Context, name: str, q_shape: tuple, kv_shape: tuple, dtype: str, causal: bool, variant: str,
              problem: Any) -> Case:
    op = get_op(OP)
    data = {n: ctx.rng.standard_normal(s).astype(dtype) for n, s in (("q", q_shape), ("k", kv_shape), ("v", kv_shape))}
    out = np.empty(q_shape, dtype=dtype)
    schedule = None if variant == "heuristic" else variant

    def check() -> float:
        out.fill(np.nan)
        jitops.attention(data["q"], data["k"], data["v"], causal=causal, out=out, schedule=schedule)
        ref = op.reference(problem, data)["out"]
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        rtol, _ = _tolerance(problem, schedule)
        assert err <= rtol and not np.isnan(out).any(), f"error {err:.3g} > {rtol} (or NaN left in output)"
        return err

    return Case(OP, f"{name} {dtype}", variant,
                jitops=lambda: jitops.attention(data["q"], data["k"], data["v"], causal=causal, schedule=schedule),
                check=check, bytes=problem.bytes_moved(), flops=problem.flops(),
                schedule=lambda: _schedule_text(problem, schedule))


def _tolerance(problem: Any, schedule: str | None) -> tuple[float, float]:
    op = get_op(OP)
    sched, _ = _select(problem, schedule)
    return op.tolerance(problem, sched)


def _select(problem: Any, forced: str | Schedule | None) -> tuple[Schedule, str]:
    from ..engine import select_schedule
    return select_schedule(get_op(OP), problem, jitops.get_backend().device, forced)


def _schedule_text(problem: Any, forced: str | None) -> str:
    sched, origin = _select(problem, forced)
    return f"{sched} [{origin}]"


def cases(ctx: Context) -> Iterator[Case]:
    make: Callable[..., Case] = _case_gpu if ctx.on_gpu else _case_cpu
    models = {m[0] for m in MODELS}
    for name, q_shape, kv_shape, dtype, causal in problems(ctx):
        problem = _problem(q_shape, kv_shape, dtype, causal, name in PADDED, _precision(name))
        for variant in (["heuristic"] if name in models else _variants(ctx, problem)):   # model rows: ours only
            yield make(ctx, name, q_shape, kv_shape, dtype, causal, variant, problem)


# ---------------------------------------------------------------- tuning sweep

def sweep(quick: bool = False) -> list[dict[str, Any]]:
    """Every candidate schedule of the bench problems: error, graph-replay time, ratio to SDPA."""
    from . import make_context
    ctx = make_context(quick)
    if not ctx.on_gpu:
        raise SystemExit("the sweep needs a GPU with torch")
    torch, timer = ctx.torch, ctx.timer
    op = get_op(OP)
    device = jitops.get_backend().device
    rows = []
    for name, q_shape, kv_shape, dtype, causal in problems(ctx):
        problem = _problem(q_shape, kv_shape, dtype, causal, name in PADDED, _precision(name))
        precision = problem.precision
        tdt = getattr(torch, dtype)
        q, k, v = (torch.randn(s, device="cuda", dtype=tdt) for s in (q_shape, kv_shape, kv_shape))
        mask = padding_mask(torch, kv_shape, tdt) if name in PADDED else None
        out = torch.empty_like(q)
        ref = torch_reference(torch, q, k, v, causal, mask)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        vendor_us = timer.graph_us(sdpa_call(torch, q, k, v, causal, mask), n=20)
        if q.dim() == 3:
            print(f"{name} {dtype}: SDPA on 3-D tensors {timer.graph_us(lambda: sdpa(q, k, v), n=20):.1f} us, "
                  f"on the 4-D view {vendor_us:.1f} us", flush=True)
        print(f"{name} {dtype}: heuristic {op.heuristic(problem, device)}", flush=True)
        mma = any(c.algorithm == "fused_mma" for c in op.candidates(problem, device))
        for sched in op.candidates(problem, device):
            if sched.algorithm == "naive" or (sched.algorithm == "three_stage" and problem.flops() > 1e11):
                continue
            if mma and sched.algorithm == "fused" and sched != op.heuristic(problem, device, "fused"):
                continue      # with matrix cores, only the scheduler's SIMT tile for reference
            out.fill_(float("nan"))
            jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=sched, precision=precision)
            err = float((out.double() - ref).abs().max() / ref.abs().max())
            us = timer.graph_us(lambda: jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=sched,
                                                         precision=precision), n=20)
            rows.append({"problem": f"{name} {dtype}", "schedule": str(sched), "error": err, "us": us,
                         "sdpa_us": vendor_us, "ratio": vendor_us / us if us and vendor_us else None,
                         "tflops": problem.flops() / (us * 1e-6) / 1e12 if us else None})
            print(f"{rows[-1]['problem']:<34} {us:9.1f} us  sdpa {vendor_us:9.1f}  ratio {rows[-1]['ratio']:5.2f}  "
                  f"{rows[-1]['tflops']:6.1f} TFLOP/s  err {err:.1e}  {sched}", flush=True)
        del ref
        torch.cuda.empty_cache()
    print("\nbest per problem (graph replay):")
    for name in dict.fromkeys(r["problem"] for r in rows):
        mine = [r for r in rows if r["problem"] == name and r["error"] == r["error"]]
        best = min(mine, key=lambda r: r["us"])
        print(f"{name:<34} best {best['us']:9.1f} us  sdpa {best['sdpa_us']:9.1f}  ratio {best['ratio']:5.2f}  "
              f"{best['tflops']:6.1f} TFLOP/s  {best['schedule']}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true", help="time every candidate schedule (GPU)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if args.sweep:
        rows = sweep(args.quick)
        if args.json:
            import json
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
