"""What fused_wgmma's kernel can hold: the head dims and dtypes it takes (`why_not`), the shared
memory and registers of a tile (`shared_bytes`, `registers`) and whether a tile fits a device (`fits`).
The scheduler's measured choices among the tiles that fit are in attention_wgmma_rules."""
from __future__ import annotations

from ..device import DeviceInfo
from .attention_mma import MMA_DTYPES, padded_dim
from .attention_problem import AttentionProblem

MAX_DIM = 256


def why_not(p: AttentionProblem, device: DeviceInfo) -> str | None:
    """None when fused_wgmma can run this problem on this device, else the reason."""
    if not device.hopper:
        return f"wgmma needs an sm_90 device ({device.name} is {device.arch})"
    if p.dtype not in MMA_DTYPES:
        return f"wgmma takes {' or '.join(MMA_DTYPES)}, not {p.dtype}"
    if p.d % 8 or p.d > MAX_DIM:
        return f"D={p.d}: fused_wgmma takes head dims that are multiples of 8 up to {MAX_DIM}"
    return None


def shared_bytes(d: int, groups: int, block_k: int, stages: int = 2, tma: bool = False, q_buffers: int = 1) -> int:
    """Q tile plus `stages` K and V tiles, each DP/8 column chunks of rows * 16 + 64 bytes (and the
    producer's ring barriers, 16 bytes per buffer, in static shared memory). tma: K and V tiles of
    ceil(DP/64) blocks of rows x 128 bytes (the 128-byte swizzle), 1024-byte aligned (1 KB of slack).
    q_buffers = 2: the walk over query tiles (q_walk) stages the next Q tile beside the current one."""
    chunks = padded_dim(d) // 8
    q = q_buffers * chunks * (64 * groups * 16 + 64)
    if tma:
        return q + 1024 + 2 * stages * (-(-padded_dim(d) // 64)) * block_k * 128 + 16 * stages
    return q + chunks * 2 * stages * (block_k * 16 + 64) + 16 * stages


def registers(d: int, block_k: int) -> int:
    """Rough registers per thread: S (BK/2) and O (DP/2) accumulators, P packed (BK/4), ~40 more."""
    return block_k // 2 + padded_dim(d) // 2 + block_k // 4 + 40


def fits(d: int, groups: int, block_k: int, device: DeviceInfo, stages: int = 2, producer: bool = False,
         tma: bool = False) -> bool:
    threads = 128 * (groups + producer)
    if tma and not producer and groups >= 3 and padded_dim(d) <= 128:
        # One block of 3-4 warpgroups with the whole register file (168 / 128 registers per thread):
        # the accumulators (S, O, packed P) must leave 8. NVRTC 13.5: 4 x 64-key tiles at DP = 128 in
        # 125 registers, 3 x 128-key tiles at DP = 128 in 158-162, no spills; 4 x 128-key tiles at
        # DP = 128 fail to allocate (the rough estimate below is for the loops with a producer).
        cap = min(255, device.registers_per_multiprocessor // threads // 8 * 8)
        return (threads <= device.max_threads_per_block
                and block_k // 2 + padded_dim(d) // 2 + block_k // 4 <= cap - 8
                and shared_bytes(d, groups, block_k, stages, tma) <= device.shared_per_block_optin)
    return (threads <= device.max_threads_per_block
            and registers(d, block_k) * threads < device.registers_per_multiprocessor   # 512 x 128: spills
            and registers(d, block_k) <= 255
            and shared_bytes(d, groups, block_k, stages, tma) <= device.shared_per_block_optin)
