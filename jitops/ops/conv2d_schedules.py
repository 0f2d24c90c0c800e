"""conv2d scheduling: the tuning space, and the heuristic that picks from it by the cost model.

The heuristic estimates every candidate's time on the device (conv2d_cost: multiprocessor count,
registers and shared memory per multiprocessor, warp size, bandwidth) and takes the cheapest; its
`why` gives the estimate of the pick and of the best candidate of every other algorithm, so a
choice can be checked against the benchmark, which times every algorithm.
"""
from __future__ import annotations

import math

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import Schedule, ceil_div
from . import conv2d_depthwise as depthwise
from . import conv2d_gemv as gemv
from . import conv2d_mma as mma
from . import conv2d_pointwise as pointwise
from . import conv2d_stem as stem
from . import conv2d_wgmma as wgmma
from .conv2d_cost import PARAMS, estimate
from .conv2d_plans import ALGORITHMS, WINOGRAD_M
from .conv2d_problem import Conv2dProblem

# The GEMM tiles (bm, bn, bk, tm, tn) in the tuning space.
TILES = tuple(PARAMS.tile_rate)


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


def applicable(p: Conv2dProblem, algorithm: str, device: DeviceInfo) -> bool:
    if algorithm == wgmma.ALGORITHM:
        return wgmma.why_not(p, device) is None
    if algorithm == mma.ALGORITHM:
        return mma.why_not(p) is None
    if algorithm == depthwise.ALGORITHM:
        return depthwise.why_not(p) is None
    if algorithm == stem.ALGORITHM:
        return stem.why_not(p) is None
    if algorithm == pointwise.ALGORITHM:
        return pointwise.why_not(p) is None and device.matrix_cores
    if algorithm == gemv.ALGORITHM:
        return gemv.why_not(p) is None
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
    cots = sorted({_pow2_at_most(p.cout_g, 8), _pow2_at_most(p.cout_g, 16)})
    cic = min(p.cin_g, 8)
    shapes = [(4, 32), (8, 32), (2, 64)] if p.ow > 16 else [(4, 16), (8, 16)]
    for th, tw in shapes:
        for pw in (1, 2):
            for cot in cots:
                for splits in (1, 2, 4, 8, 16):
                    if splits > 1 and p.cin_g < 4 * splits:
                        continue
                    out.append(direct_schedule(th, tw, pw, cot, cic, splits))
    return out


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    """Every schedule the tuner may time for this problem (each one plans on this device). fp32
    with precision "tf32" / "3xtf32" adds the matrix-core kernel to the exact ones: the precision
    is a permission (as torch's allow_tf32), the cost model picks the faster."""
    out = [Schedule.make("naive", block=256)]
    out += _direct_options(p)
    gemm_alg = "gemm_1x1" if p.is_pointwise else "implicit_gemm"
    for tile in TILES:
        out.append(gemm_schedule(gemm_alg, tile))
        for s in _split_options(p):
            out.append(gemm_schedule("split_k", tile, s))
    if p.winograd_ok:
        for alg in WINOGRAD_M:
            for tile in TILES:
                out.append(winograd_schedule(alg, tile))
    out = [s for s in out if _plannable(p, s, device)]
    if mma.why_not(p) is None:
        out += mma.candidates(p, device)
    if wgmma.why_not(p, device) is None:
        out += wgmma.candidates(p, device)
    if depthwise.why_not(p) is None:
        out += depthwise.candidates(p)
    if stem.why_not(p) is None:
        out += stem.candidates(p, device)
    if pointwise.why_not(p) is None and device.matrix_cores:
        out += pointwise.candidates(p, device)
    return out + gemv.candidates(p, device)


