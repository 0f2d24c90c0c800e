"""attention numerics on the emulator (warp 32 and 64) against a float64 reference.

Tolerances are relative to max |reference| (inputs of order 1):
- fp32: fp32 dot products and sums, exp2 on the SFU (a few ulp): 2e-5.
- fp16: inputs are exact in the reference; the output is rounded to fp16 (2^-11 of the largest value)
  and the matrix-core kernel also rounds P to fp16 before P V: 2e-3.
- bf16: the same roundings with an 8-bit significand (2^-9, 8x fp16's half ulp): 1.6e-2.
The matrix-core kernel runs on the emulator with its fragments done in software (warp 32: NVIDIA's
mma.sync layouts, warp 64: AMD's MFMA layouts); the public emulator device has no matrix cores
and refuses that schedule.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec
from jitops.runtime import use_backend
from jitops.runtime.cpu_backend import CpuBackend

from conftest import nvrtc_ptx, rel_error

op = get_op("attention")
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
SIMT = ("fused", "three_stage", "naive")


@pytest.fixture
def mma_emu_device(emu):
    """The emulator of `emu`'s warp size with matrix-core fragments emulated (tests only)."""
    backend = CpuBackend(warp_size=emu.device.warp_size, checked=True)
    backend.device = dataclasses.replace(backend.device, matrix_cores=True)
    return backend


def make(rng, q_shape, kv_shape, dtype="float32", mask_shape=None, mask_dtype="float32"):
    if "bfloat16" in (dtype, mask_dtype):
        pytest.importorskip("ml_dtypes")
    data = {"q": rng.standard_normal(q_shape).astype(dtype), "k": rng.standard_normal(kv_shape).astype(dtype),
            "v": rng.standard_normal(kv_shape).astype(dtype), "mask": None}
    if mask_shape is not None:
        data["mask"] = rng.standard_normal(mask_shape).astype(mask_dtype)
    return data


def expected(data, causal=False, scale=None):
    specs = {n: (TensorSpec(a.shape, a.dtype.name) if a is not None else None) for n, a in data.items()}
    problem = op.make_problem(specs, {"causal": causal, "scale": scale})
    return op.reference(problem, data)["out"]


def _select(data, schedule):
    from jitops.engine import select_schedule
    specs = {n: (TensorSpec(a.shape, a.dtype.name) if a is not None else None) for n, a in data.items()}
    problem = op.make_problem(specs, {"causal": False, "scale": None})
    return select_schedule(op, problem, jitops.get_backend().device, schedule)


def run_checked(data, schedule, causal=False, scale=None, tol=None):
    """Run into a NaN-poisoned output; every element must be written and match float64."""
    out = np.full(data["q"].shape, np.nan, dtype=data["q"].dtype)
    got = jitops.attention(data["q"], data["k"], data["v"], data["mask"], causal=causal, scale=scale, out=out,
                           schedule=schedule)
    assert got is out
    assert not np.isnan(out).any(), "output elements left unwritten (or NaN produced)"
    ref = expected(data, causal, scale)
    err = rel_error(out, ref)
    assert err <= (tol or TOL[out.dtype.name]), f"{schedule}: error {err:.3g}"
    return out


# ---------------------------------------------------------------- numerics per algorithm

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", SIMT)
def test_odd_lengths_gqa_mask_causal(emu, rng, algorithm, dtype):
    """Sq=197, Sk=77 (no tile divides them), 4 query heads on 2 kv heads, a broadcast mask, causal."""
    data = make(rng, (1, 4, 197, 32), (1, 2, 77, 32), dtype, mask_shape=(4, 1, 77))
    run_checked(data, algorithm)
    run_checked(data, algorithm, causal=True)


@pytest.mark.parametrize("d", [32, 64, 128])
def test_head_dims(emu, rng, d):
    data = make(rng, (2, 33, d), (2, 47, d))
    for algorithm in ("fused", "three_stage"):
        run_checked(data, algorithm)


@pytest.mark.parametrize("sq,sk", [(40, 100), (100, 40)])
def test_causal_diagonals(emu, rng, sq, sk):
    """top_left: key j visible to query i when j <= i (torch's is_causal); bottom_right: j <= i + Sk - Sq.
    With Sq > Sk, bottom_right leaves the first Sq - Sk queries without keys: their output is 0."""
    data = make(rng, (1, 2, sq, 32), (1, 2, sk, 32))
    for algorithm in SIMT:
        top = run_checked(data, algorithm, causal=True)
        bottom = run_checked(data, algorithm, causal="bottom_right")
        if sq > sk:
            assert np.all(bottom[:, :, : sq - sk] == 0)
            assert not np.allclose(top, bottom)
    # The first query sees exactly key 0 under top_left: its output is v[0].
    np.testing.assert_allclose(top[:, :, 0], data["v"][:, :, 0], rtol=1e-6, atol=1e-6)


def test_masks_broadcast_and_minus_inf(emu, rng):
    q_shape, kv_shape = (2, 3, 21, 32), (2, 3, 29, 32)
    for mask_shape in [(29,), (21, 1), (2, 1, 21, 29), (1, 3, 1, 29), (2, 3, 21, 29)]:
        data = make(rng, q_shape, kv_shape, mask_shape=mask_shape)
        for algorithm in SIMT:
            run_checked(data, algorithm)
    data = make(rng, q_shape, kv_shape, mask_shape=(2, 3, 21, 29))
    data["mask"][:, :, :, ::3] = -np.inf           # hidden keys
    data["mask"][:, :, 5] = -np.inf                 # a query that sees nothing: zeros
    for algorithm in SIMT:
        out = run_checked(data, algorithm)
        assert np.all(out[:, :, 5] == 0)


