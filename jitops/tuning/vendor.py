"""The vendor's time for the same problem (torch, which calls cuDNN / cuBLAS / its own kernels).

Only for the summary table: "where available" means a GPU backend with a CUDA/ROCm torch. Timed
the way the tuner times jitops (per-call events, L2 flushed before each call), so the columns
compare. fp32 problems are timed with TF32 off (torch lets cuDNN use TF32 for convolutions by
default; jitops' fp32 kernels round nothing to TF32). Which torch call stands for an op is the op's
REGISTRATION.vendor (the torch_<op> builders below); a builder reads the problem through its
inputs() and a few attribute names, and an op without one, or whose problem it does not
understand, gets no vendor time rather than a wrong one.
"""
from __future__ import annotations

import logging
import statistics
from typing import Any, Callable

from ..ops import get_op, registration, resolve
from .measure import flush_size

log = logging.getLogger("jitops.tune")

Builder = Callable[[Any, dict[str, Any], Any], Callable[[], Any]]


def _activation(p: Any, F: Any, y: Any) -> Any:
    act = getattr(p, "activation", None)
    if act == "relu":
        return F.relu(y)
    if act == "leaky_relu":
        return F.leaky_relu(y, getattr(p, "alpha", 0.01))
    return y


# The vendor ops the ops' REGISTRATION.vendor names ("jitops.tuning.vendor:torch_<op>").

def torch_leaky_relu(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    return lambda: torch.nn.functional.leaky_relu(t["x"], p.alpha)


def torch_conv2d(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    F = torch.nn.functional
    top, left, bottom, right = p.pad
    x, w, b = t["x"], t["w"], t.get("bias")
    if (top, left) == (bottom, right):
        return lambda: _activation(p, F, F.conv2d(x, w, b, p.stride, (top, left), p.dilation, p.groups))
    return lambda: _activation(p, F, F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, p.stride, 0, p.dilation,
                                              p.groups))


def torch_batch_norm(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    F = torch.nn.functional
    var = t["var"].abs() + 0.5
    return lambda: _activation(p, F, F.batch_norm(t["x"], t["mean"], var, t.get("gamma"), t.get("beta"),
                                                  training=False, eps=p.eps))


def torch_group_norm(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    return lambda: torch.nn.functional.group_norm(t["x"], p.groups, t.get("gamma"), t.get("beta"), p.eps)


def torch_layer_norm(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    return lambda: torch.nn.functional.layer_norm(t["x"], p.normalized_shape, t.get("gamma"), t.get("beta"), p.eps)


def torch_rms_norm(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    return lambda: torch.nn.functional.rms_norm(t["x"], p.normalized_shape, t.get("gamma"), p.eps)


def torch_attention(p: Any, t: dict[str, Any], torch: Any) -> Callable[[], Any]:
    F = torch.nn.functional
    causal = str(getattr(p, "causal", "none")).lower() not in ("none", "false", "0")
    gqa = getattr(p, "kv_heads", 1) != getattr(p, "heads", 1)
    mask = t.get("mask")
    if mask is not None and mask.dtype != t["q"].dtype:
        mask = mask.to(t["q"].dtype)
    kw = {"enable_gqa": True} if gqa else {}
    return lambda: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=mask, is_causal=causal,
                                                  scale=p.scale, **kw)


def builder(op: str) -> Builder | None:
    """The op's vendor builder (its REGISTRATION.vendor), or None when it declares none."""
    ref = registration(op).vendor
    return resolve(ref) if ref else None


def _strict_fp32(torch: Any, on: bool) -> tuple[bool, bool]:
    """Turn TF32 off (on=True) for fp32 problems, as jitops computes them; returns the previous flags."""
    prev = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    if on:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    return prev


def time_torch(fn: Callable[[], Any], torch: Any, flush: int, reps: int = 25) -> float:
    """Median per-call time (us), device events around each call, L2 flushed before each (flush > 0)."""
    buf = torch.empty(max(flush, 1), dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        if flush:
            buf.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def vendor_us(op: str, problem: Any, backend: Any) -> float | None:
    """The torch equivalent's time on this GPU, or None when there is none to compare with."""
    build = builder(op)
    if build is None or backend.name not in ("cuda", "hip"):
        return None
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        specs = {n: s for n, s in problem.inputs().items() if s is not None}
        tensors = {n: torch.randn(s.shape, dtype=getattr(torch, s.dtype), device="cuda") for n, s in specs.items()}
        fn = build(problem, tensors, torch)
        prev = _strict_fp32(torch, all(s.dtype == "float32" for s in specs.values()))
        try:
            return time_torch(fn, torch, flush_size(get_op(op), problem, backend))   # jitops' regime
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
    except Exception as exc:   # no torch, an op torch lacks (rms_norm before 2.4), a field this does not know
        log.info("no vendor time for %s %s: %s", op, problem.key(), exc)
        return None
