"""conv2d cases: the 15 problems of ../shared/BENCHMARKS.md against torch (cuDNN, no TF32).

fp32: every problem, the scheduler's pick and (algorithms="all") every applicable algorithm
forced, plus the naive kernel for the seed-style speedup table. fp16: every problem, the
scheduler's pick (the matrix-core kernel on GPUs that have them; scripts/device_conv2d.py times
fp16 / bf16 against cuDNN in both memory formats and on real-network layers). Each case is checked
against a float64 reference (computed once per problem) before it is timed.

The vendor side runs with torch.backends.cudnn.benchmark = True, so cuDNN times its own
algorithms and uses its fastest: the comparison is against cuDNN at its best, not its default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

import jitops

from . import Case, Context

OP = "conv2d"


@dataclass(frozen=True)
class ConvProblem:
    name: str
    n: int
    cin: int
    h: int
    w: int
    cout: int
    k: int
    pad: int
    k100: bool = False


PROBLEMS = [
    ConvProblem("small_1", 1, 3, 64, 64, 16, 3, 1),
    ConvProblem("mobilenet_like", 1, 64, 56, 56, 64, 3, 1),
    ConvProblem("resnet_block", 1, 64, 56, 56, 128, 1, 0),
    ConvProblem("medium", 1, 32, 128, 128, 64, 3, 1),
    ConvProblem("large_batch", 8, 64, 128, 128, 128, 3, 1),
    ConvProblem("large_spatial", 4, 64, 256, 256, 128, 3, 1),
    ConvProblem("very_wide_pointwise", 1, 128, 32, 320, 256, 1, 0),
    ConvProblem("1x1_heavy_channels", 1, 512, 16, 16, 512, 1, 0),
    ConvProblem("5x5_kernel", 1, 32, 64, 64, 64, 5, 2),
    ConvProblem("k100_1", 16, 128, 64, 64, 27, 3, 1, True),
    ConvProblem("k100_2", 16, 256, 32, 32, 256, 3, 1, True),
    ConvProblem("k100_3", 16, 64, 128, 128, 64, 3, 1, True),
    ConvProblem("k100_4", 2, 1920, 32, 32, 640, 3, 1, True),
    ConvProblem("k100_5", 2, 640, 64, 64, 640, 3, 1, True),
    ConvProblem("k100_6", 2, 320, 64, 64, 4, 3, 1, True),
]
QUICK = ("small_1", "resnet_block", "1x1_heavy_channels", "5x5_kernel", "k100_2", "k100_6")
# On the CPU emulator: the same kinds of problem, scaled down to a few thousand outputs.
EMULATOR = [
    ConvProblem("tiny_3x3", 1, 3, 16, 16, 8, 3, 1),
    ConvProblem("tiny_1x1", 1, 16, 8, 8, 24, 1, 0),
    ConvProblem("tiny_5x5", 1, 8, 12, 12, 8, 5, 2),
    ConvProblem("tiny_k100_6", 2, 32, 8, 8, 4, 3, 1),
]


def problems(ctx: Context) -> list[ConvProblem]:
    if not ctx.on_gpu:
        return EMULATOR[:2] if ctx.quick else EMULATOR
    if ctx.quick:
        return [p for p in PROBLEMS if p.name in QUICK]
    return PROBLEMS


def op_problem(cp: ConvProblem, dtype: str) -> Any:
    from ..ops import get_op
    from ..ops.base import TensorSpec
    return get_op(OP).make_problem({"x": TensorSpec((cp.n, cp.cin, cp.h, cp.w), dtype),
                                    "w": TensorSpec((cp.cout, cp.cin, cp.k, cp.k), dtype)}, {"padding": cp.pad})


def variants(ctx: Context, cp: ConvProblem, dtype: str) -> list[str]:
    """The engine's pick ("heuristic": a tuning record if one applies, else the cost model), then
    (all) the cost model's own pick ("model") and every applicable algorithm forced (each at the
    model's best parameters for it); naive for fp32 always."""
    from ..ops import get_op
    op = get_op(OP)
    if dtype == "float16":
        return ["heuristic"]
    out = ["heuristic"]
    if ctx.algorithms == "all":
        p = op_problem(cp, dtype)
        out += ["model"] + [a for a in op.ALGORITHMS if a != "naive" and op.applicable(p, a, jitops.get_backend().device)
                            and not (a == "implicit_gemm" and p.is_pointwise)]     # there it is gemm_1x1
    return out + ["naive"]


