"""`jitops bench` latency rows (bench/latency.py) without a GPU: the check that refuses a wrong
result, both timings on host clocks (emulator, torch CPU tensors, a handful of calls), and the
--markdown / --plot output of a report's rows."""
from __future__ import annotations

import json

import pytest

import jitops
from jitops.bench import latency
from jitops.bench.timing import Timer
from jitops.cli import main

torch = pytest.importorskip("torch")


def leaky_case(x, fn=None) -> latency.LatencyCase:
    return latency.LatencyCase("300 fp32", fn or (lambda: jitops.leaky_relu(x, 0.1)),
                               lambda d=None: torch.nn.functional.leaky_relu(x if d is None else x.to(d), 0.1), 1e-6)


def test_measure_checks_then_times_both_sides(emu):
    x = torch.randn(300)
    row = latency.measure(leaky_case(x), Timer(None), torch, calls=(3, 3))
    assert row["problem"] == "300 fp32" and row["error"] <= 1e-6
    for key in ("sync_us", "eager_us"):
        assert row[key]["jitops"] > 0 and row[key]["torch"] > 0
        assert row[key]["torch_over_jitops"] == pytest.approx(row[key]["torch"] / row[key]["jitops"])


def test_measure_refuses_a_wrong_result(emu):
    x = torch.randn(300)
    with pytest.raises(AssertionError, match="error"):
        latency.measure(leaky_case(x, lambda: jitops.leaky_relu(x, 0.2)), Timer(None), torch, calls=(1, 1))


def test_no_rows_without_a_gpu():
    class Ctx:
        on_gpu = False
    assert latency.op_latency("leaky_relu", object(), Ctx()) is None


ROW = {"op": "conv2d", "problem": "1x64x56x56 * 64x64x3x3 fp32", "error": 1e-6,
       "sync_us": {"jitops": 20.0, "torch": 25.0, "torch_over_jitops": 1.25},
       "eager_us": {"jitops": 8.0, "torch": 12.0, "torch_over_jitops": 1.5}}
REPORT = {"environment": {"device": "Test GPU", "date": "2026-11-23"}, "rows": [], "latency": [ROW]}


def test_markdown_and_plot_of_latency_rows(tmp_path, capsys):
    text = latency.markdown(REPORT)
    assert "| conv2d | 1x64x56x56 * 64x64x3x3 fp32 | 20.00 | 25.00 | 1.25 | 8.00 | 12.00 | 1.50 |" in text
    assert latency.markdown({"rows": []}) == ""
    assert latency.plot_path(tmp_path / "b.png") == tmp_path / "b_latency.png"
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**REPORT, "rows": [{"op": "conv2d", "problem": "p", "variant": "heuristic",
                                                    "schedule": "s", "error": 0.0, "jitops_us": 2.0,
                                                    "jitops_graph_us": 2.0, "vendor": "torch", "vendor_us": 3.0,
                                                    "vendor_graph_us": 3.0, "ratio": 1.5, "gbs": None,
                                                    "pct_copy": None, "tflops": 1.0, "notes": []}]}))
    assert main(["bench", "--from", str(path), "--markdown"]) == 0
    assert "| conv2d | 1x64x56x56 * 64x64x3x3 fp32 | 20.00" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    assert latency.plot(REPORT, tmp_path / "l.png").stat().st_size > 1000
