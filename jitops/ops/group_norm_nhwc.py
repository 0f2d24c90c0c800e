"""group_norm on channels_last (NHWC) storage, read in place (no transpose).

In NHWC a group is CPG consecutive channels of every pixel: strided, so the NCHW row kernels do
not apply. Two launches instead (templates/rows/nhwc_stats.hip.j2, then batch_norm's affine
kernel):

  stats - blocks over (sample, chunk of pixels); each thread keeps one vector of channels and
          walks pixel rows (16-byte loads along C), per-channel shifted sums, per-group states,
          a per-sample grid reduction (atomic ticket; the last block merges and writes the
          coefficients (k, a, b) per (sample, channel))
  apply - y = (x - k) * a + b over the dense storage, the vector's channels contiguous (rowwise),
          the coefficients read as float4s

`onchip` (group_norm_onchip: one launch, the tensor held in registers; a block per (sample,
group) where a group fits one block, else chunks of channel slices behind a barrier) is the pick
wherever it fits; the two launches above take the tensors whose slices do not fit the resident grid
(the 21 MB 8x320x64x64, the 103 MB 256x64x56x56). `naive` (block per group, scalar, strided
addressing) is the baseline and the fallback for channel counts the stats kernel cannot hold (more
than 1024 vectors per pixel).
"""
from __future__ import annotations

from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from . import group_norm_onchip as onchip
from .norm_affine import affine_launch
from .norm_common import ptr_or_none, row_plan, vector_width

ALGORITHMS = ("onchip", "nhwc", "naive")
SHARED_LIMIT = 44 << 10          # the stats kernel's static shared memory (48 KB at most)
STATS_REGISTERS = 72             # per thread, allocated (ptxas, sm_90: 69 for fp16/bf16, 40 for fp32)


def _shape(problem: Any) -> tuple[int, int, int, int]:
    n, c = problem.shape[0], problem.channels
    return n, c, problem.plane, c // problem.groups