def test_fp16_mask_with_fp16_inputs(emu, rng):
    data = make(rng, (1, 2, 30, 64), (1, 2, 50, 64), "float16", mask_shape=(30, 50), mask_dtype="float16")
    for algorithm in SIMT:
        run_checked(data, algorithm, causal=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_logits(emu, rng, dtype):
    """Scores around 1e3 must not overflow exp: the max is subtracted (online, per tile).

    A constant +1000 mask shifts every score without changing the softmax, but an fp32 logit near
    1000 is only known to 2^-14 (6e-5) absolute, which exp turns into relative errors of that size:
    tolerance 2e-4 for fp32. With scale = 8/sqrt(D) the scores spread over a few hundred and the
    softmax is nearly one-hot; errors near 1e-4 in such scores allow 1e-3.
    """
    data = make(rng, (1, 2, 45, 64), (1, 2, 61, 64), dtype, mask_shape=(45, 61))
    data["mask"][:] = 1000.0
    for algorithm in SIMT:
        run_checked(data, algorithm, tol=2e-4 if dtype == "float32" else TOL[dtype])
        run_checked(data, algorithm, scale=8.0 / np.sqrt(64), tol=1e-3 if dtype == "float32" else 4e-3)


def test_seed_layout_3d(emu, rng):
    data = make(rng, (3, 50, 64), (3, 70, 64), mask_shape=(50, 70))
    for algorithm in SIMT:
        run_checked(data, algorithm)
        run_checked(data, algorithm, causal=True, scale=0.3)


def test_unaligned_views_take_the_scalar_path(emu, rng):
    """Inputs one element off 16-byte alignment: the kernels check and fall back to scalar loads."""
    shape = (1, 2, 19, 32)
    data = {}
    for name in ("q", "k", "v"):
        base = rng.standard_normal(int(np.prod(shape)) + 1).astype("float32")
        data[name] = base[1:].reshape(shape)
        assert data[name].ctypes.data % 16 != 0
    data["mask"] = None
    for algorithm in SIMT:
        run_checked(data, algorithm)


def test_no_keys_and_empty_batches(emu, rng):
    data = make(rng, (2, 7, 32), (2, 0, 32))
    for algorithm in SIMT:
        out = run_checked(data, algorithm)
        assert np.all(out == 0)
    empty = make(rng, (0, 7, 32), (0, 5, 32))
    assert jitops.attention(empty["q"], empty["k"], empty["v"]).shape == (0, 7, 32)


# ---------------------------------------------------------------- matrix-core kernel (emulated fragments)

@pytest.mark.parametrize("d", [8, 20, 40, 72, 256])
def test_fused_mma_any_head_dim(mma_emu, rng, d):
    """D padded to a multiple of 16 inside the kernel: 8 (one k-step), 20 (not a multiple of 8: scalar
    loads and stores), 40/72 (SD 1.5 and DiT; 16-byte rows), 256 (Q read from shared memory)."""
    sq, sk = (37, 45) if d <= 72 else (19, 24)
    data = make(rng, (1, 2, sq, d), (1, 1, sk, d), "float16", mask_shape=(sq, sk) if d in (20, 72) else None)
    run_checked(data, "fused_mma", causal=d in (40, 256))


def test_bf16_every_algorithm(emu, mma_emu_device, rng):
    """bfloat16 (numpy ml_dtypes) through the SIMT kernels and, with emulated fragments, fused_mma
    (prefill with a bf16 mask and causal; decoding with packed heads and split keys)."""
    data = make(rng, (1, 2, 21, 32), (1, 1, 30, 32), "bfloat16", mask_shape=(21, 30), mask_dtype="bfloat16")
    for algorithm in SIMT:
        run_checked(data, algorithm, causal=True)
    with use_backend(mma_emu_device):
        run_checked(data, "fused_mma", causal=True)
        dec = make(rng, (2, 8, 1, 40), (2, 2, 200, 40), "bfloat16")
        out = run_checked(dec, Schedule.make("fused_mma", **DECODE, splits=3, pack=True), causal="bottom_right")
        assert out.dtype.name == "bfloat16"


def test_fused_mma_picks_padded_head_dims(mma_emu, rng):
    """With matrix cores every D runs fused_mma (SD 1.5's D=40 used to fall back to three_stage)."""
    data = make(rng, (1, 2, 20, 40), (1, 2, 30, 40), "float16")
    sched, _ = _select(data, None)
    assert sched.algorithm == "fused_mma" and "padded to 48" in sched.why
    run_checked(data, None, causal=True)          # the kernel of test_fused_mma_any_head_dim[40]


DECODE = dict(warps=4, row_groups=1, block_k=32, key_warps=2)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (16, 2)])
def test_decode_split_kv_gqa(mma_emu, rng, heads, kv_heads):
    """Sq = 1 and 3 against Sk = 300: GQA ratios 1, 4, 8 and MQA, query heads packed into one row set,
    two warps splitting each K/V tile, keys split over 5 blocks (partials + merge kernel)."""
    pack = heads > kv_heads
    for sq in (1, 3):
        data = make(rng, (2, heads, sq, 40), (2, kv_heads, 300, 40), "float16")
        sched = Schedule.make("fused_mma", **DECODE, splits=5, **({"pack": True} if pack else {}))
        run_checked(data, sched, causal="bottom_right")
    specs = {n: TensorSpec(a.shape, a.dtype.name) for n, a in data.items() if a is not None}
    plan = op.plan(op.make_problem({**specs, "mask": None}, {}), sched, mma_emu.device)
    assert [launch.kernel for launch in plan.launches] == ["attention_fused_mma", "attention_merge"]
    assert plan.launches[0].grid[0] == 2 * (heads // (heads // kv_heads if pack else 1)) * 5


def test_decode_split_kv_mask_and_hidden_keys(mma_emu, rng):
    """A per-head mask that hides every key of the first split and one query entirely; large logits."""
    data = make(rng, (1, 8, 2, 40), (1, 2, 200, 40), "float16", mask_shape=(1, 8, 2, 200))
    data["mask"][..., :64] = -np.inf              # split 0 (64 keys) sees nothing: its lse is -inf
    data["mask"][0, 3, 1] = -np.inf               # head 3, query 1: no key at all -> 0
    data["mask"][0, 5] += 300.0                   # large logits on one head
    sched = Schedule.make("fused_mma", **DECODE, splits=3, pack=True)
    out = run_checked(data, sched, tol=4e-3)
    assert np.all(out[0, 3, 1] == 0)
    run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32, pack=True), tol=4e-3)


def test_deeper_copy_pipelines(mma_emu, rng):
    """3 and 4 K/V buffers in a ring (more tiles in flight): tile counts below, at and above the depth."""
    for sk in (70, 230):                 # 2 + 1 and 4 + 4 tiles per split
        data = make(rng, (1, 4, 2, 24), (1, 1, sk, 24), "float16")
        for stages in (3, 4):
            run_checked(data, Schedule.make("fused_mma", **DECODE, pack=True, stages=stages, splits=2),
                        causal="bottom_right")
    data = make(rng, (1, 2, 40, 32), (1, 2, 100, 32), "float16")
    run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=16, stages=3), causal=True)


def test_decode_swizzled_tma_tiles_on_the_emulator(mma_emu, rng):
    """tma=1 (sm_90: K / V by TMA) keeps its tiles in the 128-byte-swizzled ring layout; the emulator has
    no tensor maps, so the threads store the same swizzled tiles and the fragment loads follow the swizzle:
    D = 40 / 72 (partial 64-column blocks), rings of 2 and 3 wrapping, partial last tiles, GQA packing,
    two query rows, split + merge kernel, bottom-right causal, a mask."""
    for d, kv_heads, sq, sk, params in ((72, 2, 1, 300, dict(stages=3)), (40, 1, 2, 230, dict(stages=2, splits=3)),
                                        (64, 2, 1, 100, dict(stages=2))):
        data = make(rng, (1, 8, sq, d), (1, kv_heads, sk, d), "float16")
        run_checked(data, Schedule.make("fused_mma", **DECODE, pack=True, tma=1, **params), causal="bottom_right")
    data = make(rng, (1, 8, 2, 64), (1, 2, 200, 64), "float16", mask_shape=(1, 8, 2, 200))
    data["mask"][..., :64] = -np.inf
    run_checked(data, Schedule.make("fused_mma", **DECODE, pack=True, tma=1, stages=2, splits=3), tol=4e-3)


def test_causal_sq_not_sk_on_matrix_cores(mma_emu, rng):
    """Causal with Sq != Sk, both diagonals, through the prefill tiles and the split-KV path."""
    data = make(rng, (1, 2, 40, 32), (1, 2, 100, 32), "float16")
    for causal in ("top_left", "bottom_right"):
        run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=16), causal=causal)
        run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=16, splits=3), causal=causal)


def test_fused_mma_tiles_and_edges(mma_emu, rng):
    data = make(rng, (2, 2, 37, 64), (2, 2, 70, 64), "float16")
    for params in (dict(warps=4, row_groups=2, block_k=64), dict(warps=2, row_groups=1, block_k=16),
                   dict(warps=1, row_groups=2, block_k=32)):
        run_checked(data, Schedule.make("fused_mma", **params), causal="bottom_right")
    data["mask"] = np.full((37, 70), 1000.0, dtype="float16")     # large logits
    data["mask"][3] = -np.inf                                    # a fully hidden query
    out = run_checked(data, "fused_mma")
    assert np.all(out[:, :, 3] == 0)


def test_fused_mma_padding_masks(mma_emu, rng):
    """Padding masks ([B, 1, 1, Sk] and [B, H, 1, Sk]: key_mask) on the matrix-core tiles: key tiles inside
    the bounds add the mask in the fast step, the last partial tile and the causal diagonal in the checked
    one; -inf padding and the dtype's lowest value with a key far above the rest; split keys, GQA packing
    (which keeps the per-row path) and a per-row mask of the same tensors for contrast."""
    q_shape, kv_shape = (2, 4, 37, 64), (2, 4, 150, 64)
    for mask_shape in ((2, 1, 1, 150), (2, 4, 1, 150)):
        data = make(rng, q_shape, kv_shape, "float16", mask_shape=mask_shape, mask_dtype="float16")
        data["mask"][1, ..., 90:] = -np.inf                       # batch 1: 90 real keys
        specs = {n: TensorSpec(a.shape, a.dtype.name) for n, a in data.items()}
        problem = op.make_problem(specs, {})
        assert problem.key_mask
        sched = Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32)
        assert dict(op.plan(problem, sched, mma_emu.device).launches[0].params)["key_mask"] is True
        for causal in (False, True):
            run_checked(data, sched, causal=causal)
        run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32, splits=2))
        jump = data["mask"].copy()
        jump[jump == -np.inf] = np.finfo(np.float16).min
        jump[0, ..., 100] = 30.0                                   # past the first tiles: the max moves
        run_checked({**data, "mask": jump}, sched)
    gqa = make(rng, (1, 8, 3, 64), (1, 2, 150, 64), "float16", mask_shape=(1, 1, 1, 150), mask_dtype="float16")
    gqa["mask"][..., 120:] = -np.inf
    run_checked(gqa, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32, pack=True), tol=4e-3)
    per_query = make(rng, q_shape, kv_shape, "float16", mask_shape=(2, 4, 37, 1), mask_dtype="float16")
    run_checked(per_query, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32))     # the generic path


