"""Depthwise conv2d on NHWC tensors (templates/conv2d/depthwise.hip.j2).

The NCHW kernels would need a transpose each way around an NHWC depthwise layer (MobileNet,
EfficientNet, ConvNeXt run channels_last); this kernel reads and writes NHWC directly, VEC
channels per thread (16-byte accesses when the channel count allows), and is memory bound.
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .conv2d_problem import Conv2dProblem

ALGORITHM = "depthwise_nhwc"
BLOCK = 256


def why_not(p: Conv2dProblem) -> str | None:
    if p.layout != "nhwc":
        return "depthwise_nhwc reads NHWC inputs (channels_last / layout='nhwc')"
    if not (p.groups == p.cin == p.cout):
        return "depthwise_nhwc needs groups = in channels = out channels"
    return None


def vec_width(p: Conv2dProblem) -> int:
    """Channels per thread: one 16-byte access where the channel count divides evenly."""
    best = 16 // p.itemsize
    for v in (best, best // 2, best // 4, 1):
        if v >= 1 and p.cin % v == 0:
            return v
    return 1


def schedule(why: str = "") -> Schedule:
    return Schedule.make(ALGORITHM, why=why, block=BLOCK)


def plan_depthwise(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    vec = vec_width(p)
    taps = p.kh * p.kw
    total = p.n * p.oh * p.ow * (p.cin // vec)
    idx = index_type(p.n * p.h * p.w * p.cin + 64, p.n * p.oh * p.ow * p.cout + 64)
    if ceil_div(total, BLOCK) > 2**31 - 1:
        raise ScheduleError("depthwise_nhwc: grid exceeds the launch limits")
    scalar = "i32" if idx == "int" else "i64"
    ctype = C_TYPE[p.dtype]
    pack = Launch.make("conv2d/layout.hip.j2", "conv2d_depthwise_pack", {"ctype": ctype, "index_type": idx,
                                                                         "block": BLOCK, "stage": "dw_pack"},
                       (ceil_div(taps * p.cin, BLOCK),), (BLOCK,),
                       (Buf("w"), Buf("dw_w"), Scalar(scalar, taps * p.cin), Scalar("i32", p.cin), Scalar("i32", taps)))
    params = {"ctype": ctype, "index_type": idx, "block": BLOCK, "vec": vec, "has_bias": p.has_bias,
              "has_residual": p.has_residual, "activation": p.activation}
    args = (Buf("x"), Buf("dw_w"), *((Buf("bias"),) if p.has_bias else ()),
            *((Buf("residual"),) if p.has_residual else ()), Buf("y"), Scalar(scalar, total),
            *(Scalar("i32", v) for v in (p.cin, p.h, p.w, p.oh, p.ow, p.kh, p.kw, p.stride[0], p.stride[1],
                                         p.pad[0], p.pad[1], p.dilation[0], p.dilation[1])),
            Scalar("f32", p.alpha))
    launch = Launch.make("conv2d/depthwise.hip.j2", "conv2d_depthwise_nhwc", params, (ceil_div(total, BLOCK),),
                         (BLOCK,), args)
    return Plan(launches=(launch,), workspaces=(Workspace("dw_w", taps * p.cin * p.itemsize, persistent=True,
                                                          derived_from=("w",)),), prepare=(pack,))


def estimate(p: Conv2dProblem, device: DeviceInfo, bandwidth: float, launch_s: float, flops_per_sm: float) -> float:
    """Memory bound: x read once (neighbouring taps hit L1), y (and the residual) once; or the
    fp32 FMAs at a third of the rate, whichever is larger."""
    compute = p.flops / (flops_per_sm * device.multiprocessors * 0.33)
    return launch_s + max(p.io_bytes / (0.7 * bandwidth), compute)
