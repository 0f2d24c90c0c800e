"""The few-pixel 1x1 kernel (gemv_1x1, squeeze-and-excitation layers): numerics on the emulator at warp 32
and 64 against float64 (every vector width, rows and channels past a block's tile, Cin split over more warps
than it has vectors, bias / residual / activation, fp32 / fp16 / bf16), where the heuristic takes it, and
the cases it refuses."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.device import KNOWN_TARGETS
from jitops.errors import ScheduleError
from jitops.ops import conv2d_gemv as gemv
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

from test_conv2d_mma import TOL
from test_conv2d_mma import run as run_conv2d

op = get_op("conv2d")

# (x shape, Cout, layout, schedule, residual, attrs): SE reduce / expand at batch 5 (NCHW at 1 x 1); Cin 20
# (4-channel vectors in fp16 and fp32, over 8 warps: some get none); Cin 34 (2-channel vectors) into 3
# channels; the 49 pixels of a 7 x 7 NHWC layer over two row tiles at warp 32; Cin 9 (scalar loads), Cout
# past the last block's 16; one channel per block on 16 warps (Cin 296); 34 pixels (two row tiles at warp 32).
CASES = {
    "se_reduce": ((5, 72, 1, 1), 24, None, gemv.schedule(8, 8), False, {"activation": "relu"}),
    "se_expand": ((5, 20, 1, 1), 72, None, gemv.schedule(4, 8), True, {}),
    "vec2_n3": ((3, 34, 1, 1), 3, None, gemv.schedule(4, 4), False, {"activation": "leaky_relu", "alpha": 0.1}),
    "nhwc_7x7": ((1, 64, 7, 7), 40, "nhwc", gemv.schedule(16, 4), True, {"activation": "relu"}),
    "scalar_k9": ((2, 9, 1, 1), 21, "nhwc", gemv.schedule(16, 8), True, {}),
    "long_k_tn1": ((3, 296, 1, 1), 5, None, gemv.schedule(1, 16), True, {"activation": "relu"}),
    "tn2_w16": ((34, 64, 1, 1), 9, None, gemv.schedule(2, 16), False, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gemv_numerics(emu, rng, case, dtype):
    x, cout, layout, sched, residual, attrs = CASES[case]
    err = run_conv2d(rng, x, (cout, x[1], 1, 1), attrs, dtype, sched, residual=residual, layout=layout)
    assert err <= TOL[dtype], f"{case} {dtype}: {err:.3e}"


def test_gemv_no_bias_and_the_vector_width():
    """Without a bias; Cin picks the widest vector that divides it within 16 bytes."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 48, 1, 1)).astype(np.float16)
    w = rng.standard_normal((10, 48, 1, 1)).astype(np.float16)
    y = jitops.conv2d(x, w, schedule=gemv.schedule(8, 4))
    ref = np.einsum("nc,oc->no", x[:, :, 0, 0].astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    assert np.abs(y[:, :, 0, 0] - ref).max() <= 2e-3 * np.abs(ref).max()

    def vec(cin, dtype):
        p = op.make_problem({"x": TensorSpec((2, cin, 1, 1), dtype), "w": TensorSpec((8, cin, 1, 1), dtype),
                             "bias": None, "residual": None}, {})
        return gemv.vector(p)
    assert (vec(48, "float16"), vec(20, "float16"), vec(34, "float16"), vec(9, "float16")) == (8, 4, 2, 1)
    assert (vec(48, "float32"), vec(6, "float32")) == (4, 2)


def _problem(x, cout, dtype="float16", layout=None, **attrs):
    xs = TensorSpec(x, dtype, layout) if layout else TensorSpec(x, dtype)
    return op.make_problem({"x": xs, "w": TensorSpec((cout, x[1], 1, 1), dtype), "bias": TensorSpec((cout,), dtype),
                            "residual": None}, attrs)


def test_heuristic_takes_gemv_for_few_pixels_on_sm90():
    """sm_90: squeeze-and-excitation convolutions at batch 1-64 (1 x 1 pixels, NCHW or channels_last alike)
    take gemv_1x1 with shape_rule's tiles (long dot products: more warps and fewer channels per block); more pixels, layers of a few
    pixels beyond 1 x 1 (ResNet-50 b1 at 7 x 7: the weights read per row tile), 3x3 kernels, strides and
    groups do not. Off sm_90 (not measured) the heuristic keeps its other kernels; the tuner has the
    candidates everywhere."""
    h100 = KNOWN_TARGETS["sm_90"]
    for x, cout, layout, tn, warps in (((32, 72, 1, 1), 24, None, 1, 8), ((32, 20, 1, 1), 480, None, 4, 4),
                                       ((1, 1152, 1, 1), 48, None, 1, 16), ((64, 240, 1, 1), 960, "nhwc", 4, 8),
                                       ((32, 960, 1, 1), 240, None, 2, 16), ((8, 336, 1, 1), 84, None, 2, 16)):
        s = op.heuristic(_problem(x, cout, layout=layout), h100)
        assert s.algorithm == gemv.ALGORITHM and (s["tn"], s["warps"]) == (tn, warps), (x, cout, s)
        assert "pixels" in s.why
    for x, w, layout, attrs in (((65, 72, 1, 1), (24, 72, 1, 1), None, {}), ((1, 512, 7, 7), (2048, 512, 1, 1), None, {}),
                                ((1, 512, 7, 7), (2048, 512, 1, 1), "nhwc", {}), ((2, 64, 4, 4), (32, 64, 1, 1), "nhwc", {}),
                                ((1, 64, 3, 3), (24, 64, 3, 3), "nhwc", {"padding": 1}),
                                ((1, 64, 4, 4), (64, 64, 1, 1), "nhwc", {"stride": 2}),
                                ((32, 72, 1, 1), (24, 36, 1, 1), None, {"groups": 2})):
        p = op.make_problem({"x": TensorSpec(x, "float16", layout) if layout else TensorSpec(x, "float16"),
                             "w": TensorSpec(w, "float16"), "bias": None, "residual": None}, attrs)
        assert op.heuristic(p, h100).algorithm != gemv.ALGORITHM, (x, attrs)
    for target in ("sm_80", "gfx90a"):
        p = _problem((32, 72, 1, 1), 24)
        assert op.heuristic(p, KNOWN_TARGETS[target]).algorithm != gemv.ALGORITHM
        assert any(c.algorithm == gemv.ALGORITHM for c in op.candidates(p, KNOWN_TARGETS[target]))
        assert op.heuristic(p, KNOWN_TARGETS[target], gemv.ALGORITHM).algorithm == gemv.ALGORITHM


def test_gemv_refuses_what_it_cannot_run():
    h100 = KNOWN_TARGETS["sm_90"]
    with pytest.raises(ScheduleError, match="NCHW at 7 x 7"):
        op.plan(_problem((1, 512, 7, 7), 64), gemv.schedule(8, 8), h100)
    with pytest.raises(ScheduleError, match="at most 256 pixels"):
        op.plan(_problem((300, 8, 1, 1), 8), gemv.schedule(8, 8), h100)
    with pytest.raises(ScheduleError, match="tn=5"):
        op.plan(_problem((2, 8, 1, 1), 8), gemv.schedule(5, 8), h100)
    with pytest.raises(ScheduleError, match="does not apply"):
        op.heuristic(_problem((300, 8, 1, 1), 8), h100, gemv.ALGORITHM)
    # wave64 (gfx90a): TN 16 on 16 warps would need 69632 bytes of static shared memory; not a candidate there
    mi = KNOWN_TARGETS["gfx90a"]
    with pytest.raises(ScheduleError, match="69632 bytes"):
        op.plan(_problem((2, 8, 1, 1), 8), gemv.schedule(16, 16), mi)
    assert len(gemv.candidates(_problem((2, 8, 1, 1), 8), mi)) == len(gemv.TNS) * len(gemv.WARPS) - 1
    assert len(gemv.candidates(_problem((2, 8, 1, 1), 8), h100)) == len(gemv.TNS) * len(gemv.WARPS)
