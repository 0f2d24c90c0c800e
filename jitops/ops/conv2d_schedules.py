"""conv2d scheduling: the tuning space and a cost model that picks from it.

The heuristic estimates each candidate's time from the problem and the device (multiprocessor
count, shared memory and registers per multiprocessor, warp size) and takes the cheapest:

  compute   busiest multiprocessor's share of the blocks x flops per block, at the tile's
            sustained fraction of the multiprocessor's fp32 rate, lowered when too few warps
            are resident to hide latency;
  memory    bytes that must cross DRAM (inputs once, outputs once, workspaces written and read);
  launches  a fixed cost per kernel.

Time = max(compute, memory) per kernel, summed. The fractions (TILE_RATE, DIRECT_RATE) were
fitted to an H100 sweep of every candidate on the 15 benchmark problems (scripts/conv2d_sweep.py);
`why` reports the estimate of the pick and of the best candidate of every other algorithm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import Schedule, ceil_div
from .conv2d_plans import ALGORITHMS, WINOGRAD_M, direct_shared_bytes, round_up, winograd_sizes
from .conv2d_problem import Conv2dProblem

# GEMM tiles (bm, bn, bk, tm, tn) and the fraction of a multiprocessor's fp32 rate each sustains
# with enough warps resident.
TILE_RATE: dict[tuple[int, int, int, int, int], float] = {
    (128, 128, 8, 8, 8): 0.80,
    (128, 64, 8, 8, 8): 0.72,
    (64, 128, 8, 8, 8): 0.72,
    (64, 64, 8, 8, 8): 0.62,
    (64, 64, 8, 4, 4): 0.50,
    (32, 128, 8, 4, 8): 0.58,
    (32, 64, 8, 4, 4): 0.45,
    (16, 128, 8, 4, 4): 0.40,
}
# Registers per thread assumed for occupancy (accumulators + fragments + staging + indices).
TILE_REGS = {(8, 8): 128, (8, 4): 90, (4, 8): 90, (4, 4): 64}
DIRECT_RATE = 0.30
NAIVE_RATE = 0.04
ELEMENTWISE_RATE = 0.5    # of DRAM bandwidth, for transform and reduction kernels


@dataclass(frozen=True)
class Machine:
    """What the model needs beyond DeviceInfo: fp32 flop/s per multiprocessor, DRAM bytes/s, launch s."""

    flops_per_sm: float
    bandwidth: float
    launch: float


def machine(device: DeviceInfo) -> Machine:
    arch = device.arch
    if arch.startswith("sm_9"):
        return Machine(2 * 128 * 1.75e9, 3.0e12, 2.0e-6)
    if arch.startswith("sm_8"):
        return Machine(2 * (64 if arch == "sm_80" else 128) * 1.4e9, 1.5e12, 2.5e-6)
    if arch.startswith("sm_"):
        return Machine(2 * 64 * 1.4e9, 0.9e12, 3e-6)
    if arch.startswith("gfx9"):
        return Machine(2 * 64 * 1.7e9, 1.6e12, 3e-6)
    if arch.startswith("gfx"):
        return Machine(2 * 128 * 2.0e9, 0.9e12, 3e-6)
    return Machine(1e9, 1e10, 1e-5)   # the CPU emulator: only the relative order matters


# ---------------------------------------------------------------- schedules

def gemm_schedule(algorithm: str, tile: tuple[int, int, int, int, int], split_k: int = 1, why: str = "") -> Schedule:
    bm, bn, bk, tm, tn = tile
    return Schedule.make(algorithm, why=why, bm=bm, bn=bn, bk=bk, tm=tm, tn=tn, split_k=split_k, math="fma")


def direct_schedule(th: int, tw: int, pw: int, cot: int, cic: int, splits: int = 1, why: str = "") -> Schedule:
    return Schedule.make("direct", why=why, th=th, tw=tw, pw=pw, cot=cot, cic=cic, splits=splits)


def winograd_schedule(algorithm: str, tile: tuple[int, int, int, int, int], why: str = "") -> Schedule:
    bm, bn, bk, tm, tn = tile
    return Schedule.make(algorithm, why=why, bm=bm, bn=bn, bk=bk, tm=tm, tn=tn, math="fma")


def _pow2_at_most(v: int, cap: int) -> int:
    return max(1, min(cap, 1 << max(0, int(math.log2(max(1, v))))))


def applicable(p: Conv2dProblem, algorithm: str) -> bool:
    if algorithm == "gemm_1x1":
        return p.is_pointwise
    if algorithm in WINOGRAD_M:
        return p.winograd_ok
    if algorithm == "split_k":
        return p.kh * p.kw * ceil_div(p.cin_g, 8) >= 2
    return algorithm in ALGORITHMS


def _split_options(p: Conv2dProblem) -> list[int]:
    slices = p.kh * p.kw * ceil_div(p.cin_g, 8)
    options = [s for s in (2, 3, 4, 6, 8, 12, 16, 24, 32) if slices // s >= 4]
    return options or ([2] if slices >= 2 else [])


def _direct_options(p: Conv2dProblem) -> list[Schedule]:
    out = []
    cot_max = _pow2_at_most(p.cout_g, 8)
    cic = _pow2_at_most(p.cin_g, 8)
    tw = 32 if p.ow > 16 else 16
    for th in (4, 8):
        for pw in (1, 2):
            for splits in (1, 2, 4, 8, 16):
                if splits > 1 and p.cin_g < 4 * splits:
                    continue
                out.append(direct_schedule(th, tw, pw, cot_max, cic, splits))
    return out


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    """Every schedule the tuner may time for this problem (each one plans on this device)."""
    out = [Schedule.make("naive", block=256)]
    out += _direct_options(p)
    gemm_alg = "gemm_1x1" if p.is_pointwise else "implicit_gemm"
    for tile in TILE_RATE:
        out.append(gemm_schedule(gemm_alg, tile))
        for s in _split_options(p):
            out.append(gemm_schedule("split_k", tile, s))
    if p.winograd_ok:
        for alg in WINOGRAD_M:
            for tile in TILE_RATE:
                out.append(winograd_schedule(alg, tile))
    return [s for s in out if _plannable(p, s, device)]


def _plannable(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> bool:
    from .conv2d_plans import plan
    try:
        plan(p, s, device)
    except ScheduleError:
        return False
    return True


# ---------------------------------------------------------------- cost model

def _occupancy_factor(warps: float) -> float:
    """Fraction of the tile's rate reached with `warps` resident per multiprocessor."""
    return min(1.0, 0.35 + 0.08 * warps)