def test_fused_mma_row_masks(mma_emu, rng):
    """Masks with a row per query row and contiguous keys (row_mask: a decoder export's causal + padding
    mask [B, 1, Sq, Sk], T5's position bias [1, H, Sq, Sk]) on the fast and checked tiles, a partial last
    query tile (rows past Sq read the last mask row), causal, split keys, the lowest-value fill; two keys'
    values per load where Sk is even (mask_pairs), also from a view one element off, one where it is odd."""
    q_shape = (2, 4, 37, 64)
    sched = Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32)
    for sk, mask_shape in ((150, (2, 1, 37, 150)), (150, (1, 4, 37, 150)), (150, (37, 150)), (151, (2, 1, 37, 151))):
        data = make(rng, q_shape, (2, 4, sk, 64), "float16", mask_shape=mask_shape, mask_dtype="float16")
        specs = {n: TensorSpec(a.shape, a.dtype.name) for n, a in data.items()}
        problem = op.make_problem(specs, {})
        assert problem.row_mask and not problem.key_mask and problem.row_mask_pairs == (sk % 2 == 0)
        params = dict(op.plan(problem, sched, mma_emu.device).launches[0].params)
        assert params["row_mask"] is True and params.get("mask_pairs", False) == (sk % 2 == 0)
        run_checked(data, sched)
        run_checked(data, sched, causal=True)
        run_checked(data, Schedule.make("fused_mma", warps=2, row_groups=1, block_k=32, splits=2))
        wide = op.make_problem({**specs, **{n: TensorSpec(a.shape[:-1] + (128,), "float16") for n, a in data.items()
                                            if n in "qkv"}}, {})
        assert not dict(op.plan(wide, sched, mma_emu.device).launches[0].params).get("mask_pairs")   # DP = 128: slower
        odd = np.empty(data["mask"].size + 1, data["mask"].dtype)[1:].reshape(data["mask"].shape)
        odd[...] = data["mask"]
        run_checked({**data, "mask": odd}, sched)
    decoder = make(rng, q_shape, (2, 4, 150, 64), "float16", mask_shape=(2, 1, 37, 150), mask_dtype="float16")
    decoder["mask"][:] = 0
    decoder["mask"][..., np.triu_indices(37, 150 - 37 + 1)[0], np.triu_indices(37, 150 - 37 + 1)[1]] = np.finfo(np.float16).min
    decoder["mask"][1, ..., :40] = np.finfo(np.float16).min        # batch 1 left-padded by 40 keys
    decoder["mask"][0, 0, 20, 100] = 30.0                          # a key far above the rest
    run_checked(decoder, sched)


def test_fused_mma_unaligned(mma_emu, rng):
    shape = (1, 1, 20, 32)
    data = {"mask": None}
    for name in ("q", "k", "v"):
        base = rng.standard_normal(int(np.prod(shape)) + 1).astype("float16")
        data[name] = base[1:].reshape(shape)
    run_checked(data, "fused_mma")


# ---------------------------------------------------------------- scheduler and errors

def test_scheduler_picks_by_dtype_head_dim_and_device(emu):
    from jitops.device import KNOWN_TARGETS

    def problem(dtype, d, sq=128):
        specs = {"q": TensorSpec((256, sq, d), dtype), "k": TensorSpec((256, sq, d), dtype),
                 "v": TensorSpec((256, sq, d), dtype), "mask": None}
        return op.make_problem(specs, {})

    h100 = KNOWN_TARGETS["sm_90"]
    # the seed shape on sm_90: warpgroup MMA with TMA loads (128 x 128 tiles, no padding); on sm_80
    # and for 100 queries (a fifth of the tile padding) the mma.sync kernel
    assert op.heuristic(problem("float16", 64), h100).algorithm == "fused_wgmma"
    assert op.heuristic(problem("float16", 64), KNOWN_TARGETS["sm_80"]).algorithm == "fused_mma"
    assert op.heuristic(problem("float16", 64, sq=100), h100).algorithm == "fused_mma"
    assert op.heuristic(problem("float32", 64), h100).algorithm == "fused"
    assert op.heuristic(problem("float16", 40), h100).algorithm == "fused_wgmma"
    assert op.heuristic(problem("float16", 40), emu.device).algorithm == "three_stage"   # no matrix cores
    assert op.heuristic(problem("float16", 64), KNOWN_TARGETS["gfx90a"]).algorithm == "fused_mma"
    assert op.heuristic(problem("float16", 64), emu.device).algorithm == "fused"      # no matrix cores
    big = op.heuristic(problem("float16", 64, sq=2048), KNOWN_TARGETS["sm_80"])
    assert (big["warps"], big["row_groups"]) == (8, 1) and "matrix cores" in big.why
    assert op.heuristic(problem("float16", 64, sq=2048), h100).algorithm == "fused_wgmma"
    small = op.heuristic(problem("float16", 64, sq=16), h100)      # few rows: smaller blocks, more of them
    assert 16 * small["warps"] * small["row_groups"] < 128


def test_scheduler_decoding_and_model_shapes():
    """On an H100-class target: decoding packs GQA/MQA heads, splits each tile's keys over the warps and
    the keys over ~3 blocks per SM only where the row sets do not fill the device (the choices the
    H100 sweeps of 2026-11-23 / 25 measured fastest); D=40, 72 and 256 stay on the matrix cores."""
    from jitops.device import KNOWN_TARGETS
    h100 = KNOWN_TARGETS["sm_90"]

    def pick(q, kv, causal=False):
        specs = {"q": TensorSpec(q, "float16"), "k": TensorSpec(kv, "float16"), "v": TensorSpec(kv, "float16"),
                 "mask": None}
        return op.heuristic(op.make_problem(specs, {"causal": causal}), h100)

    llama = pick((16, 32, 1, 128), (16, 8, 4096, 128))
    assert llama.get("pack") and llama["key_warps"] == 4 and llama["warps"] == 4 and llama.get("splits", 1) == 1
    assert llama["tma"] == 1 and llama["stages"] == 2 and "streams its keys once" in llama.why
    # one row tile per kv head, few kv heads: 8 warps x 128-key TMA tiles; B=1's 8 splits fit half the SMs
    # as clusters (merged in distributed shared memory), B=2 / B=4 about one block per SM + the merge kernel
    b1 = pick((1, 32, 1, 128), (1, 8, 4096, 128))
    assert (b1["warps"], b1["block_k"], b1["splits"], b1.get("cluster")) == (8, 128, 8, 1) and "cluster" in b1.why
    for batch, splits in ((2, 8), (4, 4)):
        sched = pick((batch, 32, 1, 128), (batch, 8, 4096, 128))
        assert (sched["block_k"], sched["splits"], sched.get("cluster", 0)) == (128, splits, 0), sched
    falcon = pick((16, 71, 1, 64), (16, 1, 2048, 64))
    assert falcon.get("pack") and falcon["warps"] == 8 and falcon["key_warps"] == 4 and falcon["splits"] == 8
    assert falcon["tma"] == 1 and falcon["stages"] == 3 and not falcon.get("cluster")
    assert "split 8 ways" in falcon.why and "71 query heads" in falcon.why
    mha = pick((16, 32, 1, 128), (16, 32, 4096, 128))          # 512 row sets already fill the device
    assert mha.get("splits", 1) == 1 and not mha.get("pack")
    # where TMA does not apply (D not a multiple of 8, D > 128, sm_80) the cp.async rules stay
    assert not pick((1, 32, 1, 256), (1, 8, 4096, 256)).get("tma")
    a100 = KNOWN_TARGETS["sm_80"]
    kv = TensorSpec((16, 8, 4096, 128), "float16")
    old = op.heuristic(op.make_problem({"q": TensorSpec((16, 32, 1, 128), "float16"), "k": kv, "v": kv, "mask": None}, {}),
                       a100)
    assert not old.get("tma") and old["prefetch"] == 256
    prefill = op.heuristic(op.make_problem({"q": TensorSpec((1, 32, 2048, 128), "float16"),
                                            "k": TensorSpec((1, 8, 2048, 128), "float16"),
                                            "v": TensorSpec((1, 8, 2048, 128), "float16"), "mask": None},
                                           {"causal": True}), h100, "fused_mma")
    assert (prefill["warps"], prefill["row_groups"], prefill["q_regs"]) == (4, 2, False)
    for d in (40, 72):                                          # long prefill: Hopper's warpgroup MMA
        assert pick((2, 8, 1024, d), (2, 8, 1024, d)).algorithm == "fused_wgmma"
    gemma = pick((1, 16, 2048, 256), (1, 16, 2048, 256), True)       # D = 256 too (H100: 1.16x fused_mma)
    assert gemma.algorithm == "fused_wgmma" and (gemma["groups"], gemma["block_k"]) == (2, 64)


