"""layer_norm / rms_norm with a residual (ONNX SkipLayerNormalization): y = norm(x + residual [+ bias])
and the sum output, on the emulator (warp 32 and 64) against float64 references of the sum rounded to
x's dtype; every rows strategy (warp, block in registers and shared memory, persistent prefetch,
stream, split, naive), fp32 / fp16 / bf16, outputs poisoned with NaN, argument errors."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError
from jitops.ops import get_op
from jitops.ops.base import TensorSpec
from jitops.ops.norm_common import row_heuristic

from conftest import rel_error


def skip_problem(op_name, shape, dtype="float32", ptype=None, residual=True, bias=True, return_sum=True,
                 btype=None):
    op = get_op(op_name)
    n = shape[-1]
    p = TensorSpec((n,), ptype or dtype)
    ins = {"x": TensorSpec(shape, dtype), "gamma": p, "residual": TensorSpec(shape, dtype) if residual else None,
           "bias": TensorSpec((n,), btype or ptype or dtype) if bias else None}
    if op_name == "layer_norm":
        ins["beta"] = p
    return op.make_problem(ins, {"normalized_shape": n, "return_sum": return_sum})


def run_skip(op_name, problem, schedule, rng):
    """One call into NaN-poisoned outputs; y against the float64 reference, sum exactly."""
    op = get_op(op_name)
    ins = op.random_inputs(problem, rng)
    ref = op.reference(problem, ins)
    y = np.full(problem.shape, np.nan, dtype=problem.dtype)
    s = np.full(problem.shape, np.nan, dtype=problem.dtype)
    kw = dict(residual=ins.get("residual"), bias=ins.get("bias"), return_sum=problem.has_sum,
              out=(y, s) if problem.has_sum else y, schedule=schedule)
    if op_name == "layer_norm":
        got = jitops.layer_norm(ins["x"], problem.normalized_shape, ins["gamma"], ins["beta"], **kw)
    else:
        got = jitops.rms_norm(ins["x"], problem.normalized_shape, ins["gamma"], **kw)
    if problem.has_sum:
        assert got[0] is y and got[1] is s
        assert not np.isnan(s).any(), "sum elements left unwritten"
        np.testing.assert_array_equal(s.astype(np.float64), ref["sum"].astype(np.float64))
    else:
        assert got is y
    assert not np.isnan(y).any(), f"{schedule}: y elements left unwritten"
    sched = schedule if not isinstance(schedule, (str, type(None))) else \
        op.heuristic(problem, jitops.get_backend().device, schedule)
    tol = op.tolerance(problem, sched)[0]
    err = rel_error(y, ref["y"])
    assert err <= tol, f"{op_name} {problem.shape} {problem.dtype} {schedule}: error {err:.3g} > {tol:.3g}"
    # The residual matters: the same call without it is far off (a dropped term would pass otherwise).
    plain = op.reference(problem, {**ins, "residual": np.zeros_like(ins["x"])} if problem.has_skip else
                         {**ins, "bias": np.zeros_like(ins["bias"])})["y"]
    assert rel_error(y, plain) > 50 * tol
    return y


@pytest.mark.parametrize("algorithm", [None, "warp", "block", "stream", "split", "naive"])
def test_layer_skip_strategies(emu, rng, algorithm):
    for shape in ((5, 40), (2, 3, 96)):
        run_skip("layer_norm", skip_problem("layer_norm", shape), algorithm, rng)
    # fp16 with fp32 parameters and bias, no sum output
    run_skip("layer_norm", skip_problem("layer_norm", (4, 64), "float16", "float32", return_sum=False),
             algorithm, rng)


@pytest.mark.parametrize("stats", ["welford", "sumsq"])
def test_layer_skip_stats(emu, rng, stats):
    prob = skip_problem("layer_norm", (6, 72))
    spec = prob.row_spec()
    dev = emu.device
    for sched in (row_heuristic(spec, dev, "warp", stats=stats), row_heuristic(spec, dev, "stream", stats=stats),
                  row_heuristic(spec, dev, "split", stats=stats, tpr=dev.warp_size, chunks=2)):
        run_skip("layer_norm", prob, sched, rng)


def test_layer_skip_onchip_forms(emu, rng):
    """Shared-memory rows and the persistent grid that prefetches the next row (and its residual)."""
    dev = emu.device
    prob = skip_problem("layer_norm", (9, 256), "float16")
    spec = prob.row_spec()
    run_skip("layer_norm", prob, row_heuristic(spec, dev, "block", store="smem", tpr=dev.warp_size), rng)
    run_skip("layer_norm", prob, row_heuristic(spec, dev, "warp", tpr=8, per_sm=1, prefetch=True), rng)
    run_skip("layer_norm", prob, row_heuristic(spec, dev, "block", tpr=dev.warp_size, per_sm=1, prefetch=True),
             rng)


def test_layer_skip_bf16_and_partial(emu, rng):
    run_skip("layer_norm", skip_problem("layer_norm", (3, 128), "bfloat16", "float32"), None, rng)
    run_skip("layer_norm", skip_problem("layer_norm", (3, 48), bias=False), None, rng)
    run_skip("layer_norm", skip_problem("layer_norm", (3, 48), residual=False), "block", rng)


@pytest.mark.parametrize("algorithm", [None, "stream", "split", "naive"])
def test_rms_skip(emu, rng, algorithm):
    run_skip("rms_norm", skip_problem("rms_norm", (4, 96)), algorithm, rng)
    run_skip("rms_norm", skip_problem("rms_norm", (3, 64), "float16", bias=False), algorithm, rng)


def test_skip_returns_pair_and_misaligned(emu, rng):
    """Without `out`: (y, sum) of new arrays; an odd offset view (element-wise path) agrees."""
    prob = skip_problem("layer_norm", (4, 33), bias=False)
    ins = get_op("layer_norm").random_inputs(prob, rng)
    ref = get_op("layer_norm").reference(prob, ins)
    big = np.concatenate([np.zeros(1, np.float32), ins["residual"].reshape(-1)])
    residual = big[1:].reshape(ins["residual"].shape)      # 4-byte aligned only
    for _ in range(2):      # the second call takes the repeat path (native entry) when it exists
        y, s = jitops.layer_norm(ins["x"], 33, ins["gamma"], ins["beta"], residual=residual, return_sum=True)
        np.testing.assert_array_equal(s, ref["sum"])
        assert rel_error(y, ref["y"]) <= 4e-6


def test_skip_errors(emu, rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    with pytest.raises(ArgumentError, match="residual"):
        jitops.layer_norm(x, 16, residual=x[:, :8].copy())
    with pytest.raises(ArgumentError, match="residual"):
        jitops.layer_norm(x, 16, residual=x.astype(np.float16))
    with pytest.raises(ArgumentError, match="bias"):
        jitops.layer_norm(x, 16, residual=x, bias=np.ones(8, np.float32))
    with pytest.raises(ArgumentError, match="return_sum"):
        jitops.layer_norm(x, 16, return_sum=True)
    with pytest.raises(ArgumentError, match="out"):
        jitops.layer_norm(x, 16, residual=x, return_sum=True, out=np.empty_like(x))


def test_pointer_runner_two_outputs(emu, rng):
    """The path ORT's GPU providers take (pointers by input and output name): y and sum both written."""
    from jitops.pointer_runner import pointer_runner
    prob = skip_problem("layer_norm", (4, 64))
    op = get_op("layer_norm")
    ins = op.random_inputs(prob, rng)
    ref = op.reference(prob, ins)
    y = np.full(prob.shape, np.nan, np.float32)
    s = np.full(prob.shape, np.nan, np.float32)
    attrs = {"normalized_shape": (64,), "eps": prob.eps, "return_sum": True}
    run = pointer_runner("layer_norm", prob.inputs(), attrs, emu)
    run({**{k: v.ctypes.data for k, v in ins.items()}, "y": y.ctypes.data, "sum": s.ctypes.data}, 0)
    np.testing.assert_array_equal(s, ref["sum"])
    assert rel_error(y, ref["y"]) <= 4e-6
