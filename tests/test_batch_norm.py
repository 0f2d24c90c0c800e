"""batch_norm on the emulator (warp 32 and 64) against float64: layouts (whole-vector planes,
planes that straddle vectors, rank 2 and rank 5), activations, fp16 and mixed-precision
parameters, missing gamma/beta, re-folding when parameters change, large running means, errors."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

from conftest import rel_error
from test_layer_norm import check_norm

OP = get_op("batch_norm")


def problem_of(shape, dtype="float32", ptype=None, activation=None, alpha=0.1, gamma=True, beta=True, eps=1e-5):
    p = TensorSpec((shape[1],), ptype or dtype)
    return OP.make_problem({"x": TensorSpec(shape, dtype), "mean": p, "var": p, "gamma": p if gamma else None,
                            "beta": p if beta else None}, {"activation": activation, "alpha": alpha, "eps": eps})


SHAPES = [(2, 16, 8, 8), (2, 3, 5, 7), (5, 8), (3, 5), (2, 3, 2, 3, 4), (1, 1, 1, 3)]


@pytest.mark.parametrize("dtype,ptype", [("float32", "float32"), ("float16", "float32")])
@pytest.mark.parametrize("algorithm", ["folded", "naive"])
def test_layouts(emu, rng, dtype, ptype, algorithm):
    for shape in SHAPES:
        check_norm("batch_norm", problem_of(shape, dtype, ptype), algorithm, rng)


def test_half_parameters(emu, rng):
    for shape in SHAPES[:3]:
        check_norm("batch_norm", problem_of(shape, "float16", "float16"), None, rng)


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_fused_activation(emu, rng, activation):
    for shape in [(2, 16, 8, 8), (2, 3, 5, 7)]:
        prob = problem_of(shape, activation=activation, alpha=0.2)
        y = check_norm("batch_norm", prob, None, rng)
        assert (y < 0).any() if activation == "leaky_relu" else (y >= 0).all()
        check_norm("batch_norm", prob, "naive", rng)


@pytest.mark.parametrize("params", [
    dict(vec=4, unroll=2, block=128, waves=1, streaming=True),      # grid-stride with a capped grid
    dict(vec=2, unroll=4, block=64, waves=0, streaming=False),
    dict(vec=4, unroll=1, block=256, waves=0, streaming=False, index="int64"),
])
def test_forced_schedules(emu, rng, params):
    sched = Schedule.make("folded", **params)
    for shape in [(4, 16, 20, 20), (3, 5, 7, 3)]:
        check_norm("batch_norm", problem_of(shape), sched, rng)


def test_without_gamma_beta(emu, rng):
    for gamma, beta in ((False, False), (True, False), (False, True)):
        check_norm("batch_norm", problem_of((2, 4, 3, 5), gamma=gamma, beta=beta), None, rng)


def test_refolds_when_parameters_change(emu, rng):
    """The folded (k, a, b) are recomputed when mean/var/gamma/beta change, and only then."""
    prob = problem_of((2, 4, 6, 6))
    ins = OP.random_inputs(prob, rng)
    check_norm("batch_norm", prob, None, rng, ins=ins)
    ins["gamma"][1] *= -3.0           # in place: same array, new contents
    ins["var"][2] += 1.0
    check_norm("batch_norm", prob, None, rng, ins=ins)
    ins["x"] = rng.standard_normal(prob.shape).astype(np.float32)
    check_norm("batch_norm", prob, None, rng, ins=ins)


def test_large_running_mean(emu):
    """x = 1e4 + N(0, 1) with running mean 1e4: (x - k) * a + b keeps full precision where the
    seed's x * a + (beta - mean * a) would lose about 1e4 * 2^-24 of a unit."""
    rng = np.random.default_rng(3)
    prob = problem_of((2, 4, 8, 8))
    ins = OP.random_inputs(prob, rng)
    ins["x"] = (1e4 + rng.standard_normal(prob.shape)).astype(np.float32)
    ins["mean"] = (1e4 + 0.1 * rng.standard_normal(4)).astype(np.float32)
    check_norm("batch_norm", prob, None, rng, ins=ins, tol=1e-6)


