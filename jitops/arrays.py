"""Array interop: numpy, torch, CuPy, objects with __cuda_array_interface__, and DeviceArray.

Device arrays are used in place (zero copy) and launched on the array's current stream; host
arrays go to the device and back when the backend is a GPU (on the CPU emulator they are used
in place). Results come back as the input's kind. Non-contiguous inputs are refused with the
argument's name rather than copied behind the caller's back. Two strided forms of rank 4 are
accepted, each a permutation of a dense array (LAYOUTS): "nhwc", a channels_last torch tensor (or
an array the caller declares `layout="nhwc"`) whose logical shape is (N, C, H, W) and whose memory
order is N, H, W, C; and attention's heads-inner storage read as logical [B, H, S, D]: "bshd",
[B, S, H, D] (FlashAttention's layout, and what a model has before it transposes heads forward: a
torch tensor `x.transpose(1, 2)` of a contiguous [B, S, H, D] x, or an array declared
`layout="bshd"`), and "sbhd", [S, B, H, D] (torch nn.MultiheadAttention's sequence-first
projections: `x.permute(1, 2, 0, 3)`, or `layout="sbhd"`).

Packed projections: "bshd" torch views (and __cuda_array_interface__ / CuPy arrays with such strides) may
also have a row pitch P > H * D elements: q, k and v cut as column slices out of one packed projection
[B, S, (H + 2 Hk) D] (timm ViT's `qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)`, GPT-2's
`c_attn(x).split(E, 2)` then `.view(B, S, H, D).transpose(1, 2)`, fused-qkv GQA models): element strides
(S * P, D, P, 1) (any batch stride when B == 1). The ref carries P as `pitch` (0: dense); the memory
format of such a view is the tuple ("bshd", P), so the repeat paths' signatures tell it from a dense
view and from another pitch. Other strided views are refused.

bfloat16: torch.bfloat16 tensors and numpy arrays of `ml_dtypes.bfloat16` (importing ml_dtypes
also lets numpy name the dtype "bfloat16").
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Sequence

import numpy as np

from .errors import ArgumentError

try:   # registers numpy's "bfloat16" dtype name
    import ml_dtypes  # noqa: F401
except ImportError:   # pragma: no cover - a dependency; bf16 numpy arrays then cannot be made
    ml_dtypes = None

DTYPES = ("float32", "float16", "float64", "int32", "int64", "uint8", "bfloat16")
_TYPESTR = {"<f4": "float32", "<f2": "float16", "<f8": "float64", "<i4": "int32", "<i8": "int64", "|u1": "uint8",
            "<u1": "uint8"}
_TORCH_DTYPES: dict[Any, str] = {}
_TORCH_BY_NAME: dict[str, Any] = {}


class ArrayRef:
    """One argument, classified: where its data lives, its shape, dtype and pointer."""

    __slots__ = ("obj", "kind", "shape", "dtype", "ptr", "nbytes", "host", "device_index", "layout", "pitch")

    def __init__(self, obj: Any, kind: str, shape: tuple, dtype: str, ptr: int, nbytes: int, host: bool,
                 device_index: int = 0, layout: str = "", pitch: int = 0):
        self.obj = obj
        self.layout = layout
        self.pitch = pitch          # "bshd" with a row pitch (elements between rows of S; 0: dense)
        self.kind = kind
        self.shape = shape
        self.dtype = dtype
        self.ptr = ptr
        self.nbytes = nbytes
        self.host = host
        self.device_index = device_index

    def describe(self) -> str:
        where = "host" if self.host else f"device {self.device_index}"
        return f"{self.kind} array on {where}"


def _torch_dtypes() -> dict[Any, str]:
    if not _TORCH_DTYPES:
        import torch
        _TORCH_DTYPES.update({torch.float32: "float32", torch.float16: "float16", torch.float64: "float64",
                              torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
                              torch.bfloat16: "bfloat16"})
        _TORCH_BY_NAME.update({v: k for k, v in _TORCH_DTYPES.items()})
    return _TORCH_DTYPES


def torch_dtype(name: str) -> Any:
    """The torch dtype for a jitops dtype name."""
    if not _TORCH_BY_NAME:
        _torch_dtypes()
    return _TORCH_BY_NAME[name]


def is_torch(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_cupy(obj: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(obj, cupy.ndarray)


def _contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


# Each strided layout: the permutation from the logical axes to memory order (self-describing:
# storage_shape applies it, logical_shape inverts it), and what its storage shape is called.
LAYOUTS = {"nhwc": ((0, 2, 3, 1), "(N, H, W, C)"), "bshd": ((0, 2, 1, 3), "[B, S, H, D]"),
           "sbhd": ((2, 0, 1, 3), "[S, B, H, D]")}


def _declared(ref: ArrayRef, name: str, op: str, layout: str) -> ArrayRef:
    """A C-contiguous array the caller declared `layout=`: its own shape is the storage shape."""
    if len(ref.shape) != 4:
        raise ArgumentError(name, f'a 4-d {LAYOUTS[layout][1]} array with layout="{layout}"',
                            f"shape {tuple(ref.shape)}", op=op)
    ref.shape, ref.layout = logical_shape(ref.shape, layout), layout
    return ref


def _dense_in_order(shape: Sequence[int], strides: Sequence[int], order: Sequence[int]) -> bool:
    """Strides of a dense array whose memory order lists the axes as `order` does (outermost first);
    axes of size 1 may have any stride, as torch's is_contiguous allows."""
    step = 1
    for ax in reversed(order):
        if shape[ax] != 1 and strides[ax] != step:
            return False
        step *= shape[ax]
    return True