def _rows_per_step(cv: int, warp: int, block: int = 512) -> tuple[int, int]:
    """(pixel rows per step, threads per block): CV threads per pixel row, rows filling ~block."""
    by = max(1, block // cv)
    return by, ceil_div(cv * by, warp) * warp


def _shared_bytes(c: int, groups: int, by: int, block: int) -> int:
    """Per-(row, channel) sums, shifts and references per channel, merge states per (group, thread)."""
    merge = 0 if _merge_in_sums(c, groups, by, block) else 3 * groups * _merge_threads(groups, block)
    return 4 * (2 * by * c + 2 * c + merge) + 16


def _merge_threads(groups: int, block: int) -> int:
    return max(1, block // groups)


def _merge_in_sums(c: int, groups: int, by: int, block: int) -> bool:
    """The last block's merge states fit where the per-row sums were (no longer needed by then)."""
    return 3 * groups * _merge_threads(groups, block) <= by * c


def _blocks_per_sm(block: int, device: DeviceInfo) -> int:
    """Resident stats blocks per multiprocessor: threads and registers (65536 per SM)."""
    return max(1, min(device.max_threads_per_multiprocessor // block, 65536 // (block * STATS_REGISTERS)))


def heuristic(problem: Any, device: DeviceInfo, algorithm: str | None = None, **over: Any) -> Schedule:
    if algorithm not in (None, *ALGORITHMS):
        raise ScheduleError(f"group_norm on channels_last input has no algorithm '{algorithm}' "
                            f"(choose from {', '.join(ALGORITHMS)})")
    n, c, hw, cpg = _shape(problem)
    forced_vec = "vec" in over
    vec = int(over.pop("vec", vector_width(c, ITEMSIZE[problem.dtype])))
    cv = c // vec
    why = [f"channels_last: {n} samples x {hw} pixels x {c} channels, {problem.groups} groups of {cpg} channels"]
    # The one launch (group_norm_onchip.pick) wherever it fits; the two launches take the tensors
    # whose slices do not fit the resident grid (H100: 8x320x64x64 fp16, 21 MB: 30 us against 46
    # us for the one launch's only fitting schedule, which `pick` does not take).
    if algorithm in ("onchip", None):
        picked = _onchip(problem, device, vec, algorithm, {**over, "vec": vec} if forced_vec else over, why)
        if picked is not None:
            return picked
    # the widest block (512 threads, fewer for wide rows of many channels) whose sums fit shared memory
    fitting = [t for t in (512, 256, 128, device.warp_size)
               if cv <= device.max_threads_per_block and
               _shared_bytes(c, problem.groups, *_rows_per_step(cv, device.warp_size, t)) <= SHARED_LIMIT]
    fits = bool(fitting)
    if algorithm == "naive" or (algorithm is None and not fits):
        if algorithm is None:
            why.append(f"{cv} vectors per pixel: more than the stats kernel holds, so the naive kernel")
        return Schedule.make("naive", why="; ".join(why + ["baseline: block per group, scalar, strided"]),
                             block=int(over.pop("block", 256)))
    unroll = int(over.pop("unroll", 4))
    # H100 sweep (scripts/device_memops.py, 2026-11-23, SD-UNet shapes, fp16): the per-block tail
    # (reduce, per-group merge, partials, ticket) made many small blocks lose: 512 threads and 4x
    # the pixels per block of a 2-waves split ran 1.4-1.7x faster (2x320x64x64: 25.8 -> 16.9 us).
    # The tail has since lost its global loads and per-group fences (not re-measured). Kept: about
    # one resident wave in all, at least one full load step per thread; 512 threads while that wave
    # fits one block per SM (registers allow no second one), else 256 (three per SM: more loads
    # in flight per SM for the many-block problems).
    threads = over.pop("threads", None)
    options = [int(threads)] if threads is not None else fitting[:2]
    for t in options:
        by, block = _rows_per_step(cv, device.warp_size, t)
        resident = device.multiprocessors * _blocks_per_sm(block, device)
        want = max(1, ceil_div(resident, max(1, n)))
        ppb = max(by * unroll, ceil_div(hw, want))
        if n * ceil_div(hw, ppb) <= resident:
            break
    ppb = int(over.pop("pixels_per_block", ppb))
    ablock, aunroll = int(over.pop("apply_block", 256)), int(over.pop("apply_unroll", 2))
    if over:
        raise ScheduleError(f"group_norm nhwc: unknown parameters {sorted(over)}")
    chunks = ceil_div(hw, ppb)
    why.append(f"stats: {block} threads ({by} pixel rows of {cv} vectors of {vec}), {ppb} pixels per block "
               f"({chunks} blocks per sample), grid-reduced per sample; apply: float4 coefficients")
    return Schedule.make("nhwc", why="; ".join(why), vec=vec, threads=by * cv, unroll=unroll,
                         pixels_per_block=ppb, apply_block=ablock, apply_unroll=aunroll)


def _onchip(problem: Any, device: DeviceInfo, vec: int, algorithm: str | None, over: dict,
            why: list[str]) -> Schedule | None:
    """The one-launch schedule: `onchip.pick`, parameters given in `over` taking precedence
    (threads / rows / pixels_per_block given without slice_groups mean whole pixels, one slice);
    None when nothing fits and no algorithm was forced."""
    if device.backend == "cpu":
        # the emulator's workers may be fewer than it reports: one block per slice, no waiting
        opts = [s for _, s in onchip.options(problem, device)]
        opts = [s for s in opts if int(s["pixels_per_block"]) >= problem.plane][:1]
        chosen = opts[0] if opts else None
    else:
        chosen = onchip.pick(problem, device)
    if chosen is None and algorithm is None:
        return None
    if chosen is None:
        first = onchip.options(problem, device)
        chosen = first[0][1] if first else None
    base = dict(chosen.params) if chosen is not None else {"vec": vec, "threads": 512, "rows": 1,
                                                           "pixels_per_block": 1}
    base.setdefault("slice_groups", problem.groups)
    if over and "slice_groups" not in over and chosen is not None and int(chosen["slice_groups"]) != problem.groups:
        base["slice_groups"] = problem.groups           # hand-set rows / threads: whole pixels, as before slices
        base["vec"] = vec
    params = {k: int(over.pop(k, base[k])) for k in onchip.PARAMS}
    if over:
        raise ScheduleError(f"group_norm onchip: unknown parameters {sorted(over)}")
    by, block, chunks, minb = onchip.check(problem, device, params["vec"], params["threads"], params["rows"],
                                           params["pixels_per_block"], params["slice_groups"])
    cs = params["slice_groups"] * (problem.channels // problem.groups)
    barrier = (f"{chunks} blocks per (sample, slice) behind one barrier ({minb} resident per multiprocessor)"
               if chunks > 1 else "one block per (sample, slice): no barrier")
    why.append(f"one launch, the tensor on chip: slices of {params['slice_groups']} groups ({cs} channels), "
               f"{block} threads ({by} pixel rows of {cs // params['vec']} vectors of {params['vec']}) hold "
               f"{params['rows']} rows each, {params['pixels_per_block']} pixels per block, {barrier}")
    return Schedule.make("onchip", why="; ".join(why), **params)


def candidates(problem: Any, device: DeviceInfo) -> list[Schedule]:
    out = [heuristic(problem, device, "naive")]
    _, _, hw, _ = _shape(problem)
    chosen = onchip.pick(problem, device) if device.backend != "cpu" else None
    out += ([chosen] if chosen is not None else []) + [s for _, s in onchip.options(problem, device)[:8]
                                                       if s != chosen]
    for threads in (128, 256, 512):
        for unroll in (2, 4, 8):
            for spread in (1, 2, 4):
                try:
                    base = heuristic(problem, device, "nhwc", threads=threads, unroll=unroll)
                    ppb = max(int(base["pixels_per_block"]) * spread // 2, 1)
                    out.append(heuristic(problem, device, "nhwc", threads=threads, unroll=unroll,
                                         pixels_per_block=min(ppb, hw)))
                except ScheduleError:
                    continue
    return out


def plan(problem: Any, schedule: Schedule, device: DeviceInfo) -> Plan:
    n, c, hw, cpg = _shape(problem)
    if n * c * hw == 0:
        return Plan(launches=())
    if schedule.algorithm == "naive":
        return row_plan(problem.row_spec(), schedule, device, "y")
    if schedule.algorithm == "onchip":
        return onchip.plan(problem, schedule, device)
    if schedule.algorithm != "nhwc":
        raise ScheduleError(f"group_norm on channels_last input has no algorithm '{schedule.algorithm}' "
                            f"(choose from {', '.join(ALGORITHMS)})")
    vec, unroll, ppb = int(schedule["vec"]), int(schedule["unroll"]), int(schedule["pixels_per_block"])
    itemsize = ITEMSIZE[problem.dtype]
    if vec < 1 or vec & (vec - 1) or vec * itemsize > 16 or c % vec:
        raise ScheduleError(f"group_norm nhwc: vectors of {vec} {problem.dtype} do not tile {c} channels")
    cv = c // vec
    by, block = _rows_per_step(cv, device.warp_size, int(schedule["threads"]))
    if cv > device.max_threads_per_block or block > device.max_threads_per_block:
        raise ScheduleError(f"group_norm nhwc: {cv} vectors per pixel exceed a block")
    if _shared_bytes(c, problem.groups, by, block) > SHARED_LIMIT:
        raise ScheduleError(f"group_norm nhwc: {by} rows of {c} channels ({problem.groups} groups) "
                            "exceed shared memory")
    if ppb < 1 or unroll < 1:
        raise ScheduleError("group_norm nhwc: pixels_per_block and unroll must be positive")
    chunks = ceil_div(hw, ppb)
    numel = n * c * hw
    params = {"ctype": C_TYPE[problem.dtype], "ptype": C_TYPE[problem.ptype], "index_type": index_type(numel + 16),
              "vec": vec, "channels": c, "rows_per_step": by, "unroll": unroll, "pixels": hw,
              "pixels_per_block": ppb, "chunks": chunks, "groups": problem.groups, "block": block,
              "has_gamma": problem.has_gamma, "has_beta": problem.has_beta,
              "merge_in_sums": _merge_in_sums(c, problem.groups, by, block)}
    args = [Buf("x"), *ptr_or_none("gamma", problem.has_gamma), *ptr_or_none("beta", problem.has_beta),
            Buf("partials"), Buf("counters"), Buf("coef"), Scalar("i32", n), Scalar("f32", problem.eps)]
    stats = Launch.make("rows/nhwc_stats.hip.j2", "group_norm_nhwc_stats", params, (n * chunks,), (block,),
                        args)
    apply = affine_launch("group_norm_nhwc_apply", problem.dtype, numel, 1, n * c, device, vec=vec,
                          unroll=int(schedule["apply_unroll"]), block=int(schedule["apply_block"]),
                          per_plane=False, coef="coef", out="y", streaming=False, channels=c, sample_planes=hw * c)
    workspaces = (Workspace("counters", 4 * n, persistent=True, zero=True),
                  Workspace("partials", 8 * n * chunks * problem.groups, persistent=True),
                  Workspace("coef", 12 * n * c, persistent=True))
    return Plan((stats, apply), workspaces)


def variants(make: Any, device: DeviceInfo) -> list[tuple[Any, Schedule]]:
    """One representative of each NHWC family (bf16, fp32 parameters, a vector straddling groups:
    cpg 10 of 8-channel vectors, several chunks: the two-launch path and the one-launch path with
    its barrier) and the naive kernel's strided addressing."""
    prob = make((2, 40, 6, 6), "bfloat16", "float32", 4)
    return [(prob, heuristic(prob, device, "nhwc", pixels_per_block=8)), (prob, heuristic(prob, device, "naive")),
            (prob, heuristic(prob, device, "onchip", threads=32, rows=3, pixels_per_block=18))]

