"""group_norm on the emulator (warp 32 and 64) against float64: every strategy, planes that are
and are not whole vectors, one channel per group, one element per group, ranks 2 to 5, fp16 and
mixed-precision parameters, large offsets, the grid-reduced split path, errors."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.ops.norm_common import row_heuristic

from test_layer_norm import check_norm, recovered_stats

OP = get_op("group_norm")


def problem_of(shape, groups, dtype="float32", ptype=None, gamma=True, beta=True, eps=1e-5):
    p = TensorSpec((shape[1],), ptype or dtype)
    return OP.make_problem({"x": TensorSpec(shape, dtype), "gamma": p if gamma else None,
                            "beta": p if beta else None}, {"num_groups": groups, "eps": eps})


# (shape, groups): 7x5 planes (odd), one channel per group, one group, rank 3 and 2 and 5,
# one-element groups (variance 0: y = beta).
CASES = [((2, 6, 5, 7), 3), ((2, 6, 4, 4), 6), ((1, 8, 6, 6), 1), ((3, 8, 10), 4), ((3, 8), 4),
         ((1, 4, 2, 1, 3), 2), ((2, 4, 1, 1), 4)]


@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_strategies(emu, rng, algorithm):
    for shape, groups in CASES if algorithm in (None, "naive") else CASES[:4]:
        check_norm("group_norm", problem_of(shape, groups), algorithm, rng)


@pytest.mark.parametrize("algorithm", [None, "split", "naive"])
def test_half(emu, rng, algorithm):
    check_norm("group_norm", problem_of((2, 6, 5, 7), 3, "float16", "float32"), algorithm, rng)
    check_norm("group_norm", problem_of((2, 8, 5, 4), 4, "float16", "float16"), algorithm, rng)


def test_without_gamma_beta(emu, rng):
    for gamma, beta in ((False, False), (True, False), (False, True)):
        for alg in (None, "split"):
            check_norm("group_norm", problem_of((2, 6, 3, 3), 2, gamma=gamma, beta=beta), alg, rng)


def test_one_element_groups_give_beta(emu, rng):
    prob = problem_of((3, 4, 1, 1), 4)
    ins = OP.random_inputs(prob, rng)
    y = check_norm("group_norm", prob, None, rng, ins=ins)
    np.testing.assert_array_equal(y, np.broadcast_to(ins["beta"].reshape(1, 4, 1, 1), y.shape))


@pytest.mark.parametrize("params", [
    dict(algorithm="block", tpr=64, stats="welford"),
    dict(algorithm="block", tpr=128, store="smem"),
    dict(algorithm="stream", tpr=64, unroll=2),
    dict(algorithm="split", tpr=64, unroll=2, chunks=5),
    dict(algorithm="split", tpr=64, unroll=1, chunks=3, stats="sumsq"),
])
def test_groups_longer_than_a_block(emu, rng, params):
    params = dict(params)
    alg = params.pop("algorithm")
    for shape, groups in (((2, 4, 20, 24), 2),) if alg == "block" else (((1, 6, 13, 17), 3),):
        prob = problem_of(shape, groups)
        check_norm("group_norm", prob, row_heuristic(prob.row_spec(), emu.device, alg, **params), rng)


@pytest.mark.parametrize("params", [dict(algorithm="block"), dict(algorithm="block", stats="welford"),
                                    dict(algorithm="stream", tpr=128), dict(algorithm="split", tpr=128, chunks=4)])
def test_large_offset_statistics(emu, params):
    """Seed 003: 1e4 + N(0, 1): variance positive and within 1e-6 of a float64 two-pass."""
    rng = np.random.default_rng(11)
    prob = problem_of((2, 8, 32, 32), 2, gamma=False, beta=False)
    x = (1e4 + rng.standard_normal(prob.shape)).astype(np.float32)
    params = dict(params)
    sched = row_heuristic(prob.row_spec(), emu.device, params.pop("algorithm"), **params)
    y = check_norm("group_norm", prob, sched, rng, ins={"x": x}, tol=4e-6)
    rows = x.reshape(4, -1)
    mean, var = recovered_stats(rows, y.reshape(4, -1), prob.eps)
    xd = rows.astype(np.float64)
    assert (var > 0).all()
    assert np.abs(var / xd.var(axis=1) - 1).max() <= 1e-6
    assert np.abs(mean / xd.mean(axis=1) - 1).max() <= 1e-6


def test_split_counters_reset_themselves(emu, rng):
    prob = problem_of((2, 4, 16, 16), 2)
    sched = row_heuristic(prob.row_spec(), emu.device, "split", tpr=64, chunks=4)
    for _ in range(3):
        check_norm("group_norm", prob, sched, rng)


@pytest.mark.parametrize("call, match", [
    (lambda x, p: jitops.group_norm(x, 4, p, p), "num_groups"),
    (lambda x, p: jitops.group_norm(x, 0, p, p), "num_groups"),
    (lambda x, p: jitops.group_norm(x, 2.0, p, p), "num_groups"),
    (lambda x, p: jitops.group_norm(x, 3, p[:2], p), "gamma"),
    (lambda x, p: jitops.group_norm(x, 3, p, p.reshape(1, 6)), "beta"),
    (lambda x, p: jitops.group_norm(x[0, 0, 0], 3, p, p), "rank"),
    (lambda x, p: jitops.group_norm(x.astype(np.float64), 3, p, p), "x"),
    (lambda x, p: jitops.group_norm(x, 3, p, p, eps="small"), "eps"),
])
def test_errors(call, match):
    x = np.ones((2, 6, 4, 4), np.float32)
    p = np.ones(6, np.float32)
    with pytest.raises(jitops.JitopsError, match=match):
        call(x, p)


# ---- bfloat16 and channels_last (issue 18)

def nhwc_problem(shape, groups, dtype="float32", ptype=None, gamma=True, beta=True):
    p = TensorSpec((shape[1],), ptype or dtype)
    return OP.make_problem({"x": TensorSpec(shape, dtype, "nhwc"), "gamma": p if gamma else None,
                            "beta": p if beta else None}, {"num_groups": groups})


@pytest.mark.parametrize("algorithm", [None, "block", "split", "naive"])
def test_bf16(emu, rng, algorithm):
    check_norm("group_norm", problem_of((2, 6, 5, 7), 3, "bfloat16", "float32"), algorithm, rng)
    check_norm("group_norm", problem_of((2, 8, 5, 4), 4, "bfloat16", "bfloat16"), algorithm, rng)


# NHWC on odd shapes: channel vectors straddling groups (cpg 10 / 5 / 3 with 8-, 4- or 2-wide
# vectors), one channel per group, C not a multiple of any vector (C = 3: scalar), 7x7 planes.
NHWC_CASES = [((2, 40, 6, 6), 4, "bfloat16", "float32"), ((2, 20, 5, 3), 4, "float32", "float32"),
              ((1, 6, 3, 5), 2, "float16", "float16"), ((3, 12, 7, 7), 12, "float32", "float32"),
              ((2, 3, 5, 7), 1, "float32", "float32"), ((2, 24, 7, 7), 8, "bfloat16", "bfloat16")]


@pytest.mark.parametrize("algorithm", [None, "naive"])
def test_nhwc(emu, rng, algorithm):
    for shape, groups, dtype, ptype in NHWC_CASES:
        check_norm("group_norm", nhwc_problem(shape, groups, dtype, ptype), algorithm, rng)


@pytest.mark.parametrize("params", [dict(pixels_per_block=5), dict(pixels_per_block=1, unroll=2),
                                    dict(pixels_per_block=7, threads=64, unroll=1)])
def test_nhwc_grid_reduction(emu, rng, params):
    """Several blocks per sample (the atomic ticket and the merge of partials), a last chunk
    shorter than the others, fewer rows per step than threads allow; three calls through one
    plan (the per-sample counters reset themselves)."""
    from jitops.ops import group_norm_nhwc
    for shape, groups, dtype, ptype in NHWC_CASES[:3]:
        prob = nhwc_problem(shape, groups, dtype, ptype)
        sched = group_norm_nhwc.heuristic(prob, emu.device, "nhwc", **params)
        assert get_op("group_norm").plan(prob, sched, emu.device).launches[0].grid[0] > shape[0]
        for _ in range(3):
            check_norm("group_norm", prob, sched, rng)


def test_nhwc_without_gamma_beta(emu, rng):
    for gamma, beta in ((False, False), (True, False), (False, True)):
        check_norm("group_norm", nhwc_problem((2, 16, 3, 5), 4, gamma=gamma, beta=beta), None, rng)


def test_nhwc_matches_nchw(emu, rng):
    """The same data in both memory formats: the same values, each in its own order."""
    prob = problem_of((2, 32, 5, 6), 8)
    ins = OP.random_inputs(prob, rng)
    y = jitops.group_norm(ins["x"], 8, ins["gamma"], ins["beta"])
    x_nhwc = np.ascontiguousarray(ins["x"].transpose(0, 2, 3, 1))
    y_nhwc = jitops.group_norm(x_nhwc, 8, ins["gamma"], ins["beta"], layout="nhwc")
    assert y_nhwc.shape == (2, 5, 6, 32)
    assert np.abs(y_nhwc.transpose(0, 3, 1, 2) - y).max() <= 4e-6 * np.abs(y).max()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("params", [dict(), dict(pixels_per_block=16)])
def test_nhwc_large_offset(emu, dtype, params):
    """1e4 + N(0, 1) (fp32; bf16: 1e4 + 16 N(0, 1)) through the NHWC statistics: every state is
    relative to an element of its group, so the offset costs no precision (fp32: within 1e-6 of a
    float64 two-pass, recovered from the output)."""
    _check_nhwc_large_offset(emu, dtype, (2, 16, 16, 16), 13, "nhwc", **params)


def _check_nhwc_large_offset(emu, dtype, shape_nchw, seed, algorithm, **params):
    """1e4 + N(0, 1) input (bf16: bf16_offset_data), two groups, no affine: fp32 within 1e-6 of a
    float64 two-pass (recovered from the output), bf16 within its tolerance."""
    from jitops.ops import group_norm_nhwc
    from test_layer_norm import bf16_offset_data
    rng = np.random.default_rng(seed)
    prob = nhwc_problem(shape_nchw, 2, dtype, gamma=False, beta=False)
    shape = prob.inputs()["x"].storage_shape
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32) if dtype == "float32" else bf16_offset_data(rng, shape)
    sched = group_norm_nhwc.heuristic(prob, emu.device, algorithm, **params)
    y = check_norm("group_norm", prob, sched, rng, ins={"x": x}, tol=4e-6 if dtype == "float32" else None)
    if dtype == "float32":
        groups = shape_nchw[0] * 2
        rows = np.moveaxis(x, 3, 1).reshape(groups, -1)
        mean, var = recovered_stats(rows, np.moveaxis(y, 3, 1).reshape(groups, -1), prob.eps)
        xd = rows.astype(np.float64)
        assert np.abs(var / xd.var(axis=1) - 1).max() <= 1e-6
        assert np.abs(mean / xd.mean(axis=1) - 1).max() <= 1e-6


def test_nhwc_torch_channels_last(emu):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 24, 5, 7).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    g, b = torch.randn(24), torch.randn(24)
    y = jitops.group_norm(x, 6, g, b)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    ref = torch.nn.functional.group_norm(x.double(), 6, g.double(), b.double())
    assert float((y.double() - ref).abs().max() / ref.abs().max()) <= 5e-3


def test_nhwc_refuses_row_kernels(emu):
    x = np.ones((2, 4, 4, 8), np.float32)
    with pytest.raises(jitops.ScheduleError, match="nhwc"):
        jitops.group_norm(x, 2, None, None, layout="nhwc", schedule="block")
    with pytest.raises(jitops.ArgumentError, match="layout"):
        jitops.group_norm(x, 2, None, None, layout="nchwc")


def test_nhwc_more_groups_than_threads(emu, rng):
    """One channel per group (instance norm), 96 groups, a block of one warp: the last block's
    merge threads each take several groups; several chunks per sample."""
    from jitops.ops import group_norm_nhwc
    prob = nhwc_problem((2, 96, 5, 5), 96)
    sched = group_norm_nhwc.heuristic(prob, emu.device, "nhwc", threads=emu.device.warp_size, pixels_per_block=3)
    assert get_op("group_norm").plan(prob, sched, emu.device).launches[0].block[0] < 96
    for _ in range(2):
        check_norm("group_norm", prob, sched, rng)


def test_parse_problem_layout():
    """`jitops compile group_norm ... layout=nhwc` (x is the logical N x C x H x W shape)."""
    prob = OP.parse_problem({"x": "2x8x3x5", "num_groups": "2", "layout": "nhwc", "dtype": "bfloat16"})
    assert prob.layout == "nhwc" and prob.inputs()["x"].storage_shape == (2, 3, 5, 8)
    assert OP.parse_problem({"x": "2x8x3x5", "num_groups": "2"}).layout == ""
    with pytest.raises(jitops.ArgumentError, match="layout"):
        OP.parse_problem({"x": "2x8x15", "num_groups": "2", "layout": "nhwc"})
    bn = get_op("batch_norm").parse_problem({"x": "2x8x3x5", "layout": "nhwc"})
    assert bn.layout == "nhwc" and bn.stride_plane == 1


def test_nhwc_misaligned_views(emu, rng):
    """x 2 bytes past a 16-byte boundary: the stats kernel loads element by element, the apply
    kernel takes its scalar path (per-sample coefficients there too)."""
    shape = (2, 4, 5, 16)                                    # N, H, W, C
    base = (rng.standard_normal(int(np.prod(shape)) + 1) * 2 + 0.5).astype(np.float16)
    x = base[1:].reshape(shape)
    prob = nhwc_problem((2, 16, 4, 5), 4, "float16", "float32")
    ins = OP.random_inputs(prob, rng)
    ins["x"] = x
    check_norm("group_norm", prob, None, rng, ins=ins)


# ---- one-launch NHWC group_norm (onchip): the tensor in registers across a per-sample barrier

@pytest.mark.parametrize("case", [
    (((1, 40, 6, 6), 4, "bfloat16", "float32"), dict(threads=32, rows=4, pixels_per_block=20)),
    (((2, 20, 5, 3), 4, "float32", "float32"), dict(threads=32, rows=2, pixels_per_block=8)),
    (((1, 6, 3, 5), 2, "float16", "float16"), dict(threads=64, rows=1, pixels_per_block=9)),
    (((2, 96, 5, 5), 96, "float32", "float32"), dict(threads=32, rows=13, pixels_per_block=13)),
    (((2, 40, 6, 6), 4, "bfloat16", "float32"), dict(threads=32, rows=4, pixels_per_block=20, slice_groups=2, vec=4)),
    (((1, 48, 3, 7), 12, "float16", "float16"), dict(threads=32, rows=2, pixels_per_block=12, slice_groups=3, vec=4)),
])
def test_nhwc_onchip_barrier(emu, rng, case):
    """Two blocks per (sample, channel slice) meeting at the barrier (a last chunk shorter than
    the others, rows beyond the chunk unused, 96 groups merged by fewer threads, slices of 2 and
    3 groups with a barrier each); three calls through one plan: the arrival and departure
    counters reset themselves."""
    from jitops.ops import group_norm_nhwc
    (shape, groups, dtype, ptype), params = case
    prob = nhwc_problem(shape, groups, dtype, ptype)
    sched = group_norm_nhwc.heuristic(prob, emu.device, "onchip", **params)
    launches = get_op("group_norm").plan(prob, sched, emu.device).launches
    slices = groups // params.get("slice_groups", groups)
    assert len(launches) == 1 and launches[0].grid[0] == 2 * shape[0] * slices
    for _ in range(3):
        check_norm("group_norm", prob, sched, rng)


@pytest.mark.parametrize("case", [
    (((2, 40, 6, 6), 4, "float16", "float32"), dict(threads=64, rows=3, pixels_per_block=36, slice_groups=1, vec=2)),
    (((2, 30, 5, 3), 3, "float32", "float32"), dict(threads=32, rows=3, pixels_per_block=15, slice_groups=1, vec=2)),
    (((1, 64, 4, 4), 8, "bfloat16", "bfloat16"), dict(threads=32, rows=1, pixels_per_block=16, slice_groups=2, vec=8)),
])
def test_nhwc_onchip_slices_without_barrier(emu, rng, case):
    """A block per (sample, slice of groups) holding all its pixels: no barrier, no partials in
    global memory; slices of one group (vectors of 2 channels) and of two groups."""
    from jitops.ops import group_norm_nhwc
    (shape, groups, dtype, ptype), params = case
    prob = nhwc_problem(shape, groups, dtype, ptype)
    sched = group_norm_nhwc.heuristic(prob, emu.device, "onchip", **params)
    launch = get_op("group_norm").plan(prob, sched, emu.device).launches[0]
    assert dict(launch.params)["chunks"] == 1
    assert launch.grid[0] == shape[0] * groups // params["slice_groups"]
    for _ in range(3):
        check_norm("group_norm", prob, sched, rng)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nhwc_onchip_large_offset(emu, dtype):
    """1e4 + N(0, 1) through the one-launch kernel with two chunks: fp32 within 1e-6 of a float64
    two-pass (recovered from the output); bf16 within its tolerance."""
    _check_nhwc_large_offset(emu, dtype, (1, 16, 12, 12), 17, "onchip", threads=64, rows=5, pixels_per_block=72)


def test_nhwc_onchip_without_gamma_beta_and_misaligned(emu, rng):
    from jitops.ops import group_norm_nhwc
    for gamma, beta in ((False, False), (True, False), (False, True)):
        prob = nhwc_problem((1, 16, 3, 5), 4, gamma=gamma, beta=beta)
        check_norm("group_norm", prob, group_norm_nhwc.heuristic(prob, emu.device, "onchip", threads=32, rows=2,
                                                                 pixels_per_block=8), rng)
    base = (rng.standard_normal(1 * 4 * 5 * 16 + 1) * 2 + 0.5).astype(np.float16)
    prob = nhwc_problem((1, 16, 4, 5), 4, "float16", "float32")
    ins = OP.random_inputs(prob, rng)
    ins["x"] = base[1:].reshape(1, 4, 5, 16)                 # 2 bytes past a 16-byte boundary
    check_norm("group_norm", prob, group_norm_nhwc.heuristic(prob, emu.device, "onchip", threads=32, rows=5,
                                                             pixels_per_block=10), rng, ins=ins)


def test_nhwc_onchip_choice_on_sm90():
    """No compile: on an H100/H200 (132 SMs) groups of at most 64 KB take a block each (no
    barrier), larger ones chunks of 160-byte slices behind a barrier with the grid resident,
    the 21 MB and 103 MB tensors the two launches; a forced grid too large is refused."""
    from jitops.device import KNOWN_TARGETS
    from jitops.errors import ScheduleError
    from jitops.ops import group_norm_nhwc, group_norm_onchip
    from jitops.ops.base import ITEMSIZE
    dev = KNOWN_TARGETS["sm_90"]
    expect = {(2, 1280, 8, 8): ("onchip", 1, 1), (2, 640, 16, 16): ("onchip", 1, 1),
              (2, 320, 32, 32): ("onchip", 1, 1), (2, 320, 64, 64): ("onchip", None, None),
              (8, 320, 64, 64): ("nhwc", None, None), (256, 64, 56, 56): ("nhwc", None, None)}
    for shape, (alg, gs, chunks) in expect.items():
        for dtype in ("float16", "bfloat16", "float32"):
            prob = nhwc_problem(shape, 32, dtype, "float32")
            sched = OP.heuristic(prob, dev)
            assert sched.algorithm == alg, (shape, dtype, sched)
            if alg != "onchip":
                continue
            launch = OP.plan(prob, sched, dev).launches[0]
            params = dict(launch.params)
            if gs is not None:
                assert params["slice_groups"] == gs and params["chunks"] == chunks, (shape, dtype, params)
            else:
                assert params["chunks"] > 1 and params["slice_groups"] * (shape[1] // 32) * ITEMSIZE[dtype] >= 160
                minb = params["min_blocks"]
                assert launch.grid[0] <= dev.multiprocessors * minb and minb * launch.block[0] <= 1024
    prob = nhwc_problem((2, 320, 64, 64), 32, "float16", "float32")
    with pytest.raises(ScheduleError, match="resident"):
        group_norm_nhwc.heuristic(prob, dev, "onchip", threads=256, rows=1, pixels_per_block=6)
    big = nhwc_problem((8, 320, 64, 64), 32, "float16")
    assert all(int(s["pixels_per_block"]) >= 4096 for _, s in group_norm_onchip.options(big, dev))
