"""An installed wheel finds its templates and schedules (built and installed in a fresh venv)."""
from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    wheel_dir = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(wheel_dir), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = next(wheel_dir.glob("jitops-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=True).create(env_dir)
    py = env_dir / "bin" / "python"
    inst = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    script = (
        "import jitops, numpy as np, jitops.config as c\n"
        "assert not c.is_checkout(), c.templates_dir()\n"
        "assert (c.templates_dir() / 'leaky_relu' / 'vectorized.hip.j2').is_file()\n"
        "assert (c.templates_dir() / 'common' / 'prelude.h.j2').is_file()\n"
        "assert c.schedules_dir().is_dir()\n"
        "x = np.random.randn(1001).astype('float32')\n"
        "y = jitops.leaky_relu(x, 0.1)\n"
        "assert abs(y - np.where(x > 0, x, 0.1 * x)).max() == 0.0\n"
        "print('ok', c.templates_dir())\n")
    run = subprocess.run([str(py), "-c", script], capture_output=True, text=True, cwd=str(tmp_path),
                         env={"JITOPS_BACKEND": "cpu", "JITOPS_CACHE_DIR": str(tmp_path / "cache"),
                              "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "site-packages" in run.stdout
