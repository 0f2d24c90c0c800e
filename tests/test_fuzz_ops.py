"""scripts/fuzz_ops.py on the CPU emulator (a few small calls per op family, so CI runs the fuzzer's
reference and checks, and the kernels it reaches off the GPU, on every change)."""
from __future__ import annotations

import os
import random
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import fuzz_ops  # noqa: E402

import jitops  # noqa: E402


@pytest.mark.parametrize("family", ["conv2d", "attention", "norms"])
def test_random_calls_on_the_emulator(emu, family):
    fuzz_ops.DEVICE = "cpu"
    rng = random.Random(f"5-{family}")
    results = [fuzz_ops.run_case(torch, jitops, fuzz_ops.DRAW[family](rng, False, 0.001), 5 * 100003 + i)
               for i in range(6)]
    assert not [r for r in results if r["status"] == "failed"], results
    assert sum(r["status"] == "passed" for r in results) >= 4


@pytest.mark.parametrize("family", ["conv2d", "attention"])
def test_random_calls_on_the_matrix_core_emulator(mma_emu, family):
    """The same with matrix-core fragments in software, so the picks are the mma.sync (warp 32) and MFMA
    (warp 64, AMD's wave64 layouts) kernels, which no machine here runs on hardware."""
    fuzz_ops.DEVICE = "cpu"
    seed = {"conv2d": 7, "attention": 6}[family]            # seeds whose four draws the mma kernels take
    rng = random.Random(f"{seed}-{family}")
    results = [fuzz_ops.run_case(torch, jitops, fuzz_ops.DRAW[family](rng, True, 0.0003), seed * 100003 + i)
               for i in range(4)]
    assert not [r for r in results if r["status"] == "failed"], results
    assert any("_mma" in pick for r in results for pick in r.get("picks", [])), results


def test_a_wrong_answer_fails_the_check():
    """The check itself can fail: one element off by a few percent of the RMS, and a NaN."""
    fuzz_ops.DEVICE = "cpu"
    ref = torch.randn(64, dtype=torch.float64)
    y = ref.clone()
    y[5] += 0.05 * float(ref.pow(2).mean().sqrt())
    assert not fuzz_ops.check(torch, y.half(), ref, {"op": "leaky_relu", "dtype": "float16"})[0]
    y = ref.clone()
    y[0] = float("nan")
    assert not fuzz_ops.check(torch, y, ref, {"op": "leaky_relu", "dtype": "float32"})[0]
    assert fuzz_ops.check(torch, ref.half(), ref, {"op": "leaky_relu", "dtype": "float16"})[0]