def test_matrix_core_schedule_is_refused_on_the_emulator(emu, rng):
    data = make(rng, (1, 16, 64), (1, 16, 64), "float16")
    with pytest.raises(ScheduleError, match="matrix cores"):
        jitops.attention(data["q"], data["k"], data["v"], schedule="fused_mma")
    with pytest.raises(ScheduleError, match="head dims"):
        d40 = make(rng, (1, 16, 40), (1, 16, 40))
        jitops.attention(d40["q"], d40["k"], d40["v"], schedule="fused")
    with pytest.raises(ScheduleError, match="no algorithm"):
        jitops.attention(data["q"], data["k"], data["v"], schedule="winograd")


def test_head_dims_without_fused_kernel_use_three_stage(emu, rng):
    data = make(rng, (1, 2, 9, 40), (1, 2, 13, 40))
    out = run_checked(data, None)
    assert out.shape == (1, 2, 9, 40)


@pytest.mark.parametrize("args,argument,match", [
    (dict(q=(4, 8), k=(4, 8), v=(4, 8)), "q", "shape"),
    (dict(q=(1, 4, 8), k=(1, 1, 4, 8), v=(1, 1, 4, 8)), "k", "rank 3"),
    (dict(q=(1, 4, 8), k=(2, 4, 8), v=(2, 4, 8)), "k", "B = 1"),
    (dict(q=(1, 4, 8), k=(1, 4, 16), v=(1, 4, 16)), "k", "D = 8"),
    (dict(q=(1, 4, 4, 8), k=(1, 3, 4, 8), v=(1, 3, 4, 8)), "k", "dividing"),
    (dict(q=(1, 4, 8), k=(1, 5, 8), v=(1, 6, 8)), "v", "shape of k"),
    (dict(q=(1, 4, 300), k=(1, 4, 300), v=(1, 4, 300)), "q", "1..256"),
    (dict(q=(1, 4, 8), k=(1, 5, 8), v=(1, 5, 8), mask=(4, 4)), "mask", "broadcasts"),
    (dict(q=(1, 4, 8), k=(1, 5, 8), v=(1, 5, 8), mask=(2, 4, 5)), "mask", "broadcasts"),
])
def test_shape_errors(emu, args, argument, match):
    arrays = {n: np.ones(s, dtype="float32") for n, s in args.items()}
    with pytest.raises(ArgumentError, match=match) as info:
        jitops.attention(arrays["q"], arrays["k"], arrays["v"], arrays.get("mask"))
    assert info.value.argument == argument


def test_dtype_and_attribute_errors(emu):
    x = np.ones((1, 4, 8), dtype="float32")
    with pytest.raises(ArgumentError, match="dtype") as info:
        jitops.attention(x, x.astype("float16"), x)
    assert info.value.argument == "k"
    with pytest.raises(ArgumentError) as info:
        jitops.attention(x, x, x, np.ones((4, 4), dtype="int32"))
    assert info.value.argument == "mask"
    with pytest.raises(ArgumentError, match="top_left") as info:
        jitops.attention(x, x, x, causal="diagonal")
    with pytest.raises(ArgumentError, match="real number"):
        jitops.attention(x, x, x, scale="0.1")
    with pytest.raises(ArgumentError, match="finite"):
        jitops.attention(x, x, x, scale=float("nan"))
    with pytest.raises(ArgumentError) as info:
        jitops.attention(x, None, x)
    assert info.value.argument == "k"


def test_sm80_kernel_uses_mma_sync_and_ldmatrix():
    """The matrix-core kernel's PTX (compiled offline, no GPU) has mma.sync, ldmatrix and cp.async."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops import engine
    from jitops.runtime import get_backend
    backend = get_backend(target="sm_80")
    specs = {n: TensorSpec((8, 16, 2048, 64), "float16") for n in ("q", "k", "v")}
    problem = op.make_problem({**specs, "mask": None}, {})
    launch = op.plan(problem, op.heuristic(problem, backend.device), backend.device).launches[0]
    source = engine.kernel_source(backend.device, launch)
    ptx, _ = nvrtc_ptx(source, b"-arch=compute_80", b"-std=c++17", b"-default-device")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "cp.async.cg.shared.global" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


def _sm90a_ptxas(launch):
    """(PTX, ptxas report) of one launch's kernel compiled offline for sm_90a with NVRTC."""
    from jitops import engine
    from jitops.runtime import get_backend
    source = engine.kernel_source(get_backend(target="sm_90").device, launch)
    return nvrtc_ptx(source, b"-arch=sm_90a", b"-std=c++17", b"-default-device", b"--ptxas-options=-v")


def _hopper_problem(q, kv, dtype="float16", causal=False, mask=False):
    specs = {"q": TensorSpec(q, dtype), "k": TensorSpec(kv, dtype), "v": TensorSpec(kv, dtype),
             "mask": TensorSpec((q[-2], kv[-2]), "float32") if mask else None}
    return op.make_problem(specs, {"causal": causal})


def test_causal_wgmma_grids_group_heads_only_where_all_heads_kv_overflows_l2():
    """A causal fused_wgmma grid orders query tiles heaviest first over all (batch, head) pairs, except
    where the K / V of all heads exceed 2x L2 (H100: 100 MB), where groups of heads go one after the
    other: the largest divisor of the head count (whole GQA groups where one fits) whose K / V fill at
    most half of L2 and whose blocks fill at least half the resident slots; an explicit head_group is
    taken (sweeps), one below 1 refused; non-causal grids have no such parameter."""
    from jitops.device import KNOWN_TARGETS
    from jitops.ops.base import Schedule
    h100 = KNOWN_TARGETS["sm_90"]

    def group(q, kv, causal=True, **extra):
        p = _hopper_problem(q, kv, "bfloat16", causal)
        s = op.heuristic(p, h100)
        s = Schedule.make(s.algorithm, **(s.as_dict()["params"] | extra))
        return dict(op.plan(p, s, h100).launches[0].params).get("head_group")

    assert group((8, 16, 2048, 128), (8, 16, 2048, 128)) == 16          # 1 MB per head: <= 25, divides 128
    assert group((2, 32, 4096, 128), (2, 32, 4096, 128)) == 8           # 2 MB per head: <= 12, divides 64
    assert group((4, 32, 4096, 128), (4, 32, 4096, 128)) == 8
    assert group((16, 32, 4096, 128), (16, 32, 4096, 128)) == 8
    assert group((1, 67, 4096, 128), (1, 67, 4096, 128)) == 67          # 67 heads (134 MB), no divisor fits
    assert group((1, 32, 32768, 128), (1, 8, 32768, 128)) == 4          # GQA 4:1, 4 MB per query head: one kv head
    for q, kv in (((8, 16, 2048, 64), (8, 16, 2048, 64)), ((1, 16, 2048, 256), (1, 16, 2048, 256)),
                  ((8, 12, 1024, 64), (8, 12, 1024, 64)),
                  ((1, 32, 8192, 128), (1, 8, 8192, 128))):              # <= 2x L2 (GQA: shared K / V)
        assert group(q, kv) == q[0] * q[1], q
    assert group((8, 16, 2048, 128), (8, 16, 2048, 128), head_group=5) == 5
    assert group((8, 16, 2048, 128), (8, 16, 2048, 128), head_group=10**6) == 128
    assert group((4, 32, 4096, 128), (4, 32, 4096, 128), causal=False) is None
    with pytest.raises(ScheduleError, match="head_group"):
        group((8, 16, 2048, 128), (8, 16, 2048, 128), head_group=-1)


