"""An installed wheel carries its native parts and finds its templates and schedules.

Built and installed in a fresh venv (seeing the system's packages, so nothing is downloaded):
the native launcher and the ONNX Runtime custom-op library load from the installed package, not
from the checkout and not from a compile at first use. A wheel built where no compiler works still
builds, and the installed package then warns once per part and compiles it on first use.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import ctypes, sys, warnings, numpy as np
warnings.simplefilter("always")
import jitops, jitops.config as c
from jitops.runtime import fastlaunch
from jitops.onnx import native
site = sys.argv[1]
assert jitops.__file__.startswith(site), jitops.__file__
assert not c.is_checkout(), c.templates_dir()
assert (c.templates_dir() / 'leaky_relu' / 'vectorized.hip.j2').is_file()
assert (c.templates_dir() / 'common' / 'prelude.h.j2').is_file()
assert (c.schedules_dir() / 'sm_90.json').is_file()
launcher = fastlaunch.native_launcher()
assert launcher is not None and hasattr(launcher, 'Dispatch')
print('LAUNCHER', fastlaunch.origin, launcher.__file__)
lib = native.library_path()
ctypes.CDLL(str(lib), mode=ctypes.RTLD_LOCAL)
print('ORTLIB', lib)
if sys.argv[2] == "run":     # a kernel from the installed templates, on the emulator
    x = np.random.default_rng(0).standard_normal(1001).astype('float32')
    y = jitops.leaky_relu(x, 0.5)
    assert abs(y - np.where(x > 0, x, 0.5 * x.astype(np.float64))).max() == 0.0
"""


def _build_and_install(tmp_path: Path, name: str, env: dict[str, str]) -> tuple[Path, Path]:
    """(python of a fresh venv with the wheel installed, its site-packages)."""
    wheel_dir = tmp_path / f"wheels-{name}"
    source = tmp_path / f"src-{name}"      # pip builds in the tree: a copy keeps build/ out of the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "cache", "build", "*.egg-info", "__pycache__",
                                                                ".pytest_cache", "*.so"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheel_dir), str(source)], capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = next(wheel_dir.glob("jitops-*.whl"))
    env_dir = tmp_path / f"venv-{name}"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}    # a checkout on the path looks installed
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, env=clean)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    # The system's packages (numpy...) on the path, but not their .pth hooks: an editable jitops
    # installed there would otherwise be found before the wheel. Added after the install, so that
    # pip does not see (and replace) that other jitops.
    system = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "system-site.pth").write_text("\n".join(sorted(system)) + "\n")
    return py, site


def _check(py: Path, site: Path, tmp_path: Path, run_kernel: bool) -> subprocess.CompletedProcess:
    run = subprocess.run([str(py), "-c", CHECK, str(site), "run" if run_kernel else "load"], capture_output=True, text=True, cwd=str(tmp_path),
                         env={"JITOPS_BACKEND": "cpu", "JITOPS_CACHE_DIR": str(tmp_path / "cache"),
                              "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def _line(out: str, tag: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(tag + " "))


@pytest.mark.slow
def test_wheel_carries_its_native_parts(tmp_path):
    py, site = _build_and_install(tmp_path, "full", dict(os.environ))
    run = _check(py, site, tmp_path, run_kernel=True)
    launcher = _line(run.stdout, "LAUNCHER")
    assert launcher.startswith("LAUNCHER prebuilt ") and str(site / "jitops" / "runtime") in launcher, launcher
    ort = _line(run.stdout, "ORTLIB")
    assert str(site / "jitops" / "onnx" / "libjitops_ort-") in ort, ort
    assert "JitopsWarning" not in run.stderr, run.stderr
    assert not (tmp_path / "cache" / "native").exists() or not any(
        p.name.startswith(("jitops_launch", "libjitops_ort")) for p in (tmp_path / "cache" / "native").iterdir())


@pytest.mark.slow
def test_wheel_built_without_compiler_falls_back_with_one_warning_each(tmp_path):
    env = {**os.environ, "CC": "/bin/false", "CXX": "/bin/false", "LDSHARED": "/bin/false -shared"}
    py, site = _build_and_install(tmp_path, "bare", env)
    assert not list((site / "jitops" / "runtime").glob("jitops_launch*.so"))
    assert not list((site / "jitops" / "onnx").glob("libjitops_ort-*.so"))
    run = _check(py, site, tmp_path, run_kernel=False)
    assert _line(run.stdout, "LAUNCHER").startswith(f"LAUNCHER {tmp_path / 'cache' / 'native'}")
    assert str(tmp_path / "cache" / "native") in _line(run.stdout, "ORTLIB")
    assert run.stderr.count("JitopsWarning: jitops native launcher: no prebuilt copy") == 1, run.stderr
    assert run.stderr.count("JitopsWarning: jitops ONNX Runtime library: no prebuilt copy") == 1, run.stderr
