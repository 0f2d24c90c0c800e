"""The host side of a cached jitops call, for every op, on any machine (no GPU needed): the probe
backend compiles and loads like the emulator, but its launches only record their arguments, so
what is timed is jitops' own per-call work plus the framework calls it makes (torch.empty_like,
data_ptr).

  python3 scripts/host_overhead.py [--n 20000] [--json out.json]

Per op: the public function (a native entry: no Python frame before the launch), the Python
function behind it through repeat_call and the native dispatch (the path before native entries),
and the same call through the key lookup and the Python repeat path (generated code, or the general
loop for plans with derived data or per-call scratch). Then, for leaky_relu, the pieces each call
pays and a bare probe launch. On a GPU the driver's launches (about 2 us each) and a CUDA
allocation come on top of every row alike.
"""
from __future__ import annotations

import argparse
import json
import timeit
from typing import Any, Callable

import torch

import jitops
from jitops import engine
from jitops.runtime import use_backend
from jitops.runtime.probe_backend import ProbeBackend

t = torch.randn
# Small problems (host cost is what is measured); conv2d once per plan family.
CASES: dict[str, Callable[[], tuple[str, tuple, dict]]] = {
    "leaky_relu 4096": lambda: ("leaky_relu", (t(4096),), dict(alpha=0.1)),
    "conv2d depthwise 3x3 (direct)": lambda: ("conv2d", (t(1, 8, 12, 12), t(8, 1, 3, 3), t(8)),
                                              dict(groups=8, padding=1, activation="relu")),
    "conv2d 3x3 (Winograd: derived filters, scratch)": lambda: ("conv2d", (t(1, 16, 12, 12), t(16, 16, 3, 3), t(16)),
                                                                dict(padding=1)),
    "conv2d 1x1 (packed weights, split-K scratch)": lambda: ("conv2d", (t(1, 16, 8, 8), t(32, 16, 1, 1), None), {}),
    "batch_norm (folded statistics: derived)": lambda: ("batch_norm", (t(2, 8, 5, 5), t(8), t(8).abs() + 0.5, t(8), t(8)),
                                                        dict(eps=1e-3)),
    "group_norm": lambda: ("group_norm", (t(2, 8, 5, 5), 4, t(8), t(8)), dict(eps=1e-3)),
    "layer_norm": lambda: ("layer_norm", (t(8, 768), 768, t(768), t(768)), dict(eps=1e-5)),
    "rms_norm": lambda: ("rms_norm", (t(8, 768), 768, t(768)), dict(eps=1e-5)),
    "attention": lambda: ("attention", (t(2, 16, 32), t(2, 16, 32), t(2, 16, 32)), dict(causal=True)),
}


def per_call_ns(fn: Callable[[], Any], n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e9


def taking_turns_ns(fns: dict[str, Callable[[], Any]], n: int, repeat: int = 9) -> dict[str, float]:
    """Best per-call time of each function, the functions taking turns repeat by repeat (on a
    shared machine, load then falls on all of them alike)."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=n) / n * 1e9)
    return best


def measure_op(backend: ProbeBackend, label: str, n: int) -> dict[str, Any]:
    op_name, args, kwargs = CASES[label]()
    fn = getattr(jitops, op_name)
    engine.clear_prepared()
    fn(*args, **kwargs)
    fn(*args, **kwargs)
    bound = next(b for k, b in reversed(engine._cache.bound.items()) if b and k[0] == op_name and k[1] is backend)
    row: dict[str, Any] = {"op": op_name, "launches": len(bound.steps), "derived": bound.derived is not None,
                           "scratch": bool(bound.temps), "native": bound.native is not None}
    python_fn = getattr(fn, "fallback", fn)
    if bound.native is not None:
        fns = {"native_ns": lambda: python_fn(*args, **kwargs)}
        if python_fn is not fn:
            fns["entry_ns"] = lambda: fn(*args, **kwargs)
        row.update(taking_turns_ns(fns, n))
    dispatch = engine._cache.dispatch[op_name]
    dispatch.clear()        # repeat_call misses: engine.run's key lookup and the Python repeat path
    row["python_ns"] = per_call_ns(lambda: python_fn(*args, **kwargs), n)
    return row


def leaky_relu_pieces(backend: ProbeBackend, n: int) -> dict[str, float]:
    x = torch.randn(4096)
    rows: dict[str, float] = {}
    engine.clear_prepared()
    jitops.leaky_relu(x, 0.1)
    bound = next(b for k, b in engine._cache.bound.items() if b and k[1] is backend)
    native, dispatch = bound.native, engine._cache.dispatch["leaky_relu"]
    values, attrs = (x,), (0.1,)
    if hasattr(jitops.leaky_relu, "fallback"):
        rows["public function (native entry, Dispatch, RepeatCall)"] = per_call_ns(lambda: jitops.leaky_relu(x, 0.1), n)
    rows["Dispatch (hash, signature check, RepeatCall)"] = per_call_ns(lambda: dispatch(backend, values, attrs), n)
    rows["RepeatCall (pointers, output, stream, launch)"] = per_call_ns(lambda: native(values), n)
    rows["RepeatCall.matches (signature check)"] = per_call_ns(lambda: native.matches(values), n)
    rows["generated Python (pointers, output, stream, launch)"] = per_call_ns(lambda: bound.run(values, None), n)
    rows["torch.empty_like (paid by every path)"] = per_call_ns(lambda: torch.empty_like(x), n)
    rows["x.data_ptr()"] = per_call_ns(lambda: x.data_ptr(), n)
    step, _ = bound.steps[0]
    run, entry, handle, gx, gy, gz, bx, by, bz, shared = step.run.native
    address = step.packed.address
    rows["bare probe launch through the native launcher"] = per_call_ns(
        lambda: run(entry, handle, gx, gy, gz, bx, by, bz, shared, 0, address), n)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    backend = ProbeBackend()
    with use_backend(backend):
        ops = {label: measure_op(backend, label, args.n) for label in CASES}
        pieces = leaky_relu_pieces(backend, args.n * 5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; host ns per cached call, best of 7 "
          f"(launches stubbed by the probe)")
    print(f"{'op':<50} {'launches':>8} {'entry':>9} {'dispatch':>9} {'Python':>9}")
    for label, r in ops.items():
        entry, native = (f"{r[k]:9.0f}" if k in r else f"{'-':>9}" for k in ("entry_ns", "native_ns"))
        print(f"{label:<50} {r['launches']:>8} {entry} {native} {r['python_ns']:9.0f}")
    print("\nleaky_relu 4096, the pieces:")
    for name, ns in pieces.items():
        print(f"  {name:<54} {ns:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "ops": ops, "leaky_relu_pieces": pieces}, f, indent=1)


if __name__ == "__main__":
    main()
