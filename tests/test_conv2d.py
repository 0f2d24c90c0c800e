"""conv2d on the emulator (warp 32 and 64, checked mode) against a float64 reference.

Outputs are poisoned with NaN before every run, so an element no kernel wrote fails the test.
Data is random (unit-normal x, weights scaled by 1/sqrt(fan-in), so |y| is O(1)); errors are
measured relative to the largest |reference| value.
"""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec
from jitops.ops.conv2d_schedules import direct_schedule, gemm_schedule

from conftest import rel_error

op = get_op("conv2d")

# Accepted error relative to max |reference|, per algorithm and dtype, and why:
# - fp32 direct / GEMM: each output is a K-term fp32 sum (K <= 500 here); rounding grows like
#   sqrt(K) * 2^-24 ~ 1.3e-6 at K = 500; 1e-5 leaves room for unlucky cancellation.
# - winograd_2x2: the transforms add and halve (entries 0, +-1, +-1/2): a few more roundings, 3e-5.
# - winograd_4x4: entries up to 8 (A^T) and 5 (B^T) with 1/24 .. 1/4 in G amplify the rounding
#   of the transformed values by about 10x (docs/conv2d.md, measured 5e-6 .. 2e-5): 2e-4.
# - fp16: inputs are exactly fp16, products and sums are fp32, the output is rounded once to fp16
#   (2^-11 ~ 4.9e-4 relative to the value, less relative to the max): 2e-3; F(4x4) 4e-3.
TOL = {
    ("float32", "naive"): 1e-5, ("float32", "direct"): 1e-5, ("float32", "implicit_gemm"): 1e-5,
    ("float32", "gemm_1x1"): 1e-5, ("float32", "split_k"): 1e-5, ("float32", "direct_stem"): 1e-5,
    ("float32", "winograd_2x2"): 3e-5, ("float32", "winograd_4x4"): 2e-4, ("float32", "depthwise"): 1e-5,
    ("float16", "naive"): 2e-3, ("float16", "direct"): 2e-3, ("float16", "implicit_gemm"): 2e-3,
    ("float16", "gemm_1x1"): 2e-3, ("float16", "split_k"): 2e-3, ("float16", "direct_stem"): 2e-3,
    ("float16", "winograd_2x2"): 2e-3, ("float16", "winograd_4x4"): 4e-3, ("float16", "depthwise"): 2e-3,
}


def run_and_check(rng, x_shape, w_shape, *, dtype="float32", bias=False, schedule=None, **attrs):
    spec = {"x": TensorSpec(x_shape, dtype), "w": TensorSpec(w_shape, dtype),
            "bias": TensorSpec((w_shape[0],), dtype) if bias else None}
    problem = op.make_problem(spec, attrs)
    inputs = op.random_inputs(problem, rng)
    out = np.full(problem.outputs()["y"].shape, np.nan, dtype=dtype)
    y = jitops.conv2d(inputs["x"], inputs["w"], inputs.get("bias"), out=out, schedule=schedule, **attrs)
    assert y is out and y.dtype == np.dtype(dtype)
    assert not np.isnan(y).any(), "output elements left unwritten"
    ref = op.reference(problem, inputs)["y"]
    chosen = schedule if isinstance(schedule, Schedule) else None
    algorithm = chosen.algorithm if chosen else (schedule or _heuristic(problem).algorithm)
    err = rel_error(y, ref)
    assert err <= TOL[(dtype, algorithm)], f"{problem.describe()} {schedule}: error {err:.3e}"
    return problem, inputs, y


def _heuristic(problem):
    return op.heuristic(problem, jitops.get_backend().device)


# ---------------------------------------------------------------- every algorithm, forced

