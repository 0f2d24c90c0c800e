"""conv2d on the matrix cores: implicit GEMM with NHWC activations (templates/conv2d/mma.hip.j2).

GEMM M = output pixels (N * OH * OW), N = output channels of a group, K = taps x channels with
channels innermost. The weights are packed once per weight tensor to [Cout][KH][KW][Cgp] (a
prepare launch into a derived workspace); an NCHW input is copied to NHWC per call (channels
rounded up to 8 with zeros, so every load is a 16-byte chunk inside one tap); the epilogue writes
y in the input's memory format, with bias, residual and activation fused.

Tiles (BM x BN x BK, WM x WN warps, pipeline stages) come from `TILES`; `estimate` is the cost
model the heuristic compares against the SIMT kernels (conv2d_cost). The main loop is one
function of the template, so a wgmma loop can take its place under the same plan and epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, INT32_MAX, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .conv2d_problem import Conv2dProblem

ALGORITHM = "implicit_gemm_mma"
DTYPES = ("float16", "bfloat16", "float32")    # fp32 only with precision "tf32" / "3xtf32"
LAYOUT_BLOCK = 256
# (bm, bn, bk, wm, wn, stages): the tuning space; 64x64 warp tiles first (the most math per load).
TILES = ((128, 128, 32, 2, 2, 4), (128, 128, 64, 2, 2, 3), (128, 256, 32, 2, 4, 3), (256, 128, 32, 4, 2, 3),
         (128, 64, 32, 2, 2, 4), (128, 64, 64, 2, 2, 3), (64, 128, 32, 2, 2, 4), (64, 128, 64, 2, 2, 3),
         (64, 64, 32, 2, 2, 4), (64, 64, 64, 2, 2, 3), (128, 32, 32, 4, 1, 4), (64, 32, 32, 2, 1, 4))
# fp32 (TF32 products): BK in floats (16 or 32 = 64 or 128 bytes of a row); 3xtf32 keeps to warp
# tiles of at most 64 x 32 (its split operands need the registers). 128x128x32 with 2x2 warps
# spills on sm_90 in tf32 (136 bytes, ptxas): not in the space.
TILES_F32 = ((128, 128, 32, 2, 4, 3), (128, 128, 16, 2, 2, 4), (128, 64, 32, 2, 2, 3),
             (64, 128, 32, 2, 2, 3), (64, 64, 32, 2, 2, 4), (64, 64, 16, 2, 2, 4), (128, 32, 32, 4, 1, 4),
             (64, 32, 32, 2, 1, 4))


@dataclass(frozen=True)
class MmaCost:
    """Constants of `estimate`, fitted by scripts/conv2d_mma_fit.py to an H100 sweep of every
    candidate (docs/conv2d.md says how well the fit ranks them)."""

    # Fraction of the multiprocessor's dense fp16 rate each tile sustains (mma.sync); fitted to
    # 2739 timed candidates on 108 problems, H100, 2026-11-23 (rms error 0.127 in log time).
    tile_rate: dict = field(default_factory=lambda: {
        (128, 128, 32, 2, 2): 0.322, (128, 128, 64, 2, 2): 0.268, (128, 256, 32, 2, 4): 0.445,
        (256, 128, 32, 4, 2): 0.421, (128, 64, 32, 2, 2): 0.247, (128, 64, 64, 2, 2): 0.239,
        (64, 128, 32, 2, 2): 0.240, (64, 128, 64, 2, 2): 0.236, (64, 64, 32, 2, 2): 0.167,
        (64, 64, 64, 2, 2): 0.189, (128, 32, 32, 4, 1): 0.155, (64, 32, 32, 2, 1): 0.105})
    overhead_k: float = 110.7      # prologue + epilogue of a block, in K elements of its tile
    occ_floor: float = 0.785       # rate with one block per multiprocessor, of the rate with two or more
    split_s: float = 1.36e-6       # the split-K reduction launch
    split_eff: float = 0.688       # its bytes, of the copy bandwidth
    # fp32 on the matrix cores: time per flop against the fp16 tile of the same bytes per row.
    # Nominally 2 (TF32 runs at half the fp16 rate) and 6 (three products). On 76 problems timed
    # on an H100 (2026-11-23: 10 benchmark problems, 66 torchvision layers) measured / estimated
    # time fits 3.35 and 5.03 (the kernel is bound by loads and barriers more than by products);
    # the choice against the exact kernels (modelled on an H200) loses least total time at 1.4x
    # and 2x that: 1.05x / 1.07x the time of always picking the faster (1.08x / 1.08x at the time
    # fit). scripts/conv2d_tf32_fit.py reproduces both fits.
    fp32_math: dict = field(default_factory=lambda: {"tf32": 4.7, "3xtf32": 10.0})


# Registers per thread by warp tile (ptxas, sm_90), for residency.
WARP_TILE_REGS = {(64, 64): 250, (64, 32): 160, (32, 64): 165, (32, 32): 110}


def mma_schedule(bm: int, bn: int, bk: int, wm: int, wn: int, stages: int, split_k: int = 1,
                 why: str = "", a_nchw: bool = False) -> Schedule:
    extra = {"a_nchw": 1} if a_nchw else {}
    return Schedule.make(ALGORITHM, why=why, bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, stages=stages, split_k=split_k,
                         math="mma", **extra)


@dataclass(frozen=True)
class WindowRows:
    """K and the padded input of the window-rows GEMM (wgmma.hip.j2 `window_rows`, for inputs of at
    most 4 channels: RGB stems). A window row is rk elements: its KW pixels of 4 channels, padded to a
    power-of-two count of 16-byte chunks (a pixel pair in 16 bits, one pixel in fp32); K is KH such
    rows, padded to kp. The input is copied, zero-padded, to [N][hp][wp][4] so that every chunk the
    GEMM reads lies inside it and starts on 16 bytes (16-bit: with an even horizontal stride and wp
    even)."""

    rk: int
    kp: int
    hp: int
    wp: int


def window_rows_why_not(p: Conv2dProblem) -> str | None:
    """Why the window-rows GEMM cannot run this problem (device aside), or None."""
    tf32 = p.dtype == "float32" and p.precision == "tf32"
    if p.dtype not in ("float16", "bfloat16") and not tf32:
        return f"the window-rows GEMM takes float16, bfloat16 or float32 with precision 'tf32' (got {p.dtype})"
    if p.groups != 1 or p.cin > 4:
        return f"the window-rows GEMM takes one group of at most 4 input channels (got {p.groups} x {p.cin_g})"
    if p.is_pointwise:      # wgmma.hip.j2 reads a pointwise problem's K as channels, not as window rows
        return "the window-rows GEMM takes a filter wider than 1x1 at stride 1 (a pointwise problem has no window)"
    if p.dilation != (1, 1) or (p.stride[1] % 2 and not tf32) or p.kw > (8 if tf32 else 16):
        return ("the window-rows GEMM needs no dilation, an even horizontal stride (16-bit) and KW <= 16 (8 in "
                f"fp32) (got dilation {p.dilation}, stride {p.stride}, KW {p.kw})")
    return None


def window_rows(p: Conv2dProblem, bk: int = 64) -> WindowRows:
    per_chunk = 2 if p.itemsize == 2 else 1            # pixels of 4 channels in 16 bytes
    chunks = 1
    while chunks * per_chunk < p.kw:
        chunks *= 2
    wp = (p.ow - 1) * p.stride[1] + chunks * per_chunk
    rk = 4 * per_chunk * chunks
    return WindowRows(rk=rk, kp=ceil_div(p.kh * rk, bk) * bk, hp=(p.oh - 1) * p.stride[0] + p.kh, wp=wp + wp % 2)


def is_window_rows(s: Schedule) -> bool:
    return bool(int(s.get("window_rows", 0)))


def splits_of(p: Conv2dProblem, s: Schedule) -> tuple[int, int]:
    """(splits, K tiles per split) as planned: no split leaves a block without K tiles."""
    kp = window_rows(p, int(s["bk"])).kp if is_window_rows(s) else k_padded(p, int(s["bk"]))
    kt = kp // int(s["bk"])
    per = ceil_div(kt, max(1, int(s.get("split_k", 1))))
    return ceil_div(kt, per), per


def tile_of(s: Schedule) -> tuple[int, int, int, int, int, int]:
    return tuple(int(s[k]) for k in ("bm", "bn", "bk", "wm", "wn", "stages"))  # type: ignore[return-value]


def why_not(p: Conv2dProblem) -> str | None:
    """Why the matrix-core kernel cannot run this problem (device aside), or None."""
    if p.dtype not in DTYPES:
        return f"matrix-core conv2d takes {', '.join(DTYPES)} (got {p.dtype})"
    if p.dtype == "float32" and p.precision == "highest":
        return "fp32 with precision 'highest' keeps the exact fp32 kernels (precision='tf32' or '3xtf32' allows these)"
    if p.groups > 1 and p.cin_g % 8:
        return f"grouped matrix-core conv2d needs a multiple of 8 input channels per group (got {p.cin_g})"
    return None


def channels(p: Conv2dProblem) -> tuple[int, int]:
    """(Cs, Cgp): channels per NHWC pixel and per group and tap in K (each a multiple of 8)."""
    if p.groups == 1:
        cgp = ceil_div(p.cin, 8) * 8
        return cgp, cgp
    return p.cin, p.cin_g


def reads_nchw(s: Schedule) -> bool:
    """Whether the schedule reads an NCHW input in place: mma.sync's `a_nchw` or the wgmma 1x1
    kernel's `b_nchw` (no NHWC copy)."""
    return bool(int(s.get("a_nchw", 0))) or bool(int(s.get("b_nchw", 0)))


