"""conv2d plans: the kernel launches, workspaces and prepare launches of each algorithm.

Algorithms (schedule.algorithm):
  naive          one thread per output (templates/conv2d/naive.hip.j2)
  direct         shared-memory tiled direct convolution, optional split over input channels
  implicit_gemm  GEMM over im2col indices, weights packed once (prepare), optional split-K
  gemm_1x1       the same GEMM reading a 1x1/stride-1/unpadded input as a plain matrix
  split_k        implicit_gemm / gemm_1x1 with the reduction split across blocks (its own name,
                 so the benchmark can show it beside the unsplit GEMM)
  winograd_2x2   F(2x2,3x3): filter transform once per weight (prepare), input transform,
  winograd_4x4   F(4x4,3x3)  batched GEMM over the alpha^2 points, output transform + epilogue
  (the matrix-core, depthwise, stem, few-channel and few-pixel 1x1 kernels: their own modules,
  conv2d_mma / conv2d_wgmma / conv2d_depthwise / conv2d_stem / conv2d_pointwise / conv2d_gemv)
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from . import conv2d_depthwise as depthwise
from . import conv2d_gemv as gemv
from . import conv2d_mma as mma
from . import conv2d_pointwise as pointwise
from . import conv2d_stem as stem
from . import conv2d_wgmma as wgmma
from . import conv2d_winograd as wino
from .base import C_TYPE, INT32_MAX, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type, round_up
from .conv2d_problem import Conv2dProblem

GEMM_ALGORITHMS = ("implicit_gemm", "gemm_1x1", "split_k")
WINOGRAD_M = {"winograd_2x2": 2, "winograd_4x4": 4}
ALGORITHMS = ("naive", "direct", "implicit_gemm", "gemm_1x1", "split_k", "winograd_2x2", "winograd_4x4",
              mma.ALGORITHM, wgmma.ALGORITHM, depthwise.ALGORITHM, stem.ALGORITHM, pointwise.ALGORITHM,
              gemv.ALGORITHM)
ELEMENTWISE_BLOCK = 256


def _common(p: Conv2dProblem) -> dict[str, Any]:
    return {"ctype": C_TYPE[p.dtype], "has_bias": p.has_bias, "activation": p.activation}


def _index(*element_counts: int) -> str:
    return index_type(*(c + 64 for c in element_counts))


def _bias_args(p: Conv2dProblem) -> tuple[Buf, ...]:
    return (Buf("bias"),) if p.has_bias else ()


def _numel(p: Conv2dProblem) -> tuple[int, int, int]:
    x = p.n * p.cin * p.h * p.w
    w = p.cout * p.cin_g * p.kh * p.kw
    y = p.n * p.cout * p.oh * p.ow
    return x, w, y


def _check_block(device: DeviceInfo, threads: int, shared: int, what: str) -> None:
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"{what}: {threads} threads per block exceed {device.name}'s "
                            f"{device.max_threads_per_block}")
    if shared > device.shared_per_block:
        raise ScheduleError(f"{what}: {shared} bytes of shared memory exceed {device.shared_per_block} per block")


def _check_grid(grid: tuple[int, ...], what: str) -> None:
    if grid[0] > INT32_MAX or any(g > 65535 for g in grid[1:]):
        raise ScheduleError(f"{what}: grid {grid} exceeds the launch limits")


# ---------------------------------------------------------------- naive

def plan_naive(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    block = int(s.get("block", 256))
    _check_block(device, block, 0, "naive")
    x, w, y = _numel(p)
    total = y
    idx = _index(x, w, y)
    params = {**_common(p), "index_type": idx, "block": block}
    args = (Buf("x"), Buf("w"), *_bias_args(p), Buf("y"), Scalar("i32" if idx == "int" else "i64", total),
            *(Scalar("i32", v) for v in (p.cin, p.h, p.w, p.cout, p.oh, p.ow, p.kh, p.kw, p.stride[0],
                                         p.stride[1], p.pad[0], p.pad[1], p.dilation[0], p.dilation[1],
                                         p.cin_g, p.cout_g)),
            Scalar("f32", p.alpha))
    grid = (ceil_div(total, block),)
    _check_grid(grid, "naive")
    return Plan(launches=(Launch.make("conv2d/naive.hip.j2", "conv2d_naive", params, grid, (block,), args),))


# ---------------------------------------------------------------- split-K reduction

def _splitk_launch(p: Conv2dProblem, splits: int, np_: int, idx: str, residual: bool = False,
                   out_nhwc: bool = False) -> Launch:
    """Adds the splits' fp32 partials; residual / NHWC output only for the matrix-core kernel (the
    SIMT plans add a residual in a pass of their own)."""
    params = {**_common(p), "index_type": idx, "block": ELEMENTWISE_BLOCK}
    if residual:
        params["has_residual"] = True
    if out_nhwc:
        params["out_nhwc"] = True
    args = (Buf("partial"), *_bias_args(p), *((Buf("residual"),) if residual else ()), Buf("y"),
            *(Scalar("i32", v) for v in (p.pixels, np_, p.cout, p.oh * p.ow, splits)), Scalar("f32", p.alpha))
    grid = (ceil_div(p.pixels * p.cout, ELEMENTWISE_BLOCK),) if out_nhwc else (ceil_div(p.pixels, ELEMENTWISE_BLOCK),
                                                                               p.cout)
    _check_grid(grid, "split-K reduction")
    return Launch.make("conv2d/splitk.hip.j2", "conv2d_splitk_reduce", params, grid, (ELEMENTWISE_BLOCK,), args)


# ---------------------------------------------------------------- GEMM (implicit, 1x1, split-K)

def gemm_tile(s: Schedule) -> tuple[int, int, int, int, int]:
    return tuple(int(s[k]) for k in ("bm", "bn", "bk", "tm", "tn"))  # type: ignore[return-value]


def _check_tile(bm: int, bn: int, bk: int, tm: int, tn: int, b_vec: int) -> int:
    """Threads of a GEMM tile; ScheduleError if the tile does not divide evenly among them."""
    if tm not in (4, 8) or tn not in (4, 8) or bm % tm or bn % tn or bk not in (4, 8, 16):
        raise ScheduleError(f"GEMM tile {bm}x{bn}x{bk} with {tm}x{tn} per thread is not supported "
                            "(tm, tn in 4, 8; bk in 4, 8, 16)")
    threads = (bm // tm) * (bn // tn)
    cols = bn // b_vec
    rows = threads // cols if threads % cols == 0 else 0
    if not rows or (rows < bk and bk % rows) or (rows > bk and rows % bk):
        raise ScheduleError(f"GEMM tile {bm}x{bn}x{bk}: {threads} threads cannot share the B loads evenly")
    return threads


def _gemm_launch(p: Conv2dProblem | None, device: DeviceInfo, *, ctype: str, idx: str, tile: tuple[int, ...],
                 b_mode: str, pointwise: bool, b_vec: int, epi: str, has_bias: bool, activation: str,
                 ci_check: bool, y_vec: bool, grid: tuple[int, int, int], b_buf: str, a_buf: str, out_buf: str,
                 ints: tuple[int, ...], alpha: float, name: str) -> Launch:
    bm, bn, bk, tm, tn = tile
    threads = _check_tile(bm, bn, bk, tm, tn, b_vec)
    shared = 2 * bk * (bm + bn) * 4
    _check_block(device, threads, shared, name)
    _check_grid(grid, name)
    params = {"ctype": ctype, "index_type": idx, "BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn,
              "threads": threads, "b_mode": b_mode, "pointwise": pointwise, "b_vec": b_vec, "epi": epi,
              "has_bias": has_bias, "activation": activation, "ci_check": ci_check, "y_vec": y_vec}
    args = (Buf(b_buf), Buf(a_buf), *((Buf("bias"),) if has_bias else ()), Buf(out_buf),
            *(Scalar("i32", v) for v in ints), Scalar("f32", alpha))
    return Launch.make("conv2d/gemm.hip.j2", name, params, grid, (threads,), args)


def plan_gemm(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if s.get("math", "fma") != "fma":
        raise ScheduleError(f"conv2d GEMM math '{s.get('math')}' is not built yet (only 'fma'; matrix-core "
                            "kernels are planned)")
    bm, bn, bk, tm, tn = gemm_tile(s)
    pointwise = p.is_pointwise
    if s.algorithm == "gemm_1x1" and not pointwise:
        raise ScheduleError("gemm_1x1 needs a 1x1 kernel, stride 1 and no padding")
    if p.pixels > INT32_MAX - 4 * bn:
        raise ScheduleError(f"{p.pixels} output pixels exceed the GEMM's 32-bit column index")
    m = p.cout_g
    cinp = round_up(p.cin_g, bk)
    ct = cinp // bk
    kt = p.kh * p.kw * ct
    mp = round_up(m, bm)
    splits_wanted = max(1, int(s.get("split_k", 1)))
    kt_per_split = ceil_div(kt, splits_wanted)
    splits = ceil_div(kt, kt_per_split)
    ohw = p.oh * p.ow
    b_vec = 4 if pointwise and ohw % 4 == 0 and s.get("vec", True) else 1
    np_ = round_up(p.pixels, 4)
    x, w, y = _numel(p)
    packed = p.groups * kt * bk * mp
    partial = splits * p.cout * np_ if splits > 1 else 0
    idx = _index(x, w, y, packed, partial)

    pack_params = {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": ELEMENTWISE_BLOCK}
    pack = Launch.make("conv2d/pack.hip.j2", "conv2d_pack_weights", pack_params,
                       (ceil_div(packed, ELEMENTWISE_BLOCK),), (ELEMENTWISE_BLOCK,),
                       (Buf("w"), Buf("packed_w"), Scalar("i32" if idx == "int" else "i64", packed),
                        *(Scalar("i32", v) for v in (mp, kt * bk, cinp, m, p.cin_g, p.kh, p.kw))))
    epi = "dense" if splits > 1 else "conv"
    ints = (p.pixels, m, mp, np_, kt, kt_per_split, p.groups, p.cout, p.cin, p.h, p.w, p.oh, p.ow, p.cin_g, ct,
            p.kw, p.stride[0], p.stride[1], p.pad[0], p.pad[1], p.dilation[0], p.dilation[1])
    gemm = _gemm_launch(p, device, ctype=C_TYPE[p.dtype], idx=idx, tile=(bm, bn, bk, tm, tn), b_mode="conv",
                        pointwise=pointwise, b_vec=b_vec, epi=epi, has_bias=p.has_bias and epi == "conv",
                        activation=p.activation if epi == "conv" else "none", ci_check=p.cin_g % bk != 0,
                        y_vec=ohw % 4 == 0, grid=(ceil_div(p.pixels, bn), mp // bm, p.groups * splits),
                        b_buf="x", a_buf="packed_w", out_buf="y" if epi == "conv" else "partial", ints=ints,
                        alpha=p.alpha, name="conv2d_gemm_1x1" if pointwise else "conv2d_implicit_gemm")
    workspaces = [Workspace("packed_w", packed * 4, persistent=True, derived_from=("w",))]
    launches = [gemm]
    if splits > 1:
        workspaces.append(Workspace("partial", partial * 4))
        launches.append(_splitk_launch(p, splits, np_, idx))
    return Plan(launches=tuple(launches), workspaces=tuple(workspaces), prepare=(pack,))


# ---------------------------------------------------------------- direct

def direct_shared_bytes(p: Conv2dProblem, th: int, tw: int, cot: int, cic: int) -> int:
    iht = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iwt = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    return 4 * cic * (iht * iwt + p.kh * p.kw * cot)


def plan_direct(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    th, tw, pw, cot, cic = (int(s[k]) for k in ("th", "tw", "pw", "cot", "cic"))
    if tw % pw:
        raise ScheduleError(f"direct: tile width {tw} is not a multiple of {pw} pixels per thread")
    threads = th * (tw // pw)
    cic = min(cic, p.cin_g)
    cot = min(cot, p.cout_g)
    _check_block(device, threads, direct_shared_bytes(p, th, tw, cot, cic), "direct")
    per_split = round_up(ceil_div(p.cin_g, max(1, int(s.get("splits", 1)))), cic)
    splits = ceil_div(p.cin_g, per_split)
    tiles_h, tiles_w = ceil_div(p.oh, th), ceil_div(p.ow, tw)
    chunks = ceil_div(p.cout_g, cot)
    grid = (tiles_h * tiles_w, p.groups * chunks, p.n * splits)
    _check_grid(grid, "direct")
    np_ = round_up(p.pixels, 4)
    x, w, y = _numel(p)
    partial = splits * p.cout * np_ if splits > 1 else 0
    idx = _index(x, w, y, partial)
    epi = "dense" if splits > 1 else "conv"
    params = {"ctype": C_TYPE[p.dtype], "index_type": idx, "has_bias": p.has_bias and epi == "conv",
              "activation": p.activation if epi == "conv" else "none", "epi": epi, "TH": th, "TW": tw, "PW": pw,
              "COT": cot, "CIC": cic, "KH": p.kh, "KW": p.kw, "SH": p.stride[0], "SW": p.stride[1],
              "DH": p.dilation[0], "DW": p.dilation[1]}
    args = (Buf("x"), Buf("w"), *(_bias_args(p) if epi == "conv" else ()), Buf("y" if epi == "conv" else "partial"),
            *(Scalar("i32", v) for v in (p.cin, p.h, p.w, p.oh, p.ow, p.cout, p.cin_g, p.cout_g, p.pad[0],
                                         p.pad[1], tiles_w, chunks, splits, per_split, np_)),
            Scalar("f32", p.alpha))
    launches = [Launch.make("conv2d/direct.hip.j2", "conv2d_direct", params, grid, (threads,), args)]
    workspaces = []
    if splits > 1:
        workspaces.append(Workspace("partial", partial * 4))
        launches.append(_splitk_launch(p, splits, np_, idx))
    return Plan(launches=tuple(launches), workspaces=tuple(workspaces))


# ---------------------------------------------------------------- Winograd

def _nonzero(matrix: list[list[float]]) -> tuple[tuple[tuple[int, float], ...], ...]:
    return tuple(tuple((k, float(c)) for k, c in enumerate(row) if c != 0) for row in matrix)


def winograd_sizes(p: Conv2dProblem, m: int) -> tuple[int, int, int]:
    tiles_h, tiles_w = ceil_div(p.oh, m), ceil_div(p.ow, m)
    return tiles_h, tiles_w, p.n * tiles_h * tiles_w


def plan_winograd(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if not p.winograd_ok:
        raise ScheduleError("Winograd F(m x m, 3 x 3) needs a 3x3 kernel, stride 1, dilation 1 and groups 1")
    m = WINOGRAD_M[s.algorithm]
    a = wino.alpha(m)
    mats = wino.MATRICES[m]
    bm, bn, bk, tm, tn = gemm_tile(s)
    tiles_h, tiles_w, tiles = winograd_sizes(p, m)
    tp = round_up(tiles, bn)
    cinp = round_up(p.cin, bk)
    mp = round_up(p.cout, bm)
    if max(tp, cinp * mp) > INT32_MAX:
        raise ScheduleError("Winograd workspaces exceed 32-bit tile indices")
    x, w, y = _numel(p)
    u_elems, v_elems, m_elems = a * a * cinp * mp, a * a * cinp * tp, a * a * p.cout * tp
    idx = _index(x, w, y, u_elems, v_elems, m_elems)
    base = {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": ELEMENTWISE_BLOCK, "m": m, "alpha_n": a,
            "has_bias": p.has_bias, "activation": p.activation}
    filt = Launch.make("conv2d/winograd.hip.j2", f"conv2d_winograd{m}_filter",
                       {**base, "stage": "filter", "G_nz": _nonzero(mats["G"])},
                       (ceil_div(cinp * mp, ELEMENTWISE_BLOCK),), (ELEMENTWISE_BLOCK,),
                       (Buf("w"), Buf("wino_u"), *(Scalar("i32", v) for v in (p.cin, p.cout, cinp, mp))))
    inp = Launch.make("conv2d/winograd.hip.j2", f"conv2d_winograd{m}_input",
                      {**base, "stage": "input", "BT_nz": _nonzero(mats["BT"])},
                      (ceil_div(cinp * tp, ELEMENTWISE_BLOCK),), (ELEMENTWISE_BLOCK,),
                      (Buf("x"), Buf("wino_v"), *(Scalar("i32", v) for v in (p.cin, p.h, p.w, cinp, tiles_h,
                                                                             tiles_w, tiles, tp, p.pad[0], p.pad[1]))))
    ints = (tp, p.cout, mp, tp, cinp // bk, cinp // bk, 1, p.cout) + (0,) * 14
    gemm = _gemm_launch(None, device, ctype=C_TYPE[p.dtype], idx=idx, tile=(bm, bn, bk, tm, tn), b_mode="matrix",
                        pointwise=False, b_vec=4, epi="dense", has_bias=False, activation="none", ci_check=False,
                        y_vec=False, grid=(tp // bn, mp // bm, a * a), b_buf="wino_v", a_buf="wino_u",
                        out_buf="wino_m", ints=ints, alpha=0.0, name=f"conv2d_winograd{m}_gemm")
    out = Launch.make("conv2d/winograd.hip.j2", f"conv2d_winograd{m}_output",
                      {**base, "stage": "output", "AT_nz": _nonzero(mats["AT"]), "y_vec": p.ow % m == 0},
                      (ceil_div(p.cout * tiles, ELEMENTWISE_BLOCK),), (ELEMENTWISE_BLOCK,),
                      (Buf("wino_m"), *_bias_args(p), Buf("y"),
                       *(Scalar("i32", v) for v in (p.cout, p.oh, p.ow, tiles_h, tiles_w, tiles, tp)),
                       Scalar("f32", p.alpha)))
    for launch in (filt, inp, out):
        _check_grid(launch.grid, launch.kernel)
    workspaces = (Workspace("wino_u", u_elems * 4, persistent=True, derived_from=("w",)),
                  Workspace("wino_v", v_elems * 4), Workspace("wino_m", m_elems * 4))
    return Plan(launches=(inp, gemm, out), workspaces=workspaces, prepare=(filt,))


def _residual_launch(p: Conv2dProblem) -> Launch:
    total = p.n * p.cout * p.oh * p.ow
    idx = _index(total)
    params = {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": ELEMENTWISE_BLOCK, "activation": p.activation}
    grid = (ceil_div(total, ELEMENTWISE_BLOCK),)
    _check_grid(grid, "residual")
    return Launch.make("conv2d/residual.hip.j2", "conv2d_residual", params, grid, (ELEMENTWISE_BLOCK,),
                       (Buf("residual"), Buf("y"), Scalar("i32" if idx == "int" else "i64", total),
                        Scalar("f32", p.alpha)))


def _plan_simt(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if s.algorithm == "naive":
        return plan_naive(p, s, device)
    if s.algorithm == "direct":
        return plan_direct(p, s, device)
    if s.algorithm in GEMM_ALGORITHMS:
        return plan_gemm(p, s, device)
    if s.algorithm in WINOGRAD_M:
        return plan_winograd(p, s, device)
    raise ScheduleError(f"conv2d has no algorithm '{s.algorithm}' (choose from {', '.join(ALGORITHMS)})")


def weights_from_ohwi(p: Conv2dProblem, inner: Plan) -> Plan:
    """channels_last weights (OIHW stored O, H, W, I): transposed once into an OIHW workspace derived
    from w (redone only when w changes), which the plan made for OIHW weights then reads."""
    total = p.cout * p.cin_g * p.kh * p.kw
    to_oihw = _layout_launch(p, "to_nchw", "conv2d_weights_to_oihw", (Buf("w"), Buf("w_oihw")), total,
                             (p.cin_g, p.kh * p.kw))
    names = {"w": "w_oihw"}
    oihw = Workspace("w_oihw", total * p.itemsize, persistent=True, derived_from=("w",))
    return Plan(tuple(_renamed(launch, names) for launch in inner.launches), (oihw, *inner.workspaces),
                (to_oihw, *(_renamed(launch, names) for launch in inner.prepare)))


def residual_in_x_format(p: Conv2dProblem, inner: Plan) -> Plan:
    """A residual stored in the other memory format than x (NCHW beside an NHWC x, or the reverse): copied
    into x's format (a workspace, every call) first, which the plan made for a residual like x then reads."""
    total = p.n * p.cout * p.oh * p.ow
    bufs = (Buf("residual"), Buf("residual_x"))
    if p.layout == "nhwc":                  # NCHW -> NHWC: the from_nchw pass without residual or activation
        copy = _layout_launch(p, "from_nchw", "conv2d_residual_to_nhwc", bufs, total, (p.cout, p.oh * p.ow),
                              (Scalar("f32", 0.0),), has_residual=False, activation="none")
    else:                                   # NHWC -> NCHW
        copy = _layout_launch(p, "to_nchw", "conv2d_residual_to_nchw", bufs, total, (p.cout, p.oh * p.ow))
    names = {"residual": "residual_x"}
    return Plan((copy, *(_renamed(launch, names) for launch in inner.launches)),
                (*inner.workspaces, Workspace("residual_x", total * p.itemsize)),
                tuple(_renamed(launch, names) for launch in inner.prepare))


