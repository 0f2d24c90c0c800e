"""A backend that compiles and loads like the CPU emulator but launches nothing: every launch goes
through the native launcher to its probe entry (runtime/native/jitops_launch.c), which records the
arguments and returns a status. What it is for: measuring the host side of a call on any machine
(scripts/host_overhead.py) and testing the native repeat-call path without a GPU."""
from __future__ import annotations

from typing import Callable, Sequence

from ..errors import BackendUnavailable, LaunchError
from .base import Kernel, PackedArgs
from .cpu_backend import CpuBackend
from .fastlaunch import bind_native, native_launcher


class ProbeBackend(CpuBackend):
    """The emulator's compiler and loader; launches recorded by the probe, kernels never run."""

    reads_buffer_sizes = False

    def __init__(self, warp_size: int = 32):
        super().__init__(warp_size=warp_size, checked=False)
        native = native_launcher()
        if native is None:
            raise BackendUnavailable("probe backend: the native launcher could not be built")
        self.native = native

    def launch(self, kernel: Kernel, grid, block, shared_bytes: int, args: PackedArgs, stream: int) -> None:
        self.bind_launch(kernel, grid, block, shared_bytes)(args, stream)

    def bind_launch(self, kernel: Kernel, grid: Sequence[int], block: Sequence[int],
                    shared_bytes: int, programmatic: bool = False) -> Callable[[PackedArgs, int], None]:
        def fail_at(rc: int, params: int, stream: int) -> None:
            raise LaunchError(f"probe launch of {kernel.name} (grid={tuple(grid)}, block={tuple(block)}) "
                              f"returned status {rc}")

        return bind_native(self.native, self.native.probe_entry(), kernel.handle, grid, block, shared_bytes, fail_at)