def _forced(cp: ConvProblem, dtype: str, variant: str) -> Any:
    """The schedule argument for a variant: None (engine's choice), a Schedule or an algorithm name."""
    if variant == "heuristic":
        return None
    if variant == "model":
        from ..ops import get_op
        return get_op(OP).heuristic(op_problem(cp, dtype), jitops.get_backend().device)
    return variant


def schedule_text(cp: ConvProblem, dtype: str, forced: Any) -> str:
    from ..engine import select_schedule
    from ..ops import get_op
    op = get_op(OP)
    sched, origin = select_schedule(op, op_problem(cp, dtype), jitops.get_backend().device, forced)
    return f"{sched} [{origin}]"


def _tolerance(cp: ConvProblem, dtype: str, forced: Any) -> float:
    from ..engine import select_schedule
    from ..ops import get_op
    op = get_op(OP)
    p = op_problem(cp, dtype)
    sched, _ = select_schedule(op, p, jitops.get_backend().device, forced)
    return op.tolerance(p, sched)[0]


def _gpu_cases(ctx: Context, cp: ConvProblem, dtype: str) -> Iterator[Case]:
    torch = ctx.torch
    torch.backends.cudnn.benchmark = True
    tdt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(1000 + PROBLEMS.index(cp))
    x = torch.randn(cp.n, cp.cin, cp.h, cp.w, device="cuda", generator=gen).to(tdt)
    w = (torch.randn(cp.cout, cp.cin, cp.k, cp.k, device="cuda", generator=gen) / (cp.cin * cp.k * cp.k) ** 0.5).to(tdt)
    out = torch.empty(cp.n, cp.cout, cp.h + 2 * cp.pad - cp.k + 1, cp.w + 2 * cp.pad - cp.k + 1, device="cuda",
                      dtype=tdt)
    ref_holder: dict[str, Any] = {}

    def reference() -> Any:
        if "y" not in ref_holder:
            ref_holder["y"] = reference_f64(torch, x, w, cp.pad)
            ref_holder["scale"] = float(ref_holder["y"].abs().max())
        return ref_holder["y"]

    flops = op_problem(cp, dtype).flops
    for variant in variants(ctx, cp, dtype):
        forced = _forced(cp, dtype, variant)

        def check(forced: Any = forced) -> float:
            out.fill_(float("nan"))
            jitops.conv2d(x, w, padding=cp.pad, out=out, schedule=forced)
            ref = reference()
            err = float((out.double() - ref).abs().max()) / max(ref_holder["scale"], 1e-30)
            tol = _tolerance(cp, dtype, forced)
            assert not torch.isnan(out).any(), "NaN left in the output (unwritten elements)"
            assert err <= tol, f"error {err:.3e} > {tol:.1e}"
            return err

        yield Case(OP, f"{cp.name} {dtype}", variant,
                   jitops=_jitops_call(x, w, cp.pad, forced), check=check,
                   vendor=lambda: torch.nn.functional.conv2d(x, w, padding=cp.pad), vendor_name="cudnn",
                   flops=flops, schedule=lambda forced=forced: schedule_text(cp, dtype, forced))


def reference_f64(torch: Any, x: Any, w: Any, pad: int) -> Any:
    """Stride-1 convolution in float64 on the GPU as im2col + DGEMM (cuDNN's float64 convolution
    can take seconds on the largest problems; this takes milliseconds)."""
    n, _, h, wd = x.shape
    cout, _, kh, kw = w.shape
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    cols = torch.nn.functional.unfold(x.double(), (kh, kw), padding=pad)          # N x (C*kh*kw) x (oh*ow)
    return (w.double().reshape(cout, -1) @ cols).reshape(n, cout, oh, ow)


def _jitops_call(x: Any, w: Any, pad: int, forced: Any) -> Callable[[], Any]:
    return lambda: jitops.conv2d(x, w, padding=pad, schedule=forced)


