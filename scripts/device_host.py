"""Per-call host cost on a GPU (issue 19), every op against torch on the same tensors, in one run:

- the latency rows of `jitops bench` (jitops.bench.latency, one small problem per op): correctness
  against a float64 reference (output memory poisoned with NaN first), eager back-to-back calls
  (host wall time per call over 2000 calls, best of 5) and one synchronized call (median of 1000,
  taking turns), plus the eager time through the Python function behind the public native entry,
- CUDA-graph capture of each jitops call (output poisoned, replayed, equal to the eager result) and
  the graph-replay time of both,
- ResNet-50 (torchvision, random weights, batch 1, fp32) eager with every conv through jitops (BN
  folded at load) against torch eager, with the accuracy of both against float64.

  python3 scripts/device_host.py --out results.json [--budget-s 170]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import torch

import jitops
from jitops import engine
from jitops.bench import latency
from jitops.bench.timing import Timer, warm_on_side_stream
from jitops.runtime import fastlaunch

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype)


OPS = ("leaky_relu", "layer_norm", "rms_norm", "group_norm", "batch_norm", "conv2d", "attention")


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return latency.relative_error(got, ref)


def eager_us(fns: dict[str, Callable], calls: int = 2000, trials: int = 5) -> dict[str, float]:
    """Host wall time per call of `calls` back-to-back calls (synchronized at the end), best of trials."""
    return Timer(torch).eager_us(fns, calls=calls, trials=trials)


def graph_check(fn: Callable) -> dict[str, Any]:
    """Capture one call in a CUDA graph, poison its output, replay: equal to the eager result.
    Warmed up on the capture stream first, as torch asks (jitops keeps scratch per stream)."""
    eager = fn()
    torch.cuda.synchronize()
    side = warm_on_side_stream(torch, fn)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = fn()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    same = bool(torch.equal(captured, eager))
    del graph
    return {"captured": True, "replay_equals_eager": same}


def op_rows(timer: Timer, budget_end: float) -> dict[str, Any]:
    """Every op's bench latency problem (jitops.bench.latency): the numbers `jitops bench` reports,
    plus graph capture, graph replay, and the eager time of the Python function behind the public
    one (the repeat path before native entries: repeat_call, then the same C dispatch)."""
    rows: dict[str, Any] = {}
    for op in OPS:
        case = latency.default_case(op, torch)
        name = f"{op} {case.problem}"
        if time.perf_counter() > budget_end:
            rows[name] = {"skipped": "time budget"}
            continue
        try:
            rows[name] = op_row(op, case, timer)
        except Exception as exc:
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        log(f"{name}: {json.dumps(rows[name])}")
    return rows


def op_row(op: str, case: latency.LatencyCase, timer: Timer) -> dict[str, Any]:
    t0 = time.perf_counter()
    case.jitops()
    torch.cuda.synchronize()
    row: dict[str, Any] = {"first_call_s": time.perf_counter() - t0}
    row.update(latency.measure(case, timer, torch))         # float64 check, then sync and eager timings
    entry = getattr(jitops, op)
    row["native_entry"] = hasattr(entry, "fallback")
    row["native_path"] = any(b is not None and b.native is not None for k, b in engine._cache.bound.items()
                             if k[0] == op)
    if row["native_entry"]:
        setattr(jitops, op, entry.fallback)    # the case's closures look the function up at call time
        try:
            row["eager_us"]["jitops_python_function"] = timer.eager_us({"f": case.jitops})["f"]
        finally:
            setattr(jitops, op, entry)
    try:
        row["graph"] = graph_check(case.jitops)
    except Exception as exc:
        row["graph"] = {"captured": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    row["graph_replay_us"] = {"jitops": timer.graph_us(case.jitops, n=20), "torch": timer.graph_us(case.torch, n=20)}
    r = row["graph_replay_us"]
    if r["jitops"] and r["torch"]:
        r["torch_over_jitops"] = r["torch"] / r["jitops"]
    return row


# ---------------------------------------------------------------- ResNet-50

class JitConv(torch.nn.Module):
    """A conv with its BatchNorm folded in at load, run by jitops.conv2d."""

    def __init__(self, conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d):
        super().__init__()
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            self.w = (conv.weight * scale[:, None, None, None]).contiguous()
            self.b = (bn.bias - bn.running_mean * scale).contiguous()
        self.stride, self.padding = tuple(conv.stride), tuple(conv.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return jitops.conv2d(x, self.w, self.b, stride=self.stride, padding=self.padding)


def fold_into_jitops(model: torch.nn.Module) -> torch.nn.Module:
    import copy
    import torchvision
    m = copy.deepcopy(model)
    m.conv1, m.bn1 = JitConv(m.conv1, m.bn1), torch.nn.Identity()
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            assert isinstance(blk, torchvision.models.resnet.Bottleneck)
            for i in (1, 2, 3):
                setattr(blk, f"conv{i}", JitConv(getattr(blk, f"conv{i}"), getattr(blk, f"bn{i}")))
                setattr(blk, f"bn{i}", torch.nn.Identity())
            if blk.downsample is not None:
                blk.downsample = torch.nn.Sequential(JitConv(blk.downsample[0], blk.downsample[1]))
    return m


WARM = r"""
import json, sys, torch, jitops
for xs, ws, stride, padding in json.loads(sys.argv[1]):
    x, w, b = torch.randn(*xs, device="cuda"), torch.randn(*ws, device="cuda"), torch.randn(ws[0], device="cuda")
    jitops.conv2d(x, w, b, stride=tuple(stride), padding=tuple(padding))
