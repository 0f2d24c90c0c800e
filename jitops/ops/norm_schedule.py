"""The row-normalization scheduler: which strategy, statistic and block shape for a RowSpec on a
device (row_heuristic), and the tuning space (row_candidates). Strategies: norm_common."""
from __future__ import annotations

from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import INT32_MAX, ITEMSIZE, Schedule, ceil_div
from .norm_plan import row_plan
from .norm_rows import LAYER_STATS, REG_ROW_BYTES, ROW_ALGORITHMS, RowSpec, pow2_ceil, stats_for, vector_width

def _block_shape(lenv: int, device: DeviceInfo, max_items: int = 8) -> tuple[int, int]:
    """(threads per row, vectors per thread) for a block per row.

    From an H200 sweep (scripts/sweep_norms.py, 2026-11-22): what pays is several resident
    blocks per multiprocessor (their load and reduce phases overlap; 1-2 big blocks per SM ran
    at 40-67% of copy), 2 to 8 vectors per thread, at least 128 threads, little padding.
    Registers: about 30 + 5 per 16-byte vector (ptxas: 7 vectors 56, 4 vectors 42-52).
    """
    warp = device.warp_size
    best: tuple[float, int, int] | None = None
    for items in range(1, max_items + 1):
        tpr = ceil_div(ceil_div(lenv, items), warp) * warp
        if tpr > 1024 or (items > 1 and tpr < 2 * warp):
            continue
        waste = (items * tpr - lenv) / lenv
        regs = 30 + 5 * items
        resident = min(device.max_threads_per_multiprocessor // tpr,
                       device.registers_per_multiprocessor // (tpr * regs), 32)
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
            why.append(f"short rows: {min(warp, pow2_ceil(ceil_div(lenv, 4)))} lanes per row, shuffles only")
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
    stats = stats_for(spec, algorithm, over.pop("stats", None))
    if algorithm == "naive":
        return Schedule.make("naive", why="; ".join(why + ["baseline: block per row, scalar, tree reduction"]),
                             block=int(over.pop("block", 256)))
    streaming = bool(over.pop("streaming", streaming))
    if algorithm == "warp":
        tpr = int(over.pop("tpr", min(warp, pow2_ceil(ceil_div(lenv, 4)))))
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
            tpr0, items0 = _block_shape(lenv, device)
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
