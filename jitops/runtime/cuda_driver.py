"""The CUDA driver entry points the cuda backend needs, called through ctypes on libcuda.

Why not cuda.bindings.driver: importing it costs 60-70 ms (most of it cuda.pathfinder), more than
the whole 50 ms budget for a first call with a warm cache, and its launch wrapper costs ~4 us a
call against a ~7 us budget for a whole op. NVRTC still comes from cuda.bindings.nvrtc, imported
only when something must be compiled. Every call's status is checked; a failure raises
LaunchError with the driver's own error name and text.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..errors import BackendUnavailable, LaunchError

# CUdevice_attribute values (cuda.h; the enum is append-only).
ATTR = {
    "max_threads_per_block": 1, "max_shared_per_block": 8, "warp_size": 10, "multiprocessors": 16,
    "l2_bytes": 38, "cc_major": 75, "cc_minor": 76, "max_shared_per_multiprocessor": 81,
    "max_threads_per_multiprocessor": 39, "max_registers_per_multiprocessor": 82, "max_shared_per_block_optin": 97,
}
FUNC_ATTR = {"max_threads_per_block": 0, "shared_size_bytes": 1, "local_size_bytes": 3, "num_regs": 4,
             "max_dynamic_shared_size_bytes": 8, "required_cluster_width": 11, "non_portable_cluster_size_allowed": 14}
PORTABLE_CLUSTER = 8          # blocks per cluster every sm_90 part runs; up to 16 on the H100 once allowed
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906   # asked of the legacy stream while another stream captures

_c = ctypes
_vp = _c.c_void_p
_SIGNATURES: dict[str, list] = {
    "cuInit": [_c.c_uint],
    "cuDriverGetVersion": [_c.POINTER(_c.c_int)],
    "cuDeviceGetCount": [_c.POINTER(_c.c_int)],
    "cuDeviceGet": [_c.POINTER(_c.c_int), _c.c_int],
    "cuDeviceGetName": [_c.c_char_p, _c.c_int, _c.c_int],
    "cuDeviceGetAttribute": [_c.POINTER(_c.c_int), _c.c_int, _c.c_int],
    "cuDevicePrimaryCtxRetain": [_c.POINTER(_vp), _c.c_int],
    "cuCtxSetCurrent": [_vp],
    "cuCtxSynchronize": [],
    "cuModuleLoadData": [_c.POINTER(_vp), _c.c_char_p],
    "cuModuleGetFunction": [_c.POINTER(_vp), _vp, _c.c_char_p],
    "cuFuncGetAttribute": [_c.POINTER(_c.c_int), _c.c_int, _vp],
    "cuFuncSetAttribute": [_vp, _c.c_int, _c.c_int],
    "cuLaunchKernel": [_vp, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _c.c_uint, _vp, _vp, _vp],
    "cuMemAlloc_v2": [_c.POINTER(_c.c_uint64), _c.c_size_t],
    "cuMemFree_v2": [_c.c_uint64],
    "cuMemcpyHtoDAsync_v2": [_c.c_uint64, _vp, _c.c_size_t, _vp],
    "cuMemcpyDtoHAsync_v2": [_vp, _c.c_uint64, _c.c_size_t, _vp],
    "cuMemsetD8Async": [_c.c_uint64, _c.c_ubyte, _c.c_size_t, _vp],
    "cuStreamCreate": [_c.POINTER(_vp), _c.c_uint],
    "cuStreamDestroy_v2": [_vp],
    "cuStreamSynchronize": [_vp],
    "cuStreamIsCapturing": [_vp, _c.POINTER(_c.c_int)],
    "cuTensorMapEncodeTiled": [_vp, _c.c_int, _c.c_uint32, _vp, _c.POINTER(_c.c_uint64), _c.POINTER(_c.c_uint64),
                               _c.POINTER(_c.c_uint32), _c.POINTER(_c.c_uint32), _c.c_int, _c.c_int, _c.c_int, _c.c_int],
    "cuTensorMapEncodeIm2col": [_vp, _c.c_int, _c.c_uint32, _vp, _c.POINTER(_c.c_uint64), _c.POINTER(_c.c_uint64),
                                _c.POINTER(_c.c_int), _c.POINTER(_c.c_int), _c.c_uint32, _c.c_uint32,
                                _c.POINTER(_c.c_uint32), _c.c_int, _c.c_int, _c.c_int, _c.c_int],
    "cuEventCreate": [_c.POINTER(_vp), _c.c_uint],
    "cuEventRecord": [_vp, _vp],
    "cuEventSynchronize": [_vp],
    "cuEventElapsedTime": [_c.POINTER(_c.c_float), _vp, _vp],
    "cuGetErrorName": [_c.c_int, _c.POINTER(_c.c_char_p)],
    "cuGetErrorString": [_c.c_int, _c.POINTER(_c.c_char_p)],
}

_lib: Any = None
_lock = threading.Lock()


def libcuda() -> Any:
    """libcuda.so.1 with typed entry points; BackendUnavailable when there is no NVIDIA driver."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                try:
                    lib = ctypes.CDLL("libcuda.so.1")
                except OSError as exc:
                    raise BackendUnavailable(f"cuda backend: no NVIDIA driver (libcuda.so.1: {exc})") from exc
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
                _lib = lib
    return _lib


