"""attention schedules: the scheduler, the tuning space and the kernel launches of each algorithm.

Algorithms:
- fused_wgmma: the same single pass on Hopper's warpgroup MMA (sm_90a; prefill-sized fp16/bf16
  problems with D a multiple of 8 up to 256: attention_wgmma). Chosen over fused_mma on sm_90
  where attention_wgmma_rules.preferred says it wins.
- fused_mma: flash-style single pass on the matrix cores (fp16; any D up to 256, padded to a
  multiple of 16 in the kernel; GQA packing, warps splitting keys and split-KV for decoding:
  attention_mma).
- fused_tf32: the same single pass for fp32 data with TF32 products on the matrix cores, where the
  call allows TF32 (precision "tf32"; any D up to 256: attention_tf32).
- fused: the same single pass on the SIMT cores (fp32 math; fp32 or fp16; D in 32, 64, 96, 128).
- three_stage: scores = scale Q K^T (our GEMM), row softmax (warp per row), out = P V (GEMM);
  the seed's hybrid without BLAS. Any D up to 256; needs a B*H*Sq*Sk fp32 workspace.
- naive: one thread per output element (the seed's baseline).
"""
from __future__ import annotations

import dataclasses
import logging

from ..device import DeviceInfo
from ..errors import ScheduleError
from .attention_mma import MMA_DTYPES, mma_candidates, mma_schedule, plan_mma
from .attention_problem import AttentionProblem, make_problem
from .attention_tf32 import plan_tf32, tf32_candidates, tf32_schedule, tf32_shortlist, why_not_tf32
from .attention_wgmma import plan_wgmma, wgmma_candidates, wgmma_schedule, wgmma_shortlist
from .attention_wgmma_fit import why_not
from .attention_wgmma_rules import preferred
from .base import C_TYPE, INT32_MAX, Buf, Launch, Plan, Scalar, Schedule, TensorSpec, Workspace, ceil_div, index_type

log = logging.getLogger("jitops.ops.attention")

ALGORITHMS = ("fused_wgmma", "fused_mma", "fused_tf32", "fused", "three_stage", "naive")
SIMT_HEAD_DIMS = (32, 64, 96, 128)
LOG2E = 1.4426950408889634
TEMPLATES = {"naive": "attention/naive.hip.j2", "fused": "attention/fused.hip.j2",
             "fused_mma": "attention/fused_mma.hip.j2", "fused_wgmma": "attention/fused_wgmma.hip.j2",
             "fused_tf32": "attention/fused_tf32.hip.j2", "gemm": "attention/gemm.hip.j2",
             "softmax": "attention/softmax.hip.j2"}


# ---------------------------------------------------------------- shared-memory sizes

def simt_shared_bytes(d: int, block_q: int, block_k: int) -> int:
    """Qt [D][BQ+4], Pt [BK][BQ+4], V [BK][D+4], K [BK][D+1], fp32."""
    return 4 * (d * (block_q + 4) + block_k * (block_q + 4) + block_k * (d + 4) + block_k * (d + 1))


def gemm_shared_bytes(bm: int, bn: int, bk: int) -> int:
    return 4 * bk * (bm + 4 + bn + 4)


def _tile_cost(device: DeviceInfo, blocks: int, rows_per_block: int) -> float:
    """Work of the busiest multiprocessor when blocks spread evenly, in query rows, each row
    charged extra for its share of the K/V tile loads and softmax bookkeeping of its block (32
    rows' worth per block: a guess, checked on an H100). Big tiles: fewer loads per row; small
    tiles: a fuller last wave on small problems."""
    return ceil_div(blocks, device.multiprocessors) * (rows_per_block + 32)


# ---------------------------------------------------------------- schedules per algorithm

