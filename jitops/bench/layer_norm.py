"""layer_norm cases: 4096 x 4096 and tokens x hidden (8192 tokens, hidden 1024 ... 8192), fp32
and fp16, bf16 (fp32 parameters), against torch.nn.functional.layer_norm; every algorithm when
ctx.algorithms == "all".

The helpers here (norm_cases) build the cases of all four norm benchmarks: inputs made on the
device, a float64 reference computed there too, the output poisoned with NaN before the check.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

import jitops

from ..errors import ScheduleError
from ..ops import get_op
from ..ops.base import TensorSpec
from . import Case, Context

TOKENS = 8192
DEVICE = "cuda"     # where torch inputs are made (a CPU dry run of the GPU path sets "cpu")
HIDDEN = (1024, 2048, 4096, 8192)


def schedule_text(op_name: str, problem: Any, forced: str | None) -> str:
    from ..engine import select_schedule
    sched, origin = select_schedule(get_op(op_name), problem, jitops.get_backend().device, forced)
    return f"{sched} [{origin}]"


def variants(ctx: Context, op_name: str, problem: Any, algorithms: tuple[str, ...]) -> list[str]:
    """"heuristic", then every other algorithm that can run this problem (when asked for all)."""
    out = ["heuristic"]
    if ctx.algorithms != "all":
        return out
    op = get_op(op_name)
    device = jitops.get_backend().device
    chosen = op.heuristic(problem, device).algorithm
    for alg in algorithms:
        if alg == chosen:
            continue
        try:
            sched = op.heuristic(problem, device, alg)
            op.plan(problem, sched, device)
        except ScheduleError:
            continue
        if alg == "warp" and int(sched["items"]) > 16:
            continue            # a 64-vector-per-lane warp kernel is not a contender, only slow
        out.append(alg)
    return out


def torch_inputs(ctx: Context, op_name: str, problem: Any) -> dict[str, Any]:
    """Random device tensors (never zeros): x ~ 0.5 + 2 N(0, 1), parameters near 1 / 0."""
    torch = ctx.torch
    specs: dict[str, TensorSpec] = problem.inputs()
    out = {}
    for name, spec in specs.items():
        dt = getattr(torch, spec.dtype)
        if name == "x":
            t = torch.randn(spec.shape, device=DEVICE, dtype=torch.float32).mul_(2.0).add_(0.5)
        elif name == "var":
            t = torch.rand(spec.shape, device=DEVICE, dtype=torch.float32).add_(0.5)
        elif name in ("gamma",):
            t = torch.randn(spec.shape, device=DEVICE, dtype=torch.float32).mul_(0.5).add_(1.0)
        else:
            t = torch.randn(spec.shape, device=DEVICE, dtype=torch.float32).mul_(0.3)
        t = t.to(dt)
        if spec.layout == "nhwc":       # channels_last: torch and jitops get the same strided tensor
            t = t.contiguous(memory_format=torch.channels_last)
        out[name] = t
    return out


def call(op_name: str, problem: Any, ins: dict[str, Any], out: Any = None, schedule: str | None = None) -> Any:
    # numpy arrays of an NHWC problem are in storage order: say so (torch tensors carry it)
    layout = "nhwc" if getattr(problem, "layout", "") == "nhwc" and isinstance(ins["x"], np.ndarray) else None
    if op_name == "batch_norm":
        return jitops.batch_norm(ins["x"], ins["mean"], ins["var"], ins.get("gamma"), ins.get("beta"),
                                 eps=problem.eps, activation=problem.activation, alpha=problem.alpha or 0.01,
                                 layout=layout, out=out, schedule=schedule)
    if op_name == "group_norm":
        return jitops.group_norm(ins["x"], problem.groups, ins.get("gamma"), ins.get("beta"), eps=problem.eps,
                                 layout=layout, out=out, schedule=schedule)
    skip = {"residual": ins.get("residual"), "bias": ins.get("bias"), "return_sum": bool(problem.has_sum)}
    if op_name == "layer_norm":
        return jitops.layer_norm(ins["x"], problem.normalized_shape, ins.get("gamma"), ins.get("beta"),
                                 eps=problem.eps, out=out, schedule=schedule, **skip)
    return jitops.rms_norm(ins["x"], problem.normalized_shape, ins.get("gamma"), eps=problem.eps, out=out,
                           schedule=schedule, **skip)


def torch_reference(op_name: str, problem: Any, ins: dict[str, Any]) -> Any:
    """float64 on the device: the definition, not torch's kernels."""
    x = ins["x"].double()
    p = {n: t.double() for n, t in ins.items() if n != "x" and not n.startswith("_")}
    if op_name == "batch_norm":
        shape = (1, -1) + (1,) * (x.dim() - 2)
        y = (x - p["mean"].view(shape)) / (p["var"].view(shape) + problem.eps).sqrt()
        if "gamma" in p:
            y = y * p["gamma"].view(shape)
        if "beta" in p:
            y = y + p["beta"].view(shape)
        if problem.activation == "relu":
            y = y.clamp_min(0)
        elif problem.activation == "leaky_relu":
            y = y.where(y >= 0, y * problem.alpha)
        return y
    if op_name == "group_norm":
        spec = problem.row_spec()
        rows = x.reshape(spec.rows, spec.length)
        mean = rows.mean(dim=1, keepdim=True)
        var = (rows - mean).square().mean(dim=1, keepdim=True)
        y = ((rows - mean) / (var + problem.eps).sqrt()).reshape(x.shape[0], x.shape[1], -1)
        if "gamma" in p:
            y = y * p["gamma"].view(1, -1, 1)
        if "beta" in p:
            y = y + p["beta"].view(1, -1, 1)
        return y.reshape(x.shape)
    rows = x.reshape(problem.rows, problem.length)
    if op_name == "rms_norm":
        y = rows / (rows.square().mean(dim=1, keepdim=True) + problem.eps).sqrt()
    else:
        mean = rows.mean(dim=1, keepdim=True)
        y = (rows - mean) / ((rows - mean).square().mean(dim=1, keepdim=True) + problem.eps).sqrt()
    if "gamma" in p:
        y = y * p["gamma"].reshape(1, -1)
    if "beta" in p:
        y = y + p["beta"].reshape(1, -1)
    return y.reshape(x.shape)