def error_text(code: int) -> str:
    lib = libcuda()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
    return f"{(name.value or b'CUDA_ERROR_' + str(code).encode()).decode()}: {(text.value or b'').decode()}"


def check(code: int, what: str) -> None:
    if code != 0:
        raise LaunchError(f"{what} failed: {error_text(code)}")


def call(name: str, *args: Any) -> None:
    """Call a driver entry point and check its status."""
    check(getattr(libcuda(), name)(*args), name)


def out_int(name: str, *args: Any) -> int:
    v = ctypes.c_int()
    call(name, ctypes.byref(v), *args)
    return v.value


def out_ptr(name: str, *args: Any) -> int:
    v = ctypes.c_void_p()
    call(name, ctypes.byref(v), *args)
    return v.value or 0


def launch_entry_address() -> int:
    """Address of cuLaunchKernel, for the native launcher."""
    return ctypes.cast(libcuda().cuLaunchKernel, ctypes.c_void_p).value


# ---- programmatic dependent launch (sm_90+): a kernel that waits for the stream's previous kernel
# itself (griddepcontrol.wait) may be launched before that kernel ends, its prologue overlapping the
# other's tail. cuda.h's CUlaunchAttribute / CUlaunchConfig, and the attribute's id.
ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("count", ctypes.c_uint)]


def _address(name: str) -> int:
    fn = getattr(libcuda(), name, None)
    return (ctypes.cast(fn, ctypes.c_void_p).value or 0) if fn is not None else 0


def launch_ex_address() -> int:
    """Address of cuLaunchKernelEx (CUDA 11.8+ drivers), 0 where the driver has none."""
    return _address("cuLaunchKernelEx")


def programmatic_entries() -> tuple[int, int, int, int, int]:
    """What the native launcher's programmatic entry calls (0 where the driver lacks one): cuLaunchKernel,
    cuLaunchKernelEx, and for its graph-capture test cuStreamGetCaptureInfo_v2, cuGraphNodeGetType,
    cuGraphKernelNodeGetParams_v2."""
    return (launch_entry_address(), launch_ex_address(), _address("cuStreamGetCaptureInfo_v2"),
            _address("cuGraphNodeGetType"), _address("cuGraphKernelNodeGetParams_v2"))