def _cpu_cases(ctx: Context, cp: ConvProblem) -> Iterator[Case]:
    from ..ops import get_op
    op = get_op(OP)
    p = op_problem(cp, "float32")
    inputs = op.random_inputs(p, ctx.rng)
    x, w = inputs["x"], inputs["w"]
    ref = op.reference(p, inputs)["y"]
    out = np.empty(ref.shape, np.float32)
    for variant in variants(ctx, cp, "float32"):
        forced = _forced(cp, "float32", variant)

        def check(forced: Any = forced) -> float:
            out.fill(np.nan)
            jitops.conv2d(x, w, padding=cp.pad, out=out, schedule=forced)
            err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
            tol = _tolerance(cp, "float32", forced)
            assert not np.isnan(out).any() and err <= tol, f"error {err:.3e} > {tol:.1e} (or NaN left)"
            return err

        yield Case(OP, f"{cp.name} float32", variant, jitops=_jitops_call(x, w, cp.pad, forced), check=check,
                   flops=p.flops, schedule=lambda forced=forced: schedule_text(cp, "float32", forced))


def cases(ctx: Context) -> Iterator[Case]:
    for cp in problems(ctx):
        if not ctx.on_gpu:
            yield from _cpu_cases(ctx, cp)
            continue
        yield from _gpu_cases(ctx, cp, "float32")
    if ctx.on_gpu:
        for cp in problems(ctx):
            yield from _gpu_cases(ctx, cp, "float16")


def summarize(rows: list[dict[str, Any]], variant: str = "heuristic") -> dict[str, Any]:
    """Geometric-mean ratio against cuDNN over the fp32 rows of one variant, and speedups over naive."""
    picked = {r["problem"]: r for r in rows if r["op"] == OP and r["variant"] == variant}
    naive = {r["problem"]: r for r in rows if r["op"] == OP and r["variant"] == "naive"}
    ratios = [r["ratio"] for k, r in picked.items() if k.endswith("float32") and r.get("ratio")]
    geo = float(np.exp(np.mean(np.log(ratios)))) if ratios else None
    speedups = {k: _t(naive[k]) / _t(r) for k, r in picked.items() if k in naive and _t(r)}
    return {"fp32_geomean_vs_cudnn": geo, "fp32_min_vs_cudnn": min(ratios) if ratios else None,
            "speedup_over_naive": speedups}


def _t(r: dict[str, Any]) -> float:
    return r["jitops_graph_us"] or r["jitops_us"]


def markdown(report: dict[str, Any]) -> str:
    """docs/performance.md rows from a `jitops bench --json` report."""
    env = report["environment"]
    rows = [r for r in report["rows"] if r["op"] == OP]
    by = {(r["problem"], r["variant"]): r for r in rows}
    peak = PEAK_FP32.get(env["arch"])
    lines = ["| problem | jitops us | cuDNN us | ratio | TFLOP/s | % fp32 peak | vs naive | model pick us (ratio) | "
             "jitops schedule [origin] |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["variant"] != "heuristic":
            continue
        jt = _t(r)
        vt = r["vendor_graph_us"] or r["vendor_us"]
        nv = by.get((r["problem"], "naive"))
        md = by.get((r["problem"], "model"))
        speed = f"{_t(nv) / jt:.1f}x" if nv else "-"
        pct = f"{100 * r['tflops'] / peak:.0f}%" if peak and r["tflops"] else "-"
        model = f"{_t(md):.1f} ({_f(md['ratio'], '.2f')})" if md else "-"
        lines.append(f"| {r['problem']} | {_f(jt, '.1f')} | {_f(vt, '.1f')} | {_f(r['ratio'], '.2f')} | "
                     f"{_f(r['tflops'], '.2f')} | {pct} | {speed} | {model} | `{r['schedule']}` |")
    lines.append("")
    for variant, label in (("heuristic", "engine's pick"), ("model", "cost model's pick")):
        s = summarize(rows, variant)
        if s["fp32_geomean_vs_cudnn"] is not None:
            lines.append(f"fp32, {label}: geometric-mean ratio {s['fp32_geomean_vs_cudnn']:.2f}, lowest "
                         f"{s['fp32_min_vs_cudnn']:.2f}")
    lines.append(f"({env['device']}, {env['date']}, torch {env.get('torch')}, cuDNN {env.get('cudnn')})")
    return "\n".join(lines)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


# Datasheet fp32 (non-tensor) peak, TFLOP/s, for the "% of peak" column.
PEAK_FP32 = {"sm_90": 67.0, "sm_80": 19.5}


if __name__ == "__main__":
    import json
    import sys
    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)))
