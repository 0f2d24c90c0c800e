"""The host side of a cached jitops call, on any machine (no GPU needed): the probe backend
compiles and loads like the emulator, but its launches only record their arguments, so what is
timed is jitops' own per-call work plus the framework calls it makes (torch.empty_like, data_ptr).

  python3 scripts/host_overhead.py [--n 200000]

Rows: the public call through the native dispatch (C), the same call through the key lookup and
generated Python path (what every repeat call took before the native path), the pieces each call
pays, and a bare probe launch. On a GPU the driver's launch
(about 2 us) and a CUDA allocation come on top of every row alike.
"""
from __future__ import annotations

import argparse
import timeit

import torch

import jitops
from jitops import engine
from jitops.runtime import use_backend
from jitops.runtime.probe_backend import ProbeBackend


def per_call_ns(fn, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200000)
    args = ap.parse_args()
    backend = ProbeBackend()
    x = torch.randn(4096)
    rows: dict[str, float] = {}
    with use_backend(backend):
        jitops.leaky_relu(x, 0.1)
        jitops.leaky_relu(x, 0.1)
        bound = next(b for k, b in engine._cache.bound.items() if b and k[1] is backend)
        native, dispatch = bound.native, engine._cache.dispatch["leaky_relu"]
        assert native is not None, "the native repeat path is not available here"
        rows["jitops.leaky_relu: native dispatch (C)"] = per_call_ns(lambda: jitops.leaky_relu(x, 0.1), args.n)
        del engine._cache.dispatch["leaky_relu"]
        bound.native = None
        rows["jitops.leaky_relu: key lookup + generated Python"] = per_call_ns(lambda: jitops.leaky_relu(x, 0.1),
                                                                               args.n)
        engine._cache.dispatch["leaky_relu"] = dispatch
        bound.native = native
        values, attrs = (x,), (0.1,)
        rows["  Dispatch (signature checks + FastCall)"] = per_call_ns(lambda: dispatch(backend, values, attrs),
                                                                       args.n)
    rows["  FastCall (pointers, output, stream, launch)"] = per_call_ns(lambda: native(values), args.n)
    rows["  FastCall.matches (signature checks)"] = per_call_ns(lambda: native.matches(values), args.n)
    rows["  generated Python (pointers, output, stream, launch)"] = per_call_ns(lambda: bound.run(values, None),
                                                                               args.n)
    rows["  torch.empty_like (paid by every path)"] = per_call_ns(lambda: torch.empty_like(x), args.n)
    rows["  x.data_ptr()"] = per_call_ns(lambda: x.data_ptr(), args.n)
    step, _ = bound.steps[0]
    run, entry, handle, gx, gy, gz, bx, by, bz, shared = step.run.native
    address = step.packed.address
    rows["  bare probe launch through the native launcher"] = per_call_ns(
        lambda: run(entry, handle, gx, gy, gz, bx, by, bz, shared, 0, address), args.n)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ns per call, best of 7")
    for name, ns in rows.items():
        print(f"{name:<56} {ns:8.0f}")


if __name__ == "__main__":
    main()
