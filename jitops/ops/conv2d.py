"""conv2d: NCHW input, OIHW weights, optional bias, fused relu / leaky_relu; fp32 and fp16
(fp32 accumulation).

The op is split over helper modules: conv2d_problem (validation), conv2d_plans (launches per
algorithm), conv2d_schedules (tuning space and cost model), conv2d_winograd (transform matrices).
This module is the op contract the engine sees (docs/adding_an_op.md).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from ..device import DeviceInfo
from . import conv2d_depthwise
from . import conv2d_gemv
from . import conv2d_mma as mma
from . import conv2d_pointwise
from . import conv2d_stem
from . import conv2d_wgmma
from . import conv2d_schedules as schedules
from .base import Plan, Schedule, TensorSpec
from .conv2d_plans import ALGORITHMS, plan as _plan, residual_in_x_format, weights_from_ohwi
from .conv2d_problem import NAME, Conv2dProblem, make_problem, parse_problem

INPUTS = ("x", "w", "bias", "residual")
LAYOUT_INPUTS = ("x", "residual")          # channels_last / layout="nhwc"; y keeps x's format
FORMAT_INPUTS = ("w",)                     # channels_last torch weights read as they are (layout= does not apply)
__all__ = ["NAME", "INPUTS", "ALGORITHMS", "Conv2dProblem", "make_problem", "parse_problem", "heuristic",
           "candidates", "plan", "variants", "reference", "random_inputs", "tolerance", "applicable"]

applicable = schedules.applicable


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(tuning_problems="jitops.tuning.shipped:conv2d_problems",
                            vendor="jitops.tuning.vendor:torch_conv2d", onnx=("Conv",))


def heuristic(problem: Conv2dProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    return schedules.heuristic(problem, device, algorithm)


def candidates(problem: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    return schedules.candidates(problem, device)


def timed_warm_l2(problem: Conv2dProblem, device: DeviceInfo) -> bool:
    """Input, output and weights fit in 80% of L2: the tuner then times the problem with its inputs
    left there (measure.timed_warm), as in a network (the layer before just wrote the input, the
    weights stay from the last call), as graph replays run it and as the cost model rates it
    (conv2d_wgmma.TMA_RESIDENT_BYTES). Behind a flush of L2 every tile of ResNet-50's 32x512x28x28 1x1
    (32 MB) waits on DRAM alike; benchmark mode then picked a tile 1.18x slower in graph replay
    (bf16, H100, 2026-11-27)."""
    p = problem
    return p.io_bytes + p.cout * p.cin_g * p.kh * p.kw * p.itemsize <= 0.8 * device.l2_bytes


def shortlist(problem: Conv2dProblem, device: DeviceInfo, n: int) -> list[Schedule]:
    """The heuristic's pick and the next best-rated schedules, at most n (benchmark mode times them)."""
    return schedules.shortlist(problem, device, n)


