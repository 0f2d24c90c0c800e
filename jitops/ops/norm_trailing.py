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
    # y = norm(s) with s = x + residual [+ bias] (ONNX SkipLayerNormalization), s an output when has_sum
    has_skip: bool = False
    has_bias: bool = False
    btype: str = ""
    has_sum: bool = False

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
        if self.has_skip:
            out["residual"] = TensorSpec(self.shape, self.dtype)
        if self.has_bias:
            out["bias"] = TensorSpec(self.normalized_shape, self.btype)
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        out = {"y": TensorSpec(self.shape, self.dtype)}
        if self.has_sum:
            out["sum"] = TensorSpec(self.shape, self.dtype)
        return out

    def key(self) -> str:
        # Rows x length is all the kernels see: (8, 512, 1024) and (4096, 1024) share records.
        flat = {n: (TensorSpec((self.rows, self.length), s.dtype) if n in ("x", "residual") else s)
                for n, s in self.inputs().items()}
        attrs: dict[str, Any] = {"eps": self.eps}
        if self.has_sum:
            attrs["return_sum"] = True
        return problem_key(self.NAME, flat, attrs)

    def row_spec(self) -> RowSpec:
        return RowSpec(self.NAME, self.KIND, self.rows, self.length, self.dtype, self.ptype, self.has_gamma,
                       self.has_beta, self.eps, has_skip=self.has_skip, has_bias=self.has_bias,
                       btype=self.btype, has_sum=self.has_sum)

    def bytes_moved(self) -> int:
        params = (self.has_gamma + self.has_beta) * self.length * ITEMSIZE[self.ptype]
        if self.has_bias:
            params += self.length * ITEMSIZE[self.btype]
        tensors = 2 + self.has_skip + self.has_sum
        return tensors * self.rows * self.length * ITEMSIZE[self.dtype] + params

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
        residual, bias = inputs.get("residual"), inputs.get("bias")
        if residual is not None and (residual.dtype != x.dtype or tuple(residual.shape) != tuple(x.shape)):
            raise ArgumentError("residual", f"shape {tuple(x.shape)} and dtype {x.dtype} (like x)",
                                f"shape {tuple(residual.shape)} dtype {residual.dtype}", op=name)
        btype = param_dtype(name, {"bias": bias}, dims, x) if bias is not None else ""
        return_sum = attrs.get("return_sum", False)
        if not isinstance(return_sum, (bool, np.bool_)):
            raise ArgumentError("return_sum", "True or False", repr(return_sum), op=name)
        if return_sum and residual is None and bias is None:
            raise ArgumentError("return_sum", "a residual or bias to sum (the sum of x alone is x)", True, op=name)
        return cls(tuple(int(s) for s in x.shape), x.dtype, dims, ptype, params["gamma"] is not None,
                   params.get("beta") is not None, eps, residual is not None, bias is not None, btype,
                   bool(return_sum))

    @classmethod
    def parse(cls: type[P], spec: Mapping[str, str]) -> P:
        """The op's parse_problem. CLI: x=4096x4096 [normalized_shape=4096] [dtype=float16]
        [ptype=float32] [affine=false] [eps=...] [residual=true] [bias=true] [return_sum=true]."""
        extra = set(spec) - {"x", "normalized_shape", "dtype", "affine", "eps", "ptype", "residual", "bias",
                             "return_sum"}
        if extra:
            raise ArgumentError(sorted(extra)[0], "one of x, normalized_shape, dtype, ptype, affine, eps, residual, "
                                "bias, return_sum", op=cls.NAME)
        shape = parse_shape(spec.get("x", "4096x4096"))
        dims = parse_value(spec.get("normalized_shape", str(shape[-1])))
        dtype = spec.get("dtype", "float32")
        affine = parse_value(spec.get("affine", "true")) is True
        dims_t = tuple(dims) if isinstance(dims, tuple) else (dims,)
        p = TensorSpec(dims_t, spec.get("ptype", dtype)) if affine else None
        residual = TensorSpec(shape, dtype) if parse_value(spec.get("residual", "false")) is True else None
        bias = TensorSpec(dims_t, spec.get("ptype", dtype)) if parse_value(spec.get("bias", "false")) is True else None
        return cls.make({"x": TensorSpec(shape, dtype), **{n: p for n in cls.PARAMS}, "residual": residual,
                         "bias": bias},
                        {"normalized_shape": dims, "eps": float(spec.get("eps", cls.EPS)),
                         "return_sum": parse_value(spec.get("return_sum", "false")) is True})


def heuristic(problem: TrailingNormProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    return row_heuristic(problem.row_spec(), device, algorithm)


def candidates(problem: TrailingNormProblem, device: DeviceInfo) -> list[Schedule]:
    return row_candidates(problem.row_spec(), device)


def plan(problem: TrailingNormProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    return row_plan(problem.row_spec(), schedule, device, "y")


def skip_sum(problem: TrailingNormProblem, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """s = x + residual [+ bias] as the kernels form it: added in float32 in that order, rounded to
    x's dtype (the row torch's F.layer_norm(x + r) and ORT's SkipLayerNormalization normalize)."""
    s = np.asarray(inputs["x"]).astype(np.float32)
    if problem.has_skip:
        s = s + np.asarray(inputs["residual"]).astype(np.float32)
    if problem.has_bias:
        s = s + np.asarray(inputs["bias"]).astype(np.float32)     # the trailing dims: broadcasts over rows
    return s.astype(problem.dtype)


def reference(problem: TrailingNormProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 y of the row the kernel normalizes (with a residual: the sum rounded to x's dtype,
    itself the exact reference of the `sum` output)."""
    x = skip_sum(problem, inputs) if problem.has_skip or problem.has_bias else inputs["x"]
    y = layer_reference(x, problem.rows, problem.length, problem.eps, rms=problem.KIND == "rms")
    if problem.has_gamma:
        y = y * np.asarray(inputs["gamma"], np.float64).reshape(1, -1)
    if problem.has_beta:
        y = y + np.asarray(inputs["beta"], np.float64).reshape(1, -1)
    out = {"y": y.reshape(problem.shape)}
    if problem.has_sum:
        out["sum"] = np.asarray(x)
    return out


def random_inputs(problem: TrailingNormProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """norm_random_inputs, plus a residual N(-0.3, 1.5) and a bias N(0.2, 0.5) (never zeros: a
    dropped term shows in the sum and in the statistics)."""
    out = norm_random_inputs(problem.shape, problem.normalized_shape, problem.dtype, problem.ptype,
                             problem.has_gamma, problem.has_beta, rng)
    if problem.has_skip:
        out["residual"] = (rng.standard_normal(problem.shape) * 1.5 - 0.3).astype(problem.dtype)
    if problem.has_bias:
        out["bias"] = (rng.standard_normal(problem.normalized_shape) * 0.5 + 0.2).astype(problem.btype)
    return out


def tolerance(problem: TrailingNormProblem, schedule: Schedule) -> tuple[float, float]:
    return row_tolerance(problem.dtype, schedule.algorithm, schedule.get("stats"))


def bytes_moved(problem: TrailingNormProblem) -> int:
    return problem.bytes_moved()