GENERAL = dict(x_shape=(2, 5, 9, 11), w_shape=(7, 5, 3, 3), padding=(1, 0, 2, 1), bias=True,
               activation="leaky_relu", alpha=0.2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", ["naive", "direct", "implicit_gemm", "split_k", "winograd_2x2", "winograd_4x4"])
def test_each_algorithm_forced(emu, rng, dtype, algorithm):
    """Asymmetric padding, odd sizes, batch 2, bias and leaky_relu through every algorithm."""
    run_and_check(rng, dtype=dtype, schedule=algorithm, **GENERAL)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("hw", [(5, 7), (4, 8)], ids=["scalar_b", "vector_b"])
def test_gemm_1x1(emu, rng, dtype, hw):
    """1x1 as a plain GEMM: odd pixel counts take scalar B loads, multiples of 4 16-byte loads."""
    run_and_check(rng, (3, 12, *hw), (20, 12, 1, 1), dtype=dtype, bias=True, activation="relu",
                  schedule="gemm_1x1")


@pytest.mark.parametrize("tile", [(128, 128, 8, 8, 8), (64, 64, 8, 4, 4), (32, 128, 8, 4, 8), (16, 128, 8, 4, 4)])
def test_gemm_tiles(emu, rng, tile):
    """Every tile shape, with a reduction (4 * 9 = 36) that is not a multiple of BK per tap."""
    run_and_check(rng, (2, 4, 10, 9), (19, 4, 3, 3), padding=1, schedule=gemm_schedule("implicit_gemm", tile))


@pytest.mark.parametrize("splits", [2, 3, 5])
def test_split_k(emu, rng, splits):
    """Uneven K ranges per split (the last one shorter), reduced with bias and relu."""
    run_and_check(rng, (1, 40, 4, 4), (24, 40, 1, 1), bias=True, activation="relu",
                  schedule=gemm_schedule("split_k", (32, 64, 8, 4, 4), splits))


@pytest.mark.parametrize("algorithm", ["winograd_2x2", "winograd_4x4"])
def test_winograd_partial_tiles_and_padding(emu, rng, algorithm):
    """Outputs that are not a multiple of m, asymmetric padding (0..2 per side), 9 channels."""
    run_and_check(rng, (2, 9, 11, 7), (6, 9, 3, 3), padding=(0, 2, 1, 0), bias=True, schedule=algorithm)
    run_and_check(rng, (1, 3, 8, 8), (5, 3, 3, 3), padding=1, schedule=algorithm)          # vector stores


# ---------------------------------------------------------------- shapes and attributes

CASES = {
    "stride2": dict(x_shape=(2, 6, 13, 12), w_shape=(10, 6, 3, 3), stride=2, padding=1),
    "stride_hw": dict(x_shape=(1, 3, 15, 16), w_shape=(8, 3, 5, 3), stride=(2, 3), padding=(2, 1)),
    "dilation2": dict(x_shape=(1, 4, 14, 13), w_shape=(6, 4, 3, 3), dilation=2, padding=2),
    "groups2": dict(x_shape=(2, 8, 9, 9), w_shape=(6, 4, 3, 3), groups=2, padding=1, bias=True),
    "depthwise": dict(x_shape=(2, 12, 11, 10), w_shape=(12, 1, 3, 3), groups=12, padding=1, bias=True,
                      activation="relu"),
    "depthwise_x2": dict(x_shape=(1, 6, 9, 9), w_shape=(12, 1, 5, 5), groups=6, padding=2, stride=2),
    "kernel_1x7": dict(x_shape=(1, 5, 6, 17), w_shape=(4, 5, 1, 7), padding=(0, 3)),
    "no_padding": dict(x_shape=(3, 7, 8, 9), w_shape=(9, 7, 3, 3)),
    "one_pixel_out": dict(x_shape=(2, 3, 3, 3), w_shape=(5, 3, 3, 3)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algorithm", [None, "naive", "direct", "implicit_gemm"])
def test_shapes(emu, rng, case, algorithm):
    run_and_check(rng, schedule=algorithm, **CASES[case])


@pytest.mark.parametrize("case", ["stride2", "groups2", "depthwise"])
def test_fp16_shapes(emu, rng, case):
    run_and_check(rng, dtype="float16", **CASES[case])


def test_direct_split_channels(emu, rng):
    """Few output channels, many input channels: the direct kernel splits the channels (k100_6 style)."""
    run_and_check(rng, (1, 40, 6, 10), (3, 40, 3, 3), padding=1, bias=True, activation="leaky_relu",
                  schedule=direct_schedule(4, 16, 2, 4, 8, splits=3))


def test_naive_and_gemm_agree(emu, rng):
    """The naive kernel as a second reference: the same inputs through two unrelated kernels."""
    x = rng.standard_normal((2, 6, 7, 7)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    a = jitops.conv2d(x, w, padding=1, schedule="naive")
    b = jitops.conv2d(x, w, padding=1, schedule="implicit_gemm")
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


def test_batch_zero(emu):
    x = np.zeros((0, 3, 5, 5), np.float32)
    y = jitops.conv2d(x, np.ones((4, 3, 3, 3), np.float32), padding=1)
    assert y.shape == (0, 4, 5, 5)


# ---------------------------------------------------------------- cached Winograd filter transform

@pytest.mark.parametrize("algorithm", ["winograd_4x4", "implicit_gemm"])
def test_weight_change_is_retransformed(emu, rng, algorithm):
    """The transformed / packed filter is cached per weight; new weight contents are re-transformed."""
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    problem = op.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec(w.shape, "float32")},
                              {"padding": 1})
    tol = TOL[("float32", algorithm)]
    for _ in range(2):
        y = jitops.conv2d(x, w, padding=1, schedule=algorithm)
        assert rel_error(y, op.reference(problem, {"x": x, "w": w})["y"]) <= tol
    w[...] = rng.standard_normal(w.shape)             # same array, new contents
    y = jitops.conv2d(x, w, padding=1, schedule=algorithm)
    assert rel_error(y, op.reference(problem, {"x": x, "w": w})["y"]) <= tol
    w2 = rng.standard_normal(w.shape).astype(np.float32)
    y = jitops.conv2d(x, w2, padding=1, schedule=algorithm)
    assert rel_error(y, op.reference(problem, {"x": x, "w": w2})["y"]) <= tol


def test_winograd_method_is_exact_in_float64():
    """F(2x2) and F(4x4) in float64 match direct convolution to ~1e-15: any error is fp32 rounding."""
    from jitops.ops.conv2d_winograd import transform_reference
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 9, 10))
    w = rng.standard_normal((4, 3, 3, 3))
    problem = op.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec(w.shape, "float32")},
                              {"padding": (1, 0, 2, 1)})
    ref = op.reference(problem, {"x": x, "w": w})["y"]
    for m in (2, 4):
        assert np.abs(transform_reference(x, w, m, problem.pad) - ref).max() < 1e-12