def _simt_tiles(p: AttentionProblem, device: DeviceInfo) -> list[tuple[int, int, int, int]]:
    """(block_q, block_k, rows_per_thread, cols_per_thread) that fit the device, biggest first."""
    out = []
    for tm, tn in (((8, 8), (4, 8), (4, 4)) if p.d <= 64 else ((4, 8), (4, 4))):
        for block_q in (128, 64, 32):
            for block_k in (64, 32):
                threads = (block_q // tm) * (block_k // tn)
                if (threads % device.warp_size == 0 and threads <= device.max_threads_per_block
                        and p.d % (block_k // tn) == 0 and (p.d // (block_k // tn)) % 4 == 0
                        and simt_shared_bytes(p.d, block_q, block_k) <= device.shared_per_block_optin):
                    out.append((block_q, block_k, tm, tn))
    return out


def _simt_schedule(p: AttentionProblem, device: DeviceInfo, why: str = "") -> Schedule:
    best = None
    for block_q, block_k, tm, tn in _simt_tiles(p, device):
        blocks = p.batch * p.heads * ceil_div(max(p.sq, 1), block_q)
        cost = _tile_cost(device, blocks, block_q)
        if best is None or cost < best[0]:
            best = (cost, block_q, block_k, tm, tn, blocks)
    if best is None:
        raise ScheduleError(f"attention fused: no tile of D={p.d} fits {device.shared_per_block_optin} bytes of "
                            f"shared memory on {device.name}")
    _, block_q, block_k, tm, tn, blocks = best
    smem = simt_shared_bytes(p.d, block_q, block_k)
    why = why or (f"SIMT single pass: {block_q} query rows per block, K/V tiles of {block_k} keys, "
                  f"{tm}x{tn} scores per thread ({smem // 1024} KiB shared), {blocks} blocks")
    return Schedule.make("fused", why=why, block_q=block_q, block_k=block_k, rows_per_thread=tm,
                         cols_per_thread=tn)


def _gemm_tile(m: int, n: int) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, TM, TN): 128x128 tiles of 8x8 per thread for big products, 64x64 of 4x4 else."""
    if m >= 128 and n >= 128:
        return (128, 128, 8, 8, 8)
    if n <= 32:
        return (64, 32, 16, 4, 4)
    return (64, 64, 16, 4, 4)


def _three_stage_schedule(p: AttentionProblem, device: DeviceInfo, why: str = "") -> Schedule:
    qk = _gemm_tile(p.sq, p.sk)
    pv = _gemm_tile(p.sq, p.d)
    cols = ceil_div(max(p.sk, 1), device.warp_size)
    cols_per_lane = cols if cols <= 16 else 0
    why = why or (f"GEMM {qk[0]}x{qk[1]} -> warp-per-row softmax "
                  f"({'registers' if cols_per_lane else 'two passes'}) -> GEMM {pv[0]}x{pv[1]}; "
                  f"{4 * p.batch * p.heads * p.sq * p.sk // 2**20} MiB of scores")
    return Schedule.make("three_stage", why=why, qk_tile=qk, pv_tile=pv, softmax_warps=4,
                         cols_per_lane=cols_per_lane)


def heuristic(problem: AttentionProblem, device: DeviceInfo, algorithm: str | None = None) -> Schedule:
    """fp16/bf16 + matrix cores: fused_wgmma on sm_90 where it applies and wins, else fused_mma
    (any D); fp32 with precision "tf32" + matrix cores: fused_tf32 (any D); else D in 32/64/96/128:
    fused; else three_stage. naive only when asked for."""
    p = problem
    if algorithm is None:
        if p.dtype in MMA_DTYPES and device.matrix_cores:
            if why_not(p, device) is None and preferred(p, device):
                return wgmma_schedule(p, device)
            return mma_schedule(p, device)
        if why_not_tf32(p, device) is None:
            return tf32_schedule(p, device)
        if p.d in SIMT_HEAD_DIMS:
            return _simt_schedule(p, device)
        log.debug("attention D=%d: no fused kernel, three_stage with a %d-byte score workspace", p.d,
                  4 * p.batch * p.heads * p.sq * p.sk)
        return _three_stage_schedule(p, device, why=f"D={p.d} has no fused kernel (fused: {SIMT_HEAD_DIMS}; "
                                                    f"fused_mma: {', '.join(MMA_DTYPES)} on matrix cores)")
    _check_applicable(p, device, algorithm)
    if algorithm == "fused_wgmma":
        return wgmma_schedule(p, device)
    if algorithm == "fused_mma":
        return mma_schedule(p, device)
    if algorithm == "fused_tf32":
        return tf32_schedule(p, device)
    if algorithm == "fused":
        return _simt_schedule(p, device)
    if algorithm == "three_stage":
        return _three_stage_schedule(p, device)
    return Schedule.make("naive", why="one thread per output element (baseline)", block=128)


def shortlist(problem: AttentionProblem, device: DeviceInfo, n: int) -> list[Schedule]:
    """The heuristic's pick and, for fused_wgmma picks, its nearest plain-TMA neighbours (fused_tf32: the
    tiles that won somewhere): at most n schedules, what benchmark mode times on a problem's first call.
    A causal pick whose grid goes by groups of heads (`causal_head_group`) has the all-heads order second, so timing settles the rule's
    thresholds on the machine at hand. Other picks stand alone."""
    pick = heuristic(problem, device)
    if pick.algorithm == "fused_tf32":
        return tf32_shortlist(problem, device, n)
    if pick.algorithm != "fused_wgmma" or not int(pick.get("tma", 0)) or int(pick.get("producer", 0)):
        return [pick]
    out = wgmma_shortlist(problem, device, pick, n)
    heads = problem.batch * problem.heads
    if problem.causal != "none" and n > 1 and dict(plan(problem, pick, device).launches[0].params)["head_group"] < heads:
        every_head = Schedule.make(pick.algorithm, **{**pick.as_dict()["params"], "head_group": heads})
        out = [pick, every_head] + [s for s in out[1:] if s != every_head][:n - 2]
    return out


def _check_applicable(p: AttentionProblem, device: DeviceInfo, algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ScheduleError(f"attention has no algorithm '{algorithm}' (choose from {', '.join(ALGORITHMS)})")
    if algorithm == "fused_wgmma" and why_not(p, device):
        raise ScheduleError(f"attention fused_wgmma: {why_not(p, device)}: use 'fused_mma'")
    if algorithm == "fused_mma":
        if not device.matrix_cores:
            raise ScheduleError(f"attention fused_mma needs matrix cores (mma.sync on sm_80+, MFMA on CDNA); "
                                f"{device.name} has none: use 'fused', 'three_stage' or 'naive'")
        if p.dtype not in MMA_DTYPES:
            raise ScheduleError(f"attention fused_mma takes {' or '.join(MMA_DTYPES)} inputs, got {p.dtype}: "
                                f"use 'fused'")
    if algorithm == "fused_tf32" and (reason := why_not_tf32(p, device)):
        raise ScheduleError(f"attention fused_tf32: {reason}")
    if algorithm == "fused" and p.d not in SIMT_HEAD_DIMS:
        raise ScheduleError(f"attention fused supports head dims {SIMT_HEAD_DIMS}, got D={p.d}: use 'three_stage'")


def candidates(problem: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """Every applicable algorithm with its heuristic tiles, plus tile variants of the fused kernels."""
    p = problem
    out: list[Schedule] = []
    for algorithm in ALGORITHMS:
        try:
            out.append(heuristic(p, device, algorithm))
        except ScheduleError:
            continue
    matrix = p.dtype in MMA_DTYPES and device.matrix_cores
    if matrix:
        out.extend(mma_candidates(p, device))
        out.extend(wgmma_candidates(p, device))
    if why_not_tf32(p, device) is None:
        out.extend(tf32_candidates(p, device))
    # NVIDIA matrix cores beat the SIMT tiles on every fp16 / bf16 shape timed (H100 / H200, 2026-11-22
    # to 25), so there the SIMT kernels stay as one fallback each; AMD is not measured: all tiles stay.
    if p.d in SIMT_HEAD_DIMS and not (matrix and device.backend == "cuda"):
        for block_q, block_k, tm, tn in _simt_tiles(p, device):
            out.append(Schedule.make("fused", block_q=block_q, block_k=block_k, rows_per_thread=tm,
                                     cols_per_thread=tn))
    unique: dict[Schedule, None] = {}
    for s in out:
        unique.setdefault(s, None)
    return list(unique)


# ---------------------------------------------------------------- plans

def _index(p: AttentionProblem, schedule: Schedule, *extents: int) -> str:
    if schedule.get("index") == "int64":
        return "jt_int64"
    sizes = [s.numel for s in p.inputs().values()] + [p.outputs()["out"].numel, p.q_span(), p.kv_span(), *extents]
    return index_type(max(sizes) + 1024)


def _mask_args(p: AttentionProblem, idx: str) -> tuple[Buf | Scalar, ...]:
    if not p.has_mask:
        return ()
    kind = "i32" if idx == "int" else "i64"
    return (Buf("mask"), *(Scalar(kind, s) for s in p.mask_strides()))


def _common_params(p: AttentionProblem, idx: str) -> dict:
    return {"ctype": C_TYPE[p.dtype], "index_type": idx, "has_mask": p.has_mask,
            "mtype": C_TYPE[p.mask_dtype] if p.has_mask else "", "causal": p.causal != "none",
            "q_layout": p.q_layout or "bhsd", "kv_layout": p.kv_layout or "bhsd", "q_pitch": p.q_pitch,
            "kv_pitch": p.kv_pitch}


def _has_async_copy(device: DeviceInfo) -> bool:
    """cp.async exists on NVIDIA sm_80+, which is where DeviceInfo reports matrix cores."""
    return device.backend == "cuda" and device.matrix_cores


def _check_grid(blocks: int, what: str) -> None:
    if blocks > INT32_MAX:
        raise ScheduleError(f"attention {what}: {blocks} blocks exceed the grid limit")


def plan(problem: AttentionProblem, schedule: Schedule, device: DeviceInfo) -> Plan:
    p = problem
    if p.batch * p.heads * p.sq == 0:
        return Plan(launches=())
    algorithm = schedule.algorithm
    _check_applicable(p, device, algorithm)
    scale_log2 = p.scale * LOG2E
    bh = p.batch * p.heads
    tail = (Scalar("i32", p.heads), Scalar("i32", p.group), Scalar("i32", p.sq), Scalar("i32", p.sk),
            Scalar("i32", p.batch))
    if algorithm in ("fused", "fused_mma", "fused_wgmma", "fused_tf32"):
        return _plan_fused(p, schedule, device, scale_log2, tail)
    if algorithm == "three_stage":
        return _plan_three_stage(p, schedule, device, tail)
    block = int(schedule["block"])
    if block % device.warp_size or block > device.max_threads_per_block:
        raise ScheduleError(f"attention naive: block of {block} threads does not fit {device.name}")
    per_head = ceil_div(p.sq * p.d, block)
    _check_grid(bh * per_head, "naive")
    idx = _index(p, schedule)
    params = {**_common_params(p, idx), "block": block}
    args = (Buf("q"), Buf("k"), Buf("v"), *_mask_args(p, idx), Buf("out"), *tail, Scalar("i32", p.d),
            Scalar("i32", per_head), Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    launch = Launch.make(TEMPLATES["naive"], "attention_naive", params, (bh * per_head,), (block,), args)
    return Plan(launches=(launch,))


def _plan_fused(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, scale_log2: float,
                tail: tuple) -> Plan:
    # split-KV partials: splits x B x H x Sq x D fp32 elements
    idx = _index(p, schedule, int(schedule.get("splits", 1)) * p.batch * p.heads * p.sq * p.d)
    params = _common_params(p, idx)
    params["head_dim"] = p.d
    if schedule.algorithm == "fused_wgmma":
        return plan_wgmma(p, schedule, device, params, _mask_args(p, idx), tail, scale_log2)
    if schedule.algorithm == "fused_mma":
        return plan_mma(p, schedule, device, idx, params, _mask_args(p, idx), tail, scale_log2)
    if schedule.algorithm == "fused_tf32":
        return plan_tf32(p, schedule, device, params, _mask_args(p, idx), tail, scale_log2)
    block_q, block_k, tm, tn = (int(schedule[n]) for n in ("block_q", "block_k", "rows_per_thread",
                                                           "cols_per_thread"))
    tc = block_k // tn if tn else 0
    if (tm % 4 or tn <= 0 or block_q % tm or block_k % tn or tc & (tc - 1) or tc > device.warp_size
            or p.d % tc or (p.d // tc) % 4):
        raise ScheduleError(f"attention fused: tile {block_q}x{block_k} with {tm}x{tn} per thread does not "
                            f"divide D={p.d} into float4 columns")
    threads = (block_q // tm) * tc
    if threads % device.warp_size:
        raise ScheduleError(f"attention fused: {threads} threads is not a whole number of warps "
                            f"({device.warp_size} lanes)")
    smem = simt_shared_bytes(p.d, block_q, block_k)
    params.update(block_q=block_q, block_k=block_k, rows_per_thread=tm, cols_per_thread=tn,
                  async_copy=_has_async_copy(device))
    kernel = "attention_fused"
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"attention {schedule.algorithm}: {threads} threads per block exceed {device.name}'s limit")
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"attention {schedule.algorithm}: {smem} bytes of shared memory exceed "
                            f"{device.shared_per_block_optin} on {device.name}")
    q_tiles = ceil_div(p.sq, block_q)
    blocks = p.batch * p.heads * q_tiles
    _check_grid(blocks, schedule.algorithm)
    args = (Buf("q"), Buf("k"), Buf("v"), *_mask_args(p, idx), Buf("out"), *tail, Scalar("i32", q_tiles),
            Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    launch = Launch.make(TEMPLATES[schedule.algorithm], kernel, params, (blocks,), (threads,), args, smem)
    return Plan(launches=(launch,))


def _plan_three_stage(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, tail: tuple) -> Plan:
    bh = p.batch * p.heads
    scores = bh * p.sq * p.sk
    idx = _index(p, schedule, scores)
    ikind = "i32" if idx == "int" else "i64"
    launches = []
    if p.sk == 0:   # no keys: softmax of nothing; the PV product of an empty sum writes zeros
        scores = 0
    gemm_common = {"index_type": idx, "c_type": "float"}
    score_strides = (p.heads * p.sq * p.sk, p.sq * p.sk, p.sk)     # [B, H, Sq, Sk] fp32

    def strides(sbh: tuple[int, int, int]) -> tuple[Scalar, ...]:
        return tuple(Scalar(ikind, s) for s in sbh)
    qk = tuple(int(x) for x in schedule["qk_tile"])
    pv = tuple(int(x) for x in schedule["pv_tile"])
    for name, (bm, bn, bk, tm, tn) in (("qk_tile", qk), ("pv_tile", pv)):
        threads = (bm // tm) * (bn // tn)
        if (bm % tm or bn % tn or tm % 4 or tn % 4 or threads % device.warp_size
                or threads > device.max_threads_per_block):
            raise ScheduleError(f"attention three_stage: {name} {bm}x{bn} with {tm}x{tn} per thread does not fit "
                                f"{device.name}")
    if scores:
        bm, bn, bk, tm, tn = qk
        tiles_m, tiles_n = ceil_div(p.sq, bm), ceil_div(p.sk, bn)
        _check_grid(bh * tiles_m * tiles_n, "three_stage")
        params = {**gemm_common, "a_type": C_TYPE[p.dtype], "b_type": C_TYPE[p.dtype], "b_layout": "nt",
                  "bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
        args = (Buf("q"), Buf("k"), Buf("scores"), Scalar("i32", p.sq), Scalar("i32", p.sk), Scalar("i32", p.d),
                *strides(p.q_strides()), *strides(p.kv_strides()), *strides(score_strides),
                Scalar("i32", p.heads), Scalar("i32", p.group), Scalar("i32", tiles_m), Scalar("i32", tiles_n),
                Scalar("f32", p.scale))
        launches.append(Launch.make(TEMPLATES["gemm"], "attention_scores", params, (bh * tiles_m * tiles_n,),
                                    ((bm // tm) * (bn // tn),), args, gemm_shared_bytes(bm, bn, bk)))
        warps = int(schedule["softmax_warps"])
        cols_per_lane = int(schedule["cols_per_lane"])
        if cols_per_lane and cols_per_lane * device.warp_size < p.sk:
            raise ScheduleError(f"attention three_stage: {cols_per_lane} columns per lane do not cover Sk={p.sk}")
        rows = bh * p.sq
        params = {"index_type": idx, "has_mask": p.has_mask, "causal": p.causal != "none",
                  "mtype": C_TYPE[p.mask_dtype] if p.has_mask else "", "warps": warps, "cols_per_lane": cols_per_lane}
        args = (Buf("scores"), *_mask_args(p, idx), Scalar(ikind, rows), Scalar("i32", p.heads), Scalar("i32", p.sq),
                Scalar("i32", p.sk), Scalar("i32", p.causal_offset))
        launches.append(Launch.make(TEMPLATES["softmax"], "attention_softmax", params, (ceil_div(rows, warps),),
                                    (warps * device.warp_size,), args))
    bm, bn, bk, tm, tn = pv
    tiles_m, tiles_n = ceil_div(p.sq, bm), ceil_div(p.d, bn)
    _check_grid(bh * tiles_m * tiles_n, "three_stage")
    params = {**gemm_common, "a_type": "float", "b_type": C_TYPE[p.dtype], "c_type": C_TYPE[p.dtype],
              "b_layout": "nn", "bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
    args = (Buf("scores"), Buf("v"), Buf("out"), Scalar("i32", p.sq), Scalar("i32", p.d), Scalar("i32", p.sk),
            *strides(score_strides), *strides(p.kv_strides()), *strides(p.out_strides()),
            Scalar("i32", p.heads), Scalar("i32", p.group), Scalar("i32", tiles_m), Scalar("i32", tiles_n),
            Scalar("f32", 1.0))
    launches.append(Launch.make(TEMPLATES["gemm"], "attention_pv", params, (bh * tiles_m * tiles_n,),
                                ((bm // tm) * (bn // tn),), args, gemm_shared_bytes(bm, bn, bk)))
    return Plan(launches=tuple(launches), workspaces=(Workspace("scores", max(4 * scores, 4)),))


# ---------------------------------------------------------------- compile coverage

def variants(device: DeviceInfo) -> list[tuple[AttentionProblem, Schedule]]:
    """Problems and schedules reaching every template branch (mask/no mask, causal, dtypes, D)."""

    def problem(dtype: str, d: int, mask: bool = False, causal: bool = False, sq: int = 197, sk: int = 77,
                layout: str = "", precision: str = "highest"):
        specs = {"q": TensorSpec((2, 4, sq, d), dtype, layout), "k": TensorSpec((2, 2, sk, d), dtype, layout),
                 "v": TensorSpec((2, 2, sk, d), dtype, layout),
                 "mask": TensorSpec((sq, sk), "float32") if mask else None}
        return make_problem(specs, {"causal": causal, "precision": precision})

    out = []
    for dtype in ("float32", "float16"):
        plain, masked = problem(dtype, 64), problem(dtype, 64, mask=True, causal=True)
        out.append((plain, heuristic(plain, device, "naive")))
        out.append((masked, heuristic(masked, device, "naive")))
        out.append((plain, heuristic(plain, device, "three_stage")))
        long_rows = problem(dtype, 40, mask=True, causal=True, sk=1000)     # softmax in two passes
        out.append((long_rows, heuristic(long_rows, device, "three_stage")))
        for d in (32, 64, 128):
            out.append((problem(dtype, d), heuristic(problem(dtype, d), device, "fused")))
        out.append((masked, heuristic(masked, device, "fused")))
    if device.matrix_cores:
        # fp32 with TF32 products: padded D (72 -> 80), GQA, causal with a mask (the checked softmax step)
        pr = problem("float32", 72, mask=True, causal=True, precision="tf32")
        out.append((pr, heuristic(pr, device, "fused_tf32")))
        for d in (40, 64, 256):            # padded D (40 -> 48), the unchecked fast path, Q from shared memory
            pr = problem("float16", d)
            out.append((pr, heuristic(pr, device, "fused_mma")))
        pr = problem("float16", 64, mask=True, causal=True)
        out.append((pr, Schedule.make("fused_mma", warps=4, row_groups=2, block_k=64)))
        # decoding, bf16: GQA heads packed, warps splitting the keys, split-KV partials + the merge kernel;
        # q, k, v stored [S, B, H, D] (the heads-inner addressing of this family and of the merge)
        specs = {"q": TensorSpec((2, 8, 1, 72), "bfloat16", "sbhd"), "k": TensorSpec((2, 2, 4096, 72), "bfloat16", "sbhd"),
                 "v": TensorSpec((2, 2, 4096, 72), "bfloat16", "sbhd"), "mask": None}
        pr = make_problem(specs, {"causal": "bottom_right"})
        out.append((pr, Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True,
                                      splits=8)))
        if device.hopper:
            # one sm_90 decode representative: K/V by TMA into the swizzled ring, splits merged in a cluster
            specs = {n: (dataclasses.replace(s, layout="") if s else None) for n, s in specs.items()}
            pr = make_problem(specs, {"causal": "bottom_right"})
            out.append((pr, Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True,
                                          splits=4, cluster=1, tma=1, stages=3)))
    if why_not(problem("bfloat16", 72), device) is None:
        # one sm_90a representative: bf16, padded D (72 -> 80), GQA, causal with a mask (checked softmax),
        # q, k, v stored [B, S, H, D] (4-d tensor maps)
        pr = problem("bfloat16", 72, mask=True, causal=True, layout="bshd")
        out.append((pr, Schedule.make("fused_wgmma", groups=2, block_k=64)))
        # and the plain TMA loop (the sm_90 picks' loop) with the bounded step and a trimmed last key tile,
        # under a padding mask ([B, 1, 1, Sk]: key_mask's loads in the fast and the bounded step)
        specs = {"q": TensorSpec((2, 4, 197, 64), "float16"), "k": TensorSpec((2, 2, 77, 64), "float16"),
                 "v": TensorSpec((2, 2, 77, 64), "float16"), "mask": TensorSpec((2, 1, 1, 77), "float16")}
        pr = make_problem(specs, {"causal": False})
        out.append((pr, Schedule.make("fused_wgmma", groups=1, block_k=64, tma=1, bounded=1, trim=1)))
        # fp32 on TF32 wgmma (fused_tf32 wgmma=1): padded D (72 -> 72, 18 pieces: a partial block of 8 in the
        # V transpose), GQA, causal with a mask (the checked softmax), two consumer warpgroups
        pr = problem("float32", 72, mask=True, causal=True, precision="tf32")
        out.append((pr, Schedule.make("fused_tf32", wgmma=1, groups=2, block_k=64, stages=2)))
    return out
