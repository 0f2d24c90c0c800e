"""Per-call latency of every op on one small problem, against torch's equivalent on the same tensors.

Small problems are most of a network at batch 1, and there the host path is the kernel. For each
op `jitops bench` reports two host wall times on a GPU: one synchronized call (median of many, the
two sides taking turns: Timer.latency_us) and eager back-to-back calls (Timer.eager_us), after
checking the jitops result against a float64 reference. An op's bench module may declare its own
problem (`latency_case(torch) -> LatencyCase`); otherwise the one below for its name is used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jitops

from .timing import Timer


@dataclass
class LatencyCase:
    problem: str
    jitops: Callable[[], Any]
    torch: Callable[..., Any]      # torch(dtype=None): the same math; torch(float64) is the reference
    tolerance: float               # max |jitops - ref| / max |ref|


def default_case(op: str, torch: Any) -> LatencyCase | None:
    """The small problem of `op` (the issue-19 set), on CUDA tensors; None for an op without one."""
    import torch.nn.functional as F

    def rand(*shape: int, dtype: Any = torch.float32) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    def c(t: Any, dtype: Any) -> Any:
        return t if dtype is None else t.to(dtype)

    if op == "leaky_relu":
        x = rand(4096)
        return LatencyCase("4096 fp32", lambda: jitops.leaky_relu(x, 0.1), lambda d=None: F.leaky_relu(c(x, d), 0.1),
                           1e-6)
    if op in ("layer_norm", "rms_norm"):
        x, g, b = rand(8, 768), rand(768), rand(768)
        if op == "layer_norm":
            return LatencyCase("8x768 fp32", lambda: jitops.layer_norm(x, 768, g, b, 1e-5),
                               lambda d=None: F.layer_norm(c(x, d), (768,), c(g, d), c(b, d), 1e-5), 1e-4)
        return LatencyCase("8x768 fp32", lambda: jitops.rms_norm(x, 768, g, 1e-6),
                           lambda d=None: F.rms_norm(c(x, d), (768,), c(g, d), 1e-6), 1e-4)
    x, g, b = rand(1, 64, 56, 56), rand(64), rand(64)
    if op == "group_norm":
        return LatencyCase("1x64x56x56 g32 fp32", lambda: jitops.group_norm(x, 32, g, b, 1e-5),
                           lambda d=None: F.group_norm(c(x, d), 32, c(g, d), c(b, d), 1e-5), 1e-4)
    if op == "batch_norm":
        mean, var = rand(64), rand(64).abs() + 0.5
        return LatencyCase("1x64x56x56 fp32", lambda: jitops.batch_norm(x, mean, var, g, b, 1e-5),
                           lambda d=None: F.batch_norm(c(x, d), c(mean, d), c(var, d), c(g, d), c(b, d), False, 0.0,
                                                       1e-5), 1e-4)
    if op == "conv2d":
        w, wb = rand(64, 64, 3, 3) * 0.05, rand(64)
        return LatencyCase("1x64x56x56 * 64x64x3x3 fp32", lambda: jitops.conv2d(x, w, wb, padding=1),
                           lambda d=None: F.conv2d(c(x, d), c(w, d), c(wb, d), padding=1), 2e-3)
    if op == "attention":
        q, k, v = (rand(1, 8, 128, 64, dtype=torch.float16) for _ in range(3))
        return LatencyCase("1x8x128x64 fp16", lambda: jitops.attention(q, k, v),
                           lambda d=None: F.scaled_dot_product_attention(c(q, d), c(k, d), c(v, d)), 2e-2)
    return None


def relative_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| (inf when got has NaN)."""
    got = got.double()
    if bool(got.isnan().any()):
        return math.inf
    return float((got - ref).abs().max() / max(float(ref.abs().max()), 1e-30))


def measure(case: LatencyCase, timer: Timer, torch: Any, quick: bool = False,
            calls: tuple[int, int] | None = None) -> dict[str, Any]:
    """Check once against float64 (poisoned output memory first), then time both sides;
    calls: (synchronized, eager) call counts instead of the defaults."""
    sync_calls, eager_calls = calls or ((200, 500) if quick else (1000, 2000))
    ref = case.torch(torch.float64)
    y = case.jitops()
    y.fill_(float("nan"))       # a freed NaN block: the next output likely reuses it
    del y
    error = relative_error(case.jitops(), ref)
    if not error <= case.tolerance:
        raise AssertionError(f"latency problem {case.problem}: error {error:.3g} > {case.tolerance:g}")
    fns = {"jitops": case.jitops, "torch": case.torch}
    row: dict[str, Any] = {"problem": case.problem, "error": error,
                           "sync_us": timer.latency_us(fns, calls=sync_calls),
                           "eager_us": timer.eager_us(fns, calls=eager_calls)}
    for key in ("sync_us", "eager_us"):
        row[key]["torch_over_jitops"] = row[key]["torch"] / row[key]["jitops"]
    return row


def op_latency(op: str, module: Any, ctx: Any) -> dict[str, Any] | None:
    """The latency row of `op` for `jitops bench` (None without a GPU or a problem for it)."""
    if not ctx.on_gpu:
        return None
    hook = getattr(module, "latency_case", None)
    case = hook(ctx.torch) if hook is not None else default_case(op, ctx.torch)
    if case is None:
        return None
    return {"op": op, **measure(case, ctx.timer, ctx.torch, ctx.quick)}


NOTE = ("host wall time per call; sync: one call + synchronize, median of 1000 (quick 200), the two sides "
        "taking turns; eager: 2000 (quick 500) back-to-back calls + one synchronize, best of 5; "
        "ratio = torch / jitops (>= 1: jitops no slower)")


def markdown(report: dict[str, Any]) -> str:
    """The latency rows of a bench report as one table ('' when it has none)."""
    rows = report.get("latency") or []
    if not rows:
        return ""
    out = ["", "### per-call latency (small problems, host wall time)", "", NOTE + ".", "",
           "| op | problem | sync jitops us | sync torch us | ratio | eager jitops us | eager torch us | ratio |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, e = r["sync_us"], r["eager_us"]
        out.append(f"| {r['op']} | {r['problem']} | {s['jitops']:.2f} | {s['torch']:.2f} "
                   f"| {s['torch_over_jitops']:.2f} | {e['jitops']:.2f} | {e['torch']:.2f} "
                   f"| {e['torch_over_jitops']:.2f} |")
    return "\n".join(out)


def plot_path(path: str | Path) -> Path:
    """Where `--plot FILE` draws the latency picture: FILE's name with `_latency` added."""
    path = Path(path)
    return path.with_name(f"{path.stem}_latency{path.suffix}")


def plot(report: dict[str, Any], path: str | Path) -> Path | None:
    """Bars of torch / jitops per op, synchronized and eager (None when the report has no rows)."""
    rows = report.get("latency") or []
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.2))
    y = list(range(len(rows)))
    for offset, key, color in ((-0.2, "sync_us", "tab:blue"), (0.2, "eager_us", "tab:orange")):
        ax.barh([v + offset for v in y], [r[key]["torch_over_jitops"] for r in rows], height=0.4, color=color,
                label="synchronized call" if key == "sync_us" else "eager back-to-back")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{r['op']} {r['problem']}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    env = report.get("environment", {})
    ax.set_title(f"per-call latency, torch / jitops (> 1: jitops faster); {env.get('device', '?')}, "
                 f"{env.get('date', '')}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