def a_channels(p: Conv2dProblem, s: Schedule) -> int:
    """Channels of the A rows the GEMM reads: the input's own with `a_nchw` (rows of H * W pixels),
    else those of the (possibly padded) NHWC copy."""
    return p.cin if reads_nchw(s) else channels(p)[0]


def needs_nhwc_copy(p: Conv2dProblem, s: Schedule | None = None) -> bool:
    """An NCHW input, or NHWC whose channels are not a multiple of 8, is copied to padded NHWC
    (not by an `a_nchw` schedule, which reads NCHW itself)."""
    if s is not None and reads_nchw(s):
        return False
    return p.layout != "nhwc" or channels(p)[0] != p.cin


def nchw_direct(p: Conv2dProblem) -> bool:
    """Whether the GEMM can read this NCHW input in place (`a_nchw`): 1x1, stride 1, no padding,
    one group, 16-bit, H * W a multiple of 4 (chunks of 8 or 4 pixels never straddle two images)."""
    return (p.layout != "nhwc" and p.is_pointwise and p.groups == 1 and p.dtype in ("float16", "bfloat16")
            and (p.h * p.w) % 4 == 0)


def nchw_chunk(p: Conv2dProblem) -> int:
    """Pixels per `a_nchw` load: 8 (16 bytes) where H * W allows, else 4 (8 bytes)."""
    return 8 if (p.h * p.w) % 8 == 0 else 4


