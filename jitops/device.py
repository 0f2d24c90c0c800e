"""What the scheduler may know about a device: a plain description, no driver handles.

Ops read a DeviceInfo to choose schedules; runtime backends produce one from the
driver (or from the table of known targets for offline compilation).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class DeviceInfo:
    backend: str                  # "cuda" | "hip" | "cpu"
    arch: str                     # "sm_90", "gfx90a", "cpu"
    name: str
    warp_size: int
    multiprocessors: int
    max_threads_per_block: int = 1024
    shared_per_block: int = 48 * 1024         # without opt-in
    shared_per_block_optin: int = 48 * 1024   # the most one block may ask for
    shared_per_multiprocessor: int = 64 * 1024
    registers_per_multiprocessor: int = 65536
    max_threads_per_multiprocessor: int = 2048   # 2048 on sm_80/sm_90 and CDNA (32 waves of 64)
    l2_bytes: int = 4 * 1024 * 1024
    matrix_cores: bool = False    # mma.sync (sm_80+) or MFMA (CDNA) usable from templates
    online: bool = True           # False: compile-only target, no device present

    @property
    def hopper(self) -> bool:
        """NVIDIA compute capability 9.0 (sm_90 / sm_90a): wgmma, TMA (cp.async.bulk.tensor) and
        thread-block clusters."""
        return self.backend == "cuda" and self.arch.rstrip("a") == "sm_90"

    @property
    def key(self) -> str:
        """Identity for tuning records: arch plus multiprocessor count."""
        return f"{self.arch}-{self.multiprocessors}sm"

    def as_dict(self) -> dict:
        return asdict(self)

    def offline(self) -> "DeviceInfo":
        return replace(self, online=False)

    def resident_blocks(self, threads: int, shared: int = 0, registers_per_thread: int = 0) -> int:
        """Blocks of `threads` threads that one multiprocessor holds at once, limited by its thread
        slots, shared memory (`shared` bytes per block) and register file; at least 1."""
        limit = self.max_threads_per_multiprocessor // max(1, threads)
        if shared:
            limit = min(limit, self.shared_per_multiprocessor // shared)
        if registers_per_thread:
            limit = min(limit, self.registers_per_multiprocessor // (registers_per_thread * threads))
        return max(1, limit)


# Compile targets known without a device (values from vendor documentation).
KNOWN_TARGETS: dict[str, DeviceInfo] = {
    "sm_80": DeviceInfo("cuda", "sm_80", "NVIDIA A100 (offline target)", 32, 108,
                        shared_per_block_optin=163 * 1024, shared_per_multiprocessor=164 * 1024,
                        l2_bytes=40 * 1024 * 1024, matrix_cores=True, online=False),
    "sm_86": DeviceInfo("cuda", "sm_86", "NVIDIA GA10x (offline target)", 32, 84,
                        shared_per_block_optin=99 * 1024, shared_per_multiprocessor=100 * 1024,
                        l2_bytes=6 * 1024 * 1024, matrix_cores=True, online=False),
    "sm_89": DeviceInfo("cuda", "sm_89", "NVIDIA AD10x (offline target)", 32, 128,
                        shared_per_block_optin=99 * 1024, shared_per_multiprocessor=100 * 1024,
                        l2_bytes=72 * 1024 * 1024, matrix_cores=True, online=False),
    "sm_90": DeviceInfo("cuda", "sm_90", "NVIDIA H100/H200 (offline target)", 32, 132,
                        shared_per_block_optin=227 * 1024, shared_per_multiprocessor=228 * 1024,
                        l2_bytes=50 * 1024 * 1024, matrix_cores=True, online=False),
    "gfx90a": DeviceInfo("hip", "gfx90a", "AMD MI200 (offline target)", 64, 110,
                         shared_per_block=64 * 1024, shared_per_block_optin=64 * 1024,
                         shared_per_multiprocessor=64 * 1024, registers_per_multiprocessor=131072,
                         l2_bytes=8 * 1024 * 1024, matrix_cores=True, online=False),
    "gfx942": DeviceInfo("hip", "gfx942", "AMD MI300 (offline target)", 64, 304,
                         shared_per_block=64 * 1024, shared_per_block_optin=64 * 1024,
                         shared_per_multiprocessor=64 * 1024, registers_per_multiprocessor=131072,
                         l2_bytes=4 * 1024 * 1024, matrix_cores=True, online=False),
    "gfx1100": DeviceInfo("hip", "gfx1100", "AMD RDNA3 (offline target)", 32, 96,
                          shared_per_block=64 * 1024, shared_per_block_optin=64 * 1024,
                          shared_per_multiprocessor=128 * 1024, l2_bytes=6 * 1024 * 1024,
                          matrix_cores=False, online=False),
}


def backend_of_target(target: str) -> str:
    if target.startswith("sm_"):
        return "cuda"
    if target.startswith("gfx"):
        return "hip"
    if target.startswith("cpu"):
        return "cpu"
    raise ValueError(f"unknown target '{target}': expected sm_XX, gfxNNN or cpu")