def is_channels_last(t: Any) -> bool:
    """A torch tensor jitops reads as NHWC when it is not C-contiguous: 4-d and channels_last-contiguous
    (what wrap classifies, and what the repeat paths' signatures check)."""
    return t.dim() == 4 and _dense_in_order(t.shape, t.stride(), LAYOUTS["nhwc"][0])


def bshd_pitch(shape: Sequence[int], strides: Sequence[int]) -> int:
    """The row pitch P (elements between consecutive rows of S) of a logical [B, H, S, D] view stored
    [B, S, H, D] with rows P >= H * D apart (a slice of a packed q/k/v projection): strides
    (S * P, D, P, 1), any batch stride when B == 1; 0 when the strides are not of that form. Axes of
    size 1 may have any stride, as torch's is_contiguous allows."""
    if len(shape) != 4:
        return 0
    b, h, s, d = shape
    sb, sh, ss, sd = strides
    if (d != 1 and sd != 1) or (h != 1 and sh != d):
        return 0
    pitch = ss if s != 1 else sb if b != 1 else h * d
    if pitch < h * d or (b != 1 and sb != s * pitch):
        return 0
    return pitch


def memory_format(t: Any) -> str | bool | tuple[str, int]:
    """A torch tensor's memory format as the repeat paths' signatures record it: True (C order),
    a LAYOUTS name, ("bshd", P) for [B, S, H, D] storage with row pitch P (packed projections), or
    False (another strided view). One stride read, no views made: this runs on every repeat call."""
    if t.is_contiguous():
        return True
    if t.dim() != 4:
        return False
    shape, strides = t.shape, t.stride()
    for name, (order, _) in LAYOUTS.items():
        if _dense_in_order(shape, strides, order):
            return name
    pitch = bshd_pitch(shape, strides)
    return ("bshd", pitch) if pitch else False


def wrap(obj: Any, name: str, op: str, layout: str = "") -> ArrayRef:
    """Classify one array argument; a clear error names the argument when it cannot be used.
    `layout` ("nhwc", "bshd", "sbhd"): the caller declares a C-contiguous array's own shape to be the
    layout's storage shape; the ref then carries the logical shape. Strided torch views in a layout
    (channels_last, transposed [B, S, H, D], packed projections' slices with a row pitch) need no
    declaration."""
    ref = _wrap(obj, name, op)
    if layout in LAYOUTS and not ref.layout:
        return _declared(ref, name, op, layout)
    return ref


