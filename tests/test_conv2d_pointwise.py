"""The few-channel 1x1 stream (pointwise_mma): numerics on the emulator's software fragments at warp 32
(mma.sync layouts) and warp 64 (MFMA layouts), the persistent walk over pixel tiles, the paired and
the scalar stores, and the cases it refuses."""
from __future__ import annotations

import pytest

from jitops.device import KNOWN_TARGETS
from jitops.errors import ScheduleError
from jitops.ops import conv2d_pointwise as pointwise
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

from test_conv2d_mma import TOL
from test_conv2d_mma import run as run_conv2d

op = get_op("conv2d")


def run(rng, x_shape, cout, dtype, schedule, *, bias=True, residual=False, attrs=None, layout="nhwc"):
    """One 1x1 call (NHWC, or NCHW with layout None) into a NaN-poisoned output, through test_conv2d_mma's
    helper; the error against float64."""
    return run_conv2d(rng, x_shape, (cout, x_shape[1], 1, 1), attrs or {}, dtype, schedule, bias=bias,
                      residual=residual, layout=layout)


# (x shape, Cout, schedule, residual, attrs): 16 -> 16 over more tiles than blocks (each block walks 3-4,
# the ring wraps); K padded 24 -> 32 and N 20 -> 32; K = 64 over four k steps, N = 40 (3 column fragments)
# per warp; Cout odd (scalar stores), leaky_relu; 4 row fragments per warp on one block per SM; partial last tiles.
CASES = {
    "walk_16_16": ((2, 16, 15, 23), 16, pointwise.schedule(1, 3, 2), True, {"activation": "relu"}),
    "one_per_sm": ((1, 32, 8, 9), 24, pointwise.schedule(4, 2, 1), True, {}),
    "pad_24_20": ((1, 24, 9, 7), 20, pointwise.schedule(2, 2, 2), True, {}),
    "k64_n40": ((1, 64, 6, 11), 40, pointwise.schedule(2, 2, 2), False, {"activation": "relu"}),
    "odd_cout": ((1, 40, 5, 7), 21, pointwise.schedule(2, 3, 1), True, {"activation": "leaky_relu", "alpha": 0.1}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pointwise_numerics(mma_emu, rng, case, dtype):
    x, cout, sched, residual, attrs = CASES[case]
    err = run(rng, x, cout, dtype, sched, residual=residual, attrs=attrs)
    assert err <= TOL[dtype], f"{case} {dtype}: {err:.3e}"


# NCHW (H * W a multiple of 8): tiles crossing images (H * W = 40 over 64-pixel tiles), walks, K padded
# 24 -> 32, Cout odd (8-pixel stores of one channel still whole), K = 64 over four k steps.
NCHW_CASES = {
    "walk_cross_images": ((5, 16, 5, 8), 16, pointwise.schedule(1, 3, 2), True, {"activation": "relu"}),
    "pad_24_21": ((2, 24, 4, 6), 21, pointwise.schedule(2, 2, 1), True, {"activation": "leaky_relu", "alpha": 0.1}),
    "k64_n40": ((1, 64, 8, 9), 40, pointwise.schedule(2, 2, 1), False, {}),
}


@pytest.mark.parametrize("case", sorted(NCHW_CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pointwise_nchw_numerics(mma_emu, rng, case, dtype):
    x, cout, sched, residual, attrs = NCHW_CASES[case]
    err = run(rng, x, cout, dtype, sched, residual=residual, attrs=attrs, layout=None)
    assert err <= TOL[dtype], f"{case} {dtype}: {err:.3e}"


def test_pointwise_walks_tiles(mma_emu):
    """The grid is persistent: fewer blocks than tiles where the pixels outnumber per_sm x SMs tiles."""
    p = op.make_problem({"x": TensorSpec((2, 16, 15, 23), "float16", "nhwc"),
                         "w": TensorSpec((16, 16, 1, 1), "float16"), "bias": None}, {})
    s = pointwise.schedule(1, 3, 2)
    tiles, blocks = pointwise.grid_blocks(p, s, mma_emu.device)
    assert tiles == -(-690 // 64) and blocks == 2 * mma_emu.device.multiprocessors < tiles
    (launch,) = op.plan(p, s, mma_emu.device).launches
    assert launch.grid[0] == blocks


def test_pointwise_refusals():
    h200 = KNOWN_TARGETS["sm_90"]

    def problem(x, w, layout="nhwc", dtype="float16", **attrs):
        return op.make_problem({"x": TensorSpec(x, dtype, layout), "w": TensorSpec(w, dtype), "bias": None}, attrs)

    ok = problem((1, 16, 8, 8), (16, 16, 1, 1))
    assert pointwise.why_not(ok) is None and pointwise.candidates(ok, h200)
    assert pointwise.why_not(problem((1, 16, 8, 8), (16, 16, 1, 1), layout="")) is None      # NCHW, 64 pixels
    for bad, match in ((problem((1, 16, 5, 7), (16, 16, 1, 1), layout=""), "multiple of 8"),
                       (problem((1, 12, 8, 8), (16, 12, 1, 1)), "multiple of 8"),
                       (problem((1, 16, 8, 8), (16, 16, 3, 3), padding=1), "1x1"),
                       (problem((1, 16, 8, 8), (16, 16, 1, 1), stride=2), "stride 1"),
                       (problem((1, 16, 8, 8), (144, 16, 1, 1)), "at most"),
                       (problem((1, 16, 8, 8), (16, 16, 1, 1), dtype="float32"), "float16")):
        assert match in pointwise.why_not(bad)
        assert pointwise.candidates(bad, h200) == []
        with pytest.raises(ScheduleError, match="pointwise_mma"):
            op.plan(bad, pointwise.schedule(2, 3, 4), h200)
    with pytest.raises(ScheduleError, match="accumulator"):          # 4 x 16 rows by 128 columns per warp
        op.plan(problem((1, 16, 8, 8), (128, 16, 1, 1)), pointwise.schedule(4, 3, 2), h200)
    with pytest.raises(ScheduleError, match="must be in"):
        op.plan(ok, pointwise.schedule(3, 3, 2), h200)


def test_pointwise_heuristic_rule():
    """The heuristic rates the stream on sm_90 only, from MIN_RATED_PIXELS pixels and up to MAX_RATED_MACS
    padded multiply-adds per pixel, with its first fitting schedule of HEURISTIC_ORDER; the tuner's
    candidates are the whole space everywhere."""
    import dataclasses
    h200 = dataclasses.replace(KNOWN_TARGETS["sm_90"], name="NVIDIA H200")
    a100 = KNOWN_TARGETS["sm_80"]

    def problem(n, cin, hw, cout):
        return op.make_problem({"x": TensorSpec((n, cin, hw, hw), "float16", "nhwc"),
                                "w": TensorSpec((cout, cin, 1, 1), "float16"), "bias": None}, {})

    mobilenet = problem(32, 16, 112, 16)                 # H200, 12:33: 9.4 us against 31.4 (cuDNN 12.6)
    pick = op.heuristic(mobilenet, h200)
    assert pick == pointwise.schedule(2, 4, 2) and "estimated" in pick.why
    assert pointwise.ALGORITHM in op.heuristic(problem(32, 144, 56, 24), h200).algorithm     # K x N = 4608
    for p in (problem(32, 64, 56, 64 + 16),              # 64 x 80 padded multiply-adds per pixel
              problem(1, 16, 112, 16),                   # 12544 pixels
              problem(32, 256, 56, 64)):                 # ResNet-50's 256 -> 64: the tiled GEMMs
        assert op.heuristic(p, h200).algorithm != pointwise.ALGORITHM, p.describe()
    nchw = op.make_problem({"x": TensorSpec((32, 32, 112, 112), "float16"), "w": TensorSpec((16, 32, 1, 1), "float16"),
                            "bias": None}, {})
    assert op.heuristic(nchw, h200).algorithm == pointwise.ALGORITHM           # EfficientNet's 32 -> 16 in NCHW
    assert pointwise.estimate(nchw, pick, h200, 4.2e12, 2e-6) > pointwise.estimate(
        op.make_problem({"x": TensorSpec((32, 32, 112, 112), "float16", "nhwc"), "w": TensorSpec((16, 32, 1, 1), "float16"),
                         "bias": None}, {}), pick, h200, 4.2e12, 2e-6)           # NCHW's own, slower constants
    assert op.heuristic(mobilenet, a100).algorithm != pointwise.ALGORITHM       # not measured off sm_90
    assert pointwise.candidates(mobilenet, a100)                                # the tuner still times it
    assert op.heuristic(mobilenet, a100, pointwise.ALGORITHM).algorithm == pointwise.ALGORITHM
    assert op.heuristic(problem(1, 16, 112, 16), h200, pointwise.ALGORITHM).algorithm == pointwise.ALGORITHM