def _gemm_time(p: Conv2dProblem, device: DeviceInfo, mach: Machine, tile: tuple[int, ...], m: int, n: int,
               k_slices: int, batches: int) -> float:
    bm, bn, bk, tm, tn = tile
    threads = (bm // tm) * (bn // tn)
    regs = TILE_REGS[(tm, tn)]
    shared = 2 * bk * (bm + bn) * 4
    resident = max(1, min(2048 // threads, device.registers_per_multiprocessor // (threads * regs),
                          device.shared_per_multiprocessor // max(1, shared), 32))
    blocks = ceil_div(m, bm) * ceil_div(n, bn) * batches
    per_sm = ceil_div(blocks, device.multiprocessors)
    warps = min(per_sm, resident) * threads / device.warp_size
    block_flops = 2.0 * bm * bn * bk * k_slices
    rate = mach.flops_per_sm * TILE_RATE[tile] * _occupancy_factor(warps)
    # Each block also pays a fixed prologue/epilogue of about four slices.
    return per_sm * (block_flops + 2.0 * bm * bn * bk * 4) / rate


def _mem(mach: Machine, nbytes: float) -> float:
    return nbytes / mach.bandwidth


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> float:
    """Estimated seconds for one call (the heuristic compares these; absolute values are rough)."""
    mach = machine(device)
    isz = p.itemsize
    x_bytes = p.n * p.cin * p.h * p.w * isz
    y_bytes = p.n * p.cout * p.oh * p.ow * isz
    w_bytes = p.cout * p.cin_g * p.kh * p.kw * isz
    io = _mem(mach, x_bytes + y_bytes + w_bytes)
    alg = s.algorithm
    if alg == "naive":
        rate = mach.flops_per_sm * device.multiprocessors * NAIVE_RATE
        return mach.launch + max(p.flops / rate, io)
    if alg == "direct":
        th, tw, pw, cot, cic = (int(s[k]) for k in ("th", "tw", "pw", "cot", "cic"))
        cot = min(cot, p.cout_g)
        splits = int(s.get("splits", 1))
        threads = th * tw // pw
        blocks = ceil_div(p.oh, th) * ceil_div(p.ow, tw) * p.groups * ceil_div(p.cout_g, cot) * p.n * splits
        per_sm = ceil_div(blocks, device.multiprocessors)
        shared = direct_shared_bytes(p, th, tw, cot, min(cic, p.cin_g))
        resident = max(1, min(2048 // threads, device.shared_per_multiprocessor // max(1, shared), 32))
        warps = min(per_sm, resident) * threads / device.warp_size
        # Work per block includes the padded tile (threads beyond the output edge still load).
        flops = 2.0 * th * tw * cot * ceil_div(p.cin_g, splits) * p.kh * p.kw
        # With few output channels per block the shared-memory reads, not the FMAs, set the pace.
        rate = mach.flops_per_sm * DIRECT_RATE * min(1.0, (cot + 4) / 12) * _occupancy_factor(warps)
        t = per_sm * flops / rate
        t = max(t, io) + mach.launch
        if splits > 1:
            t += mach.launch + _mem(mach, 2 * splits * p.cout * p.pixels * 4) / ELEMENTWISE_RATE
        return t
    if alg in ("implicit_gemm", "gemm_1x1", "split_k"):
        tile = tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn"))
        bk = tile[2]
        k_slices = p.kh * p.kw * ceil_div(p.cin_g, bk)
        splits = int(s.get("split_k", 1))
        per = ceil_div(k_slices, splits)
        splits = ceil_div(k_slices, per)
        t = _gemm_time(p, device, mach, tile, p.cout_g, p.pixels, per, p.groups * splits)
        # Implicit im2col re-reads the input once per tap through the caches: charge a share of it.
        t = max(t, io) + mach.launch
        if splits > 1:
            t += mach.launch + _mem(mach, 2 * splits * p.cout * p.pixels * 4) / ELEMENTWISE_RATE
        return t
    if alg in WINOGRAD_M:
        m = WINOGRAD_M[alg]
        a2 = (m + 2) ** 2
        tile = tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn"))
        _, _, tiles = winograd_sizes(p, m)
        tp = round_up(tiles, tile[1])
        cinp = round_up(p.cin, tile[2])
        v_bytes = a2 * cinp * tp * 4
        m_bytes = a2 * p.cout * tp * 4
        t_in = _mem(mach, x_bytes * 1.5 + v_bytes) / ELEMENTWISE_RATE
        t_gemm = max(_gemm_time(p, device, mach, tile, p.cout, tp, cinp // tile[2], a2),
                     _mem(mach, v_bytes * ceil_div(p.cout, tile[0]) + m_bytes))
        t_out = _mem(mach, m_bytes + y_bytes) / ELEMENTWISE_RATE
        return t_in + t_gemm + t_out + 3 * mach.launch
    raise ScheduleError(f"conv2d has no algorithm '{alg}'")


def _best(p: Conv2dProblem, device: DeviceInfo, schedules: list[Schedule]) -> tuple[Schedule, float]:
    scored = [(estimate(p, s, device), i, s) for i, s in enumerate(schedules)]
    t, _, s = min(scored)
    return s, t


def heuristic(p: Conv2dProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ScheduleError(f"conv2d has no algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if algorithm is not None and not applicable(p, algorithm):
        raise ScheduleError(f"conv2d algorithm '{algorithm}' does not apply to {p.describe()}")
    if algorithm == "naive":
        return Schedule.make("naive", why="one thread per output (the seeds' baseline)", block=256)
    if algorithm == "implicit_gemm" and p.is_pointwise:
        algorithm = "gemm_1x1"    # the same GEMM; for 1x1 it reads the input as a plain matrix
    pool = [s for s in candidates(p, device) if s.algorithm != "naive"]
    if algorithm is not None:
        pool = [s for s in pool if s.algorithm == algorithm]
        if not pool:
            raise ScheduleError(f"conv2d algorithm '{algorithm}' has no schedule that fits {device.name}")
    best, t = _best(p, device, pool)
    others = []
    for alg in ALGORITHMS:
        if alg in ("naive", best.algorithm):
            continue
        group = [s for s in pool if s.algorithm == alg] if algorithm is None else []
        if group:
            _, ta = _best(p, device, group)
            others.append(f"{alg} {ta * 1e6:.1f}")
    why = (f"{p.describe()} on {device.multiprocessors} multiprocessors (warp {device.warp_size}): "
           f"{best} estimated {t * 1e6:.1f} us")
    if others:
        why += " (best of the others, us: " + ", ".join(others) + ")"
    return Schedule(best.algorithm, best.params, why)