# ---------------------------------------------------------------- errors

def _f32(*shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("call, argument, text", [
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 3, 3, 3)), "w", "in_channels / groups"),
    (lambda: jitops.conv2d(_f32(1, 6, 8, 8), _f32(8, 2, 3, 3), groups=4), "groups", "divisor of the input"),
    (lambda: jitops.conv2d(_f32(1, 8, 8, 8), _f32(6, 2, 3, 3), groups=4), "groups", "divisor of the output"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), groups=0), "groups", "positive int"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), padding=-1), "padding", "non-negative"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), padding=3), "padding", "at most"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), padding=(1, 2, 3)), "padding", "four ints"),
    (lambda: jitops.conv2d(_f32(1, 4, 2, 8), _f32(8, 4, 3, 3)), "x", "output would be 0x6"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), stride=0), "stride", ">= 1"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), dilation=(1, 2, 3)), "dilation", "pair"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), stride=1.5), "stride", "int"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), _f32(7)), "bias", "shape (8,)"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), activation="gelu"), "activation", "relu"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3, 3), activation="leaky_relu", alpha=float("nan")),
     "alpha", "finite"),
    (lambda: jitops.conv2d(_f32(4, 8, 8), _f32(8, 4, 3, 3)), "x", "rank 4"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 3)), "w", "rank 4"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), np.ones((8, 4, 3, 3), np.float16)), "w", "dtype"),
    (lambda: jitops.conv2d(_f32(1, 4, 8, 8), _f32(8, 4, 0, 3)), "w", "at least 1x1"),
])
def test_argument_errors(emu, call, argument, text):
    with pytest.raises(ArgumentError) as info:
        call()
    assert info.value.argument == argument
    assert text in str(info.value)


