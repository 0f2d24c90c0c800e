"""conv2d for few input channels: a network's stem (templates/conv2d/stem.hip.j2).

A 3x3 RGB stem has K = 27: the matrix-core GEMMs pad it to one or two 64-wide K steps (after
padding C to 8) and pad 16 or 32 output channels to a 64-wide tile, and their per-block set-up
then dominates (H100, 2026-11-25: MobileNet-V3's and EfficientNet-B0's stems at 0.49x / 0.56x
cuDNN on wgmma). This direct kernel reads x in its own layout (no NHWC copy), keeps the weights in
shared memory and spends its time on the FMAs the layer really has.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, ceil_div, index_type
from .conv2d_problem import Conv2dProblem

ALGORITHM = "direct_stem"
MAX_CIN = 8
COTS = (8, 16, 32)
BLOCKS = (128, 256)


@dataclass(frozen=True)
class StemCost:
    """Constants of `estimate`: the share of the issue rate the kernel sustains (its loads are L1
    hits, its shared reads broadcasts), the share of the copy bandwidth its bytes move at, and the
    instructions of one tap besides the FMAs (address arithmetic, bounds test, loads). Chosen on
    46 timed rows (10 stems x fp16 / bf16 / fp32 x NCHW / NHWC, every candidate; H100,
    2026-11-25, docs/data/conv2d_stem_h100_2026-11-25/run2_*) for the fewest lost microseconds
    against the other kernels' estimates: the pick runs 1.037x the faster of the stem kernel and
    the previous pick on geometric mean; the estimates themselves are about 1.3x optimistic (rms
    0.33 in log time). scripts/conv2d_stem_fit.py reproduces the choice."""

    issue_eff: float = 0.45
    mem_eff: float = 0.6
    per_tap: float = 5.0


COST = StemCost()


def why_not(p: Conv2dProblem) -> str | None:
    if p.groups != 1:
        return "direct_stem takes groups = 1"
    if p.cin > MAX_CIN:
        return f"direct_stem is for at most {MAX_CIN} input channels (got {p.cin})"
    return None


def schedule(cot: int, block: int = 256, why: str = "") -> Schedule:
    return Schedule.make(ALGORITHM, why=why, cot=cot, block=block)


def _shared_bytes(p: Conv2dProblem, cot: int) -> int:
    return p.kh * p.kw * p.cin * cot * 4


def _check(p: Conv2dProblem, cot: int, block: int, device: DeviceInfo) -> None:
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    if cot not in COTS or block % device.warp_size or block > device.max_threads_per_block:
        raise ScheduleError(f"direct_stem: {cot} output channels per thread, {block} threads is not supported")
    if _shared_bytes(p, cot) > device.shared_per_block:
        raise ScheduleError(f"direct_stem: {p.kh}x{p.kw}x{p.cin} weights for {cot} channels need "
                            f"{_shared_bytes(p, cot)} bytes of shared memory (at most {device.shared_per_block})")
    if ceil_div(p.pixels, block) > 2**31 - 1 or ceil_div(p.cout, cot) > 65535:
        raise ScheduleError("direct_stem: grid exceeds the launch limits")


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    out = []
    for cot in COTS:
        if cot > 8 and cot // 2 >= p.cout:
            continue            # half the lanes would multiply zeros
        for block in BLOCKS:
            try:
                _check(p, cot, block, device)
            except ScheduleError:
                continue
            out.append(schedule(cot, block))
    return out


def plan_stem(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    cot, block = int(s["cot"]), int(s["block"])
    _check(p, cot, block, device)
    nhwc = p.layout == "nhwc"
    idx = index_type(p.n * p.cin * p.h * p.w + 64, p.n * p.cout * p.oh * p.ow + 64)
    params = {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": block, "cot": cot, "cin": p.cin, "kh": p.kh,
              "kw": p.kw, "stride": p.stride, "pad": p.pad[:2], "dilation": p.dilation, "x_nhwc": nhwc,
              "vec_out": nhwc and p.cout % 8 == 0 and cot % 8 == 0, "unroll_taps": p.kh * p.kw <= 25,
              "has_bias": p.has_bias, "has_residual": p.has_residual, "activation": p.activation}
    out_align = 16 if params["vec_out"] else 0          # NHWC: 8 channels of residual and y at once
    args = (Buf("x"), Buf("w"), *((Buf("bias"),) if p.has_bias else ()),
            *((Buf("residual", align=out_align),) if p.has_residual else ()),
            Buf("y", align=out_align), Scalar("i32" if idx == "int" else "i64", p.pixels),
            *(Scalar("i32", v) for v in (p.cout, p.h, p.w, p.oh, p.ow)), Scalar("f32", p.alpha))
    grid = (ceil_div(p.pixels, block), ceil_div(p.cout, cot))
    return Plan(launches=(Launch.make("conv2d/stem.hip.j2", "conv2d_direct_stem", params, grid, (block,), args),))


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float,
             issue_per_sm: float) -> float:
    """Thread instructions (per tap: C x COT FMAs, C x COT / 4 shared reads, the tap's own
    arithmetic) at a share of the issue rate, or x read once and y (and the residual) once."""
    cot = int(s["cot"])
    threads = p.pixels * ceil_div(p.cout, cot)
    instr = threads * p.kh * p.kw * (p.cin * cot * 1.25 + COST.per_tap)
    compute = instr / (issue_per_sm * device.multiprocessors * COST.issue_eff)
    return launch_s + max(compute, p.io_bytes / (COST.mem_eff * bandwidth))
