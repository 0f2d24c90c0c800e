"""fp32 attention with TF32 products (fused_tf32, precision "tf32") on the emulator (warp 32: the
mma.sync m16n8k8 layouts, warp 64: MFMA's) against float64 into NaN-poisoned outputs, and the
precision policy that decides when it runs.

Tolerance (attention_problem.TF32_TOLERANCE = 4e-3 of max |reference|): Q, K, V and P rounded to 11
significant bits (2^-11 each); measured here 3e-4 .. 6e-4, on the H200 2.7e-4 .. 8.1e-4. Every case
also asks for an error above FLOOR (the exact kernels' few 1e-6), so a kernel that silently skipped
the rounding, or a scheduler that silently ran the exact kernel, fails.
"""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError
from jitops.ops import get_op
from jitops.ops.attention_problem import TF32_TOLERANCE, random_inputs, reference
from jitops.ops.attention_tf32 import mma_tf32_schedule
from jitops.ops.base import Schedule, TensorSpec
from jitops.runtime import get_backend

op = get_op("attention")
FLOOR = 2e-5


def tile(warps: int, block_k: int, row_groups: int = 1) -> Schedule:
    return Schedule.make("fused_tf32", warps=warps, block_k=block_k, **({"row_groups": 2} if row_groups == 2 else {}))


CASES = {   # q (logical), kv (logical), causal, mask shape, layout, schedule
    "gqa_d40_fast_step": ((1, 4, 37, 40), (1, 2, 45, 40), False, None, "", tile(2, 32)),
    "rank3_d24_bottom_right_mask": ((2, 33, 24), (2, 50, 24), "bottom_right", (33, 50), "", tile(1, 16)),
    "d72_causal_two_row_groups": ((1, 2, 150, 72), (1, 1, 130, 72), True, None, "", tile(2, 32, 2)),
    "padding_mask_bshd": ((2, 2, 40, 32), (2, 2, 70, 32), False, (2, 1, 1, 70), "bshd", tile(2, 16)),
}


def problem(q, kv, causal=False, mask=None, layout="", precision="tf32", dtype="float32", scale=None):
    specs = {"q": TensorSpec(q, dtype, layout), "k": TensorSpec(kv, dtype, layout), "v": TensorSpec(kv, dtype, layout),
             "mask": TensorSpec(mask, "float32") if mask else None}
    return op.make_problem(specs, {"causal": causal, "precision": precision, "scale": scale})


def run_case(rng, q, kv, causal, mask, layout, schedule) -> float:
    p = problem(q, kv, causal, mask, layout)
    data = random_inputs(p, rng)
    out = np.full(p.outputs()["out"].storage_shape, np.nan, dtype=np.float32)
    jitops.attention(data["q"], data["k"], data["v"], data.get("mask"), causal=causal, layout=layout or None,
                     out=out, schedule=schedule, precision="tf32")
    assert np.isfinite(out).all(), "unwritten or non-finite output"
    ref = reference(p, data)["out"]
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_tf32_numerics(mma_emu, rng, case):
    err = run_case(rng, *CASES[case])
    assert FLOOR < err <= TF32_TOLERANCE, f"{case}: {err:.3e}"


@pytest.mark.parametrize("q, kv, scale, causal", [((1, 2, 20, 3), (1, 2, 33, 3), -0.7, False),   # D = 3: plain loads;
                                                   ((1, 1, 17, 1), (1, 1, 5, 1), None, "bottom_right"),  # scale < 0: every
                                                   ((1, 2, 9, 16), (1, 2, 0, 16), None, False)])   # step checked; no keys
def test_tf32_edges(mma_emu, rng, q, kv, scale, causal):
    p = problem(q, kv, causal, scale=scale)
    data = random_inputs(p, rng)
    out = np.full(q, np.nan, dtype=np.float32)
    jitops.attention(data["q"], data["k"], data["v"], causal=causal, scale=scale, out=out, schedule=tile(1, 16),
                     precision="tf32")
    ref = reference(p, data)["out"]
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() <= TF32_TOLERANCE * max(np.abs(ref).max(), 1.0)