def gpu_case(ctx: Context, op_name: str, problem: Any, label: str, variant: str,
             vendor: Callable[[dict[str, Any]], Any]) -> Case:
    torch = ctx.torch
    op = get_op(op_name)
    ins = torch_inputs(ctx, op_name, problem)
    out = torch.empty_like(ins["x"])            # x's memory format (channels_last for NHWC problems)
    forced = None if variant == "heuristic" else variant
    device = jitops.get_backend().device

    def check() -> float:
        out.fill_(float("nan"))
        call(op_name, problem, ins, out=out, schedule=forced)
        ref = torch_reference(op_name, problem, ins)
        err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        tol = op.tolerance(problem, op.heuristic(problem, device, forced))[0]
        assert err <= tol and not torch.isnan(out).any(), f"error {err:.3g} > {tol:.3g} (or NaN left in output)"
        del ref
        return err

    return Case(op_name, label, variant, jitops=lambda: call(op_name, problem, ins, schedule=forced), check=check,
                vendor=lambda: vendor(ins), vendor_name="torch", bytes=op.bytes_moved(problem),
                schedule=lambda: schedule_text(op_name, problem, forced))


def cpu_case(ctx: Context, op_name: str, problem: Any, label: str, variant: str) -> Case:
    """The emulator: correctness and relative timings only, no vendor op."""
    op = get_op(op_name)
    ins = op.random_inputs(problem, ctx.rng)
    ref = op.reference(problem, ins)["y"]
    out = np.empty(problem.inputs()["x"].storage_shape, dtype=problem.dtype)
    forced = None if variant == "heuristic" else variant
    device = jitops.get_backend().device

    def check() -> float:
        out.fill(np.nan)
        call(op_name, problem, ins, out=out, schedule=forced)
        got = np.asarray(out, np.float64)
        err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        tol = op.tolerance(problem, op.heuristic(problem, device, forced))[0]
        assert err <= tol and not np.isnan(got).any(), f"error {err:.3g} > {tol:.3g} (or NaN left in output)"
        return err

    return Case(op_name, label, variant, jitops=lambda: call(op_name, problem, ins, schedule=forced), check=check,
                bytes=op.bytes_moved(problem), schedule=lambda: schedule_text(op_name, problem, forced))


def norm_cases(ctx: Context, op_name: str, problems: list[tuple[str, Any]], algorithms: tuple[str, ...],
               vendor: Callable[[Any], Callable[[dict[str, Any]], Any]]) -> Iterator[Case]:
    for label, problem in problems:
        for variant in variants(ctx, op_name, problem, algorithms):
            if ctx.on_gpu:
                yield gpu_case(ctx, op_name, problem, label, variant, vendor(problem))
            else:
                yield cpu_case(ctx, op_name, problem, label, variant)


ROW_ALGORITHMS = ("warp", "block", "stream", "split", "naive")


def like_x(ins: dict[str, Any], name: str) -> Any:
    """ins[name] in x's dtype for a vendor op that wants one dtype, converted on first use and kept
    (under a private key, so the timed calls do not convert)."""
    key = f"_{name}_like_x"
    if key not in ins:
        t = ins.get(name)
        ins[key] = t.to(ins["x"].dtype) if t is not None else None
    return ins[key]


def problems(ctx: Context) -> list[tuple[str, Any]]:
    op = get_op("layer_norm")
    if not ctx.on_gpu:
        shapes = [((64, 1024), "float32")] if ctx.quick else [((64, 1024), "float32"), ((16, 4096), "float16")]
    else:
        hidden = (1024, 4096) if ctx.quick else HIDDEN
        shapes = [((4096, 4096), dt) for dt in ("float32", "float16", "bfloat16")]
        shapes += [((TOKENS, h), dt) for dt in ("float32", "float16", "bfloat16") for h in hidden]
    out = []
    for shape, dtype in shapes:
        p = TensorSpec((shape[-1],), "float32" if dtype == "bfloat16" else dtype)   # bf16: fp32 weights
        prob = op.make_problem({"x": TensorSpec(shape, dtype), "gamma": p, "beta": p}, {"normalized_shape": shape[-1]})
        out.append((f"{shape[0]}x{shape[1]} {dtype}", prob))
    return out


def cases(ctx: Context) -> Iterator[Case]:
    def vendor(problem: Any) -> Callable[[dict[str, Any]], Any]:
        f = ctx.torch.nn.functional.layer_norm
        # torch gets gamma / beta in x's dtype (bf16 rows: a bf16 copy of the fp32 weights, made once)
        return lambda ins: f(ins["x"], problem.normalized_shape, like_x(ins, "gamma"), like_x(ins, "beta"), problem.eps)

    yield from norm_cases(ctx, "layer_norm", problems(ctx), ROW_ALGORITHMS, vendor)
