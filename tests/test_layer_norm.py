"""layer_norm on the emulator (warp 32 and 64) against float64 references: every strategy and
statistic, odd sizes, one-element rows, rows longer than a block, large offsets, misaligned
views, repeated split calls (self-resetting counters) and argument errors.

The helpers at the top (norm_call, check_norm, recovered_stats) serve the other norm tests too.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

from conftest import rel_error
from jitops.bench.layer_norm import call as norm_call   # the public call for any norm problem


def check_norm(op_name: str, problem: Any, schedule: Schedule | str | None, rng: np.random.Generator,
               ins: Mapping[str, np.ndarray] | None = None, tol: float | None = None) -> np.ndarray:
    """Run once into a NaN-poisoned output; compare with the op's float64 reference."""
    op = get_op(op_name)
    ins = dict(ins) if ins is not None else op.random_inputs(problem, rng)
    ref = op.reference(problem, ins)["y"]
    out = np.full(problem.inputs()["x"].storage_shape, np.nan, dtype=problem.dtype)
    y = norm_call(op_name, problem, ins, out=out, schedule=schedule)
    assert y is out
    assert not np.isnan(y).any(), f"{problem.shape} {schedule}: elements left unwritten"
    if tol is None:
        sched = schedule if isinstance(schedule, Schedule) else \
            op.heuristic(problem, jitops.get_backend().device, schedule)
        tol = op.tolerance(problem, sched)[0]
    err = rel_error(y, ref)
    assert err <= tol, f"{op_name} {problem.shape} {problem.dtype} {schedule}: error {err:.3g} > {tol:.3g}"
    return y


