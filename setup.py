"""Native parts built with the wheel, when a compiler is there (metadata lives in pyproject.toml).

- `jitops.runtime.jitops_launch`: the native launcher (runtime/native/*.c), a real
  extension module. Its `source_digest` names the source it was built from, so a stale in-place
  build beside edited sources is not used.
- `jitops/onnx/libjitops_ort-<digest>.so`: the ONNX Runtime custom-op library (not a Python
  module: ORT dlopens it), named by the digest of its sources as jitops.onnx.native computes it.

Both are optional: without a C or C++ compiler (or Python headers) the build still succeeds,
says what it skipped, and jitops compiles them on first use where it can (warning once if not).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE_DIR = Path("jitops/runtime/native")
# Every file of the launcher module, in the order jitops.runtime.fastlaunch hashes them.
LAUNCH_FILES = [NATIVE_DIR / f for f in ("jitops_native.h", "jitops_launch.c", "jitops_fastcall.c",
                                         "jitops_dispatch.c", "jitops_programmatic.c")]
ORT_DIR = Path("jitops/onnx/native")


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update((ROOT / p).read_bytes())
    return h.hexdigest()[:16]


def _say(message: str) -> None:
    print(f"jitops build: {message}", file=sys.stderr)


class OptionalNativeBuild(build_ext):
    """build_ext that never fails the build, and also builds the ORT custom-op library."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.force = True     # a build/ folder left by an earlier build must not stand in for this one

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: setuptools raises before building anything
            _say(f"native launcher not built ({exc}); jitops will compile it on first use")
        self._build_ort_library()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # compiler or Python.h missing
            _say(f"{ext.name} not built ({exc}); jitops will compile it on first use")

    def _build_ort_library(self) -> None:
        sources = [ORT_DIR / "ort_abi.h", ORT_DIR / "jitops_ort.cc"]   # the order native.sources_digest hashes
        digest = _digest(sources)
        target_dir = (ROOT / "jitops" / "onnx") if self.inplace else Path(self.build_lib) / "jitops" / "onnx"
        target = target_dir / f"libjitops_ort-{digest}.so"
        for stale in target_dir.glob("libjitops_ort-*.so"):
            stale.unlink()
        compiler = next((c for c in (os.environ.get("CXX"), "g++", "clang++", "c++") if c and shutil.which(c)), None)
        if compiler is None:
            _say("no C++ compiler: ONNX Runtime custom-op library not built; jitops will build it on first use")
            return
        target_dir.mkdir(parents=True, exist_ok=True)
        cmd = [compiler, "-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
               f"-I{ROOT / ORT_DIR}", f"-DJITOPS_ORT_SOURCES_{digest}", str(ROOT / ORT_DIR / "jitops_ort.cc"),
               "-o", str(target)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            _say(f"ONNX Runtime custom-op library not built ({res.stderr.strip()[:500]}); "
                 "jitops will build it on first use")
            target.unlink(missing_ok=True)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        onnx_dir = Path(self.build_lib) / "jitops" / "onnx"
        return outputs + [str(p) for p in onnx_dir.glob("libjitops_ort-*.so")]


setup(
    ext_modules=[Extension("jitops.runtime.jitops_launch", [str(f) for f in LAUNCH_FILES if f.suffix == ".c"],
                           depends=[str(LAUNCH_FILES[0])], optional=True,
                           define_macros=[("JITOPS_LAUNCH_DIGEST", f'"{_digest(LAUNCH_FILES)}"')],
                           extra_compile_args=["-O2"])],
    cmdclass={"build_ext": OptionalNativeBuild},
)
