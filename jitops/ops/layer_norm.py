"""layer_norm: y = (x - mean) / sqrt(var + eps) * gamma + beta over the trailing dims.

With `residual` (and `bias`), x is replaced by s = x + residual [+ bias] (ONNX's
SkipLayerNormalization), s rounded to x's dtype, and `return_sum` makes s a second output.

fp32, fp16 or bf16 input, fp32 statistics; gamma/beta optional, shaped like `normalized_shape`, in
the input's dtype or float32. One implementation with rms_norm (norm_trailing); the
row scheduler (norm_common) picks warp / block / stream /
split kernels and the statistics; `naive` is the baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import DeviceInfo
from .base import Registration, Schedule, TensorSpec
from .norm_common import row_heuristic
# The op functions: one implementation for layer_norm and rms_norm.
from .norm_trailing import (TrailingNormProblem, bytes_moved, candidates, heuristic, plan,
                            random_inputs, reference, tolerance)

NAME = "layer_norm"
INPUTS = ("x", "gamma", "beta", "residual", "bias")


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
REGISTRATION = Registration(vendor="jitops.tuning.vendor:torch_layer_norm", onnx=("LayerNormalization", "ReduceMean"))


@dataclass(frozen=True)
class LayerNormProblem(TrailingNormProblem):
    NAME = NAME
    KIND = "layer"
    PARAMS = ("gamma", "beta")
    EPS = 1e-5


make_problem = LayerNormProblem.make
parse_problem = LayerNormProblem.parse


def variants(device: DeviceInfo) -> list[tuple[LayerNormProblem, Schedule]]:
    """Every template branch: each strategy and statistic, fp32/fp16, with and without affine."""
    out = []
    for dtype, ptype in (("float32", "float32"), ("float16", "float16"), ("float16", "float32")):
        p = TensorSpec((1024,), ptype)
        prob = make_problem({"x": TensorSpec((64, 1024), dtype), "gamma": p, "beta": p}, {"normalized_shape": 1024})
        spec = prob.row_spec()
        out.append((prob, row_heuristic(spec, device, "naive")))
        out.append((prob, row_heuristic(spec, device, "block", store="smem", tpr=256)))
        # Every statistic in fp32; the storage types need each strategy once.
        for stats in ("two_pass", "welford", "sumsq") if dtype == ptype == "float32" else ("two_pass",):
            out.append((prob, row_heuristic(spec, device, "warp", stats=stats)))
            out.append((prob, row_heuristic(spec, device, "block", stats=stats, tpr=2 * device.warp_size)))
        # Persistent grid, next row prefetched (one kernel body for every statistic and dtype).
        if dtype == ptype == "float32":
            out.append((prob, row_heuristic(spec, device, "block", stats="welford", tpr=2 * device.warp_size,
                                            per_sm=1, prefetch=True)))
        if dtype == ptype == "float16":
            out.append((prob, row_heuristic(spec, device, "warp", tpr=8, per_sm=1, prefetch=True)))
        for stats in ("welford", "sumsq") if dtype == ptype == "float32" else ("welford",):
            out.append((prob, row_heuristic(spec, device, "stream", stats=stats)))
            out.append((prob, row_heuristic(spec, device, "split", stats=stats, tpr=64, chunks=2)))
    bare = make_problem({"x": TensorSpec((8, 3, 100), "float32")}, {"normalized_shape": (3, 100)})
    out.append((bare, row_heuristic(bare.row_spec(), device)))
    out.append((bare, row_heuristic(bare.row_spec(), device, "naive")))
    # bf16 activations with fp32 parameters (the row family's one bf16 representative).
    p32 = TensorSpec((1024,), "float32")
    bf16 = make_problem({"x": TensorSpec((64, 1024), "bfloat16"), "gamma": p32, "beta": p32},
                        {"normalized_shape": 1024})
    out.append((bf16, row_heuristic(bf16.row_spec(), device)))
    only_gamma = make_problem({"x": TensorSpec((8, 100), "float32"), "gamma": TensorSpec((100,), "float32")},
                              {"normalized_shape": 100})
    out.append((only_gamma, row_heuristic(only_gamma.row_spec(), device, "block", tpr=device.warp_size * 2)))
    # The residual form (SkipLayerNormalization: x + residual + bias, the sum written): one representative.
    h = TensorSpec((1024,), "float16")
    skip = make_problem({"x": TensorSpec((64, 1024), "float16"), "gamma": h, "beta": h,
                         "residual": TensorSpec((64, 1024), "float16"), "bias": h},
                        {"normalized_shape": 1024, "return_sum": True})
    out.append((skip, row_heuristic(skip.row_spec(), device)))
    return out


__all__ = ["NAME", "INPUTS", "REGISTRATION", "LayerNormProblem", "make_problem", "parse_problem", "heuristic",
           "candidates", "plan", "variants", "reference", "random_inputs", "tolerance", "bytes_moved"]
