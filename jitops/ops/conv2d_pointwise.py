"""conv2d for 1x1 layers with few channels: a streaming matrix-core kernel (templates/conv2d/pointwise.hip.j2).

MobileNet's and EfficientNet's 1x1 layers at high resolution (16 -> 16, 16 -> 64, 32 -> 16 channels
at 112 x 112) are plain GEMMs with M in the hundreds of thousands and K, N of 16-64: about two bytes
per multiply-add, so DRAM (or L2) bound. The tiled GEMMs ran them at 1.5-2.5x cuDNN's time on the
H200 (2026-11-29 pool sweeps: the 64-wide K step pads K = 16 four times, each block waits for its
one tile). This kernel keeps the whole weight matrix in shared memory, walks pixel tiles over a
persistent grid with several tiles' loads in flight, and stores through each warp's fp32 rows in
shared memory, 16 bytes per lane.

Scope: fp16 / bf16, 1x1 / stride 1 / no padding, one group, Cin a multiple of 8 and at most 256, Cout at
most 128; the input read in place, NHWC (every 16-byte copy one pixel's channels) or NCHW (H * W a
multiple of 8: copies of 8 pixels of one channel); bias, residual and activation fused. `estimate` rates
it by its bytes (it is a stream) and its padded products, next to the other kernels' estimates; `rated`
says where the heuristic considers it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, ceil_div, index_type, round_up
from .conv2d_problem import Conv2dProblem

ALGORITHM = "pointwise_mma"
MAX_CIN = 256
MAX_COUT = 128
WARPS = 4
MTS = (1, 2, 4)            # 16-row fragments per warp: BM = WARPS x MT x 16 pixels per tile
STAGES = (2, 3, 4)
BLOCKS_PER_SM = (1, 2, 4)  # the persistent grid: this many blocks per multiprocessor (launch bounds ask for it)


@dataclass(frozen=True)
class PointwiseCost:
    """Constants of `estimate`, fitted (least squares, relative error) to the heuristic's schedule on 48
    real-network layers (MobileNet-v3-L b32 / b8, EfficientNet-B0 / B3, ResNet-50, DenseNet-121 b32;
    H200, 2026-11-29, docs/data/conv2d_pointwise_h200_2026-11-29/): a fixed cost past the launch, input
    (and residual) bytes read at read_share and output bytes written at write_share of the copy
    bandwidth (the input mostly comes from L2, written there by the layer before), and the padded
    multiply-adds at mma_share of the dense fp16 rate. rms error 0.10 in log time.

    margin: the estimate is divided by it where the heuristic rates the kernel against the others
    (`rated`). The tiled GEMMs' estimates ran 0.53-0.92x their measured times on these layers; with
    margin 1.3 the heuristic's choice between the two lost 0.2% against the faster on the 48 layers
    (margins 1.2-1.5 all within 0.6%)."""

    fixed_s: float = 1.36e-6
    read_share: float = 2.60
    write_share: float = 0.88
    mma_share: float = 0.24
    margin: float = 1.3
    # NCHW, fitted the same way on 30 layers (13:04): 8-pixel runs of each channel read and written,
    # fragments loaded transposed. rms 0.10 in log time.
    nchw_fixed_s: float = 0.98e-6
    nchw_read_share: float = 1.64
    nchw_write_share: float = 0.64
    nchw_mma_share: float = 0.16


COST = PointwiseCost()


def why_not(p: Conv2dProblem) -> str | None:
    """Why this kernel cannot run the problem (device aside), or None."""
    if p.dtype not in ("float16", "bfloat16"):
        return f"pointwise_mma takes float16 or bfloat16 (got {p.dtype})"
    if not p.is_pointwise or p.groups != 1:
        return "pointwise_mma takes 1x1 convolutions with stride 1, no padding and one group"
    if p.cin % 8:
        return f"pointwise_mma takes a multiple of 8 input channels (got {p.cin})"
    if p.layout != "nhwc" and (p.h * p.w) % 8:
        return (f"pointwise_mma reads an NCHW input in 8-pixel runs: H * W must be a multiple of 8 "
                f"(got {p.h} x {p.w}; channels_last has no such limit)")
    if p.cin > MAX_CIN or p.cout > MAX_COUT:
        return (f"pointwise_mma is for at most {MAX_CIN} input and {MAX_COUT} output channels "
                f"(got {p.cin} -> {p.cout})")
    return None


def schedule(mt: int, stages: int, blocks_per_sm: int, why: str = "") -> Schedule:
    return Schedule.make(ALGORITHM, why=why, mt=mt, stages=stages, per_sm=blocks_per_sm)


def padded(p: Conv2dProblem) -> tuple[int, int]:
    """(KP, NP): Cin and Cout rounded up to the 16 of a fragment."""
    return round_up(p.cin, 16), round_up(p.cout, 16)


def shared_bytes(p: Conv2dProblem, mt: int, stages: int) -> int:
    """The weights and the ring of pixel tiles (rows padded by 16 bytes; NCHW: channel rows of the tile's
    pixels), and each warp's 16 fp32 epilogue rows."""
    kp, np_ = padded(p)
    bm = WARPS * mt * 16
    stage = kp * (bm + 8) if p.layout != "nhwc" else bm * (kp + 8)
    return (np_ * (kp + 8) + stages * stage) * p.itemsize + WARPS * 16 * (np_ + 8) * 4


