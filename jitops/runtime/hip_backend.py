"""AMD backend: hiprtc to a code object, hipModule* to load and launch, both through hip-python.

Offline (an explicit target such as "gfx90a", no GPU) it compiles in a worker subprocess: the
comgr shipped with ROCm 5.x aborts the whole process on some targets, and a subprocess keeps
that from taking the caller down. When only libamdhip64 is installed (Debian's ROCm 5.2, where
hiprtc lives inside it), a libhiprtc.so shim pointing at it is made in the jitops cache.
"""
from __future__ import annotations

import glob
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from .. import config
from ..device import KNOWN_TARGETS, DeviceInfo
from ..errors import BackendUnavailable, CompileError, LaunchError
from . import hip_clang
from .base import Backend, Kernel, PackedArgs, save_failed_source
from .hiprtc_worker import hiprtc_compile

HIP_ERROR_STREAM_CAPTURE_IMPLICIT = 906   # hipErrorStreamCaptureImplicit, as CUDA's code

log = logging.getLogger("jitops.hip")

_LIB_DIRS = ("/opt/rocm/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


def _rocm_roots() -> list[str]:
    roots = [os.environ.get("ROCM_PATH", ""), os.environ.get("HIP_PATH", ""), "/opt/rocm"]
    return [r for r in roots if r]


def find_hiprtc_library() -> Path | None:
    """libhiprtc.so, or the libamdhip64.so that contains hiprtc (ROCm 5.x)."""
    dirs = [os.path.join(r, "lib") for r in _rocm_roots()] + list(_LIB_DIRS)
    dirs += os.environ.get("LD_LIBRARY_PATH", "").split(":")
    for name in ("libhiprtc.so", "libhiprtc.so.*", "libamdhip64.so.5", "libamdhip64.so"):
        for d in dirs:
            if not d:
                continue
            hits = sorted(glob.glob(os.path.join(d, name)))
            if hits:
                return Path(hits[0])
    return None


def hip_environment() -> dict[str, str]:
    """Environment under which hip-python finds hiprtc (making the ROCm 5.x shim if needed)."""
    env = dict(os.environ)
    env.setdefault("HIP_PLATFORM", "amd")
    lib = find_hiprtc_library()
    if lib is None:
        raise BackendUnavailable("hip backend: no hiprtc library found (install ROCm, or on Debian "
                                 "'apt install libamdhip64-dev libhiprtc-builtins5 rocm-device-libs')")
    lib_dir = lib.parent
    if not lib.name.startswith("libhiprtc"):
        shim = config.cache_dir() / "hip-shim"
        link = shim / "lib" / "libhiprtc.so"
        if not link.exists() or os.path.realpath(link) != os.path.realpath(lib):
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".libhiprtc-{os.getpid()}.so")
            if tmp.exists() or tmp.is_symlink():
                tmp.unlink()
            tmp.symlink_to(lib.resolve())
            os.replace(tmp, link)
        env["ROCM_PATH"] = str(shim)
        lib_dir = link.parent
    # hip-python dlopens "libhiprtc.so" by name. Only a non-system folder is added: a system lib
    # dir first on LD_LIBRARY_PATH can swap the interpreter's own libpython.
    if str(lib_dir) not in _LIB_DIRS:
        env["LD_LIBRARY_PATH"] = f"{lib_dir}:" + env.get("LD_LIBRARY_PATH", "")
    return env


def _hip_python_version() -> str:
    try:
        return importlib.metadata.version("hip-python")
    except importlib.metadata.PackageNotFoundError:
        try:
            return "rocm-bindings-hip-" + importlib.metadata.version("rocm-bindings-hip")
        except importlib.metadata.PackageNotFoundError:
            return ""


def _offline_device(target: str) -> DeviceInfo:
    if target in KNOWN_TARGETS:
        return KNOWN_TARGETS[target]
    if not target.startswith("gfx"):
        raise BackendUnavailable(f"hip backend: unknown target '{target}' (expected gfxNNN, e.g. gfx90a)")
    wave = 32 if target.startswith(("gfx10", "gfx11", "gfx12")) else 64
    return DeviceInfo("hip", target, f"AMD {target} (offline target)", wave, 64, shared_per_block=64 * 1024,
                      shared_per_block_optin=64 * 1024, online=False)


