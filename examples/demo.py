"""The jitops story end to end: direct op calls checked against float64, what the scheduler chose
and why, offline compilation for other GPUs, and (on a GPU) timings against the vendor op.

Runs on the GPU when there is one, on the CPU emulator otherwise:
    python3 examples/demo.py
"""
from __future__ import annotations

import sys
import time

import numpy as np

import jitops
from jitops import engine
from jitops.errors import BackendUnavailable
from jitops.ops import get_op


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)))


def check(name: str, got, ref: np.ndarray, tol: float) -> None:
    got = np.asarray(got, dtype=np.float64)
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    status = "ok" if err <= tol else "FAILED"
    print(f"  {name:<44} max rel error {err:.2e} (tol {tol:.0e})  {status}")
    if err > tol:
        sys.exit(f"demo: {name} is wrong")


def main() -> None:
    backend = jitops.get_backend()
    section("device")
    d = backend.device
    print(f"  backend {backend.name}: {d.name} ({d.arch}, warp {d.warp_size}, {d.multiprocessors} multiprocessors)")
    print(f"  compiler {backend.compiler_id()}")

    section("direct op calls, checked against float64")
    rng = np.random.default_rng(0)
    for dtype, tol in (("float32", 1.2e-7), ("float16", 1e-3)):
        x = rng.standard_normal(1_000_003).astype(dtype)
        t0 = time.perf_counter()
        y = jitops.leaky_relu(x, 0.1)
        first = time.perf_counter() - t0
        xd = x.astype(np.float64)
        check(f"leaky_relu {x.size} {dtype} (first call {first * 1e3:.0f} ms)", y, np.where(xd > 0, xd, 0.1 * xd), tol)

    section("what the scheduler chose, and why")
    op = get_op("leaky_relu")
    for n in (4096, 1 << 20, 1 << 28):
        p = op.parse_problem({"x": str(n), "dtype": "float32"})
        sched, origin = engine.select_schedule(op, p, d)
        print(f"  n={n:<10} {sched} [{origin}]\n  {'':12} {sched.why}")

    section("offline compilation for other GPUs (no device needed)")
    p = op.parse_problem({"x": "1048576", "dtype": "float16"})
    for target in ("sm_80", "sm_90", "gfx90a"):
        try:
            be = jitops.get_backend(target=target)
        except BackendUnavailable as exc:
            print(f"  {target:<7} skipped: {exc}")
            continue
        sched, _, kernels = engine.compile_problem("leaky_relu", p, be)
        for k in kernels:
            how = f"compiled in {k.compile_seconds * 1e3:.0f} ms" if k.origin == "compiled" else f"{k.origin} cache"
            print(f"  {target:<7} {k.kernel:<24} {k.binary_bytes:>6} bytes  {how}")

    if backend.name != "cpu":
        gpu_timings()
    else:
        section("timings")
        print("  skipped on the CPU emulator (run on a GPU for timings against the vendor op)")
    section("done")


def gpu_timings() -> None:
    try:
        import torch
    except ImportError:
        print("  torch not installed: no vendor comparison")
        return
    from jitops.bench.timing import Timer
    section("timings against torch (CUDA-graph replay)")
    timer = Timer(torch)
    for n in (1 << 20, 1 << 26):
        x = torch.randn(n, device="cuda")
        j = timer.graph_us(lambda: jitops.leaky_relu(x, 0.01))
        v = timer.graph_us(lambda: torch.nn.functional.leaky_relu(x, 0.01))
        print(f"  leaky_relu n={n:<9} jitops {j:8.2f} us   torch {v:8.2f} us   ratio {v / j:5.2f}")


if __name__ == "__main__":
    main()
