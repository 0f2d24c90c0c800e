"""group_norm on channels_last (NHWC) storage in one launch, the tensor kept on chip
(templates/rows/nhwc_onchip.hip.j2).

Why: at the 0.3-5 MB of SD-UNet activations the two-launch path (statistics, then affine) costs
two launch latencies and a second read, more than the bytes. Here every block holds its part of
the tensor in registers, computes the statistics of its groups and writes the output from its
registers: one launch, each element read once.

A block covers a channel slice (`slice_groups` whole groups) of one sample and a chunk of its
pixels. When a slice's pixels fit one block (one chunk) the block has everything its groups need:
no barrier, any grid size. Otherwise the chunks of a (sample, slice) meet at a barrier, which is
only safe when every block of the grid is resident at once, so the grid is sized to the resident
blocks: on CUDA `min_blocks` per multiprocessor, held by __launch_bounds__ (the compiler keeps
registers within 64K / (min_blocks * block)); on HIP one block per compute unit; on the emulator,
which hands blocks out in order to one worker each, a slice's chunks must not outnumber the
workers (one per multiprocessor it reports). Shapes that do not fit (large tensors) take the
two-launch path.

The counters and partials are per-stream persistent workspaces of the prepared plan.
"""
from __future__ import annotations

from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .norm_common import ptr_or_none

SHARED_LIMIT = 47 << 10          # static shared memory of one block
RESIDENT_THREADS = 1024          # per multiprocessor on CUDA: 64 registers per thread
MAX_ROWS = 32                    # pixel rows a thread holds (registers: one to four per vector)
SPIN_LIMIT = {"cpu": 1 << 35, "gpu": 1 << 26}   # ~20 s on the emulator, ~30 s on a GPU, then trap
PARAMS = ("vec", "threads", "rows", "pixels_per_block", "slice_groups")