def _wrap(obj: Any, name: str, op: str) -> ArrayRef:
    if isinstance(obj, np.ndarray):
        dtype = obj.dtype.name
        if dtype not in DTYPES:
            raise ArgumentError(name, "a float32, float16 or bfloat16 array", f"numpy dtype {dtype}", op=op)
        if not obj.flags.c_contiguous:
            raise ArgumentError(name, "a C-contiguous array (use np.ascontiguousarray)", "a strided view", op=op)
        return ArrayRef(obj, "numpy", obj.shape, dtype, obj.ctypes.data, obj.nbytes, True)
    if is_torch(obj):
        dtype = _torch_dtypes().get(obj.dtype)
        if dtype is None:
            raise ArgumentError(name, "a float32, float16 or bfloat16 tensor", f"torch dtype {obj.dtype}", op=op)
        fmt = memory_format(obj)
        if fmt is False:
            raise ArgumentError(name, STRIDED_ACCEPTED, f"a strided view (shape {tuple(obj.shape)}, strides "
                                f"{obj.stride()})", op=op)
        layout, pitch = (fmt if isinstance(fmt, tuple) else ("" if fmt is True else str(fmt), 0))
        dev = obj.device
        if dev.type not in ("cuda", "cpu"):
            raise ArgumentError(name, "a CPU or CUDA/ROCm tensor", f"a tensor on '{dev.type}'", op=op)
        host = dev.type == "cpu"
        nbytes = span_elements(obj.shape, obj.stride()) * obj.element_size() if pitch else obj.numel() * obj.element_size()
        return ArrayRef(obj, "torch", tuple(obj.shape), dtype, obj.data_ptr(), nbytes, host,
                        0 if host else (dev.index or 0), layout, pitch)
    from .device_array import DeviceArray
    if isinstance(obj, DeviceArray):
        return ArrayRef(obj, "jitops", obj.shape, obj.dtype, obj.ptr, obj.nbytes, obj.backend.name == "cpu", 0)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(int(s) for s in cai["shape"])
        dtype = _TYPESTR.get(cai["typestr"])
        if dtype is None:
            raise ArgumentError(name, "a float32, float16 or bfloat16 array", f"typestr {cai['typestr']}", op=op)
        itemsize = np.dtype(cai["typestr"]).itemsize
        strides = cai.get("strides")
        pitch = 0
        if strides is not None and tuple(strides) != _contiguous_strides(shape, itemsize) and int(np.prod(shape)) > 1:
            pitch = _cai_pitch(shape, strides, itemsize)
            if not pitch:
                raise ArgumentError(name, "a C-contiguous device array, or for attention a [B, S, H, D] slice of a "
                                    "packed projection (strides (S * P, D, P, 1) elements)", f"strides {tuple(strides)}",
                                    op=op)
        kind = "cupy" if is_cupy(obj) else "cai"
        dev_index = int(obj.device.id) if kind == "cupy" else 0
        elements = span_elements(shape, tuple(st // itemsize for st in strides)) if pitch else int(np.prod(shape, dtype=np.int64))
        dense_rows = bool(pitch) and pitch == shape[1] * shape[3]     # a plain transposed [B, S, H, D] array
        return ArrayRef(obj, kind, shape, dtype, int(cai["data"][0]), elements * itemsize, False, dev_index,
                        "bshd" if pitch else "", 0 if dense_rows else pitch)
    if isinstance(obj, (list, tuple, int, float)):
        raise ArgumentError(name, "an array (numpy, torch, CuPy or jitops.DeviceArray)",
                            f"a Python {type(obj).__name__}; wrap it with np.asarray(..., dtype=np.float32)", op=op)
    raise ArgumentError(name, "an array (numpy, torch, CuPy, __cuda_array_interface__ or jitops.DeviceArray)",
                        type(obj).__name__, op=op)


STRIDED_ACCEPTED = ("a contiguous or channels_last tensor, or for attention a transposed [B, S, H, D] one "
                    "(x.transpose(1, 2)), a sequence-first one (x.permute(1, 2, 0, 3)) or a [B, S, H, D] slice of "
                    "a packed q/k/v projection (strides (S * P, D, P, 1), P >= H * D); call .contiguous()")


def _cai_pitch(shape: tuple, byte_strides: Sequence[int], itemsize: int) -> int:
    """bshd_pitch for byte strides (__cuda_array_interface__); 0 for strides that are not whole elements."""
    if any(st % itemsize for st in byte_strides):
        return 0
    return bshd_pitch(shape, [st // itemsize for st in byte_strides])


def span_elements(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a strided view's first element to its last, inclusive (what a pitched view's
    memory covers: what staging copies)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def check_placement(refs: dict[str, ArrayRef], backend: Any, op: str) -> bool:
    """All arrays on one side (host or the backend's device). Returns True when they are on the host."""
    items = list(refs.items())
    first_name, first = items[0]
    on_cpu_backend = backend.name == "cpu"
    for name, ref in items:
        if ref.host != first.host:
            raise ArgumentError(name, f"an array on the same side as '{first_name}' ({first.describe()})",
                                ref.describe(), op=op)
        if not ref.host and on_cpu_backend:
            raise ArgumentError(name, "a host array: the active backend is the CPU emulator",
                                f"{ref.describe()}; select the GPU backend with JITOPS_BACKEND or jitops.use_backend",
                                op=op)
        if not ref.host and ref.device_index != getattr(backend, "ordinal", 0):
            raise ArgumentError(name, f"an array on device {getattr(backend, 'ordinal', 0)} (the backend's device)",
                                ref.describe(), op=op)
    return first.host


def current_stream(ref: ArrayRef) -> int:
    """The stream a device array's framework is using now (0: the default stream)."""
    if ref.kind == "torch" and not ref.host:
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(ref.device_index))
        return int(torch.cuda.current_stream(ref.device_index).cuda_stream)
    if ref.kind == "cupy":
        return int(sys.modules["cupy"].cuda.get_current_stream().ptr)
    return 0


def storage_shape(shape: tuple, layout: str) -> tuple:
    """The shape in memory order: (N, H, W, C) for a logical (N, C, H, W) shape stored "nhwc",
    [B, S, H, D] / [S, B, H, D] for a logical [B, H, S, D] stored "bshd" / "sbhd"; the shape itself otherwise."""
    if layout in LAYOUTS:
        return tuple(shape[a] for a in LAYOUTS[layout][0])
    return tuple(shape)


def logical_shape(storage: tuple, layout: str) -> tuple:
    """The inverse of storage_shape."""
    if layout in LAYOUTS:
        out = [0] * len(storage)
        for i, a in enumerate(LAYOUTS[layout][0]):
            out[a] = storage[i]
        return tuple(out)
    return tuple(storage)


def same_memory_order(shape: Sequence[int], layout: str, other: str) -> bool:
    """Whether two layouts store an array of this logical shape identically: their memory orders agree
    on the axes longer than 1 (a bshd [B, H, 1, D] array is also C-contiguous)."""
    def order(name: str) -> list[int]:
        perm = LAYOUTS[name][0] if name in LAYOUTS else tuple(range(len(shape)))
        return [ax for ax in perm if shape[ax] != 1]
    return order(layout) == order(other)


def inverse_permutation(layout: str) -> tuple[int, ...]:
    """The permutation that views a storage-order tensor in logical order (torch .permute)."""
    perm = LAYOUTS[layout][0]
    return tuple(perm.index(i) for i in range(len(perm)))


def allocate_like(ref: ArrayRef, shape: tuple, dtype: str, backend: Any, layout: str = "") -> tuple[Any, int]:
    """A new array of the same kind (and device) as `ref`; returns (object, data pointer). With
    layout "nhwc" (logical `shape` (N, C, H, W)): a channels_last torch tensor, or an (N, H, W, C)
    array of the other kinds."""
    if ref.kind == "torch":
        torch = sys.modules["torch"]
        t = torch.empty(storage_shape(shape, layout), dtype=torch_dtype(dtype), device=ref.obj.device)
        if layout in LAYOUTS:
            t = t.permute(*inverse_permutation(layout))
        return t, t.data_ptr()
    shape = storage_shape(shape, layout)
    if ref.kind == "numpy":
        a = np.empty(shape, dtype=dtype)
        return a, a.ctypes.data
    if ref.kind == "cupy":
        cupy = sys.modules["cupy"]
        a = cupy.empty(shape, dtype=dtype)
        return a, int(a.data.ptr)
    from .device_array import DeviceArray
    a = DeviceArray(shape, dtype, backend=backend)
    return a, a.ptr


def host_view(ref: ArrayRef) -> np.ndarray:
    """A C-contiguous numpy view of a host array's memory (numpy or torch CPU) for copies; for a
    pitched view the bytes it spans (the rows with the other columns between them)."""
    if ref.pitch:
        return np.ctypeslib.as_array((ctypes.c_uint8 * ref.nbytes).from_address(ref.ptr))
    return ref.obj if ref.kind == "numpy" else host_storage(ref.obj)


def host_storage(t: Any) -> np.ndarray:
    """A torch CPU tensor's memory as a C-contiguous numpy array (a layout's view in storage order;
    bfloat16, which numpy lacks without ml_dtypes views, as its 16-bit pattern)."""
    if isinstance(t, np.ndarray):
        return t
    torch = sys.modules["torch"]
    fmt = memory_format(t)
    if isinstance(fmt, str):
        t = t.permute(*LAYOUTS[fmt][0])
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()
