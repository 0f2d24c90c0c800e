"""The native repeat path on a real GPU (pytest -m gpu): every op's repeat call (the bench latency
problem, jitops.bench.latency) is correct against float64, takes the native path with no Python
frame of jitops, and can be captured in a CUDA graph whose replay (output poisoned first) equals
the eager result; `jitops bench` gives every op a latency row. scripts/device_host.py times the
same cases against torch."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import jitops
from jitops.bench import latency

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]   # conftest: the GPU, not the emulator
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "device_host", Path(__file__).resolve().parents[1] / "scripts" / "device_host.py")
device_host = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_host)




@pytest.mark.parametrize("op", device_host.OPS)
def test_repeat_call_native_correct_and_capturable(op):
    case = latency.default_case(op, torch)
    case.jitops()
    y = case.jitops()
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    assert device_host.rel_err(y, case.torch(torch.float64)) <= case.tolerance
    assert any(b is not None and b.native is not None
               for k, b in jitops.engine._cache.bound.items() if k[0] == op), "not on the native path"
    frames = []
    package = str(Path(jitops.__file__).parent)     # the case's own closure lives in jitops/bench: not counted
    sys.setprofile(lambda frame, event, arg: event == "call" and frame.f_code.co_filename.startswith(package) and
                   "bench" not in frame.f_code.co_filename and frames.append(frame.f_code.co_name))
    try:
        case.jitops()
    finally:
        sys.setprofile(None)
    assert frames == [], f"Python frames of jitops on a repeat call: {frames}"
    graph = device_host.graph_check(case.jitops)
    assert graph == {"captured": True, "replay_equals_eager": True}


@pytest.mark.parametrize("op", device_host.OPS)
def test_bench_gives_every_op_a_latency_row(op):
    from jitops import bench
    ctx = bench.make_context(quick=True)
    row = latency.op_latency(op, importlib.import_module(f"jitops.bench.{op}"), ctx)
    assert row is not None and row["op"] == op and row["error"] <= latency.default_case(op, torch).tolerance
    for key in ("sync_us", "eager_us"):
        assert row[key]["jitops"] > 0 and row[key]["torch"] > 0
