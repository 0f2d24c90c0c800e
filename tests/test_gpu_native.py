"""The native repeat path on a real GPU (pytest -m gpu): every op's repeat call is correct against
float64, takes the native path, and can be captured in a CUDA graph whose replay (output
poisoned first) equals the eager result. The cases and checks are scripts/device_host.py's, which
also times them against torch."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import jitops

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "device_host", Path(__file__).resolve().parents[1] / "scripts" / "device_host.py")
device_host = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_host)
CASES = device_host.cases()


@pytest.fixture(autouse=True)
def gpu_backend():
    """The GPU, not the emulator the test session defaults to (conftest sets JITOPS_BACKEND=cpu)."""
    be = jitops.get_backend("cuda") if torch.version.hip is None else jitops.get_backend("hip")
    with jitops.use_backend(be):
        yield be


@pytest.mark.parametrize("name", list(CASES))
def test_repeat_call_native_correct_and_capturable(name):
    jit, ref_fn, tol = CASES[name]
    jit()
    y = jit()
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert device_host.rel_err(y, ref_fn(torch.float64)) <= tol
    op = name.split()[0]
    assert any(b is not None and b.native is not None
               for k, b in jitops.engine._cache.bound.items() if k[0] == op), "not on the native path"
    graph = device_host.graph_check(jit)
    assert graph == {"captured": True, "replay_equals_eager": True}
