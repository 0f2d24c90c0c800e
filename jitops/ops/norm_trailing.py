"""layer_norm and rms_norm: one implementation of a normalization over the trailing dims.

The two ops differ in their statistic (mean and variance, or the mean of squares), their
parameters (gamma and beta, or gamma) and their default eps; everything else (checks, problem
keys, the row scheduler and planner, references) is this module. Each op module subclasses
TrailingNormProblem with its NAME / KIND / PARAMS / EPS and imports the functions below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, TypeVar

import numpy as np

from ..device import DeviceInfo
from ..errors import ArgumentError
from .base import ITEMSIZE, Plan, Schedule, TensorSpec, parse_shape, parse_value, problem_key
from .norm_args import check_eps, check_input, normalized_dims, param_dtype, prod, require_tensor
from .norm_common import RowSpec, layer_reference, row_candidates, row_heuristic, row_plan, row_tolerance
from .norm_reference import norm_random_inputs


P = TypeVar("P", bound="TrailingNormProblem")


@dataclass(frozen=True)
class TrailingNormProblem:
    NAME: ClassVar[str]
    KIND: ClassVar[str]                 # "layer": mean and variance; "rms": mean of squares
    PARAMS: ClassVar[tuple[str, ...]]   # parameter inputs: ("gamma", "beta") or ("gamma",)
    EPS: ClassVar[float]                # default eps

    shape: tuple[int, ...]
    dtype: str
    normalized_shape: tuple[int, ...]
    ptype: str
    has_gamma: bool
    has_beta: bool
    eps: float

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
        if self.has_beta:
            out["beta"] = TensorSpec(self.normalized_shape, self.ptype)
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec(self.shape, self.dtype)}

    def key(self) -> str:
        # Rows x length is all the kernels see: (8, 512, 1024) and (4096, 1024) share records.
        flat = {n: (TensorSpec((self.rows, self.length), s.dtype) if n == "x" else s) for n, s in self.inputs().items()}
        return problem_key(self.NAME, flat, {"eps": self.eps})

    def row_spec(self) -> RowSpec:
        return RowSpec(self.NAME, self.KIND, self.rows, self.length, self.dtype, self.ptype, self.has_gamma,
                       self.has_beta, self.eps)

    def bytes_moved(self) -> int:
        params = (self.has_gamma + self.has_beta) * self.length * ITEMSIZE[self.ptype]
        return 2 * self.rows * self.length * ITEMSIZE[self.dtype] + params

    @classmethod
    def make(cls: type[P], inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> P:
        """The op's make_problem: validated inputs and attributes."""
        name = cls.NAME
        x = require_tensor(name, "x", inputs.get("x"))
        check_input(name, x, 1)
        dims = normalized_dims(name, attrs.get("normalized_shape"), x)
        params = {p: inputs.get(p) for p in cls.PARAMS}
        ptype = param_dtype(name, params, dims, x)
        eps = check_eps(name, attrs.get("eps", cls.EPS))
        return cls(tuple(int(s) for s in x.shape), x.dtype, dims, ptype, params["gamma"] is not None,
                   params.get("beta") is not None, eps)

    @classmethod
    def parse(cls: type[P], spec: Mapping[str, str]) -> P:
        """The op's parse_problem. CLI: x=4096x4096 [normalized_shape=4096] [dtype=float16]
        [ptype=float32] [affine=false] [eps=...]."""
        extra = set(spec) - {"x", "normalized_shape", "dtype", "affine", "eps", "ptype"}
        if extra:
            raise ArgumentError(sorted(extra)[0], "one of x, normalized_shape, dtype, ptype, affine, eps",
                                op=cls.NAME)
        shape = parse_shape(spec.get("x", "4096x4096"))
        dims = parse_value(spec.get("normalized_shape", str(shape[-1])))
        dtype = spec.get("dtype", "float32")
        affine = parse_value(spec.get("affine", "true")) is True
        dims_t = tuple(dims) if isinstance(dims, tuple) else (dims,)
        p = TensorSpec(dims_t, spec.get("ptype", dtype)) if affine else None
        return cls.make({"x": TensorSpec(shape, dtype), **{n: p for n in cls.PARAMS}},
                        {"normalized_shape": dims, "eps": float(spec.get("eps", cls.EPS))})


def heuristic(problem: TrailingNormProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    return row_heuristic(problem.row_spec(), device, algorithm)


def candidates(problem: TrailingNormProblem, device: DeviceInfo) -> list[Schedule]:
    return row_candidates(problem.row_spec(), device)


def plan(problem: TrailingNormProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    return row_plan(problem.row_spec(), schedule, device, "y")


def reference(problem: TrailingNormProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    y = layer_reference(inputs["x"], problem.rows, problem.length, problem.eps, rms=problem.KIND == "rms")
    if problem.has_gamma:
        y = y * np.asarray(inputs["gamma"], np.float64).reshape(1, -1)
    if problem.has_beta:
        y = y + np.asarray(inputs["beta"], np.float64).reshape(1, -1)
    return {"y": y.reshape(problem.shape)}


def random_inputs(problem: TrailingNormProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return norm_random_inputs(problem.shape, problem.normalized_shape, problem.dtype, problem.ptype,
                              problem.has_gamma, problem.has_beta, rng)


def tolerance(problem: TrailingNormProblem, schedule: Schedule) -> tuple[float, float]:
    return row_tolerance(problem.dtype, schedule.algorithm, schedule.get("stats"))


def bytes_moved(problem: TrailingNormProblem) -> int:
    return problem.bytes_moved()
