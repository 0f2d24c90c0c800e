"""conv2d on Hopper's warpgroup MMA: implicit GEMM with wgmma (templates/conv2d/wgmma.hip.j2).

The problem, the weight pack, the NHWC copy, the epilogue and split-K are those of the mma.sync
kernel (conv2d_mma); only the main loop differs: wgmma.mma_async m64nBNk16 reading both operands
from shared memory, so a warpgroup's products run while its threads prepare the next tile. The
arch-specific target sm_90a exists on compute capability 9.0 only; elsewhere the mma.sync kernel
stays the matrix-core path.

Variants: `persistent` (a grid of resident blocks looping over tiles, for short K), `b_nchw`
(a 1x1 convolution of an NCHW input as y_n = W x_n per image, templates/conv2d/wgmma_nchw.hip.j2:
the image read in place as wgmma's transposed B, no NHWC copy) and `window_rows` (inputs of at most
4 channels, RGB stems: K made of window rows of 4-channel pixels instead of taps of 8 channels,
conv2d_mma.WindowRows; ResNet-50's 7x7 stem has 4 K tiles instead of 7).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import (C_TYPE, INT32_MAX, Buf, Launch, Plan, Scalar, Schedule, TensorMap, Workspace, ceil_div, index_type,
                   round_up)
from .conv2d_mma import (channels, epilogue_bytes, is_window_rows, k_padded, needs_nhwc_copy, nhwc_copy_launch,
                         pack_launch, plan_around, splits_of, window_rows, window_rows_why_not)
from .conv2d_problem import Conv2dProblem

ALGORITHM = "implicit_gemm_wgmma"
DTYPES = ("float16", "bfloat16", "float32")    # fp32 only with precision "tf32"
# (bm, bn, stages, producer): bm / 64 consumer warpgroups; producer adds a copying warpgroup.
# 3-stage 128 x 128 and the 64-wide tiles leave room for two blocks per multiprocessor (one's
# epilogue runs beside the other's main loop). The producer variant won only two 1x1 layers of 36
# in the first sweep (H100, 2026-11-24): two of its tiles stay in the space.
TILES = ((128, 256, 4, 0), (256, 128, 4, 0), (192, 128, 4, 0), (128, 192, 4, 0), (128, 128, 6, 0),
         (128, 128, 4, 0), (128, 128, 3, 0), (64, 256, 4, 0), (64, 128, 4, 0), (128, 64, 4, 0), (64, 64, 4, 0),
         (128, 128, 4, 1), (192, 128, 4, 1), (128, 64, 3, 0), (64, 128, 3, 0), (192, 64, 3, 0))
# Tiles also offered on a persistent grid (NHWC output, no split): each block loops over tiles, and
# its next tile's first K tiles load while the current one's epilogue stores. For problems with a
# short K (3x3 over 64 channels: 9 K tiles), where a block's prologue and epilogue are a large
# share of its time.
PERSISTENT_TILES = ((256, 128, 4, 0), (128, 256, 4, 0), (128, 128, 4, 0), (128, 128, 3, 0), (192, 128, 4, 0),
                    (128, 64, 4, 0), (64, 128, 4, 0), (128, 64, 3, 0),
                    # 2026-11-26: 6-stage 128 x 128, fastest candidate of 7 of 121 problems in a TF32 sweep
                    # (H100; 0.94-0.98x the next tile). Tried and left out the same day: 192 x 128 with 5
                    # stages (fastest of 1 of 121; large_spatial 1.002x the 4-stage ring), 128 x 192 and 256 x 64
                    # (none; 1.06-2.0x the fastest).
                    (128, 128, 6, 0))
# The persistent tiles the fp16 / bf16 twin rule may swap in (timed in fp16 on the H100, 2026-11-25).
TWIN_TILES = PERSISTENT_TILES[:8]
# Tiles of the NCHW 1x1 kernel (templates/conv2d/wgmma_nchw.hip.j2, `b_nchw`): (output channels,
# pixels, stages).
NCHW_TILES = ((128, 128, 4, 0), (128, 64, 4, 0), (64, 128, 4, 0), (64, 64, 4, 0), (128, 256, 4, 0),
              (256, 128, 4, 0))



# TF32 constants of WgmmaCost (chosen and printed by scripts/conv2d_wgmma_picks.py --tf32). Tiles
# without TF32 timings are rated at UNRATED_TF32.
TF32_RATE = {(128, 256, 4, 0): 0.741, (256, 128, 4, 0): 0.559, (192, 128, 4, 0): 0.746, (128, 192, 4, 0): 0.749, (128, 128, 6, 0): 0.604, (128, 128, 4, 0): 0.547, (128, 128, 3, 0): 0.466, (64, 256, 4, 0): 0.468, (64, 128, 4, 0): 0.65, (128, 64, 4, 0): 0.67, (64, 64, 4, 0): 0.741, (128, 128, 4, 1): 0.527, (192, 128, 4, 1): 0.644, (128, 64, 3, 0): 0.607, (64, 128, 3, 0): 0.766, (192, 64, 3, 0): 0.407}
TF32_PERSISTENT_RATE = {(256, 128, 4, 0): 0.584, (128, 256, 4, 0): 0.739, (128, 128, 4, 0): 0.515, (128, 128, 3, 0): 0.591, (192, 128, 4, 0): 0.586, (128, 64, 4, 0): 0.514, (64, 128, 4, 0): 0.522, (128, 64, 3, 0): 0.487, (128, 128, 6, 0): 0.535}
TF32_OVERHEAD_K = 184.9
TF32_PERSISTENT_OVERHEAD_K = 96.9
TF32_L2_BYTES_PER_S = 7.39e+12
UNRATED_TF32 = 0.25


@dataclass(frozen=True)
class WgmmaCost:
    """Constants of `estimate`: the share of the multiprocessor's dense fp16 rate each tile
    sustains in its main loop, the per-block overhead (prologue, epilogue) in K elements, the L2's
    rate into shared memory and split-K's fixed cost. Fitted by scripts/conv2d_wgmma_fit.py to 2886
    timed candidates, each checked against float64, on 137 problems (15 benchmark in fp16 and bf16,
    14 large, 93 torchvision layers; H100, 2026-11-25): rms error 0.127 in log time; the model's
    pick runs 1.030x the fastest candidate's time on geometric mean (worst 1.29x)."""

    tile_rate: dict = field(default_factory=lambda: {
        (128, 256, 4, 0): 0.719, (256, 128, 4, 0): 0.676, (192, 128, 4, 0): 0.635, (128, 192, 4, 0): 0.658,
        (128, 128, 6, 0): 0.581, (128, 128, 4, 0): 0.566, (128, 128, 3, 0): 0.519, (64, 256, 4, 0): 0.513,
        (64, 128, 4, 0): 0.824, (128, 64, 4, 0): 0.795, (64, 64, 4, 0): 0.804, (128, 128, 4, 1): 0.476,
        (192, 128, 4, 1): 0.532})
    overhead_k: float = 213.3
    # Bytes per second the L2 delivers to all multiprocessors' shared memory together: each block
    # reads (bm + bn) rows of its K, so small tiles need twice the traffic per flop of large ones;
    # without this term the fit rated 64x128 at 68% of peak from small problems and picked it on
    # k100_2, where it ran 1.34x slower than 128x256 (H100, 2026-11-25).
    l2_bytes_per_s: float = 8.29e12
    # Fixed seconds a split-K call adds: the second (reduction) kernel and the fp32 workspace's
    # first touch; its bytes are charged apart at the copy rate.
    split_s: float = 2.22e-6
    # Persistent tiles (PERSISTENT_TILES) in fp16 / bf16: not rated yet, so never the model's pick (the tuner times
    # them; the heuristic swaps one in by persistent_twin's measured rule). A fit of one factor on
    # these rates and a separate overhead to 160 timings (H100, 2026-11-25) reached rms 0.20 in
    # log time but picked persistent tiles where they lost (TF32 k100_2, SD's 320-channel 3x3).
    persistent_rate: dict = field(default_factory=dict)
    # fp32 with precision "tf32": constants of its own, persistent tiles rated. Per tile, the share
    # of the dense TF32 rate (half the fp16 one) in the main loop, non-persistent and persistent;
    # per-block overheads in fp32 K elements; the L2's rate into shared memory. Chosen by
    # scripts/conv2d_wgmma_fit.py --tf32 (docs/conv2d.md, "Choosing a TF32 tile"): least squares
    # on log time plus the time the picks lose to the fastest timed candidate of each problem.
    # The fp16 rates over a single factor (3.2) ranked the TF32 tiles badly: 64 x 128 on k100_5
    # (1.43x the 192 x 128 persistent tile), and persistent tiles only by the fp16 twin rule.
    # They were fitted on channels_last timings only: NCHW inputs (an NHWC copy in, an NCHW store out)
    # keep the earlier estimate, the fp16 rates over tf32_math (that fit moved 7 small NCHW 1x1
    # layers off the exact kernels onto wgmma, 0.58-0.95x their time, H100 2026-11-26 run 2).
    tf32_math: float = 3.2
    tf32_rate: dict = field(default_factory=lambda: dict(TF32_RATE))
    tf32_persistent_rate: dict = field(default_factory=lambda: dict(TF32_PERSISTENT_RATE))
    tf32_overhead_k: float = TF32_OVERHEAD_K
    tf32_persistent_overhead_k: float = TF32_PERSISTENT_OVERHEAD_K
    tf32_l2_bytes_per_s: float = TF32_L2_BYTES_PER_S