def _threads(device: DeviceInfo) -> int:
    return WARPS * device.warp_size


def _check(p: Conv2dProblem, mt: int, stages: int, per_sm: int, device: DeviceInfo) -> None:
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    if not device.matrix_cores:
        raise ScheduleError(f"{device.name} has no matrix cores usable from jitops templates")
    if mt not in MTS or stages not in STAGES or per_sm not in BLOCKS_PER_SM:
        raise ScheduleError(f"pointwise_mma: mt={mt}, stages={stages}, per_sm={per_sm} must be in {MTS}, {STAGES} "
                            f"and {BLOCKS_PER_SM}")
    kp, np_ = padded(p)
    if mt * np_ > 256:
        raise ScheduleError(f"pointwise_mma: {mt} x 16 rows by {np_} columns per warp exceed the accumulator budget "
                            f"(mt x padded Cout <= 256)")
    smem = shared_bytes(p, mt, stages)
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"pointwise_mma: {smem} bytes of shared memory exceed {device.shared_per_block_optin} "
                            f"on {device.name}")
    if p.pixels > 2**31 - 1 - 64 * WARPS * 16:
        raise ScheduleError(f"pointwise_mma: {p.pixels} pixels exceed 32-bit row indices")


def registers(p: Conv2dProblem, mt: int) -> int:
    """Registers per thread ptxas needs, about: 40 + 1.4 per fp32 accumulator (sm_90, NVRTC 13.5, offline:
    40-220 over Cout 16-128 and mt 1-4). The launch bounds ask for per_sm blocks; below this ptxas spills."""
    return int(40 + 1.4 * mt * padded(p)[1] * 16 // 32)


def _fits_resident(p: Conv2dProblem, mt: int, stages: int, per_sm: int, device: DeviceInfo) -> bool:
    threads = _threads(device)
    return (per_sm * shared_bytes(p, mt, stages) <= device.shared_per_multiprocessor
            and per_sm * threads <= device.max_threads_per_multiprocessor
            and per_sm * threads * registers(p, mt) <= device.registers_per_multiprocessor)


def _fits(p: Conv2dProblem, mt: int, stages: int, per_sm: int, device: DeviceInfo) -> bool:
    """The tile plans here and per_sm of its blocks fit a multiprocessor."""
    try:
        _check(p, mt, stages, per_sm, device)
    except ScheduleError:
        return False
    return _fits_resident(p, mt, stages, per_sm, device)


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    return [schedule(mt, stages, per_sm) for mt in MTS for stages in STAGES for per_sm in BLOCKS_PER_SM
            if _fits(p, mt, stages, per_sm, device)]


def _tile_of(s: Schedule) -> tuple[int, int, int]:
    return int(s["mt"]), int(s["stages"]), int(s["per_sm"])


def grid_blocks(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> tuple[int, int]:
    """(tiles, blocks): pixel tiles of BM rows, and the persistent grid that walks them."""
    mt, _, per_sm = _tile_of(s)
    tiles = ceil_div(p.pixels, WARPS * mt * 16)
    return tiles, max(1, min(tiles, per_sm * device.multiprocessors))


def plan_pointwise(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    mt, stages, per_sm = _tile_of(s)
    _check(p, mt, stages, per_sm, device)
    kp, np_ = padded(p)
    threads = _threads(device)
    tiles, blocks = grid_blocks(p, s, device)
    idx = index_type(p.pixels * max(p.cin, p.cout) + 64, p.cout * p.cin + 64)
    nchw = p.layout != "nhwc"
    vec_out = nchw or p.cout % 8 == 0         # NCHW: 8 pixels of a channel per store (H * W % 8 == 0)
    params = {"ctype": C_TYPE[p.dtype], "index_type": idx, "KP": kp, "NP": np_, "WARPS": WARPS, "MT": mt,
              "STAGES": stages, "threads": threads, "min_blocks": per_sm, "async_copy": device.backend == "cuda",
              "has_bias": p.has_bias, "has_residual": p.has_residual, "activation": p.activation,
              "vec_out": vec_out, "nchw": nchw}
    out_align = 16 if vec_out else 0          # 8 outputs of y and residual (NHWC: and bias) at once
    bias_align = 0 if nchw else out_align
    args = (Buf("x", align=16), Buf("w", align=16), *((Buf("bias", align=bias_align),) if p.has_bias else ()),
            *((Buf("residual", align=out_align),) if p.has_residual else ()), Buf("y", align=out_align),
            *(Scalar("i32", v) for v in (p.pixels, p.cin, p.cout, p.h * p.w, tiles)), Scalar("f32", p.alpha))
    return Plan(launches=(Launch.make("conv2d/pointwise.hip.j2", "conv2d_pointwise_mma", params, (blocks,),
                                      (threads,), args, shared_bytes(p, mt, stages)),))


# The heuristic's schedule: the first of these (mt, stages, per_sm) that fits. Over the 48 NHWC layers of
# the fit, (2, 4, 2) ran 1.022x the fastest of all 27 on geometric mean where it fits (19 layers), (2, 3, 2)
# 1.024x (21), (1, 4, 2) 1.071x (27), (1, 3, 1) 1.104x (48); over 30 NCHW layers 1.065x, 1.073x, 1.080x
# and 1.32x (one block per SM starves NCHW's shorter copies).
HEURISTIC_ORDER = ((2, 4, 2), (2, 3, 2), (1, 4, 2), (1, 3, 2), (1, 2, 2), (1, 3, 1), (1, 2, 1))
# The heuristic rates the stream only up to this many padded multiply-adds per pixel (KP x NP): above it
# the tiled GEMMs do the math faster (64 -> 64 and every 128-channel DenseNet layer ran 1.4-1.9x slower
# here), and their optimistic estimates would not show it.
MAX_RATED_MACS = 4608
# ... and from this many pixels: below it (ResNet-50 / MobileNet-v3 at batch 1, EfficientNet-B0 at batch 8
# at 56 x 56) its fixed cost per call left it 1.1-1.3x slower than the tiled GEMMs' ~2.5 us in 7 of 10
# layers it would have taken (chosen on that second set of 36 layers, H200, 2026-11-29 12:38).
MIN_RATED_PIXELS = 50000


def rated(p: Conv2dProblem, device: DeviceInfo, explicit: bool = False) -> list[Schedule]:
    """The one schedule the heuristic rates against the other kernels (the first of HEURISTIC_ORDER that
    fits), or none: only on sm_90 (the devices it was measured on; elsewhere the tuner still times its
    candidates), and within MAX_RATED_MACS and from MIN_RATED_PIXELS, unless the caller named the
    algorithm (explicit)."""
    if why_not(p) is not None or not device.matrix_cores or not (explicit or device.arch.startswith("sm_9")):
        return []
    kp, np_ = padded(p)
    if (kp * np_ > MAX_RATED_MACS or p.pixels < MIN_RATED_PIXELS) and not explicit:
        return []
    for mt, stages, per_sm in HEURISTIC_ORDER:
        if _fits(p, mt, stages, per_sm, device):
            return [schedule(mt, stages, per_sm)]
    return []


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float,
             prm: PointwiseCost | None = None) -> float:
    """Seconds for one call, as rated against the other kernels (the fit in PointwiseCost, divided by
    its margin): the launch and fixed cost, the bytes read and written, the padded multiply-adds; the
    persistent grid's blocks share the pixel tiles evenly, so the tile shape enters only through the
    padding."""
    prm = prm or COST
    kp, np_ = padded(p)
    isz = p.itemsize
    read = (p.pixels * p.cin + (p.pixels * p.cout if p.has_residual else 0) + p.cout * p.cin) * isz
    write = p.pixels * p.cout * isz
    peak = 4096 * 1.83e9 * device.multiprocessors if device.arch.startswith("sm_9") else \
        2048 * 1.5e9 * device.multiprocessors
    if p.layout == "nhwc":
        fixed, rd, wr, mma = prm.fixed_s, prm.read_share, prm.write_share, prm.mma_share
    else:
        fixed, rd, wr, mma = prm.nchw_fixed_s, prm.nchw_read_share, prm.nchw_write_share, prm.nchw_mma_share
    t = (launch_s + fixed + read / (rd * bandwidth) + write / (wr * bandwidth) + 2.0 * p.pixels * kp * np_ / (mma * peak))
    return t / prm.margin
