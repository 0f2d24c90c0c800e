"""The jitops command: info, compile (offline targets, --source), cache, bench on the emulator."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jitops.cli import main


def test_info(capsys, monkeypatch):
    from jitops import config
    monkeypatch.setattr(config, "_benchmark", [None])
    monkeypatch.delenv("JITOPS_BENCHMARK", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend      cpu" in out and "cache" in out and "nvrtc" in out and "benchmark    off" in out
    assert "fp32 math    highest" in out
    monkeypatch.setenv("JITOPS_BENCHMARK", "4")
    assert main(["info"]) == 0
    assert "benchmark    on: first calls time up to 4 schedules" in capsys.readouterr().out


def test_compile_offline_targets(capsys):
    assert main(["compile", "leaky_relu", "x=1048576", "dtype=float32", "--target", "sm_90", "--target", "sm_80"]) == 0
    out = capsys.readouterr().out
    assert "[sm_90] cuda backend" in out and "[sm_80] cuda backend" in out
    assert "schedule  vectorized(" in out and "why" in out and "kernel    leaky_relu_vectorized" in out


def test_compile_hip_target(capsys):
    from jitops.errors import BackendUnavailable
    from jitops.runtime import get_backend
    try:
        get_backend(target="gfx90a")
    except BackendUnavailable:
        pytest.skip("hiprtc not installed")
    assert main(["compile", "leaky_relu", "x=4096", "dtype=float16", "--target", "gfx90a", "--source"]) == 0
    out = capsys.readouterr().out
    assert "[gfx90a] hip backend" in out and "JT_WARP_SIZE 64" in out and "typedef _Float16 jt_half" in out


def test_compile_bad_arguments(capsys):
    assert main(["compile", "leaky_relu", "x=12xq"]) == 2
    assert "AxBxC" in capsys.readouterr().err
    assert main(["compile", "nosuchop", "x=1"]) == 2
    assert "argument 'op'" in capsys.readouterr().err


def test_cache_info_and_clear(capsys):
    assert main(["cache", "info"]) == 0
    assert "entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out


def test_bench_quick_on_emulator(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "jitops", "bench", "--quick", "--ops", "leaky_relu",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["environment"]["backend"] == "cpu"
    assert {r["variant"] for r in report["rows"]} == {"heuristic", "vectorized", "naive"}
    assert all(r["error"] <= 1e-3 for r in report["rows"])
    assert report["extras"]["leaky_relu"]["cold_start"]["warm_cache"]["first_call_s"] > 0
