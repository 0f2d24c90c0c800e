"""rms_norm: y = x / sqrt(mean(x^2) + eps) * gamma over the trailing dims.

fp32, fp16 or bf16 input, fp32 accumulation; gamma optional, shaped like `normalized_shape`, in the
input's dtype or float32. Same row scheduler as layer_norm (norm_common); the statistic is a plain
sum of squares (nothing to cancel, so one pass is exact enough). `naive` is the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError
from .base import ITEMSIZE, Plan, Schedule, TensorSpec, parse_shape, parse_value, problem_key
from .norm_args import check_eps, check_input, normalized_dims, param_dtype, prod, require_tensor
from .norm_common import RowSpec, layer_reference, row_candidates, row_heuristic, row_plan, row_tolerance

NAME = "rms_norm"
INPUTS = ("x", "gamma")


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(vendor="jitops.tuning.vendor:torch_rms_norm", onnx=("RMSNormalization", "Pow", "Mul"))


@dataclass(frozen=True)
class RmsNormProblem:
    shape: tuple[int, ...]
    dtype: str
    normalized_shape: tuple[int, ...]
    ptype: str
    has_gamma: bool
    eps: float
    has_beta = False

    @property
    def rows(self) -> int:
        return prod(self.shape[:len(self.shape) - len(self.normalized_shape)])

    @property
    def length(self) -> int:
        return prod(self.normalized_shape)

    def inputs(self) -> dict[str, TensorSpec]:
        out = {"x": TensorSpec(self.shape, self.dtype)}
        if self.has_gamma:
            out["gamma"] = TensorSpec(self.normalized_shape, self.ptype)
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(self.shape, self.dtype)}

    def key(self) -> str:
        # Rows x length is all the kernels see: (8, 512, 1024) and (4096, 1024) share records.
        flat = {n: (TensorSpec((self.rows, self.length), s.dtype) if n == "x" else s) for n, s in self.inputs().items()}
        return problem_key(NAME, flat, {"eps": self.eps})

    def row_spec(self) -> RowSpec:
        return RowSpec(NAME, "rms", self.rows, self.length, self.dtype, self.ptype, self.has_gamma,
                       self.has_beta, self.eps)

    def bytes_moved(self) -> int:
        params = self.has_gamma * self.length * ITEMSIZE[self.ptype]
        return 2 * self.rows * self.length * ITEMSIZE[self.dtype] + params


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> RmsNormProblem:
    x = require_tensor(NAME, "x", inputs.get("x"))
    check_input(NAME, x, 1)
    dims = normalized_dims(NAME, attrs.get("normalized_shape"), x)
    gamma = inputs.get("gamma")
    ptype = param_dtype(NAME, {"gamma": gamma}, dims, x)
    eps = check_eps(NAME, attrs.get("eps", 1e-6))
    return RmsNormProblem(tuple(int(s) for s in x.shape), x.dtype, dims, ptype, gamma is not None, eps)


def parse_problem(spec: Mapping[str, str]) -> RmsNormProblem:
    """CLI: x=4096x4096 [normalized_shape=4096] [dtype=float16] [affine=false] [eps=1e-6]."""
    extra = set(spec) - {"x", "normalized_shape", "dtype", "affine", "eps", "ptype"}
    if extra:
        raise ArgumentError(sorted(extra)[0], "one of x, normalized_shape, dtype, ptype, affine, eps", op=NAME)
    shape = parse_shape(spec.get("x", "4096x4096"))
    dims = parse_value(spec.get("normalized_shape", str(shape[-1])))
    dtype = spec.get("dtype", "float32")
    affine = parse_value(spec.get("affine", "true")) is True
    dims_t = tuple(dims) if isinstance(dims, tuple) else (dims,)
    p = TensorSpec(dims_t, spec.get("ptype", dtype)) if affine else None
    return make_problem({"x": TensorSpec(shape, dtype), "gamma": p},
                        {"normalized_shape": dims, "eps": float(spec.get("eps", 1e-6))})


def heuristic(problem: RmsNormProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    return row_heuristic(problem.row_spec(), device, algorithm)


def candidates(problem: RmsNormProblem, device: DeviceInfo) -> list[Schedule]:
    return row_candidates(problem.row_spec(), device)


def plan(problem: RmsNormProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    return row_plan(problem.row_spec(), schedule, device, "y")


def variants(device: DeviceInfo) -> list[tuple[RmsNormProblem, Schedule]]:
    """Every template branch: each strategy, fp32/fp16, with and without gamma."""
    out = []
    for dtype, ptype in (("float32", "float32"), ("float16", "float16"), ("float16", "float32")):
        p = TensorSpec((1024,), ptype)
        prob = make_problem({"x": TensorSpec((64, 1024), dtype), "gamma": p}, {"normalized_shape": 1024})
        spec = prob.row_spec()
        out.append((prob, row_heuristic(spec, device, "naive")))
        out.append((prob, row_heuristic(spec, device, "warp")))
        out.append((prob, row_heuristic(spec, device, "block", tpr=2 * device.warp_size)))
        if dtype == ptype == "float16":
            out.append((prob, row_heuristic(spec, device, "block", tpr=2 * device.warp_size, per_sm=1,
                                            prefetch=True)))
        out.append((prob, row_heuristic(spec, device, "block", store="smem", tpr=256)))
        out.append((prob, row_heuristic(spec, device, "stream")))
        out.append((prob, row_heuristic(spec, device, "split", tpr=64, chunks=2)))
    bare = make_problem({"x": TensorSpec((8, 3, 100), "float32")}, {"normalized_shape": (3, 100)})
    out.append((bare, row_heuristic(bare.row_spec(), device)))
    out.append((bare, row_heuristic(bare.row_spec(), device, "naive")))
    return out


def reference(problem: RmsNormProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    y = layer_reference(inputs["x"], problem.rows, problem.length, problem.eps, rms=True)
    if problem.has_gamma:
        y = y * np.asarray(inputs["gamma"], np.float64).reshape(1, -1)
    return {"y": y.reshape(problem.shape)}


def random_inputs(problem: RmsNormProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {"x": (rng.standard_normal(problem.shape) * 2.0 + 0.5).astype(problem.dtype)}
    if problem.has_gamma:
        out["gamma"] = (1.0 + 0.5 * rng.standard_normal(problem.normalized_shape)).astype(problem.ptype)
    return out


def tolerance(problem: RmsNormProblem, schedule: Schedule) -> tuple[float, float]:
    return row_tolerance(problem.dtype, schedule.algorithm, schedule.get("stats"))


def bytes_moved(problem: RmsNormProblem) -> int:
    return problem.bytes_moved()