def layout(cv: int, warp: int, threads: int) -> tuple[int, int]:
    """(pixel rows per step BY, threads per block): CV threads per pixel row, rows filling ~threads."""
    by = max(1, threads // cv)
    return by, ceil_div(cv * by, warp) * warp


def lanes(groups: int, block: int) -> int:
    """Lanes per group in the group reductions: the largest power of two that lets every group
    reduce in one round (groups * lanes <= block); across warps when more than a warp."""
    out = 1
    while out * 2 <= block // max(1, groups):
        out *= 2
    return out


def shared_bytes(cs: int, gs: int, by: int, block: int = 1024) -> int:
    """Per-(row, channel) sums and squares, gamma and beta per channel, R_g and two statistics
    per group of the slice, one partial per warp."""
    return 4 * (2 * by * cs + 2 * cs + 3 * gs + block // 32) + 16


def min_blocks(block: int, shared: int, device: DeviceInfo) -> int:
    """Blocks per multiprocessor the barrier relies on."""
    if device.backend != "cuda":
        return 1
    by_shared = device.shared_per_multiprocessor // (shared + 1024)
    return max(1, min(RESIDENT_THREADS // block, by_shared))


def registers(rows: int, vec: int, itemsize: int) -> int:
    """Estimated registers per thread: the held vectors, each element's shift and two values per
    element in the passes (NVRTC 13.5, sm_90, checked without spills: 6 rows of 8 halves, 9 of
    4 floats, 21 of 2 floats)."""
    per_vec = ceil_div(vec * itemsize, 4)
    return per_vec * rows + 3 * vec + 16


def vector_widths(cs: int, itemsize: int) -> list[int]:
    """Widths (powers of two, at most 16 bytes) that tile a slice of CS channels, widest first."""
    return [v for v in (16, 8, 4, 2, 1) if v * itemsize <= 16 and cs % v == 0]


def check(problem: Any, device: DeviceInfo, vec: int, threads: int, rows: int, ppb: int,
          gs: int | None = None) -> tuple[int, int, int, int]:
    """(BY, block, chunks, min_blocks) of a runnable configuration, else ScheduleError with the reason."""
    n, c, hw, groups = problem.shape[0], problem.channels, problem.plane, problem.groups
    gs = groups if gs is None else gs
    itemsize = ITEMSIZE[problem.dtype]
    if gs < 1 or groups % gs:
        raise ScheduleError(f"group_norm onchip: slices of {gs} groups do not tile {groups} groups")
    cs = gs * (c // groups)
    if vec < 1 or vec & (vec - 1) or vec * itemsize > 16 or cs % vec:
        raise ScheduleError(f"group_norm onchip: vectors of {vec} {problem.dtype} do not tile a slice of {cs} channels")
    cv = cs // vec
    by, block = layout(cv, device.warp_size, threads)
    if cv > device.max_threads_per_block or block > device.max_threads_per_block:
        raise ScheduleError(f"group_norm onchip: {cv} vectors per pixel exceed a block")
    if not 1 <= rows <= MAX_ROWS or not 1 <= ppb <= by * rows:
        raise ScheduleError(f"group_norm onchip: {ppb} pixels per block with {rows} rows of {by} (1..{MAX_ROWS})")
    shared = shared_bytes(cs, gs, by)
    if shared > SHARED_LIMIT:
        raise ScheduleError(f"group_norm onchip: {by} rows of {cs} channels exceed shared memory")
    chunks = ceil_div(hw, ppb)
    minb = min_blocks(block, shared, device)
    if chunks > 1:
        if device.backend == "cpu":
            if chunks > device.multiprocessors:
                raise ScheduleError(f"group_norm onchip: {chunks} blocks per slice, more than the emulator's "
                                    f"{device.multiprocessors} workers")
        elif n * (groups // gs) * chunks > device.multiprocessors * minb:
            raise ScheduleError(f"group_norm onchip: {n * (groups // gs) * chunks} blocks, more than the "
                                f"{device.multiprocessors * minb} that are resident at once (the barrier needs them all)")
    return by, block, chunks, minb


SLICE_BYTES = 64 << 10           # a group's tensor bytes up to which one block holds a whole group
MIN_RUN_BYTES = 160              # a slice's bytes per pixel when chunks meet at a barrier
MIN_GROUP_BYTES = 16             # a group's bytes per pixel for a block per group (narrower: strided)


def slice_sizes(groups: int) -> list[int]:
    """The slice widths, in groups, that tile `groups`: its divisors, smallest first."""
    return [d for d in range(1, groups + 1) if groups % d == 0]


def pick(problem: Any, device: DeviceInfo) -> Schedule | None:
    """The scheduler's choice among `options`, or None (the two launches then).

    H100 sweep (scripts/device_group_norm_nhwc.py, 2026-11-25, 12 SD-UNet / SDXL shapes x fp16,
    bf16, fp32, 932 schedules, graph replay): these two rules pick within 1.4% of the fastest
    timed one-launch schedule on geometric mean, 8.7% at worst.
    - A group of at most 64 KB and of 16 bytes or more per pixel: one block per (sample, group)
      holds all of it: no barrier, no partials (0.3-2.6 MB tensors: 3.1-8.7 us against 6-13 us
      for blocks of whole pixels behind a barrier); the fewest threads (256, else 512) whose
      rows fit the registers.
    - Larger groups: chunks of a slice meet at a barrier; slices of the fewest groups that give
      160 bytes per pixel (narrower rows: 2-4 byte accesses, the load queue throttles), 256
      threads, the most rows (the fewest blocks)."""
    c, hw, groups = problem.channels, problem.plane, problem.groups
    itemsize = ITEMSIZE[problem.dtype]
    cpg = c // groups
    opts = [s for _, s in options(problem, device)]
    if cpg * hw * itemsize <= SLICE_BYTES and cpg * itemsize >= MIN_GROUP_BYTES:
        whole = [s for s in opts if int(s["slice_groups"]) == 1 and int(s["pixels_per_block"]) >= hw
                 and int(s["threads"]) in (256, 512)]
        if whole:
            return min(whole, key=lambda s: int(s["threads"]))
    wide = [d for d in slice_sizes(groups) if d * cpg * itemsize >= MIN_RUN_BYTES]
    gs = wide[0] if wide else groups
    fam = [s for s in opts if int(s["slice_groups"]) == gs]
    for threads in (256, 512, 1024):
        same = [s for s in fam if int(s["threads"]) == threads]
        if same:
            return max(same, key=lambda s: int(s["rows"]))
    return None


def options(problem: Any, device: DeviceInfo, vec: int | None = None) -> list[tuple[tuple, Schedule]]:
    """Every fitting (slice, threads, rows) at the widest vector of its slice, best first. For
    each slice and block size: the fewest rows that fit the slice's pixels in one chunk, and,
    where that needs more rows than registers allow, every row count with the grid resident."""
    c, hw, groups = problem.channels, problem.plane, problem.groups
    itemsize = ITEMSIZE[problem.dtype]
    out: list[tuple[tuple, Schedule]] = []
    for gs in slice_sizes(groups):
        cs = gs * (c // groups)
        widths = vector_widths(cs, itemsize)
        if vec is not None and gs == groups:
            widths = [vec] if vec in widths else []
        if not widths:
            continue
        v = widths[0]
        for threads in (256, 512, 1024):
            by, _ = layout(cs // v, device.warp_size, threads)
            for rows in range(1, MAX_ROWS + 1):
                if device.backend != "cpu" and registers(rows, v, itemsize) > 64:
                    break
                if by * (rows - 1) >= hw:
                    break                               # more rows than the slice has pixels
                ppb = min(by * rows, hw)
                try:
                    _, _, chunks, _ = check(problem, device, v, threads, rows, ppb, gs)
                except ScheduleError:
                    continue
                # listing order for the tuner: no barrier first, then fewer rows
                out.append(((chunks > 1, rows, -gs, threads),
                            Schedule.make("onchip", vec=v, threads=threads, rows=rows, pixels_per_block=ppb,
                                          slice_groups=gs)))
                if chunks == 1:
                    break                               # more rows only add idle registers
    return sorted(out, key=lambda t: t[0])


def plan(problem: Any, schedule: Schedule, device: DeviceInfo) -> Plan:
    n, c, hw, groups = problem.shape[0], problem.channels, problem.plane, problem.groups
    vec, threads, rows, ppb = (int(schedule[k]) for k in ("vec", "threads", "rows", "pixels_per_block"))
    gs = int(schedule.get("slice_groups", groups))
    by, block, chunks, minb = check(problem, device, vec, threads, rows, ppb, gs)
    numel = n * c * hw
    slices = groups // gs
    params = {"ctype": C_TYPE[problem.dtype], "ptype": C_TYPE[problem.ptype], "index_type": index_type(numel + 16),
              "vec": vec, "channels": c, "groups": groups, "slice_groups": gs, "rows_per_step": by, "rows": rows,
              "pixels": hw, "pixels_per_block": ppb, "chunks": chunks, "block": block, "min_blocks": minb,
              "lanes": lanes(gs, block),
              "spin_limit": SPIN_LIMIT["cpu" if device.backend == "cpu" else "gpu"],
              "has_gamma": problem.has_gamma, "has_beta": problem.has_beta}
    args = [Buf("x"), *ptr_or_none("gamma", problem.has_gamma), *ptr_or_none("beta", problem.has_beta),
            Buf("y"), Buf("partials"), Buf("counters"), Scalar("f32", problem.eps)]
    launch = Launch.make("rows/nhwc_onchip.hip.j2", "group_norm_nhwc_onchip", params, (n * slices * chunks,),
                         (block,), args)
    workspaces = (Workspace("counters", 8 * n * slices, persistent=True, zero=True),
                  Workspace("partials", 8 * n * chunks * groups, persistent=True))
    return Plan((launch,), workspaces)
