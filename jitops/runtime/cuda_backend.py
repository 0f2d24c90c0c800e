"""NVIDIA backend: NVRTC (cuda.bindings.nvrtc) to cubin; the driver (cuda_driver.py) to load and launch.

Uses the device's primary context, so it shares memory and streams with torch and CuPy.
Created with an explicit target (e.g. "sm_80") it compiles with no GPU present and refuses to
launch. NVRTC is imported only when something must be compiled; its version (part of every cache
key) is remembered on disk, so a warm start imports no CUDA Python bindings at all.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import json
import logging
import os
import threading
from typing import Any, Callable, Sequence

from .. import config
from ..device import KNOWN_TARGETS, DeviceInfo
from ..errors import BackendUnavailable, CompileError, LaunchError
from . import cuda_driver as drv
from .base import Backend, Kernel, PackedArgs, save_failed_source
from .fastlaunch import bind_native, native_launcher
from .hostcc import write_atomic

ARCH_SPECIFIC_MARK = "#define JT_REQUIRES_SM90A"   # in a source: compile for sm_90a

log = logging.getLogger("jitops.cuda")

_DEFAULT_SMEM = 48 * 1024
_CAPTURE_MODE_RELAXED = 2   # CU_STREAM_CAPTURE_MODE_RELAXED


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:  # cuda-python < 12.6 spelled it differently
            from cuda import nvrtc  # type: ignore
        except ImportError as exc:
            raise BackendUnavailable("cuda backend needs cuda-bindings and nvidia-cuda-nvrtc to compile "
                                     "(pip install 'jitops[cuda]')") from exc
    return nvrtc


def _nvrtc_files() -> list[str]:
    """The NVRTC binding and libraries, found without importing them."""
    files = []
    for mod in ("cuda.bindings.nvrtc", "cuda.nvrtc"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            files.append(spec.origin)
            break
    try:
        nvidia = importlib.util.find_spec("nvidia")
        roots = list(nvidia.submodule_search_locations or []) if nvidia else []
    except (ImportError, ValueError):
        roots = []
    for root in roots:
        files += glob.glob(os.path.join(root, "*", "lib", "libnvrtc*"))
    files += glob.glob("/usr/local/cuda*/lib64/libnvrtc*")
    return sorted(files)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[str, tuple[int, ...]]:
    """NVRTC's version and supported archs; from a small on-disk memo when the files are unchanged."""
    files = _nvrtc_files()
    stamp = [[f, os.stat(f).st_size, int(os.stat(f).st_mtime)] for f in files if os.path.exists(f)]
    memo = config.cache_dir() / "compilers.json"
    try:
        saved = json.loads(memo.read_text())
        entry = saved.get("nvrtc")
        if entry and entry["stamp"] == stamp:
            return entry["version"], tuple(entry["archs"])
    except (OSError, ValueError, KeyError, TypeError):
        saved = {}
    nv = _nvrtc()
    err, major, minor = nv.nvrtcVersion()
    if int(err) != 0:
        raise BackendUnavailable(f"NVRTC nvrtcVersion failed: {err}")
    try:
        _, archs = nv.nvrtcGetSupportedArchs()
        archs = sorted(int(a) for a in archs)
    except Exception:
        archs = []
    version = f"{major}.{minor}"
    saved = saved if isinstance(saved, dict) else {}
    saved["nvrtc"] = {"stamp": stamp, "version": version, "archs": archs}
    try:
        write_atomic(memo, json.dumps(saved).encode())
    except OSError:
        pass
    return version, tuple(archs)


