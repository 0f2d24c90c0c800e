"""group_norm: channels split into `num_groups` groups; each (sample, group) normalized alone,
then gamma[c] * y + beta[c] per channel.

x is (N, C, *spatial) (NCHW, or any rank >= 2 with channels on axis 1): a group is C/G whole
channel planes, contiguous, so it is a "row" of (C/G) * plane elements for the row scheduler
(norm_common), with parameters looked up per channel (compile-time plane size: no division at
run time). Seed 000 section 6 is the baseline (`naive`); the split path writes per-plane
coefficients that batch_norm's affine kernel applies.

fp32, fp16 or bf16 x (fp32 statistics), parameters in x's dtype or fp32. A channels_last x (or a
layout="nhwc" array) is read in place by the NHWC kernels (group_norm_nhwc) and the output keeps
that format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError
from . import group_norm_nhwc as nhwc
from .base import ITEMSIZE, Plan, Schedule, TensorSpec, parse_shape, parse_value
from .norm_args import channel_problem_key, check_eps, check_input, param_dtype, prod, require_tensor
from .norm_common import RowSpec, layer_reference, row_candidates, row_heuristic, row_plan, row_tolerance
from .norm_reference import norm_random_inputs

NAME = "group_norm"
INPUTS = ("x", "gamma", "beta")
LAYOUT_INPUTS = ("x",)


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(vendor="jitops.tuning.vendor:torch_group_norm",
                            onnx=("GroupNormalization", "InstanceNormalization"))


@dataclass(frozen=True)
class GroupNormProblem:
    shape: tuple[int, ...]
    dtype: str
    groups: int
    ptype: str
    has_gamma: bool
    has_beta: bool
    eps: float
    layout: str = ""          # "nhwc": x stored N, H, W, C

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def plane(self) -> int:
        return prod(self.shape[2:])

    def inputs(self) -> dict[str, TensorSpec]:
        out = {"x": TensorSpec(self.shape, self.dtype, self.layout)}
        if self.has_gamma:
            out["gamma"] = TensorSpec((self.channels,), self.ptype)
        if self.has_beta:
            out["beta"] = TensorSpec((self.channels,), self.ptype)
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(self.shape, self.dtype, self.layout)}

    def key(self) -> str:
        return channel_problem_key(NAME, self, {"num_groups": self.groups, "eps": self.eps})

    def row_spec(self) -> RowSpec:
        cpg = self.channels // self.groups
        return RowSpec(NAME, "layer", self.shape[0] * self.groups, cpg * self.plane, self.dtype, self.ptype,
                       self.has_gamma, self.has_beta, self.eps, groups=self.groups, cpg=cpg, plane=self.plane,
                       nhwc=self.layout == "nhwc")

    def bytes_moved(self) -> int:
        params = (self.has_gamma + self.has_beta) * self.channels * ITEMSIZE[self.ptype]
        return 2 * prod(self.shape) * ITEMSIZE[self.dtype] + params


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> GroupNormProblem:
    x = require_tensor(NAME, "x", inputs.get("x"))
    check_input(NAME, x, 2)
    groups = attrs.get("num_groups")
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups <= 0:
        raise ArgumentError("num_groups", "a positive int", repr(groups), op=NAME)
    groups = int(groups)
    channels = int(x.shape[1])
    if channels % groups:
        raise ArgumentError("num_groups", f"a divisor of the channel count {channels}", groups, op=NAME)
    gamma, beta = inputs.get("gamma"), inputs.get("beta")
    ptype = param_dtype(NAME, {"gamma": gamma, "beta": beta}, (channels,), x)
    eps = check_eps(NAME, attrs.get("eps", 1e-5))
    return GroupNormProblem(tuple(int(s) for s in x.shape), x.dtype, groups, ptype, gamma is not None,
                            beta is not None, eps, x.layout)


def parse_problem(spec: Mapping[str, str]) -> GroupNormProblem:
    """CLI: x=256x64x56x56 num_groups=32 [dtype=float16] [ptype=float32] [affine=false] [eps=1e-5]
    [layout=nhwc] (x is the logical N x C x H x W shape either way)."""
    extra = set(spec) - {"x", "num_groups", "dtype", "ptype", "affine", "eps", "layout"}
    if extra:
        raise ArgumentError(sorted(extra)[0], "one of x, num_groups, dtype, ptype, affine, eps, layout", op=NAME)
    layout = spec.get("layout", "nchw")
    shape = parse_shape(spec.get("x", "256x64x56x56"))
    dtype = spec.get("dtype", "float32")
    affine = parse_value(spec.get("affine", "true")) is True
    p = TensorSpec((shape[1] if len(shape) > 1 else 0,), spec.get("ptype", dtype)) if affine else None
    if layout not in ("nchw", "nhwc") or (layout == "nhwc" and len(shape) != 4):
        raise ArgumentError("layout", "nchw, or nhwc with a 4-d x", layout, op=NAME)
    return make_problem({"x": TensorSpec(shape, dtype, "" if layout == "nchw" else layout), "gamma": p, "beta": p},
                        {"num_groups": parse_value(spec.get("num_groups", "32")),
                         "eps": float(spec.get("eps", 1e-5))})


def heuristic(problem: GroupNormProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    if problem.layout == "nhwc":
        return nhwc.heuristic(problem, device, algorithm)
    return row_heuristic(problem.row_spec(), device, algorithm)


def candidates(problem: GroupNormProblem, device: DeviceInfo) -> list[Schedule]:
    if problem.layout == "nhwc":
        return nhwc.candidates(problem, device)
    return row_candidates(problem.row_spec(), device)


def plan(problem: GroupNormProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    if problem.layout == "nhwc":
        return nhwc.plan(problem, schedule, device)
    return row_plan(problem.row_spec(), schedule, device, "y")


def variants(device: DeviceInfo) -> list[tuple[GroupNormProblem, Schedule]]:
    """Every template branch: planes that are whole vectors and planes that are not (7x7),
    each strategy and statistic, fp32/fp16, mixed-precision parameters, no parameters."""
    out = []
    for dtype, ptype, planes in (("float32", "float32", ((8, 8), (7, 7))), ("float16", "float16", ((8, 8),)),
                                 ("float16", "float32", ((7, 7),))):
        for hw in planes:
            p = TensorSpec((32,), ptype)
            prob = make_problem({"x": TensorSpec((2, 32, *hw), dtype), "gamma": p, "beta": p}, {"num_groups": 8})
            spec = prob.row_spec()
            out.append((prob, row_heuristic(spec, device, "naive")))
            out.append((prob, row_heuristic(spec, device)))
            out.append((prob, row_heuristic(spec, device, "block", tpr=2 * device.warp_size)))
            if dtype == "float32" and hw == (7, 7):
                out.append((prob, row_heuristic(spec, device, "block", tpr=2 * device.warp_size, per_sm=1,
                                                prefetch=True)))
            out.append((prob, row_heuristic(spec, device, "block", store="smem", tpr=2 * device.warp_size)))
            out.append((prob, row_heuristic(spec, device, "stream")))
            out.append((prob, row_heuristic(spec, device, "split", tpr=device.warp_size, chunks=2)))
    p = TensorSpec((32,), "float32")
    prob = make_problem({"x": TensorSpec((2, 32, 8, 8), "float32"), "gamma": p, "beta": p}, {"num_groups": 8})
    for stats in ("welford", "sumsq"):
        out.append((prob, row_heuristic(prob.row_spec(), device, "warp", stats=stats)))
        out.append((prob, row_heuristic(prob.row_spec(), device, "split", stats=stats, tpr=device.warp_size,
                                        chunks=2)))
    bare = make_problem({"x": TensorSpec((2, 32, 8, 8), "float32")}, {"num_groups": 4})
    for alg in ("naive", "block", "split"):
        out.append((bare, row_heuristic(bare.row_spec(), device, alg)))
    return out + nhwc.variants(_nhwc_problem, device)


def _nhwc_problem(shape: tuple[int, ...], dtype: str, ptype: str, groups: int) -> GroupNormProblem:
    p = TensorSpec((shape[1],), ptype)
    return make_problem({"x": TensorSpec(shape, dtype, "nhwc"), "gamma": p, "beta": p}, {"num_groups": groups})


def reference(problem: GroupNormProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64; x and y in storage order ((N, H, W, C) for "nhwc")."""
    n, c = problem.shape[0], problem.channels
    spec = problem.row_spec()
    x = np.asarray(inputs["x"], np.float64)
    if problem.layout == "nhwc":
        x = np.moveaxis(x, 3, 1)
    y = layer_reference(np.ascontiguousarray(x), spec.rows, spec.length, problem.eps, rms=False).reshape(n, c, -1)
    if problem.has_gamma:
        y = y * np.asarray(inputs["gamma"], np.float64).reshape(1, c, 1)
    if problem.has_beta:
        y = y + np.asarray(inputs["beta"], np.float64).reshape(1, c, 1)
    y = y.reshape(problem.shape)
    return {"y": np.ascontiguousarray(np.moveaxis(y, 1, 3)) if problem.layout == "nhwc" else y}


def random_inputs(problem: GroupNormProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x in storage order ((N, H, W, C) for "nhwc")."""
    return norm_random_inputs(problem.inputs()["x"].storage_shape, problem.channels, problem.dtype, problem.ptype,
                              problem.has_gamma, problem.has_beta, rng)


def tolerance(problem: GroupNormProblem, schedule: Schedule) -> tuple[float, float]:
    return row_tolerance(problem.dtype, schedule.algorithm, schedule.get("stats"))


def bytes_moved(problem: GroupNormProblem) -> int:
    return problem.bytes_moved()
