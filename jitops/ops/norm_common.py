"""The scheduler and planner for "row" normalizations (layer_norm, rms_norm, group_norm in NCHW),
vector widths, float64 references and tolerances. Argument checks live in norm_args, the
per-channel affine apply in norm_affine.

A row is what one statistic covers: a layer/rms-norm row (the trailing dims) or a group-norm
group (channels/groups channels of one sample, contiguous in NCHW). Row kernels
(templates/layer_norm/) come in four strategies the scheduler picks from:

  warp   - a warp, or a power-of-two part of one, per row; the row in registers (short rows)
  block  - a block per row, the row in registers or shared memory: the input is read once
  stream - a block per row for rows too long to keep: statistics, then a second read
  split  - few long rows: each row over several blocks, a grid reduction (atomic ticket, the last
           block merges and resets the counter) then a separate normalize kernel
  naive  - block per row, scalar, tree reduction in shared memory (the seeds' baseline)

Statistics: two_pass (on chip only: exact deviations, corrected mean), welford (Chan merges of
per-vector states, shifted by the row's first element) or sumsq (one pass over x - K, K the
row's first element: fast, and well conditioned unless that element is an outlier, so never the
default for layer/group norm). rms_norm's mean of squares has nothing to cancel.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, INT32_MAX, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .norm_affine import MAX_THREADS_PER_SM, affine_launch

log = logging.getLogger("jitops.ops.norm")

ROW_ALGORITHMS = ("warp", "block", "stream", "split", "naive")
LAYER_STATS = ("two_pass", "welford", "sumsq")
REG_ROW_BYTES = 32 << 10        # rows up to this size stay in registers, longer ones in shared memory


def vector_width(length: int, itemsize: int) -> int:
    """The widest power-of-two vector (at most 16 bytes) that tiles a row exactly."""
    vec = 16 // itemsize
    while vec > 1 and length % vec:
        vec //= 2
    return vec


def ptr_or_none(name: str, present: bool) -> list[Buf]:
    return [Buf(name)] if present else []


# ---------------------------------------------------------------- row normalization

@dataclass(frozen=True)
class RowSpec:
    """What the row kernels need to know about a layer/rms/group-norm problem."""

    op: str
    kind: str                 # "layer": mean and variance; "rms": mean of squares
    rows: int
    length: int
    dtype: str
    ptype: str
    has_gamma: bool
    has_beta: bool
    eps: float
    groups: int = 0           # group norm: parameters per channel, channel = (row % groups) * cpg + i // plane
    cpg: int = 0
    plane: int = 0
    nhwc: bool = False        # group norm on channels_last storage (the naive kernel's addressing)

    @property
    def params(self) -> str:
        return "channel" if self.groups else "element"

    @property
    def numel(self) -> int:
        return self.rows * self.length

    @property
    def row_bytes(self) -> int:
        return self.length * ITEMSIZE[self.dtype]


def _stats_for(spec: RowSpec, algorithm: str, stats: str | None) -> str:
    if spec.kind == "rms":
        if stats not in (None, "rms"):
            raise ScheduleError(f"{spec.op} has one statistic, the mean of squares (got stats={stats})")
        return "rms"
    if stats is None:
        return "two_pass" if algorithm in ("warp", "block") else "welford"
    if stats not in LAYER_STATS:
        raise ScheduleError(f"{spec.op}: stats must be one of {', '.join(LAYER_STATS)} (got {stats})")
    if stats == "two_pass" and algorithm not in ("warp", "block"):
        raise ScheduleError(f"{spec.op}: two_pass needs the row on chip (warp or block), not {algorithm}")
    return stats


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _block_shape(lenv: int, warp: int, max_items: int = 8) -> tuple[int, int]:
    """(threads per row, vectors per thread) for a block per row.

    From an H200 sweep (scripts/sweep_norms.py, 2026-11-22): what pays is several resident
    blocks per multiprocessor (their load and reduce phases overlap; 1-2 big blocks per SM ran
    at 40-67% of copy), 2 to 8 vectors per thread, at least 128 threads, little padding.
    Registers: about 30 + 5 per 16-byte vector (ptxas: 7 vectors 56, 4 vectors 42-52).
    """
    best: tuple[float, int, int] | None = None
    for items in range(1, max_items + 1):
        tpr = ceil_div(ceil_div(lenv, items), warp) * warp
        if tpr > 1024 or (items > 1 and tpr < 2 * warp):
            continue
        waste = (items * tpr - lenv) / lenv
        regs = 30 + 5 * items
        resident = min(MAX_THREADS_PER_SM // tpr, 65536 // (tpr * regs), 32)
        score = waste + 0.03 * max(0, 4 - resident) + 0.005 * abs(items - 4) + (0.02 if tpr < 128 else 0.0)
        if best is None or score < best[0]:
            best = (score, tpr, items)
    if best is None:
        raise ScheduleError(f"a row of {lenv} vectors does not fit one block in registers")
    return best[1], best[2]


def row_heuristic(spec: RowSpec, device: DeviceInfo, algorithm: str | None = None, **over: Any) -> Schedule:
    """The scheduler for row normalizations; `over` pins parameters (tuning, tests)."""
    if algorithm is not None and algorithm not in ROW_ALGORITHMS:
        raise ScheduleError(f"{spec.op} has no algorithm '{algorithm}' (choose from {', '.join(ROW_ALGORITHMS)})")
    itemsize = ITEMSIZE[spec.dtype]
    vec = int(over.pop("vec", vector_width(spec.length, itemsize)))
    lenv = spec.length // vec
    vbytes = vec * itemsize
    warp = device.warp_size
    sms = device.multiprocessors
    what = (f"{spec.rows} groups of {spec.cpg} channels x {spec.plane} =" if spec.groups else f"{spec.rows} rows of")
    why = [f"{what} {spec.length} {spec.dtype} elements ({spec.row_bytes} bytes each)"]
    # Evict-first loads/stores lost to plain ones in 12 of 13 same-schedule pairs of the H200
    # sweep (e.g. group norm fp16 seed shape 66% -> 92% of copy): off unless a schedule asks.
    streaming = False
    if algorithm is None:
        smem_ok = lenv * vbytes <= device.shared_per_block_optin - 2048
        if spec.length > INT32_MAX:
            algorithm = "naive"
            why.append("a row past 2^31 elements: only the naive kernel indexes rows in 64 bits")
        elif lenv <= 4 * warp:
            algorithm = "warp"
            why.append(f"short rows: {min(warp, _pow2_ceil(ceil_div(lenv, 4)))} lanes per row, shuffles only")
        elif spec.row_bytes <= REG_ROW_BYTES:
            algorithm = "block"
            why.append("a block per row, the row in registers: one read of the input")
        elif spec.rows < sms // 2 and spec.row_bytes >= (64 << 10):
            algorithm = "split"
            why.append(f"{spec.rows} long rows cannot fill {sms} multiprocessors: each row over several "
                       "blocks, grid reduction, then the normalize kernel")
        elif smem_ok and spec.rows >= sms:
            algorithm = "block"
            over.setdefault("store", "smem")
            why.append("a block per row, the row in shared memory: one read of the input")
        elif spec.rows >= sms:
            algorithm = "stream"
            why.append("rows too long to keep on chip: statistics, then a second read (L2)")
        else:
            algorithm = "split"
            why.append(f"few long rows ({spec.rows}): split over blocks with a grid reduction")
    stats = _stats_for(spec, algorithm, over.pop("stats", None))
    if algorithm == "naive":
        return Schedule.make("naive", why="; ".join(why + ["baseline: block per row, scalar, tree reduction"]),
                             block=int(over.pop("block", 256)))
    streaming = bool(over.pop("streaming", streaming))
    if algorithm == "warp":
        tpr = int(over.pop("tpr", min(warp, _pow2_ceil(ceil_div(lenv, 4)))))
        items = int(over.pop("items", ceil_div(lenv, tpr)))
        block = int(over.pop("block", max(256, tpr)))
        if over.pop("store", "regs") != "regs":
            raise ScheduleError(f"{spec.op} warp: rows shared by a warp stay in registers")
        params = dict(vec=vec, tpr=tpr, items=items, block=block, store="regs", stats=stats,
                      waves=int(over.pop("waves", 0)), streaming=streaming, **_pipeline(over))
    elif algorithm == "block":
        store = over.pop("store", "regs")
        if store == "smem":
            tpr = int(over.pop("tpr", 512))
            items = int(over.pop("items", ceil_div(lenv, tpr)))
        else:
            tpr0, items0 = _block_shape(lenv, warp)
            tpr = int(over.pop("tpr", tpr0))
            items = int(over.pop("items", items0 if tpr == tpr0 else ceil_div(lenv, tpr)))
        over.pop("block", None)     # a block per row: the block is the row's threads
        params = dict(vec=vec, tpr=tpr, items=items, block=tpr, store=store, stats=stats,
                      waves=int(over.pop("waves", 0)), streaming=streaming, **_pipeline(over))
    elif algorithm == "stream":
        tpr = int(over.pop("tpr", 256))
        params = dict(vec=vec, tpr=tpr, unroll=int(over.pop("unroll", 4)), stats=stats,
                      waves=int(over.pop("waves", 0)), streaming=streaming)
    else:  # split
        tpr = int(over.pop("tpr", 512))
        unroll = int(over.pop("unroll", 4))
        # About one block per multiprocessor in all: on the H200 sweep 16 groups of 1 MB ran in
        # 14.8 us with 8 chunks each, 15.0 with 16, 17.8 with 32 (Welford partials merge slower).
        want = max(1, ceil_div(sms, max(1, spec.rows)))
        per_chunk = max(tpr * unroll, ceil_div(lenv, want))
        chunks = int(over.pop("chunks", ceil_div(lenv, per_chunk)))
        params = dict(vec=vec, tpr=tpr, unroll=unroll, chunks=chunks, stats=stats,
                      apply_block=int(over.pop("apply_block", 256)), apply_unroll=int(over.pop("apply_unroll", 2)))
        why.append(f"{chunks} blocks per row")
    if over:
        raise ScheduleError(f"{spec.op} {algorithm}: unknown parameters {sorted(over)}")
    why.append(f"{vec}-element vectors, statistics {stats}")
    return Schedule.make(algorithm, why="; ".join(why), **params)


def _pipeline(over: dict[str, Any]) -> dict[str, Any]:
    """Persistent-grid options of the on-chip kernels: `per_sm` blocks per multiprocessor in all
    (0: a block per row or rows-per-block), `prefetch` a block's next row while this one reduces."""
    return {"per_sm": int(over.pop("per_sm", 0)), "prefetch": bool(over.pop("prefetch", False))}


