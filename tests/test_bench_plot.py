"""`jitops bench --from/--markdown/--plot`: tables and pictures of a report, without a GPU."""
from __future__ import annotations

import gzip
import json

import pytest

from jitops.bench import plot
from jitops.cli import main
from jitops.errors import JitopsError


def _row(op, problem, variant, j, v, **extra):
    return {"op": op, "problem": problem, "variant": variant, "schedule": f"{variant}(x=1)", "error": 0.0,
            "jitops_us": j, "jitops_graph_us": j, "vendor": "torch", "vendor_us": v, "vendor_graph_us": v,
            "ratio": v / j, "gbs": None, "pct_copy": extra.get("pct"), "tflops": extra.get("tflops"), "notes": []}


REPORT = {"environment": {"device": "Test GPU", "arch": "sm_90", "jitops": "0", "date": "2026-11-23"},
          "rows": [_row("leaky_relu", "n=4096", "naive", 4.0, 2.0, pct=10.0),
                   _row("leaky_relu", "n=4096", "heuristic", 2.0, 2.0, pct=20.0),
                   _row("leaky_relu", "n=65536", "naive", 1.0, 4.0, pct=90.0),
                   _row("leaky_relu", "n=65536", "vectorized", 2.0, 4.0, pct=45.0),
                   _row("conv2d", "8x64x56x56", "heuristic", 10.0, 5.0, tflops=100.0)]}


def test_one_row_per_problem_the_schedulers_pick_first():
    rows = plot.best_rows(REPORT)
    assert [r["variant"] for r in rows["leaky_relu"]] == ["heuristic", "naive"]   # else the fastest
    assert len(rows["conv2d"]) == 1


def test_markdown_gives_geomean_worst_and_the_schedule_verbatim():
    text = plot.markdown(REPORT)
    assert "### leaky_relu — geomean 2.00x, worst 1.00x" in text      # sqrt(1.0 * 4.0)
    assert "### conv2d — geomean 0.50x, worst 0.50x" in text
    assert "`heuristic(x=1)`" in text and "Test GPU" in text


def test_plot_from_a_saved_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")   # an optional extra; the test extra installs it
    src = tmp_path / "r.json.gz"
    with gzip.open(src, "wt") as f:
        json.dump(REPORT, f)
    png = tmp_path / "r.png"
    assert main(["bench", "--from", str(src), "--plot", str(png), "--markdown"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "geomean" in capsys.readouterr().out


def test_a_file_that_is_not_a_report_is_refused(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(JitopsError, match="not a jitops bench report"):
        plot.load(bad)