def _plannable(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> bool:
    from .conv2d_plans import plan
    try:
        plan(p, s, device)
    except ScheduleError:
        return False
    return True


def _best(p: Conv2dProblem, device: DeviceInfo, schedules: list[Schedule]) -> tuple[Schedule, float]:
    scored = [(estimate(p, s, device), i, s) for i, s in enumerate(schedules)]
    t, _, s = min(scored)
    return s, t


def _pool(p: Conv2dProblem, device: DeviceInfo, algorithm: str | None) -> list[Schedule]:
    """The schedules the heuristic rates against each other (of one algorithm, if named)."""
    # The cost model rates a depthwise layer by its bytes, not by its output tile: the depthwise
    # kernel competes with its own rule's tile.
    pool = [s for s in candidates(p, device) if s.algorithm not in ("naive", depthwise.ALGORITHM)]
    if depthwise.why_not(p) is None:
        pool.append(depthwise.heuristic(p))
    if algorithm is None and wgmma.why_not(p, device) is None:
        # On sm_90 the wgmma kernel stands in for mma.sync (the tuner still times both): on 122
        # fp16 problems (H100, 2026-11-24) mma.sync was >10% faster on 3, and the two cost models,
        # fitted apart, picked mma.sync on 53 where it lost up to 1.3x (launch-bound layers); in
        # TF32 wgmma ran 2.4x faster on geometric mean (29 problems, never slower).
        # Kept: mma.sync reading an NCHW input in place (a_nchw), which wgmma cannot (it copies
        # the input to NHWC first).
        pool = [s for s in pool if s.algorithm != mma.ALGORITHM or mma.reads_nchw(s)]
    # The few-channel 1x1 stream: its heuristic schedule only, where it rates it (conv2d_pointwise.rated).
    pool = [s for s in pool if s.algorithm != pointwise.ALGORITHM] + \
        pointwise.rated(p, device, explicit=algorithm == pointwise.ALGORITHM)
    # The few-pixel 1x1 kernel: only its own rule's schedule (the heuristic takes it by gemv.rated).
    pool = [s for s in pool if s.algorithm != gemv.ALGORITHM] + \
        gemv.rated(p, device, explicit=algorithm == gemv.ALGORITHM)
    if algorithm is not None:
        pool = [s for s in pool if s.algorithm == algorithm]
        if not pool:
            raise ScheduleError(f"conv2d algorithm '{algorithm}' has no schedule that fits {device.name}")
    return pool


def shortlist(p: Conv2dProblem, device: DeviceInfo, n: int) -> list[Schedule]:
    """The heuristic's pick, then the next best-rated schedules: at most n, what benchmark mode times
    on a problem's first call (on the H100's large layers the fastest of the best four rated ran
    1.03x the pick in geometric mean and up to 1.22x, 2026-11-27)."""
    first = heuristic(p, device)
    ranked = sorted(((estimate(p, s, device), i, s) for i, s in enumerate(_pool(p, device, None))),
                    key=lambda e: e[:2])
    out = [first]
    for _, _, s in ranked:
        if len(out) >= n:
            break
        if s not in out:
            out.append(s)
    return out


def heuristic(p: Conv2dProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ScheduleError(f"conv2d has no algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if algorithm is not None and not applicable(p, algorithm, device):
        reason = {mma.ALGORITHM: mma.why_not, depthwise.ALGORITHM: depthwise.why_not, stem.ALGORITHM: stem.why_not,
                  pointwise.ALGORITHM: lambda q: pointwise.why_not(q) or f"{device.name} has no matrix cores",
                  gemv.ALGORITHM: gemv.why_not,
                  wgmma.ALGORITHM: lambda q: wgmma.why_not(q, device)}.get(algorithm, lambda _: None)(p)
        raise ScheduleError(f"conv2d algorithm '{algorithm}' does not apply to {p.describe()}"
                            + (f": {reason}" if reason else ""))
    if algorithm == "naive":
        return Schedule.make("naive", why="one thread per output (the seeds' baseline)", block=256)
    if algorithm == "implicit_gemm" and p.is_pointwise:
        algorithm = "gemm_1x1"    # the same GEMM; for 1x1 it reads the input as a plain matrix
    few_pixels = gemv.rated(p, device) if algorithm is None else []
    if few_pixels:                # 1x1 over a few pixels (squeeze-and-excitation): one launch of dot products
        return few_pixels[0]
    pool = _pool(p, device, algorithm)
    best, t = _best(p, device, pool)
    if best.algorithm == stem.ALGORITHM and algorithm is None and wgmma.tf32_stem_on_rows(p, device):
        best, t = _best(p, device, [s for s in pool if s.algorithm == wgmma.ALGORITHM and not wgmma.is_tma(s)
                                    and not wgmma.is_nchw_1x1(s) and mma.splits_of(p, s)[0] == 1])
    rows = wgmma.window_rows_twin(p, best) if algorithm in (None, wgmma.ALGORITHM) else None
    if rows is not None:            # `why` names the schedule run and its own estimate
        best, t = rows, estimate(p, rows, device)
    twin = wgmma.persistent_twin(p, best, device) if algorithm in (None, wgmma.ALGORITHM) else None
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
    if best.algorithm == wgmma.ALGORITHM and wgmma.is_window_rows(best):
        why += "; K as window rows of 4-channel pixels (at most 4 input channels)"
    if twin is not None:
        best = twin
        why += "; on a persistent grid (short K: the next tile's loads overlap the epilogue)"
    return Schedule(best.algorithm, best.params, why)
