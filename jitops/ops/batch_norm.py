"""batch_norm (inference): y = act((x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]).

x is (N, C, *spatial), any rank >= 2, channels on axis 1; fp32, fp16 or bf16, parameters in x's
dtype or float32, gamma/beta optional. A channels_last (NHWC) x is the rank-2 case over its
storage: (N*H*W) x C with the channel innermost, so the same apply kernel broadcasts the folded
parameters along C, and the output keeps the format. Seed 000 section 4: the per-channel work is folded once into
(k, a, b) = (mean, gamma / sqrt(var + eps), beta) by a prepare launch that the engine re-runs
only when a parameter tensor changes; the apply is then a vectorized y = act((x - k) * a + b)
with the channel found per vector without a run-time division. Activation: None, "relu" or
"leaky_relu" (alpha). `naive` (one thread per element, the full formula) is the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError, ScheduleError
from .base import (C_TYPE, INT32_MAX, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, TensorSpec, Workspace, ceil_div,
                   index_type, parse_shape, parse_value)
from .norm_affine import affine_launch
from .norm_args import channel_problem_key, check_eps, check_input, param_dtype, prod, require_tensor

NAME = "batch_norm"
INPUTS = ("x", "mean", "var", "gamma", "beta")
LAYOUT_INPUTS = ("x",)
ALGORITHMS = ("folded", "naive")
ACTIVATIONS = (None, "relu", "leaky_relu")
PARAMS = ("mean", "var", "gamma", "beta")


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(vendor="jitops.tuning.vendor:torch_batch_norm", onnx=("BatchNormalization",))


@dataclass(frozen=True)
class BatchNormProblem:
    shape: tuple[int, ...]
    dtype: str
    ptype: str
    has_gamma: bool
    has_beta: bool
    eps: float
    activation: str | None
    alpha: float
    layout: str = ""          # "nhwc": x stored N, H, W, C (channels innermost)

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def plane(self) -> int:
        return prod(self.shape[2:])

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def stride_plane(self) -> int:
        """Consecutive elements of one channel in memory: the plane (NCHW), 1 (NHWC)."""
        return 1 if self.layout == "nhwc" else self.plane

    def present(self) -> tuple[str, ...]:
        return tuple(n for n in PARAMS if n in ("mean", "var") or getattr(self, f"has_{n}"))

    def inputs(self) -> dict[str, TensorSpec]:
        out = {"x": TensorSpec(self.shape, self.dtype, self.layout)}
        out.update({n: TensorSpec((self.channels,), self.ptype) for n in self.present()})
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(self.shape, self.dtype, self.layout)}

    def key(self) -> str:
        return channel_problem_key(NAME, self, {"eps": self.eps, "activation": self.activation or "none",
                                                "alpha": self.alpha})

    def bytes_moved(self) -> int:
        return 2 * self.numel * ITEMSIZE[self.dtype] + len(self.present()) * self.channels * ITEMSIZE[self.ptype]


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> BatchNormProblem:
    x = require_tensor(NAME, "x", inputs.get("x"))
    check_input(NAME, x, 2)
    for name in ("mean", "var"):
        require_tensor(NAME, name, inputs.get(name))
    params = {n: inputs.get(n) for n in PARAMS}
    ptype = param_dtype(NAME, params, (x.shape[1],), x)
    activation = attrs.get("activation")
    if activation not in ACTIVATIONS:
        raise ArgumentError("activation", "None, 'relu' or 'leaky_relu'", repr(activation), op=NAME)
    alpha = attrs.get("alpha", 0.01)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)) \
            or not np.isfinite(float(alpha)):
        raise ArgumentError("alpha", "a finite real number", repr(alpha), op=NAME)
    return BatchNormProblem(tuple(int(s) for s in x.shape), x.dtype, ptype, params["gamma"] is not None,
                            params["beta"] is not None, check_eps(NAME, attrs.get("eps", 1e-5)), activation,
                            float(alpha) if activation == "leaky_relu" else 0.0, x.layout)


def parse_problem(spec: Mapping[str, str]) -> BatchNormProblem:
    """CLI: x=256x64x56x56 [dtype=float16] [ptype=float32] [activation=relu] [alpha=0.1] [eps=1e-5]
    [layout=nhwc] (x is the logical N x C x H x W shape either way)."""
    extra = set(spec) - {"x", "dtype", "ptype", "activation", "alpha", "eps", "layout"}
    if extra:
        raise ArgumentError(sorted(extra)[0], "one of x, dtype, ptype, activation, alpha, eps, layout", op=NAME)
    shape = parse_shape(spec.get("x", "256x64x56x56"))
    dtype = spec.get("dtype", "float32")
    p = TensorSpec((shape[1] if len(shape) > 1 else 0,), spec.get("ptype", dtype))
    act = spec.get("activation")
    return make_problem({"x": TensorSpec(shape, dtype, _layout(spec, shape)), "mean": p, "var": p, "gamma": p,
                         "beta": p},
                        {"eps": float(spec.get("eps", 1e-5)), "activation": None if act in (None, "none") else act,
                         "alpha": parse_value(spec.get("alpha", "0.01"))})


def _layout(spec: Mapping[str, str], shape: tuple[int, ...]) -> str:
    layout = spec.get("layout", "nchw")
    if layout not in ("nchw", "nhwc") or (layout == "nhwc" and len(shape) != 4):
        raise ArgumentError("layout", "nchw, or nhwc with a 4-d x", layout, op=NAME)
    return "" if layout == "nchw" else layout


def heuristic(problem: BatchNormProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    algorithm = algorithm or "folded"
    if algorithm not in ALGORITHMS:
        raise ScheduleError(f"batch_norm has no algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if algorithm == "naive":
        return Schedule.make("naive", why="one thread per element, the whole formula (baseline)", block=256)
    n = problem.numel
    vec = 16 // ITEMSIZE[problem.dtype]
    block = 256
    resident = device.multiprocessors * device.resident_blocks(block)
    one_per_thread = ceil_div(n, vec * block)
    unroll = 4 if one_per_thread <= 2 * resident else 1
    # H200 sweep (2026-11-22): evict-first accesses bought nothing here (fp32 98.1 vs 98.2% of copy,
    # fp16 92.9 vs 94.8%), so plain ones; the candidates still try both.
    streaming = False
    plane = problem.stride_plane
    lookup = ("one channel per vector" if plane % vec == 0 else
              "contiguous channels per vector" if plane == 1 and problem.channels % vec == 0 else
              "vectors straddle planes: channel of the first element, then compare-and-increment")
    why = (f"scale/shift folded once per channel (prepare launch, re-run only when mean/var/gamma/beta change); "
           f"apply: {vec}-element vectors, {unroll} per thread, {block} threads, {lookup}, compile-time plane "
           f"size {plane} and channel count {problem.channels} (no run-time division)"
           + (", streaming loads/stores" if streaming else ""))
    return Schedule.make("folded", why=why, vec=vec, unroll=unroll, block=block, waves=0, streaming=streaming)


def candidates(problem: BatchNormProblem, device: DeviceInfo) -> list[Schedule]:
    out = [heuristic(problem, device, "naive")]
    vmax = 16 // ITEMSIZE[problem.dtype]
    for vec in sorted({vmax, max(1, vmax // 2)}):
        for unroll in (1, 2, 4):
            for block in (128, 256, 512):
                for waves in (0, 8):
                    for streaming in (False, True):
                        out.append(Schedule.make("folded", vec=vec, unroll=unroll, block=block, waves=waves,
                                                 streaming=streaming))
    return out


def plan(problem: BatchNormProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    n, c, plane = problem.numel, problem.channels, problem.stride_plane
    if n == 0:
        return Plan(launches=())
    present = problem.present()
    if schedule.algorithm == "naive":
        block = int(schedule["block"])
        if ceil_div(n, block) > INT32_MAX or block > device.max_threads_per_block:
            raise ScheduleError(f"naive batch_norm cannot cover {n} elements with blocks of {block}")
        idx = index_type(n + block)
        params = {"ctype": C_TYPE[problem.dtype], "ptype": C_TYPE[problem.ptype], "index_type": idx,
                  "block": block, "has_gamma": problem.has_gamma, "has_beta": problem.has_beta,
                  "activation": problem.activation or "none"}
        wide = "i32" if idx == "int" else "i64"
        args = (Buf("x"), *[Buf(p) for p in present], Buf("y"), Scalar(wide, n), Scalar("i32", c),
                Scalar(wide, plane), Scalar("f32", problem.eps), Scalar("f32", problem.alpha))
        return Plan((Launch.make("batch_norm/naive.hip.j2", "batch_norm_naive", params, (ceil_div(n, block),),
                                 (block,), args),))
    if schedule.algorithm != "folded":
        raise ScheduleError(f"batch_norm has no algorithm '{schedule.algorithm}'")
    fold_block = 128
    fold = Launch.make("batch_norm/fold.hip.j2", "batch_norm_fold",
                       {"ptype": C_TYPE[problem.ptype], "block": fold_block, "has_gamma": problem.has_gamma,
                        "has_beta": problem.has_beta},
                       (ceil_div(c, fold_block),), (fold_block,),
                       (*[Buf(p) for p in present], Buf("coef"), Scalar("i32", c), Scalar("f32", problem.eps)))
    apply = affine_launch("batch_norm_apply", problem.dtype, n, plane, c, device, vec=int(schedule["vec"]),
                          unroll=int(schedule["unroll"]), block=int(schedule["block"]), per_plane=False,
                          coef="coef", out="y", streaming=bool(schedule.get("streaming")),
                          waves=int(schedule.get("waves", 0)), activation=problem.activation,
                          alpha=problem.alpha, channels=c)
    coef = Workspace("coef", 3 * 4 * c, persistent=True, derived_from=present)
    return Plan(launches=(apply,), workspaces=(coef,), prepare=(fold,))


def variants(device: DeviceInfo) -> list[tuple[BatchNormProblem, Schedule]]:
    """Every template branch: whole-vector planes, rank 2 (contiguous channels), straddling
    planes (7x7), each activation, fp16, mixed-precision and missing parameters, 64-bit indices."""
    out = []
    for dtype, ptype, shape, act in (("float32", "float32", (2, 16, 8, 8), None),
                                     ("float16", "float16", (2, 16, 8, 8), "relu"),
                                     ("float16", "float32", (2, 16, 7, 7), "leaky_relu"),
                                     ("float32", "float32", (64, 32), None),
                                     ("float32", "float32", (3, 5, 7), "relu")):
        p = TensorSpec((shape[1],), ptype)
        prob = make_problem({"x": TensorSpec(shape, dtype), "mean": p, "var": p, "gamma": p, "beta": p},
                            {"activation": act, "alpha": 0.1})
        out.append((prob, heuristic(prob, device)))
        out.append((prob, heuristic(prob, device, "naive")))
        out.append((prob, Schedule.make("folded", vec=16 // ITEMSIZE[dtype], unroll=2, block=128, waves=1,
                                        streaming=True)))
    # NHWC is the rank-2 (rowwise, float4 coefficients) branch above; bf16 is compiled by the
    # group-norm NHWC variant through the same affine template (no extra compile here: CI time).
    p = TensorSpec((16,), "float32")
    bare = make_problem({"x": TensorSpec((2, 16, 8, 8), "float32"), "mean": p, "var": p}, {})
    out.append((bare, heuristic(bare, device)))
    out.append((bare, heuristic(bare, device, "naive")))
    return out


def reference(problem: BatchNormProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    c = problem.channels
    # x in storage order: parameters broadcast along the innermost axis for NHWC.
    shape = (1, 1, 1, c) if problem.layout == "nhwc" else (1, c) + (1,) * (len(problem.shape) - 2)

    def param(name: str, default: float) -> np.ndarray:
        v = inputs.get(name)
        return np.full(shape, default) if v is None else np.asarray(v, np.float64).reshape(shape)

    x = np.asarray(inputs["x"], np.float64)
    y = (x - param("mean", 0.0)) / np.sqrt(param("var", 1.0) + problem.eps) * param("gamma", 1.0) + param("beta", 0.0)
    if problem.activation == "relu":
        y = np.where(y < 0, 0.0, y)
    elif problem.activation == "leaky_relu":
        y = np.where(y < 0, problem.alpha * y, y)
    return {"y": y}


def random_inputs(problem: BatchNormProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    c = problem.channels
    out = {"x": rng.standard_normal(problem.inputs()["x"].storage_shape).astype(problem.dtype),
           "mean": (0.3 * rng.standard_normal(c)).astype(problem.ptype),
           "var": (0.5 + rng.random(c)).astype(problem.ptype)}
    if problem.has_gamma:
        out["gamma"] = (1.0 + 0.5 * rng.standard_normal(c)).astype(problem.ptype)
    if problem.has_beta:
        out["beta"] = (0.5 * rng.standard_normal(c)).astype(problem.ptype)
    return out


def tolerance(problem: BatchNormProblem, schedule: Schedule) -> tuple[float, float]:
    # fp32: the folded scale is rounded once, then a subtract and an fma (3-4 roundings of values
    # no larger than the output): 1e-6 of the largest |y|. fp16: the output rounding (2^-11);
    # bf16: the output rounding, half an ulp of 8 significant bits (2^-8 = 3.9e-3), plus margin.
    return {"float32": (1e-6, 0.0), "float16": (1e-3, 0.0), "bfloat16": (5e-3, 0.0)}[problem.dtype]


def bytes_moved(problem: BatchNormProblem) -> int:
    return problem.bytes_moved()