def test_wgmma_blocks_walk_query_tiles_over_one_key_tile():
    """sm_90: calls over 64-128 keys (cross-attention over 77 text tokens, T5's 128, BERT at S=128) take one
    warpgroup whose blocks walk 8, 4 or 2 query tiles over the one key tile: the longest walk whose grid
    is 4 waves of resident blocks or more (4 per SM with a trimmed tile, 3 with a whole one at DP = 64, 2
    at DP = 80), else the longest that fills 90% of a wave; none where no walk fills one (they keep their
    earlier picks), causal, with a mask, over fewer than 64 or more than 128 keys; an explicit walk is
    refused where it cannot run."""
    from jitops.device import KNOWN_TARGETS
    from jitops.ops.attention_wgmma import wgmma_shortlist
    from jitops.ops.base import Schedule
    h100 = KNOWN_TARGETS["sm_90"]
    for q, kv, walk in (((16, 10, 4096, 64), (16, 10, 77, 64), 4),    # SDXL cross b8: 2560 blocks of 4 >= 4 x 528
                        ((16, 20, 1024, 64), (16, 20, 77, 64), 2),    # SDXL cross b8 at 32 x 32: 2560 of 2
                        ((2, 10, 4096, 64), (2, 10, 77, 64), 2),      # SDXL b2: 4 -> 320 < 0.9 x 528
                        ((8, 12, 512, 64), (8, 12, 128, 64), 2),      # T5 cross: 3 per SM, 384 >= 356
                        ((32, 12, 128, 64), (32, 12, 128, 64), 2),    # BERT b32 S=128: 2 tiles per head
                        ((2, 8, 4096, 40), (2, 8, 77, 40), 2),        # SD 1.5 D = 40 (fused_mma before)
                        ((2, 16, 4096, 72), (2, 16, 120, 72), 8)):    # PixArt D = 72 over 120 (fused_mma before)
        p = _hopper_problem(q, kv)
        s = op.heuristic(p, h100)
        assert s.algorithm == "fused_wgmma" and (s["groups"], s["block_k"], s["stages"], s["q_walk"]) == (1, 128, 1, walk), (q, s)
        assert f"walks {walk} query tiles" in s.why, s.why
        launch = op.plan(p, s, h100).launches[0]
        assert launch.grid[0] == q[0] * q[1] * -(-(-(-q[2] // 64)) // walk), launch.grid
        assert dict(launch.params)["q_walk"] == walk
        assert any(c.get("q_walk") == walk for c in op.candidates(p, h100))
        short = wgmma_shortlist(p, h100, s, 6)
        assert short[0] == s and any(not c.get("q_walk") for c in short), short
    for q, kv, causal, mask in (((2, 20, 1024, 64), (2, 20, 77, 64), False, False),   # 320 blocks: no walk fills
                                ((2, 8, 256, 160), (2, 8, 77, 160), False, False),
                                ((8, 12, 128, 64), (8, 12, 128, 64), False, False),
                                ((16, 10, 4096, 64), (16, 10, 77, 64), True, False),
                                ((16, 10, 4096, 64), (16, 10, 77, 64), False, True),
                                ((16, 10, 4096, 64), (16, 10, 16, 64), False, False),
                                ((16, 10, 4096, 64), (16, 10, 200, 64), False, False)):
        s = op.heuristic(_hopper_problem(q, kv, causal=causal, mask=mask), h100)
        assert not s.get("q_walk"), (q, kv, causal, mask, s)
    # the walk's kernels compile offline for sm_90a without spills: a trimmed 80-key tile (4 blocks per SM)
    # and a whole 128-key tile (3 per SM: at 4, 128 registers, ptxas spills)
    if importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.bindings.nvrtc"):
        for q, kv, n in (((16, 10, 4096, 64), (16, 10, 77, 64), 80), ((8, 12, 512, 64), (8, 12, 128, 64), 128)):
            p = _hopper_problem(q, kv)
            ptx, text = _sm90a_ptxas(op.plan(p, op.heuristic(p, h100), h100).launches[0])
            assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in ptx and "cp.async.bulk.tensor" in ptx
            assert "0 bytes spill stores" in text and "C7512" not in text and "C7519" not in text, text
    walk = Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, stages=1, q_walk=4)
    for q, kv, causal, bad in (((2, 10, 4096, 64), (2, 10, 77, 64), True, {}),
                               ((2, 10, 4096, 64), (2, 10, 200, 64), False, {}),
                               ((2, 10, 4096, 64), (2, 10, 77, 64), False, {"q_walk": 1}),
                               ((2, 10, 4096, 64), (2, 10, 77, 64), False, {"producer": 1})):
        s = Schedule.make("fused_wgmma", **(walk.as_dict()["params"] | bad))
        with pytest.raises(ScheduleError, match="q_walk|producer|stages"):
            op.plan(_hopper_problem(q, kv, causal=causal), s, h100)


def test_wgmma_padding_masks():
    """sm_90 with a mask: a padding mask ([B, 1, 1, Sk]) is a key mask (one load per column in the softmax)
    and walks query tiles over one key tile like no mask (BERT / T5 from ONNX); masked calls of 128-key
    tiles at DP <= 64 take 64-key tiles instead (128 spill at two blocks per SM) unless a padding mask
    runs the bounded step; padding masks and masks of contiguous rows (row_mask) take the fast softmax on
    tiles inside the bounds and, up to DP = 112, the bounded step (row masks without causal masking on one
    warpgroup of 128-key tiles); per-row masks are no key masks and do not walk."""
    from jitops.device import KNOWN_TARGETS
    h100 = KNOWN_TARGETS["sm_90"]

    def problem(q, kv, mask_shape, causal=False):
        specs = {"q": TensorSpec(q, "float16"), "k": TensorSpec(kv, "float16"), "v": TensorSpec(kv, "float16"),
                 "mask": TensorSpec(mask_shape, "float16")}
        return op.make_problem(specs, {"causal": causal})

    bert = problem((32, 12, 128, 64), (32, 12, 128, 64), (32, 1, 1, 128))
    assert bert.key_mask and problem((8, 12, 512, 64), (8, 12, 128, 64), (128,)).key_mask
    assert not problem((32, 12, 128, 64), (32, 12, 128, 64), (32, 12, 128, 128)).key_mask
    assert not problem((32, 12, 128, 64), (32, 12, 128, 64), (32, 1, 128, 1)).key_mask
    s = op.heuristic(bert, h100)
    assert s.get("q_walk") == 2, s
    assert dict(op.plan(bert, s, h100).launches[0].params)["key_mask"] is True
    for q, m in (((32, 12, 384, 64), (32, 1, 1, 384)), ((32, 12, 128, 64), (32, 12, 128, 128))):
        p = problem(q, q, m)
        s = op.heuristic(p, h100)
        # padding masks on the bounded step fit 128 keys on two warpgroups, row masks on one
        tiles = (2, 128) if m[1:3] == (1, 1) else (1, 128)
        assert s.algorithm == "fused_wgmma" and (s["groups"], s["block_k"]) == tiles and not s.get("q_walk"), (q, m, s)
        assert ("key_mask" in dict(op.plan(p, s, h100).launches[0].params)) == (m[1:3] == (1, 1))
        assert s.get("bounded"), (m, s)
        assert dict(op.plan(p, s, h100).launches[0].params).get("row_mask", False) == (m[2] > 1)
    causal_rows = op.heuristic(problem((4, 12, 512, 64), (4, 12, 512, 64), (4, 1, 512, 512), True), h100)
    assert (causal_rows["groups"], causal_rows["block_k"]) == (2, 64), causal_rows    # one warpgroup: not measured
    wide = problem((8, 16, 1024, 128), (8, 16, 1024, 128), (8, 1, 1, 1024))
    assert not op.heuristic(wide, h100).get("bounded")       # DP > 112: causal would spill
    assert op.heuristic(problem((8, 16, 1024, 96), (8, 16, 1024, 96), (8, 1, 1, 1024)), h100).get("bounded")
    assert not op.heuristic(problem((32, 12, 128, 64), (32, 12, 128, 64), (32, 1, 1, 128), True), h100).get("q_walk")
    # the masked picks at DP <= 64 compile without spills (128-key tiles spilled 276-316 bytes, C7512)
    if importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.bindings.nvrtc"):
        for p in [problem((32, 12, 384, 64), (32, 12, 384, 64), m) for m in ((32, 1, 1, 384), (32, 12, 384, 384))] + [
                wide, problem((8, 16, 1024, 96), (8, 16, 1024, 96), (8, 1, 1024, 1024))]:
            _, text = _sm90a_ptxas(op.plan(p, op.heuristic(p, h100), h100).launches[0])
            assert "0 bytes spill stores" in text and "C7512" not in text, (p, text)


def test_scheduler_picks_wgmma_on_hopper_for_long_prefill_only():
    """sm_90: fused_wgmma for prefill of 256 queries and keys or more (fp16/bf16, D a multiple of 8
    up to 256, GQA, causal, masks), from 128 where the tiles are not padding, and for 128-255 queries
    and keys without causal masking or a mask (ViT), calls under a wave of blocks included; fused_mma
    for decoding, other short sequences or D=36; never on sm_80 or for fp32."""
    from jitops.device import KNOWN_TARGETS
    h100, a100 = KNOWN_TARGETS["sm_90"], KNOWN_TARGETS["sm_80"]
    for q, kv, dtype, causal, mask in (((8, 16, 2048, 64), (8, 16, 2048, 64), "float16", False, False),
                                       ((1, 32, 2048, 128), (1, 8, 2048, 128), "bfloat16", True, False),
                                       ((2, 8, 4096, 40), (2, 8, 4096, 40), "float16", False, True),
                                       ((1, 16, 2048, 256), (1, 16, 2048, 256), "float16", True, False)):
        p = _hopper_problem(q, kv, dtype, causal, mask)
        s = op.heuristic(p, h100)
        assert s.algorithm == "fused_wgmma", (q, s)
        assert "warpgroup MMA" in s.why and f"D={q[-1]}" in s.why
        assert op.heuristic(p, a100).algorithm == "fused_mma"
        assert any(c.algorithm == "fused_wgmma" for c in op.candidates(p, h100))
        assert not any(c.algorithm == "fused_wgmma" for c in op.candidates(p, a100))
        # K / V by TMA everywhere: the plain loop (thread 0 issues, 2 buffers), which won on the H100
        # for these shapes, causal D = 128 (Llama-3 prefill) included
        assert s["tma"] == 1 and "by TMA" in s.why, s
        assert not s.get("producer", 0) and "producer warpgroup" not in s.why, s
        if q[-1] <= 64:                 # 2 warpgroups, 128-key tiles; 64 with a mask (128 would spill)
            assert (s["groups"], s["block_k"], s.get("stages", 2)) == (2, 64 if mask else 128, 2), s
        else:
            assert (s["groups"], s["block_k"], s.get("stages", 2)) == (2, 64, 2), s
        # buffers released per warp (no block barrier per tile): causal up to D = 64 and D = 256
        release = (bool(causal) and q[-1] <= 64) or q[-1] == 256
        assert bool(s.get("release", 0)) == release and ("released per warp" in s.why) == release, s
    # 128 x 128: whole tiles; one warpgroup per block where its grid takes no more waves of resident blocks
    # (3 per SM) than two warpgroups' (2 per SM): BERT b8 S=384 2 and 2, the seed 1 and 1; not BERT b32
    # S=384 (6 against 5) or Whisper's encoder (2 against 1); BERT b32 / b64 at S=128 walk (below)
    for q, groups in (((32, 12, 128, 64), 1), ((64, 12, 128, 64), 1), ((1, 8, 128, 64), 1), ((8, 12, 384, 64), 1),
                      ((32, 12, 384, 64), 2), ((1, 20, 1500, 64), 2)):
        s = op.heuristic(_hopper_problem(q, q), h100)
        assert s.algorithm == "fused_wgmma" and (s["groups"], s["block_k"], s["tma"]) == (groups, 128, 1), (q, s)
    # two warpgroups over at most 4 key tiles (BERT-length encoders): buffers released per warp; over longer
    # keys, with a mask, with 64-key tiles (D > 64) or on one warpgroup: the block barrier per tile
    for q, kv, mask, release in (((32, 12, 384, 64), None, False, True), ((16, 16, 512, 64), None, False, True),
                                 ((64, 12, 256, 64), None, False, True), ((16, 16, 640, 64), None, False, False),
                                 ((1, 20, 1500, 64), None, False, False), ((8, 16, 2048, 64), None, False, False),
                                 ((32, 12, 384, 64), None, True, False), ((16, 16, 512, 96), None, False, False),
                                 ((8, 12, 384, 64), None, False, False), ((32, 12, 512, 64), (32, 12, 384, 64), False, True)):
        s = op.heuristic(_hopper_problem(q, kv or q, mask=mask), h100)
        assert bool(s.get("release", 0)) == release and ("released per warp" in s.why) == release, (q, mask, s)
    # causal: two warpgroups (one_group is measured without it); a mask of whole rows at D = 64: one
    # warpgroup of 128-key tiles (its two-warpgroup tiles spill at 128 keys and lose at 64, H200)
    for causal, mask, groups in ((True, False, 2), (False, True, 1), (True, True, 2)):
        s = op.heuristic(_hopper_problem((8, 12, 384, 64), (8, 12, 384, 64), causal=causal, mask=mask), h100)
        assert s.algorithm == "fused_wgmma" and s["groups"] == groups, (causal, mask, s)
    # long queries over one tile of keys (SD cross-attention over 77 tokens) at DP = 64 and 160: the plain
    # loop, one warpgroup, one 128-key tile trimmed to 80; fused_mma at DP = 48 / 80, causal or with a mask
    for q, kv, wgmma in (((2, 20, 1024, 64), (2, 20, 77, 64), True), ((2, 8, 256, 160), (2, 8, 77, 160), True),
                         ((2, 8, 1024, 80), (2, 8, 77, 80), False)):
        s = op.heuristic(_hopper_problem(q, kv), h100)
        assert (s.algorithm == "fused_wgmma") == wgmma, (q, kv, s)
        if wgmma:
            assert (s["groups"], s["block_k"], s["tma"], s["trim"]) == (1, 128, 1, 1) and not s.get("producer", 0), s
            assert "last key tile at 80 keys" in s.why and "(cross-attention)" in s.why, s.why
            assert not s.get("q_walk"), s
    for causal, mask in ((True, False), (False, True)):
        s = op.heuristic(_hopper_problem((2, 10, 4096, 64), (2, 10, 77, 64), causal=causal, mask=mask), h100)
        assert s.algorithm == "fused_mma", (causal, mask, s)
    # ... but not over a few keys (IP-Adapter's 16 image tokens: fused_mma 1.6x faster)
    assert op.heuristic(_hopper_problem((2, 10, 4096, 64), (2, 10, 16, 64)), h100).algorithm == "fused_mma"
    # 64-255 queries over 1024 keys or more (Whisper's decoder over 1500 frames): one warpgroup walking
    # every key tile, 128-key tiles up to DP = 64, 64 above; split-KV fused_mma for decoding, causal calls,
    # fewer queries or D = 256
    for q, kv, bk in (((8, 20, 64, 64), (8, 20, 1500, 64), 128), ((8, 16, 100, 64), (8, 16, 2048, 64), 128),
                      ((8, 16, 64, 128), (8, 16, 4096, 128), 64)):
        s = op.heuristic(_hopper_problem(q, kv), h100)
        assert s.algorithm == "fused_wgmma" and (s["groups"], s["block_k"], s["tma"]) == (1, bk, 1), (q, kv, s)
        assert not s.get("producer", 0) and "walks every key tile" in s.why, s
    for q, kv, causal in (((8, 20, 64, 64), (8, 20, 1500, 64), True), ((8, 32, 16, 128), (8, 8, 4096, 128), False),
                          ((8, 16, 64, 256), (8, 16, 4096, 256), False)):
        assert op.heuristic(_hopper_problem(q, kv, causal=causal), h100).algorithm == "fused_mma", (q, kv, causal)
    for q, kv, dtype in (((16, 32, 1, 128), (16, 8, 4096, 128), "float16"),      # decoding
                         ((8, 12, 197, 64), (8, 12, 77, 64), "float16"),         # 77 keys: short cross-attention
                         ((2, 8, 2048, 36), (2, 8, 2048, 36), "float16")):       # D not a multiple of 8
        assert op.heuristic(_hopper_problem(q, kv, dtype), h100).algorithm == "fused_mma", q
    # 128-255 queries and keys that 128-key tiles would pad (ViT's 197): one warpgroup of 64 rows per
    # block, 64-key tiles up to DP = 64 from two waves of 64-row blocks and 128-key tiles below (ViT b1-b4);
    # above DP = 64 two warpgroups of 64-key tiles, one under two waves; not causal, no mask
    for q, tiles in (((8, 12, 197, 64), (1, 64)), ((64, 6, 197, 64), (1, 64)), ((1, 12, 197, 64), (1, 128)),
                     ((4, 12, 197, 64), (1, 128)), ((16, 12, 160, 128), (2, 64)), ((1, 12, 160, 128), (1, 64))):
        s = op.heuristic(_hopper_problem(q, q), h100)
        assert s.algorithm == "fused_wgmma" and (s["groups"], s["block_k"], s["tma"]) == (*tiles, 1), s
        assert not s.get("producer", 0), s
    for causal, mask in ((True, False), (False, True)):
        s = op.heuristic(_hopper_problem((8, 12, 197, 64), (8, 12, 197, 64), causal=causal, mask=mask), h100)
        assert s.algorithm == "fused_mma", (causal, mask, s)
    # CLIP's 257 tokens: 128-key tiles with the last one trimmed to 16 keys (256 + 16: 94% real), the plain
    # loop, one warpgroup per block where its grid takes no more waves (b1, b8), two at b32; causal calls
    # cannot trim, and there 128-key tiles would be a third padding: 64-key tiles, 3 warpgroups, a producer
    for q, groups in (((1, 16, 257, 64), 1), ((8, 16, 257, 64), 1), ((32, 16, 257, 64), 2)):
        clip = op.heuristic(_hopper_problem(q, q), h100)
        assert clip.algorithm == "fused_wgmma" and not clip.get("producer", 0), clip
        assert (clip["groups"], clip["block_k"], clip["tma"], clip["trim"], clip["bounded"]) == (groups, 128, 1, 1, 1), clip
        assert "last key tile at 16 keys" in clip.why, clip.why
    clip = op.heuristic(_hopper_problem((8, 16, 257, 64), (8, 16, 257, 64), causal=True), h100)
    assert clip.algorithm == "fused_wgmma" and clip["groups"] == 3 and clip["producer"] == 1 and clip["tma"] == 1, clip
    causal = op.heuristic(_hopper_problem((8, 16, 2048, 64), (8, 16, 2048, 64), causal=True), h100)
    assert (causal["groups"], causal["block_k"], causal["tma"], causal["release"]) == (2, 128, 1, 1), causal
    assert not causal.get("producer", 0), causal
    assert op.heuristic(_hopper_problem((8, 16, 2048, 64), (8, 16, 2048, 64), "float32"), h100).algorithm == "fused"


def test_scheduler_trims_a_partial_last_key_tile():
    """sm_90's plain TMA schedules take trim=1 where the keys end inside a tile and the call is not
    causal (the last tile then runs at its visible keys rounded up to 16, after the loop): ViT's 197
    keys, also in the tuner's candidates and benchmark mode's shortlist; not for whole tiles or causal
    calls. The plan passes the tail width only then, and refuses trim outside the plain TMA loop."""
    from jitops.device import KNOWN_TARGETS
    from jitops.ops.base import Schedule
    h100 = KNOWN_TARGETS["sm_90"]
    vit = _hopper_problem((32, 12, 197, 64), (32, 12, 197, 64))
    pick = op.heuristic(vit, h100)
    assert pick.get("trim") == 1 and "last key tile at 16 keys" in pick.why, pick
    params = dict(op.plan(vit, pick, h100).launches[0].params)
    assert params["tail_keys"] == 16                               # 197 = 3 x 64 + 5
    plain = [c for c in op.candidates(vit, h100) if c.algorithm == "fused_wgmma" and not c.get("producer", 0)]
    assert plain and all(c.get("trim") == 1 for c in plain)
    assert all(s.get("trim") == 1 for s in op.shortlist(vit, h100, 6))
    for q, causal in (((8, 16, 2048, 64), False), ((8, 12, 197, 64), True)):
        s = op.heuristic(_hopper_problem(q, q, causal=causal), h100)
        assert not s.get("trim") and "tail_keys" not in dict(op.plan(_hopper_problem(q, q, causal=causal), s, h100)
                                                             .launches[0].params), (q, s)
    near_whole = _hopper_problem((1, 4, 300, 128), (1, 4, 700, 128))     # 700 = 10 x 64 + 60: nothing to trim
    assert "tail_keys" not in dict(op.plan(near_whole, Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1, trim=1),
                                           h100).launches[0].params)
    assert dict(op.plan(near_whole, Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1, trim=1),
                        h100).launches[0].params)["tail_keys"] == 64
    with pytest.raises(ScheduleError, match="trim=1"):
        op.plan(vit, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1, trim=1), h100)