def shared_bytes(bm: int, bn: int, bk: int, stages: int, itemsize: int = 2, a_nchw: bool = False) -> int:
    """Pipeline buffers (rows padded by 16 bytes; an `a_nchw` A stage is [bk][bm + 8]) or the fp32
    epilogue tile, whichever is larger."""
    pad = 16 // itemsize
    a = bk * (bm + pad) if a_nchw else bm * (bk + pad)
    return max(stages * (a + bn * (bk + pad)) * itemsize, epilogue_bytes(bm, bn))


def epilogue_bytes(bm: int, bn: int) -> int:
    """The fp32 tile of the epilogue: [bm][bn + 8] for NHWC output, [bn][bm + 4] for NCHW."""
    return max(bm * (bn + 8), bn * (bm + 4)) * 4


def tiles_for(p: Conv2dProblem) -> tuple[tuple[int, int, int, int, int, int], ...]:
    return TILES_F32 if p.dtype == "float32" else TILES


def _check(p: Conv2dProblem, tile: tuple[int, ...], device: DeviceInfo, a_nchw: bool = False) -> int:
    """Threads per block; ScheduleError when the tile cannot run here."""
    reason = why_not(p)
    if reason:
        raise ScheduleError(reason)
    if a_nchw and not nchw_direct(p):
        raise ScheduleError("a_nchw reads an NCHW input in place: 1x1, stride 1, no padding, one group, "
                            "fp16 / bf16 and H * W a multiple of 4 only")
    if not device.matrix_cores:
        raise ScheduleError(f"{device.name} has no matrix cores usable from jitops templates")
    bm, bn, bk, wm, wn, stages = tile
    threads = wm * wn * device.warp_size
    f32 = p.dtype == "float32"
    kc = bk // (4 if f32 else 8)
    if bk not in ((16, 32) if f32 else (32, 64)) or stages < 2 or bm % (16 * wm) or bn % (16 * wn):
        raise ScheduleError(f"mma tile {bm}x{bn}x{bk} with {wm}x{wn} warps, {stages} stages is not supported")
    if p.precision == "3xtf32" and (bm // wm) * (bn // wn) > 64 * 32:
        raise ScheduleError(f"3xtf32 mma tile {bm}x{bn}: warp tiles above 64x32 run out of registers")
    step = threads // kc
    if threads % kc or bm % step or bn % step:
        raise ScheduleError(f"mma tile {bm}x{bn}x{bk}: {threads} threads cannot share the loads evenly")
    if a_nchw:
        chunks_per_row = bm // nchw_chunk(p)          # of one channel row of the A tile
        if threads % chunks_per_row or bk % (threads // chunks_per_row):
            raise ScheduleError(f"mma tile {bm}x{bn}x{bk}: {threads} threads cannot share NCHW chunks evenly")
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"mma tile: {threads} threads exceed {device.max_threads_per_block}")
    smem = shared_bytes(bm, bn, bk, stages, p.itemsize, a_nchw)
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"mma tile {bm}x{bn}x{bk}x{stages}: {smem} bytes of shared "
                            f"memory exceed {device.shared_per_block_optin} on {device.name}")
    return threads