def row_candidates(spec: RowSpec, device: DeviceInfo) -> list[Schedule]:
    """The tuning space: each strategy with a few shapes (the ones that apply to this row)."""
    out: list[Schedule] = [row_heuristic(spec, device, "naive")]
    itemsize = ITEMSIZE[spec.dtype]
    vec = vector_width(spec.length, itemsize)
    lenv = spec.length // vec
    warp = device.warp_size
    stats_list = ["rms"] if spec.kind == "rms" else list(LAYER_STATS)
    for stats in stats_list:
        tpr = warp
        while tpr >= 1:
            if ceil_div(lenv, tpr) <= 16:
                out.append(row_heuristic(spec, device, "warp", tpr=tpr, stats=stats))
            tpr //= 2
        for tpr in range(2 * warp, 1025, warp):
            items = ceil_div(lenv, tpr)
            if items <= 8 and (items == 1 or tpr * (items - 1) < lenv):
                out.append(row_heuristic(spec, device, "block", tpr=tpr, stats=stats))
        for tpr in (256, 512, 1024):
            items = ceil_div(lenv, tpr)
            if items * tpr * vec * itemsize <= device.shared_per_block_optin - 1024 and items <= 64:
                out.append(row_heuristic(spec, device, "block", tpr=tpr, store="smem", stats=stats))
        # Persistent grids with the next row loaded ahead (the heuristic shape; only where each
        # block gets several rows).
        for alg in ("warp", "block") if lenv <= 16 * warp else ("block",):
            try:
                base = row_heuristic(spec, device, alg, stats=stats)
            except ScheduleError:
                continue
            rpb = int(base["block"]) // int(base["tpr"])
            for per_sm in (4, 8):
                if base.get("store") == "regs" and spec.rows >= 2 * per_sm * device.multiprocessors * rpb:
                    out.append(row_heuristic(spec, device, alg, **{**dict(base.params), "per_sm": per_sm,
                                                                   "prefetch": True}))
    for stats in (["rms"] if spec.kind == "rms" else ["welford", "sumsq"]):
        for tpr in (256, 512, 1024):
            for unroll in (2, 4):
                out.append(row_heuristic(spec, device, "stream", tpr=tpr, unroll=unroll, stats=stats))
                for chunks in (2, 4, 8, 16, 32):
                    if ceil_div(lenv, chunks) >= tpr:
                        out.append(row_heuristic(spec, device, "split", tpr=tpr, unroll=unroll, chunks=chunks,
                                                 stats=stats))
    return [s for s in out if _fits(spec, s, device)]


