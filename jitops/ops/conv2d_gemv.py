"""conv2d for 1x1 layers over a few pixels: dot products split over warps (templates/conv2d/gemv.hip.j2).

Squeeze-and-excitation blocks (MobileNet-v3, EfficientNet, RegNetY) convolve a pooled [N, C, 1, 1]
tensor twice per block: 32 x 72 -> 24, 32 x 1152 -> 48, 32 x 48 -> 1152 at batch 32, a few thousand dot
products each. The tiled GEMMs ran them in 4-9 us against cuDNN's 2.3-4 (H200 pool sweeps, 2026-11-29):
one block for 72 -> 24 channels, a second launch to sum split K, or an NHWC <-> NCHW copy around a
kernel that reads NCHW. Here one launch covers the layer: blocks of warp-size pixel rows by TN
channels, the warps splitting Cin, their sums meeting in shared memory, bias / residual / activation
fused.

Scope: 1x1 / stride 1 / no padding, one group, at most MAX_PIXELS pixels, rows contiguous in Cin (NHWC,
or NCHW at 1 x 1), any dtype (fp32 exact: no TF32). `rated` says where the heuristic takes it.
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, ceil_div, index_type
from .conv2d_problem import Conv2dProblem

ALGORITHM = "gemv_1x1"
MAX_PIXELS = 256           # the kernel re-reads the weights once per warp-size rows of pixels
TNS = (1, 2, 4, 8, 16)     # output channels per block
WARPS = (4, 8, 16)         # warps per block, splitting Cin
# The heuristic takes it at 1 x 1 pixels for at most this many (two 32-row tiles: batch <= 64). Not for
# channels_last layers of a few pixels with large weights (ResNet-50 b1's 512 -> 2048 at 7 x 7: 14.3 us
# against 4.1 for the TMA kernel; H200, 2026-11-29): every row tile reads all the weights.
RATED_PIXELS = 64


def why_not(p: Conv2dProblem) -> str | None:
    """Why this kernel cannot run the problem, or None."""
    if not p.is_pointwise or p.groups != 1:
        return "gemv_1x1 takes 1x1 convolutions with stride 1, no padding and one group"
    if p.layout != "nhwc" and p.h * p.w != 1:
        return (f"gemv_1x1 reads pixel rows of contiguous channels: channels_last, or NCHW at 1 x 1 "
                f"(got NCHW at {p.h} x {p.w})")
    if p.pixels > MAX_PIXELS:
        return f"gemv_1x1 is for at most {MAX_PIXELS} pixels (got {p.pixels})"
    return None


def vector(p: Conv2dProblem) -> int:
    """Channels per load: the widest of 8 / 4 / 2 / 1 that divides Cin within 16 bytes."""
    return next(v for v in (8, 4, 2, 1) if p.cin % v == 0 and v * p.itemsize <= 16)


def schedule(tn: int, warps: int, why: str = "") -> Schedule:
    return Schedule.make(ALGORITHM, why=why, tn=tn, warps=warps)


def shared_bytes(tn: int, warps: int, device: DeviceInfo) -> int:
    """The warps' partial sums: [warps][warp size][TN + 1] floats, static shared memory."""
    return warps * device.warp_size * (tn + 1) * 4


def fits(tn: int, warps: int, device: DeviceInfo) -> bool:
    """The block's partial sums fit its static shared memory and its threads a block (at warp 64, TN 16 on
    16 warps does not)."""
    return shared_bytes(tn, warps, device) <= device.shared_per_block and warps * device.warp_size <= 1024


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    if why_not(p) is not None:
        return []
    return [schedule(tn, warps) for tn in TNS for warps in WARPS if fits(tn, warps, device)]


