"""leaky_relu numerics on the emulator (both warp sizes) against a float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.ops.base import Schedule

from conftest import rel_error

SIZES = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4097, 65537]
# One rounding of alpha * x to the output type: half an ulp relative (fp32 2^-24, fp16 2^-11),
# measured against the largest |reference| value.
TOL = {"float32": 1.2e-7, "float16": 1e-3}


def reference(x: np.ndarray, alpha: float) -> np.ndarray:
    xd = x.astype(np.float64)
    return np.where(xd > 0, xd, alpha * xd)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", ["vectorized", "naive"])
def test_sizes(emu, rng, dtype, algorithm):
    for n in SIZES:
        x = rng.standard_normal(n).astype(dtype)
        out = np.full(n, np.nan, dtype=dtype)   # poison: an unwritten element stays NaN
        y = jitops.leaky_relu(x, 0.2, out=out, schedule=algorithm)
        assert y is out
        assert not np.isnan(y).any(), f"n={n}: elements left unwritten"
        assert rel_error(y, reference(x, 0.2)) <= TOL[dtype], f"n={n}"


def test_exact_fp32_matches_numpy_float32_arithmetic(emu, rng):
    x = rng.standard_normal(100003).astype(np.float32)
    y = jitops.leaky_relu(x, 0.1)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.abs(y - np.where(x > 0, x, 0.1 * x)).max() == 0.0


@pytest.mark.parametrize("offset", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_misaligned_views(emu, rng, dtype, offset):
    base = rng.standard_normal(10000).astype(dtype)
    x = base[offset:]                      # not 16-byte aligned
    y = jitops.leaky_relu(x, 0.05)
    assert rel_error(y, reference(x, 0.05)) <= TOL[dtype]
    # Same misalignment for input and output: the vector body runs after a scalar head.
    out_base = np.full(10000, np.nan, dtype=dtype)
    out = out_base[offset:]
    jitops.leaky_relu(x, 0.05, out=out)
    assert np.isnan(out_base[:offset]).all(), "wrote before the output view"
    assert rel_error(out, reference(x, 0.05)) <= TOL[dtype]


@pytest.mark.parametrize("params", [
    dict(vec=4, unroll=2, block=128, waves=1),            # grid-stride loop with a capped grid
    dict(vec=2, unroll=8, block=512, waves=0),
    dict(vec=4, unroll=1, block=256, waves=0, index="int64"),
    dict(vec=4, unroll=4, block=256, waves=0, streaming=True),
])
def test_forced_schedules(emu, rng, params):
    x = rng.standard_normal(50001).astype(np.float32)
    y = jitops.leaky_relu(x, 0.3, schedule=Schedule.make("vectorized", **params))
    assert rel_error(y, reference(x, 0.3)) <= TOL["float32"]


def test_special_values(emu):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38], dtype=np.float32)
    y = jitops.leaky_relu(x, 0.5)
    ref = np.where(x > 0, x, np.float32(0.5) * x)
    np.testing.assert_array_equal(y, ref)
    assert np.signbit(y[4])  # -0.0 stays -0.0


def test_shapes_are_kept(emu, rng):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    y = jitops.leaky_relu(x)
    assert y.shape == (3, 5, 7)
    assert rel_error(y, reference(x, 0.01)) <= TOL["float32"]
    empty = np.empty((0, 4), dtype=np.float32)
    assert jitops.leaky_relu(empty).shape == (0, 4)


def test_torch_cpu_tensors(emu):
    torch = pytest.importorskip("torch")
    x = torch.randn(1001)
    y = jitops.leaky_relu(x, 0.1)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert torch.equal(y, torch.nn.functional.leaky_relu(x, 0.1))


def test_device_array(emu, rng):
    x = rng.standard_normal(777).astype(np.float32)
    dx = jitops.to_device(x)
    dy = jitops.leaky_relu(dx, 0.1)
    assert isinstance(dy, jitops.DeviceArray)
    assert rel_error(dy.numpy(), reference(x, 0.1)) <= TOL["float32"]


# ---- bfloat16 and channels_last (issue 18): bf16 keeps 8 significant bits, one rounding of
# alpha * x is at most 2^-8 (3.9e-3) relative.

@pytest.mark.parametrize("algorithm", ["vectorized", "naive"])
def test_bf16_sizes(emu, rng, algorithm):
    for n in SIZES:
        x = rng.standard_normal(n).astype("bfloat16")
        out = np.full(n, np.nan, dtype="bfloat16")
        y = jitops.leaky_relu(x, 0.2, out=out, schedule=algorithm)
        assert not np.isnan(np.asarray(y, np.float32)).any(), f"n={n}: elements left unwritten"
        assert rel_error(y, reference(x, 0.2)) <= 4e-3, f"n={n}"
    # positive values pass through bit for bit
    pos = np.abs(x) + np.asarray(1, "bfloat16")
    assert (jitops.leaky_relu(pos, 0.2).view(np.uint16) == pos.view(np.uint16)).all()


def test_nhwc_arrays_keep_their_layout(emu, rng):
    x = rng.standard_normal((2, 5, 7, 3)).astype(np.float16)      # N, H, W, C
    y = jitops.leaky_relu(x, 0.1, layout="nhwc")
    assert y.shape == (2, 5, 7, 3)
    assert rel_error(y, reference(x, 0.1)) <= TOL["float16"]
    with pytest.raises(jitops.ArgumentError, match="layout"):
        jitops.leaky_relu(x, 0.1, layout="chw")


def test_torch_channels_last_bf16(emu):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 6, 5, 7).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y = jitops.leaky_relu(x, 0.1)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, torch.nn.functional.leaky_relu(x, 0.1))


@pytest.mark.parametrize("dtype, params", [("float32", dict(unroll=2, block=128)), ("float16", dict(unroll=1, block=64)),
                                           ("bfloat16", dict(unroll=8, block=64))])
def test_tiled(emu, rng, dtype, params):
    """Contiguous tiles per block: full tiles without bounds checks, a partial last tile, the
    scalar tail, and misaligned views (scalar head) at sizes around a tile's edge."""
    vec = 16 // np.dtype(dtype if dtype != "bfloat16" else "float16").itemsize
    tile = vec * params["unroll"] * params["block"]
    sched = Schedule.make("vectorized", vec=vec, waves=0, tiled=True, **params)
    tol = {"float32": 1.2e-7, "float16": 1e-3, "bfloat16": 5e-3}[dtype]
    for n in (tile, 3 * tile, 3 * tile + 1, 2 * tile - vec - 3, 5):
        base = rng.standard_normal(n + 1).astype(dtype)
        for x, out in ((base[:n], np.full(n, np.nan, dtype)), (base[1:], np.full(n + 1, np.nan, dtype)[1:])):
            y = jitops.leaky_relu(x, 0.2, out=out, schedule=sched)
            assert y is out and not np.isnan(y.astype(np.float32)).any(), f"n={n}: elements left unwritten"
            assert rel_error(y, reference(x, 0.2)) <= tol, f"n={n}"


def test_tiled_refuses_waves():
    from jitops.device import KNOWN_TARGETS
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    op = get_op("leaky_relu")
    p = op.make_problem({"x": TensorSpec((4096,), "float32")}, {})
    with pytest.raises(jitops.ScheduleError, match="waves"):
        op.plan(p, Schedule.make("vectorized", vec=4, unroll=1, block=128, waves=2, tiled=True), KNOWN_TARGETS["sm_90"])


def test_heuristic_streams_only_just_past_l2():
    """Evict-first accesses where the data moved is past L2 but at most two L2s (fastest there on the H200,
    2-6% slower from 2.6 L2s on): 16M fp16 (64 MB moved) streams; 8M fp16 (fits), 32M fp16 and 268M fp32 do not."""
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    hopper = jitops.get_backend(target="sm_90").device
    op = get_op("leaky_relu")

    def streams(n, dtype):
        return bool(op.heuristic(op.make_problem({"x": TensorSpec((n,), dtype)}, {}), hopper).get("streaming"))
    assert streams(1 << 24, "float16")
    assert not streams(1 << 23, "float16")
    assert not streams(1 << 25, "float16")
    assert not streams(1 << 28, "float32")