COST = WgmmaCost()


def why_not(p: Conv2dProblem, device: DeviceInfo) -> str | None:
    """Why the wgmma kernel cannot run this problem on this device, or None."""
    if not device.hopper:
        return f"wgmma needs an sm_90 device ({device.name} is {device.arch})"
    if p.dtype not in DTYPES:
        return f"wgmma conv2d takes float16 or bfloat16, or float32 with precision 'tf32' (got {p.dtype})"
    if p.dtype == "float32" and p.precision != "tf32":
        return (f"wgmma conv2d takes float32 only with precision 'tf32' (got '{p.precision}': 'highest' keeps "
                "the exact kernels, '3xtf32' the mma.sync kernel)")
    if p.groups > 1 and p.cin_g % 8:
        return f"grouped matrix-core conv2d needs a multiple of 8 input channels per group (got {p.cin_g})"
    return None


def bk_of(p: Conv2dProblem) -> int:
    """K per stage: one 128-byte swizzled row (64 16-bit elements or 32 fp32)."""
    return 128 // p.itemsize


def schedule(bm: int, bn: int, stages: int, producer: int, split_k: int = 1, why: str = "", bk: int = 64,
             persistent: bool = False, b_nchw: bool = False, tma: int = 0, regs: int = 0,
             pingpong: bool = False, rows: bool = False, a_rows: bool = False) -> Schedule:
    extra = {"persistent": 1} if persistent else {}
    if rows:
        extra["window_rows"] = 1
    if b_nchw:
        extra["b_nchw"] = 1
    if tma:
        extra["tma"] = tma
        if regs:
            extra["regs"] = regs
        if pingpong:
            extra["pingpong"] = 1
        if a_rows:
            extra["a_rows"] = 1
    return Schedule.make(ALGORITHM, why=why, bm=bm, bn=bn, bk=bk, stages=stages, producer=producer,
                         split_k=split_k, math="wgmma", **extra)


def is_persistent(s: Schedule) -> bool:
    """Whether the schedule runs a persistent grid (each block loops over tiles)."""
    return bool(int(s.get("persistent", 0)))


def is_tma(s: Schedule) -> bool:
    """Whether the schedule is the warp-specialized TMA kernel (templates/conv2d/wgmma_tma.hip.j2)."""
    return bool(int(s.get("tma", 0)))


def is_nchw_1x1(s: Schedule) -> bool:
    """Whether the schedule is the NCHW 1x1 kernel (weights as A, the image read in place as B)."""
    return bool(int(s.get("b_nchw", 0)))


def nchw_1x1_why_not(p: Conv2dProblem) -> str | None:
    """Why the NCHW 1x1 kernel cannot run this problem (the device aside), or None."""
    if p.layout == "nhwc" or not p.is_pointwise or p.groups != 1 or p.dtype not in ("float16", "bfloat16"):
        return "the NCHW 1x1 wgmma kernel takes NCHW fp16 / bf16 1x1 convolutions (stride 1, no padding, one group)"
    if (p.h * p.w) % 4:
        return f"the NCHW 1x1 wgmma kernel needs H * W a multiple of 4 (got {p.h * p.w})"
    return None


def tile_of(s: Schedule) -> tuple[int, int, int, int]:
    return int(s["bm"]), int(s["bn"]), int(s["stages"]), int(s.get("producer", 0))


def shared_bytes(bm: int, bn: int, stages: int, persistent: bool = False) -> int:
    """The pipeline stages or the fp32 epilogue tile, whichever is larger (they share memory;
    a persistent block stores from registers and has no such tile), plus 1024 bytes to align the
    swizzled stages."""
    stage_bytes = stages * (bm + bn) * 128
    return (stage_bytes if persistent else max(stage_bytes, epilogue_bytes(bm, bn))) + 1024


def persistent_blocks(bm: int, bn: int, stages: int, device: DeviceInfo) -> int:
    """Blocks of a persistent tile that one multiprocessor holds (by shared memory and threads;
    the kernel's launch bounds ask ptxas for registers to match)."""
    return device.resident_blocks(threads_of(bm, 0), shared_bytes(bm, bn, stages, True))


def threads_of(bm: int, producer: int) -> int:
    return 128 * (bm // 64 + producer)


def _check(p: Conv2dProblem, tile: tuple[int, int, int, int], device: DeviceInfo, persistent: bool = False,
           splits: int = 1) -> int:
    reason = why_not(p, device)
    if reason:
        raise ScheduleError(reason)
    if persistent and (tile[3] or splits > 1 or p.layout != "nhwc"):
        raise ScheduleError("a persistent wgmma grid needs NHWC output, no producer warpgroup and no split-K "
                            f"(got layout {p.layout or 'nchw'}, producer {tile[3]}, {splits} splits)")
    bm, bn, stages, producer = tile
    if bm % 64 or bn % 64 or bn > 256 or stages < (2 if producer else 3):
        raise ScheduleError(f"wgmma tile {bm}x{bn} with {stages} stages is not supported")
    threads = threads_of(bm, producer)
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"wgmma tile {bm}x{bn}: {threads} threads exceed {device.max_threads_per_block}")
    smem = shared_bytes(bm, bn, stages, persistent)
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"wgmma tile {bm}x{bn}, {stages} stages: {smem} bytes of shared memory exceed "
                            f"{device.shared_per_block_optin} on {device.name}")
    return threads


