"""Random calls of the public API against torch in float64 on the GPU (pytest -m gpu): the fixed seeds of
scripts/fuzz_ops.py, every op family, no wrong or unwritten element, crash or unclear exception."""
from __future__ import annotations

import os
import random
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]   # conftest: the GPU, not the emulator
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import fuzz_ops  # noqa: E402

import jitops  # noqa: E402


@pytest.mark.parametrize("family", ["conv2d", "attention", "norms"])
def test_random_calls_match_float64(family):
    fuzz_ops.DEVICE = "cuda"
    rng = random.Random(f"7-{family}")
    failed = []
    for i in range(60):
        case = fuzz_ops.DRAW[family](rng, True, 2.0)
        result = fuzz_ops.run_case(torch, jitops, case, 7 * 100003 + i)
        if result["status"] == "failed":
            failed.append((case, result))
    assert not failed, failed[:3]
