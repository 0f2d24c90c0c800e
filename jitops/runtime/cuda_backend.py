"""NVIDIA backend: NVRTC (cuda.bindings.nvrtc) to cubin, cuda.bindings.driver to load and launch.

Uses the device's primary context, so it shares memory and streams with torch and CuPy.
Created with an explicit target (e.g. "sm_80") it compiles with no GPU present and refuses to
launch. Every driver call's status is checked.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Sequence

from ..device import KNOWN_TARGETS, DeviceInfo
from ..errors import BackendUnavailable, CompileError, LaunchError
from .base import Backend, Kernel, PackedArgs, save_failed_source

log = logging.getLogger("jitops.cuda")

_DEFAULT_SMEM = 48 * 1024


def _import_bindings() -> tuple[Any, Any]:
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        try:  # cuda-python < 12.6 spelled it differently
            from cuda import cuda as driver  # type: ignore
            from cuda import nvrtc  # type: ignore
        except ImportError as exc:
            raise BackendUnavailable("cuda backend needs cuda-bindings and nvidia-cuda-nvrtc "
                                     "(pip install 'jitops[cuda]')") from exc
    return driver, nvrtc


def _offline_device(target: str) -> DeviceInfo:
    if target in KNOWN_TARGETS:
        return KNOWN_TARGETS[target]
    if not target.startswith("sm_") or not target[3:].rstrip("af").isdigit():
        raise BackendUnavailable(f"cuda backend: unknown target '{target}' (expected sm_XX, e.g. sm_90)")
    return DeviceInfo("cuda", target, f"NVIDIA {target} (offline target)", 32, 80, matrix_cores=True, online=False)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, target: str | None = None, ordinal: int | None = None):
        self.cu, self.nvrtc = _import_bindings()
        self.ordinal = int(os.environ.get("JITOPS_DEVICE", "0")) if ordinal is None else ordinal
        self._lock = threading.Lock()
        self._ctx = None
        self._raised_smem: set[int] = set()
        err, major, minor = self.nvrtc.nvrtcVersion()
        self._check_nvrtc(err, "nvrtcVersion")
        self._nvrtc_version = f"{major}.{minor}"
        try:
            _, archs = self.nvrtc.nvrtcGetSupportedArchs()
            self._supported = sorted(int(a) for a in archs)
        except Exception:
            self._supported = []
        if target is not None:
            self.device = _offline_device(target)
            return
        self.device = self._probe_device()

    # ---- errors ----
    def _check(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            try:
                _, name = self.cu.cuGetErrorName(err)
                _, text = self.cu.cuGetErrorString(err)
                detail = f"{name.decode()}: {text.decode()}"
            except Exception:
                detail = str(err)
            raise LaunchError(f"{what} failed: {detail}")
        if isinstance(result, tuple):
            return result[1] if len(result) == 2 else result[1:]
        return None

    def _check_nvrtc(self, err: Any, what: str) -> None:
        if int(err) != 0:
            raise BackendUnavailable(f"NVRTC {what} failed: {err}")

    # ---- device ----
    def _probe_device(self) -> DeviceInfo:
        cu = self.cu
        try:
            self._check(cu.cuInit(0), "cuInit")
            count = self._check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        except (LaunchError, RuntimeError, OSError) as exc:
            raise BackendUnavailable(f"cuda backend: no usable NVIDIA driver/device ({exc})") from exc
        except Exception as exc:  # cuda.pathfinder raises its own error when libcuda is absent
            raise BackendUnavailable(f"cuda backend: no NVIDIA driver ({type(exc).__name__}: {exc})") from exc
        if count <= self.ordinal:
            raise BackendUnavailable(f"cuda backend: device {self.ordinal} requested, {count} present")
        dev = self._check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
        self._dev = dev
        self._ctx = self._check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        self._check(cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        A = cu.CUdevice_attribute

        def attr(name: str) -> int:
            return int(self._check(cu.cuDeviceGetAttribute(getattr(A, name), dev), f"cuDeviceGetAttribute({name})"))

        major = attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        raw_name = self._check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
        return DeviceInfo(
            backend="cuda", arch=f"sm_{major}{minor}", name=name,
            warp_size=attr("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
            multiprocessors=attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            max_threads_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            shared_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
            shared_per_block_optin=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            shared_per_multiprocessor=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
            registers_per_multiprocessor=attr("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR"),
            l2_bytes=attr("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
            matrix_cores=major >= 8, online=True)

    def _ensure_context(self) -> None:
        self._check(self.cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    # ---- compilation ----
    def compiler_id(self) -> str:
        return f"nvrtc-{self._nvrtc_version}"

    def _arch_option(self) -> str:
        cc = int(self.device.arch[3:].rstrip("af"))
        suffix = self.device.arch[3 + len(str(cc)):]
        if self._supported and cc > self._supported[-1]:
            # Newer GPU than this NVRTC knows: emit PTX for the newest arch it does, the driver JITs it.
            return f"-arch=compute_{self._supported[-1]}"
        return f"-arch=sm_{cc}{suffix}"

    def compile_options(self) -> tuple[str, ...]:
        return (self._arch_option(), "-std=c++17", "-default-device", "--ptxas-options=-v")

    @property
    def binary_format(self) -> str:
        return "cubin"

    def compile(self, source: str, kernel_names: Sequence[str], label: str) -> bytes:
        nv = self.nvrtc
        err, prog = nv.nvrtcCreateProgram(source.encode(), f"{label}.cu".encode(), 0, [], [])
        self._check_nvrtc(err, "nvrtcCreateProgram")
        try:
            opts = [o.encode() for o in self.compile_options()]
            (res,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
            err, size = nv.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nv.nvrtcGetProgramLog(prog, buf)
            compile_log = buf.rstrip(b"\0 ").decode(errors="replace")
            if int(res) != 0:
                saved = save_failed_source(label, source, ".cu")
                raise CompileError("cuda", self.device.arch, compile_log, saved)
            ptx_only = self._arch_option().startswith("-arch=compute_")
            if ptx_only:
                err, size = nv.nvrtcGetPTXSize(prog)
                out = b" " * size
                self._check_nvrtc(nv.nvrtcGetPTX(prog, out)[0], "nvrtcGetPTX")
            else:
                err, size = nv.nvrtcGetCUBINSize(prog)
                out = b" " * size
                self._check_nvrtc(nv.nvrtcGetCUBIN(prog, out)[0], "nvrtcGetCUBIN")
            if compile_log:
                log.debug("%s: %s", label, compile_log.strip())
            return bytes(out)
        finally:
            nv.nvrtcDestroyProgram(prog)

    # ---- modules and launches ----
    def load(self, binary: bytes, kernel_names: Sequence[str]) -> dict[str, Kernel]:
        self.require_device("load kernels")
        cu = self.cu
        self._ensure_context()
        module = self._check(cu.cuModuleLoadData(binary), "cuModuleLoadData")
        out = {}
        F = cu.CUfunction_attribute
        for k in kernel_names:
            fn = self._check(cu.cuModuleGetFunction(module, k.encode()), f"cuModuleGetFunction({k})")
            regs = self._check(cu.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_NUM_REGS, fn), "cuFuncGetAttribute")
            smem = self._check(cu.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn), "cuFuncGetAttribute")
            maxt = self._check(cu.cuFuncGetAttribute(F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn), "cuFuncGetAttribute")
            out[k] = Kernel(k, fn, module, int(smem), int(regs), int(maxt))
        return out

    def launch(self, kernel: Kernel, grid, block, shared_bytes: int, args: PackedArgs, stream: int) -> None:
        if shared_bytes > _DEFAULT_SMEM and id(kernel.handle) not in self._raised_smem:
            self._check(self.cu.cuFuncSetAttribute(
                kernel.handle, self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes), "cuFuncSetAttribute(max dynamic shared)")
            self._raised_smem.add(id(kernel.handle))
        (err,) = self.cu.cuLaunchKernel(kernel.handle, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                        shared_bytes, stream, args.address, 0)
        if int(err) != 0:
            if int(err) == int(self.cu.CUresult.CUDA_ERROR_INVALID_CONTEXT):
                self._ensure_context()  # a thread that never made the primary context current
                return self.launch(kernel, grid, block, shared_bytes, args, stream)
            self._check((err,), f"cuLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)}, "
                                f"shared={shared_bytes})")

    # ---- memory, streams, events ----
    def alloc(self, nbytes: int) -> int:
        self.require_device("allocate device memory")
        self._ensure_context()
        return int(self._check(self.cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))

    def free(self, ptr: int) -> None:
        if ptr:
            self._check(self.cu.cuMemFree(ptr), "cuMemFree")

    def copy_to_device(self, dst: int, src_host: Any, nbytes: int, stream: int = 0) -> None:
        src = src_host if isinstance(src_host, int) else src_host.ctypes.data
        self._check(self.cu.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")

    def copy_to_host(self, dst_host: Any, src: int, nbytes: int, stream: int = 0) -> None:
        dst = dst_host if isinstance(dst_host, int) else dst_host.ctypes.data
        self._check(self.cu.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")
        self.synchronize(stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None:
        self._check(self.cu.cuMemsetD8Async(ptr, value, nbytes, stream), "cuMemsetD8Async")

    def synchronize(self, stream: int = 0) -> None:
        if stream:
            self._check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        else:
            self._check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def create_stream(self) -> int:
        self._ensure_context()
        s = self._check(self.cu.cuStreamCreate(1), "cuStreamCreate")  # non-blocking
        return int(s)

    def destroy_stream(self, stream: int) -> None:
        self._check(self.cu.cuStreamDestroy(stream), "cuStreamDestroy")

    def create_event(self) -> Any:
        return self._check(self.cu.cuEventCreate(0), "cuEventCreate")

    def record_event(self, event: Any, stream: int = 0) -> None:
        self._check(self.cu.cuEventRecord(event, stream), "cuEventRecord")

    def elapsed_ms(self, start: Any, end: Any) -> float:
        self._check(self.cu.cuEventSynchronize(end), "cuEventSynchronize")
        return float(self._check(self.cu.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