torch.cuda.synchronize()
"""


def warm_compile(model: torch.nn.Module, x: torch.Tensor, workers: int) -> int:
    """Compile every conv problem of the model in parallel processes sharing the disk cache."""
    problems: list = []
    hooks = [mod.register_forward_hook(lambda mod, inp, out: problems.append(
        (list(inp[0].shape), list(mod.weight.shape), list(mod.stride), list(mod.padding))))
        for mod in model.modules() if isinstance(mod, torch.nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    unique = [list(p) for p in {json.dumps(p): p for p in problems}.values()]
    procs = [subprocess.Popen([sys.executable, "-c", WARM, json.dumps(unique[i::workers])])
             for i in range(min(workers, len(unique)))]
    for p in procs:
        p.wait()
    return len(unique)


def resnet(budget_end: float) -> dict[str, Any]:
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval().cuda()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    x = torch.randn(1, 3, 224, 224, device="cuda")
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    out["unique_conv_problems"] = warm_compile(model, x, workers=12)
    out["parallel_compile_s"] = time.perf_counter() - t0
    log(f"resnet: {out['unique_conv_problems']} conv problems compiled in {out['parallel_compile_s']:.1f}s")
    jit = fold_into_jitops(model)
    with torch.no_grad():
        ref = model.double()(x.double())
        model.float()
        t0 = time.perf_counter()
        jit(x)
        torch.cuda.synchronize()
        out["first_forward_s"] = time.perf_counter() - t0
        y_torch = model(x)
        out["jitops_rel_err_vs_fp64"] = rel_err(jit(x), ref)
        out["torch_rel_err_vs_fp64"] = rel_err(y_torch, ref)
        out["torch_cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        if time.perf_counter() > budget_end:
            out["skipped_timing"] = "time budget"
            return out
        fns = {"jitops": lambda: jit(x), "torch": lambda: model(x)}
        out["eager_ms"] = {k: v / 1e3 for k, v in eager_us(fns, calls=20, trials=5).items()}
        out["eager_ms"]["torch_over_jitops"] = out["eager_ms"]["torch"] / out["eager_ms"]["jitops"]
        entry = jitops.conv2d
        if hasattr(entry, "fallback"):          # JitConv looks jitops.conv2d up at call time
            jitops.conv2d = entry.fallback
            try:
                out["eager_ms"]["jitops_python_function"] = eager_us({"f": fns["jitops"]}, calls=20)["f"] / 1e3
            finally:
                jitops.conv2d = entry
        native = sum(1 for k, b in engine._cache.bound.items() if k[0] == "conv2d" and b is not None and b.native)
        out["conv_bound_calls_native"] = native
    log(f"resnet: {out}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=165.0)
    args = ap.parse_args()
    budget_end = T0 + args.budget_s
    jitops.leaky_relu(rand(16), 0.1)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "jitops": jitops.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.version.split()[0],
        "native_launcher": fastlaunch.origin or "unavailable", "jitops_file": jitops.__file__,
        "note": latency.NOTE + "; jitops_python_function: the Python function behind the public native "
                "entry; graph_replay_us: 20 calls captured in one graph, median replay / 20",
    }
    log(f"{report['device']} torch {report['torch']} launcher {report['native_launcher']}")
    timer = Timer(torch)
    report["ops"] = op_rows(timer, T0 + args.budget_s * 0.45)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    try:
        report["resnet50_b1"] = resnet(budget_end)
    except Exception as exc:
        report["resnet50_b1"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        log(f"resnet failed: {exc}")
    report["total_s"] = time.perf_counter() - T0
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    log("done")


if __name__ == "__main__":
    os.environ.setdefault("JITOPS_BACKEND", "cuda")
    main()