def test_scheduler_skips_the_running_max_where_it_measured_faster():
    """sm_90, the plain TMA loop: bounded=1 (no max on key tiles after the first while the
    probabilities stay bounded) on two warpgroups up to DP = 112 and with causal masking above (without
    it the H100 ran it 0.95-0.99x at DP = 128, where 3 warpgroups of 128-key tiles take it instead);
    with a padding or whole-row mask up to DP = 112 only (an [Sq, Sk] mask is one of whole rows). D = 40 /
    72 (rows not whole 32-byte sectors): 4 warpgroups on a released ring of 3 buffers."""
    from jitops.device import KNOWN_TARGETS
    h100 = KNOWN_TARGETS["sm_90"]
    for q, kv, causal, mask, bounded in (((8, 16, 2048, 64), (8, 16, 2048, 64), False, False, True),
                                         ((8, 16, 2048, 64), (8, 16, 2048, 64), True, False, True),
                                         ((4, 16, 2048, 96), (4, 16, 2048, 96), False, False, True),
                                         ((8, 16, 2048, 128), (8, 16, 2048, 128), False, True, False),
                                         ((1, 32, 2048, 128), (1, 8, 2048, 128), True, False, True),
                                         ((2, 8, 4096, 48), (2, 8, 4096, 48), False, True, True),
                                         ((1, 16, 2048, 256), (1, 16, 2048, 256), True, False, True),
                                         ((1, 16, 2048, 256), (1, 16, 2048, 256), False, False, False)):
        s = op.heuristic(_hopper_problem(q, kv, "float16", causal, mask), h100)
        assert bool(s.get("bounded", 0)) == bounded and ("no running max" in s.why) == bounded, (q, s)
        assert s["groups"] == 2, s
    # D = 128 without causal masking: 3 warpgroups of 128-key tiles, released, bounded; not where the
    # 192-row tiles would be a third padding (S = 256) or too few blocks fill the SMs
    for q, three in (((8, 16, 2048, 128), True), ((1, 24, 4096, 128), True), ((8, 16, 256, 128), False),
                     ((1, 2, 2048, 128), False)):
        s = op.heuristic(_hopper_problem(q, q), h100)
        got = (s["groups"], s["block_k"], s.get("release", 0), s.get("bounded", 0))
        assert (got == (3, 128, 1, 1)) == three and (three or got[:2] == (2, 64)), (q, s)
        assert ("3 warpgroups" in s.why) == three, s.why
        assert s in op.candidates(_hopper_problem(q, q), h100), s      # the tuner times the pick too
    for q, bk in (((4, 16, 1024, 72), 64), ((2, 8, 4096, 40), 128)):    # DiT-XL, SD 1.5: 144- and 80-byte rows
        s = op.heuristic(_hopper_problem(q, q), h100)     # 128-key tiles where DP <= 48 (1.23-1.27x at D = 40)
        assert (s["groups"], s["block_k"], s["stages"], s["release"], s["bounded"]) == (4, bk, 3, 1, 1), s
        assert "4 warpgroups" in s.why and "3 K/V buffers" in s.why, s.why
        assert s in op.candidates(_hopper_problem(q, q), h100), s
    p = _hopper_problem((8, 16, 2048, 64), (8, 16, 2048, 64))
    assert any(c.get("bounded", 0) for c in op.candidates(p, h100))
    with pytest.raises(ScheduleError, match="bounded=1 is an option of the plain TMA loop"):
        op.plan(p, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1, bounded=1), h100)
    with pytest.raises(ScheduleError, match="registers"):     # 4 warpgroups of 128-key tiles: DP <= 48 only
        op.plan(p, Schedule.make("fused_wgmma", groups=4, block_k=128, tma=1), h100)


