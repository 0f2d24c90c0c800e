"""rms_norm: y = x / sqrt(mean(x^2) + eps) * gamma over the trailing dims.

fp32, fp16 or bf16 input, fp32 accumulation; gamma optional, shaped like `normalized_shape`, in the
input's dtype or float32. One implementation with layer_norm (norm_trailing); the statistic is a plain
sum of squares (nothing to cancel, so one pass is exact enough). `naive` is the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import DeviceInfo
from .base import Registration, Schedule, TensorSpec
from .norm_common import row_heuristic
# The op functions: one implementation for layer_norm and rms_norm.
from .norm_trailing import (TrailingNormProblem, bytes_moved, candidates, heuristic, plan,
                            random_inputs, reference, tolerance)

NAME = "rms_norm"
INPUTS = ("x", "gamma", "residual", "bias")


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
REGISTRATION = Registration(vendor="jitops.tuning.vendor:torch_rms_norm", onnx=("RMSNormalization", "Pow", "Mul"))


@dataclass(frozen=True)
class RmsNormProblem(TrailingNormProblem):
    NAME = NAME
    KIND = "rms"
    PARAMS = ("gamma",)
    EPS = 1e-6


make_problem = RmsNormProblem.make
parse_problem = RmsNormProblem.parse


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


__all__ = ["NAME", "INPUTS", "REGISTRATION", "RmsNormProblem", "make_problem", "parse_problem", "heuristic",
           "candidates", "plan", "variants", "reference", "random_inputs", "tolerance", "bytes_moved"]