def plan(problem: Conv2dProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    if problem.residual_other_format:   # the plan for a residual like x, reading a copy of it in x's format
        return residual_in_x_format(problem, plan(replace(problem, residual_other_format=False), schedule, device))
    if problem.w_layout == "nhwc":      # the plan for OIHW weights, reading an OIHW copy derived from w
        return weights_from_ohwi(problem, _plan(replace(problem, w_layout=""), schedule, device))
    return _plan(problem, schedule, device)


def _problem(x: tuple[int, ...], w: tuple[int, ...], dtype: str = "float32", bias: bool = False,
             residual: bool = False, **attrs: Any) -> Conv2dProblem:
    b = TensorSpec((w[0],), dtype) if bias else None
    p = make_problem({"x": TensorSpec(x, dtype), "w": TensorSpec(w, dtype), "bias": b}, attrs)
    r = p.outputs()["y"] if residual else None
    return make_problem({"x": TensorSpec(x, dtype), "w": TensorSpec(w, dtype), "bias": b, "residual": r}, attrs)


def _mma_variant(p: Conv2dProblem, device: DeviceInfo) -> Schedule:
    """The matrix-core kernel with the largest tile that fits the device (the SIMT residual pass
    where the device has no matrix cores: the emulator)."""
    found = mma.candidates(p, device)
    return found[0] if found else schedules.gemm_schedule("implicit_gemm", (32, 64, 8, 4, 4))


def variants(device: DeviceInfo) -> list[tuple[Conv2dProblem, Schedule]]:
    """Problems and schedules reaching every branch of every template (compile checks): all of
    them in fp32, and in fp16 those whose half loads and stores differ."""
    S = schedules
    out: list[tuple[Conv2dProblem, Schedule]] = []
    for dtype in ("float32", "float16"):
        half = dtype == "float16"
        general = _problem((2, 6, 9, 11), (8, 6, 3, 3), dtype, bias=True, padding=(1, 0, 2, 1), stride=2,
                           activation="leaky_relu")
        resnet = _problem((1, 64, 56, 56), (128, 64, 3, 3), dtype, padding=1, activation="relu")
        odd = _problem((1, 5, 7, 9), (3, 5, 3, 3), dtype, bias=True, padding=1)
        point = _problem((1, 64, 16, 16), (96, 64, 1, 1), dtype, bias=True)
        odd_point = _problem((2, 12, 5, 5), (20, 12, 1, 1), dtype)
        residual = _problem((2, 12, 9, 7), (24, 12, 3, 3), dtype, bias=True, padding=1, stride=2,
                            activation="relu", residual=True)
        depthwise = _problem((1, 16, 20, 20), (16, 1, 3, 3), dtype, bias=True, padding=2, groups=16, dilation=2,
                             activation="relu")
        squeeze = _problem((3, 20, 1, 1), (12, 20, 1, 1), dtype, bias=True, residual=True, activation="relu")
        out += [
            (general, Schedule.make("naive", block=256)),
            (general, S.gemm_schedule("split_k", (64, 64, 8, 8, 8), 2)),               # dense epilogue + reduce
            (resnet, S.gemm_schedule("implicit_gemm", (128, 128, 8, 8, 8))),          # vector stores
            (resnet, S.winograd_schedule("winograd_4x4", (128, 128, 8, 8, 8))),       # all stages, vector rows
            (odd, S.winograd_schedule("winograd_4x4", (32, 64, 8, 4, 4))),            # partial tiles
            (point, S.gemm_schedule("gemm_1x1", (128, 64, 8, 8, 8))),                 # 16-byte B loads
            (depthwise, S.direct_schedule(8, 16, 1, 1, 1)),                           # direct, fused epilogue
            (squeeze, conv2d_gemv.schedule(8, 8)),                                    # few-pixel 1x1 dot products
        ]
        if half:
            out.append((residual, _mma_variant(residual, device)))            # matrix cores: one per target
            dw = make_problem({"x": TensorSpec((1, 24, 9, 7), dtype, "nhwc"), "w": TensorSpec((24, 1, 3, 3), dtype),
                               "bias": TensorSpec((24,), dtype), "residual": TensorSpec((1, 24, 5, 4), dtype, "nhwc")},
                              {"padding": 1, "stride": 2, "groups": 24, "activation": "relu"})
            out.append((dw, conv2d_depthwise.schedule(2, 2)))                     # NHWC depthwise, 16-byte vectors
            rgb = make_problem({"x": TensorSpec((1, 3, 9, 7), dtype, "nhwc"), "w": TensorSpec((16, 3, 3, 3), dtype),
                                "bias": TensorSpec((16,), dtype), "residual": TensorSpec((1, 16, 5, 4), dtype, "nhwc")},
                               {"padding": 1, "stride": 2, "activation": "relu"})
            out.append((rgb, conv2d_stem.schedule(16)))                               # few-channel stem, NHWC stores
            thin = make_problem({"x": TensorSpec((1, 24, 9, 7), dtype, "nhwc"), "w": TensorSpec((20, 24, 1, 1), dtype),
                                 "bias": TensorSpec((20,), dtype), "residual": TensorSpec((1, 20, 9, 7), dtype, "nhwc")},
                                {"activation": "relu"})
            if conv2d_pointwise.why_not(thin) is None and device.matrix_cores:
                out.append((thin, conv2d_pointwise.schedule(2, 3, 4)))                # few-channel 1x1 stream
                thin_nchw = _problem((2, 24, 4, 6), (21, 24, 1, 1), dtype, bias=True, residual=True, activation="relu")
                out.append((thin_nchw, conv2d_pointwise.schedule(1, 2, 2)))           # the same on NCHW
            if conv2d_wgmma.why_not(residual, device) is None:                    # sm_90a: one representative
                out.append((residual, conv2d_wgmma.schedule(128, 128, 4, 1, split_k=1)))
                res_nhwc = make_problem({"x": TensorSpec((2, 12, 9, 7), dtype, "nhwc"),
                                         "w": TensorSpec((20, 12, 3, 3), dtype), "bias": TensorSpec((20,), dtype),
                                         "residual": TensorSpec((2, 20, 5, 4), dtype, "nhwc")},
                                        {"padding": 1, "stride": 2, "activation": "relu"})
                out.append((res_nhwc, conv2d_wgmma.schedule(128, 128, 3, 0, persistent=True)))   # scalar stores
                out.append((res_nhwc, conv2d_wgmma.tma_schedule((256, 128, 4, 2, 232), 64)))      # TMA, setmaxnreg
                plain_1x1 = make_problem({"x": TensorSpec((2, 16, 9, 7), dtype, "nhwc"),
                                          "w": TensorSpec((24, 16, 1, 1), dtype), "bias": None}, {})
                out.append((plain_1x1, conv2d_wgmma.tma_schedule((64, 128, 4, 1, 0), 64, a_rows=True)))  # TMA, A tiled
                nchw_1x1 = _problem((2, 40, 8, 6), (72, 40, 1, 1), dtype, bias=True, residual=True, activation="relu")
                out.append((nchw_1x1, conv2d_wgmma.schedule(128, 64, 4, 0, b_nchw=True)))          # NCHW read in place
                out.append((rgb, conv2d_wgmma.schedule(64, 64, 4, 0, rows=True)))                  # RGB window rows
            continue
        tf32 = _problem((2, 12, 9, 7), (24, 12, 3, 3), dtype, bias=True, padding=1, stride=2, activation="relu",
                        residual=True, precision="3xtf32")
        out += [
            (tf32, _mma_variant(tf32, device)),           # fp32 on the matrix cores (3xtf32 covers tf32's code)
            (general, S.gemm_schedule("implicit_gemm", (32, 64, 8, 4, 4))),          # channel tail check
            (general, S.direct_schedule(4, 16, 2, 4, 4, splits=2)),                   # direct, partial sums
            (resnet, S.winograd_schedule("winograd_2x2", (64, 64, 8, 4, 4))),         # guarded B rows
            (resnet, S.gemm_schedule("implicit_gemm", (64, 128, 16, 8, 8))),          # BK 16
            (point, S.gemm_schedule("split_k", (32, 128, 8, 4, 8), 4)),
            (odd_point, S.gemm_schedule("gemm_1x1", (16, 128, 8, 4, 4))),             # scalar B loads
            (depthwise, conv2d_depthwise.schedule(2, 4)),                             # NCHW depthwise in place
        ]
    return out


def _logical(a: np.ndarray, nhwc: bool) -> np.ndarray:
    """An activation in storage order as (N, C, H, W)."""
    return a.transpose(0, 3, 1, 2) if nhwc else a


def _storage(a: np.ndarray, nhwc: bool) -> np.ndarray:
    """An (N, C, H, W) activation in storage order ((N, H, W, C) for "nhwc")."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if nhwc else a


def reference(problem: Conv2dProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 convolution by explicit im2col per group (independent of every kernel here).
    Activations (x, residual, y) in storage order, as every op's reference and random_inputs: the
    tuner copies them to and from device buffers byte for byte."""
    p = problem
    nhwc = p.layout == "nhwc"
    x = _logical(np.asarray(inputs["x"], dtype=np.float64), nhwc)
    w = np.asarray(inputs["w"], dtype=np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (p.pad[0], p.pad[2]), (p.pad[1], p.pad[3])))
    sh, sw = p.stride
    dh, dw = p.dilation
    y = np.zeros((p.n, p.cout, p.oh, p.ow))
    for g in range(p.groups):
        xg = xp[:, g * p.cin_g:(g + 1) * p.cin_g]
        wg = w[g * p.cout_g:(g + 1) * p.cout_g]
        for r in range(p.kh):
            for s in range(p.kw):
                patch = xg[:, :, r * dh:r * dh + sh * (p.oh - 1) + 1:sh, s * dw:s * dw + sw * (p.ow - 1) + 1:sw]
                y[:, g * p.cout_g:(g + 1) * p.cout_g] += np.einsum("nchw,oc->nohw", patch, wg[:, :, r, s])
    if p.has_bias:
        y += np.asarray(inputs["bias"], dtype=np.float64)[None, :, None, None]
    if p.has_residual:
        y += _logical(np.asarray(inputs["residual"], dtype=np.float64), nhwc)
    if p.activation == "relu":
        y = np.maximum(y, 0.0)
    elif p.activation == "leaky_relu":
        y = np.where(y < 0, p.alpha * y, y)
    return {"y": _storage(y, nhwc)}