def test_kinds_and_empty(emu, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    p = np.ones(3, np.float32)
    y = jitops.batch_norm(x, p * 0, p, p, p * 0)
    assert rel_error(y, x / np.sqrt(1 + 1e-5)) <= 1e-6
    assert jitops.batch_norm(np.empty((0, 3, 4), np.float32), p, p, p, p).shape == (0, 3, 4)
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 5, 5)
    m, v, g, b = torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)
    ref = torch.nn.functional.batch_norm(t, m, v, g, b, training=False, eps=1e-5)
    assert torch.allclose(jitops.batch_norm(t, m, v, g, b), ref, atol=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda x, p: jitops.batch_norm(x[0, 0, 0], p, p, p, p), "rank"),
    (lambda x, p: jitops.batch_norm(x, p[:2], p, p, p), "mean"),
    (lambda x, p: jitops.batch_norm(x, p, None, p, p), "var"),
    (lambda x, p: jitops.batch_norm(x, p, p, p.astype(np.float16), p), "dtype"),
    (lambda x, p: jitops.batch_norm(x.astype(np.float16), p.astype(np.float64), p, p, p), "mean"),
    (lambda x, p: jitops.batch_norm(x, p, p, p, p, activation="gelu"), "activation"),
    (lambda x, p: jitops.batch_norm(x, p, p, p, p, activation="leaky_relu", alpha=float("nan")), "alpha"),
    (lambda x, p: jitops.batch_norm(x, p, p, p, p, eps=float("inf")), "eps"),
    (lambda x, p: jitops.batch_norm(x, p, p, p, p, schedule="split"), "split"),
])
def test_errors(call, match):
    x = np.ones((2, 3, 4, 4), np.float32)
    p = np.ones(3, np.float32)
    with pytest.raises(jitops.JitopsError, match=match):
        call(x, p)


# ---- bfloat16 and channels_last (issue 18)

def nhwc_problem(shape, dtype="float32", ptype="float32", activation=None):
    p = TensorSpec((shape[1],), ptype)
    return OP.make_problem({"x": TensorSpec(shape, dtype, "nhwc"), "mean": p, "var": p, "gamma": p, "beta": p},
                           {"activation": activation, "alpha": 0.1})


@pytest.mark.parametrize("algorithm", ["folded", "naive"])
def test_bf16(emu, rng, algorithm):
    for shape in SHAPES[:3]:
        check_norm("batch_norm", problem_of(shape, "bfloat16", "float32"), algorithm, rng)
    check_norm("batch_norm", problem_of((2, 16, 8, 8), "bfloat16", "bfloat16", "relu"), algorithm, rng)


# NHWC: channels a multiple of the vector (rowwise, float4 coefficients), C = 3 and 12 (vectors
# straddle pixels: compare-and-increment), one channel, a fused activation.
@pytest.mark.parametrize("algorithm", ["folded", "naive"])
def test_nhwc(emu, rng, algorithm):
    for shape, dtype, act in (((2, 16, 5, 7), "float32", None), ((2, 40, 3, 3), "bfloat16", "leaky_relu"),
                              ((2, 3, 5, 7), "float32", "relu"), ((1, 12, 3, 3), "float16", None),
                              ((2, 1, 4, 4), "float32", None)):
        check_norm("batch_norm", nhwc_problem(shape, dtype, activation=act), algorithm, rng)


def test_nhwc_torch_channels_last(emu):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 24, 5, 7).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    m, v, g, b = torch.randn(24), torch.rand(24) + 0.5, torch.randn(24), torch.randn(24)
    y = jitops.batch_norm(x, m, v, g, b)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    ref = torch.nn.functional.batch_norm(x.double(), m.double(), v.double(), g.double(), b.double())
    assert float((y.double() - ref).abs().max() / ref.abs().max()) <= 5e-3
