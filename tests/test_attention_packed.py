"""attention on q / k / v sliced out of one packed projection, read in place (layout "bshd" with a row pitch).

Models hand SDPA strided views of one [B, S, (H + 2 Hk) D] projection: timm's ViT
(`qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)`), GPT-2 (`c_attn(x).split(E, 2)` then
`.view(B, S, H, D).transpose(1, 2)`) and fused-qkv GQA models (q: H heads, k / v: Hk heads, one row pitch).
Every kernel family the emulator runs reads them against the float64 reference of the same data made
contiguous, into NaN-poisoned outputs; pitches off 16 bytes take the plain-load paths; a plan bound for
one pitch never runs on a dense view or another pitch (the repeat paths' signatures, and the native
format check on the probe backend).
"""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops import arrays, engine
from jitops.errors import ArgumentError
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec

from conftest import rel_error

torch = pytest.importorskip("torch")
op = get_op("attention")
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
DECODE = dict(warps=4, row_groups=1, block_k=64, key_warps=4, pack=True)


def timm_views(b, s, h, d, dtype, hk=None):
    """q, k, v as timm's ViT makes them: one [B, S, 3 H D] projection, reshaped and unbound."""
    qkv = torch.randn(b, s, 3 * h * d).to(dtype)
    return qkv.reshape(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)


def gpt2_views(b, s, h, d, dtype, hk=None):
    """q, k, v as GPT-2 makes them: c_attn(x).split(E, dim=2), each .view(B, S, H, D).transpose(1, 2)."""
    e = h * d
    return tuple(t.view(b, s, h, d).transpose(1, 2) for t in torch.randn(b, s, 3 * e).to(dtype).split(e, dim=2))


def gqa_views(b, s, h, d, dtype, hk=2, extra=0, offset=0):
    """A fused-qkv GQA projection: rows of (H + 2 Hk) D (+ extra) elements, q then k then v; `offset`
    elements into the row (a view off alignment)."""
    pitch = (h + 2 * hk) * d + extra
    rows = torch.randn(b, s, pitch + offset).to(dtype)[..., offset:]
    cuts = (0, h * d, (h + hk) * d, (h + 2 * hk) * d)
    heads = (h, hk, hk)
    return tuple(rows[..., lo:hi].unflatten(2, (n, d)).transpose(1, 2) for lo, hi, n in zip(cuts, cuts[1:], heads))


STYLES = {"timm": timm_views, "gpt2": gpt2_views, "gqa": gqa_views}


def reference(q, k, v, mask=None, causal=False) -> np.ndarray:
    """float64 attention of the views' values, [B, H, Sq, D]."""
    data = {n: t.contiguous().double().numpy() for n, t in (("q", q), ("k", k), ("v", v))}
    data["mask"] = None if mask is None else mask.double().numpy()
    specs = {n: (TensorSpec(a.shape, "float32") if a is not None else None) for n, a in data.items()}
    return op.reference(op.make_problem(specs, {"causal": causal}), data)["out"]


def poisoned_out(q):
    """A NaN-filled output as attention writes it for a bshd q: dense [B, Sq, H, D], viewed [B, H, Sq, D]."""
    b, h, s, d = q.shape
    return torch.full((b, s, h, d), float("nan"), dtype=q.dtype).transpose(1, 2)


def check(q, k, v, mask=None, causal=False, schedule=None, tol=None, **kw):
    out = poisoned_out(q)
    got = jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule, **kw)
    assert got is out and not torch.isnan(out).any(), f"{schedule}: output elements left unwritten"
    err = rel_error(out.double().numpy(), reference(q, k, v, mask, causal))
    assert err <= (tol or TOL[q.dtype]), f"{schedule}: error {err:.3g}"
    return out


@pytest.mark.parametrize("style", list(STYLES))
def test_views_are_read_as_pitched_bshd(style):
    q, k, v = STYLES[style](2, 9, 4, 16, torch.float32)
    pitch = {"timm": 3 * 4 * 16, "gpt2": 3 * 4 * 16, "gqa": 8 * 16}[style]
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert arrays.memory_format(t) == ("bshd", pitch)
        ref = arrays.wrap(t, name, "attention")
        assert (ref.layout, ref.pitch, ref.shape) == ("bshd", pitch, tuple(t.shape))
        # the bytes it spans: from its first element to its last
        assert ref.nbytes == ((2 * 9 - 1) * pitch + t.shape[1] * 16) * 4