def _fits(spec: RowSpec, schedule: Schedule, device: DeviceInfo) -> bool:
    try:
        row_plan(spec, schedule, device, "x")
        return True
    except ScheduleError:
        return False


def _common_params(spec: RowSpec, vec: int, stats: str) -> dict[str, Any]:
    return {"ctype": C_TYPE[spec.dtype], "ptype": C_TYPE[spec.ptype], "vec": vec, "length": spec.length,
            "kind": spec.kind, "stats": stats, "has_gamma": spec.has_gamma, "has_beta": spec.has_beta,
            "params": spec.params, "plane": spec.plane, "cpg": spec.cpg, "groups": spec.groups,
            "index_type": _index(spec)}


def _index(spec: RowSpec) -> str:
    return index_type(spec.numel + 16)


def _row_args(spec: RowSpec, out: str) -> list[Buf | Scalar]:
    return [Buf("x"), *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta), Buf(out),
            Scalar("i32", spec.rows), Scalar("f32", spec.eps)]


def _check_shape(spec: RowSpec, device: DeviceInfo, vec: int, threads: int) -> None:
    if spec.length % vec or vec * ITEMSIZE[spec.dtype] > 16 or vec & (vec - 1):
        raise ScheduleError(f"{spec.op}: vectors of {vec} do not tile rows of {spec.length} {spec.dtype}")
    if threads > device.max_threads_per_block or threads % device.warp_size:
        raise ScheduleError(f"{spec.op}: a block of {threads} threads does not fit {device.name} "
                            f"(warp {device.warp_size})")
    if spec.length > INT32_MAX or spec.rows > INT32_MAX:
        raise ScheduleError(f"{spec.op}: rows of {spec.length} elements need the naive kernel")


