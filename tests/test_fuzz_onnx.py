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


def test_float16_multihead_attention_model_does_not_crash_the_cpu_provider():
    """ORT's CPU provider at its default level crashed (SIGSEGV) creating a session for this float16 model once a
    custom op library was registered (found by fuzz_onnx.py --dtype float16); session() lowers the level for
    float16 models on the CPU provider. Run in a child process: a crash must fail the test, not end pytest."""
    import json
    import subprocess
    spec = {"family": "transformer", "width": 32, "heads": 4, "blocks": 2, "norm": "rms", "prenorm": True,
            "attn": "mha_batch_first", "mask": "padding", "scale": "div", "opset": 17}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import fuzz_onnx; "
            "print(json.dumps(fuzz_onnx.run_model(json.loads(sys.argv[2]), 8 * 1009 + 11, 'cpu', 'float16')))")
    scripts = os.path.join(os.path.dirname(__file__), "..", "scripts")
    done = subprocess.run([sys.executable, "-c", code, scripts, json.dumps(spec)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "passed" and result["taken"], result