def k_padded(p: Conv2dProblem, bk: int) -> int:
    return ceil_div(p.kh * p.kw * channels(p)[1], bk) * bk


def plan_mma(p: Conv2dProblem, s: Schedule, device: DeviceInfo) -> Plan:
    if is_window_rows(s):       # plan_around and splits_of would lay out K as window rows mma.hip.j2 cannot read
        raise ScheduleError("window_rows is a parameter of implicit_gemm_wgmma (sm_90), not of implicit_gemm_mma")
    tile = tile_of(s)
    bm, bn, bk, wm, wn, stages = tile
    a_nchw = reads_nchw(s)
    threads = _check(p, tile, device, a_nchw)
    splits, _ = splits_of(p, s)
    params = {"BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "STAGES": stages, "threads": threads,
              "async_copy": device.backend == "cuda", "mma_type": C_TYPE[p.dtype],
              "precision": p.precision if p.dtype == "float32" else "none", "a_nchw": a_nchw,
              "a_chunk": nchw_chunk(p) if a_nchw else 8}
    grid = (ceil_div(p.pixels, bm), ceil_div(p.cout_g, bn), p.groups * splits)
    return plan_around(p, s, "conv2d/mma.hip.j2", "conv2d_implicit_gemm_mma", params, grid, threads,
                       shared_bytes(bm, bn, bk, stages, p.itemsize, a_nchw))