def _renamed(launch: Launch, names: dict[str, str]) -> Launch:
    args = tuple(replace(a, name=names.get(a.name, a.name)) if isinstance(a, Buf) else a for a in launch.args)
    return replace(launch, args=args)


def _layout_launch(p: Conv2dProblem, stage: str, kernel: str, bufs: tuple[Buf, ...], total: int,
                   ints: tuple[int, ...], tail: tuple[Scalar, ...] = (), **params: Any) -> Launch:
    """One thread per element of a layout change (templates/conv2d/layout.hip.j2)."""
    idx = _index(total)
    grid = (ceil_div(total, ELEMENTWISE_BLOCK),)
    _check_grid(grid, kernel)
    args = (*bufs, Scalar("i32" if idx == "int" else "i64", total), *(Scalar("i32", v) for v in ints), *tail)
    return Launch.make("conv2d/layout.hip.j2", kernel, {"ctype": C_TYPE[p.dtype], "index_type": idx,
                                                       "block": ELEMENTWISE_BLOCK, "stage": stage, **params},
                       grid, (ELEMENTWISE_BLOCK,), args)


def _plan_via_nchw(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    """An NHWC problem on a kernel that reads NCHW: x transposed to NCHW, the NCHW plan (without
    residual and activation when there is a residual), then y = act(t + residual) back to NHWC."""
    res = p.has_residual
    inner_p = replace(p, layout="", has_residual=False, activation="none" if res else p.activation,
                      alpha=0.0 if res else p.alpha)
    inner = _plan_simt(inner_p, s, device)
    names = {"x": "x_nchw", "y": "y_nchw"}
    x_elems, y_elems = p.n * p.cin * p.h * p.w, p.n * p.cout * p.oh * p.ow
    to_nchw = _layout_launch(p, "to_nchw", "conv2d_to_nchw", (Buf("x"), Buf("x_nchw")), x_elems, (p.cin, p.h * p.w))
    back = _layout_launch(p, "from_nchw", "conv2d_from_nchw",
                          (Buf("y_nchw"), *((Buf("residual"),) if res else ()), Buf("y")), y_elems,
                          (p.cout, p.oh * p.ow), (Scalar("f32", p.alpha),), has_residual=res,
                          activation=p.activation if res else "none")
    launches = (to_nchw, *(_renamed(l, names) for l in inner.launches), back)
    workspaces = inner.workspaces + (Workspace("x_nchw", x_elems * p.itemsize),
                                     Workspace("y_nchw", y_elems * p.itemsize))
    return Plan(launches=launches, workspaces=workspaces, prepare=tuple(_renamed(l, names) for l in inner.prepare))


def plan(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if p.n == 0:
        return Plan(launches=())
    if s.algorithm == mma.ALGORITHM:
        return mma.plan_mma(p, s, device)
    if s.algorithm == wgmma.ALGORITHM:
        return wgmma.plan_wgmma(p, s, device)
    if s.algorithm == depthwise.ALGORITHM:
        return depthwise.plan_depthwise(p, s, device)
    if s.algorithm == stem.ALGORITHM:
        return stem.plan_stem(p, s, device)
    if s.algorithm == pointwise.ALGORITHM:
        return pointwise.plan_pointwise(p, s, device)
    if s.algorithm == gemv.ALGORITHM:
        return gemv.plan_gemv(p, s, device)
    if p.layout == "nhwc":
        return _plan_via_nchw(p, s, device)
    if not p.has_residual:
        return _plan_simt(p, s, device)
    # The SIMT kernels write conv + bias; a second kernel adds the residual and activates.
    inner = _plan_simt(replace(p, has_residual=False, activation="none", alpha=0.0), s, device)
    return Plan(launches=inner.launches + (_residual_launch(p),), workspaces=inner.workspaces,
                prepare=inner.prepare)
