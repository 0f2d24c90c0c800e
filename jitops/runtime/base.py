"""The one interface every runtime backend implements. Backends know nothing about operators."""
from __future__ import annotations

import ctypes
import hashlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import config
from ..device import DeviceInfo
from ..errors import BackendUnavailable, DeviceRequired

# Scalar argument kinds a kernel may take, with their ctypes.
SCALAR_CTYPES: dict[str, type] = {
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "ptr": ctypes.c_uint64,
    "tmap": ctypes.c_uint64 * 16,   # a 128-byte tensor map (TMA), passed by value
}


class PackedArgs:
    """ctypes storage for one kernel's arguments in the void** form drivers take.

    Built once per prepared launch; per call only the values are written, so the hot path
    allocates nothing. Buffer arguments also carry their size and element size, which only
    the CPU emulator's checked mode reads.
    """

    __slots__ = ("kinds", "names", "values", "array", "address", "buf_bytes", "buf_itemsize")

    def __init__(self, kinds: Sequence[str], names: Sequence[str]):
        self.kinds = tuple(kinds)
        self.names = tuple(names)
        self.values = [SCALAR_CTYPES[k]() for k in self.kinds]
        n = len(self.values)
        self.array = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(v) for v in self.values])
        self.address = ctypes.addressof(self.array)
        self.buf_bytes = [-1] * n
        self.buf_itemsize = [0] * n

    def set(self, index: int, value: Any) -> None:
        self.values[index].value = value

    def set_buffer(self, index: int, ptr: int, nbytes: int, itemsize: int) -> None:
        self.values[index].value = ptr
        self.buf_bytes[index] = nbytes
        self.buf_itemsize[index] = itemsize


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel function: backend handle plus the name it was compiled under."""

    name: str
    handle: Any
    module: Any
    static_shared: int = 0
    registers: int = 0
    max_threads: int = 1024


class Backend(ABC):
    """Compile, load and launch kernels; own device memory, streams and events."""

    name: str = "?"
    device: DeviceInfo
    reads_buffer_sizes: bool = False    # launches read PackedArgs.buf_bytes (the emulator's checked mode)

    # ---- compilation (works offline) ----
    @abstractmethod
    def compiler_id(self) -> str:
        """Compiler name and version; part of every cache key."""

    @abstractmethod
    def compile_options(self) -> tuple[str, ...]:
        """Options passed to the compiler for this device; part of every cache key."""

    @abstractmethod
    def compile(self, source: str, kernel_names: Sequence[str], label: str) -> bytes:
        """Compile rendered source into a loadable binary. Raises CompileError with the log."""

    @property
    def binary_format(self) -> str:
        return "bin"

    # ---- needs a device ----
    @property
    def can_launch(self) -> bool:
        return self.device.online

    def require_device(self, what: str) -> None:
        if not self.can_launch:
            raise DeviceRequired(
                f"{self.name} backend for target {self.device.arch} is compile-only (no device present); "
                f"cannot {what}. Use a backend created without an explicit target on a machine with the GPU.")

    @abstractmethod
    def load(self, binary: bytes, kernel_names: Sequence[str]) -> dict[str, Kernel]:
        """Load a binary; returns the named kernels. Raises LaunchError if the binary is unusable."""

    @abstractmethod
    def launch(self, kernel: Kernel, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared_bytes: int, args: PackedArgs, stream: int) -> None:
        """Enqueue one launch on `stream` (0: the backend's default stream)."""

    def can_launch_programmatic(self) -> bool:
        """Programmatic dependent launch is possible here (CUDA sm_90+ only)."""
        return False

    def bind_launch(self, kernel: Kernel, grid: Sequence[int], block: Sequence[int],
                    shared_bytes: int, programmatic: bool = False) -> "Callable[[PackedArgs, int], None]":
        """A callable (args, stream) for repeated launches of one configuration (the hot path).

        programmatic: the kernel waits for the stream's previous kernel itself before touching memory,
        so a backend that can may launch it early (CUDA's programmatic dependent launch); others ignore it."""
        grid, block = tuple(grid), tuple(block)
        return lambda args, stream: self.launch(kernel, grid, block, shared_bytes, args, stream)

    @abstractmethod
    def alloc(self, nbytes: int) -> int: ...

    @abstractmethod
    def free(self, ptr: int) -> None: ...

    @abstractmethod
    def copy_to_device(self, dst: int, src_host: Any, nbytes: int, stream: int = 0) -> None: ...

    @abstractmethod
    def copy_to_host(self, dst_host: Any, src: int, nbytes: int, stream: int = 0) -> None: ...

    @abstractmethod
    def memset(self, ptr: int, value: int, nbytes: int, stream: int = 0) -> None: ...

    @abstractmethod
    def synchronize(self, stream: int = 0) -> None: ...

    def tensor_map(self, ptr: int, dtype: str, dims: Sequence[int], box: Sequence[int], swizzle: int,
                   strides: Sequence[int] | None = None) -> bytes:
        """The 128 bytes of a TMA tensor map over `ptr` (see ops.base.TensorMap). Only CUDA has TMA."""
        raise BackendUnavailable(f"{self.name} backend: no tensor maps (TMA is an sm_90 feature)")

    def im2col_map(self, ptr: int, dtype: str, dims: Sequence[int], im2col: Sequence[int], swizzle: int) -> bytes:
        """The 128 bytes of a TMA im2col tensor map over `ptr` (see ops.base.TensorMap.im2col)."""
        raise BackendUnavailable(f"{self.name} backend: no tensor maps (TMA is an sm_90 feature)")

    def capturing(self, stream: int = 0) -> bool:
        """Whether `stream` is being captured into a CUDA graph (a synchronize or a free would end
        the capture). Backends without graphs: never."""
        return False

    def create_stream(self) -> int:
        return 0

    def destroy_stream(self, stream: int) -> None:
        pass

    # ---- events: host timers unless a backend has device events ----
    def create_event(self) -> Any:
        return [0.0]

    def record_event(self, event: Any, stream: int = 0) -> None:
        self.synchronize(stream)
        event[0] = time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (end[0] - start[0]) * 1e3

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "compiler": self.compiler_id(), **self.device.as_dict()}


def save_failed_source(label: str, source: str, suffix: str = ".hip") -> Path:
    """Keep the source of a failed compile where the user can open it; the error names the path."""
    folder = config.cache_dir() / "failed"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{label}-{hashlib.sha256(source.encode()).hexdigest()[:12]}{suffix}"
    path.write_text(source)
    return path