def _offline_device(target: str) -> DeviceInfo:
    if target in KNOWN_TARGETS:
        return KNOWN_TARGETS[target]
    if not target.startswith("sm_") or not target[3:].rstrip("af").isdigit():
        raise BackendUnavailable(f"cuda backend: unknown target '{target}' (expected sm_XX, e.g. sm_90)")
    return DeviceInfo("cuda", target, f"NVIDIA {target} (offline target)", 32, 80, matrix_cores=True, online=False)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, target: str | None = None, ordinal: int | None = None):
        self.ordinal = int(os.environ.get(config.ENV_DEVICE, "0")) if ordinal is None else ordinal
        self._ctx = 0
        self._raised_smem: dict[int, int] = {}     # kernel handle -> dynamic bytes opted in
        self._programmatic: bool | None = None      # the device and driver can: asked once
        self._lock = threading.Lock()
        if target is not None:
            _nvrtc()  # an offline backend exists to compile: fail now if it cannot
            self.device = _offline_device(target)
            return
        self.device = self._probe_device()

    # ---- device ----
    def _probe_device(self) -> DeviceInfo:
        try:
            drv.call("cuInit", 0)
            count = drv.out_int("cuDeviceGetCount")
        except LaunchError as exc:
            raise BackendUnavailable(f"cuda backend: no usable NVIDIA device ({exc})") from exc
        if count <= self.ordinal:
            raise BackendUnavailable(f"cuda backend: device {self.ordinal} requested, {count} present")
        dev = drv.out_int("cuDeviceGet", self.ordinal)
        self._ctx = drv.out_ptr("cuDevicePrimaryCtxRetain", dev)
        drv.call("cuCtxSetCurrent", self._ctx)

        def attr(name: str) -> int:
            return drv.out_int("cuDeviceGetAttribute", drv.ATTR[name], dev)

        buf = ctypes.create_string_buffer(256)
        drv.call("cuDeviceGetName", buf, 256, dev)
        major, minor = attr("cc_major"), attr("cc_minor")
        return DeviceInfo(
            backend="cuda", arch=f"sm_{major}{minor}", name=buf.value.decode(errors="replace"),
            warp_size=attr("warp_size"), multiprocessors=attr("multiprocessors"),
            max_threads_per_block=attr("max_threads_per_block"),
            shared_per_block=attr("max_shared_per_block"),
            shared_per_block_optin=attr("max_shared_per_block_optin"),
            shared_per_multiprocessor=attr("max_shared_per_multiprocessor"),
            registers_per_multiprocessor=attr("max_registers_per_multiprocessor"),
            max_threads_per_multiprocessor=attr("max_threads_per_multiprocessor"),
            l2_bytes=attr("l2_bytes"), matrix_cores=major >= 8, online=True)

    def _ensure_context(self) -> None:
        drv.call("cuCtxSetCurrent", self._ctx)

    # ---- compilation ----
    def compiler_id(self) -> str:
        return f"nvrtc-{nvrtc_version()[0]}"

    def _compute_capability(self) -> int:
        """sm_90a -> 90."""
        return int(self.device.arch[3:].rstrip("af"))

    def _arch_option(self) -> str:
        cc = self._compute_capability()
        suffix = self.device.arch[3 + len(str(cc)):]
        supported = nvrtc_version()[1]
        if supported and cc > supported[-1]:
            # Newer GPU than this NVRTC knows: emit PTX for the newest arch it does; the driver JITs it.
            return f"-arch=compute_{supported[-1]}"
        return f"-arch=sm_{cc}{suffix}"

    def compile_options(self) -> tuple[str, ...]:
        return (self._arch_option(), "-std=c++17", "-default-device", "--ptxas-options=-v")

    def _source_options(self, source: str, label: str) -> list[str]:
        """The options for one source: Hopper's warpgroup instructions (wgmma, setmaxnreg) exist
        only on the arch-specific target, which a source asks for by defining JT_REQUIRES_SM90A
        (templates/common/wgmma.h.j2 does); such a cubin runs on compute capability 9.0 alone."""
        opts = list(self.compile_options())
        if ARCH_SPECIFIC_MARK in source:
            if self.device.arch.rstrip("a") != "sm_90":
                raise CompileError("cuda", self.device.arch,
                                   f"{label} uses Hopper warpgroup instructions (sm_90a); this device is "
                                   f"{self.device.arch}: its scheduler should not have chosen this kernel",
                                   save_failed_source(label, source, ".cu"))
            opts[0] = "-arch=sm_90a"
        return opts

    @property
    def binary_format(self) -> str:
        return "cubin"

    def compile(self, source: str, kernel_names: Sequence[str], label: str) -> bytes:
        nv = _nvrtc()
        err, prog = nv.nvrtcCreateProgram(source.encode(), f"{label}.cu".encode(), 0, [], [])
        if int(err) != 0:
            raise BackendUnavailable(f"nvrtcCreateProgram failed: {err}")
        try:
            opts = [o.encode() for o in self._source_options(source, label)]
            (res,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
            _, size = nv.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nv.nvrtcGetProgramLog(prog, buf)
            compile_log = buf.rstrip(b"\0 ").decode(errors="replace")
            if int(res) != 0:
                raise CompileError("cuda", self.device.arch, compile_log, save_failed_source(label, source, ".cu"))
            if self._arch_option().startswith("-arch=compute_"):
                _, size = nv.nvrtcGetPTXSize(prog)
                out = b" " * size
                err = nv.nvrtcGetPTX(prog, out)[0]
            else:
                _, size = nv.nvrtcGetCUBINSize(prog)
                out = b" " * size
                err = nv.nvrtcGetCUBIN(prog, out)[0]
            if int(err) != 0:
                raise BackendUnavailable(f"NVRTC could not return the binary: {err}")
            if compile_log:
                log.debug("%s: %s", label, compile_log.strip())
            return bytes(out)
        finally:
            nv.nvrtcDestroyProgram(prog)

    # ---- modules and launches ----
    def load(self, binary: bytes, kernel_names: Sequence[str]) -> dict[str, Kernel]:
        self.require_device("load kernels")
        self._ensure_context()
        module = drv.out_ptr("cuModuleLoadData", binary)
        out = {}
        for k in kernel_names:
            fn = drv.out_ptr("cuModuleGetFunction", module, k.encode())
            if (self.device.arch.rstrip("a") == "sm_90" and drv.PORTABLE_CLUSTER
                    < drv.out_int("cuFuncGetAttribute", drv.FUNC_ATTR["required_cluster_width"], fn)):
                # a compile-time cluster of more than 8 blocks (__cluster_dims__) launches only once allowed
                drv.call("cuFuncSetAttribute", fn, drv.FUNC_ATTR["non_portable_cluster_size_allowed"], 1)
            out[k] = Kernel(k, fn, module,
                            static_shared=drv.out_int("cuFuncGetAttribute", drv.FUNC_ATTR["shared_size_bytes"], fn),
                            registers=drv.out_int("cuFuncGetAttribute", drv.FUNC_ATTR["num_regs"], fn),
                            max_threads=drv.out_int("cuFuncGetAttribute", drv.FUNC_ATTR["max_threads_per_block"], fn))
        return out

    def _prepare_shared(self, kernel: Kernel, shared_bytes: int) -> None:
        """Opt a kernel in to more than the default 48 KiB per block, which counts static and dynamic shared
        memory together (a 48 KiB dynamic row beside a reduction's static scratch failed to launch)."""
        over_default = kernel.static_shared + shared_bytes > _DEFAULT_SMEM
        if over_default and self._raised_smem.get(kernel.handle, 0) < shared_bytes:
            drv.call("cuFuncSetAttribute", kernel.handle, drv.FUNC_ATTR["max_dynamic_shared_size_bytes"], shared_bytes)
            self._raised_smem[kernel.handle] = shared_bytes

    def _failed(self, code: int, kernel: Kernel, grid: Sequence[int], block: Sequence[int], shared: int) -> None:
        drv.check(code, f"cuLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)}, shared={shared})")

    def launch(self, kernel: Kernel, grid, block, shared_bytes: int, args: PackedArgs, stream: int) -> None:
        self.bind_launch(kernel, grid, block, shared_bytes)(args, stream)

    def can_launch_programmatic(self) -> bool:
        """Programmatic dependent launch is possible: an sm_90+ device and a driver with cuLaunchKernelEx."""
        if self._programmatic is None:
            self._programmatic = (self.can_launch and self._compute_capability() >= 90
                                  and bool(drv.launch_ex_address()))
        return self._programmatic

    def bind_launch(self, kernel: Kernel, grid: Sequence[int], block: Sequence[int],
                    shared_bytes: int, programmatic: bool = False) -> Callable[[PackedArgs, int], None]:
        self._prepare_shared(kernel, shared_bytes)
        gx, gy, gz = (int(v) for v in grid)
        bx, by, bz = (int(v) for v in block)
        mode = config.programmatic_launch_mode() if programmatic and self.can_launch_programmatic() else "off"
        native = native_launcher()
        if native is not None:
            entry = drv.launch_entry_address()
            if mode != "off":     # the native entry decides per launch (auto) or always carries the attribute
                entry = native.programmatic_setup(*drv.programmatic_entries())
                native.programmatic_mode(2 if mode == "on" else 1)
                native.programmatic_register(kernel.handle)
            return bind_native(native, entry, kernel.handle, grid, block, shared_bytes,
                               lambda rc, params, stream: self._retry_or_raise(rc, kernel, grid, block,
                                                                               shared_bytes, params, stream))
        if mode == "on":                     # no native launcher: ctypes (auto launches plainly)
            def launch_ex(args: PackedArgs, stream: int) -> None:
                rc = drv.launch_programmatic(kernel.handle, (gx, gy, gz), (bx, by, bz), shared_bytes, stream,
                                             args.address)
                if rc:
                    self._retry_or_raise(rc, kernel, grid, block, shared_bytes, args.address, stream)
            return launch_ex
        fn = drv.libcuda().cuLaunchKernel

        def launch(args: PackedArgs, stream: int) -> None:
            rc = fn(kernel.handle, gx, gy, gz, bx, by, bz, shared_bytes, stream, args.address, None)
            if rc:
                self._retry_or_raise(rc, kernel, grid, block, shared_bytes, args.address, stream)
        return launch

    def _retry_or_raise(self, rc: int, kernel: Kernel, grid, block, shared: int, params: int, stream: int) -> None:
        if rc == drv.CUDA_ERROR_INVALID_CONTEXT:
            self._ensure_context()   # a thread that never made the primary context current
            rc = drv.libcuda().cuLaunchKernel(kernel.handle, *[int(v) for v in grid], *[int(v) for v in block],
                                              shared, stream, params, None)
        self._failed(rc, kernel, grid, block, shared)

    # ---- memory, streams, events ----
    def alloc(self, nbytes: int) -> int:
        self.require_device("allocate device memory")
        self._ensure_context()
        ptr = ctypes.c_uint64()
        # Relaxed capture mode for the allocation (as torch's allocator does): a workspace first
        # needed inside a CUDA-graph capture (a stream's persistent counters) must not end it.
        mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
        drv.call("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode))
        try:
            drv.call("cuMemAlloc_v2", ctypes.byref(ptr), max(int(nbytes), 1))
        finally:
            drv.call("cuThreadExchangeStreamCaptureMode", ctypes.byref(mode))
        return ptr.value

    def free(self, ptr: int) -> None:
        if ptr:
            drv.call("cuMemFree_v2", ptr)

    def copy_to_device(self, dst: int, src_host: Any, nbytes: int, stream: int = 0) -> None:
        src = src_host if isinstance(src_host, int) else src_host.ctypes.data
        drv.call("cuMemcpyHtoDAsync_v2", dst, src, nbytes, stream)

    def copy_to_host(self, dst_host: Any, src: int, nbytes: int, stream: int = 0) -> None:
        dst = dst_host if isinstance(dst_host, int) else dst_host.ctypes.data
        drv.call("cuMemcpyDtoHAsync_v2", dst, src, nbytes, stream)
        self.synchronize(stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        drv.call("cuMemsetD8Async", ptr, value, nbytes, stream)

    def synchronize(self, stream: int = 0) -> None:
        if stream:
            drv.call("cuStreamSynchronize", stream)
        else:
            drv.call("cuCtxSynchronize")

    def tensor_map(self, ptr: int, dtype: str, dims: Sequence[int], box: Sequence[int], swizzle: int,
                   strides: Sequence[int] | None = None) -> bytes:
        return drv.encode_tensor_map(ptr, dtype, dims, box, swizzle, strides)

    def im2col_map(self, ptr: int, dtype: str, dims: Sequence[int], im2col: Sequence[int], swizzle: int) -> bytes:
        lw, lh, uw, uh, channels, pixels, sw, sh = im2col
        return drv.encode_im2col_map(ptr, dtype, dims, (lw, lh), (uw, uh), channels, pixels, (1, sw, sh, 1), swizzle)

    def capturing(self, stream: int = 0) -> bool:
        status = ctypes.c_int()
        code = drv.libcuda().cuStreamIsCapturing(stream, ctypes.byref(status))
        if code == drv.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
            return True
        drv.check(code, "cuStreamIsCapturing")
        return status.value != 0       # active, or invalidated (still inside a capture)

    def create_stream(self) -> int:
        self._ensure_context()
        return drv.out_ptr("cuStreamCreate", 1)   # non-blocking

    def destroy_stream(self, stream: int) -> None:
        drv.call("cuStreamDestroy_v2", stream)

    def create_event(self) -> Any:
        return drv.out_ptr("cuEventCreate", 0)

    def record_event(self, event: Any, stream: int = 0) -> None:
        drv.call("cuEventRecord", event, stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        drv.call("cuEventSynchronize", end)
        ms = ctypes.c_float()
        drv.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value