def plan_around(p: Conv2dProblem, s: Schedule, template: str, kernel: str, params: dict, grid: tuple[int, int, int],
                threads: int, shared: int) -> Plan:
    """A matrix-core GEMM launch (mma.hip.j2 or wgmma.hip.j2: the same arguments and epilogue)
    with what surrounds it: the weight pack (prepare), the NHWC copy of the input where it is
    needed (the zero-padded 4-channel copy for window rows), and the split-K reduction."""
    from .conv2d_plans import _splitk_launch
    bk = int(s["bk"])
    window = window_rows(p, bk) if is_window_rows(s) else None
    if window:            # the GEMM reads the padded copy: its sizes, no padding left
        cs, cgp, kp, h, w, pad = 4, window.rk, window.kp, window.hp, window.wp, (0, 0)
    else:
        cs, cgp, kp, h, w, pad = a_channels(p, s), channels(p)[1], k_padded(p, bk), p.h, p.w, p.pad[:2]
    splits, kt_per_split = splits_of(p, s)
    m = p.pixels
    if m > INT32_MAX - int(s["bm"]) or grid[1] > 65535 or grid[2] > 65535:
        raise ScheduleError(f"{s.algorithm} grid {grid} exceeds the launch limits")
    ctype = C_TYPE[p.dtype]
    x_elems = p.n * h * w * cs
    y_elems = p.n * p.cout * p.oh * p.ow
    packed = p.cout * kp
    np_ = ceil_div(m, 8) * 8
    partial = splits * p.cout * np_ if splits > 1 else 0
    idx = index_type(x_elems + 64, y_elems + 64, packed + 64, p.n * p.cin * p.h * p.w + 64, partial + 64)
    out_nhwc = p.layout == "nhwc"
    vec_out = p.cout_g % 8 == 0 if out_nhwc else (p.oh * p.ow) % 8 == 0
    copy = window is not None or needs_nhwc_copy(p, s)
    fused = splits == 1
    params = {**params, "ctype": ctype, "index_type": idx, "has_bias": p.has_bias and fused,
              "has_residual": p.has_residual and fused, "activation": p.activation if fused else "none",
              "out_nhwc": out_nhwc, "vec_out": vec_out, "split_k": not fused, "pointwise": p.is_pointwise}
    x_align, out_align, bias_align = _vector_bytes(p, params, vec_out)
    outs = (Buf("y", align=out_align),) if fused else (Buf("partial"), Scalar("i32", np_), Scalar("i32", kt_per_split))
    args = (Buf("x_nhwc") if copy else Buf("x", align=x_align), Buf("packed_w"),
            *((Buf("bias", align=bias_align),) if p.has_bias and fused else ()),
            *((Buf("residual", align=out_align),) if p.has_residual and fused else ()), *outs,
            *(Scalar("i32", v) for v in (m, p.cout_g, p.cout, kp, cs, cgp, h, w, p.oh, p.ow, p.kh, p.kw,
                                         p.stride[0], p.stride[1], pad[0], pad[1], p.dilation[0],
                                         p.dilation[1])),
            Scalar("f32", p.alpha))
    gemm = Launch.make(template, kernel, params, grid, (threads,), args, shared,
                       programmatic=bool(params.get("programmatic")))
    pack = pack_rows_launch(p, idx, window) if window else pack_launch(p, idx, kp, cgp)
    launches = [gemm]
    workspaces = [Workspace("packed_w", packed * p.itemsize, persistent=True, derived_from=("w",))]
    if copy:
        launches.insert(0, pad4_launch(p, idx, window) if window else nhwc_copy_launch(p, idx, cs))
        workspaces.append(Workspace("x_nhwc", x_elems * p.itemsize))
    if not fused:
        workspaces.append(Workspace("partial", partial * 4))
        launches.append(_splitk_launch(p, splits, np_, idx, residual=p.has_residual, out_nhwc=out_nhwc))
    return Plan(launches=tuple(launches), workspaces=tuple(workspaces), prepare=(pack,))