class HipBackend(Backend):
    name = "hip"

    def __init__(self, target: str | None = None, ordinal: int | None = None):
        self.ordinal = int(os.environ.get(config.ENV_DEVICE, "0")) if ordinal is None else ordinal
        self._lock = threading.Lock()
        self._raised_smem: set[int] = set()
        # Offline, targets the installed hiprtc has no device library for go through clang.
        self._use_clang = target is not None and not hip_clang.hiprtc_supports(target)
        if self._use_clang:
            if hip_clang.find_clang() is None:
                raise BackendUnavailable(f"hip backend: the installed hiprtc cannot compile for {target} and no "
                                         "clang >= 17 with ld.lld and llvm-as is on PATH "
                                         "(Debian: apt install clang-19 lld-19 llvm-19)")
            self._compiler = hip_clang.clang_id()
            self.device = _offline_device(target)
            self.hip = None
            return
        if not _hip_python_version():
            raise BackendUnavailable("hip backend needs hip-python (pip install 'jitops[rocm]' with the "
                                     "hip-python version matching your ROCm)")
        lib = find_hiprtc_library()
        if lib is None:
            raise BackendUnavailable("hip backend: no hiprtc library found (install ROCm)")
        self._compiler = f"hiprtc:{lib.resolve().name} hip-python-{_hip_python_version()}"
        if target is not None:
            self.device = _offline_device(target)
            self.hip = None
            return
        self.device = self._probe_device()

    # ---- device ----
    def _probe_device(self) -> DeviceInfo:
        try:
            from hip import hip
        except Exception as exc:
            raise BackendUnavailable(f"hip backend: hip-python failed to load ({exc})") from exc
        self.hip = hip
        try:
            count = self._check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        except Exception as exc:
            raise BackendUnavailable(f"hip backend: no usable AMD GPU ({exc})") from exc
        if count <= self.ordinal:
            raise BackendUnavailable(f"hip backend: device {self.ordinal} requested, {count} present")
        self._check(hip.hipSetDevice(self.ordinal), "hipSetDevice")
        props = hip.hipDeviceProp_t()
        self._check(hip.hipGetDeviceProperties(props, self.ordinal), "hipGetDeviceProperties")
        arch = props.gcnArchName.decode().split(":")[0] if isinstance(props.gcnArchName, bytes) else \
            str(props.gcnArchName).split(":")[0]
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
        smem_mp = int(props.maxSharedMemoryPerMultiProcessor) or int(props.sharedMemPerBlock)
        return DeviceInfo(
            backend="hip", arch=arch, name=name.strip("\0"), warp_size=int(props.warpSize),
            multiprocessors=int(props.multiProcessorCount), max_threads_per_block=int(props.maxThreadsPerBlock),
            shared_per_block=int(props.sharedMemPerBlock), shared_per_block_optin=int(props.sharedMemPerBlock),
            shared_per_multiprocessor=smem_mp, registers_per_multiprocessor=int(props.regsPerMultiprocessor) or 65536,
            max_threads_per_multiprocessor=int(props.maxThreadsPerMultiProcessor) or 2048,
            l2_bytes=int(props.l2CacheSize), matrix_cores=arch.startswith(("gfx90a", "gfx94", "gfx95")), online=True)

    def _check(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            detail = str(err)
            try:
                detail = self.hip.hipGetErrorString(err).decode()
            except Exception:
                pass
            raise LaunchError(f"{what} failed: {detail}")
        if isinstance(result, tuple):
            return result[1] if len(result) == 2 else result[1:]
        return None

    # ---- compilation ----
    def compiler_id(self) -> str:
        return self._compiler

    def compile_options(self) -> tuple[str, ...]:
        return (f"--offload-arch={self.device.arch}", "-O3", "-std=c++17")

    @property
    def binary_format(self) -> str:
        return "hsaco"

    def compile(self, source: str, kernel_names: Sequence[str], label: str) -> bytes:
        if self._use_clang:
            ok, binary, compile_log = hip_clang.compile_with_clang(source, self.device.arch, label)
        elif self.device.online:
            ok, binary, compile_log = hiprtc_compile(source, label, list(self.compile_options()))
        else:
            ok, binary, compile_log = self._compile_in_subprocess(source, label)
        if not ok:
            raise CompileError("hip", self.device.arch, compile_log, save_failed_source(label, source, ".hip"))
        return binary

    def _compile_in_subprocess(self, source: str, label: str) -> tuple[bool, bytes, str]:
        with tempfile.TemporaryDirectory(prefix="jitops-hiprtc-") as tmp:
            src, out = Path(tmp) / "kernel.hip", Path(tmp) / "kernel.hsaco"
            src.write_text(source)
            job = {"source": str(src), "output": str(out), "label": label, "options": list(self.compile_options())}
            worker = Path(__file__).resolve().with_name("hiprtc_worker.py")
            proc = subprocess.run([sys.executable, str(worker)], input=json.dumps(job), capture_output=True,
                                  text=True, env=hip_environment(), check=False)
            if proc.returncode == 0 and out.exists():
                return True, out.read_bytes(), proc.stderr
            detail = proc.stderr.strip() or f"hiprtc worker exited with status {proc.returncode}"
            if proc.returncode < 0:
                detail += f"\n(the compiler process died with signal {-proc.returncode})"
            return False, b"", detail

    # ---- modules and launches ----
    def load(self, binary: bytes, kernel_names: Sequence[str]) -> dict[str, Kernel]:
        self.require_device("load kernels")
        module = self._check(self.hip.hipModuleLoadData(binary), "hipModuleLoadData")
        out = {}
        for k in kernel_names:
            fn = self._check(self.hip.hipModuleGetFunction(module, k.encode()), f"hipModuleGetFunction({k})")
            out[k] = Kernel(k, fn, module)
        return out

    def launch(self, kernel: Kernel, grid, block, shared_bytes: int, args: PackedArgs, stream: int) -> None:
        self._check(self.hip.hipModuleLaunchKernel(kernel.handle, grid[0], grid[1], grid[2], block[0], block[1],
                                                   block[2], shared_bytes, stream, args.address, None),
                    f"hipModuleLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)})")

    def alloc(self, nbytes: int) -> int:
        self.require_device("allocate device memory")
        return int(self._check(self.hip.hipMalloc(max(int(nbytes), 1)), f"hipMalloc({nbytes})"))

    def free(self, ptr: int) -> None:
        if ptr:
            self._check(self.hip.hipFree(ptr), "hipFree")

    def copy_to_device(self, dst: int, src_host: Any, nbytes: int, stream: int = 0) -> None:
        src = src_host if isinstance(src_host, int) else src_host.ctypes.data
        self._check(self.hip.hipMemcpyHtoDAsync(dst, src, nbytes, stream), "hipMemcpyHtoDAsync")

    def copy_to_host(self, dst_host: Any, src: int, nbytes: int, stream: int = 0) -> None:
        dst = dst_host if isinstance(dst_host, int) else dst_host.ctypes.data
        self._check(self.hip.hipMemcpyDtoHAsync(dst, src, nbytes, stream), "hipMemcpyDtoHAsync")
        self.synchronize(stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        self._check(self.hip.hipMemsetD8Async(ptr, value, nbytes, stream), "hipMemsetD8Async")

    def capturing(self, stream: int = 0) -> bool:
        """Whether `stream` is being captured into a HIP graph (see Backend.capturing): the capture
        status (active or invalidated), and the legacy stream while another stream captures in
        global mode (hipErrorStreamCaptureImplicit), where a synchronize would break the capture."""
        result = self.hip.hipStreamIsCapturing(stream)
        err = result[0] if isinstance(result, tuple) else result
        if int(err) == HIP_ERROR_STREAM_CAPTURE_IMPLICIT:
            return True
        return int(self._check(result, "hipStreamIsCapturing")) != 0

    def synchronize(self, stream: int = 0) -> None:
        if stream:
            self._check(self.hip.hipStreamSynchronize(stream), "hipStreamSynchronize")
        else:
            self._check(self.hip.hipDeviceSynchronize(), "hipDeviceSynchronize")

    def create_stream(self) -> int:
        return int(self._check(self.hip.hipStreamCreateWithFlags(1), "hipStreamCreateWithFlags"))

    def destroy_stream(self, stream: int) -> None:
        self._check(self.hip.hipStreamDestroy(stream), "hipStreamDestroy")

    def create_event(self) -> Any:
        return self._check(self.hip.hipEventCreate(), "hipEventCreate")

    def record_event(self, event: Any, stream: int = 0) -> None:
        self._check(self.hip.hipEventRecord(event, stream), "hipEventRecord")

    def elapsed_ms(self, start: Any, end: Any) -> float:
        self._check(self.hip.hipEventSynchronize(end), "hipEventSynchronize")
        return float(self._check(self.hip.hipEventElapsedTime(start, end), "hipEventElapsedTime"))