def test_one_batch_takes_any_batch_stride(emu):
    """B == 1: the batch stride is never used, so any is accepted (a slice of a larger buffer)."""
    h, s, d, pitch = 4, 9, 32, 3 * 128
    rows = torch.randn(12345 + s * pitch)
    q, k, v = (rows.as_strided((1, h, s, d), (12345, d, pitch, 1), off) for off in (0, h * d, 2 * h * d))
    assert arrays.memory_format(q) == ("bshd", pitch) and not q.is_contiguous()
    check(q, k, v, causal=True, schedule="fused")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("algorithm", ["fused", "three_stage", "naive"])
def test_simt_kernels_on_packed_views(emu, dtype, algorithm):
    q, k, v = timm_views(2, 37, 4, 32, dtype)
    mask = torch.randn(37, 37)
    check(q, k, v, mask, causal=True, schedule=algorithm)
    q, k, v = gqa_views(1, 29, 4, 32, dtype, hk=2)
    check(q, k, v, schedule=algorithm)
    q, k, v = gpt2_views(2, 19, 3, 32, dtype)
    check(q, k, v, causal=True, schedule=algorithm)


@pytest.mark.parametrize("style", list(STYLES))
def test_fused_mma_prefill_on_packed_views(mma_emu, style):
    """fp16 on the matrix-core kernel: 16-byte rows, causal with a mask, and D = 40 (padded to 48)."""
    q, k, v = STYLES[style](2, 37, 4, 64, torch.float16)
    check(q, k, v, torch.randn(2, 1, 37, 37), causal=True, schedule="fused_mma")
    q, k, v = STYLES[style](1, 45, 2, 40, torch.float16)
    check(q, k, v, schedule="fused_mma")


@pytest.mark.parametrize("extra", [{}, {"splits": 3}, {"splits": 2, "tma": 1, "stages": 3}])
def test_fused_mma_decoding_with_a_packed_kv(mma_emu, extra):
    """Sq = 1..3 query rows of 8 heads packed per kv head (a new head every Sq rows, q's rows a pitch
    apart, out's dense), keys split over warps and blocks (the merge writes the dense output)."""
    for sq in (1, 3):
        q, _, _ = gqa_views(2, sq, 8, 64, torch.float16, hk=2)
        _, k, v = gqa_views(2, 300, 8, 64, torch.float16, hk=2)
        check(q, k, v, causal="bottom_right", schedule=Schedule.make("fused_mma", **DECODE, **extra))


def test_fused_tf32_on_packed_views(mma_emu):
    q, k, v = gqa_views(2, 40, 4, 32, torch.float32, hk=2)
    check(q, k, v, torch.randn(2, 1, 1, 40), schedule=Schedule.make("fused_tf32", warps=2, block_k=16),
          precision="tf32", tol=4e-3)


@pytest.mark.parametrize("extra,offset", [(4, 0), (0, 3), (1, 1)])
def test_pitches_off_16_bytes_take_the_plain_paths(mma_emu, extra, offset):
    """Rows (H + 2 Hk) D + extra elements apart (fp16: not a multiple of 16 bytes), or bases off 16 bytes:
    the 16-byte copies are skipped, the result is the same."""
    q, k, v = gqa_views(2, 37, 4, 64, torch.float16, hk=2, extra=extra, offset=offset)
    check(q, k, v, causal=True, schedule="fused_mma")
    check(q, k, v, schedule=Schedule.make("fused_mma", **DECODE, splits=2, tma=1, stages=3))
    check(q, k, v, schedule="fused")


def test_repeat_calls_never_mix_pitches(emu):
    """The same op called with dense views, packed views, another pitch and dense again: each call runs a
    plan made for its own memory layout (the bound plan's signature carries the pitch)."""
    dense = tuple(torch.randn(2, 21, 4, 32).transpose(1, 2) for _ in range(3))
    timm = timm_views(2, 21, 4, 32, torch.float32)
    gqa = gqa_views(2, 21, 4, 32, torch.float32, hk=4, extra=8)
    for views in (dense, timm, dense, gqa, timm, dense, gqa):
        want = reference(*views)
        for _ in range(2):                                  # the second call takes the repeat path
            out = jitops.attention(*views)
            assert out.transpose(1, 2).is_contiguous()
            assert rel_error(out.numpy(), want) <= TOL[torch.float32]
    keys = {k for k in engine._cache.bound if k[0] == "attention"}
    formats = {e[-1] for key in keys for e in key if isinstance(e, tuple) and len(e) == 5}
    assert {"bshd", ("bshd", 384), ("bshd", 392)} <= formats