def random_inputs(problem: Conv2dProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Unit-normal input; weights scaled by 1/sqrt(fan-in) so outputs stay O(1) at every size.
    Activations in storage order ((N, H, W, C) for "nhwc")."""
    p = problem
    nhwc = p.layout == "nhwc"
    fan_in = p.cin_g * p.kh * p.kw
    out = {"x": _storage(rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(p.dtype), nhwc),
           "w": (rng.standard_normal((p.cout, p.cin_g, p.kh, p.kw)) / np.sqrt(fan_in)).astype(p.dtype)}
    if p.has_bias:
        out["bias"] = rng.standard_normal(p.cout).astype(p.dtype)
    if p.has_residual:
        out["residual"] = _storage(rng.standard_normal((p.n, p.cout, p.oh, p.ow)).astype(p.dtype), nhwc)
    return out


def tolerance(problem: Conv2dProblem, schedule: Schedule) -> tuple[float, float]:
    """(rtol, atol) against the float64 reference, relative to the largest |reference| value.

    fp32: an output is a K-term fp32 sum (K = input channels per group x taps); with weights
    scaled by 1/sqrt(K) its rounding error grows like sqrt(K) * 2^-24 (measured on an H200:
    9.8e-6 for the naive kernel's sequential sum at K = 17280). Allowed: 4 sqrt(K) 2^-24, at
    least 1e-5. Winograd sums only over input channels (K = Cin), then transforms: F(2x2)'s
    entries (0, +-1, +-1/2) add little, 8 sqrt(Cin) 2^-24, at least 3e-5; F(4x4)'s entries up to
    8 (A^T) and 5 (B^T) amplify rounding about 10-15x (measured 3.7e-5 at Cin = 1920):
    60 sqrt(Cin) 2^-24, at least 2e-4 (docs/conv2d.md). fp16: inputs are exact fp16 values,
    accumulation is fp32, the output is rounded once to fp16 (2^-11 of a value): 2e-3, plus the
    fp32 allowance above. bf16: the same with 8 significant bits (2^-9): 1e-2. The matrix-core
    kernel multiplies exact 16-bit values into fp32 accumulators: the same allowances. fp32 on the
    matrix cores: "tf32" rounds both operands to 11 significant bits (relative error 2^-11 each,
    about 2^-10 per product, averaging down over K like the fp32 sum): 4e-3; "3xtf32" (big +
    small TF32 parts, three products) twice the fp32 allowance.
    """
    eps = 2.0 ** -24
    alg = schedule.algorithm
    if alg == "winograd_4x4":
        tol = max(2e-4, 60 * problem.cin ** 0.5 * eps)
    elif alg == "winograd_2x2":
        tol = max(3e-5, 8 * problem.cin ** 0.5 * eps)
    else:
        tol = max(1e-5, 4 * problem.gemm_k ** 0.5 * eps)
    if alg == "implicit_gemm_wgmma" and problem.precision == "tf32":
        tol = 8e-3     # wgmma reads TF32 from the fp32 bits: truncated (2^-10 each), not rounded
    elif alg == "implicit_gemm_mma" and problem.precision == "tf32":
        tol = 4e-3     # operands rounded to 10-bit mantissas (2^-11 each): ~2^-10 per product
    elif alg == "implicit_gemm_mma" and problem.precision == "3xtf32":
        tol *= 2       # big + small parts keep ~21 bits of each operand: within 2x of exact fp32
    if problem.dtype == "float16":
        tol += 2e-3
    elif problem.dtype == "bfloat16":
        tol += 1e-2    # output rounded to bf16 (2^-9 of a value), twice when a residual pass follows
    return (tol, 0.0)


def flops(problem: Conv2dProblem) -> int:
    return problem.flops
