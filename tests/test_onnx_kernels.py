"""The kernel plumbing under the ONNX Runtime ops, on the emulator: raw pointers, the library's ABI."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from jitops import engine
from jitops.ops.base import TensorSpec


def test_run_pointers_matches_run_on_the_same_buffers(rng):
    x = rng.standard_normal((16, 96)).astype(np.float32)
    gamma = (rng.random(96) + 0.5).astype(np.float32)
    attrs = {"normalized_shape": (96,), "eps": 1e-5}
    expected = engine.run("rms_norm", {"x": x, "gamma": gamma}, attrs)
    out = np.full_like(x, np.nan)
    engine.run_pointers("rms_norm", {"x": (x.ctypes.data, TensorSpec(x.shape, "float32")),
                                     "gamma": (gamma.ctypes.data, TensorSpec(gamma.shape, "float32"))},
                        attrs, {"y": out.ctypes.data}, stream=0)
    np.testing.assert_array_equal(out, expected)


def test_library_exports_only_the_entry_points():
    pytest.importorskip("onnxruntime")
    from jitops.onnx.native import library_path
    res = subprocess.run(["nm", "-D", "--defined-only", str(library_path())], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("no nm here")
    ours = sorted(line.split()[-1] for line in res.stdout.splitlines() if " T " in line)
    assert ours == ["RegisterCustomOps", "jitops_ort_configure", "jitops_ort_output", "jitops_ort_shutdown"]


def test_registering_the_library_without_jitops_is_a_clear_ort_error():
    ort = pytest.importorskip("onnxruntime")
    from jitops.onnx.native import library_path
    script = (f"import onnxruntime as ort\nso = ort.SessionOptions()\n"
              f"try:\n    so.register_custom_ops_library({str(library_path())!r})\n    print('no error')\n"
              f"except Exception as exc:\n    print('error:', exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout
    assert "error:" in out and "jitops.onnx.session()" in out, (ort.__version__, out)