def launch_programmatic(handle: int, grid: Any, block: Any, shared: int, stream: int, params: int) -> int:
    """cuLaunchKernelEx with programmatic stream serialization allowed (the path without the native
    launcher); returns the driver's status."""
    fn = libcuda().cuLaunchKernelEx
    attr = LaunchAttribute(id=ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    cfg = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared, stream,
                       ctypes.pointer(attr), 1)
    return int(fn(ctypes.byref(cfg), ctypes.c_void_p(handle), ctypes.c_void_p(params), None))


# CUtensorMapDataType values (cuda.h) with the element size, and CUtensorMapSwizzle values.
TENSOR_MAP_DTYPE = {"float16": (6, 2), "float32": (7, 4), "bfloat16": (9, 2)}
TENSOR_MAP_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
TENSOR_MAP_L2_PROMOTION_256B = 3


def _dense_byte_strides(dims: Any, itemsize: int) -> list[int]:
    """Byte strides of dims 1.. of a dense tensor (dims innermost first), as the encoders take them."""
    strides, step = [], itemsize
    for d in dims[:-1]:
        step *= int(d)
        strides.append(step)
    return strides


def _encode_map(function: str, *args: Any) -> bytes:
    """One cuTensorMapEncode* call into a 64-byte aligned CUtensorMap (the driver wants that alignment:
    it is written into an over-sized buffer); the 128 bytes of the map."""
    buf = (ctypes.c_ubyte * 192)()
    base = (ctypes.addressof(buf) + 63) & ~63
    call(function, base, *args)
    return ctypes.string_at(base, 128)


def encode_tensor_map(ptr: int, dtype: str, dims: Any, box: Any, swizzle: int, elem_strides: Any = None) -> bytes:
    """cuTensorMapEncodeTiled (innermost dim first; element strides of dims 1.., dense when None),
    zeros outside the tensor."""
    code, itemsize = TENSOR_MAP_DTYPE[dtype]
    rank = len(dims)
    strides = (_dense_byte_strides(dims, itemsize) if elem_strides is None
               else [int(s) * itemsize for s in elem_strides])
    return _encode_map("cuTensorMapEncodeTiled", code, rank, ptr,
                       (ctypes.c_uint64 * rank)(*[int(d) for d in dims]), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
                       (ctypes.c_uint32 * rank)(*[int(b) for b in box]), (ctypes.c_uint32 * rank)(*([1] * rank)),
                       0, TENSOR_MAP_SWIZZLE[int(swizzle)], TENSOR_MAP_L2_PROMOTION_256B, 0)


def encode_im2col_map(ptr: int, dtype: str, dims: Any, lower: Any, upper: Any, channels: int, pixels: int,
                      elem_strides: Any, swizzle: int) -> bytes:
    """cuTensorMapEncodeIm2col over a dense NHWC tensor (dims innermost first: C, W, H, N): each load
    brings `pixels` consecutive output pixels' rows of `channels` channels, the pixels walked with
    `elem_strides` (1, stride_w, stride_h, 1) over the box of window corners from `lower` to `upper`
    (W, H; relative to the tensor's first / last position: -padding and padding - (filter - 1) *
    dilation), wrapping to the next row and image; zeros outside the tensor (the padding)."""
    code, itemsize = TENSOR_MAP_DTYPE[dtype]
    rank = len(dims)
    nsp = rank - 2
    return _encode_map("cuTensorMapEncodeIm2col", code, rank, ptr,
                       (ctypes.c_uint64 * rank)(*[int(d) for d in dims]),
                       (ctypes.c_uint64 * (rank - 1))(*_dense_byte_strides(dims, itemsize)),
                       (ctypes.c_int * nsp)(*[int(v) for v in lower]), (ctypes.c_int * nsp)(*[int(v) for v in upper]),
                       int(channels), int(pixels), (ctypes.c_uint32 * rank)(*[int(e) for e in elem_strides]),
                       0, TENSOR_MAP_SWIZZLE[int(swizzle)], TENSOR_MAP_L2_PROMOTION_256B, 0)