def recovered_stats(x: np.ndarray, y: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance each row was normalized with, recovered from y = (x - mean) * rstd by a
    float64 least-squares fit (rows as the first axis)."""
    xd = x.astype(np.float64)
    yd = y.astype(np.float64)
    xm = xd.mean(axis=1, keepdims=True)
    slope = ((xd - xm) * yd).sum(axis=1) / ((xd - xm) ** 2).sum(axis=1)
    mean = xm[:, 0] - yd.mean(axis=1) / slope
    return mean, 1.0 / slope ** 2 - eps


def bf16_offset_data(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Large-offset data that bf16 can still tell apart: 1e4 + 16 N(0, 1) (bf16 spacing is 64 at
    1e4, so a handful of distinct values, offset / spread ~ 300). An unshifted fp32 sum of squares
    loses the variance here; fp32 statistics shifted by an element of the row do not."""
    return (1e4 + 16 * rng.standard_normal(shape)).astype("bfloat16")


def problem_of(shape, nshape, dtype="float32", ptype=None, gamma=True, beta=True, eps=1e-5):
    op = get_op("layer_norm")
    dims = (nshape,) if isinstance(nshape, int) else tuple(nshape)
    p = TensorSpec(dims, ptype or dtype)
    return op.make_problem({"x": TensorSpec(shape, dtype), "gamma": p if gamma else None,
                            "beta": p if beta else None}, {"normalized_shape": nshape, "eps": eps})


SHAPES = [((5, 37), 37), ((3, 4, 24), (4, 24)), ((4, 1), 1), ((2, 2, 300), 300)]


@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_strategies(emu, rng, algorithm):
    for shape, nshape in SHAPES[:3] if algorithm in ("stream", "split") else SHAPES:
        check_norm("layer_norm", problem_of(shape, nshape), algorithm, rng)


@pytest.mark.parametrize("algorithm", [None, "split", "naive"])
def test_half(emu, rng, algorithm):
    check_norm("layer_norm", problem_of((3, 2, 200), (2, 200), "float16", "float32"), algorithm, rng)
    check_norm("layer_norm", problem_of((7, 96), 96, "float16", "float16"), algorithm, rng)


@pytest.mark.parametrize("params", [
    dict(algorithm="warp", tpr=8, stats="welford"),                  # several rows per warp
    dict(algorithm="warp", tpr=4, stats="sumsq"),
    dict(algorithm="block", tpr=64, stats="welford"),                # 8 vectors per thread
    dict(algorithm="block", tpr=64, stats="sumsq"),
    dict(algorithm="block", tpr=192, stats="welford"),               # 3 or 6 warps: not a power of two
    dict(algorithm="block", tpr=128, store="smem"),                  # the row in shared memory
    dict(algorithm="block", tpr=64, waves=1),                        # fewer blocks than rows: loop
    dict(algorithm="stream", tpr=64, unroll=2, stats="sumsq"),       # rows longer than the block
    dict(algorithm="stream", tpr=128, unroll=4, waves=1),
    dict(algorithm="split", tpr=64, unroll=2, chunks=3),             # grid reduction
    dict(algorithm="split", tpr=64, unroll=1, chunks=7, stats="sumsq"),
    dict(algorithm="split", tpr=192, unroll=1, chunks=3),
])
def test_forced_schedules(emu, rng, params):
    from jitops.ops.norm_common import row_heuristic
    params = dict(params)
    alg = params.pop("algorithm")
    for shape in ((3, 2052),):
        prob = problem_of(shape, shape[-1])
        sched = row_heuristic(prob.row_spec(), emu.device, alg, **params)
        check_norm("layer_norm", prob, sched, rng)


@pytest.mark.parametrize("params", [
    dict(algorithm="block", tpr=64),                                 # one row per block, 2052 wide
    dict(algorithm="block", tpr=64, stats="welford"),
    dict(algorithm="warp", tpr=8, stats="sumsq"),                    # several rows per warp, some idle
])
def test_prefetch_next_row(emu, rng, params):
    """Persistent grid (one block per multiprocessor) with the next row loaded ahead: many rows
    per block, a row count that leaves the last pass of blocks partly idle."""
    from jitops.ops.norm_common import row_heuristic
    params = dict(params)
    alg = params.pop("algorithm")
    sms = emu.device.multiprocessors
    rows = 7 * sms + 3 if alg == "block" else 7 * sms * (emu.device.warp_size // 8) + 5
    length = 2052 if alg == "block" else 100
    prob = problem_of((rows, length), length)
    sched = row_heuristic(prob.row_spec(), emu.device, alg, per_sm=1, prefetch=True, **params)
    plan = get_op("layer_norm").plan(prob, sched, emu.device)
    assert plan.launches[0].grid[0] == sms < rows
    check_norm("layer_norm", prob, sched, rng)


LARGE_OFFSET = [
    dict(algorithm="warp"), dict(algorithm="warp", stats="welford"),
    dict(algorithm="block"), dict(algorithm="block", stats="welford"), dict(algorithm="block", stats="sumsq"),
    dict(algorithm="block", store="smem", tpr=256),
    dict(algorithm="block", per_sm=1, prefetch=True),
    dict(algorithm="stream", tpr=128), dict(algorithm="split", tpr=128, chunks=4),
]


@pytest.mark.parametrize("params", LARGE_OFFSET)
def test_large_offset_statistics(emu, params):
    """Seed 003: data 1e4 + N(0, 1). The variance must stay positive and within 1e-6 (relative)
    of a float64 two-pass, and so must the output (the mean carries no offset rounding)."""
    from jitops.ops.norm_common import row_heuristic
    rng = np.random.default_rng(7)
    length = 256 if params["algorithm"] == "warp" else 4096
    x = (1e4 + rng.standard_normal((4, length))).astype(np.float32)
    prob = problem_of(x.shape, length, gamma=False, beta=False)
    params = dict(params)
    sched = row_heuristic(prob.row_spec(), emu.device, params.pop("algorithm"), **params)
    y = check_norm("layer_norm", prob, sched, rng, ins={"x": x}, tol=4e-6)
    mean, var = recovered_stats(x, y, prob.eps)
    xd = x.astype(np.float64)
    assert (var > 0).all()
    assert np.abs(var / xd.var(axis=1) - 1).max() <= 1e-6
    assert np.abs(mean / xd.mean(axis=1) - 1).max() <= 1e-6


def test_one_pass_without_shift_would_fail():
    """Why the statistics are shifted: fp32 sum / sum of squares of 1e4 + N(0, 1) is useless."""
    x = (1e4 + np.random.default_rng(7).standard_normal(4096)).astype(np.float32)
    var = np.float32((x * x).sum(dtype=np.float32) / 4096) - np.float32(x.sum(dtype=np.float32) / 4096) ** 2
    assert abs(var - x.astype(np.float64).var()) > 0.5


def test_split_counters_reset_themselves(emu, rng):
    """Three calls through one prepared split plan, different data each time: a counter left
    non-zero would keep the last block from finishing, and the output would be stale."""
    from jitops.ops.norm_common import row_heuristic
    prob = problem_of((3, 3000), 3000)
    sched = row_heuristic(prob.row_spec(), emu.device, "split", tpr=64, chunks=5)
    for _ in range(3):
        check_norm("layer_norm", prob, sched, rng)


def test_misaligned_views(emu, rng):
    base = rng.standard_normal(6 * 256 + 1).astype(np.float32)
    x = base[1:].reshape(6, 256)                        # 4 bytes past a 16-byte boundary
    prob = problem_of(x.shape, 256, gamma=False, beta=False)
    for alg in ("warp", "block", "stream", "split"):
        check_norm("layer_norm", prob, alg, rng, ins={"x": x})


def test_shapes_and_kinds(emu, rng):
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)
    y = jitops.layer_norm(x, [40])
    assert y.shape == x.shape and y.dtype == np.float32
    g = rng.standard_normal(40).astype(np.float32)
    y2 = jitops.layer_norm(x, 40, g)
    assert rel_error(y2, y.astype(np.float64) * g) <= 1e-6
    assert jitops.layer_norm(np.empty((0, 8), np.float32), 8).shape == (0, 8)
    torch = pytest.importorskip("torch")
    t = torch.randn(4, 33)
    assert torch.allclose(jitops.layer_norm(t, 33), torch.nn.functional.layer_norm(t, (33,)), atol=2e-6)


@pytest.mark.parametrize("call, match", [
    (lambda x, g: jitops.layer_norm(x, 7, g), "normalized_shape"),
    (lambda x, g: jitops.layer_norm(x, (2, 16), g), "normalized_shape"),
    (lambda x, g: jitops.layer_norm(x, "16", g), "normalized_shape"),
    (lambda x, g: jitops.layer_norm(x, 16, g[:8]), "gamma"),
    (lambda x, g: jitops.layer_norm(x, 16, g, g.astype(np.float16)), "dtype"),
    (lambda x, g: jitops.layer_norm(x, 16, g.astype(np.float64)), "gamma"),
    (lambda x, g: jitops.layer_norm(x.astype(np.int32), 16), "x"),
    (lambda x, g: jitops.layer_norm(x, 16, eps=-1.0), "eps"),
    (lambda x, g: jitops.layer_norm(x, 16, schedule="fused"), "fused"),
    (lambda x, g: jitops.layer_norm(x, 16, schedule=Schedule.make("stream", vec=4, tpr=64, unroll=2,
                                                                  stats="two_pass")), "two_pass"),
])
def test_errors(call, match):
    assert_refused(call, match)


def assert_refused(call, match):
    """call(x, gamma) on a (3, 16) float32 input raises a JitopsError matching `match`."""
    with pytest.raises(jitops.JitopsError, match=match):
        call(np.ones((3, 16), np.float32), np.ones(16, np.float32))


# ---- bfloat16 (issue 18): tolerances from bf16's 8 significant bits (norm_common.row_tolerance)

@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_bf16(emu, rng, algorithm):
    """bf16 activations with fp32 parameters (mixed precision as models keep them) and with bf16
    parameters; fp32 statistics."""
    check_norm("layer_norm", problem_of((3, 2, 200), (2, 200), "bfloat16", "float32"), algorithm, rng)
    if algorithm in (None, "naive"):
        check_norm("layer_norm", problem_of((7, 96), 96, "bfloat16", "bfloat16"), algorithm, rng)


@pytest.mark.parametrize("algorithm", ["warp", "block", "stream", "split"])
def test_bf16_large_offset(emu, algorithm):
    rng = np.random.default_rng(5)
    length = 256 if algorithm == "warp" else 2048
    x = bf16_offset_data(rng, (3, length))
    prob = problem_of(x.shape, length, "bfloat16", gamma=False, beta=False)
    y = check_norm("layer_norm", prob, algorithm, rng, ins={"x": x})
    assert np.abs(np.asarray(y, np.float64)).max() > 1.0     # normalized, not flattened to zero


def test_bf16_refuses_fp16_parameters(rng):
    x = np.ones((3, 16), "bfloat16")
    with pytest.raises(jitops.ArgumentError, match="gamma"):
        jitops.layer_norm(x, 16, np.ones(16, np.float16))


def test_bf16_torch_tensors(emu):
    torch = pytest.importorskip("torch")
    t = torch.randn(5, 64).to(torch.bfloat16)
    g = torch.randn(64)
    y = jitops.layer_norm(t, 64, g)
    assert y.dtype == torch.bfloat16
    ref = torch.nn.functional.layer_norm(t.double(), (64,), g.double())
    assert float((y.double() - ref).abs().max() / ref.abs().max()) <= 5e-3
