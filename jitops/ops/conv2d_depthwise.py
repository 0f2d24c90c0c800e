"""Depthwise conv2d (groups = in channels = out channels) on NCHW or NHWC tensors, read and written
in place (templates/conv2d/depthwise.hip.j2).

MobileNet, EfficientNet and ConvNeXt spend a large share of their convolution time here; the
layers are memory bound (KH * KW multiply-adds per element), so what matters is loading each
input element once per thread rather than once per tap: the kernel geometry is compiled in and a
thread computes OHT x OWT adjacent outputs (and, NHWC, VEC channels: 16-byte accesses).
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type, vector_buf
from .conv2d_problem import Conv2dProblem

ALGORITHM = "depthwise"
BLOCKS = (128, 256)
OUTPUT_TILES = ((1, 1), (1, 2), (1, 4), (2, 2), (1, 8), (2, 4), (4, 4))   # (rows, columns) per thread
MAX_SPAN = 16                   # input columns a thread keeps per row: (OWT - 1) * SW + (KW - 1) * DW + 1
MAX_ACCUMULATORS = 64           # OHT * OWT * VEC fp32 sums: 128 (NHWC fp16, 4 x 4 tiles) spill on sm_90 (NVRTC 13.5)


def why_not(p: Conv2dProblem) -> str | None:
    if not (p.groups == p.cin == p.cout):
        return "the depthwise kernel needs groups = in channels = out channels"
    return None


def vec_width(p: Conv2dProblem) -> int:
    """NHWC channels per thread: one 16-byte access where the channel count divides evenly; NCHW: 1."""
    if p.layout != "nhwc":
        return 1
    best = 16 // p.itemsize
    for v in (best, best // 2, best // 4, 1):
        if v >= 1 and p.cin % v == 0:
            return v
    return 1


def span(p: Conv2dProblem, rows: int, cols: int) -> tuple[int, int]:
    """Input rows and columns one thread's OHT x OWT outputs read."""
    return ((rows - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1,
            (cols - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1)


def schedule(rows: int = 1, cols: int = 1, block: int = 256, why: str = "") -> Schedule:
    return Schedule.make(ALGORITHM, why=why, block=block, oht=rows, owt=cols)


def candidates(p: Conv2dProblem) -> list[Schedule]:
    """Output tiles whose input columns fit MAX_SPAN, whose sums fit MAX_ACCUMULATORS and that do
    not run far past the output, in both block sizes."""
    out = []
    for rows, cols in OUTPUT_TILES:
        if (span(p, rows, cols)[1] > MAX_SPAN or rows * cols * vec_width(p) > MAX_ACCUMULATORS
                or (cols > 1 and cols > 2 * p.ow) or (rows > 1 and rows > 2 * p.oh)):
            continue
        out += [schedule(rows, cols, block) for block in BLOCKS]
    return out or [schedule()]


# The output tile (rows, columns) per thread by layout, stride and output width (<= 7, <= 14, <= 28,
# wider), from the H100 sweep of 2026-11-26 (scripts/device_conv2d_depthwise.py: every tile on the 25
# depthwise layers of MobileNet-V3-L, EfficientNet-B0 and ConvNeXt-T at batch 8, fp16 / bf16 / fp32):
# the tile with the least summed log time over each bucket's layers. NCHW stays within 1.02x of the
# fastest tile in every bucket; NHWC wants fewer outputs per thread where a thread already holds 8
# channels (16-bit types) than where it holds 4 (fp32): registers, not loads, bound it there.
NCHW_TILES = {1: ((1, 4), (2, 2), (4, 4), (4, 4)), 2: ((1, 4), (1, 2), (2, 2), (2, 2))}
NHWC_TILES = {(1, 8): ((1, 1), (1, 2), (1, 4), (2, 2)), (2, 8): ((1, 1), (1, 1), (1, 2), (1, 2)),
              (1, 4): ((1, 8), (1, 8), (2, 4), (4, 4)), (2, 4): ((2, 2), (1, 2), (2, 2), (2, 4))}


def heuristic(p: Conv2dProblem) -> Schedule:
    """The measured tile for the layer's layout, stride and output width, shrunk while it reads
    more than MAX_SPAN input columns or covers far more than the output."""
    width = 0 if p.ow <= 7 else 1 if p.ow <= 14 else 2 if p.ow <= 28 else 3
    stride = 1 if p.stride[1] == 1 else 2
    if p.layout == "nhwc":
        rows, cols = NHWC_TILES[(stride, 8 if vec_width(p) >= 8 else 4)][width]
    else:
        rows, cols = NCHW_TILES[stride][width]
    while cols > 1 and (span(p, rows, cols)[1] > MAX_SPAN or cols > 2 * p.ow):
        cols //= 2
    while rows > 1 and rows > 2 * p.oh:
        rows //= 2
    return schedule(rows, cols, 128, why=f"depthwise {p.kh}x{p.kw} stride {p.stride[1]}, {p.layout or 'nchw'}: "
                                         f"{rows} x {cols} outputs per thread (measured per output width)")


def plan_depthwise(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    rows, cols, block = int(s.get("oht", 1)), int(s.get("owt", 1)), int(s.get("block", 256))
    if rows < 1 or cols < 1 or span(p, rows, cols)[1] > MAX_SPAN:
        raise ScheduleError(f"depthwise: {rows} x {cols} outputs per thread read more than {MAX_SPAN} input "
                            f"columns for a {p.kh}x{p.kw} kernel (stride {p.stride[1]}, dilation {p.dilation[1]})")
    if block > device.max_threads_per_block or block % device.warp_size:
        raise ScheduleError(f"depthwise: block={block} must be a multiple of the warp ({device.warp_size}) "
                            f"up to {device.max_threads_per_block}")
    vec = vec_width(p)
    nhwc = p.layout == "nhwc"
    total = p.n * ceil_div(p.oh, rows) * ceil_div(p.ow, cols) * (p.cin // vec)
    idx = index_type(p.n * p.h * p.w * p.cin + 64, p.n * p.oh * p.ow * p.cout + 64, total + block)
    if ceil_div(total, block) > 2**31 - 1:
        raise ScheduleError("depthwise: grid exceeds the launch limits")
    scalar = "i32" if idx == "int" else "i64"
    ctype = C_TYPE[p.dtype]
    params = {"ctype": ctype, "index_type": idx, "block": block, "vec": vec, "layout": "nhwc" if nhwc else "nchw",
              "kh": p.kh, "kw": p.kw, "sh": p.stride[0], "sw": p.stride[1], "dh": p.dilation[0],
              "dw": p.dilation[1], "ph": p.pad[0], "pw": p.pad[1], "oht": rows, "owt": cols,
              "has_bias": p.has_bias, "has_residual": p.has_residual, "activation": p.activation,
              "row_vectors": not nhwc and cols > 1 and p.ow % cols == 0 and cols * p.itemsize <= 16}
    weights = Buf("dw_w") if nhwc else Buf("w")
    # Vectors with no unaligned path: NHWC, `vec` channels of x, bias, residual and y; NCHW with
    # row_vectors, a thread's row of `cols` outputs (residual and y).
    chans = vec if nhwc else 1
    row = cols if params["row_vectors"] else chans
    args = (vector_buf("x", chans, p.itemsize), weights,
            *((vector_buf("bias", chans, p.itemsize),) if p.has_bias else ()),
            *((vector_buf("residual", row, p.itemsize),) if p.has_residual else ()),
            vector_buf("y", row, p.itemsize), Scalar(scalar, total),
            *(Scalar("i32", v) for v in (p.cin, p.h, p.w, p.oh, p.ow)), Scalar("f32", p.alpha))
    launch = Launch.make("conv2d/depthwise.hip.j2", "conv2d_depthwise", params, (ceil_div(total, block),),
                         (block,), args)
    if not nhwc:                # [C][KH][KW] as the weights come: no packing
        return Plan(launches=(launch,))
    taps = p.kh * p.kw
    pack = Launch.make("conv2d/layout.hip.j2", "conv2d_depthwise_pack", {"ctype": ctype, "index_type": idx,
                                                                         "block": 256, "stage": "dw_pack"},
                       (ceil_div(taps * p.cin, 256),), (256,),
                       (Buf("w"), Buf("dw_w"), Scalar(scalar, taps * p.cin), Scalar("i32", p.cin), Scalar("i32", taps)))
    return Plan(launches=(launch,), workspaces=(Workspace("dw_w", taps * p.cin * p.itemsize, persistent=True,
                                                          derived_from=("w",)),), prepare=(pack,))


def estimate(p: Conv2dProblem, device: DeviceInfo, bandwidth: float, launch_s: float, flops_per_sm: float) -> float:
    """Memory bound: x read once (neighbouring threads' spans overlap in L1), y (and the residual)
    once; or the fp32 FMAs at a third of the rate, whichever is larger."""
    compute = p.flops / (flops_per_sm * device.multiprocessors * 0.33)
    return launch_s + max(p.io_bytes / (0.7 * bandwidth), compute)
