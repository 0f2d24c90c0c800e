"""scripts/fuzz_onnx.py in CI: a few random conv nets and transformer stacks exported by torch, rewritten, and
run through the fallback bodies and the jitops kernels (emulator) against ONNX Runtime on the original."""
from __future__ import annotations

import os
import random
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import fuzz_onnx  # noqa: E402


@pytest.mark.parametrize("family", ["conv", "transformer"])
def test_random_models_match_onnx_runtime(family):
    rng = random.Random(f"11-{family}")
    draw = fuzz_onnx.draw_transformer if family == "transformer" else fuzz_onnx.draw_layers
    results = [fuzz_onnx.run_model(draw(rng), 11 * 1009 + i, "cpu") for i in range(3)]
    assert all(r["status"] == "passed" for r in results), results
    assert all(r["taken"] for r in results), results       # every model had something jitops took