def plan_nchw_1x1(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    bm, bn, stages, producer = tile_of(s)
    reason = why_not(p, device) or nchw_1x1_why_not(p)
    if reason:
        raise ScheduleError(reason)
    if (bm, bn, stages, producer) not in NCHW_TILES or splits_of(p, s)[0] > 1 or is_persistent(s):
        raise ScheduleError(f"the NCHW 1x1 wgmma kernel has no tile {bm}x{bn} with {stages} stages, "
                            f"split-K or a persistent grid")
    threads = threads_of(bm, 0)
    params = {"BM": bm, "BN": bn, "STAGES": stages, "threads": threads,
              "CHUNK": 8 if (p.h * p.w) % 8 == 0 else 4}        # pixels per copy: 16 or 8 bytes
    grid = (ceil_div(p.h * p.w, bn), ceil_div(p.cout, bm), p.n)
    return plan_around(p, s, "conv2d/wgmma_nchw.hip.j2", "conv2d_wgmma_nchw_1x1", params, grid, threads,
                       stages * (bm + bn) * 128 + 1024)


def plan_wgmma(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if is_nchw_1x1(s):
        return plan_nchw_1x1(p, s, device)
    if is_tma(s):
        return plan_tma(p, s, device)
    tile = tile_of(s)
    bm, bn, stages, producer = tile
    persistent = is_persistent(s)
    splits, _ = splits_of(p, s)
    threads = _check(p, tile, device, persistent, splits)
    rows = 0
    if is_window_rows(s):
        reason = window_rows_why_not(p)
        if reason:
            raise ScheduleError(reason)
        rows = window_rows(p, bk_of(p)).rk
    params = {"BM": bm, "BN": bn, "BK": bk_of(p), "STAGES": stages, "WG": bm // 64, "producer": producer,
              "threads": threads, "persistent": persistent, "min_blocks": 1, "window_rows": rows, "programmatic": 1}
    grid = (ceil_div(p.pixels, bm), ceil_div(p.cout_g, bn), p.groups * splits)
    if persistent:
        resident = persistent_blocks(bm, bn, stages, device)
        params["min_blocks"] = resident
        grid = (min(grid[0] * grid[1] * grid[2], device.multiprocessors * resident), 1, 1)
    return plan_around(p, s, "conv2d/wgmma.hip.j2", "conv2d_implicit_gemm_wgmma", params, grid, threads,
                       shared_bytes(bm, bn, stages, persistent))


def _split_options(p: Conv2dProblem, bm: int, bn: int, device: DeviceInfo) -> list[int]:
    blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout_g, bn) * p.groups
    bk = bk_of(p)
    kt = k_padded(p, bk) // bk
    if blocks >= device.multiprocessors:
        return [1]
    return [1] + [s for s in (2, 3, 4, 6, 8) if kt // s >= 4 and blocks * s <= 2 * device.multiprocessors]


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    out = []
    for tile in TILES:
        if tile[0] > max(64, ceil_div(p.pixels, 64) * 64) or tile[1] > max(64, ceil_div(p.cout_g, 64) * 64):
            continue    # a tile wider than the problem only multiplies zeros (never the fastest in run 10)
        try:
            _check(p, tile, device)
        except ScheduleError:
            continue
        out += [schedule(*tile, split_k=k, bk=bk_of(p)) for k in _split_options(p, tile[0], tile[1], device)]
    if nchw_1x1_why_not(p) is None and why_not(p, device) is None:
        # 4-pixel copies (H * W % 8 == 4) double the B copies per thread: 256 pixels spill (ptxas)
        widest = 256 if (p.h * p.w) % 8 == 0 else 128
        out += [schedule(*tile, bk=64, b_nchw=True) for tile in NCHW_TILES
                if tile[0] <= max(64, ceil_div(p.cout, 64) * 64) and tile[1] <= min(widest, max(64, ceil_div(p.h * p.w, 64) * 64))]
    out += [schedule(*tile, bk=bk_of(p), persistent=True) for tile in PERSISTENT_TILES
            if persistent_offered(p, tile, device)]
    if why_not(p, device) is None:
        out += [twin for c in out if splits_of(p, c)[0] == 1 and (twin := window_rows_twin(p, c)) is not None]
    return out + tma_candidates(p, device)


def persistent_offered(p: Conv2dProblem, tile: tuple[int, int, int, int], device: DeviceInfo) -> bool:
    """Whether `candidates` offers `tile` on a persistent grid: it plans (NHWC output, fits) and
    there are more tiles than resident blocks, so blocks loop."""
    if p.layout != "nhwc":
        return False
    try:
        _check(p, tile, device, persistent=True)
    except ScheduleError:
        return False
    return ceil_div(p.pixels, tile[0]) * ceil_div(p.cout_g, tile[1]) * p.groups > \
        device.multiprocessors * persistent_blocks(*tile[:3], device)


def window_rows_twin(p: Conv2dProblem, s: Schedule) -> Schedule | None:
    """The window-rows form of a picked wgmma schedule (same tile), wherever it applies: it runs fewer
    K tiles (7x7 stem: 4 instead of 7) on a smaller input copy, and it was faster or even in every
    case timed (H100, 2026-11-27 04:29, docs/data/conv2d_window_rows_h100_2026-11-27/, fp16 / bf16:
    ResNet-50's stem b1 / b8 / b32 1.3-1.8x, ViT-B/16's patches 2.0x, ConvNeXt's 4x4 1.2x, a 3x3
    stride-2 stem 1.4x). The cost model reads both as bound by the same output bytes and would
    keep the first; the rule does not need it to tell them apart."""
    if s.algorithm != ALGORITHM or is_window_rows(s) or is_tma(s) or is_nchw_1x1(s) or window_rows_why_not(p):
        return None
    return Schedule.make(ALGORITHM, **{**s.as_dict()["params"], "window_rows": 1})


# Smallest TF32 stem (flops) the heuristic moves from direct_stem to window rows.
TF32_ROWS_MIN_FLOPS = 1e8


def tf32_stem_on_rows(p: Conv2dProblem, device: DeviceInfo) -> bool:
    """Whether an fp32 stem with precision "tf32" runs as window rows on wgmma rather than direct_stem
    (exact fp32 FMAs), whatever the estimates say: the stem cost model rates direct_stem's fp32 path
    well below what it runs. H100, 2026-11-27 05:06 (scripts/device_conv2d_window_rows.py --dtypes
    float32, docs/data/conv2d_window_rows_h100_2026-11-27/tf32_05-06.json.gz), window rows against the
    direct_stem pick at batch 32: 3x3 stride 2 3 -> 64 2.7x (74.4 against 198.3 us), 3 -> 32 1.45x,
    ConvNeXt's 4x4 1.42x; a 32-MFLOP 7x7 1.25x; an 11-MFLOP 5x5 NCHW 0.70x, so from 100 MFLOP only."""
    return (device.hopper and p.dtype == "float32" and p.precision == "tf32" and window_rows_why_not(p) is None
            and why_not(p, device) is None and p.flops >= TF32_ROWS_MIN_FLOPS)


# Longest K (elements, padded) for which the heuristic swaps a pick for its persistent twin.
PERSISTENT_MAX_K = 576


def persistent_twin(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Schedule | None:
    """The persistent variant of a picked wgmma schedule, where it is measured to win: the same
    tile, offered (more tiles than resident blocks), K at most 576 (a 3x3 over 64 channels, 1x1
    over 256 or fewer) and 8k output channels per group (16-byte stores). On the H100 sweep of
    2026-11-25 (docs/data/conv2d_persistent_h100_2026-11-25/run2_persist.json) every such case
    ran faster than its non-persistent twin (11 of 11, fp16 and TF32: 1.01-1.12x); with a longer K
    or the scalar stores of 27 channels it ran up to 9% slower, so those keep the pick. The fp16 /
    bf16 model does not rate persistent tiles (persistent_rate is empty): the tuner times them.
    TF32 rates them (tf32_persistent_rate) and its picks may be persistent at any K; where its
    pick is not, the same rule applies (its constants were chosen with the rule in place)."""
    if s.algorithm != ALGORITHM or is_persistent(s) or is_tma(s) or splits_of(p, s)[0] > 1:
        return None
    tile = tile_of(s)
    if tile not in TWIN_TILES or p.cout_g % 8 or k_padded(p, bk_of(p)) > PERSISTENT_MAX_K \
            or not persistent_offered(p, tile, device):
        return None
    return schedule(*tile, bk=int(s["bk"]), persistent=True, why=s.why, rows=is_window_rows(s))


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float,
             prm: WgmmaCost | None = None) -> float:
    """Seconds for one call: one block per multiprocessor at a time (the tiles fill its shared
    memory), each at the tile's share of the dense fp16 rate (TF32: of the dense TF32 rate, with
    its own constants); or the operands' L2 traffic or the DRAM bytes, whichever is larger; plus
    the NHWC copy and the split-K reduction."""
    prm = prm or COST
    if is_tma(s):
        return tma_estimate(p, s, device, bandwidth, launch_s)
    bm, bn, stages, producer = tile_of(s)
    peak_sm = 4096 * 1.83e9
    tile = (bm, bn, stages, producer)
    tf32_own = p.dtype == "float32" and p.layout == "nhwc"
    if tf32_own:                      # TF32 on NHWC: its own rates (of the dense TF32 rate), overheads, L2
        rates = prm.tf32_persistent_rate if is_persistent(s) else prm.tf32_rate
        rate = peak_sm / 2 * min(1.0, rates.get(tile, UNRATED_TF32))
        overhead = prm.tf32_persistent_overhead_k if is_persistent(s) else prm.tf32_overhead_k
        l2 = prm.tf32_l2_bytes_per_s
    else:
        share = prm.persistent_rate.get(tile, 0.3) if is_persistent(s) else prm.tile_rate.get(tile, 0.4)
        rate = peak_sm * share / (prm.tf32_math if p.dtype == "float32" else 1)
        overhead = prm.overhead_k * 2 / p.itemsize    # overhead_k is in 16-bit K elements (bytes per row)
        l2 = prm.l2_bytes_per_s
    bk = bk_of(p)
    splits, per = splits_of(p, s)
    if is_nchw_1x1(s):        # tiles of output channels x pixels of one image
        blocks = ceil_div(p.h * p.w, bn) * ceil_div(p.cout, bm) * p.n
    else:
        blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout_g, bn) * p.groups * splits
    threads = threads_of(bm, producer)
    regs = bn // 2 + 70                           # accumulators + addressing (ptxas: 115-206)
    if is_persistent(s):                          # tiles in turn on resident blocks: the same waves
        resident = persistent_blocks(bm, bn, stages, device)
    else:
        resident = max(1, min(device.shared_per_multiprocessor // shared_bytes(bm, bn, stages),
                              device.registers_per_multiprocessor // (threads * regs)))
    waves = ceil_div(blocks, device.multiprocessors * resident) * resident
    compute = waves * 2.0 * bm * bn * (per * bk + overhead) / rate
    if tf32_own:               # rows past the problem's pixels or channels are zero-filled, not read
        rows = (p.pixels * ceil_div(p.cout_g, bn) + p.cout_g * ceil_div(p.pixels, bm)) * p.groups * splits
    else:
        rows = blocks * (bm + bn)
    operands = rows * per * bk * p.itemsize / l2
    compute = max(compute, operands)
    return call_seconds(p, s, compute, p.cout * k_padded(p, bk) * p.itemsize, splits, prm.split_s, bandwidth, launch_s)


# A strided 1x1 filter reads only the input pixels it lands on where each pixel's channels fill whole 128-byte
# lines (NHWC), a quarter of the input at stride 2: charged the whole input, ResNet-50 b32's 256 -> 512 1x1
# stride-2 layer at 56 x 56 looked memory-bound on every tile (20.4 us estimated alike) and took the cp.async
# kernel's 18.8 us over the TMA tiles' 15.9-16.2 (H200, 2026-11-29, scripts/device_conv2d_deep_ring.py). With
# the rule it takes a TMA tile: 19.0 -> 17.3 us (b16 10.0 -> 9.6; scripts/device_conv2d_rules_ab.py --rules
# strided_1x1 over nine network / batch pairs). Pixels of 64 bytes (RegNetY-1.6GF's 32 -> 48 at 112 x 112)
# share their lines with the skipped ones: that layer ran 0.83x at b32 (1.15x at b8), so they keep the charge.
STRIDED_1X1_MIN_PIXEL_BYTES = 128


def io_bytes(p: Conv2dProblem) -> tuple[float, float]:
    """(input bytes, output + residual bytes) of one call (the packed weights come apart)."""
    isz = p.itemsize
    cs, _ = channels(p)
    pixels = p.n * p.h * p.w
    if p.kh * p.kw == 1 and cs * isz >= STRIDED_1X1_MIN_PIXEL_BYTES:
        pixels = min(pixels, p.n * p.oh * p.ow)
    return pixels * cs * isz, p.n * p.cout * p.oh * p.ow * isz * (2 if p.has_residual else 1)


def call_seconds(p: Conv2dProblem, s: Schedule, compute: float, w_bytes: float, splits: int, split_s: float,
                 bandwidth: float, launch_s: float, io_bandwidth: float | None = None) -> float:
    """One call of a wgmma kernel (either loop) from its main loop's seconds: the launch, the larger of
    that and the DRAM bytes (input, output, residual, the packed weights' w_bytes; at io_bandwidth if
    given), the NHWC copy of an NCHW input and split-K's reduction (split_s fixed, its fp32 partials at
    the copy rate)."""
    isz = p.itemsize
    x_bytes, y_bytes = io_bytes(p)
    t = launch_s + max(compute, (x_bytes + y_bytes + w_bytes) / (io_bandwidth or bandwidth))
    if needs_nhwc_copy(p, s):
        t += launch_s + (p.n * p.cin * p.h * p.w * isz + x_bytes) / (0.8 * bandwidth)
    if splits > 1:
        t += split_s + (splits * p.cout * p.pixels * 4 + y_bytes) / (0.688 * bandwidth)
    return t


# ---------------------------------------------------------------- the warp-specialized TMA kernel
# (templates/conv2d/wgmma_tma.hip.j2): A by TMA in im2col mode, B by TMA, a producer warpgroup and
# `tma` consumer warpgroups (bm / 64 / tma m64 blocks each). Tiles (bm, bn, stages, consumer
# warpgroups, setmaxnreg count for the consumers or 0).
TMA_TILES = ((128, 128, 4, 2, 0), (128, 128, 6, 2, 0), (128, 256, 4, 2, 232), (256, 128, 4, 2, 232),
             (192, 128, 5, 3, 0), (128, 64, 6, 2, 0), (64, 128, 6, 1, 0), (64, 256, 4, 1, 0),
             # two blocks per multiprocessor (one's epilogue beside the other's products; 128 x 128 with 3 stages
             # does not compile at the 80 registers that leaves, setmaxnreg or not: ptxas C7602)
             (64, 128, 4, 1, 0), (128, 64, 3, 2, 0), (64, 64, 4, 1, 0),
             # ping-pong: the two consumer warpgroups take alternate tiles whole (offered on persistent grids
             # only: where blocks get few tiles, one warpgroup idles). Of five timed (H100 2026-11-26, run 5)
             # these two were fastest anywhere: TF32 C = 64 3x3 layers, 1.03-1.05x the best other tile.
             (128, 128, 6, 2, 232, 1), (128, 64, 6, 2, 0, 1),
             # 160 channels wide (NARROW_TILES), offered where they divide the output channels (Stable Diffusion's
             # 320 / 640 / 1280: 2 / 4 / 8 tiles instead of 3 / 5 / 10 of 128) or pad them less than 128 / 256 do
             (128, 160, 6, 2, 0), (64, 160, 4, 1, 0))
# Tiles whose width is not a multiple of 64: offered only where they divide Cout or pad it less.
NARROW_TILES = frozenset(t for t in TMA_TILES if t[1] % 64)
# Grids of one wave (no more blocks than multiprocessors: every block alone on its multiprocessor, so a tile
# sized for two per multiprocessor leaves half its shared memory idle) run these tiles with the deepest ring
# shared memory holds, which hides more of each K tile's load. Measured against the same grid's shallow tile
# (H200, 2026-11-29, scripts/device_conv2d_deep_ring.py, 37 layers: ResNet-50 b32 / b16 / b8, issue 16's large
# 3x3): 64 x 64 1.042x (7 pairs, worst 1.010), 64 x 128 from 4 stages 1.059x (21, worst 0.992), from 6
# 1.081x (21, worst 1.000), 128 x 64 from 3 stages 1.232x (21, worst 1.058). Not taken: 128 x 64 from 6 stages
# (1.028x, worst 0.898), 64 x 160 (worst 0.910), 128 x 128 with 7 stages (0.977x / 0.993x), nor grids of more
# than one wave (0.957x over 308 pairs). The estimate rates each deep tile as its first shallow source. The 83
# real-network layers whose pick this changes (ResNet-50 b8-b32, ResNet-101, DenseNet-121, EfficientNet-B0,
# Inception-v3, Wide-ResNet-50-2, VGG-16, MobileNet-v3-L; scripts/device_conv2d_rules_ab.py --rules deep_ring)
# ran 1.031x faster on geometric mean (0.935-1.091x), whole ResNet-50 b32 1.011x.
TMA_ONE_WAVE_DEEPER = {(64, 64, 4, 1, 0): (64, 64, 8, 1, 0), (64, 128, 4, 1, 0): (64, 128, 8, 1, 0),
                       (64, 128, 6, 1, 0): (64, 128, 8, 1, 0), (128, 64, 3, 2, 0): (128, 64, 8, 2, 0)}


def tma_why_not(p: Conv2dProblem, device: DeviceInfo) -> str | None:
    """Why the TMA kernel cannot run this problem, or None: NHWC in and out, one group, the im2col
    map's limits (rank 4: box corners within [-128, 127], tap offsets within 16 bits)."""
    reason = why_not(p, device)
    if reason:
        return reason
    if p.layout != "nhwc" or p.groups != 1:
        return "the TMA wgmma kernel takes channels_last input and output and one group"
    lower = (-p.pad[1], -p.pad[0])
    upper = (p.pad[3] - (p.kw - 1) * p.dilation[1], p.pad[2] - (p.kh - 1) * p.dilation[0])
    if not all(-128 <= v <= 127 for v in (*lower, *upper)) or max(p.stride) > 8:
        return "the TMA im2col map: padding, filter extent or stride outside its limits"
    if p.pixels > INT32_MAX - 256:
        return "the TMA wgmma kernel indexes pixels with 32 bits"
    return None


def tma_tile_of(s: Schedule) -> tuple[int, ...]:
    """(bm, bn, stages, consumer warpgroups, setmaxnreg count), and a sixth 1 for ping-pong."""
    tile = (int(s["bm"]), int(s["bn"]), int(s["stages"]), int(s["tma"]), int(s.get("regs", 0)))
    return tile + (1,) if int(s.get("pingpong", 0)) else tile


def tma_shared_bytes(bm: int, bn: int, stages: int) -> int:
    """The ring, its 2 x stages mbarriers, and 1024 bytes to align the swizzled stages."""
    return stages * (bm + bn) * 128 + 16 * stages + 1024


def tma_resident(tile: tuple[int, int, int, int, int], device: DeviceInfo) -> int:
    """Blocks of a TMA tile one multiprocessor holds (1 or 2): by shared memory and threads; the
    launch bounds then ask ptxas for registers to match. Two blocks overlap one's epilogue (stores
    from the accumulators) and start with the other's products."""
    bm, bn, stages, wgs, regs = tile[:5]
    return 1 if regs > 128 else min(2, device.resident_blocks(128 * (wgs + 1), tma_shared_bytes(bm, bn, stages)))


def tma_schedule(tile: tuple[int, ...], bk: int, persistent: bool = True, why: str = "",
                 split_k: int = 1, a_rows: bool = False) -> Schedule:
    bm, bn, stages, wgs, regs = tile[:5]
    return schedule(bm, bn, stages, 0, bk=bk, persistent=persistent, tma=wgs, regs=regs, why=why, split_k=split_k,
                    pingpong=len(tile) > 5 and bool(tile[5]), a_rows=a_rows)


def tma_k_tiles(p: Conv2dProblem) -> int:
    """K tiles of the TMA kernel: taps x 128-byte channel chunks."""
    return p.kh * p.kw * ceil_div(channels(p)[0], bk_of(p))


def tma_splits(p: Conv2dProblem, s: Schedule) -> tuple[int, int]:
    """(splits, K tiles per split) of a TMA schedule: no split is left empty."""
    kt = tma_k_tiles(p)
    per = ceil_div(kt, max(1, int(s.get("split_k", 1))))
    return ceil_div(kt, per), per


def plan_tma(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    reason = tma_why_not(p, device)
    if reason:
        raise ScheduleError(reason)
    tile = tma_tile_of(s)
    bm, bn, stages, wgs, regs = tile[:5]
    pingpong = len(tile) > 5
    bk = bk_of(p)
    if (bm % (64 * wgs) and not pingpong) or bm > 256 or bn % 32 or bn > 256 or stages < 2 or \
            (pingpong and (wgs != 2 or bm * bn // 128 > 128 and not regs)):
        raise ScheduleError(f"TMA wgmma tile {bm}x{bn} over {wgs} warpgroups, {stages} stages: not supported")
    splits, kt_per = tma_splits(p, s)
    a_rows = bool(int(s.get("a_rows", 0)))
    if a_rows and not p.is_pointwise:      # 1x1, stride 1, no padding: the NHWC input is A, [pixels][channels]
        raise ScheduleError("a_rows (A read as a [pixels][channels] matrix) needs a 1x1 filter, stride 1 and no padding")
    if pingpong and splits > 1:
        raise ScheduleError("the ping-pong TMA kernel takes no split-K")
    threads = 128 * (wgs + 1)
    smem = tma_shared_bytes(bm, bn, stages)
    if smem > device.shared_per_block_optin or threads > device.max_threads_per_block:
        raise ScheduleError(f"TMA wgmma tile {bm}x{bn}, {stages} stages: {smem} bytes of shared memory")
    cs = channels(p)[0]
    chunks = ceil_div(cs, bk)
    taps = p.kh * p.kw
    kp = taps * chunks * bk                     # each tap's channels padded to whole chunks
    copy = needs_nhwc_copy(p, s)
    x_name = "x_nhwc" if copy else "x"
    idx = index_type(p.n * p.h * p.w * cs + 64, p.n * p.cout * p.oh * p.ow + 64, p.cout * kp + 64)
    tiles_m = ceil_div(p.pixels, bm)
    tiles = tiles_m * ceil_div(p.cout, bn)
    resident = tma_resident(tile, device)
    blocks = ceil_div(tiles, 2) if pingpong else tiles * splits        # ping-pong: two tiles per block at least
    grid = min(blocks, device.multiprocessors * resident) if is_persistent(s) else blocks
    vec_out = p.cout % 8 == 0
    fused = splits == 1
    params = {"BM": bm, "BN": bn, "BK": bk, "STAGES": stages, "WG": wgs, "regs": regs, "threads": threads,
              "min_blocks": resident, "pingpong": int(pingpong), "a_rows": int(a_rows),
              "ctype": C_TYPE[p.dtype], "index_type": idx, "has_bias": p.has_bias and fused,
              "has_residual": p.has_residual and fused, "activation": p.activation if fused else "none",
              "vec_out": vec_out, "split_k": not fused, "programmatic": 1}
    out_align = 16 if vec_out else 0
    if a_rows:
        amap = TensorMap(x_name, p.dtype, (cs, p.pixels), (bk, bm), 128)
    else:
        amap = TensorMap(x_name, p.dtype, (cs, p.w, p.h, p.n), (), 128,
                         im2col=(-p.pad[1], -p.pad[0], p.pad[3] - (p.kw - 1) * p.dilation[1],
                                 p.pad[2] - (p.kh - 1) * p.dilation[0], bk, bm, p.stride[1], p.stride[0]))
    bmap = TensorMap("packed_w", p.dtype, (kp, p.cout), (bk, bn), 128)
    np_ = ceil_div(p.pixels, 8) * 8
    outs = ((*((Buf("bias", align=out_align),) if p.has_bias else ()),
             *((Buf("residual", align=out_align),) if p.has_residual else ()), Buf("y", align=out_align))
            if fused else (Buf("partial"), Scalar("i32", np_)))
    args = (Buf(x_name, align=16), *outs,
            *(Scalar("i32", v) for v in (p.pixels, p.cout, p.oh * p.ow, p.ow, p.stride[0], p.stride[1], p.pad[0],
                                         p.pad[1], p.dilation[0], p.dilation[1], p.kw, taps * chunks, kt_per, splits,
                                         chunks, tiles_m, tiles)),
            Scalar("f32", p.alpha), amap, bmap)
    gemm = Launch.make("conv2d/wgmma_tma.hip.j2", "conv2d_wgmma_tma", params, (grid,), (threads,), args, smem,
                       programmatic=True)
    launches = [gemm]
    workspaces = [Workspace("packed_w", p.cout * kp * p.itemsize, persistent=True, derived_from=("w",))]
    if copy:
        launches.insert(0, nhwc_copy_launch(p, idx, cs))
        workspaces.append(Workspace("x_nhwc", p.n * p.h * p.w * cs * p.itemsize))
    if not fused:
        from .conv2d_plans import _splitk_launch
        workspaces.append(Workspace("partial", splits * p.cout * np_ * 4))
        launches.append(_splitk_launch(p, splits, np_, idx, residual=p.has_residual, out_nhwc=True))
    return Plan(launches=tuple(launches), workspaces=tuple(workspaces), prepare=(pack_launch(p, idx, kp, chunks * bk),))


# Problems below this many flops keep the other kernels (a coarse measured rule). On the benchmark's
# six shapes under 1 GFLOP (0.05-0.7 GFLOP, 2.6-12 us; H100, 2026-11-26) the TMA kernel's fastest tile
# ranged from 1.6x slower (5x5_kernel fp16) to 1.24x faster (very_wide_pointwise) than the cp.async
# kernel's pick, and the model's choice among them did no better than this rule (thresholds 0.1-1
# GFLOP scored within 1% of each other on run 5's sweep).
TMA_MIN_FLOPS = 1e9
# On fast-memory devices (fast_memory: the H200) from this many: over the 130 sub-GFLOP layers of seven
# networks (docs/data/conv2d_h200_sweep_2026-11-29/pool_sweep3.json.gz, every TMA tile offered and timed)
# the picks' weighted time against the fastest schedule went from 1.114x at 1e9 to 1.076x at 2e8 (1.077-1.078x
# at 0-3e8); six of the seven networks gained (ResNet-50 b32 1.19x -> 1.00x), Inception-v3 lost 0.3%.
TMA_MIN_FLOPS_FAST_MEMORY = 2e8
# 1x1 stride-1 unpadded layers read A by a tiled map over the input as a [pixels][channels] matrix (`a_rows`)
# instead of the im2col map: the same tile ran 1.018x faster on geometric mean over 80 (tile, layer) pairs of
# ResNet-50's b32 / b8 1x1 layers (0.97-1.11x; H200, 2026-11-29, scripts/device_conv2d_a_rows.py).
TMA_A_ROWS = True
# Fewest output channels the TMA kernel takes for filters wider than 1x1 (tma_candidates).
TMA_WIDE_FILTER_MIN_COUT = 33


def tma_ring(tile: tuple[int, ...], blocks: int, device: DeviceInfo) -> tuple[int, ...]:
    """The tile a grid of `blocks` runs: its deep-ring twin where the grid is one wave (TMA_ONE_WAVE_DEEPER)."""
    return TMA_ONE_WAVE_DEEPER.get(tile, tile) if blocks <= device.multiprocessors else tile


def tma_rated_as(tile: tuple[int, ...]) -> tuple[int, ...]:
    """The tile whose rates a tile takes: a deep-ring twin its first shallow source's, any other its own."""
    return next((shallow for shallow, deep in TMA_ONE_WAVE_DEEPER.items() if deep == tile), tile)


def tma_candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    """The TMA kernel's tiles for the tuner and the heuristic: output channels a multiple of 8 (16-byte
    stores; with 27 channels the scalar stores ran 1.5x slower than the cp.async kernel, H100
    2026-11-26), at least TMA_MIN_FLOPS (TMA_MIN_FLOPS_FAST_MEMORY on the H200), a tile no wider than the
    problem, plain or persistent grids, split-K where the tiles leave multiprocessors idle. Not for filters
    wider than 1x1 into 32 or fewer channels: DenseNet-121's 128 -> 32 3x3 (b32, 56 x 56 / 28 x 28) ran
    1.28x / 1.36x and Inception-v3's 32 -> 32 3x3 1.87x the cp.async kernel's fastest tile (H200,
    2026-11-29 pool sweeps). One-wave grids get the deep-ring twins of their tiles (tma_ring)."""
    min_flops = TMA_MIN_FLOPS_FAST_MEMORY if fast_memory(device) else TMA_MIN_FLOPS
    if tma_why_not(p, device) or p.cout % 8 or p.flops < min_flops or \
            (p.kh * p.kw > 1 and p.cout < TMA_WIDE_FILTER_MIN_COUT):
        return []
    out = []
    rows = TMA_A_ROWS and p.is_pointwise
    for tile in TMA_TILES:
        bm, bn, stages = tile[:3]
        if bm > max(64, ceil_div(p.pixels, 64) * 64) or bn > max(64, ceil_div(p.cout, 64) * 64):
            continue
        if tma_shared_bytes(bm, bn, stages) > device.shared_per_block_optin:
            continue
        if tile in NARROW_TILES and p.cout % bn and round_up(p.cout, bn) >= round_up(p.cout, 128):
            continue
        # a persistent grid where blocks loop (one block per multiprocessor either way); split-K where
        # the tiles leave most multiprocessors idle and each split keeps 4 K tiles
        tiles = ceil_div(p.pixels, bm) * ceil_div(p.cout, bn)
        if len(tile) > 5 and tiles < 4 * device.multiprocessors:
            continue
        out.append(tma_schedule(tma_ring(tile, tiles, device), bk_of(p),
                                persistent=tiles > device.multiprocessors * tma_resident(tile, device), a_rows=rows))
        if tiles < device.multiprocessors and len(tile) == 5:
            kt = tma_k_tiles(p)
            out += [tma_schedule(tma_ring(tile, tiles * k, device), bk_of(p), persistent=False, split_k=k, a_rows=rows)
                    for k in (2, 3, 4, 6, 8) if kt // k >= 4 and tiles * k <= 2 * device.multiprocessors]
    return list(dict.fromkeys(out))            # 64 x 128 from 4 and from 6 stages: one deep tile


# Constants of tma_estimate, per precision class ("16": fp16 / bf16, "tf32"): per tile, the share of
# the dense rate (TF32: half the fp16 one) a block sustains in its main loop; per-block overheads in
# K tiles (one 128-byte chunk of channels of one tap), plain and persistent grids. Chosen by
# `python3 scripts/conv2d_tma_fit.py docs/data/conv2d_tma_h100_2026-11-26/run{2,3,5}_sweep.json.gz` (H100
# sweeps of 2026-11-26: every TMA candidate of the 15 benchmark and 14 large problems, checked against
# float64 first): rms error 0.155 (fp16 / bf16) and 0.17 (TF32) in log time.
TMA_RATE = {
    ('16', (64, 64, 4, 1, 0)): 0.674, ('16', (64, 128, 4, 1, 0)): 0.895, ('16', (64, 128, 6, 1, 0)): 0.699,
    ('16', (64, 256, 4, 1, 0)): 0.786, ('16', (128, 64, 3, 2, 0)): 0.732, ('16', (128, 64, 6, 2, 0)): 0.675,
    ('16', (128, 64, 6, 2, 0, 1)): 0.511, ('16', (128, 128, 4, 2, 0)): 0.85, ('16', (128, 128, 6, 2, 0)): 0.855,
    ('16', (128, 128, 6, 2, 232, 1)): 0.638, ('16', (128, 256, 4, 2, 232)): 0.921, ('16', (192, 128, 5, 3, 0)): 0.866,
    ('16', (256, 128, 4, 2, 232)): 0.92, ('tf32', (64, 64, 4, 1, 0)): 0.66, ('tf32', (64, 128, 4, 1, 0)): 0.851,
    ('tf32', (64, 128, 6, 1, 0)): 0.674, ('tf32', (64, 256, 4, 1, 0)): 0.774, ('tf32', (128, 64, 3, 2, 0)): 0.706,
    ('tf32', (128, 64, 6, 2, 0)): 0.659, ('tf32', (128, 64, 6, 2, 0, 1)): 0.474, ('tf32', (128, 128, 4, 2, 0)): 0.808,
    ('tf32', (128, 128, 6, 2, 0)): 0.839, ('tf32', (128, 128, 6, 2, 232, 1)): 0.592, ('tf32', (128, 256, 4, 2, 232)): 0.928,
    ('tf32', (192, 128, 5, 3, 0)): 0.858, ('tf32', (256, 128, 4, 2, 232)): 0.904,
}
# The 160-wide tiles (2026-11-29) were not in those sweeps. 64 x 160: the 64 x 128 tile's rates. 128 x 160: the
# 128 x 128 six-stage tile's rates (0.855 / 0.839) ran 0.91-0.97x their estimates on the Stable Diffusion layers
# they were picked for (H200, `scripts/device_conv2d_narrow.py`, docs/data/conv2d_narrow_tiles_h200_2026-11-29/),
# so they are raised by the geometric mean of that ratio (fp16 / bf16 0.94, TF32 0.95).
TMA_RATE.update({('16', (128, 160, 6, 2, 0)): 0.91, ('16', (64, 160, 4, 1, 0)): 0.895,
                 ('tf32', (128, 160, 6, 2, 0)): 0.88, ('tf32', (64, 160, 4, 1, 0)): 0.851})
# On fast-memory devices (fast_memory: the H200) the fp16 / bf16 rates of these tiles are scaled, except for
# lone blocks (TMA_LONE_SHARE rates those): chosen by `scripts/conv2d_tma_rank_fit.py` (coordinate descent on
# the measured time of the heuristic's picks, not on the fit of the times, over the H200 pool sweeps of
# 2026-11-29, docs/data/conv2d_h200_sweep_2026-11-29/): the picks' weighted time 6470 -> 6351 us (the fastest
# timed: 6196); fitted on half of the networks and scored on the other, both ways, 0.6% and 0.7% better. On
# the device in a separate run, the changed picks of nine networks (four not in the sweeps) and whole
# networks: docs/performance.md, "ranking-aware rates".
TMA_RATE_FAST_MEMORY_SCALE = {(64, 128, 4, 1, 0): 0.8, (64, 128, 6, 1, 0): 0.8, (128, 64, 3, 2, 0): 0.95,
                              (128, 128, 6, 2, 0): 0.8, (256, 128, 4, 2, 232): 0.95}
TMA_OVERHEAD = {'tf32': 6, '16': 4}
TMA_PERSISTENT_OVERHEAD = {'tf32': 8, '16': 4}
# Bytes per second from L2 into all multiprocessors' shared memory (0: no such term), and the factor
# the heuristic charges the TMA kernel against the other kernels' estimates (their models were fitted
# apart; chosen on the same sweeps for the fewest lost picks).
TMA_L2_BYTES_PER_S = 1.2e+13
TMA_MARGIN = 1.1
# On the H200 (4.2 TB/s copies; the H100 3.0) the TMA kernel beat the others' estimates wherever its K carries
# no more zero padding than theirs: each tap's channels whole 128-byte chunks, or a 1x1 filter (both kernels
# pad its K alike). Chosen on the first pool sweep of real-network layers (docs/data/conv2d_h200_sweep_2026-11-29/,
# scripts/conv2d_pick_regret.py), with TMA_LONE_SHARE: the picks' weighted time 1.092x -> 1.065x the fastest
# schedule timed there, 1.090x -> 1.050x on the second sweep's layers (not used to choose it); counting 1x1
# filters too gained another 0.5-1.0% on each of the three sweeps. On the H100 sweeps
# (docs/data/conv2d_tma_h100_2026-11-26/) the margin lost (chosen / best 1.029 -> 1.041), so devices below
# TMA_FAST_MEMORY_BANDWIDTH keep TMA_MARGIN.
TMA_MARGIN_WHOLE = 0.9
# Copy bandwidth (conv2d_cost.machine) from which a device takes the fast-memory constants above.
TMA_FAST_MEMORY_BANDWIDTH = 4e12
UNRATED_TMA = 0.05
# A call whose input, output and weights together fit in L2 (50 MB on the H100) and stay there between
# calls (graph replays; in a network, the layer before just wrote the input) reads them at more than
# the DRAM rate. Measured (H100, 2026-11-26, four sweeps, 17:35-19:45 UTC): the 1x1 layer 32x512x28x28
# -> 128 (32 MB) ran 8.7-8.9 us on the TMA kernel's 192 x 128 tile, 4.8 TB/s counting every byte once,
# while the cp.async kernel's pick ran 11.4-11.9 us (2.8 TB/s); charged at 3.0 TB/s both estimates
# were the DRAM term (12.7 us) and the tie went to the cp.async kernel. The 64 MB layer
# 32x256x56x56 -> 64 ran at 2.8-2.9 TB/s on both kernels. Only the TMA estimate takes this rate
# (the cp.async kernel did not reach it); split-K's partials keep the copy rate (with it, 2x640x32x32 3x3
# moved to a 3-way split measured 35.6-36.3 us against 29.6-30.2 for an unsplit 128 x 128 tile). Same-run
# A/B against the previous estimate (run 2, 19:55): the 8 changed picks ran 1.18-1.52x faster.
TMA_RESIDENT_BYTES = 40e6
TMA_RESIDENT_BYTES_PER_S = 4.8e12
# A tile rated at two blocks per multiprocessor (TMA_RATE: the pair's rate) whose grid has no more blocks
# than multiprocessors runs one block on each, alone: one wave at this share of the pair's rate (the
# estimate charged it two waves, 1.19-1.48x its measured time on four tiles; 0.8 scored best of 0.5-0.95 on
# the H200 pool sweeps and left the H100 sweeps' picks as they were, 1.029 / 1.030x the fastest).
TMA_LONE_SHARE = 0.8


def fast_memory(device: DeviceInfo) -> bool:
    """Whether the device copies at TMA_FAST_MEMORY_BANDWIDTH or more (of the sm_90 parts measured: the H200)."""
    from .conv2d_cost import machine        # conv2d_cost imports this module: imported on use
    return machine(device).bandwidth >= TMA_FAST_MEMORY_BANDWIDTH


def tma_estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float,
                 rates: dict | None = None, overhead: dict | None = None, persistent_overhead: dict | None = None,
                 l2: float | None = None, margin: float | None = None, lone: float | None = None) -> float:
    """Seconds for one call of the TMA kernel: one block per multiprocessor (the ring fills its shared
    memory), waves of blocks each at its tile's share of the dense rate over its K tiles plus a fixed
    overhead; or the DRAM bytes; plus the NHWC copy and the split-K reduction."""
    rates = TMA_RATE if rates is None else rates
    cls = "tf32" if p.dtype == "float32" else "16"
    ovh = (TMA_PERSISTENT_OVERHEAD if persistent_overhead is None else persistent_overhead) if is_persistent(s) \
        else (TMA_OVERHEAD if overhead is None else overhead)
    tile = tma_rated_as(tma_tile_of(s))
    bm, bn = tile[:2]
    bk = bk_of(p)
    splits, per = tma_splits(p, s)
    blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout, bn) * splits
    if len(tile) > 5:                                     # ping-pong: two tiles share a block, one at a time
        blocks = ceil_div(blocks, 2) * 2
    resident = tma_resident(tile, device)                 # resident blocks share the multiprocessor
    waves = ceil_div(blocks, device.multiprocessors * resident) * resident
    rate = 4096 * 1.83e9 / (2 if cls == "tf32" else 1) * rates.get((cls, tile), UNRATED_TMA)
    if resident > 1 and blocks <= device.multiprocessors:  # a block per multiprocessor: each has one alone
        waves = 1
        rate *= TMA_LONE_SHARE if lone is None else lone
    elif cls == "16" and bandwidth >= TMA_FAST_MEMORY_BANDWIDTH:
        rate *= TMA_RATE_FAST_MEMORY_SCALE.get(tile, 1.0)
    compute = waves * 2.0 * bm * bn * bk * (per + ovh[cls]) / rate
    l2 = TMA_L2_BYTES_PER_S if l2 is None else l2
    if l2:                     # every block's A and B rows of its K range, 128 bytes per row and K tile
        compute = max(compute, blocks * (bm + bn) * per * 128 / l2)
    if margin is None:
        whole = (channels(p)[0] % bk == 0 or p.kh * p.kw == 1) and bandwidth >= TMA_FAST_MEMORY_BANDWIDTH
        margin = TMA_MARGIN_WHOLE if whole else TMA_MARGIN
    compute *= margin
    w_bytes = p.cout * per * splits * bk * p.itemsize
    io_bw = max(bandwidth, TMA_RESIDENT_BYTES_PER_S) if sum(io_bytes(p)) + w_bytes <= TMA_RESIDENT_BYTES \
        else bandwidth
    return call_seconds(p, s, compute, w_bytes, splits, COST.split_s, bandwidth, launch_s, io_bandwidth=io_bw)
