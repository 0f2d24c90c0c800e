"""Where a jitops call's host time goes on a GPU machine: launch paths, allocation, the whole
call, and a profile of the first call with a warm cache. Developer tool; prints a short table."""
from __future__ import annotations

import cProfile
import ctypes
import io
import pstats
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import jitops


def per_call_us(fn, n=20000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    x = torch.randn(4096, device="cuda")
    y = jitops.leaky_relu(x, 0.1)
    from jitops.engine import _cache
    bound = next(b for b in _cache.bound.values() if b)
    step, _ = bound.steps[0]
    packed, l, k = step.packed, step.launch, step.kernel
    stream = torch.cuda.current_stream().cuda_stream
    from cuda.bindings import driver as cu
    rows = {}
    fn = cu.CUfunction(k.handle)
    rows["cuda-bindings cuLaunchKernel"] = per_call_us(
        lambda: cu.cuLaunchKernel(fn, *l.grid, *l.block, 0, stream, packed.address, 0))
    from jitops.runtime import cuda_driver
    f = cuda_driver.libcuda().cuLaunchKernel
    h = int(k.handle)
    rows["ctypes cuLaunchKernel"] = per_call_us(lambda: f(h, *l.grid, *l.block, 0, stream, packed.address, None))
    from jitops.runtime.fastlaunch import native_launcher
    native, entry = native_launcher(), cuda_driver.launch_entry_address()
    if native is not None:
        rows["native launcher"] = per_call_us(lambda: native.launch(entry, h, *l.grid, *l.block, 0, stream, packed.address))
        import struct
        buf = ctypes.create_string_buffer(struct.pack("QQif", x.data_ptr(), y.data_ptr(), 4096, 0.1), 24)
        baddr = ctypes.addressof(buf)
        rows["native launcher, one buffer"] = per_call_us(
            lambda: native.launch_buffer(entry, h, *l.grid, *l.block, 0, stream, baddr, 24))
    rows["bound step.run"] = per_call_us(lambda: step.run(packed, stream))
    rows["bound.run (generated)"] = per_call_us(lambda: bound.run((x,), None))
    rows["torch.empty_like"] = per_call_us(lambda: torch.empty_like(x))
    rows["torch.empty(shape, dtype, device)"] = per_call_us(lambda: torch.empty((4096,), dtype=torch.float32, device=x.device))
    raw = torch._C._cuda_getCurrentRawStream
    rows["raw stream"] = per_call_us(lambda: raw(0))
    rows["x.data_ptr()"] = per_call_us(lambda: x.data_ptr())
    rows["jitops.leaky_relu (cached)"] = per_call_us(lambda: jitops.leaky_relu(x, 0.1))
    rows["jitops.leaky_relu out="] = per_call_us(lambda: jitops.leaky_relu(x, 0.1, out=y))
    rows["torch leaky_relu"] = per_call_us(lambda: torch.nn.functional.leaky_relu(x, 0.1))
    for name, us in rows.items():
        print(f"{name:<40} {us:7.2f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20000):
        jitops.leaky_relu(x, 0.1)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(10)
    print(s.getvalue()[-2500:])
    first_call_profile()


FIRST = r"""
import cProfile, pstats, io, time, torch
x = torch.randn(1 << 20, device="cuda"); torch.cuda.synchronize()
import jitops
pr = cProfile.Profile(); t0 = time.perf_counter(); pr.enable()
jitops.leaky_relu(x, 0.01); torch.cuda.synchronize()
pr.disable(); print("first call", (time.perf_counter() - t0) * 1e3, "ms")
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25); print(s.getvalue()[:6000])
"""


def first_call_profile() -> None:
    with tempfile.TemporaryDirectory() as d:
        env = {**__import__("os").environ, "JITOPS_CACHE_DIR": d}
        subprocess.run([sys.executable, "-c", FIRST], env=env, capture_output=True)       # fill the cache
        out = subprocess.run([sys.executable, "-c", FIRST], env=env, capture_output=True, text=True)
        print("== warm-cache first call ==")
        print(out.stdout[-7000:], out.stderr[-2000:])


if __name__ == "__main__":
    main()