def rated(p: Conv2dProblem, device: DeviceInfo, explicit: bool = False) -> list[Schedule]:
    """The heuristic's schedule where it takes this kernel, else none: on sm_90 (where it was measured;
    elsewhere the tuner still times it) at 1 x 1 pixels up to RATED_PIXELS of them, or wherever it applies
    when the caller named the algorithm. The schedule is `shape_rule`'s."""
    rateable = device.arch.startswith("sm_9") and p.h * p.w == 1 and p.pixels <= RATED_PIXELS
    if why_not(p) is not None or not (explicit or rateable):
        return []
    tn, warps = shape_rule(p)
    return [schedule(tn, warps, why=f"{p.describe()}: {p.pixels} pixels, one launch of dot products split over "
                                    f"{warps} warps")]


def shape_rule(p: Conv2dProblem) -> tuple[int, int]:
    """(TN, warps): below 64 input channels 4 channels per block on 4 warps; from 64, 8 warps (16 from 256)
    splitting Cin, and per block 1 output channel below 64 of them, 2 below 256, else 4: long dot
    products want more warps on each and more blocks. H200, 2026-11-29 (scripts/device_conv2d_gemv.py, all
    15 schedules on 80 squeeze-and-excitation layers of EfficientNet-B0 / B3, MobileNet-v3-L, RegNetY-1.6GF):
    fitted on the 56 layers at batch 32, 1.011x the fastest schedule timed there (count-weighted), 1.007x on
    the 24 at batch 1 / 8 held out, worst 1.21x (4 channels on 8 warps everywhere: 1.137x, worst 1.59x).
    Timed in fp16; bf16 and fp32 take the same tiles (checked against float64 there, not timed)."""
    if p.cin < 64:
        return 4, 4
    return (1 if p.cout < 64 else 2 if p.cout < 256 else 4), (8 if p.cin < 256 else 16)


def plan_gemv(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    tn, warps = int(s["tn"]), int(s["warps"])
    if tn not in TNS or warps not in WARPS:
        raise ScheduleError(f"gemv_1x1: tn={tn} and warps={warps} must be in {TNS} and {WARPS}")
    if not fits(tn, warps, device):
        smem = shared_bytes(tn, warps, device)
        raise ScheduleError(f"gemv_1x1: tn={tn} on {warps} warps of {device.warp_size} needs {smem} bytes of shared "
                            f"memory and {warps * device.warp_size} threads (at most {device.shared_per_block} and 1024)")
    vec = vector(p)
    tm = device.warp_size
    threads = warps * device.warp_size
    params = {"ctype": C_TYPE[p.dtype], "index_type": index_type(p.pixels * max(p.cin, p.cout), p.cout * p.cin),
              "VEC": vec, "TM": tm, "TN": tn, "WARPS": warps, "threads": threads, "has_bias": p.has_bias,
              "has_residual": p.has_residual, "activation": p.activation}
    align = vec * p.itemsize if vec > 1 else 0
    args = (Buf("x", align=align), Buf("w", align=align), *((Buf("bias"),) if p.has_bias else ()),
            *((Buf("residual"),) if p.has_residual else ()), Buf("y"),
            *(Scalar("i32", v) for v in (p.pixels, p.cin, p.cout)), Scalar("f32", p.alpha))
    grid = (ceil_div(p.cout, tn), ceil_div(p.pixels, tm))
    return Plan(launches=(Launch.make("conv2d/gemv.hip.j2", "conv2d_gemv_1x1", params, grid, (threads,), args, 0),))


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float) -> float:
    """Seconds for one call: the launch, a fixed 1 us, the weights once per row tile and x once per block
    at the copy bandwidth. Only ranks this kernel's own schedules (benchmark mode's shortlist); the
    heuristic takes it by `rated`, not by comparing this with the other kernels' estimates."""
    tn = int(s["tn"])
    blocks_n = ceil_div(p.cout, tn)
    tiles = ceil_div(p.pixels, device.warp_size)
    reads = (tiles * p.cout * p.cin + blocks_n * p.pixels * p.cin) * p.itemsize
    return launch_s + 1e-6 + reads / bandwidth
