"""The CPU emulator backend: the same rendered HIP source, built with the host C++ compiler.

GPU threads run as fibers (see emu/jitops_emu_runtime.cpp), so __syncthreads() and warp
shuffles behave as on a GPU, with a warp of 32 or 64 lanes. Checked mode guards every buffer
and shared array and reports out-of-bounds accesses and barrier deadlocks. The alignment check
(kernels built with the compiler's alignment sanitizer, trapping) reports a misaligned vector
access, which x86 performs silently and a GPU faults on.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import config
from ..device import DeviceInfo
from ..errors import BackendUnavailable, CompileError, EmulatorFault, LaunchError
from .base import Backend, Kernel, PackedArgs, save_failed_source
from .hostcc import build_library, compiler_version, find_compiler, write_cached

log = logging.getLogger("jitops.cpu")

EMU_DIR = Path(__file__).resolve().parent / "emu"
_ERRLEN = 4096


class _LaunchCfg(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("dynamic_smem", ctypes.c_ulonglong),
        ("warp_size", ctypes.c_int),
        ("workers", ctypes.c_int),
        ("checked", ctypes.c_int),
        ("stack_kb", ctypes.c_int),
        ("kernel", ctypes.c_char_p),
        ("nargs", ctypes.c_int),
        ("args", ctypes.c_void_p),
        ("buf_bytes", ctypes.POINTER(ctypes.c_longlong)),
        ("buf_itemsize", ctypes.POINTER(ctypes.c_int)),
        ("arg_names", ctypes.POINTER(ctypes.c_char_p)),
    ]


class CpuBackend(Backend):
    """Host emulator of a GPU with a configurable warp size."""

    name = "cpu"
    reads_buffer_sizes = True
    _runtime_lock = threading.Lock()
    _runtime: dict[str, ctypes.CDLL] = {}

    def __init__(self, warp_size: int | None = None, checked: bool | None = None, workers: int | None = None,
                 check_alignment: bool | None = None):
        if warp_size is None:
            warp_size = int(os.environ.get(config.ENV_CPU_WARP_SIZE, "32"))
        if warp_size not in (32, 64):
            raise BackendUnavailable(f"cpu backend: warp_size must be 32 or 64, got {warp_size}")
        self.checked = config.env_flag(config.ENV_CPU_CHECK) if checked is None else bool(checked)
        self.check_alignment = (config.env_flag(config.ENV_CPU_CHECK_ALIGNMENT) if check_alignment is None
                                else bool(check_alignment))
        self.workers = workers or int(os.environ.get(config.ENV_CPU_THREADS, "0") or 0) or (os.cpu_count() or 1)
        self.stack_kb = int(os.environ.get(config.ENV_CPU_STACK_KB, "64"))
        self.cxx = find_compiler(cxx=True)
        self._cxx_version = compiler_version(self.cxx)
        header = (EMU_DIR / "jitops_emu.h").read_bytes()
        runtime_src = (EMU_DIR / "jitops_emu_runtime.cpp").read_bytes()
        self._emu_hash = hashlib.sha256(header + runtime_src).hexdigest()[:16]
        amd_like = warp_size == 64
        self.device = DeviceInfo(
            backend="cpu", arch="cpu", name=f"CPU emulator (warp {warp_size})", warp_size=warp_size,
            multiprocessors=max(2, os.cpu_count() or 2), max_threads_per_block=1024,
            shared_per_block=(64 if amd_like else 48) * 1024,
            shared_per_block_optin=(64 if amd_like else 99) * 1024,
            shared_per_multiprocessor=(64 if amd_like else 100) * 1024,
            l2_bytes=4 * 1024 * 1024, matrix_cores=False, online=True)
        self._buffers: dict[int, np.ndarray] = {}
        self._lib = self._load_runtime()

    # ---- compilation ----
    def compiler_id(self) -> str:
        return f"{self._cxx_version} emu-{self._emu_hash}"

    def compile_options(self) -> tuple[str, ...]:
        base = ("-std=c++17", "-O2", "-fPIC", "-shared", "-U_FORTIFY_SOURCE", "-fno-strict-aliasing",
                "-w", "-fvisibility=hidden")
        if self.check_alignment:    # a trap (SIGILL, reported by the runtime) per misaligned typed access
            return base + ("-fsanitize=alignment", "-fsanitize-undefined-trap-on-error")
        return base

    @property
    def binary_format(self) -> str:
        return "so"

    def _build(self, source: str, out: Path, extra: Sequence[str], label: str) -> None:
        with tempfile.TemporaryDirectory(prefix="jitops-cpu-") as tmp:
            src = Path(tmp) / f"{label}.cpp"
            src.write_text(source)
            cmd = [self.cxx, *self.compile_options(), *extra, f"-I{EMU_DIR}", str(src), "-o", str(out)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                saved = save_failed_source(label, source)
                raise CompileError("cpu", "host", f"$ {' '.join(cmd)}\n{res.stderr}", saved)

    def compile(self, source: str, kernel_names: Sequence[str], label: str) -> bytes:
        thunks = "\n".join(
            f'extern "C" __attribute__((visibility("default"))) void jt_emu_thunk_{k}(void** a) '
            f"{{ jt_emu::invoke({k}, a); }}" for k in kernel_names)
        with tempfile.TemporaryDirectory(prefix="jitops-cpu-") as tmp:
            out = Path(tmp) / "kernel.so"
            self._build(source + "\n// ---- emulator entry points ----\n" + thunks + "\n", out, [], label)
            return out.read_bytes()

    def _load_runtime(self) -> ctypes.CDLL:
        with self._runtime_lock:
            lib = self._runtime.get(self._emu_hash)
            if lib is None:
                path = build_library("libjitops_emu", [EMU_DIR / "jitops_emu_runtime.cpp"],
                                     ["-std=c++17", "-O2", "-fPIC", "-shared", "-U_FORTIFY_SOURCE", f"-I{EMU_DIR}",
                                      "-lpthread"])
                lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                lib.jt_emu_launch.argtypes = [ctypes.POINTER(_LaunchCfg), ctypes.c_void_p, ctypes.c_char_p,
                                              ctypes.c_int]
                lib.jt_emu_launch.restype = ctypes.c_int
                self._runtime[self._emu_hash] = lib
            return lib

    # ---- loading and launching ----
    def load(self, binary: bytes, kernel_names: Sequence[str]) -> dict[str, Kernel]:
        digest = hashlib.sha256(binary).hexdigest()[:24]
        path = config.cache_dir() / "emu" / "so" / f"{digest}.so"
        if not path.exists() or path.stat().st_size != len(binary):
            path = write_cached(Path("emu") / "so" / f"{digest}.so", binary)
        try:
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            raise LaunchError(f"cpu backend: could not load kernel library {path}: {exc}") from exc
        kernels = {}
        for k in kernel_names:
            try:
                fn = getattr(lib, f"jt_emu_thunk_{k}")
            except AttributeError as exc:
                raise LaunchError(f"cpu backend: kernel '{k}' not found in {path}") from exc
            kernels[k] = Kernel(name=k, handle=ctypes.cast(fn, ctypes.c_void_p).value, module=lib)
        return kernels

    def launch(self, kernel: Kernel, grid, block, shared_bytes: int, args: PackedArgs, stream: int) -> None:
        n = len(args.kinds)
        cfg = _LaunchCfg()
        cfg.grid[:] = [int(g) for g in grid]
        cfg.block[:] = [int(b) for b in block]
        cfg.dynamic_smem = int(shared_bytes)
        cfg.warp_size = self.device.warp_size
        cfg.workers = self.workers
        cfg.checked = 1 if self.checked else 0
        cfg.stack_kb = self.stack_kb
        cfg.kernel = kernel.name.encode()
        cfg.nargs = n
        cfg.args = args.address
        cfg.buf_bytes = (ctypes.c_longlong * max(n, 1))(*args.buf_bytes)
        cfg.buf_itemsize = (ctypes.c_int * max(n, 1))(*args.buf_itemsize)
        names = (ctypes.c_char_p * max(n, 1))(*[s.encode() for s in args.names])
        cfg.arg_names = names
        err = ctypes.create_string_buffer(_ERRLEN)
        rc = self._lib.jt_emu_launch(ctypes.byref(cfg), kernel.handle, err, _ERRLEN)
        if rc != 0:
            raise EmulatorFault(err.value.decode(errors="replace"))

    # ---- memory: device memory is host memory ----
    def alloc(self, nbytes: int) -> int:
        buf = np.empty(max(int(nbytes), 1) + 256, dtype=np.uint8)
        addr = buf.ctypes.data
        aligned = (addr + 255) & ~255
        self._buffers[aligned] = buf
        return aligned

    def free(self, ptr: int) -> None:
        self._buffers.pop(ptr, None)

    def copy_to_device(self, dst: int, src_host: Any, nbytes: int, stream: int = 0) -> None:
        ctypes.memmove(dst, _host_address(src_host), nbytes)

    def copy_to_host(self, dst_host: Any, src: int, nbytes: int, stream: int = 0) -> None:
        ctypes.memmove(_host_address(dst_host), src, nbytes)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        ctypes.memset(ptr, value, nbytes)

    def synchronize(self, stream: int = 0) -> None:
        return None


def _host_address(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    return obj.ctypes.data
