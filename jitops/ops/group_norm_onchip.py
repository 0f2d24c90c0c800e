"""group_norm on channels_last (NHWC) storage in one launch, the tensor kept on chip
(templates/rows/nhwc_onchip.hip.j2).

Why: at the 0.3-5 MB of SD-UNet activations the two-launch path (statistics, then affine) costs
two launch latencies and a second read, more than the bytes. Here every block holds its chunk of
pixels in registers, writes per-group partials, waits at a per-sample barrier for the sample's
other blocks, merges all partials and writes the output from its registers: one launch, each
element read once.

The barrier is only safe when every block of the grid is resident at once, so the grid is sized
to the resident blocks: on CUDA `min_blocks` per multiprocessor, held by __launch_bounds__
(the compiler keeps registers within 64K / (min_blocks * block)); on HIP one block per compute
unit; on the emulator, which hands blocks out in order to one worker each, a sample's chunks must
not outnumber the workers (one per multiprocessor it reports). Shapes that do not fit (large
tensors) take the two-launch path.

The counters are a persistent workspace of the prepared plan, which every stream shares (as the
two-launch path's ticket and partials are): two launches of one problem running at once on two
streams would mix their arrivals, and a block may then spin out its bound and trap.
"""
from __future__ import annotations

from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .norm_common import ptr_or_none

SHARED_LIMIT = 47 << 10          # static shared memory of one block
RESIDENT_THREADS = 1024          # per multiprocessor on CUDA: 64 registers per thread
MAX_ROWS = 16                    # pixel rows a thread holds (registers: 4 per 16-byte vector)
SPIN_LIMIT = {"cpu": 1 << 35, "gpu": 1 << 26}   # ~20 s on the emulator, ~30 s on a GPU, then trap


