"""conv2d on the matrix cores, NHWC, bf16 and the residual input, on the emulator (warp 32: NVIDIA's
mma.sync fragment layouts, warp 64: MFMA's; checked mode) against a float64 reference.

Outputs are NaN-poisoned; errors are max |y - ref| / max |ref|. Tolerances and why:
- fp16: inputs exact in fp16, products exact in fp32, fp32 accumulation, one rounding of the
  output to fp16 (2^-11 of a value): 2e-3 (measured here 2e-4 .. 4e-4).
- bf16: the same with 8 significant bits (2^-9): 1e-2 (measured 2e-3 .. 3e-3).
- fp32 (depthwise NHWC, the NCHW kernels behind transposes): K-term fp32 sums: 1e-5.
- SIMT kernels with a residual round y once before the residual pass: still inside those bounds.
The shapes are tiny: the emulator runs the matrix fragments in software.
"""
from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.ops import conv2d_depthwise
from jitops.ops.conv2d_mma import mma_schedule
from jitops.ops.conv2d_schedules import direct_schedule, gemm_schedule

from conftest import rel_error

op = get_op("conv2d")
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
SMALL = mma_schedule(32, 32, 32, 1, 1, 2)            # one warp per block: fastest on the emulator


def nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def run(rng, x_shape, w_shape, attrs, dtype, schedule, *, bias=True, residual=False, layout=None):
    """One call into a NaN-poisoned output; returns the error against float64."""
    spec = {"x": TensorSpec(x_shape, "float32"), "w": TensorSpec(w_shape, "float32"),
            "bias": TensorSpec((w_shape[0],), "float32") if bias else None}
    p = op.make_problem(spec, attrs)
    if residual:
        spec["residual"] = p.outputs()["y"]
        p = op.make_problem(spec, attrs)
    data = {k: v.astype(NP[dtype]) for k, v in op.random_inputs(p, rng).items()}
    ref = op.reference(p, {k: v.astype(np.float64) for k, v in data.items()})["y"]
    x, r = data["x"], data.get("residual")
    if layout == "nhwc":
        x, r = nhwc(x), (nhwc(r) if r is not None else None)
    out = np.full(nhwc(ref).shape if layout == "nhwc" else ref.shape, np.nan, NP[dtype])
    y = jitops.conv2d(x, data["w"], data.get("bias"), residual=r, layout=layout, out=out, schedule=schedule, **attrs)
    assert y is out
    got = y.astype(np.float64)
    if layout == "nhwc":
        got = got.transpose(0, 3, 1, 2)
    assert not np.isnan(got).any(), "output elements left unwritten"
    return rel_error(got, ref)


