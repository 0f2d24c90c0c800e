"""attention on heads-inner storage ([B, S, H, D] "bshd", [S, B, H, D] "sbhd"), read and written in place.

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


ORDER = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3)}     # storage axes in logical [B, H, S, D] terms
LAYOUTS = list(ORDER)


def heads_first(a: np.ndarray | None, layout: str = "bshd") -> np.ndarray | None:
    """Storage-order data as [B, H, S, D]."""
    return None if a is None else np.ascontiguousarray(a.transpose(np.argsort(ORDER[layout])))


def reference(q, k, v, mask=None, causal=False, layout="bshd"):
    """float64 attention of storage-order arrays, in storage order."""
    data = {"q": heads_first(q, layout), "k": heads_first(k, layout), "v": heads_first(v, layout), "mask": mask}
    specs = {n: (TensorSpec(a.shape, a.dtype.name) if a is not None else None) for n, a in data.items()}
    problem = op.make_problem(specs, {"causal": causal, "scale": None})
    return op.reference(problem, data)["out"].transpose(ORDER[layout])


def make(rng, b, sq, sk, h, hk, d, dtype, mask=False, layout="bshd"):
    """q, k, v in `layout`'s storage order (from [B, H, S, D] draws), an optional [Sq, Sk] mask."""
    def draw(heads, s):
        return np.ascontiguousarray(rng.standard_normal((b, heads, s, d)).astype(dtype).transpose(ORDER[layout]))
    q, k, v = draw(h, sq), draw(hk, sk), draw(hk, sk)
    m = rng.standard_normal((sq, sk)).astype("float32") if mask else None
    return q, k, v, m


def run_bshd(q, k, v, mask, schedule, causal=False, layout="bshd"):
    out = np.full(q.shape, np.nan, dtype=q.dtype)
    got = jitops.attention(q, k, v, mask, causal=causal, layout=layout, out=out, schedule=schedule)
    assert got is out and not np.isnan(out).any(), "output elements left unwritten"
    err = rel_error(out, reference(q, k, v, mask, causal, layout))
    assert err <= TOL[q.dtype.name], f"{schedule} {layout}: error {err:.3g}"
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", ["fused", "three_stage", "naive"])
def test_simt_kernels_read_and_write_heads_inner(emu, rng, dtype, algorithm, layout):
    q, k, v, m = make(rng, 2, 37, 53, 4, 2, 64, dtype, mask=True, layout=layout)
    run_bshd(q, k, v, m, algorithm, causal=True, layout=layout)
    q, k, v, _ = make(rng, 1, 19, 19, 3, 3, 32, dtype, layout=layout)
    run_bshd(q, k, v, None, algorithm, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d", [64, 40])
def test_fused_mma_prefill_heads_inner(mma_emu, rng, d, layout):
    """16-byte rows (D=64) and the element path (D=40, padded to 48), causal with a mask."""
    q, k, v, m = make(rng, 2, 37, 53, 4, 2, d, "float16", mask=d == 64, layout=layout)
    run_bshd(q, k, v, m, "fused_mma", causal=True, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("extra", [{}, {"splits": 3}, {"splits": 2, "tma": 1, "stages": 3}])
def test_fused_mma_decoding_heads_inner(mma_emu, rng, extra, layout):
    """GQA heads packed into one row set (a new head every Sq rows of a heads-inner q), keys split
    over warps and blocks (the merge kernel writes the heads-inner output), the TMA ring's tiles."""
    q, k, v, _ = make(rng, 2, 3, 300, 8, 2, 64, "float16", layout=layout)
    run_bshd(q, k, v, None, Schedule.make("fused_mma", **DECODE, pack=True, **extra), causal="bottom_right",
             layout=layout)


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


def test_torch_sequence_first_views_are_read_in_place(emu, rng):
    """x.permute(1, 2, 0, 3) of a contiguous [S, B, H, D] tensor (nn.MultiheadAttention's projections)
    is read as "sbhd"; the result is the same kind of view; a declared layout="sbhd" array too."""
    torch = pytest.importorskip("torch")
    q, k, v, _ = make(rng, 2, 21, 21, 4, 2, 32, "float32", layout="sbhd")
    want = reference(q, k, v, layout="sbhd")
    tq, tk, tv = (torch.from_numpy(a).permute(1, 2, 0, 3) for a in (q, k, v))
    for _ in range(2):
        out = jitops.attention(tq, tk, tv)
        assert out.shape == (2, 4, 21, 32) and out.permute(2, 0, 1, 3).is_contiguous()
        assert rel_error(out.permute(2, 0, 1, 3).numpy(), want) <= TOL["float32"]
    assert op.parse_problem({"q": "2x4x16x64", "layout": "sbhd"}).inputs()["q"].storage_shape == (16, 2, 4, 64)