def test_the_native_format_check_tells_pitches_apart(probe):
    """On the native repeat path (probe backend: launches recorded, nothing runs) a dense [B, S, H, D] view,
    a packed one and one of another pitch each launch their own plan's kernel."""
    dense = tuple(torch.randn(2, 21, 4, 32).transpose(1, 2) for _ in range(3))
    packed = timm_views(2, 21, 4, 32, torch.float32)
    other = gqa_views(2, 21, 4, 32, torch.float32, hk=4, extra=8)
    kernels = {}
    for name, views in (("dense", dense), ("packed", packed), ("other", other)):
        jitops.attention(*views)                           # general path: binds
        kernels[name] = probe.native.probe_last(1)[1]
    assert len(set(kernels.values())) == 3
    assert len(engine._cache.dispatch["attention"]) == 3
    for name, views in (("packed", packed), ("dense", dense), ("other", other), ("packed", packed)):
        before = probe.native.probe_last(1)[0]
        out = jitops.attention(*views)
        calls, kernel = probe.native.probe_last(1)[:2]
        assert calls == before + 1 and kernel == kernels[name], name
        assert out.transpose(1, 2).is_contiguous()


def test_pitch_is_part_of_the_problem_and_its_key():
    def spec(shape, layout="bshd", pitch=0):
        return TensorSpec(shape, "float16", layout, pitch)
    dense = op.make_problem({"q": spec((2, 4, 16, 64)), "k": spec((2, 4, 16, 64)), "v": spec((2, 4, 16, 64))}, {})
    packed = op.make_problem({"q": spec((2, 4, 16, 64), pitch=768), "k": spec((2, 4, 16, 64), pitch=768),
                              "v": spec((2, 4, 16, 64), pitch=768)}, {})
    assert dense.key() != packed.key() and ":pitch768" in packed.key()
    assert (packed.q_pitch, packed.kv_pitch) == (768, 768)
    assert packed.q_strides() == (16 * 768, 64, 768) and packed.out_strides() == (16 * 256, 64, 256)
    assert packed.outputs()["out"] == TensorSpec((2, 4, 16, 64), "float16", "bshd")
    assert op.parse_problem({"q": "2x4x16x64", "dtype": "float16", "layout": "bshd", "pitch": "768"}).key() == packed.key()
    same = op.make_problem({"q": spec((2, 4, 16, 64), pitch=256), "k": spec((2, 4, 16, 64)),
                            "v": spec((2, 4, 16, 64))}, {})
    assert same.key() == dense.key()            # a pitch of H * D is the dense layout: one key
    with pytest.raises(ArgumentError, match="'v'.*k's row pitch"):
        op.make_problem({"q": spec((2, 4, 16, 64)), "k": spec((2, 4, 16, 64), pitch=768),
                         "v": spec((2, 4, 16, 64), pitch=1024)}, {})
    with pytest.raises(ArgumentError, match="'q'.*row pitch only for"):
        op.make_problem({"q": spec((2, 4, 16, 64), "", 768), "k": spec((2, 4, 16, 64), ""),
                         "v": spec((2, 4, 16, 64), "")}, {})