# (x, w, attrs): C not a multiple of 8, odd H/W, stride 2, dilation, groups, asymmetric padding.
CASES = {
    "c5_s2_relu": ((2, 5, 7, 9), (12, 5, 3, 3), {"padding": 1, "stride": 2, "activation": "relu"}),
    "1x1_leaky": ((1, 16, 5, 7), (20, 16, 1, 1), {"activation": "leaky_relu", "alpha": 0.2}),
    "dil_groups": ((1, 16, 9, 8), (16, 8, 3, 3), {"padding": (1, 0, 2, 1), "stride": 2, "dilation": (1, 2),
                                                  "groups": 2}),
    "5x5_c3": ((1, 3, 8, 7), (8, 3, 5, 5), {"padding": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_numerics(mma_emu, rng, case, dtype):
    x, w, attrs = CASES[case]
    layout = "nhwc" if case in ("c5_s2_relu", "dil_groups") else None
    err = run(rng, x, w, attrs, dtype, SMALL, residual=case != "5x5_c3", layout=layout)
    assert err <= TOL[dtype], f"{case} {dtype}: {err:.3e}"


@pytest.mark.parametrize("layout", [None, "nhwc"])
def test_mma_split_k_with_residual(mma_emu, rng, layout):
    """K split over blocks (uneven last split); the reduction adds bias, residual and activation."""
    for cout in (10, 16):       # 16: 8-channel vector partials and stores
        err = run(rng, (1, 24, 5, 5), (cout, 24, 3, 3), {"padding": 1, "activation": "relu"}, "float16",
                  mma_schedule(32, 32, 32, 1, 1, 3, split_k=3), residual=True, layout=layout)
        assert err <= TOL["float16"]


def test_mma_multi_warp_tile(mma_emu, rng):
    """2 x 2 warps, BK 64: several k16 steps per stage and the fragment double buffer across tiles."""
    err = run(rng, (1, 40, 6, 6), (24, 40, 3, 3), {"padding": 1}, "float16", mma_schedule(64, 64, 64, 2, 2, 3),
              layout="nhwc")
    assert err <= TOL["float16"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_reads_nchw_in_place(mma_emu, rng, dtype):
    """a_nchw: a 1x1 on an NCHW input read in place (8- or 4-pixel chunks, fragments loaded transposed):
    no NHWC copy in the plan; tiles spanning two images, K past the channels (20 of 32), split-K
    with a residual, the 2x2-warp tile with BK 64."""
    spec = {"x": TensorSpec((3, 20, 4, 6), dtype), "w": TensorSpec((24, 20, 1, 1), dtype), "bias": None}
    launches = op.plan(op.make_problem(spec, {}), mma_schedule(32, 32, 32, 1, 1, 2, a_nchw=True),
                       mma_emu.device).launches
    assert [lc.kernel for lc in launches] == ["conv2d_implicit_gemm_mma"]
    for sched, residual in ((mma_schedule(32, 32, 32, 1, 1, 2, a_nchw=True), True),
                            (mma_schedule(64, 64, 64, 2, 2, 3, a_nchw=True), False),
                            (mma_schedule(32, 32, 32, 1, 1, 3, split_k=2, a_nchw=True), True)):
        err = run(rng, (3, 20, 4, 6), (24, 20, 1, 1), {"activation": "relu"}, dtype, sched, residual=residual)
        assert err <= TOL[dtype], (sched, err)
        # H * W = 12: 4-pixel (8-byte) chunks
        err = run(rng, (3, 20, 2, 6), (24, 20, 1, 1), {"activation": "relu"}, dtype, sched, residual=residual)
        assert err <= TOL[dtype], (sched, "4-pixel chunks", err)
    with pytest.raises(ScheduleError, match="in place"):       # H * W = 35: chunks would straddle images
        op.plan(op.make_problem({"x": TensorSpec((1, 16, 5, 7), dtype), "w": TensorSpec((8, 16, 1, 1), dtype),
                                 "bias": None}, {}), mma_schedule(32, 32, 32, 1, 1, 2, a_nchw=True), mma_emu.device)


# Depthwise: (x, w, attrs, layout, (rows, columns) per thread, residual). Output tiles past the edges
# (OW = 11 over 4 columns, 3 rows over 2), whole rows stored as vectors (NCHW, OW = 8 over 4), stride 2,
# dilation, asymmetric padding, 7x7, 6 channels (NHWC: 2-wide vectors), both layouts.
DW_CASES = {
    "nhwc_s2_residual": ((2, 16, 7, 6), (16, 1, 3, 3), {"padding": 1, "stride": 2, "groups": 16, "activation": "relu"},
                         "nhwc", (2, 2), True),
    "nhwc_dilated_vec2": ((1, 6, 9, 9), (6, 1, 5, 5), {"padding": (2, 1, 2, 3), "dilation": (1, 2), "groups": 6},
                          "nhwc", (1, 4), False),
    "nchw_tails": ((2, 5, 9, 11), (5, 1, 3, 3), {"padding": 1, "groups": 5, "activation": "leaky_relu", "alpha": 0.1},
                   None, (2, 4), True),
    "nchw_row_vectors": ((2, 5, 7, 8), (5, 1, 3, 3), {"padding": 1, "groups": 5, "activation": "relu"}, None, (2, 4),
                         True),
    "nchw_7x7": ((1, 4, 10, 9), (4, 1, 7, 7), {"padding": 3, "groups": 4}, None, (4, 4), False),
    "nchw_5x5_s2": ((1, 3, 13, 12), (3, 1, 5, 5), {"padding": (2, 1, 2, 2), "stride": 2, "groups": 3}, None, (2, 2),
                    False),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(DW_CASES))
def test_depthwise(emu, rng, case, dtype):
    """The depthwise kernel in place on NCHW and NHWC: every output of a thread's tile, the taps
    falling off each edge, bias, residual and activations, against float64."""
    if dtype != "float16" and case not in ("nhwc_s2_residual", "nchw_tails", "nchw_row_vectors"):
        pytest.skip("one dtype for the geometry-only cases (CI time)")
    x, w, attrs, layout, (rows, cols), residual = DW_CASES[case]
    err = run(rng, x, w, attrs, dtype, conv2d_depthwise.schedule(rows, cols, 128), residual=residual,
              bias=case != "nhwc_dilated_vec2", layout=layout)
    assert err <= TOL[dtype], f"{case} {dtype}: {err:.3e}"


def test_depthwise_tiles_and_rule():
    """Every candidate tile plans; tiles whose input columns exceed the kernel's span limit are refused
    with a reason, and the rule never offers one."""
    dev = jitops.get_backend(target="sm_90").device
    for layout in ("", "nhwc"):
        for xs, ws, attrs in (((8, 96, 112, 112), (96, 1, 3, 3), {"padding": 1, "groups": 96}),
                              ((8, 672, 14, 14), (672, 1, 5, 5), {"padding": 2, "stride": 2, "groups": 672}),
                              ((8, 768, 7, 7), (768, 1, 7, 7), {"padding": 3, "groups": 768})):
            p = op.make_problem({"x": TensorSpec(xs, "float16", layout), "w": TensorSpec(ws, "float16"),
                                 "bias": None}, attrs)
            for s in conv2d_depthwise.candidates(p) + [conv2d_depthwise.heuristic(p)]:
                op.plan(p, s, dev)
    p = op.make_problem({"x": TensorSpec((1, 8, 32, 32), "float16"), "w": TensorSpec((8, 1, 7, 7), "float16"),
                         "bias": None}, {"padding": 3, "stride": 2, "groups": 8})
    with pytest.raises(ScheduleError, match="input columns"):
        op.plan(p, conv2d_depthwise.schedule(1, 8), dev)       # 7 * 2 + 7 = 21 columns


@pytest.mark.parametrize("schedule", [gemm_schedule("implicit_gemm", (32, 64, 8, 4, 4)),
                                      direct_schedule(4, 16, 1, 4, 4, splits=2)], ids=["gemm", "direct_split"])
@pytest.mark.parametrize("layout", [None, "nhwc"])
def test_simt_residual_and_nhwc(emu, rng, schedule, layout):
    """The NCHW kernels: residual in a pass of its own, NHWC through transposes; fp32 and bf16."""
    for dtype in ("float32", "bfloat16"):
        err = run(rng, (2, 6, 7, 5), (8, 6, 3, 3), {"padding": 1, "activation": "leaky_relu"}, dtype, schedule,
                  residual=True, layout=layout)
        assert err <= TOL[dtype], f"{schedule} {layout} {dtype}: {err:.3e}"


def test_public_emulator_refuses_mma(emu):
    x = np.ones((1, 8, 4, 4), np.float16)
    w = np.ones((8, 8, 1, 1), np.float16)
    with pytest.raises(ScheduleError):
        jitops.conv2d(x, w, schedule=SMALL)


def test_argument_errors(emu):
    x = np.ones((1, 8, 4, 4), np.float32)
    w = np.ones((8, 8, 3, 3), np.float32)
    with pytest.raises(ArgumentError, match="residual"):
        jitops.conv2d(x, w, residual=np.ones((1, 8, 4, 4), np.float32))           # output is 2x2
    with pytest.raises(ArgumentError, match="residual"):
        jitops.conv2d(x, w, residual=np.ones((1, 8, 2, 2), np.float16))           # dtype
    with pytest.raises(ArgumentError, match="layout"):
        jitops.conv2d(x, w, layout="nchwc")
    with pytest.raises(ArgumentError, match="x"):
        jitops.conv2d(np.ones((1, 4, 4, 8), np.float32)[..., :7], w, layout="nhwc")   # strided
    with pytest.raises(ScheduleError, match="groups"):
        jitops.conv2d(x, w, schedule="depthwise")


def test_heuristic_uses_matrix_cores_for_half():
    """fp16 / bf16 3x3 and 1x1 go to the matrix cores (wgmma on sm_90, mma.sync on sm_80),
    depthwise NHWC to its kernel, fp32 stays on the exact kernels."""
    hopper = jitops.get_backend(target="sm_90").device
    ampere = jitops.get_backend(target="sm_80").device

    def pick(x, w, dtype, layout="", dev=hopper, **attrs):
        p = op.make_problem({"x": TensorSpec(x, dtype, layout), "w": TensorSpec(w, dtype), "bias": None}, attrs)
        return op.heuristic(p, dev)

    for dtype in ("float16", "bfloat16"):
        assert pick((8, 256, 56, 56), (256, 256, 3, 3), dtype, padding=1).algorithm == "implicit_gemm_wgmma"
        assert pick((8, 256, 56, 56), (64, 256, 1, 1), dtype, "nhwc").algorithm == "implicit_gemm_wgmma"
        assert pick((8, 256, 56, 56), (256, 256, 3, 3), dtype, padding=1, dev=ampere).algorithm == "implicit_gemm_mma"
    assert pick((8, 96, 56, 56), (96, 1, 3, 3), "float16", "nhwc", padding=1, groups=96).algorithm == "depthwise"
    assert pick((8, 256, 56, 56), (256, 256, 3, 3), "float32", padding=1).algorithm not in (
        "implicit_gemm_mma", "implicit_gemm_wgmma")
    why = pick((8, 256, 56, 56), (256, 256, 3, 3), "float16", padding=1).why
    assert "implicit_gemm_wgmma" in why and "estimated" in why


def test_wgmma_only_on_hopper_and_half():
    """The wgmma kernel needs sm_90 and fp16 / bf16 (or fp32 with precision "tf32"): elsewhere a forced request names why; every
    candidate it offers fits the device's shared memory and threads."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    hopper = jitops.get_backend(target="sm_90").device
    ampere = jitops.get_backend(target="sm_80").device
    half = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float16", "nhwc"),
                            "w": TensorSpec((96, 64, 3, 3), "float16"), "bias": None}, {"padding": 1})
    with pytest.raises(ScheduleError, match="sm_90"):
        op.heuristic(half, ampere, wg.ALGORITHM)
    fp32 = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float32"), "w": TensorSpec((96, 64, 3, 3), "float32"),
                            "bias": None}, {"padding": 1})
    with pytest.raises(ScheduleError, match="precision 'tf32'"):
        op.heuristic(fp32, hopper, wg.ALGORITHM)
    tf32 = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float32", "nhwc"),
                            "w": TensorSpec((96, 64, 3, 3), "float32"), "bias": None}, {"padding": 1, "precision": "tf32"})
    s = op.heuristic(tf32, hopper, wg.ALGORITHM)
    assert s["bk"] == 32                                   # 32 fp32 per 128-byte swizzled row
    cands = [s for s in wg.candidates(half, hopper) if not wg.is_tma(s)]   # Cout 96: no tile wider than 128 columns
    assert {wg.tile_of(s)[1] for s in cands} == {64, 128}
    wide = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float16", "nhwc"),
                            "w": TensorSpec((256, 64, 3, 3), "float16"), "bias": None}, {"padding": 1})
    assert len({wg.tile_of(s) for s in wg.candidates(wide, hopper) if not wg.is_tma(s)}) == len(wg.TILES)
    assert not any(wg.is_tma(s) for s in wg.candidates(wide, hopper))         # 0.24 GFLOP: below TMA_MIN_FLOPS
    large = op.make_problem({"x": TensorSpec((2, 64, 120, 120), "float16", "nhwc"),
                             "w": TensorSpec((256, 64, 3, 3), "float16"), "bias": None}, {"padding": 1})
    offered = {wg.tma_tile_of(s) for s in wg.candidates(large, hopper) if wg.is_tma(s)}
    assert {t for t in offered if len(t) == 5} == {t for t in wg.TMA_TILES if len(t) == 5} - wg.NARROW_TILES
    assert {t for t in offered if len(t) > 5} == {(128, 64, 6, 2, 0, 1)}   # ping-pong: 4 tiles a block at least
    for s in cands:
        launch = next(l for l in op.plan(half, s, hopper).launches if l.kernel == "conv2d_implicit_gemm_wgmma")
        assert launch.shared_bytes <= hopper.shared_per_block_optin
        assert launch.block[0] == 128 * (int(s["bm"]) // 64 + int(s["producer"]))


def _emulate(launch, buffers: dict):
    """Run one plan launch (a layout kernel) on the CPU emulator over numpy buffers, by name."""
    from jitops.ops.base import Buf
    from jitops.prepared import kernel_source
    from jitops.runtime.base import PackedArgs
    backend = jitops.get_backend("cpu")
    source = kernel_source(backend.device, launch)
    kernel = backend.load(backend.compile(source, [launch.kernel], launch.kernel), [launch.kernel])[launch.kernel]
    kinds = ["ptr" if isinstance(a, Buf) else a.kind for a in launch.args]
    packed = PackedArgs(kinds, [a.name if isinstance(a, Buf) else f"arg{i}" for i, a in enumerate(launch.args)])
    for i, a in enumerate(launch.args):
        if isinstance(a, Buf):
            arr = buffers[a.name]
            packed.set_buffer(i, arr.ctypes.data, arr.nbytes, arr.itemsize)
        else:
            packed.set(i, a.value)
    backend.launch(kernel, launch.grid, launch.block, launch.shared_bytes, packed, 0)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", [((2, 3, 23, 29), (24, 3, 7, 7), {"stride": 2, "padding": 3}),
                                  ((1, 4, 17, 20), (16, 4, 5, 5), {"stride": (1, 2), "padding": (2, 1, 0, 3)}),
                                  ((1, 3, 32, 32), (8, 3, 16, 16), {"stride": 16}),
                                  ((2, 3, 23, 29), (24, 3, 7, 7), {"stride": 2, "padding": 3, "precision": "tf32"}),
                                  ((1, 3, 19, 21), (16, 3, 5, 5), {"stride": 1, "padding": 2, "precision": "tf32"})])
def test_window_rows_layouts_make_the_convolution(case, layout):
    """The window-rows GEMM (RGB stems on wgmma): the padded 4-channel copy and the weight pack, run on
    the emulator from the sm_90 plan, give the float64 convolution when multiplied as the template
    gathers them (row r of a window: pixels 2q, 2q + 1 of 4 channels at the chunk q), every chunk an
    aligned 16-byte piece inside the copy. The wgmma kernel itself runs on the device only
    (tests/test_gpu_conv2d.py)."""
    from jitops.ops import conv2d_mma as mm
    from jitops.ops import conv2d_wgmma as wg
    xs, ws, attrs = case
    dtype = "float32" if "precision" in attrs else "float16"     # fp32: one 4-channel pixel per chunk
    npt = np.float32 if dtype == "float32" else np.float16
    hopper = jitops.get_backend(target="sm_90").device
    p = op.make_problem({"x": TensorSpec(xs, dtype, "nhwc" if layout == "nhwc" else ""),
                         "w": TensorSpec(ws, dtype), "bias": None}, attrs)
    s = op.heuristic(p, hopper, wg.ALGORITHM)
    assert s["window_rows"] == 1
    plan = op.plan(p, s, hopper)
    win = mm.window_rows(p, wg.bk_of(p))
    pad, = [l for l in plan.launches if l.kernel == "conv2d_pad4"]
    pack, = [l for l in plan.prepare if l.kernel == "conv2d_pack_window_rows"]
    gemm, = [l for l in plan.launches if l.kernel == "conv2d_implicit_gemm_wgmma"]
    assert dict(gemm.params)["window_rows"] == win.rk
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(npt)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(npt)
    x_in = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "nhwc" else x
    xp = np.full((xs[0], win.hp, win.wp, 4), np.nan, npt)
    wp = np.full((ws[0], win.kp), np.nan, npt)
    _emulate(pad, {"x": x_in, "x_nhwc": xp})
    _emulate(pack, {"w": w, "packed_w": wp})
    assert np.isfinite(xp).all() and np.isfinite(wp).all()
    sh, sw = p.stride
    per_chunk = 16 // (4 * p.itemsize)                    # 4-channel pixels per 16-byte chunk
    assert per_chunk == 1 or (sw % 2 == 0 and win.wp % 2 == 0)     # every chunk starts on 16 bytes
    assert (p.oh - 1) * sh + p.kh <= win.hp and (p.ow - 1) * sw + win.rk // 4 <= win.wp
    assert dict(gemm.params)["BK"] % win.rk == 0 and win.kp % dict(gemm.params)["BK"] == 0
    k = np.arange(win.kp)
    r, pix, c = k // win.rk, (k % win.rk) // 4, k % 4
    oh, ow = np.meshgrid(np.arange(p.oh), np.arange(p.ow), indexing="ij")
    rows = np.minimum(oh[..., None] * sh + r, win.hp - 1)
    a = xp[:, rows, ow[..., None] * sw + pix, c].astype(np.float64)          # [n, oh, ow, kp]
    a[..., r >= p.kh] = 0.0                                                  # rows past the window: not loaded
    y = np.einsum("nhwk,ok->nohw", a, wp.astype(np.float64))
    ref = op.reference(p, {"x": x_in.astype(np.float64), "w": w.astype(np.float64), "bias": None})["y"]
    if layout == "nhwc":
        ref = ref.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9)


def test_window_rows_picked_for_stems_and_refused_elsewhere():
    """On sm_90 the heuristic runs RGB stems that land on wgmma as window rows (ResNet-50's 7x7: 4 K
    tiles of 64 instead of 7; a persistent grid on NHWC), with a reason in `why`; a forced window-rows
    schedule where it does not apply says why."""
    from jitops.ops import conv2d_mma as mm
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import Schedule
    hopper = jitops.get_backend(target="sm_90").device
    stem = op.make_problem({"x": TensorSpec((32, 3, 224, 224), "float16", "nhwc"),
                            "w": TensorSpec((64, 3, 7, 7), "float16"), "bias": None}, {"stride": 2, "padding": 3})
    s = op.heuristic(stem, hopper)
    assert s.algorithm == wg.ALGORITHM and s["window_rows"] == 1 and s["persistent"] == 1
    assert "window rows" in s.why
    assert mm.window_rows(stem) == mm.WindowRows(rk=32, kp=256, hp=229, wp=230)
    assert mm.k_padded(stem, 64) == 448
    # fp32 with precision "tf32": one 4-channel pixel per chunk (K = 7 rows x 32 in 7 tiles of 32, not 13);
    # stems of 100 MFLOP and more leave direct_stem for it; exact fp32 keeps direct_stem
    for xs, ws, attrs, rows in (((32, 3, 224, 224), (64, 3, 7, 7), {"stride": 2, "padding": 3}, True),
                                ((32, 3, 224, 224), (64, 3, 3, 3), {"stride": 2, "padding": 1}, True),
                                ((2, 4, 31, 45), (40, 4, 5, 5), {"stride": 1, "padding": 2}, False)):
        for precision in ("tf32", None):
            p = op.make_problem({"x": TensorSpec(xs, "float32", "nhwc"), "w": TensorSpec(ws, "float32"), "bias": None},
                                {**attrs, **({"precision": precision} if precision else {})})
            s = op.heuristic(p, hopper)
            on_rows = s.algorithm == wg.ALGORITHM and s.get("window_rows", 0) == 1
            assert on_rows == (rows and precision == "tf32"), (ws, precision, s)
            if not on_rows:
                assert s.algorithm == "direct_stem", (ws, precision, s)
    tf32 = op.make_problem({"x": TensorSpec((32, 3, 224, 224), "float32", "nhwc"), "w": TensorSpec((64, 3, 7, 7), "float32"),
                            "bias": None}, {"stride": 2, "padding": 3, "precision": "tf32"})
    assert mm.window_rows(tf32, 32) == mm.WindowRows(rk=32, kp=224, hp=229, wp=230)
    for xs, ws, attrs, match in (
            ((2, 8, 32, 32), (16, 8, 7, 7), {"stride": 2}, "at most 4 input channels"),
            ((2, 3, 32, 32), (16, 3, 7, 7), {"stride": 1}, "even horizontal stride"),
            ((2, 3, 32, 32), (16, 3, 3, 3), {"stride": 2, "dilation": 2}, "no dilation"),
            ((2, 3, 64, 64), (16, 3, 17, 17), {"stride": 2}, "KW <= 16"),
            ((2, 3, 32, 32), (16, 3, 9, 9), {"stride": 2, "precision": "tf32"}, "8 in fp32")):
        dtype = "float32" if "precision" in attrs else "float16"
        p = op.make_problem({"x": TensorSpec(xs, dtype, "nhwc"), "w": TensorSpec(ws, dtype), "bias": None}, attrs)
        forced = Schedule.make(wg.ALGORITHM, bm=128, bn=64, bk=wg.bk_of(p), stages=4, producer=0, split_k=1,
                               math="wgmma", window_rows=1)
        with pytest.raises(ScheduleError, match=match):
            op.plan(p, forced, hopper)
        assert "window_rows" not in op.heuristic(p, hopper).as_dict()["params"]
    # the mma.sync kernel has no window-rows loader: a schedule asking it for one is refused, not planned
    mma_rows = Schedule.make("implicit_gemm_mma", **{**op.heuristic(stem, hopper, "implicit_gemm_mma").as_dict()["params"],
                                                     "window_rows": 1})
    with pytest.raises(ScheduleError, match="window_rows is a parameter of implicit_gemm_wgmma"):
        op.plan(stem, mma_rows, hopper)


def test_window_rows_kernels_compile_for_sm90a_without_spills():
    """The stems' window-rows wgmma kernels (ResNet-50's 7x7: fp16 on a persistent grid, TF32 plain)
    compile offline (NVRTC, sm_90a) to wgmma with no local memory and no serialized wgmma."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from conftest import nvrtc_ptx
    from jitops import engine
    hopper = jitops.get_backend(target="sm_90")
    for dtype, extra, mma in (("float16", {}, "m64n64k16.f32.f16.f16"), ("float32", {"precision": "tf32"},
                                                                      "m64n64k8.f32.tf32.tf32")):
        p = op.make_problem({"x": TensorSpec((32, 3, 224, 224), dtype, "nhwc"), "w": TensorSpec((64, 3, 7, 7), dtype),
                             "bias": None}, {"stride": 2, "padding": 3, **extra})
        s = op.heuristic(p, hopper.device)
        assert s["window_rows"] == 1, s
        gemm, = [l for l in op.plan(p, s, hopper.device).launches if l.kernel == "conv2d_implicit_gemm_wgmma"]
        ptx, text = nvrtc_ptx(engine.kernel_source(hopper.device, gemm), b"-arch=sm_90a", b"-std=c++17",
                              b"-default-device", b"--ptxas-options=-v")
        assert f"wgmma.mma_async.sync.aligned.{mma}" in ptx, dtype
        assert "0 bytes spill stores" in text and "C7519" not in text and "C7512" not in text, text


def test_wgmma_persistent_grid():
    """The persistent wgmma grid: one block per resident slot (shared memory without the fp32
    epilogue tile), offered only where blocks loop over tiles, refused with a reason for NCHW
    output, split-K or a producer warpgroup; the heuristic swaps in the persistent twin for short K
    with 8k channels (large_spatial), not for long K, NCHW or 27 channels."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    hopper = jitops.get_backend(target="sm_90").device

    def prob(x, w, layout="nhwc", **attrs):
        return op.make_problem({"x": TensorSpec(x, "float16", layout), "w": TensorSpec(w, "float16"), "bias": None},
                               {"padding": 1, **attrs})
    big = prob((4, 64, 256, 256), (128, 64, 3, 3))
    s = wg.persistent_twin(big, wg.schedule(256, 128, 4, 0), hopper)   # (the heuristic may take the TMA kernel)
    assert wg.is_persistent(s) and wg.tile_of(s) == (256, 128, 4, 0), s
    launch = next(l for l in op.plan(big, s, hopper).launches if l.kernel == "conv2d_implicit_gemm_wgmma")
    assert launch.grid == (hopper.multiprocessors, 1, 1)
    assert launch.shared_bytes == 4 * (256 + 128) * 128 + 1024
    two = wg.schedule(128, 128, 3, 0, persistent=True)
    launch = next(l for l in op.plan(big, two, hopper).launches if l.kernel == "conv2d_implicit_gemm_wgmma")
    assert launch.grid == (2 * hopper.multiprocessors, 1, 1)          # two 97 KB blocks per multiprocessor
    assert launch.template_params["min_blocks"] == 2
    for bad, match in ((prob((4, 64, 256, 256), (128, 64, 3, 3), ""), "NHWC output"),):
        with pytest.raises(ScheduleError, match=match):
            op.plan(bad, two, hopper)
    with pytest.raises(ScheduleError, match="no split-K"):
        op.plan(big, wg.schedule(128, 128, 3, 0, split_k=2, persistent=True), hopper)
    with pytest.raises(ScheduleError, match="producer"):
        op.plan(big, wg.schedule(128, 128, 4, 1, persistent=True), hopper)
    assert not any(wg.is_persistent(c) for c in wg.candidates(prob((2, 64, 20, 20), (96, 64, 3, 3)), hopper))
    for other in (prob((4, 64, 256, 256), (128, 64, 3, 3), ""),             # NCHW
                  prob((16, 256, 64, 64), (256, 256, 3, 3)),                # K = 2304
                  prob((16, 128, 64, 64), (27, 128, 3, 3))):                # 27 channels: scalar stores
        old = next(c for c in wg.candidates(other, hopper) if not wg.is_tma(c) and not wg.is_persistent(c)
                   and wg.tile_of(c) in wg.TWIN_TILES and int(c["split_k"]) == 1)
        assert wg.persistent_twin(other, old, hopper) is None, other.describe()


def test_wgmma_tf32_rates_its_own_tiles():
    """TF32 has rates of its own, persistent tiles included (scripts/conv2d_wgmma_picks.py --tf32):
    the 192 x 128 tile for large_spatial (persistent, 171.6 us on the H100 sweep of 2026-11-26) and
    k100_5 (229.2 us; the fp16 rates had picked 64 x 128, 319.7 us), estimates within 10% of those
    times, and the fp16 picks of the same shapes unchanged."""
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.conv2d_cost import estimate
    hopper = jitops.get_backend(target="sm_90").device

    def prob(x, w, dtype):
        extra = {"precision": "tf32"} if dtype == "float32" else {}
        return op.make_problem({"x": TensorSpec(x, dtype, "nhwc"), "w": TensorSpec(w, dtype), "bias": None},
                               {"padding": 1, **extra})
    def cp_async_pick(p):     # the pick among the cp.async kernel's tiles (the TMA kernel has its own test)
        s = min((c for c in wg.candidates(p, hopper) if not wg.is_tma(c)), key=lambda c: estimate(p, c, hopper))
        return wg.persistent_twin(p, s, hopper) or s
    for x, w, persistent, us in (((4, 64, 256, 256), (128, 64, 3, 3), True, 171.6),
                                 ((2, 640, 64, 64), (640, 640, 3, 3), False, 229.2)):
        s = cp_async_pick(prob(x, w, "float32"))
        assert wg.tile_of(s) == (192, 128, 4, 0) and wg.is_persistent(s) == persistent, s
        assert 0.9 < estimate(prob(x, w, "float32"), s, hopper) * 1e6 / us < 1.1
    assert wg.tile_of(cp_async_pick(prob((4, 64, 256, 256), (128, 64, 3, 3), "float16"))) == (256, 128, 4, 0)
    assert wg.tile_of(cp_async_pick(prob((2, 640, 64, 64), (640, 640, 3, 3), "float16"))) == (128, 192, 4, 0)
    assert set(wg.COST.tf32_persistent_rate) <= set(wg.PERSISTENT_TILES) and set(wg.COST.tf32_rate) <= set(wg.TILES)


def test_wgmma_nchw_1x1_plans():
    """The NCHW 1x1 wgmma kernel: offered for NCHW fp16 / bf16 1x1 convs with H * W a multiple of 4,
    one launch (no NHWC copy), a grid of pixel tiles x channel tiles x images; refused with a reason
    elsewhere; the heuristic takes it for ResNet-50's NCHW 256 -> 64 1x1 at 56x56 (0.45x cuDNN
    through a_nchw before it, 0.87x with it: H100, 2026-11-25)."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    hopper = jitops.get_backend(target="sm_90").device

    def prob(x, w, layout="", dtype="float16", **attrs):
        return op.make_problem({"x": TensorSpec(x, dtype, layout), "w": TensorSpec(w, dtype), "bias": None}, attrs)
    p = prob((8, 256, 56, 56), (64, 256, 1, 1))
    s = op.heuristic(p, hopper)
    assert wg.is_nchw_1x1(s), s
    plan = op.plan(p, wg.schedule(128, 64, 4, 0, b_nchw=True), hopper)
    assert [l.kernel for l in plan.launches] == ["conv2d_wgmma_nchw_1x1"]
    assert plan.launches[0].grid == (49, 1, 8)
    assert op.plan(prob((8, 256, 14, 14), (64, 256, 1, 1)), wg.schedule(128, 64, 4, 0, b_nchw=True),
                   hopper).launches[0].template_params["CHUNK"] == 4          # 196 pixels: 8-byte copies
    for bad in (prob((8, 256, 56, 56), (64, 256, 1, 1), "nhwc"), prob((8, 256, 15, 15), (64, 256, 1, 1)),
                prob((8, 256, 56, 56), (64, 256, 3, 3), padding=1), prob((8, 256, 56, 56), (64, 256, 1, 1), dtype="float32")):
        assert not any(wg.is_nchw_1x1(c) for c in wg.candidates(bad, hopper)), bad.describe()
    with pytest.raises(ScheduleError, match="multiple of 4"):
        op.plan(prob((8, 256, 15, 15), (64, 256, 1, 1)), wg.schedule(128, 64, 4, 0, b_nchw=True), hopper)
    with pytest.raises(ScheduleError, match="no tile"):
        op.plan(p, wg.schedule(192, 64, 3, 0, b_nchw=True), hopper)


def test_mma_plans():
    """What each layout costs in launches: NHWC with 8k channels reads x in place; NCHW (or 3
    channels) adds one copy; split-K adds the reduction; the weights are packed once (prepare)."""
    dev = jitops.get_backend(target="sm_90").device

    def kernels(x, w, layout="", split=1):
        p = op.make_problem({"x": TensorSpec(x, "float16", layout), "w": TensorSpec(w, "float16"), "bias": None},
                            {"padding": 1})
        plan = op.plan(p, mma_schedule(128, 128, 32, 2, 2, 4, split_k=split), dev)
        assert [l.kernel for l in plan.prepare] == ["conv2d_mma_pack_weights"]
        assert any(ws.derived_from == ("w",) for ws in plan.workspaces)
        return [l.kernel for l in plan.launches]

    assert kernels((8, 64, 56, 56), (64, 64, 3, 3), "nhwc") == ["conv2d_implicit_gemm_mma"]
    assert kernels((8, 64, 56, 56), (64, 64, 3, 3)) == ["conv2d_to_nhwc", "conv2d_implicit_gemm_mma"]
    assert kernels((8, 3, 56, 56), (64, 3, 3, 3), "nhwc") == ["conv2d_to_nhwc", "conv2d_implicit_gemm_mma"]
    assert kernels((2, 512, 7, 7), (64, 512, 3, 3), "nhwc", split=4) == ["conv2d_implicit_gemm_mma",
                                                                         "conv2d_splitk_reduce"]
    from jitops.ops.conv2d_wgmma import schedule as wgmma_schedule
    p = op.make_problem({"x": TensorSpec((2, 20, 9, 9), "float16"), "w": TensorSpec((32, 20, 3, 3), "float16"),
                         "bias": None}, {"padding": 1})
    plan = op.plan(p, wgmma_schedule(128, 128, 4, 0, split_k=2), dev)       # the same plan around wgmma
    assert [l.kernel for l in plan.launches] == ["conv2d_to_nhwc", "conv2d_implicit_gemm_wgmma", "conv2d_splitk_reduce"]
    assert [l.kernel for l in plan.prepare] == ["conv2d_mma_pack_weights"]


def test_wgmma_tma_plan():
    """The warp-specialized TMA kernel: an im2col map over the NHWC input (corners from padding,
    filter and dilation; one 128-byte chunk per pixel; BM pixels per load), a tiled map over weights
    packed with each tap's channels padded to whole chunks, a producer warpgroup beside the consumers,
    a persistent grid of one block per multiprocessor; refused with a reason for NCHW and groups."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorMap
    hopper = jitops.get_backend(target="sm_90").device
    p = op.make_problem({"x": TensorSpec((2, 96, 31, 33), "float16", "nhwc"), "w": TensorSpec((136, 96, 5, 5), "float16"),
                         "bias": None}, {"padding": (2, 1, 2, 1), "dilation": (1, 2), "stride": (2, 1)})
    s = wg.tma_schedule((128, 128, 4, 2, 0), 64)
    plan = op.plan(p, s, hopper)
    launch = next(l for l in plan.launches if l.kernel == "conv2d_wgmma_tma")
    amap, bmap = [a for a in launch.args if isinstance(a, TensorMap)]
    assert amap.name == "x" and amap.dims == (96, 33, 31, 2)
    assert amap.im2col == (-1, -2, 1 - 4 * 2, 2 - 4, 64, 128, 1, 2)     # W then H: corners, chunk, pixels, strides
    assert bmap.name == "packed_w" and bmap.dims == (25 * 128, 136) and bmap.box == (64, 128)   # 96 -> 2 chunks a tap
    assert launch.block == (384, 1, 1) and launch.grid == (7 * 2, 1, 1)      # 864 pixels, 136 channels: 14 tiles
    assert launch.shared_bytes <= hopper.shared_per_block_optin
    assert plan.prepare[0].kernel == "conv2d_mma_pack_weights"
    odd = op.make_problem({"x": TensorSpec((2, 20, 17, 15), "float32", "nhwc"), "w": TensorSpec((24, 20, 3, 3), "float32"),
                           "bias": None}, {"padding": 1, "precision": "tf32"})
    plan = op.plan(odd, wg.tma_schedule((64, 128, 6, 1, 0), 32, persistent=False), hopper)
    assert [l.kernel for l in plan.launches] == ["conv2d_to_nhwc", "conv2d_wgmma_tma"]    # C = 20: padded copy to 24
    amap = next(a for a in plan.launches[1].args if isinstance(a, TensorMap))
    assert amap.name == "x_nhwc" and amap.dims[0] == 24 and amap.im2col[4] == 32
    nchw = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float16"), "w": TensorSpec((96, 64, 3, 3), "float16"),
                            "bias": None}, {"padding": 1})
    grouped = op.make_problem({"x": TensorSpec((2, 64, 20, 20), "float16", "nhwc"),
                               "w": TensorSpec((64, 16, 3, 3), "float16"), "bias": None}, {"padding": 1, "groups": 4})
    for bad in (nchw, grouped):
        assert wg.tma_candidates(bad, hopper) == []
        with pytest.raises(ScheduleError, match="channels_last"):
            op.plan(bad, s, hopper)


def test_wgmma_tma_a_rows():
    """1x1 stride-1 unpadded layers read A by a tiled map over the input as a [pixels][channels] matrix (box BM
    rows x one 128-byte chunk), every TMA candidate of theirs does; other layers keep the im2col map, and a
    schedule asking for a_rows there is refused with the reason."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorMap
    hopper = jitops.get_backend(target="sm_90").device
    plain = op.make_problem({"x": TensorSpec((32, 128, 28, 28), "float16", "nhwc"),
                             "w": TensorSpec((512, 128, 1, 1), "float16"), "bias": None}, {})
    cands = wg.tma_candidates(plain, hopper)
    assert cands and all(int(s.get("a_rows", 0)) == 1 for s in cands)
    launch = next(l for l in op.plan(plain, cands[0], hopper).launches if l.kernel == "conv2d_wgmma_tma")
    amap = next(a for a in launch.args if isinstance(a, TensorMap))
    assert amap.im2col is None and amap.dims == (128, 32 * 28 * 28) and amap.box == (64, int(cands[0]["bm"]))
    assert dict(launch.params)["a_rows"] == 1
    for k, attrs in ((1, {"stride": 2}), (3, {"padding": 1})):
        other = op.make_problem({"x": TensorSpec((32, 128, 28, 28), "float16", "nhwc"),
                                 "w": TensorSpec((512, 128, k, k), "float16"), "bias": None}, attrs)
        assert not any(int(s.get("a_rows", 0)) for s in wg.tma_candidates(other, hopper))
        with pytest.raises(ScheduleError, match="a_rows .* 1x1 filter, stride 1 and no padding"):
            op.plan(other, wg.tma_schedule((128, 128, 4, 2, 0), 64, a_rows=True), hopper)
    deep = op.make_problem({"x": TensorSpec((32, 2048, 7, 7), "float16", "nhwc"),
                            "w": TensorSpec((512, 2048, 1, 1), "float16"), "bias": None}, {})
    pick = op.heuristic(deep, hopper)                      # ResNet-50's 2048 -> 512: the TMA kernel
    assert wg.is_tma(pick) and pick.get("a_rows") == 1, pick


def test_wgmma_tma_heuristic():
    """The heuristic takes the TMA kernel where the H100 sweeps of 2026-11-26 measured it faster (the
    large 3x3 layers, the deep SD layers with split-K), keeps the cp.async / stem kernels for the
    small problems, never takes it for NCHW input, and the tuner's candidates include its tiles."""
    from jitops.ops import conv2d_wgmma as wg
    hopper = jitops.get_backend(target="sm_90").device

    def prob(x, w, dtype="float16", layout="nhwc", **attrs):
        extra = {"precision": "tf32"} if dtype == "float32" else {}
        return op.make_problem({"x": TensorSpec(x, dtype, layout), "w": TensorSpec(w, dtype), "bias": None},
                               {"padding": 1, **extra, **attrs})
    for dtype in ("float16", "bfloat16", "float32"):
        for x, w in (((8, 64, 128, 128), (128, 64, 3, 3)), ((2, 640, 64, 64), (640, 640, 3, 3)),
                     ((2, 1280, 8, 8), (1280, 1280, 3, 3))):
            if dtype == "float32" and w[0] == 640:
                continue          # TF32 k100_5: the estimates favour the cp.async kernel (measured 1.08x slower)
            s = op.heuristic(prob(x, w, dtype), hopper)
            assert wg.is_tma(s), (dtype, x, w, s)
        assert not wg.is_tma(op.heuristic(prob((1, 64, 56, 56), (64, 64, 3, 3), dtype), hopper))
        assert not wg.is_tma(op.heuristic(prob((8, 64, 128, 128), (128, 64, 3, 3), dtype, ""), hopper))
    s = op.heuristic(prob((2, 1280, 8, 8), (1280, 1280, 3, 3)), hopper)
    assert int(s["split_k"]) > 1                                # 20 tiles of 128 x 128 on 132 multiprocessors
    assert any(wg.is_tma(c) for c in get_op("conv2d").candidates(prob((2, 640, 64, 64), (640, 640, 3, 3)), hopper))


def test_wgmma_tma_narrow_tiles():
    """160-channel TMA tiles: offered (and the heuristic's pick) where output channels are 320 / 960 (Stable
    Diffusion's first level: 3 x 128 columns computed 384), offered where 160 divides them (640), not for 512
    (neither divides nor pads less); their weight map's box is 160 rows, and a width that is not a multiple of
    32 is refused."""
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorMap
    hopper = jitops.get_backend(target="sm_90").device

    def prob(cin, cout, dtype="float16"):
        extra = {"precision": "tf32"} if dtype == "float32" else {}
        return op.make_problem({"x": TensorSpec((2, cin, 64, 64), dtype, "nhwc"), "w": TensorSpec((cout, cin, 3, 3), dtype),
                                "bias": None}, {"padding": 1, **extra})
    for dtype in ("float16", "bfloat16", "float32"):
        for cin, cout in ((320, 320), (960, 320)):
            p = prob(cin, cout, dtype)
            offered = {wg.tma_tile_of(c) for c in wg.tma_candidates(p, hopper)}
            assert wg.NARROW_TILES <= offered
            s = op.heuristic(p, hopper)
            assert wg.is_tma(s) and int(s["bn"]) == 160, (dtype, cin, cout, s)
            launch = next(l for l in op.plan(p, s, hopper).launches if l.kernel == "conv2d_wgmma_tma")
            bmap = [a for a in launch.args if isinstance(a, TensorMap)][1]
            assert bmap.box == (wg.bk_of(p), 160) and launch.shared_bytes <= hopper.shared_per_block_optin
        assert wg.NARROW_TILES <= {wg.tma_tile_of(c) for c in wg.tma_candidates(prob(640, 640, dtype), hopper)}
        assert not wg.NARROW_TILES & {wg.tma_tile_of(c) for c in wg.tma_candidates(prob(512, 512, dtype), hopper)}
    with pytest.raises(ScheduleError, match="not supported"):
        op.plan(prob(320, 320), wg.tma_schedule((128, 144, 6, 2, 0), 64), hopper)


def test_wgmma_tma_h200_rules():
    """Rules from the H200 pool sweeps (2026-11-29): a two-per-multiprocessor tile whose grid has no more
    blocks than multiprocessors is charged one wave at TMA_LONE_SHARE of the pair's rate, not two (ResNet-50's
    512 -> 512 3x3 at 7 x 7, b32, now takes the 4-stage 64 x 128 tile: 17.5 us against 19.0 on the 6-stage
    one); on a device of at least TMA_FAST_MEMORY_BANDWIDTH (the H200) whole-chunk channels take the TMA kernel
    at TMA_MARGIN_WHOLE, and so do 1x1 filters over any channels (ResNet-50 b32's 128 -> 512 1x1 at 28 x 28: 12.6
    us against 16.9 on the cp.async pick), the H100 keeps TMA_MARGIN; from TMA_MIN_FLOPS_FAST_MEMORY flops there,
    not TMA_MIN_FLOPS; 3x3 filters into 32 channels keep the cp.async kernel."""
    import dataclasses
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.conv2d_cost import machine
    base = jitops.get_backend(target="sm_90").device
    h200 = dataclasses.replace(base, name="NVIDIA H200")
    h100 = dataclasses.replace(base, name="NVIDIA H100 80GB HBM3")

    def prob(x, w, padding=0):
        return op.make_problem({"x": TensorSpec(x, "float16", "nhwc"), "w": TensorSpec(w, "float16"), "bias": None},
                               {"padding": padding})
    deep = prob((32, 512, 7, 7), (512, 512, 3, 3), 1)                       # 25 x 4 = 100 blocks of 64 x 128
    lone, pair = wg.tma_schedule((64, 128, 4, 1, 0), 64, persistent=False), wg.tma_schedule((64, 128, 6, 1, 0), 64)
    bw = machine(h200).bandwidth
    t_lone = wg.tma_estimate(deep, lone, h200, bw, 0.0, lone=wg.TMA_LONE_SHARE)
    assert t_lone == pytest.approx(wg.tma_estimate(deep, lone, h200, bw, 0.0, lone=0.5) * 0.5 / wg.TMA_LONE_SHARE,
                                   rel=0.05)
    assert wg.tma_tile_of(op.heuristic(deep, h200))[:3] == (64, 128, 8)   # the lone 4-stage tile's deep ring
    assert t_lone < wg.tma_estimate(deep, pair, h200, bw, 0.0)
    # ranking-aware rates (TMA_RATE_FAST_MEMORY_SCALE), the H200 only: ResNet-50 b32's 256 -> 1024 1x1 at 14 x 14
    # on three consumer warpgroups (9.5 us against 10.4 on the 64 x 128 tile it took before, 2026-11-29 14:06)
    expand = prob((32, 256, 14, 14), (1024, 256, 1, 1))
    assert wg.tma_tile_of(op.heuristic(expand, h200))[:2] == (192, 128)
    assert wg.tma_tile_of(op.heuristic(expand, h100))[:2] == (64, 128)
    point = prob((32, 128, 28, 28), (512, 128, 1, 1))
    assert wg.is_tma(op.heuristic(point, h200))
    assert not wg.is_tma(op.heuristic(point, h100))
    padded_1x1, padded_3x3 = prob((32, 48, 28, 28), (288, 48, 1, 1)), prob((32, 48, 28, 28), (288, 48, 3, 3), 1)
    for dev in (h100, h200):
        m = machine(dev).bandwidth
        s = wg.tma_schedule((192, 128, 5, 3, 0), 64)
        for q, whole in ((point, True), (padded_1x1, True), (padded_3x3, False)):   # 1x1: K padded alike on both kernels
            expect = wg.TMA_MARGIN_WHOLE if m >= wg.TMA_FAST_MEMORY_BANDWIDTH and whole else wg.TMA_MARGIN
            assert wg.tma_estimate(q, s, dev, m, 0.0) > wg.tma_estimate(q, s, dev, m, 0.0, margin=expect * 0.99)
            assert wg.tma_estimate(q, s, dev, m, 0.0) < wg.tma_estimate(q, s, dev, m, 0.0, margin=expect * 1.01)
    small = prob((32, 32, 112, 112), (16, 32, 1, 1))                           # 0.41 GFLOP
    assert wg.TMA_MIN_FLOPS_FAST_MEMORY <= small.flops < wg.TMA_MIN_FLOPS
    assert wg.tma_candidates(small, h200) and not wg.tma_candidates(small, h100)
    assert not wg.tma_candidates(prob((32, 128, 56, 56), (32, 128, 3, 3), 1), h200)
    assert wg.tma_candidates(prob((32, 192, 56, 56), (32, 192, 1, 1)), h200)
    assert wg.tma_candidates(prob((32, 128, 56, 56), (64, 128, 3, 3), 1), h200)


def test_wgmma_tma_l2_resident_rate():
    """A call whose bytes fit in L2 is charged at TMA_RESIDENT_BYTES_PER_S on the TMA kernel only: the
    ResNet-50 b32 1x1 layer 512 -> 128 at 28x28 (32 MB; both kernels' estimates were the DRAM term)
    takes the TMA kernel's 192 x 128 tile (8.7-8.9 us against 11.4-11.9 on the cp.async pick, H100
    2026-11-26); the 64 MB 1x1 layer 256 -> 64 at 56x56 keeps the cp.async kernel."""
    from jitops.ops import conv2d_wgmma as wg
    hopper = jitops.get_backend(target="sm_90").device

    def prob(x, w, dtype="float16", padding=0):
        return op.make_problem({"x": TensorSpec(x, dtype, "nhwc"), "w": TensorSpec(w, dtype), "bias": None},
                               {"padding": padding})
    for dtype in ("float16", "bfloat16"):
        s = op.heuristic(prob((32, 512, 28, 28), (128, 512, 1, 1), dtype), hopper)
        assert wg.is_tma(s) and wg.tma_tile_of(s) == (192, 128, 5, 3, 0), s
        assert not wg.is_tma(op.heuristic(prob((32, 256, 56, 56), (64, 256, 1, 1), dtype), hopper))


def test_wgmma_tma_one_wave_deep_ring():
    """A grid of one wave runs the shallow tiles of TMA_ONE_WAVE_DEEPER on their deep rings (each block is alone
    on its multiprocessor), rated as their shallow source; grids of more blocks than multiprocessors keep the
    shallow tiles (two per multiprocessor), and every offered tile fits the device's shared memory."""
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.conv2d_cost import machine
    h200 = jitops.get_backend(target="sm_90").device

    def offered(x, w, padding=0):
        p = op.make_problem({"x": TensorSpec(x, "float16", "nhwc"), "w": TensorSpec(w, "float16"), "bias": None},
                            {"padding": padding})
        return p, wg.tma_candidates(p, h200)
    small, cands = offered((32, 2048, 7, 7), (512, 2048, 1, 1))           # 25 x 4 = 100 blocks of 64 x 128
    assert len(cands) == len(set(cands))
    for s in cands:                                     # by the blocks of each grid (split-K multiplies them)
        tile = wg.tma_tile_of(s)
        blocks = -(-small.pixels // tile[0]) * -(-small.cout // tile[1]) * int(s["split_k"])
        assert tile not in (wg.TMA_ONE_WAVE_DEEPER if blocks <= h200.multiprocessors
                            else set(wg.TMA_ONE_WAVE_DEEPER.values())), s
    assert (64, 128, 8, 1, 0) in {wg.tma_tile_of(s) for s in cands}
    deep = next(s for s in cands if wg.tma_tile_of(s) == (64, 128, 8, 1, 0) and int(s["split_k"]) == 1)
    shallow = wg.tma_schedule((64, 128, 4, 1, 0), 64, persistent=False, a_rows=True)
    bw = machine(h200).bandwidth
    assert wg.tma_estimate(small, deep, h200, bw, 0.0) == wg.tma_estimate(small, shallow, h200, bw, 0.0)
    for s in cands:
        assert op.plan(small, s, h200).launches[-1].shared_bytes <= h200.shared_per_block_optin
    _, many = offered((32, 512, 28, 28), (128, 512, 1, 1))                # 392 x 1 blocks of 64 x 128: 3 waves
    assert (64, 128, 4, 1, 0) in {wg.tma_tile_of(s) for s in many}
    assert not {wg.tma_tile_of(s) for s in many} & set(wg.TMA_ONE_WAVE_DEEPER.values())


def test_wgmma_strided_1x1_reads_landed_pixels():
    """A strided 1x1 filter over NHWC pixels of 128 bytes or more is charged the pixels it lands on (a quarter
    at stride 2), so ResNet-50 b32's 256 -> 512 stride-2 downsample is no longer rated memory-bound alike on
    every tile and takes a TMA tile; 64-byte pixels (32 channels) keep the whole input's charge."""
    import dataclasses
    from jitops.ops import conv2d_wgmma as wg
    h200 = dataclasses.replace(jitops.get_backend(target="sm_90").device, name="NVIDIA H200")

    def prob(x, w):
        return op.make_problem({"x": TensorSpec(x, "float16", "nhwc"), "w": TensorSpec(w, "float16"), "bias": None},
                               {"stride": 2})
    down, thin = prob((32, 256, 56, 56), (512, 256, 1, 1)), prob((32, 32, 112, 112), (48, 32, 1, 1))
    assert wg.io_bytes(down)[0] == 32 * 28 * 28 * 256 * 2
    assert wg.io_bytes(thin)[0] == 32 * 112 * 112 * 32 * 2
    assert wg.is_tma(op.heuristic(down, h200))


@pytest.mark.parametrize("x_format", ["channels_last", "contiguous_format"])
def test_residual_in_the_other_memory_format(emu, x_format):
    """A residual stored NCHW beside a channels_last x (or the reverse) is copied into x's format first
    (residual_in_x_format) and read by the plan made for a residual like x: every algorithm the emulator
    offers, fp32 and bf16, into a NaN-filled output in x's format, against float64; the problem says so in
    its key and description."""
    torch = pytest.importorskip("torch")
    xf = getattr(torch, x_format)
    rf = torch.contiguous_format if x_format == "channels_last" else torch.channels_last
    gen = torch.Generator().manual_seed(3)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(2, 6, 9, 7, generator=gen).to(dtype).contiguous(memory_format=xf)
        w = (torch.randn(10, 6, 3, 3, generator=gen) / 7).to(dtype)
        r = torch.randn(2, 10, 5, 4, generator=gen).to(dtype).contiguous(memory_format=rf)
        want = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), padding=1, stride=2) + r.double())
        spec = {"x": TensorSpec(tuple(x.shape), str(dtype).split(".")[1], "nhwc" if xf is torch.channels_last else ""),
                "w": TensorSpec(tuple(w.shape), str(dtype).split(".")[1]), "bias": None}
        p = op.make_problem({**spec, "residual": TensorSpec(tuple(r.shape), spec["w"].dtype,
                                                            "" if spec["x"].layout else "nhwc")},
                            {"padding": 1, "stride": 2, "activation": "relu"})
        assert p.residual_other_format and "residual n" in p.describe()
        same = op.make_problem({**spec, "residual": TensorSpec(tuple(r.shape), spec["w"].dtype, spec["x"].layout)},
                               {"padding": 1, "stride": 2, "activation": "relu"})
        assert not same.residual_other_format and same.key() != p.key()
        ran = set()
        for s in op.candidates(p, emu.device):
            if s.algorithm in ran:
                continue
            ran.add(s.algorithm)
            out = torch.full_like(want, float("nan"), dtype=dtype).contiguous(memory_format=xf)
            y = jitops.conv2d(x, w, padding=1, stride=2, residual=r, activation="relu", out=out, schedule=s)
            assert y.is_contiguous(memory_format=xf)
            err = float((y.double() - want).abs().max() / want.abs().max())
            assert err <= tol, (dtype, s, err)
        assert len(ran) >= 2, ran
