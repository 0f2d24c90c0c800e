"""leaky_relu cases: 4K ... 1G elements (powers of 4, seed 000 table 2), fp32, fp16 and bf16, and
a channels_last SD-UNet activation (2 x 320 x 64 x 64) in fp16 and bf16, against
torch.nn.functional.leaky_relu on the same tensors; plus per-call latency and cold-start extras."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Iterator

import numpy as np

import jitops

from . import Case, Context

ALPHA = 0.01


def sizes(ctx: Context) -> list[int]:
    if not ctx.on_gpu:
        return [4096, 1 << 16] if ctx.quick else [4096, 1 << 16, 1 << 20]
    if ctx.quick:
        return [4 ** 6, 4 ** 10, 4 ** 12, 4 ** 14]
    return [4 ** k for k in range(6, 16)]


TOL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 5e-3}    # one rounding: 2^-24, 2^-11, 2^-8
CHANNELS_LAST = (2, 320, 64, 64)


def _case_gpu(ctx: Context, n: int, dtype: str, variant: str, shape: tuple[int, ...] | None = None) -> Case:
    """n elements, or a channels_last tensor of `shape` (n = its element count)."""
    torch = ctx.torch
    tdt = getattr(torch, dtype)
    x = torch.randn(n, device="cuda", dtype=tdt) if shape is None else \
        torch.randn(shape, device="cuda", dtype=tdt).contiguous(memory_format=torch.channels_last)
    out = torch.empty_like(x)
    schedule = None if variant == "heuristic" else variant

    def check() -> float:
        out.fill_(float("nan"))
        jitops.leaky_relu(x, ALPHA, out=out, schedule=schedule)
        xd = x.double()
        ref = torch.where(xd > 0, xd, ALPHA * xd)
        err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        tol = TOL[dtype]
        assert err <= tol and not torch.isnan(out).any(), f"error {err} > {tol} (or NaN left in output)"
        return err

    label = f"n={n} {dtype}" if shape is None else f"{'x'.join(map(str, shape))} {dtype} channels_last"
    return Case("leaky_relu", label, variant,
                jitops=lambda: jitops.leaky_relu(x, ALPHA, schedule=schedule),
                check=check, vendor=lambda: torch.nn.functional.leaky_relu(x, ALPHA),
                vendor_name="torch", bytes=2 * n * x.element_size(),
                schedule=lambda: _schedule_text(n, dtype, schedule))


def _case_cpu(ctx: Context, n: int, dtype: str, variant: str) -> Case:
    x = ctx.rng.standard_normal(n).astype(dtype)
    out = np.empty_like(x)
    schedule = None if variant == "heuristic" else variant

    def check() -> float:
        out.fill(np.nan)
        jitops.leaky_relu(x, ALPHA, out=out, schedule=schedule)
        ref = np.where(x > 0, x.astype(np.float64), ALPHA * x.astype(np.float64))
        got = np.asarray(out, np.float64)
        err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        tol = TOL[dtype]
        assert err <= tol and not np.isnan(got).any(), f"error {err} > {tol} (or NaN left in output)"
        return err

    return Case("leaky_relu", f"n={n} {dtype}", variant,
                jitops=lambda: jitops.leaky_relu(x, ALPHA, schedule=schedule),
                check=check, vendor=lambda: np.where(x > 0, x, x * np.asarray(ALPHA, dtype)), vendor_name="numpy",
                bytes=2 * n * x.itemsize, schedule=lambda: _schedule_text(n, dtype, schedule))


def _schedule_text(n: int, dtype: str, forced: str | None) -> str:
    from ..engine import select_schedule
    from ..ops import get_op
    from ..ops.base import TensorSpec
    op = get_op("leaky_relu")
    problem = op.make_problem({"x": TensorSpec((n,), dtype)}, {"alpha": ALPHA})
    sched, origin = select_schedule(op, problem, jitops.get_backend().device, forced)
    return f"{sched} [{origin}]"


def cases(ctx: Context) -> Iterator[Case]:
    make = _case_gpu if ctx.on_gpu else _case_cpu
    # "vectorized": the heuristic's own parameters, beside the engine's pick (a tuned record if any)
    variants = ["heuristic"] if ctx.algorithms == "heuristic" else ["heuristic", "vectorized", "naive"]
    # bf16 rows on the GPU only: the emulator's quick bench is part of CI (test_cli)
    for dtype in ("float32", "float16") + (("bfloat16",) if ctx.on_gpu else ()):
        for n in sizes(ctx):
            for v in variants:
                yield make(ctx, n, dtype, v)
    if ctx.on_gpu:
        n = 1
        for s in CHANNELS_LAST:
            n *= s
        for dtype in ("float16", "bfloat16"):
            yield _case_gpu(ctx, n, dtype, "heuristic", CHANNELS_LAST)


def extras(ctx: Context) -> dict[str, Any]:
    """Per-call latency on a small torch tensor, and cold start in fresh processes."""
    out: dict[str, Any] = {}
    if ctx.on_gpu:
        torch = ctx.torch
        x = torch.randn(4096, device="cuda")
        out["latency_us"] = {
            **ctx.timer.latency_us({"jitops": lambda: jitops.leaky_relu(x, ALPHA),
                                    "torch": lambda: torch.nn.functional.leaky_relu(x, ALPHA)}),
            "note": "host wall time of one synchronized call on a 4096-element fp32 CUDA tensor, median of "
                    "1000, the two calls taking turns",
        }
    out["cold_start"] = cold_start(ctx.on_gpu)
    return out


_COLD = r"""
import json, time, sys
t0 = time.perf_counter()
import jitops
t_import = time.perf_counter() - t0
gpu = sys.argv[1] == "1"
if gpu:
    import torch
    x = torch.randn(1 << 20, device="cuda"); torch.cuda.synchronize()
else:
    import numpy as np
    x = np.random.randn(1 << 20).astype("float32")
t1 = time.perf_counter()
y = jitops.leaky_relu(x, 0.01)
if gpu:
    torch.cuda.synchronize()
t_first = time.perf_counter() - t1
print(json.dumps({"import_s": t_import, "first_call_s": t_first}))
"""


def cold_start(gpu: bool) -> dict[str, Any]:
    """First call in a fresh process: empty cache (compile), then warm cache (load only).

    The first call is timed after the framework has created its context (torch tensor on the GPU
    already), so it measures jitops alone: backend start, schedule, render, compile or cache load,
    launch. `import jitops` is timed separately. Python bytecode is written as an installed
    package would have it (a first, import-only process primes it).
    """
    with tempfile.TemporaryDirectory(prefix="jitops-cold-") as cache:
        env = {**os.environ, "JITOPS_CACHE_DIR": cache}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([sys.executable, "-c", "import jitops, jitops.engine, jitops.runtime.cuda_backend"],
                       env=env, capture_output=True, check=False)
        runs = {}
        for label in ("empty_cache", "warm_cache"):
            proc = subprocess.run([sys.executable, "-c", _COLD, "1" if gpu else "0"], env=env,
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                return {"error": proc.stderr[-2000:]}
            runs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        return runs
