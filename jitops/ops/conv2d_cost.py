"""conv2d cost model: estimated time of a schedule on a device, for the heuristic to compare.

Per kernel, time = max(compute, memory) + a launch cost, summed over the plan's kernels:

  compute  the busiest multiprocessor's blocks x flops per block (plus a fixed prologue /
           epilogue counted in reduction slices), at the tile's sustained fraction of the
           multiprocessor's fp32 rate, lowered when too few warps are resident to hide latency
           (residency from threads, registers and shared memory per block and per multiprocessor);
  memory   bytes that must cross DRAM (inputs once, outputs once, workspaces written and read).

The constants in PARAMS were fitted (scripts/conv2d_fit.py, least squares on log time) to a sweep
of every candidate schedule on the 15 benchmark problems and 10 common network layers on an H200
(scripts/conv2d_sweep.py, docs/data/conv2d_sweep_h200_*.json.gz); docs/conv2d.md says how well the
fit ranks the candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from . import conv2d_depthwise as depthwise
from . import conv2d_gemv as gemv
from . import conv2d_mma as mma
from . import conv2d_pointwise as pointwise
from . import conv2d_stem as stem
from . import conv2d_wgmma as wgmma
from .base import Schedule, ceil_div, round_up
from .conv2d_plans import WINOGRAD_M, direct_shared_bytes, winograd_sizes
from .conv2d_problem import Conv2dProblem

Tile = tuple[int, int, int, int, int]      # bm, bn, bk, tm, tn


@dataclass(frozen=True)
class CostParams:
    # Fraction of a multiprocessor's fp32 rate each GEMM tile sustains with latency hidden.
    tile_rate: dict[Tile, float] = field(default_factory=lambda: {
        (128, 128, 16, 8, 8): 0.673, (128, 128, 8, 8, 8): 0.630, (128, 64, 8, 8, 8): 0.568,
        (128, 32, 8, 8, 4): 0.461, (64, 128, 16, 8, 8): 0.657, (64, 128, 8, 8, 8): 0.569,
        (64, 64, 16, 8, 8): 0.585, (64, 64, 8, 8, 8): 0.519, (64, 64, 8, 4, 4): 0.321,
        (64, 32, 8, 8, 4): 0.400, (32, 128, 16, 4, 8): 0.489, (32, 128, 8, 4, 8): 0.425,
        (32, 64, 8, 4, 8): 0.393, (32, 64, 8, 4, 4): 0.308, (32, 32, 8, 4, 4): 0.303,
        (16, 128, 8, 4, 4): 0.290})
    # The same for the Winograd GEMMs (B a plain matrix, short reductions when channels are few).
    matrix_tile_rate: dict[Tile, float] = field(default_factory=lambda: {
        (128, 128, 16, 8, 8): 0.723, (128, 128, 8, 8, 8): 0.758, (128, 64, 8, 8, 8): 0.516,
        (128, 32, 8, 8, 4): 0.439, (64, 128, 16, 8, 8): 0.706, (64, 128, 8, 8, 8): 0.554,
        (64, 64, 16, 8, 8): 0.629, (64, 64, 8, 8, 8): 0.711, (64, 64, 8, 4, 4): 0.489,
        (64, 32, 8, 8, 4): 0.540, (32, 128, 16, 4, 8): 0.596, (32, 128, 8, 4, 8): 0.484,
        (32, 64, 8, 4, 8): 0.544, (32, 64, 8, 4, 4): 0.463, (32, 32, 8, 4, 4): 0.400,
        (16, 128, 8, 4, 4): 0.431})
    occ_floor: float = 0.22           # fraction of the rate reached with one warp per multiprocessor
    occ_warps: float = 11.3           # warps per multiprocessor that hide the latency
    overhead_slices: float = 0.0      # prologue + epilogue of a block, in BK slices (fitted: none)
    gemm_mem_eff: float = 1.2         # DRAM bytes a GEMM moves are mostly L2 hits: rarely the limit
    elem_eff: float = 0.81            # transform and reduction kernels, of the copy bandwidth
    launch_s: float = 2.0e-6          # per kernel (graph replay); eager calls add host time
    direct_rate: float = 0.81         # of the fp32 issue rate, for the direct kernel's slots below
    direct_load: float = 54.0         # issue slots per element staged into shared memory (latency)
    direct_lds: float = 0.72          # per shared-memory read in the inner loop
    direct_sync: float = 195.0        # per chunk (two barriers)
    naive_rate: float = 0.021


PARAMS = CostParams()
# Registers per thread (ptxas, sm_90) by thread tile, for residency.
TILE_REGS = {(8, 8): 132, (8, 4): 88, (4, 8): 88, (4, 4): 60}


@dataclass(frozen=True)
class Machine:
    """What the model needs beyond DeviceInfo: fp32 flop/s per multiprocessor and DRAM bytes/s."""

    flops_per_sm: float
    bandwidth: float


def machine(device: DeviceInfo) -> Machine:
    arch, name = device.arch, device.name
    if arch.startswith("sm_9"):
        # H200 4.2 TB/s and H100 3.0 TB/s device-to-device copies measured here; offline: between.
        bw = 4.2e12 if "H200" in name and "H100" not in name else 3.0e12 if "H100" in name and "H200" not in name \
            else 3.6e12
        return Machine(2 * 128 * 1.98e9, bw)
    if arch.startswith("sm_8"):
        return Machine(2 * (64 if arch == "sm_80" else 128) * 1.41e9, 1.5e12)
    if arch.startswith("sm_"):
        return Machine(2 * 64 * 1.4e9, 0.9e12)
    if arch.startswith("gfx9"):
        return Machine(2 * 64 * 1.7e9, 1.6e12)
    if arch.startswith("gfx"):
        return Machine(2 * 128 * 2.0e9, 0.9e12)
    return Machine(1e9, 1e10)   # the CPU emulator: only the relative order matters


def _occupancy(prm: CostParams, warps: float) -> float:
    return min(1.0, prm.occ_floor + (1.0 - prm.occ_floor) * warps / prm.occ_warps)


def _tile_rate(rates: dict[Tile, float], tile: Tile) -> float:
    if tile in rates:
        return rates[tile]
    bm, bn, bk, tm, tn = tile           # an untimed tile: the nearest timed one with this thread tile
    near = [v for (m, n, _, a, b), v in rates.items() if (a, b) == (tm, tn) and m * n <= bm * bn]
    return max(near, default=0.4)


def gemm_time(prm: CostParams, device: DeviceInfo, mach: Machine, tile: Tile, m: int, n: int, slices: int,
              batches: int, implicit: bool) -> float:
    bm, bn, bk, tm, tn = tile
    threads = (bm // tm) * (bn // tn)
    regs = TILE_REGS[(tm, tn)]
    shared = 2 * bk * (bm + bn) * 4
    resident = max(1, min(device.max_threads_per_block * 2 // threads,
                          device.registers_per_multiprocessor // (threads * regs),
                          device.shared_per_multiprocessor // max(1, shared), 32))
    blocks = ceil_div(m, bm) * ceil_div(n, bn) * batches
    per_sm = ceil_div(blocks, device.multiprocessors)
    warps = min(per_sm, resident) * threads / device.warp_size
    rates = prm.tile_rate if implicit else prm.matrix_tile_rate
    rate = mach.flops_per_sm * _tile_rate(rates, tile) * _occupancy(prm, warps)
    return per_sm * 2.0 * bm * bn * bk * (slices + prm.overhead_slices) / rate


def direct_splits(p: Conv2dProblem, s: Schedule) -> int:
    cic = min(int(s["cic"]), p.cin_g)
    per_split = round_up(ceil_div(p.cin_g, max(1, int(s.get("splits", 1)))), cic)
    return ceil_div(p.cin_g, per_split)


def direct_time(prm: CostParams, p: Conv2dProblem, s: Schedule, device: DeviceInfo, mach: Machine) -> float:
    """Per input-channel chunk each thread stages its share of the tile (and weights) through shared
    memory, waits at two barriers, then per channel and tap reads PW inputs and COT weights from
    shared memory for PW x COT FMAs: counted in FMA-issue slots, at direct_rate of the fp32 rate."""
    th, tw, pw, cot, cic = (int(s[k]) for k in ("th", "tw", "pw", "cot", "cic"))
    cot, cic = min(cot, p.cout_g), min(cic, p.cin_g)
    splits = direct_splits(p, s)
    chunks = ceil_div(ceil_div(p.cin_g, splits), cic)
    threads = th * tw // pw
    iht = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iwt = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    taps = p.kh * p.kw
    per_thread = (prm.direct_load * (cic * iht * iwt + cic * taps * cot) / threads
                  + cic * taps * (pw * cot + prm.direct_lds * (pw + cot)) + prm.direct_sync)
    blocks = ceil_div(p.oh, th) * ceil_div(p.ow, tw) * p.groups * ceil_div(p.cout_g, cot) * p.n * splits
    per_sm = ceil_div(blocks, device.multiprocessors)
    shared = direct_shared_bytes(p, th, tw, cot, cic)
    resident = max(1, min(device.max_threads_per_multiprocessor // threads, device.shared_per_multiprocessor // max(1, shared), 32))
    warps = min(per_sm, resident) * threads / device.warp_size
    fma_rate = mach.flops_per_sm / 2 * prm.direct_rate * _occupancy(prm, warps)
    return per_sm * chunks * per_thread * threads / fma_rate


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, prm: CostParams = PARAMS) -> float:
    """Estimated seconds for one call (graph replay)."""
    t = _estimate(p, s, device, prm)
    if s.algorithm in (mma.ALGORITHM, wgmma.ALGORITHM, depthwise.ALGORITHM, stem.ALGORITHM, pointwise.ALGORITHM,
                       gemv.ALGORITHM):
        return t
    bw = machine(device).bandwidth * prm.elem_eff
    y_bytes = p.n * p.cout * p.oh * p.ow * p.itemsize
    if p.layout == "nhwc":      # NCHW kernels: x transposed in, y transposed out (with the residual)
        t += 2 * prm.launch_s + (2 * p.n * p.cin * p.h * p.w * p.itemsize + (3 if p.has_residual else 2) * y_bytes) / bw
    elif p.has_residual:        # the separate residual pass: y and r read, y written
        t += prm.launch_s + 3 * y_bytes / bw
    return t


def _estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, prm: CostParams) -> float:
    mach = machine(device)
    bw = mach.bandwidth
    isz = p.itemsize
    x_bytes = p.n * p.cin * p.h * p.w * isz
    y_bytes = p.n * p.cout * p.oh * p.ow * isz
    w_bytes = p.cout * p.cin_g * p.kh * p.kw * isz
    io = (x_bytes + y_bytes + w_bytes) / (bw * prm.gemm_mem_eff)
    alg = s.algorithm

    def reduction(splits: int) -> float:
        return 0.0 if splits <= 1 else \
            prm.launch_s + (splits * p.cout * p.pixels * 4 + y_bytes) / (bw * prm.elem_eff)

    if alg == "naive":
        return prm.launch_s + max(p.flops / (mach.flops_per_sm * device.multiprocessors * prm.naive_rate), io)
    if alg == "direct":
        return prm.launch_s + max(direct_time(prm, p, s, device, mach), io) + \
            reduction(direct_splits(p, s))
    if alg in ("implicit_gemm", "gemm_1x1", "split_k"):
        tile: Any = tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn"))
        slices = p.kh * p.kw * ceil_div(p.cin_g, tile[2])
        per = ceil_div(slices, int(s.get("split_k", 1)))
        splits = ceil_div(slices, per)
        t = gemm_time(prm, device, mach, tile, p.cout_g, p.pixels, per, p.groups * splits, implicit=True)
        return prm.launch_s + max(t, io) + reduction(splits)
    if alg in WINOGRAD_M:
        m = WINOGRAD_M[alg]
        a2 = (m + 2) ** 2
        tile = tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn"))
        _, _, tiles = winograd_sizes(p, m)
        tp = round_up(tiles, tile[1])
        cinp = round_up(p.cin, tile[2])
        v_bytes = a2 * cinp * tp * 4
        m_bytes = a2 * p.cout * tp * 4
        t_in = (x_bytes + v_bytes) / (bw * prm.elem_eff)
        t_gemm = max(gemm_time(prm, device, mach, tile, p.cout, tp, cinp // tile[2], a2, implicit=False),
                     (v_bytes * ceil_div(p.cout, tile[0]) + m_bytes) / (bw * prm.gemm_mem_eff))
        t_out = (m_bytes + y_bytes) / (bw * prm.elem_eff)
        return t_in + t_gemm + t_out + 3 * prm.launch_s
    if alg == mma.ALGORITHM:
        return mma.estimate(p, s, device, bw, prm.launch_s)
    if alg == wgmma.ALGORITHM:
        return wgmma.estimate(p, s, device, bw, prm.launch_s)
    if alg == depthwise.ALGORITHM:
        return depthwise.estimate(p, device, bw, prm.launch_s, mach.flops_per_sm)
    if alg == stem.ALGORITHM:
        return stem.estimate(p, s, device, bw, prm.launch_s, mach.flops_per_sm / 2)
    if alg == pointwise.ALGORITHM:
        return pointwise.estimate(p, s, device, bw, prm.launch_s)
    if alg == gemv.ALGORITHM:
        return gemv.estimate(p, s, device, bw, prm.launch_s)
    raise ScheduleError(f"conv2d has no algorithm '{alg}'")


def with_params(**changes: Any) -> CostParams:
    return replace(PARAMS, **changes)
