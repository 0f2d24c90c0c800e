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