def test_tf32_fragments_round_to_nearest(mma_emu):
    """Q and key 0 = rows of 1 + 2^-11 (halfway between two TF32 values: cvt.rna rounds away, to 1 + 2^-10),
    key 1 = ones, V one-hot: key 0's weight 1 / (1 + 2^(s1 - s0)) shows the rounding (exact fp32 would give
    scores 8 (1 + 2^-11)^2 and 8 (1 + 2^-11), truncation 8 and 8: weights 1e-3 off). Key 0 has the larger
    score, so its probability is exactly 1; key 1's is rounded to TF32 before the row sum adds it."""
    q = np.full((1, 1, 16, 8), 1 + 2.0 ** -11, dtype=np.float32)
    v = np.eye(2, 8, dtype=np.float32)[None, None]
    k = np.concatenate([q[:, :, :1], np.ones_like(q[:, :, :1])], axis=2)
    out = jitops.attention(q, k, v, scale=1.0, schedule=tile(1, 16), precision="tf32")
    s1, s2 = 8 * (1 + 2.0 ** -10) ** 2, 8 * (1 + 2.0 ** -10)
    p1 = np.array([np.exp(s2 - s1)], dtype=np.float32).view(np.uint32)      # key 1's probability, rounded
    w1 = 1 / (1 + float(((p1 + 0x1000) & 0xFFFFE000).view(np.float32)[0]))    # as the softmax sums it
    assert abs(float(out[0, 0, 0, 0]) - w1) < 2e-6, (float(out[0, 0, 0, 0]), w1)


def test_precision_policy_and_keys():
    h100, a100, rdna = (get_backend(target=t).device for t in ("sm_90", "sm_80", "gfx1100"))
    shape = (8, 16, 2048, 64)
    tf32, exact = problem(shape, shape), problem(shape, shape, precision="highest")
    assert op.heuristic(tf32, h100).algorithm == "fused_tf32"
    assert op.heuristic(tf32, a100).algorithm == "fused_tf32"
    assert op.heuristic(exact, h100).algorithm == "fused"
    assert op.heuristic(tf32, rdna).algorithm == "fused"             # no matrix cores: exact kernels
    assert problem(shape, shape, precision="3xtf32").precision == "highest"   # exact kernels give near-fp32
    half = problem(shape, shape, dtype="float16")
    assert half.precision == "highest" and op.heuristic(half, h100).algorithm == "fused_wgmma"
    # keys: "highest" keeps the key every earlier record and bundle has; tf32 problems get their own
    assert "precision" not in exact.key() and "tf32" in tf32.key() and tf32.key() != exact.key()
    assert not any(s.algorithm == "fused_tf32" for s in op.candidates(exact, h100))
    assert any(s.algorithm == "fused_tf32" for s in op.candidates(tf32, h100))
    with pytest.raises(ScheduleError, match="precision='tf32'"):
        op.heuristic(exact, h100, "fused_tf32")
    with pytest.raises(ArgumentError, match="precision"):
        problem(shape, shape, precision="fp8")


def test_set_fp32_precision_reaches_attention():
    shape = (2, 4, 64, 64)
    try:
        jitops.set_fp32_precision("tf32")
        assert op.make_problem({n: TensorSpec(shape, "float32") for n in "qkv"} | {"mask": None}, {}).precision == "tf32"
    finally:
        jitops.set_fp32_precision("highest")
    assert op.make_problem({n: TensorSpec(shape, "float32") for n in "qkv"} | {"mask": None}, {}).precision == "highest"


def test_tf32_tiles_by_grid_and_mask():
    """The mma.sync tile (the pick off sm_90 and off the wgmma form's region): 256-row blocks where they fill their waves, 128-row ones (8 x 16) where they do not, 64 rows for small calls;
    one row group under a mask (two spill there); 64-key tiles at DP = 64 only; D = 256 on 16-key tiles."""
    h100 = get_backend(target="sm_90").device
    pick = lambda q, kv=None, **kw: mma_tf32_schedule(problem(q, kv or q, **kw), h100)   # noqa: E731
    assert pick((8, 16, 2048, 64)).as_dict()["params"] == {"warps": 8, "row_groups": 2, "block_k": 64}
    assert pick((1, 32, 2048, 128), (1, 8, 2048, 128), causal=True).as_dict()["params"] == \
        {"warps": 8, "row_groups": 2, "block_k": 32}
    assert pick((8, 12, 384, 64)).as_dict()["params"] == {"warps": 8, "block_k": 64}
    assert pick((1, 12, 128, 64)).as_dict()["params"] == {"warps": 4, "block_k": 64}
    # 256 blocks of 256 rows fill the waves, but half their rows are past Sq = 128: 128-row blocks
    assert pick((256, 1, 128, 64)).as_dict()["params"] == {"warps": 8, "block_k": 64}
    assert pick((8, 12, 384, 64), mask=(8, 1, 1, 384)).as_dict()["params"] == {"warps": 8, "block_k": 64}
    assert pick((1, 16, 2048, 256), causal=True).as_dict()["params"] == {"warps": 8, "block_k": 16}
    masked = problem((8, 12, 384, 64), (8, 12, 384, 64), mask=(8, 1, 1, 384))
    assert all(not s.get("row_groups") for s in op.candidates(masked, h100) if s.algorithm == "fused_tf32")
    # AMD (64 KiB of shared memory): D = 256 does not fit even one warp's tile: the exact kernels
    gfx = get_backend(target="gfx90a").device
    assert op.heuristic(problem((1, 16, 2048, 256), (1, 16, 2048, 256)), gfx).algorithm != "fused_tf32"


