"""The per-channel affine apply y = act((x - k) * a + b) (templates/batch_norm/affine.hip.j2):
batch norm's folded parameters, group norm's split path (per plane) and its NHWC path (per
sample and channel)."""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, ITEMSIZE, Buf, Launch, Scalar, ceil_div, index_type


def affine_launch(kernel: str, dtype: str, numel: int, plane: int, nparams: int, device: DeviceInfo, *,
                  vec: int, unroll: int, block: int, per_plane: bool, coef: str, out: str,
                  streaming: bool, waves: int = 0, activation: str | None = None, alpha: float = 0.0,
                  channels: int = 0, sample_planes: int = 0) -> Launch:
    """y = act((x - k) * a + b) with (k, a, b) per channel (plane % channels), per plane, or per
    (sample, channel) when `sample_planes` (planes per sample) is given."""
    itemsize = ITEMSIZE[dtype]
    if vec < 1 or vec & (vec - 1) or vec * itemsize > 16:
        raise ScheduleError(f"vector of {vec} {dtype} is not a power-of-two access of at most 16 bytes")
    if block > device.max_threads_per_block or block % device.warp_size:
        raise ScheduleError(f"block of {block} threads does not fit {device.name}")
    nvec = numel // vec
    full = max(1, ceil_div(nvec, unroll * block))
    cap = waves * device.multiprocessors * device.resident_blocks(block)
    grid = min(full, cap) if waves else full
    idx = index_type(numel + grid * block * unroll * vec + 16)
    if plane % vec == 0:
        layout = "aligned"
    elif plane == 1 and not per_plane and channels % vec == 0:
        layout = "rowwise"
    else:
        layout = "crossing"
    if sample_planes and layout == "crossing":
        raise ScheduleError(f"per-sample coefficients need whole vectors of channels ({channels} % {vec})")
    # float4 coefficient loads: the vector's channels start at a multiple of 4, and so do the a and b
    # thirds of the coefficient array.
    coef_vec = 4 if layout == "rowwise" and vec % 4 == 0 and nparams % 4 == 0 else 1
    params = {"ctype": C_TYPE[dtype], "index_type": idx, "vec": vec, "unroll": unroll, "block": block,
              "grid_stride": bool(waves) and cap < full, "streaming": streaming, "plane": plane,
              "nch": channels if not per_plane else 0, "per_plane": per_plane, "layout": layout,
              "activation": activation or "none", "sample_planes": sample_planes, "coef_vec": coef_vec}
    wide = "i32" if idx == "int" else "i64"
    args = (Buf("x"), Buf(coef), Buf(out), Scalar(wide, numel), Scalar(wide, nparams), Scalar("f32", alpha))
    return Launch.make("batch_norm/affine.hip.j2", kernel, params, (grid,), (block,), args)
