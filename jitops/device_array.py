"""A small device array for users without torch or CuPy: allocate, copy in, copy out."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import ArgumentError


class DeviceArray:
    """Contiguous memory on a backend's device with a shape and dtype.

    On CUDA it exposes __cuda_array_interface__, so torch.as_tensor / cupy.asarray can view it.
    """

    def __init__(self, shape: Sequence[int] | int, dtype: str | np.dtype = "float32", backend: Any = None):
        from .runtime import get_backend
        self.backend = backend or get_backend()
        self.shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype).name
        if any(s < 0 for s in self.shape):
            raise ArgumentError("shape", "non-negative dimensions", self.shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
        self.backend.require_device("allocate device memory")
        self.ptr = self.backend.alloc(self.nbytes)
        self._owner = True

    @classmethod
    def from_numpy(cls, array: np.ndarray, backend: Any = None) -> "DeviceArray":
        array = np.ascontiguousarray(array)
        out = cls(array.shape, array.dtype, backend)
        if out.nbytes:
            out.backend.copy_to_device(out.ptr, array, out.nbytes)
        return out

    def numpy(self) -> np.ndarray:
        host = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            self.backend.synchronize()
            self.backend.copy_to_host(host, self.ptr, self.nbytes)
        return host

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.backend.name == "cpu":
            raise AttributeError("a DeviceArray of the CPU emulator lives in host memory")
        return {"shape": self.shape, "typestr": np.dtype(self.dtype).str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __del__(self) -> None:
        if getattr(self, "_owner", False) and self.ptr:
            try:
                self.backend.free(self.ptr)
            except Exception:
                pass
            self.ptr = 0

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, backend={self.backend.name})"


def to_device(array: Any, backend: Any = None) -> DeviceArray:
    """Copy a host array to the active backend's device."""
    return DeviceArray.from_numpy(np.asarray(array), backend)


def empty(shape: Sequence[int] | int, dtype: str = "float32", backend: Any = None) -> DeviceArray:
    return DeviceArray(shape, dtype, backend)
