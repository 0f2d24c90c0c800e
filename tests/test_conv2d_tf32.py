"""fp32 conv2d on the matrix cores (precision "tf32" / "3xtf32") and the precision policy, on the
emulator (warp 32: mma.sync m16n8k8 layouts, warp 64: MFMA's; software TF32 rounding as cvt.rna)
against a float64 reference, NaN-poisoned outputs.

Tolerances (conv2d.tolerance) and why:
- tf32: both operands rounded to 11 significant bits (2^-11 relative each), about 2^-10 per
  product, averaging down over K: 4e-3 (measured here 1e-4 .. 4e-4). The test also asks for an
  error above 1e-5, so a kernel that silently skipped the rounding would fail.
- 3xtf32: big + small TF32 parts keep about 21 bits of each operand: twice the fp32 allowance
  (at least 2e-5; measured here a few 1e-7).
"""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.ops.conv2d_mma import mma_schedule

from test_conv2d_mma import run

op = get_op("conv2d")
SMALL = mma_schedule(32, 32, 16, 1, 1, 2)             # one warp, BK 16 floats: two k8 steps per stage
TF32_TOL, TF32_FLOOR, X3_TOL = 4e-3, 1e-5, 2e-5

CASES = {   # (x, w, attrs, layout): C not a multiple of 8, odd H/W, stride 2, dilation, groups
    "c5_s2_leaky": ((2, 5, 7, 9), (12, 5, 3, 3), {"padding": 1, "stride": 2, "activation": "leaky_relu"}, "nhwc"),
    "dil_groups": ((1, 16, 9, 8), (16, 8, 3, 3), {"padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2}, None),
    "1x1_relu": ((1, 24, 5, 7), (20, 24, 1, 1), {"activation": "relu"}, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
def test_tf32_numerics(mma_emu, rng, case, precision):
    x, w, attrs, layout = CASES[case]
    err = run(rng, x, w, {**attrs, "precision": precision}, "float32", SMALL, residual=True, layout=layout)
    if precision == "tf32":
        assert TF32_FLOOR < err <= TF32_TOL, f"{case}: {err:.3e}"
    else:
        assert err <= X3_TOL, f"{case}: {err:.3e}"


@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
def test_tf32_split_k_and_warps(mma_emu, rng, precision):
    """fp32 partials of a split K (NHWC, uneven last split), and 2 x 2 warps with BK 32 (four k8
    steps per stage, the fragment double buffer across tiles)."""
    tol = TF32_TOL if precision == "tf32" else X3_TOL
    err = run(rng, (1, 24, 5, 5), (16, 24, 3, 3), {"padding": 1, "activation": "relu", "precision": precision},
              "float32", mma_schedule(32, 32, 16, 1, 1, 3, split_k=3), residual=True, layout="nhwc")
    assert err <= tol
    err = run(rng, (1, 40, 6, 6), (24, 40, 3, 3), {"padding": 1, "precision": precision}, "float32",
              mma_schedule(64, 64, 32, 2, 2, 3), bias=False)
    assert err <= tol


def test_tf32_rounds_to_nearest_away(mma_emu):
    """1 + 2^-11 lies halfway between two TF32 values: cvt.rna (and the emulator) round it away
    from zero to 1 + 2^-10 (nearest-even would give 1); 3xtf32 keeps it exactly."""
    x = np.zeros((1, 8, 2, 2), np.float32)
    x[0, 0] = [[1 + 2.0 ** -11, -(1 + 2.0 ** -11)], [1.0, 3.0]]
    w = np.zeros((8, 8, 1, 1), np.float32)
    w[:, 0] = 1.0
    y = jitops.conv2d(x, w, precision="tf32", schedule=SMALL)
    np.testing.assert_array_equal(y[0, 0], [[1 + 2.0 ** -10, -(1 + 2.0 ** -10)], [1.0, 3.0]])
    y = jitops.conv2d(x, w, precision="3xtf32", schedule=SMALL)
    np.testing.assert_array_equal(y[0, :], np.broadcast_to(x[0, 0], (8, 2, 2)))


def test_fp32_precision_default(mma_emu, rng):
    """set_fp32_precision changes what a call without `precision` runs (the repeat path too);
    "highest" is the default and keeps the exact kernels."""
    assert jitops.get_fp32_precision() == "highest"
    p = op.make_problem({"x": TensorSpec((1, 16, 6, 6), "float32"), "w": TensorSpec((16, 16, 3, 3), "float32")},
                        {"padding": 1})
    data = op.random_inputs(p, rng)
    ref = op.reference(p, {k: v.astype(np.float64) for k, v in data.items()})["y"]

    def err() -> float:
        y = jitops.conv2d(data["x"], data["w"], padding=1)
        return float(np.abs(y - ref).max() / np.abs(ref).max())

    assert err() <= 1e-5
    try:
        jitops.set_fp32_precision("tf32")
        assert TF32_FLOOR < err() <= TF32_TOL and TF32_FLOOR < err() <= TF32_TOL
        jitops.set_fp32_precision("3xtf32")
        assert err() <= X3_TOL
    finally:
        jitops.set_fp32_precision("highest")
    assert err() <= 1e-5


def test_precision_errors_and_choice(emu):
    x = np.ones((1, 8, 4, 4), np.float32)
    w = np.ones((8, 8, 3, 3), np.float32)
    with pytest.raises(ArgumentError, match="precision"):
        jitops.conv2d(x, w, precision="fp16")
    with pytest.raises(ArgumentError, match="mode"):
        jitops.set_fp32_precision("medium")
    # The public emulator has no matrix cores: tf32 falls back to the exact kernels (a permission).
    y = jitops.conv2d(x, w, precision="tf32")
    np.testing.assert_allclose(y, 72.0, rtol=1e-6)
    with pytest.raises(ScheduleError):
        jitops.conv2d(x, w, precision="tf32", schedule=SMALL)
    dev = jitops.get_backend(target="sm_90").device

    def pick(precision: str, dtype: str = "float32", w=(512, 256, 1, 1), padding=0):
        p = op.make_problem({"x": TensorSpec((8, 256, 56, 56), dtype, "nhwc"), "w": TensorSpec(w, dtype)},
                            {"padding": padding, "precision": precision})
        return p, op.heuristic(p, dev)

    # A permission, not an order: the cost model takes the matrix cores where they are faster and
    # keeps Winograd where it is (measured on an H100: docs/conv2d.md). On sm_90 TF32 runs on
    # wgmma (2.4x mma.sync's speed, 29 problems), fast enough to pass Winograd on a large 3x3;
    # 3xtf32 (mma.sync only) does not.
    assert pick("highest")[1].algorithm not in ("implicit_gemm_mma", "implicit_gemm_wgmma")
    assert pick("tf32")[1].algorithm == "implicit_gemm_wgmma"
    assert pick("tf32", w=(256, 256, 3, 3), padding=1)[1].algorithm == "implicit_gemm_wgmma"
    assert pick("3xtf32", w=(256, 256, 3, 3), padding=1)[1].algorithm == "winograd_4x4"
    for precision in ("tf32", "3xtf32"):
        p, s = pick(precision)
        assert precision in p.key() and any(c.algorithm == "implicit_gemm_mma" for c in op.candidates(p, dev))
    assert pick("tf32", "float16")[0].precision == "highest"      # 16-bit inputs: no fp32 policy
    p = pick("3xtf32")[0]
    with pytest.raises(ScheduleError, match="registers"):
        op.plan(p, mma_schedule(128, 128, 32, 2, 2, 3), dev)       # 64x64 warp tiles


def test_few_channel_pointwise_offers_no_window_rows_and_its_wgmma_candidates_compile():
    """A 1x1 over at most 4 channels in TF32 passed the window-rows rule, and wgmma.hip.j2 cannot read a
    pointwise problem's K as window rows: three such candidates failed to compile (NVRTC: identifier
    "c" is undefined), found by scripts/fuzz_ops.py --candidates on the H200, 2026-11-29."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops import engine
    backend = jitops.get_backend(target="sm_90")
    p = op.make_problem({"x": TensorSpec((2, 4, 64, 13), "float32"), "w": TensorSpec((17, 4, 1, 1), "float32"),
                         "bias": None, "residual": None}, {"precision": "tf32", "activation": "relu"})
    cands = [s for s in op.candidates(p, backend.device) if s.algorithm == "implicit_gemm_wgmma"]
    assert cands and not [s for s in cands if s.get("window_rows", 0)]
    for s in cands[:6]:
        engine.compile_problem("conv2d", p, backend, s)
    stem = op.make_problem({"x": TensorSpec((2, 4, 64, 13), "float32"), "w": TensorSpec((17, 4, 3, 3), "float32"),
                            "bias": None, "residual": None}, {"precision": "tf32", "padding": 1})
    assert [s for s in op.candidates(stem, backend.device) if s.get("window_rows", 0)]   # still offered with a window