def pack_rows_launch(p: Conv2dProblem, idx: str, window: WindowRows) -> Launch:
    """The weight pack of the window-rows GEMM: OIHW w -> packed_w[cout][kp], k = r * rk + s * 4 + c."""
    packed = p.cout * window.kp
    return Launch.make("conv2d/layout.hip.j2", "conv2d_pack_window_rows",
                       {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": LAYOUT_BLOCK, "stage": "pack_rows"},
                       (ceil_div(packed, LAYOUT_BLOCK),), (LAYOUT_BLOCK,),
                       (Buf("w"), Buf("packed_w"), Scalar("i32" if idx == "int" else "i64", packed),
                        *(Scalar("i32", v) for v in (window.kp, window.rk, p.cin_g, p.kh, p.kw))))


def pad4_launch(p: Conv2dProblem, idx: str, window: WindowRows) -> Launch:
    """x (NCHW or NHWC, at most 4 channels) -> x_nhwc[N][hp][wp][4], zero-padded (top, left by the
    problem's padding)."""
    total = p.n * window.hp * window.wp
    return Launch.make("conv2d/layout.hip.j2", "conv2d_pad4",
                       {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": LAYOUT_BLOCK, "stage": "pad4",
                        "src_nhwc": p.layout == "nhwc"},
                       (ceil_div(total, LAYOUT_BLOCK),), (LAYOUT_BLOCK,),
                       (Buf("x"), Buf("x_nhwc"), Scalar("i32" if idx == "int" else "i64", total),
                        *(Scalar("i32", v) for v in (p.cin, p.h, p.w, window.hp, window.wp, p.pad[0], p.pad[1]))))


def pack_launch(p: Conv2dProblem, idx: str, kp: int, cgp: int) -> Launch:
    """The weight pack (a prepare launch): OIHW w -> packed_w[cout][kp], k = tap * cgp + c, zeros
    for channels past the group's and for k past the taps."""
    packed = p.cout * kp
    return Launch.make("conv2d/layout.hip.j2", "conv2d_mma_pack_weights",
                       {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": LAYOUT_BLOCK, "stage": "pack"},
                       (ceil_div(packed, LAYOUT_BLOCK),), (LAYOUT_BLOCK,),
                       (Buf("w"), Buf("packed_w"), Scalar("i32" if idx == "int" else "i64", packed),
                        *(Scalar("i32", v) for v in (kp, cgp, p.cin_g, p.kh, p.kw))))


def nhwc_copy_launch(p: Conv2dProblem, idx: str, cs: int) -> Launch:
    """x (NCHW, or NHWC with C % 8 != 0) -> x_nhwc with cs channels per pixel (zeros past C)."""
    src_nhwc = p.layout == "nhwc"
    narrow = not src_nhwc and cs == 8          # C <= 8 from NCHW: a thread per pixel, no shared tile
    total = p.n * p.h * p.w * (cs // 8)
    grid_c = (ceil_div(total, LAYOUT_BLOCK),) if src_nhwc or narrow else \
        (ceil_div(p.h * p.w, 32), ceil_div(cs, 64), p.n)
    if max(grid_c[1:], default=0) > 65535:
        raise ScheduleError(f"NHWC copy grid {grid_c} exceeds the launch limits")
    return Launch.make("conv2d/layout.hip.j2", "conv2d_to_nhwc",
                       {"ctype": C_TYPE[p.dtype], "index_type": idx, "block": LAYOUT_BLOCK, "stage": "nhwc",
                        "src_nhwc": src_nhwc, "narrow": narrow},
                       grid_c, (LAYOUT_BLOCK,),
                       (Buf("x"), Buf("x_nhwc"), Scalar("i32" if idx == "int" else "i64", total),
                        *(Scalar("i32", v) for v in (p.cin, p.h * p.w, cs))))


def _vector_bytes(p: Conv2dProblem, params: dict, vec_out: bool) -> tuple[int, int, int]:
    """The alignment (bytes) the GEMM kernels' vector accesses with no unaligned path need of x read
    in place, of y and residual, and of bias: 16-byte cp.async chunks of x (NHWC channels; `a_nchw` /
    the wgmma 1x1 kernel: 2 * chunk bytes of pixels), 16-byte epilogue stores of 8 outputs (vec_out;
    the wgmma 1x1 kernel: 2 * CHUNK bytes), bias as 8 channels at once in the NHWC epilogue."""
    if "CHUNK" in params:                       # wgmma_nchw.hip.j2: pixels per copy and per store
        return 2 * params["CHUNK"], 2 * params["CHUNK"], 0
    x_align = 2 * params["a_chunk"] if params.get("a_nchw") else 16
    out_align = 16 if vec_out else 0
    return x_align, out_align, out_align if p.layout == "nhwc" else 0


def _split_options(p: Conv2dProblem, tile: tuple[int, ...], device: DeviceInfo) -> list[int]:
    """Split-K counts worth trying: only when the unsplit grid leaves most multiprocessors idle
    and every split keeps at least 4 K tiles."""
    bm, bn, bk = tile[:3]
    blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout_g, bn) * p.groups
    kt = k_padded(p, bk) // bk
    if blocks >= device.multiprocessors:
        return [1]
    return [1] + [s for s in (2, 3, 4, 6, 8, 12, 16) if kt // s >= 4 and blocks * s <= 4 * device.multiprocessors]


def candidates(p: Conv2dProblem, device: DeviceInfo) -> list[Schedule]:
    out = []
    for a_nchw in ((False, True) if nchw_direct(p) else (False,)):
        for tile in tiles_for(p):
            try:
                _check(p, tile, device, a_nchw)
            except ScheduleError:
                continue
            out += [mma_schedule(*tile, split_k=s, a_nchw=a_nchw) for s in _split_options(p, tile, device)]
    return out


def estimate(p: Conv2dProblem, s: Schedule, device: DeviceInfo, bandwidth: float, launch_s: float,
             prm: MmaCost | None = None) -> float:
    """Seconds for one call: the busiest multiprocessor's blocks at the tile's share of the dense
    fp16 rate (lowered with one block per multiprocessor), or the bytes that must cross DRAM,
    whichever is larger; plus the NHWC copy and the split-K reduction."""
    prm = prm or COST
    bm, bn, bk, wm, wn, stages = tile_of(s)
    if device.arch.startswith("sm_9"):
        peak_sm = 4096 * 1.83e9                   # dense fp16 flop/clock/SM x clock (H100 SXM)
    elif device.backend == "hip":
        peak_sm = 2048 * 1.7e9
    else:
        peak_sm = 2048 * 1.41e9
    math_per_flop = prm.fp32_math.get(p.precision, 1.0) if p.dtype == "float32" else 1.0
    key_bk = bk * p.itemsize // 2
    rate = peak_sm * prm.tile_rate.get((bm, bn, key_bk, wm, wn), 0.2) / math_per_flop
    smem = shared_bytes(bm, bn, bk, stages, p.itemsize, reads_nchw(s))
    threads = wm * wn * device.warp_size
    regs = WARP_TILE_REGS.get((bm // wm, bn // wn), 200)
    resident = max(1, min(device.shared_per_multiprocessor // smem, device.max_threads_per_multiprocessor // threads,
                          device.registers_per_multiprocessor // (threads * regs)))
    splits, per = splits_of(p, s)
    blocks = ceil_div(p.pixels, bm) * ceil_div(p.cout_g, bn) * p.groups * splits
    per_sm = ceil_div(blocks, device.multiprocessors)
    occupancy = 1.0 if min(per_sm, resident) > 1 else prm.occ_floor
    compute = per_sm * 2.0 * bm * bn * (per * bk + prm.overhead_k) / (rate * occupancy)
    isz = p.itemsize
    x_bytes = p.n * p.h * p.w * a_channels(p, s) * isz
    y_bytes = p.n * p.cout * p.oh * p.ow * isz * (2 if p.has_residual else 1)
    w_bytes = p.cout * k_padded(p, bk) * isz
    memory = (x_bytes + y_bytes + w_bytes) / bandwidth
    t = launch_s + max(compute, memory)
    if needs_nhwc_copy(p, s):
        t += launch_s + (p.n * p.cin * p.h * p.w * isz + x_bytes) / (0.8 * bandwidth)
    if splits > 1:
        t += prm.split_s + (splits * p.cout * p.pixels * 4 + y_bytes) / (prm.split_eff * bandwidth)
    return t


COST = MmaCost()
