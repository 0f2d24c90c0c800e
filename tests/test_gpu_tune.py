"""End-to-end tune of the example model on a real GPU (pytest -m gpu -s prints the summary).

Targets: the ~20 conv/norm problems tune in <= 3 minutes with the default budget; after
tuning no problem is slower than its heuristic schedule (checked by timing both again, afresh);
tuning again is answered from the records in seconds.
"""
from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

import pytest

import jitops
from jitops import config, engine, records
from jitops.cli import main
from jitops.ops import get_op
from jitops.ops.base import Schedule
from jitops.records import store

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)
onnx = pytest.importorskip("onnx")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHAPE = "image=8x3x128x128"


@pytest.fixture(autouse=True)
def gpu_and_fresh_records(tmp_path, monkeypatch):
    be = jitops.get_backend("cuda") if torch.version.hip is None else jitops.get_backend("hip")
    monkeypatch.setattr(records, "user_records_path", lambda: tmp_path / "records" / "user.json")
    (tmp_path / "schedules").mkdir()
    monkeypatch.setattr(config, "schedules_dir", lambda: tmp_path / "schedules")   # no shipped records
    store().invalidate()
    with jitops.use_backend(be):
        yield be
    store().invalidate()
    engine.clear_prepared()


def test_tune_example_model(tmp_path, capsys, gpu_and_fresh_records):
    spec = importlib.util.spec_from_file_location("make_model", EXAMPLES / "make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "tiny_unet.onnx"
    onnx.save(mod.build_model(size=128), str(path))
    out_json = tmp_path / "tune.json"

    t0 = time.monotonic()
    rc = main(["tune", str(path), "--input-shape", SHAPE, "--json", str(out_json)])
    first = time.monotonic() - t0
    printed = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{printed}\nfirst tune: {first:.1f} s (default budget)")
    assert rc == 0
    rows = json.loads(out_json.read_text())
    conv_norm = [r for r in rows if r["op"] in ("conv2d", "batch_norm", "group_norm", "layer_norm", "rms_norm")]
    assert len(conv_norm) >= 19
    assert all(r["source"] == "tuned" for r in rows), [r["source"] for r in rows]
    assert first <= 180.0

    # Independent check: time heuristic and tuned schedules again, interleaved, on fresh buffers.
    from jitops.tuning.model import collect
    from jitops.tuning.tuner import remeasure
    problems, _ = collect(str(path), {"image": (8, 3, 128, 128)})
    by_key = {(r["op"], r["problem"]): r for r in rows}
    ratios = []
    lines = []
    for p in problems:
        r = by_key[(p.op, p.problem.key())]
        tuned, heur = Schedule.from_dict(r["schedule"]), Schedule.from_dict(r["heuristic"])
        if tuned == heur:
            ratios.append(1.0)
            continue
        t_us, h_us = remeasure(get_op(p.op), p.problem, [tuned, heur], gpu_and_fresh_records)
        if h_us / t_us < 0.95:
            # one re-measurement of a 2-6 us kernel can land 5% off (leaky_relu 1M fp32: 5.90 against
            # 5.60 us, H100 2026-11-26): the median of three decides
            more = [remeasure(get_op(p.op), p.problem, [tuned, heur], gpu_and_fresh_records) for _ in range(2)]
            t_us, h_us = sorted([(t_us, h_us), *more], key=lambda th: th[1] / th[0])[1]
        ratios.append(h_us / t_us)
        lines.append(f"  {p.op:<11} {p.problem.key()[:70]:<70} heuristic {h_us:9.2f} us  tuned {t_us:9.2f} us")
    gain = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    with capsys.disabled():
        print("re-measured (changed schedules only):\n" + "\n".join(lines))
        print(f"re-measured geometric-mean speedup over the heuristic: {gain:.3f}x over {len(ratios)} problems")
    # No problem slower than its heuristic, beyond the timing noise of one re-measurement (5%).
    assert min(ratios) >= 0.95, sorted(ratios)[:3]

    # Tuning again is answered from the records.
    t1 = time.monotonic()
    assert main(["tune", str(path), "--input-shape", SHAPE, "--no-vendor"]) == 0
    again = time.monotonic() - t1
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"second tune (records): {again:.1f} s")
    assert f"0 tuned now, {len(rows)} from records" in out
    assert again < 20.0