def test_tf32_wgmma_region_and_tiles():
    """sm_90: the wgmma form for encoder-length calls (D <= 64, keys <= 512, no causal masking), its warpgroups
    by the grid; long keys, causal calls, D > 64 and other devices keep the mma.sync tile; every candidate plans."""
    h100, a100 = (get_backend(target=t).device for t in ("sm_90", "sm_80"))
    pick = lambda q, kv=None, **kw: op.heuristic(problem(q, kv or q, **kw), h100).as_dict()["params"]   # noqa: E731
    assert pick((8, 12, 384, 64)) == {"wgmma": 1, "groups": 3, "block_k": 64, "stages": 2}
    assert pick((8, 12, 384, 64), mask=(8, 1, 1, 384)) == {"wgmma": 1, "groups": 3, "block_k": 64, "stages": 2}
    assert pick((256, 1, 128, 64)) == {"wgmma": 1, "groups": 2, "block_k": 32, "stages": 2}      # 192 rows: 2/3 padding
    assert pick((8, 12, 197, 64)) == {"wgmma": 1, "groups": 2, "block_k": 32, "stages": 2}
    assert pick((1, 12, 128, 64)) == {"wgmma": 1, "groups": 1, "block_k": 64, "stages": 2}       # 12 heads: one wave
    for q, kv, kw in (((1, 20, 1500, 64), None, {}), ((8, 12, 384, 64), None, {"causal": True}),
                      ((4, 16, 384, 80), None, {}), ((2, 8, 40, 64), None, {})):
        assert "wgmma" not in pick(q, kv, **kw), (q, kw)
    assert "wgmma" not in op.heuristic(problem((8, 12, 384, 64), (8, 12, 384, 64)), a100).as_dict()["params"]
    p = problem((2, 4, 197, 72), (2, 2, 77, 72), causal=True, mask=(197, 77))
    wg = [s for s in op.candidates(p, h100) if s.get("wgmma")]
    assert wg and all(op.plan(p, s, h100).launches[0].shared_bytes <= h100.shared_per_block_optin for s in wg)
    assert not [s for s in op.candidates(p, a100) if s.get("wgmma")]
    with pytest.raises(ScheduleError, match="shared memory"):
        op.plan(p, Schedule.make("fused_tf32", wgmma=1, groups=3, block_k=128, stages=4), h100)
    with pytest.raises(ScheduleError, match="sm_90"):
        op.plan(p, Schedule.make("fused_tf32", wgmma=1, groups=2, block_k=64, stages=2), a100)


def test_benchmark_mode_shortlist_times_the_tf32_tiles_that_won():
    """Benchmark mode's shortlist of an fp32 TF32 pick: the pick first, then distinct tiles that were the
    fastest somewhere, all planning, at most n; with a mask, one row group only."""
    h100 = get_backend(target="sm_90").device
    for q, kv, mask in (((8, 12, 197, 64), None, None), ((8, 16, 2048, 128), None, None),
                        ((8, 12, 384, 64), None, (8, 1, 1, 384)), ((1, 16, 2048, 256), None, None)):
        p = problem(q, kv or q, mask=mask)
        for n in (1, 3, 6):
            short = op.shortlist(p, h100, n)
            assert short[0] == op.heuristic(p, h100) and 1 <= len(short) <= n and len(set(short)) == len(short)
            assert all(s.algorithm == "fused_tf32" for s in short)
            for s in short:
                op.plan(p, s, h100)
        assert len(op.shortlist(p, h100, 6)) >= 2 or q[-1] == 256, op.shortlist(p, h100, 6)
        if mask:
            assert not any(s.get("row_groups") for s in op.shortlist(p, h100, 6))


