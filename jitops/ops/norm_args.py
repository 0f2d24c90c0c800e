"""Argument checks the norm ops share (batch_norm, group_norm, layer_norm, rms_norm): tensors
present, input dtype and rank, eps, normalized_shape, and the one dtype of the parameters
(x's or float32: fp16 / bf16 activations with fp32 weights are how models keep them)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ArgumentError
from .base import TensorSpec, problem_key

NORM_DTYPES = ("float32", "float16", "bfloat16")   # inputs; statistics and accumulation are fp32


def require_tensor(op: str, name: str, spec: TensorSpec | None) -> TensorSpec:
    if spec is None:
        raise ArgumentError(name, "a tensor", None, op=op)
    return spec


def check_eps(op: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ArgumentError("eps", "a real number", repr(value), op=op)
    eps = float(value)
    if not np.isfinite(eps) or eps < 0:
        raise ArgumentError("eps", "a finite number >= 0", eps, op=op)
    return eps


def param_dtype(op: str, params: Mapping[str, TensorSpec | None], shape: Sequence[int], x: TensorSpec) -> str:
    """The one dtype of the present parameter tensors: the input's or float32 (fp16 / bf16 input,
    fp32 weights is the usual mixed-precision setup). Shapes must be exactly `shape`."""
    shape = tuple(int(s) for s in shape)
    dtypes = set()
    for name, spec in params.items():
        if spec is None:
            continue
        if spec.dtype not in NORM_DTYPES:
            raise ArgumentError(name, f"dtype {x.dtype} or float32", spec.dtype, op=op)
        if spec.dtype not in (x.dtype, "float32"):
            raise ArgumentError(name, f"dtype {x.dtype} (like x) or float32", spec.dtype, op=op)
        if tuple(spec.shape) != shape:
            raise ArgumentError(name, f"shape {shape}", f"shape {tuple(spec.shape)}", op=op)
        dtypes.add(spec.dtype)
    if len(dtypes) > 1:
        names = ", ".join(f"{n}: {s.dtype}" for n, s in params.items() if s is not None)
        raise ArgumentError(next(n for n, s in params.items() if s is not None),
                            "one dtype for every parameter tensor", names, op=op)
    return dtypes.pop() if dtypes else "float32"


def check_input(op: str, x: TensorSpec, min_rank: int) -> None:
    if x.dtype not in NORM_DTYPES:
        raise ArgumentError("x", f"dtype in {{{', '.join(NORM_DTYPES)}}}", x.dtype, op=op)
    if len(x.shape) < min_rank:
        raise ArgumentError("x", f"a tensor of rank >= {min_rank}", f"shape {tuple(x.shape)}", op=op)


def normalized_dims(op: str, value: Any, x: TensorSpec) -> tuple[int, ...]:
    """`normalized_shape` (an int or a sequence) checked against the trailing dims of x."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        dims: tuple[int, ...] = (int(value),)
    elif isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        dims = tuple(int(v) for v in value)
    else:
        raise ArgumentError("normalized_shape", "an int or a non-empty sequence of ints", repr(value), op=op)
    if any(d <= 0 for d in dims):
        raise ArgumentError("normalized_shape", "positive sizes", dims, op=op)
    if len(dims) > len(x.shape) or tuple(x.shape[len(x.shape) - len(dims):]) != dims:
        raise ArgumentError("normalized_shape", f"the trailing dims of x (shape {tuple(x.shape)})", dims, op=op)
    return dims


def prod(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= int(v)
    return n


def channel_problem_key(name: str, p: Any, attrs: Mapping[str, Any]) -> str:
    """The record key of a per-channel problem (batch_norm, group_norm): x as (N, C, H*W), so shapes
    that only split the plane differently share tuning records."""
    flat = {n: (TensorSpec((p.shape[0], p.channels, p.plane), s.dtype, p.layout) if n == "x" else s)
            for n, s in p.inputs().items()}
    return problem_key(name, flat, attrs)