def test_random_inputs_and_reference_read_packed_rows(rng):
    """The tuner's data for a pitched problem: whole packed rows, the reference reading its columns."""
    p = op.parse_problem({"q": "1x2x5x8", "k": "1x1x5x8", "layout": "bshd", "pitch": "32", "dtype": "float32"})
    data = op.random_inputs(p, rng)
    assert data["q"].shape == (1, 5, 32) and data["k"].shape == (1, 5, 32)
    dense = {n: np.ascontiguousarray(data[n][..., :w].reshape(1, 5, w // 8, 8)) for n, w in (("q", 16), ("k", 8),
                                                                                               ("v", 8))}
    plain = op.parse_problem({"q": "1x2x5x8", "k": "1x1x5x8", "layout": "bshd", "dtype": "float32"})
    assert np.array_equal(op.reference(p, data)["out"], op.reference(plain, dense)["out"])
    assert p.inputs()["q"].span_nbytes == (4 * 32 + 16) * 4


def test_unsupported_strides_name_the_argument():
    """Heads interleaved with their q / k / v parts (a [B, S, H, 3 D] projection: head stride 3 D) is not a
    row pitch: refused with what is accepted."""
    b, s, h, d = 2, 7, 4, 8
    q, k, v = (t.transpose(1, 2) for t in torch.randn(b, s, h, 3 * d).split(d, dim=3))
    with pytest.raises(ArgumentError, match="'q'.*packed q/k/v projection.*strides"):
        jitops.attention(q, k, v)
    q, k, v = timm_views(2, 7, 4, 8, torch.float32)
    with pytest.raises(ArgumentError, match="'k'.*packed"):
        jitops.attention(q, k[:, :, ::2], v[:, :, ::2])


class _DeviceView:
    """A __cuda_array_interface__ object (as CuPy and Numba export it) over made-up device memory."""

    def __init__(self, shape, strides, typestr="<f2"):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": typestr,
                                         "data": (1 << 20, False), "version": 3}


def test_device_arrays_with_a_row_pitch_are_classified():
    b, s, h, d, p = 2, 9, 4, 16, 3 * 64
    ref = arrays.wrap(_DeviceView((b, h, s, d), (s * p * 2, d * 2, p * 2, 2)), "q", "attention")
    assert (ref.layout, ref.pitch, ref.nbytes) == ("bshd", p, ((b * s - 1) * p + h * d) * 2)
    dense = arrays.wrap(_DeviceView((b, h, s, d), (s * h * d * 2, d * 2, h * d * 2, 2)), "q", "attention")
    assert (dense.layout, dense.pitch) == ("bshd", 0)
    with pytest.raises(ArgumentError, match="'q'.*packed projection"):
        arrays.wrap(_DeviceView((b, h, s, d), (s * p * 2, d * 2 * 3, p * 2, 2)), "q", "attention")


def test_c_contiguous_device_arrays_of_any_rank_stay_plain():
    """C-contiguous __cuda_array_interface__ arrays (CuPy's default) of rank 1-4, strides given or None, are
    plain arrays: no layout, no pitch, their own size (a rank-1 CuPy array once failed the pitch test)."""
    for shape in ((1_000_003,), (7, 5), (2, 3, 4), (2, 4, 9, 16)):
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * 4 for i in range(len(shape)))
        for st in (strides, None):
            ref = arrays.wrap(_DeviceView(shape, st, "<f4"), "x", "leaky_relu")
            assert (ref.layout, ref.pitch, ref.nbytes) == ("", 0, int(np.prod(shape)) * 4)


def test_tuning_a_packed_problem_checks_and_records_its_pitch(isolated):
    """jitops.tune on packed views: candidates run on whole packed rows (random_inputs), are checked
    against float64, and the record's problem key names the pitch (a dense problem never finds it)."""
    from jitops.runtime import get_backend, use_backend
    from jitops import records
    with use_backend(get_backend("cpu", warp_size=32)) as cpu:
        q, k, v = gqa_views(1, 24, 4, 32, torch.float32, hk=2)
        r = jitops.tune("attention", q=q, k=k, v=v, max_candidates=2, workers=1, budget=None)
        assert r.source == "tuned" and ":pitch256" in r.key and r.problem.kv_pitch == 256
        assert all(c.status == "ok" for c in r.candidates)
        assert next(c for c in r.candidates if c.schedule == r.schedule).checked is True
        assert records.store().find(cpu.device, "attention", r.key, op.SPACE) is not None
        dense = r.key.replace(":pitch256", "")
        assert records.store().find(cpu.device, "attention", dense, op.SPACE) is None


def test_strided_device_arrays_are_refused_where_the_op_reads_c_order(emu):
    """A [B, S, H, D] __cuda_array_interface__ array reaching an op that reads C order only is refused (no
    copy is made of a foreign device array)."""
    b, s, h, d = 2, 9, 4, 16
    with pytest.raises(ArgumentError, match="'x'.*C-contiguous device array"):
        jitops.leaky_relu(_DeviceView((b, h, s, d), (s * h * d * 2, d * 2, h * d * 2, 2)))