@pytest.mark.parametrize("kwargs, algorithm", [
    (dict(w_shape=(4, 3, 5, 5), padding=2), "winograd_4x4"),         # not 3x3
    (dict(w_shape=(4, 3, 3, 3), stride=2), "winograd_2x2"),          # not stride 1
    (dict(w_shape=(4, 3, 3, 3), padding=1), "gemm_1x1"),              # not 1x1
    (dict(w_shape=(4, 3, 3, 3)), "fft"),                               # unknown
])
def test_schedule_errors(emu, kwargs, algorithm):
    attrs = {k: v for k, v in kwargs.items() if k != "w_shape"}
    with pytest.raises(ScheduleError):
        jitops.conv2d(_f32(1, 3, 10, 10), _f32(*kwargs["w_shape"]), schedule=algorithm, **attrs)


def test_tensor_core_math_is_reserved(emu):
    s = Schedule.make("implicit_gemm", bm=64, bn=64, bk=8, tm=8, tn=8, split_k=1, math="mma")
    with pytest.raises(ScheduleError, match="not built yet"):
        jitops.conv2d(_f32(1, 3, 10, 10), _f32(4, 3, 3, 3), schedule=s)


# ---------------------------------------------------------------- scheduler

BENCH = {
    "small_1": ((1, 3, 64, 64), (16, 3, 3, 3), 1),
    "resnet_block": ((1, 64, 56, 56), (128, 64, 1, 1), 0),
    "large_spatial": ((4, 64, 256, 256), (128, 64, 3, 3), 1),
    "1x1_heavy_channels": ((1, 512, 16, 16), (512, 512, 1, 1), 0),
    "k100_4": ((2, 1920, 32, 32), (640, 1920, 3, 3), 1),
    "k100_6": ((2, 320, 64, 64), (4, 320, 3, 3), 1),
}


@pytest.mark.parametrize("target", ["sm_90", "gfx90a"])
def test_heuristic_explains_and_plans(target):
    from jitops.device import KNOWN_TARGETS
    device = KNOWN_TARGETS[target]
    for name, (xs, ws, pad) in BENCH.items():
        p = op.make_problem({"x": TensorSpec(xs, "float32"), "w": TensorSpec(ws, "float32")}, {"padding": pad})
        s = op.heuristic(p, device)
        assert f"{device.multiprocessors} multiprocessors" in s.why and "estimated" in s.why, name
        op.plan(p, s, device)
    depthwise = op.make_problem({"x": TensorSpec((1, 32, 112, 112), "float32"),
                                 "w": TensorSpec((32, 1, 3, 3), "float32")}, {"padding": 1, "groups": 32})
    # H100, 2026-11-26, the same layer at batch 8 in fp32: the depthwise kernel 9.0 us, direct 23.4, cuDNN 29.1
    assert op.heuristic(depthwise, KNOWN_TARGETS["sm_90"]).algorithm == "depthwise"


def test_heuristic_choices_on_sm90():
    """Shapes where the choice is not in doubt (measured on an H100, docs/conv2d.md)."""
    from jitops.device import KNOWN_TARGETS
    device = KNOWN_TARGETS["sm_90"]

    def pick(name):
        xs, ws, pad = BENCH[name]
        return op.heuristic(op.make_problem({"x": TensorSpec(xs, "float32"), "w": TensorSpec(ws, "float32")},
                                            {"padding": pad}), device)
    assert pick("large_spatial").algorithm == "winograd_4x4"
    assert pick("k100_4").algorithm == "winograd_4x4"
    assert pick("resnet_block").algorithm in ("gemm_1x1", "split_k")


def test_compile_command_for_gpu_targets(capsys):
    from jitops.cli import main
    assert main(["compile", "conv2d", "x=1x64x56x56", "w=128x64x3x3", "padding=1", "--target", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "[sm_90] cuda backend" in out and "why" in out and "estimated" in out


def test_parse_problem():
    p = op.parse_problem({"x": "2x8x9x9", "w": "6x4x3x3", "groups": "2", "padding": "1,0,2,1", "stride": "2",
                          "bias": "1", "activation": "relu", "dtype": "float16"})
    assert (p.groups, p.pad, p.stride, p.has_bias, p.activation, p.dtype) == \
        (2, (1, 0, 2, 1), (2, 2), True, "relu", "float16")
    with pytest.raises(ArgumentError):
        op.parse_problem({"x": "1x3x8x8", "w": "4x3x3x3", "kernel": "3"})