def test_tuner_candidates_leave_out_loops_that_never_won():
    """sm_90 fp16: the tuner times K / V by TMA only (the cp.async wgmma loops lost every H100
    comparison) and one SIMT fallback per algorithm; each heuristic pick is among them. AMD (never
    measured) keeps every SIMT tile."""
    from collections import Counter
    from jitops.device import KNOWN_TARGETS
    p = _hopper_problem((8, 16, 2048, 64), (8, 16, 2048, 64))
    h100 = KNOWN_TARGETS["sm_90"]
    cands = op.candidates(p, h100)
    assert all(c.get("tma", 0) == 1 for c in cands if c.algorithm == "fused_wgmma")
    counts = Counter(c.algorithm for c in cands)
    assert counts["fused"] == counts["naive"] == counts["three_stage"] == 1, counts
    assert op.heuristic(p, h100) in cands and len(cands) <= 64, len(cands)
    assert Counter(c.algorithm for c in op.candidates(p, KNOWN_TARGETS["gfx90a"]))["fused"] > 1
    fp32 = _hopper_problem((8, 16, 2048, 64), (8, 16, 2048, 64), "float32")
    assert Counter(c.algorithm for c in op.candidates(fp32, h100))["fused"] > 1


def test_wgmma_is_refused_where_it_cannot_run():
    from jitops.device import KNOWN_TARGETS
    h100, a100 = KNOWN_TARGETS["sm_90"], KNOWN_TARGETS["sm_80"]
    p = _hopper_problem((1, 2, 256, 64), (1, 2, 256, 64))
    with pytest.raises(ScheduleError, match="sm_90"):
        op.heuristic(p, a100, "fused_wgmma")
    with pytest.raises(ScheduleError, match="multiples of 8"):
        op.heuristic(_hopper_problem((1, 2, 256, 36), (1, 2, 256, 36)), h100, "fused_wgmma")
    with pytest.raises(ScheduleError, match="float16 or bfloat16"):
        op.heuristic(_hopper_problem((1, 2, 256, 64), (1, 2, 256, 64), "float32"), h100, "fused_wgmma")
    with pytest.raises(ScheduleError, match="stages"):
        op.plan(p, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=5), h100)
    with pytest.raises(ScheduleError, match="shared memory"):
        op.plan(_hopper_problem((1, 2, 256, 128), (1, 2, 256, 128)),
                Schedule.make("fused_wgmma", groups=3, block_k=128, stages=3), h100)