def row_plan(spec: RowSpec, schedule: Schedule, device: DeviceInfo, out: str) -> Plan:
    """Launches for one schedule; `out` names the output tensor."""
    name = spec.op
    alg = schedule.algorithm
    if spec.rows == 0 or spec.length == 0:
        return Plan(launches=())
    if alg == "naive":
        block = int(schedule["block"])
        if block & (block - 1) or block > device.max_threads_per_block:
            raise ScheduleError(f"{name} naive: block must be a power of two <= {device.max_threads_per_block}")
        idx = index_type(spec.numel + block)
        params = {"ctype": C_TYPE[spec.dtype], "ptype": C_TYPE[spec.ptype], "block": block, "kind": spec.kind,
                  "one_pass": spec.params == "channel", "has_gamma": spec.has_gamma, "has_beta": spec.has_beta,
                  "params": spec.params, "index_type": idx, "nhwc": spec.nhwc}
        args = [Buf("x"), *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta), Buf(out),
                Scalar("i32" if idx == "int" else "i64", spec.length), Scalar("i32", spec.plane or 1),
                Scalar("i32", spec.cpg or 1), Scalar("i32", spec.groups or 1), Scalar("f32", spec.eps)]
        return Plan((Launch.make("layer_norm/naive.hip.j2", f"{name}_naive", params, (spec.rows,), (block,), args),))
    if spec.nhwc:
        raise ScheduleError(f"{name}: the row kernels read NCHW; channels_last input takes the nhwc or naive kernels")
    vec = int(schedule["vec"])
    stats = _stats_for(spec, alg, schedule.get("stats"))
    lenv = spec.length // max(vec, 1)
    params = _common_params(spec, vec, stats)
    if alg in ("warp", "block"):
        tpr, items, block = int(schedule["tpr"]), int(schedule["items"]), int(schedule["block"])
        store = schedule.get("store", "regs")
        _check_shape(spec, device, vec, block)
        if tpr < 1 or tpr & (tpr - 1) and tpr <= device.warp_size or block % tpr:
            raise ScheduleError(f"{name}: {tpr} threads per row must be a power of two up to the warp or a "
                                f"multiple of it, and divide the block ({block})")
        if tpr > device.warp_size and (tpr != block or tpr % device.warp_size):
            raise ScheduleError(f"{name}: rows wider than a warp take the whole block ({tpr} != {block})")
        if items * tpr < lenv or (items - 1) * tpr >= lenv:
            raise ScheduleError(f"{name}: {items} vectors for each of {tpr} threads do not tile {lenv} vectors")
        shared = 0
        if store == "smem":
            if tpr != block:
                raise ScheduleError(f"{name}: shared-memory rows take a whole block")
            shared = items * tpr * vec * ITEMSIZE[spec.dtype]
            if shared > device.shared_per_block_optin - 6 * 32 * 4:
                raise ScheduleError(f"{name}: a row of {shared} bytes does not fit shared memory "
                                    f"({device.shared_per_block_optin})")
        elif store != "regs":
            raise ScheduleError(f"{name}: store must be regs or smem (got {store})")
        rpb = block // tpr
        grid = ceil_div(spec.rows, rpb)
        waves = int(schedule.get("waves", 0))
        if waves:
            grid = min(grid, waves * device.multiprocessors * device.resident_blocks(block))
        per_sm = int(schedule.get("per_sm", 0))
        if per_sm < 0:
            raise ScheduleError(f"{name}: per_sm must be >= 0 (got {per_sm})")
        if per_sm:
            grid = min(grid, per_sm * device.multiprocessors)
        prefetch = bool(schedule.get("prefetch", False))
        if prefetch and store != "regs":
            raise ScheduleError(f"{name}: prefetch keeps the next row in registers (store=regs, not {store})")
        params.update(tpr=tpr, items=items, block=block, store=store, streaming=bool(schedule.get("streaming")),
                      prefetch=prefetch)
        launch = Launch.make("layer_norm/onchip.hip.j2", f"{name}_{alg}", params, (grid,), (block,),
                             _row_args(spec, out), shared)
        return Plan((launch,))
    if alg == "stream":
        tpr, unroll = int(schedule["tpr"]), int(schedule["unroll"])
        _check_shape(spec, device, vec, tpr)
        grid = spec.rows
        waves = int(schedule.get("waves", 0))
        if waves:
            grid = min(grid, waves * device.multiprocessors * device.resident_blocks(tpr))
        params.update(tpr=tpr, unroll=unroll, streaming=bool(schedule.get("streaming")))
        return Plan((Launch.make("layer_norm/stream.hip.j2", f"{name}_stream", params, (grid,), (tpr,),
                                 _row_args(spec, out)),))
    if alg == "split":
        return _split_plan(spec, schedule, device, out, params, vec, lenv)
    raise ScheduleError(f"{name} has no algorithm '{alg}'")


