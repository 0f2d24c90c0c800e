"""rms_norm on the emulator (warp 32 and 64) against float64: every strategy, odd sizes,
one-element rows, rows longer than a block, fp16 and mixed-precision gamma, large offsets (the
mean of squares has nothing to cancel), the split path's self-resetting counters, errors."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.ops.norm_common import row_heuristic

from test_layer_norm import check_norm

OP = get_op("rms_norm")


def problem_of(shape, nshape, dtype="float32", ptype=None, gamma=True, eps=1e-6):
    dims = (nshape,) if isinstance(nshape, int) else tuple(nshape)
    p = TensorSpec(dims, ptype or dtype) if gamma else None
    return OP.make_problem({"x": TensorSpec(shape, dtype), "gamma": p}, {"normalized_shape": nshape, "eps": eps})


SHAPES = [((5, 37), 37), ((3, 4, 24), (4, 24)), ((4, 1), 1), ((2, 2, 300), 300)]


@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_strategies(emu, rng, algorithm):
    for shape, nshape in SHAPES[:3] if algorithm in ("stream", "split") else SHAPES:
        check_norm("rms_norm", problem_of(shape, nshape), algorithm, rng)


@pytest.mark.parametrize("algorithm", [None, "split"])
def test_half(emu, rng, algorithm):
    check_norm("rms_norm", problem_of((3, 2, 200), (2, 200), "float16", "float32"), algorithm, rng)
    check_norm("rms_norm", problem_of((7, 96), 96, "float16", "float16"), algorithm, rng)
    check_norm("rms_norm", problem_of((7, 96), 96, "float16", gamma=False), algorithm, rng)


@pytest.mark.parametrize("params", [
    dict(algorithm="block", tpr=64), dict(algorithm="block", tpr=128, store="smem"),
    dict(algorithm="stream", tpr=64, unroll=2), dict(algorithm="split", tpr=64, unroll=2, chunks=6),
])
def test_rows_longer_than_a_block(emu, rng, params):
    params = dict(params)
    prob = problem_of((3, 2052), 2052)
    check_norm("rms_norm", prob, row_heuristic(prob.row_spec(), emu.device, params.pop("algorithm"), **params), rng)


def test_large_offset(emu):
    rng = np.random.default_rng(5)
    x = (1e4 + rng.standard_normal((4, 1024))).astype(np.float32)
    for alg in ("warp", "block", "split"):
        check_norm("rms_norm", problem_of(x.shape, 1024, gamma=False), alg, rng, ins={"x": x}, tol=2e-6)


def test_split_counters_reset_themselves(emu, rng):
    prob = problem_of((2, 3000), 3000)
    sched = row_heuristic(prob.row_spec(), emu.device, "split", tpr=64, chunks=4)
    for _ in range(3):
        check_norm("rms_norm", prob, sched, rng)


def test_matches_torch(emu):
    torch = pytest.importorskip("torch")
    if not hasattr(torch.nn.functional, "rms_norm"):
        pytest.skip("torch without rms_norm")
    t, g = torch.randn(6, 40), torch.randn(40)
    ref = torch.nn.functional.rms_norm(t, (40,), g, eps=1e-6)
    assert torch.allclose(jitops.rms_norm(t, 40, g), ref, atol=2e-6)


@pytest.mark.parametrize("call, match", [
    (lambda x, g: jitops.rms_norm(x, 8, g), "normalized_shape"),
    (lambda x, g: jitops.rms_norm(x, 16, g[:3]), "gamma"),
    (lambda x, g: jitops.rms_norm(x, 16, g.astype(np.int32)), "gamma"),
    (lambda x, g: jitops.rms_norm(x, [], g), "normalized_shape"),
    (lambda x, g: jitops.rms_norm(x, 16, g, eps=float("nan")), "eps"),
    (lambda x, g: jitops.rms_norm(x, 16, g, schedule=jitops.Schedule.make("block", vec=4, tpr=64, items=1,
                                                                         block=64, stats="welford")), "stats"),
])
def test_errors(call, match):
    from test_layer_norm import assert_refused
    assert_refused(call, match)


# ---- bfloat16 (issue 18)

@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_bf16(emu, rng, algorithm):
    check_norm("rms_norm", problem_of((3, 2, 200), (2, 200), "bfloat16", "float32"), algorithm, rng)
    if algorithm in (None, "naive"):
        check_norm("rms_norm", problem_of((7, 96), 96, "bfloat16", "bfloat16"), algorithm, rng)


def test_bf16_large_offset(emu):
    from test_layer_norm import bf16_offset_data
    rng = np.random.default_rng(3)
    x = bf16_offset_data(rng, (3, 1024))
    check_norm("rms_norm", problem_of(x.shape, 1024, "bfloat16", gamma=False), None, rng, ins={"x": x})
