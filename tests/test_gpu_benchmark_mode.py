"""Benchmark mode (jitops.set_benchmark) on a real GPU: a first call times the op's shortlist and
records the winner; the output is right either way; a first call made inside a CUDA-graph capture
times nothing, records nothing and the captured graph replays correctly."""
from __future__ import annotations

import json

import pytest

import jitops
from jitops import config, engine, records
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec
from jitops.records import store

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)
F = torch.nn.functional


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """The GPU backend, private user records, no shipped ones, benchmark mode reset afterwards."""
    from jitops.tuning import benchmark
    be = jitops.get_backend("cuda") if torch.version.hip is None else jitops.get_backend("hip")
    user = tmp_path / "records" / "user.json"
    monkeypatch.setattr(records, "user_records_path", lambda: user)
    (tmp_path / "schedules").mkdir()
    monkeypatch.setattr(config, "schedules_dir", lambda: tmp_path / "schedules")
    store().invalidate()
    engine.clear_prepared()
    with jitops.use_backend(be):
        yield be, user
    config._benchmark[0] = None
    benchmark._told.clear()
    store().invalidate()
    engine.clear_prepared()


def _records(user) -> list[dict]:
    return json.loads(user.read_text())["records"] if user.exists() else []


def test_first_calls_time_the_shortlist_and_record_it(fresh):
    be, user = fresh
    jitops.set_benchmark(3)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 64, 28, 28, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
    w = (torch.randn(128, 64, 3, 3, device="cuda", generator=g) / 24).half()
    y = jitops.conv2d(x, w, padding=1)
    ref = F.conv2d(x.double(), w.double(), padding=1)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 4e-3
    q = torch.randn(1, 4, 1024, 64, device="cuda", generator=g).half()
    o = jitops.attention(q, q, q)
    ref = F.scaled_dot_product_attention(q.double(), q.double(), q.double())
    assert float((o.double() - ref).abs().max() / ref.abs().max()) < 4e-3
    recs = {r["op"]: r for r in _records(user)}
    assert set(recs) == {"conv2d", "attention"}, recs.keys()
    for name, rec in recs.items():
        assert rec["shortlist"] == 3 and rec["check"]["passed"] and rec["check"]["reference"].startswith("the output of")
        assert rec["candidates"].get("ok", 0) >= 2, rec["candidates"]
        op = get_op(name)
        p = op.make_problem(*({"conv2d": ({"x": TensorSpec((4, 64, 28, 28), "float16", "nhwc"),
                                           "w": TensorSpec((128, 64, 3, 3), "float16")}, {"padding": 1}),
                               "attention": ({n: TensorSpec((1, 4, 1024, 64), "float16") for n in "qkv"}, {})}[name]))
        assert rec["problem"] == p.key()
        assert engine.select_schedule(op, p, be.device, backend=be) == (Schedule.from_dict(rec["schedule"]), "user")


def test_a_first_call_inside_a_graph_capture_times_nothing(fresh):
    be, user = fresh
    jitops.set_benchmark(True)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 64, 20, 20, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
    w = (torch.randn(64, 64, 3, 3, device="cuda", generator=g) / 24).half()
    out = torch.empty(2, 64, 20, 20, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    # the kernel loaded beforehand (forced schedule: another prepared plan, no record), as a user warms up
    pick = get_op("conv2d").heuristic(get_op("conv2d").make_problem(
        {"x": TensorSpec((2, 64, 20, 20), "float16", "nhwc"), "w": TensorSpec((64, 64, 3, 3), "float16")},
        {"padding": 1}), be.device)
    jitops.conv2d(x, w, padding=1, schedule=pick)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            jitops.conv2d(x, w, padding=1, out=out)          # the problem's first call: no timing in here
    graph.replay()
    torch.cuda.synchronize()
    ref = F.conv2d(x.double(), w.double(), padding=1)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 4e-3
    assert _records(user) == []