def _split_plan(spec: RowSpec, schedule: Schedule, device: DeviceInfo, out: str, params: dict[str, Any],
                vec: int, lenv: int) -> Plan:
    name = spec.op
    tpr, unroll, chunks = int(schedule["tpr"]), int(schedule["unroll"]), int(schedule["chunks"])
    _check_shape(spec, device, vec, tpr)
    if chunks < 1 or ceil_div(lenv, ceil_div(lenv, chunks)) != chunks:
        raise ScheduleError(f"{name} split: {chunks} chunks of a {lenv}-vector row would leave one empty")
    if spec.rows * chunks > INT32_MAX:
        raise ScheduleError(f"{name} split: {spec.rows} x {chunks} blocks is too many")
    params.update(tpr=tpr, unroll=unroll, chunks=chunks)
    channel = spec.params == "channel"
    planes = spec.rows * spec.cpg
    stats_bytes = 4 * (3 * planes if channel else (spec.rows if spec.kind == "rms" else 3 * spec.rows))
    workspaces = (
        Workspace("counters", 4 * spec.rows, persistent=True, zero=True),
        Workspace("partials", 8 * spec.rows * chunks, persistent=True),
        Workspace("stats", stats_bytes, persistent=True),
    )
    stats_args: list[Buf | Scalar] = [Buf("x")]
    if channel:
        stats_args += [*ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta)]
    stats_args += [Buf("partials"), Buf("counters"), Buf("stats"), Scalar("i32", spec.rows), Scalar("f32", spec.eps)]
    stats_launch = Launch.make("layer_norm/split_stats.hip.j2", f"{name}_split_stats", params,
                               (spec.rows * chunks,), (tpr,), stats_args)
    ablock, aunroll = int(schedule["apply_block"]), int(schedule["apply_unroll"])
    if ablock > device.max_threads_per_block or ablock % device.warp_size:
        raise ScheduleError(f"{name} split: apply block of {ablock} threads does not fit {device.name}")
    if channel:
        apply = affine_launch(f"{name}_split_apply", spec.dtype, spec.numel, spec.plane, planes, device,
                              vec=vector_width(spec.plane * spec.cpg, ITEMSIZE[spec.dtype]), unroll=aunroll,
                              block=ablock, per_plane=True, coef="stats", out=out, streaming=False)
    else:
        nvec = spec.numel // vec
        grid = max(1, min(ceil_div(nvec, ablock * aunroll), 64 * device.multiprocessors))
        aparams = dict(_common_params(spec, vec, params["stats"]), block=ablock, unroll=aunroll, streaming=False)
        idx = aparams["index_type"]
        args = [Buf("x"), *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta), Buf("stats"),
                Buf(out), Scalar("i32" if idx == "int" else "i64", nvec)]
        apply = Launch.make("layer_norm/split_apply.hip.j2", f"{name}_split_apply", aparams, (grid,), (ablock,), args)
    return Plan((stats_launch, apply), workspaces)


