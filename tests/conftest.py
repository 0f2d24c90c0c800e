"""Test setup: one fresh binary cache for the session, emulator backends for warp 32 and 64."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

# Before jitops is imported anywhere: a private cache, so tests never read a stale user cache.
if "JITOPS_CACHE_DIR" not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="jitops-test-cache-")
    os.environ["JITOPS_CACHE_DIR"] = _SESSION_CACHE
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)   # tens of MB of binaries a run
os.environ.setdefault("JITOPS_BACKEND", "cpu")

import jitops  # noqa: E402
from jitops.runtime import get_backend, use_backend  # noqa: E402


@pytest.fixture(params=[32, 64], ids=["warp32", "warp64"])
def emu(request):
    """The CPU emulator in checked mode (bounds and deadlock checks), for each warp size."""
    backend = get_backend("cpu", warp_size=request.param, checked=True)
    with use_backend(backend):
        yield backend


@pytest.fixture(params=[32, 64], ids=["warp32", "warp64"])
def mma_emu(request):
    """The emulator in checked mode with matrix-core fragments done in software (the public
    emulator reports none, so schedulers never pick them there): the matrix-core kernels' numerics
    at warp 32 (mma.sync layouts) and warp 64 (MFMA layouts)."""
    import dataclasses
    from jitops.runtime.cpu_backend import CpuBackend
    backend = CpuBackend(warp_size=request.param, checked=True)
    backend.device = dataclasses.replace(backend.device, matrix_cores=True)
    with use_backend(backend):
        yield backend


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A private user-record file and shipped-schedules folder for one test: (user file, folder).
    Prepared plans and the record store are dropped before and after, so no record leaks across."""
    from jitops import config, engine, records
    user = tmp_path / "cache" / "records" / "user.json"
    shipped = tmp_path / "schedules"
    shipped.mkdir()
    monkeypatch.setattr(records, "user_records_path", lambda: user)
    monkeypatch.setattr(config, "schedules_dir", lambda: shipped)
    records.store().invalidate()
    engine.clear_prepared()
    yield user, shipped
    records.store().invalidate()
    engine.clear_prepared()


@pytest.fixture
def gpu_backend():
    """The GPU backend (CUDA, or HIP on a ROCm torch), not the emulator the test session defaults
    to; GPU test modules use it with `pytest.mark.usefixtures("gpu_backend")`."""
    import jitops
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    be = jitops.get_backend("cuda") if torch.version.hip is None else jitops.get_backend("hip")
    with jitops.use_backend(be):
        yield be
    jitops.engine.clear_prepared()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def probe():
    """The probe backend (launches recorded, nothing runs) with no prepared plan before or after."""
    from jitops import engine
    from jitops.runtime.probe_backend import ProbeBackend
    backend = ProbeBackend()
    engine.clear_prepared()
    with use_backend(backend):
        yield backend
    backend.native.probe_set_status(0)
    engine.clear_prepared()


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    return float(np.abs(got - ref).max(initial=0.0) / scale)


def nvrtc_ptx(source: str, *options: bytes) -> tuple[str, str]:
    """Compile CUDA source with NVRTC (no GPU needed): (PTX, compiler log); fails the test on an error."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    _, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    rc = int(nvrtc.nvrtcCompileProgram(prog, len(options), list(options))[0])
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.decode(errors="replace")
    assert rc == 0, text
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.decode(errors="replace"), text
