"""attention on heads-inner storage ([B, S, H, D], layout "bshd"), read and written in place.

Every kernel family addresses q / out and k / v through the same two layouts; these tests run
each family on the emulator against the float64 reference of the transposed ([B, H, S, D])
arrays, with outputs poisoned first. Tolerances as in test_attention (relative to max |ref|).
"""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

from conftest import rel_error

op = get_op("attention")
TOL = {"float32": 2e-5, "float16": 2e-3}
DECODE = dict(warps=4, row_groups=1, block_k=64, key_warps=4)


def heads_first(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(a.transpose(0, 2, 1, 3))


def reference(q, k, v, mask=None, causal=False):
    """float64 attention of [B, S, H, D] arrays, as [B, S, H, D]."""
    data = {"q": heads_first(q), "k": heads_first(k), "v": heads_first(v), "mask": mask}
    specs = {n: (TensorSpec(a.shape, a.dtype.name) if a is not None else None) for n, a in data.items()}
    problem = op.make_problem(specs, {"causal": causal, "scale": None})
    return op.reference(problem, data)["out"].transpose(0, 2, 1, 3)


def make(rng, b, sq, sk, h, hk, d, dtype, mask=False):
    q = rng.standard_normal((b, sq, h, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hk, d)).astype(dtype)
    m = rng.standard_normal((sq, sk)).astype("float32") if mask else None
    return q, k, v, m


def run_bshd(q, k, v, mask, schedule, causal=False):
    out = np.full(q.shape, np.nan, dtype=q.dtype)
    got = jitops.attention(q, k, v, mask, causal=causal, layout="bshd", out=out, schedule=schedule)
    assert got is out and not np.isnan(out).any(), "output elements left unwritten"
    err = rel_error(out, reference(q, k, v, mask, causal))
    assert err <= TOL[q.dtype.name], f"{schedule}: error {err:.3g}"
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", ["fused", "three_stage", "naive"])
def test_simt_kernels_read_and_write_bshd(emu, rng, dtype, algorithm):
    q, k, v, m = make(rng, 2, 37, 53, 4, 2, 64, dtype, mask=True)
    run_bshd(q, k, v, m, algorithm, causal=True)
    q, k, v, _ = make(rng, 1, 19, 19, 3, 3, 32, dtype)
    run_bshd(q, k, v, None, algorithm)


@pytest.mark.parametrize("d", [64, 40])
def test_fused_mma_prefill_bshd(mma_emu, rng, d):
    """16-byte rows (D=64) and the element path (D=40, padded to 48), causal with a mask."""
    q, k, v, m = make(rng, 2, 37, 53, 4, 2, d, "float16", mask=d == 64)
    run_bshd(q, k, v, m, "fused_mma", causal=True)


@pytest.mark.parametrize("extra", [{}, {"splits": 3}, {"splits": 2, "tma": 1, "stages": 3}])
def test_fused_mma_decoding_bshd(mma_emu, rng, extra):
    """GQA heads packed into one row set (a new head every Sq rows of [B, S, H, D] q), keys split
    over warps and blocks (the merge kernel writes the heads-inner output), the TMA ring's tiles."""
    q, k, v, _ = make(rng, 2, 3, 300, 8, 2, 64, "float16")
    run_bshd(q, k, v, None, Schedule.make("fused_mma", **DECODE, pack=True, **extra), causal="bottom_right")


def test_layout_changes_the_problem_key(emu):
    spec = {"q": TensorSpec((2, 4, 16, 64), "float16"), "k": TensorSpec((2, 4, 16, 64), "float16"),
            "v": TensorSpec((2, 4, 16, 64), "float16"), "mask": None}
    bshd = {n: (TensorSpec(s.shape, s.dtype, "bshd") if s else None) for n, s in spec.items()}
    plain, inner = op.make_problem(spec, {}), op.make_problem(bshd, {})
    assert plain.key() != inner.key() and ":bshd" in inner.key()
    assert inner.outputs()["out"].storage_shape == (2, 16, 4, 64)
    parsed = op.parse_problem({"q": "2x4x16x64", "dtype": "float16", "layout": "bshd"})
    assert parsed.key() == inner.key()


def test_bad_layouts_name_the_argument(emu, rng):
    q, k, v, _ = make(rng, 1, 8, 8, 2, 2, 32, "float32")
    with pytest.raises(ArgumentError, match="'layout'"):
        jitops.attention(q, k, v, layout="nhwc")
    with pytest.raises(ArgumentError, match="'q'.*4-d"):
        jitops.attention(q[0], k[0], v[0], layout="bshd")
    with pytest.raises(ArgumentError, match="'v'.*k's memory layout"):
        op.make_problem({"q": TensorSpec((1, 2, 8, 32), "float32", "bshd"),
                         "k": TensorSpec((1, 2, 8, 32), "float32", "bshd"),
                         "v": TensorSpec((1, 2, 8, 32), "float32")}, {})


def test_torch_transposed_views_are_read_in_place(emu, rng):
    """q.transpose(1, 2) of a contiguous [B, S, H, D] tensor (what SDPA users pass) needs no
    declaration; the result is the same kind of view. Mixed layouts (q heads-inner, a [B, H, S, D]
    KV cache) work, and repeat calls never reuse a plan made for the other layout."""
    torch = pytest.importorskip("torch")
    q, k, v, _ = make(rng, 2, 21, 21, 4, 2, 32, "float32")
    want = reference(q, k, v)
    tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
    assert not tq.is_contiguous()
    for _ in range(2):                        # the second call takes the repeat path
        out = jitops.attention(tq, tk, tv)
        assert out.shape == (2, 4, 21, 32) and out.transpose(1, 2).is_contiguous()
        assert rel_error(out.transpose(1, 2).numpy(), want) <= TOL["float32"]
    ck, cv = tk.contiguous(), tv.contiguous()
    for _ in range(2):
        mixed = jitops.attention(tq, ck, cv)
        assert rel_error(mixed.transpose(1, 2).numpy(), want) <= TOL["float32"]
    for _ in range(2):
        plain = jitops.attention(tq.contiguous(), ck, cv)
        assert plain.is_contiguous() and rel_error(plain.transpose(1, 2).numpy(), want) <= TOL["float32"]