def layout(cv: int, warp: int, threads: int) -> tuple[int, int]:
    """(pixel rows per step BY, threads per block): CV threads per pixel row, rows filling ~threads."""
    by = max(1, threads // cv)
    return by, ceil_div(cv * by, warp) * warp


def _merge_threads(groups: int, block: int) -> int:
    return max(1, block // groups)


def shared_bytes(c: int, groups: int, by: int, block: int) -> int:
    merge = 3 * groups * _merge_threads(groups, block)
    own_merge = 0 if merge <= by * c else merge
    return 4 * (2 * by * c + 2 * c + 2 * groups + own_merge) + 16


def min_blocks(block: int, shared: int, device: DeviceInfo) -> int:
    """Blocks per multiprocessor the barrier relies on."""
    if device.backend != "cuda":
        return 1
    by_shared = device.shared_per_multiprocessor // (shared + 1024)
    return max(1, min(RESIDENT_THREADS // block, by_shared))


def registers(rows: int, vec: int, itemsize: int) -> int:
    """Estimated registers per thread: the held vectors, the shift vector, two sums per element."""
    per_vec = ceil_div(vec * itemsize, 4)
    return per_vec * (rows + 1) + 2 * vec + 16


def check(problem: Any, device: DeviceInfo, vec: int, threads: int, rows: int, ppb: int) -> tuple[int, int, int, int]:
    """(BY, block, chunks, min_blocks) of a runnable configuration, else ScheduleError with the reason."""
    n, c, hw = problem.shape[0], problem.channels, problem.plane
    itemsize = ITEMSIZE[problem.dtype]
    if vec < 1 or vec & (vec - 1) or vec * itemsize > 16 or c % vec:
        raise ScheduleError(f"group_norm onchip: vectors of {vec} {problem.dtype} do not tile {c} channels")
    cv = c // vec
    by, block = layout(cv, device.warp_size, threads)
    if cv > device.max_threads_per_block or block > device.max_threads_per_block:
        raise ScheduleError(f"group_norm onchip: {cv} vectors per pixel exceed a block")
    if not 1 <= rows <= MAX_ROWS or not 1 <= ppb <= by * rows:
        raise ScheduleError(f"group_norm onchip: {ppb} pixels per block with {rows} rows of {by} (1..{MAX_ROWS})")
    shared = shared_bytes(c, problem.groups, by, block)
    if shared > SHARED_LIMIT:
        raise ScheduleError(f"group_norm onchip: {by} rows of {c} channels exceed shared memory")
    chunks = ceil_div(hw, ppb)
    minb = min_blocks(block, shared, device)
    if device.backend == "cpu":
        if chunks > device.multiprocessors:
            raise ScheduleError(f"group_norm onchip: {chunks} blocks per sample, more than the emulator's "
                                f"{device.multiprocessors} workers")
    elif n * chunks > device.multiprocessors * minb:
        raise ScheduleError(f"group_norm onchip: {n * chunks} blocks, more than the {device.multiprocessors * minb} "
                            "that are resident at once (the barrier needs them all)")
    return by, block, chunks, minb


def options(problem: Any, device: DeviceInfo, vec: int) -> list[tuple[tuple, Schedule]]:
    """Every fitting (threads, rows), best first. H100 sweep (scripts/device_memops2.py,
    2026-11-23, 8 SD-UNet shapes x fp16/bf16/fp32, graph replay): the fastest were 512-thread
    blocks with the fewest rows that keep the grid within one block per multiprocessor (1024
    threads where 512 would need more registers than 64 per thread); 256-thread blocks holding
    many rows were 5-25% slower. So: grid within the multiprocessors first, then 512, 1024, 256
    threads, then fewer rows."""
    n, c, hw = problem.shape[0], problem.channels, problem.plane
    itemsize = ITEMSIZE[problem.dtype]
    out: list[tuple[tuple, Schedule]] = []
    if c % vec:
        return out
    for rank, threads in enumerate((512, 1024, 256)):
        for rows in range(1, MAX_ROWS + 1):
            by, _ = layout(c // vec, device.warp_size, threads)
            ppb = min(by * rows, hw)
            if ppb < by * rows and rows > 1:
                break                                   # more rows than the sample has pixels
            if device.backend != "cpu" and registers(rows, vec, itemsize) > 64:
                break
            try:
                by, block, chunks, minb = check(problem, device, vec, threads, rows, ppb)
            except ScheduleError:
                continue
            score = (n * chunks > device.multiprocessors, rank, rows)
            out.append((score, Schedule.make("onchip", vec=vec, threads=threads, rows=rows, pixels_per_block=ppb)))
    return sorted(out, key=lambda t: t[0])


def plan(problem: Any, schedule: Schedule, device: DeviceInfo) -> Plan:
    n, c, hw = problem.shape[0], problem.channels, problem.plane
    vec, threads, rows, ppb = (int(schedule[k]) for k in ("vec", "threads", "rows", "pixels_per_block"))
    by, block, chunks, minb = check(problem, device, vec, threads, rows, ppb)
    numel = n * c * hw
    params = {"ctype": C_TYPE[problem.dtype], "ptype": C_TYPE[problem.ptype], "index_type": index_type(numel + 16),
              "vec": vec, "channels": c, "rows_per_step": by, "rows": rows, "pixels": hw, "pixels_per_block": ppb,
              "chunks": chunks, "groups": problem.groups, "block": block, "min_blocks": minb,
              "spin_limit": SPIN_LIMIT["cpu" if device.backend == "cpu" else "gpu"],
              "has_gamma": problem.has_gamma, "has_beta": problem.has_beta,
              "merge_in_sums": 3 * problem.groups * _merge_threads(problem.groups, block) <= by * c}
    args = [Buf("x"), *ptr_or_none("gamma", problem.has_gamma), *ptr_or_none("beta", problem.has_beta),
            Buf("y"), Buf("partials"), Buf("counters"), Scalar("f32", problem.eps)]
    launch = Launch.make("rows/nhwc_onchip.hip.j2", "group_norm_nhwc_onchip", params, (n * chunks,),
                         (block,), args)
    workspaces = (Workspace("counters", 8 * n, persistent=True, zero=True),
                  Workspace("partials", 8 * n * chunks * problem.groups, persistent=True))
    return Plan((launch,), workspaces)