@pytest.mark.skipif(not (importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.bindings.nvrtc")),
                    reason="needs NVRTC (cuda-bindings)")
def test_tf32_picks_compile_without_spills():
    """The sm_90 picks with the most registers (two row groups at D = 64 / 128, D = 256) compile offline
    without spills, on m16n8k8 TF32 products; so do the wgmma form's (m64nNk8 TF32, no serialized wgmma)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import nvrtc_ptx

    from jitops import engine
    h100 = get_backend(target="sm_90").device
    for q, kv, causal in (((8, 16, 2048, 64), None, False), ((1, 32, 2048, 128), (1, 8, 2048, 128), True),
                          ((1, 16, 2048, 256), None, True)):
        p = problem(q, kv or q, causal)
        launch = op.plan(p, op.heuristic(p, h100), h100).launches[0]
        ptx, text = nvrtc_ptx(engine.kernel_source(h100, launch), b"-arch=sm_90a", b"-std=c++17", b"-default-device",
                              b"--ptxas-options=-v")
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx and "cvt.rna.tf32.f32" in ptx
        assert re.search(r"\b0 bytes spill stores", text), text
    # the wgmma form's picks and its largest-register candidate (3 warpgroups at 512 threads: 128 registers)
    for p, s in ((problem((8, 12, 384, 64), (8, 12, 384, 64)), None),
                 (problem((1, 12, 128, 64), (1, 12, 128, 64), mask=(1, 1, 1, 128)), None),
                 (problem((4, 16, 384, 64), (4, 16, 384, 64)), Schedule.make("fused_tf32", wgmma=1, groups=3, block_k=64,
                                                                              stages=3))):
        launch = op.plan(p, s or op.heuristic(p, h100), h100).launches[0]
        assert dict(launch.params).get("groups")
        ptx, text = nvrtc_ptx(engine.kernel_source(h100, launch), b"-arch=sm_90a", b"-std=c++17", b"-default-device",
                              b"--ptxas-options=-v")
        assert "k8.f32.tf32.tf32" in ptx and "wgmma.mma_async" in ptx and "cvt.rna.tf32.f32" in ptx
        assert re.search(r"\b0 bytes spill stores", text) and "C75" not in text, text


def test_public_emulator_runs_exact_kernels_under_tf32(emu, rng):
    """No matrix cores (the public emulator): precision "tf32" is a permission, the exact kernels run."""
    shape = (1, 2, 20, 32)
    p = problem(shape, shape)
    assert op.heuristic(p, emu.device).algorithm == "fused"
    data = random_inputs(p, rng)
    out = jitops.attention(data["q"], data["k"], data["v"], precision="tf32")
    assert np.abs(out - reference(p, data)["out"]).max() <= 2e-5


def test_benchmark_mode_on_a_tf32_problem(mma_emu, isolated, rng):
    """A first call with benchmark mode on times the fused_tf32 shortlist on the device at hand (here the
    emulator's software fragments), checks each tile against the pick's output with the TF32 tolerance,
    and records the fastest under the problem's tf32 key; the result is TF32-accurate."""
    import json

    from jitops import config
    from jitops.tuning import benchmark
    shape = (1, 2, 40, 32)
    p = problem(shape, shape)
    short = op.shortlist(p, mma_emu.device, 3)
    assert len(short) == 3 and all(s.algorithm == "fused_tf32" for s in short)
    data = random_inputs(p, rng)
    try:
        jitops.set_benchmark(3)
        out = jitops.attention(data["q"], data["k"], data["v"], precision="tf32")
    finally:
        jitops.set_benchmark(False)
        config._benchmark[0] = None
        benchmark._told.clear()
    err = float(np.abs(out - reference(p, data)["out"]).max())
    assert FLOOR < err <= TF32_TOLERANCE
    rec, = json.loads(isolated[0].read_text())["records"]
    assert rec["problem"] == p.key() and "tf32" in rec["problem"] and rec["shortlist"] == 3
    assert rec["check"]["passed"] and Schedule.from_dict(rec["schedule"]) in short