def test_unsplit_decode_asks_l2_for_256_byte_prefetches():
    """The Llama-3 decode pick on sm_80 streams each kv head once with cp.async ... .L2::256B (NVRTC)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops import engine
    from jitops.runtime import get_backend
    backend = get_backend(target="sm_80")
    p = _hopper_problem((16, 32, 1, 128), (16, 8, 4096, 128))
    pick = op.heuristic(p, backend.device)
    assert pick.algorithm == "fused_mma" and pick["prefetch"] == 256, pick
    ptx, _ = nvrtc_ptx(engine.kernel_source(backend.device, op.plan(p, pick, backend.device).launches[0]),
                       b"-arch=sm_80", b"-std=c++17", b"-default-device")
    assert "cp.async.cg.shared.global.L2::256B" in ptx


def test_sm90_decode_pick_uses_tma_and_a_cluster_merge():
    """Llama-3 B=1 on sm_90 (NVRTC, offline): K / V tiles by cp.async.bulk.tensor completing mbarriers,
    the splits merged through a cluster (mapa + ld.shared::cluster between two cluster barriers), one
    launch, no spills."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops import engine
    from jitops.runtime import get_backend
    backend = get_backend(target="sm_90")
    p = _hopper_problem((1, 32, 1, 128), (1, 8, 4096, 128), "bfloat16")
    plan = op.plan(p, op.heuristic(p, backend.device), backend.device)
    assert len(plan.launches) == 1 and not plan.workspaces
    ptx, text = nvrtc_ptx(engine.kernel_source(backend.device, plan.launches[0]), b"-arch=sm_90", b"-std=c++17",
                          b"-default-device", b"--ptxas-options=-v")
    assert "cp.async.bulk.tensor.3d" in ptx and "mbarrier.try_wait.parity" in ptx
    assert ".reqnctapercluster 8, 1, 1" in ptx and "mapa.shared::cluster" in ptx and ptx.count("barrier.cluster.wait") == 2
    assert "0 bytes spill stores" in text, text


def test_tma_and_cluster_schedules_are_refused_where_they_cannot_run(mma_emu):
    from jitops.device import KNOWN_TARGETS
    p = _hopper_problem((1, 32, 1, 128), (1, 8, 4096, 128))
    tma = Schedule.make("fused_mma", **DECODE, pack=True, tma=1)
    for target in ("sm_80", "gfx90a"):
        with pytest.raises(ScheduleError, match="sm_90"):
            op.plan(p, tma, KNOWN_TARGETS[target])
    with pytest.raises(ScheduleError, match="cluster"):
        op.plan(p, Schedule.make("fused_mma", **DECODE, pack=True, splits=4, cluster=1), mma_emu.device)
    with pytest.raises(ScheduleError, match="at most 16 splits"):
        op.plan(p, Schedule.make("fused_mma", **DECODE, pack=True, splits=32, cluster=1), KNOWN_TARGETS["sm_90"])
    with pytest.raises(ScheduleError, match="multiple of 8"):
        op.plan(_hopper_problem((1, 32, 1, 36), (1, 8, 4096, 36)), tma, KNOWN_TARGETS["sm_90"])


def test_plain_tma_loop_asks_for_two_blocks_only_where_registers_allow():
    """The plain TMA loop asks ptxas for two blocks per SM (its speed comes from that) with 2
    warpgroups; with 3 that would leave 85 registers and ptxas refuses the kernel, so it asks for one.
    Both compile offline for sm_90a without spills."""
    from jitops.runtime import get_backend
    backend = get_backend(target="sm_90")
    p = _hopper_problem((1, 2, 300, 64), (1, 2, 500, 64), "float16", causal=True)
    for groups, want in ((2, 2), (3, 1)):
        sched = Schedule.make("fused_wgmma", groups=groups, block_k=64, stages=3, tma=1, release=1)
        launch = op.plan(p, sched, backend.device).launches[0]
        assert dict(launch.params)["min_blocks"] == want, (groups, dict(launch.params)["min_blocks"])
        if groups == 3:
            pytest.importorskip("cuda.bindings.nvrtc")
            ptx, text = _sm90a_ptxas(launch)
            assert "0 bytes spill stores" in text and "C7512" not in text, text


def test_wgmma_kernel_compiles_for_sm90a_without_spills():
    """Both loops of fused_wgmma compile offline (NVRTC, sm_90a) to wgmma with no local memory; the
    warpgroup-specialised PTX has the register-A form with a transposed B."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops.runtime import get_backend
    backend = get_backend(target="sm_90")
    p = _hopper_problem((1, 4, 300, 72), (1, 2, 200, 72), "bfloat16", causal=True)
    for sched in (Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3),
                  Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1)):
        ptx, text = _sm90a_ptxas(op.plan(p, sched, backend.device).launches[0])
        assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx
        assert "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16" in ptx     # P V: D=72 padded to 80
        assert "0 bytes spill stores" in text and "C7519" not in text, text
        assert ("mbarrier.try_wait.parity" in ptx) == bool(sched.get("producer", 0))
        # the producer's tiles are marked full by the copies themselves, not after a wait for them
        assert ("cp.async.mbarrier.arrive.noinc" in ptx) == bool(sched.get("producer", 0))
    # the scheduler's pick at D = 72: the plain TMA loop, 4 warpgroups (512 threads at 128 registers),
    # no running max while bounded: the warpgroup's vote for running S again is a barrier reduction
    dit = _hopper_problem((4, 16, 1024, 72), (4, 16, 1024, 72), "bfloat16")
    pick = op.heuristic(dit, backend.device)
    assert (pick["groups"], pick.get("bounded", 0)) == (4, 1), pick
    ptx, text = _sm90a_ptxas(op.plan(dit, pick, backend.device).launches[0])
    assert "bar.red.or.pred" in ptx and "cp.async.bulk.tensor" in ptx
    assert "0 bytes spill stores" in text and "C7519" not in text and "C7512" not in text, text



def test_shortlist_is_the_pick_and_its_plannable_neighbours():
    """Benchmark mode's shortlist on sm_90: the heuristic's fused_wgmma pick first, then distinct
    plain-TMA neighbours that plan, at most n; picks of other algorithms stand alone."""
    from jitops.errors import ScheduleError
    op = get_op("attention")
    hopper = jitops.get_backend(target="sm_90").device
    for qs, causal in (((8, 16, 2048, 128), False), ((8, 16, 2048, 128), True), ((2, 8, 4096, 40), False),
                       ((1, 16, 2048, 256), True)):
        spec = TensorSpec(qs, "float16")
        p = op.make_problem({"q": spec, "k": spec, "v": spec}, {"causal": causal})
        for n in (2, 6):
            short = op.shortlist(p, hopper, n)
            assert short[0] == op.heuristic(p, hopper) and 2 <= len(short) <= n and len(set(short)) == len(short)
            for s in short:
                try:
                    op.plan(p, s, hopper)
                except ScheduleError as exc:
                    raise AssertionError(f"{qs} {s}: {exc}") from exc
    tiny = TensorSpec((1, 8, 100, 64), "float16")       # fused_mma: no neighbours
    p = op.make_problem({"q": tiny, "k": tiny, "v": tiny}, {})
    assert op.shortlist(p, hopper, 6) == [op.heuristic(p, hopper)]
    # a causal grid by groups of heads: the all-heads order second; none where all heads are one group
    for qs, grouped in (((8, 16, 2048, 128), True), ((8, 12, 1024, 64), False)):
        spec = TensorSpec(qs, "float16")
        p = op.make_problem({"q": spec, "k": spec, "v": spec}, {"causal": True})
        short = op.shortlist(p, hopper, 6)
        every = [s for s in short if s.get("head_group", 0) == qs[0] * qs[1]]
        assert (short[1:2] == every) if grouped else not every, short
        assert len(short) <= 6