# ---------------------------------------------------------------- float64 references

def layer_reference(x: np.ndarray, rows: int, length: int, eps: float, rms: bool) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) per row (two-pass, float64), or x / sqrt(mean(x^2) + eps)."""
    xd = np.asarray(x, dtype=np.float64).reshape(rows, length)
    if rms:
        return xd / np.sqrt((xd * xd).mean(axis=1, keepdims=True) + eps)
    mean = xd.mean(axis=1, keepdims=True)
    dev = xd - mean
    return dev / np.sqrt((dev * dev).mean(axis=1, keepdims=True) + eps)


def row_tolerance(dtype: str, algorithm: str, stats: str | None) -> tuple[float, float]:
    """(rtol, atol) against the float64 reference, relative to the largest |y|.

    fp32: a few roundings per element plus the statistics' own error (well under 1e-6 of the
    spread for every stable method): 4e-6. fp16: the output rounding alone is 2^-11 (4.9e-4),
    the input rounding does not count (the reference sees the same fp16 values): 2e-3.
    bf16: 8 significant bits, the output rounding alone is up to 2^-8 (3.9e-3) of |y|: 5e-3.
    The naive group-norm kernel uses the seed's one-pass sum/sum of squares, exact enough only
    on centred data; the tests give it centred data."""
    if dtype == "bfloat16":
        return 5e-3, 0.0
    if dtype == "float16":
        return 2e-3, 0.0
    return (2e-5 if algorithm == "naive" else 4e-6), 0.0
