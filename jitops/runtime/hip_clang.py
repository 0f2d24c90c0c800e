"""Offline HIP compilation with a system clang, for targets the installed hiprtc cannot build.

Debian's ROCm 5.2 hiprtc (comgr 2.4) aborts on gfx94x and RDNA3: its device libraries have no
ISA-version bitcode for them. clang >= 17 compiles HIP for those targets given the ROCm device
libraries plus that one missing file, which only defines the constant __oclc_ISA_version
(major*1000 + minor*100 + stepping); we generate it with llvm-as. The result is the same kind of
code object hiprtc returns, loadable with hipModuleLoadData.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import config
from ..errors import BackendUnavailable

DEVICE_LIB_DIRS = ("/opt/rocm/amdgcn/bitcode", "/opt/rocm/lib/llvm/lib/clang/*/lib/amdgcn/bitcode",
                   "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode")


def system_device_libs() -> Path | None:
    roots = [os.path.join(os.environ["ROCM_PATH"], "amdgcn", "bitcode")] if os.environ.get("ROCM_PATH") else []
    for pattern in (*roots, *DEVICE_LIB_DIRS):
        for d in sorted(glob.glob(pattern)):
            if os.path.isfile(os.path.join(d, "ocml.bc")):
                return Path(d)
    return None


def isa_suffix(arch: str) -> str:
    """'gfx942' -> '942', 'gfx90a' -> '90a' (the oclc_isa_version_<suffix>.bc naming)."""
    m = re.fullmatch(r"gfx([0-9a-f]+)", arch.split(":")[0])
    if not m:
        raise BackendUnavailable(f"hip backend: cannot parse target '{arch}'")
    return m.group(1)


def isa_version(arch: str) -> int:
    """gfx942 -> 9402, gfx90a -> 9010, gfx1100 -> 11000: major*1000 + minor*100 + stepping."""
    s = isa_suffix(arch)
    return int(s[:-2]) * 1000 + int(s[-2], 16) * 100 + int(s[-1], 16)


def hiprtc_supports(arch: str) -> bool:
    libs = system_device_libs()
    return libs is not None and (libs / f"oclc_isa_version_{isa_suffix(arch)}.bc").is_file()


@functools.lru_cache(maxsize=1)
def find_clang() -> tuple[str, str, str, str] | None:
    """(clang, ld.lld, llvm-as, version line) for the newest clang >= 17 on PATH, or None."""
    for v in ("21", "20", "19", "18", "17", ""):
        suffix = f"-{v}" if v else ""
        clang, lld, llvm_as = (shutil.which(f"{t}{suffix}") for t in ("clang", "ld.lld", "llvm-as"))
        if not (clang and lld and llvm_as):
            continue
        line = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        m = re.search(r"version (\d+)", line)
        if m and int(m.group(1)) >= 17:
            return clang, lld, llvm_as, line
    return None


def _device_lib_dir(arch: str, llvm_as: str) -> Path:
    """The system device libraries plus a generated ISA-version bitcode for `arch`."""
    system = system_device_libs()
    if system is None:
        raise BackendUnavailable("hip backend: no ROCm device libraries found (install rocm-device-libs)")
    folder = config.cache_dir() / "hip-devlibs" / arch
    isa = folder / f"oclc_isa_version_{isa_suffix(arch)}.bc"
    if isa.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for bc in system.glob("*.bc"):
        link = folder / bc.name
        if not link.exists():
            try:
                link.symlink_to(bc)
            except FileExistsError:
                pass
    with tempfile.TemporaryDirectory(prefix="jitops-isa-") as tmp:
        ll = Path(tmp) / "isa.ll"
        ll.write_text('target triple = "amdgcn-amd-amdhsa"\n'
                      f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) "
                      f"constant i32 {isa_version(arch)}, align 4\n")
        out = Path(tmp) / isa.name
        subprocess.run([llvm_as, str(ll), "-o", str(out)], check=True, capture_output=True)
        os.replace(out, isa)
    return folder


def clang_id() -> str:
    found = find_clang()
    return found[3] if found else "clang-unavailable"


def compile_with_clang(source: str, arch: str, label: str) -> tuple[bool, bytes, str]:
    """(ok, code object, log) from clang; BackendUnavailable when no suitable clang is installed."""
    found = find_clang()
    if found is None:
        raise BackendUnavailable(f"hip backend: the installed hiprtc cannot compile for {arch} and no clang >= 17 "
                                 "with ld.lld and llvm-as is on PATH (Debian: apt install clang-19 lld-19 llvm-19)")
    clang, lld, llvm_as, _ = found
    libs = _device_lib_dir(arch, llvm_as)
    include_root = "/usr" if os.path.isfile("/usr/include/hip/hip_runtime.h") else os.environ.get("ROCM_PATH", "/opt/rocm")
    with tempfile.TemporaryDirectory(prefix="jitops-clang-") as tmp:
        src = Path(tmp) / f"{hashlib.sha256(label.encode()).hexdigest()[:8]}.hip"
        out = Path(tmp) / "kernel.hsaco"
        src.write_text(source)
        cmd = [clang, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output", "-O3",
               "-std=c++17", f"--rocm-path={include_root}", f"--rocm-device-lib-path={libs}", f"--ld-path={lld}",
               str(src), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or not out.exists():
            return False, b"", f"$ {' '.join(cmd)}\n{res.stderr}"
        return True, out.read_bytes(), res.stderr
