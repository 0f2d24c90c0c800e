"""Kernel launches of a row-normalization schedule (templates/rows/): the on-chip kernels
(warp, block), stream, split (grid reduction, then an element-wise or per-channel apply) and naive."""
from __future__ import annotations

from typing import Any

from ..device import DeviceInfo
from ..errors import ScheduleError
from .base import C_TYPE, INT32_MAX, ITEMSIZE, Buf, Launch, Plan, Scalar, Schedule, Workspace, ceil_div, index_type
from .norm_affine import affine_launch
from .norm_rows import RowSpec, ptr_or_none, stats_for, vector_width

def _common_params(spec: RowSpec, vec: int, stats: str) -> dict[str, Any]:
    return {"ctype": C_TYPE[spec.dtype], "ptype": C_TYPE[spec.ptype], "vec": vec, "length": spec.length,
            "kind": spec.kind, "stats": stats, "has_gamma": spec.has_gamma, "has_beta": spec.has_beta,
            "params": spec.params, "plane": spec.plane, "cpg": spec.cpg, "groups": spec.groups,
            "index_type": _index(spec), **_skip_params(spec)}


def _skip_params(spec: RowSpec) -> dict[str, Any]:
    return {"has_skip": spec.has_skip, "has_bias": spec.has_bias, "has_sum": spec.has_sum,
            "btype": C_TYPE[spec.btype or spec.dtype]}


def _index(spec: RowSpec) -> str:
    return index_type(spec.numel + 16)


def _row_args(spec: RowSpec, out: str) -> list[Buf | Scalar]:
    return [Buf("x"), *spec.skip_args, *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta),
            Buf(out), *ptr_or_none("sum", spec.has_sum), Scalar("i32", spec.rows), Scalar("f32", spec.eps)]


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
                  "params": spec.params, "index_type": idx, "nhwc": spec.nhwc, **_skip_params(spec)}
        args = [Buf("x"), *spec.skip_args, *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta),
                Buf(out), *ptr_or_none("sum", spec.has_sum),
                Scalar("i32" if idx == "int" else "i64", spec.length), Scalar("i32", spec.plane or 1),
                Scalar("i32", spec.cpg or 1), Scalar("i32", spec.groups or 1), Scalar("f32", spec.eps)]
        return Plan((Launch.make("rows/naive.hip.j2", f"{name}_naive", params, (spec.rows,), (block,), args),))
    if spec.nhwc:
        raise ScheduleError(f"{name}: the row kernels read NCHW; channels_last input takes the nhwc or naive kernels")
    vec = int(schedule["vec"])
    stats = stats_for(spec, alg, schedule.get("stats"))
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
        launch = Launch.make("rows/onchip.hip.j2", f"{name}_{alg}", params, (grid,), (block,),
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
        return Plan((Launch.make("rows/stream.hip.j2", f"{name}_stream", params, (grid,), (tpr,),
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
    stats_args: list[Buf | Scalar] = [Buf("x"), *spec.skip_args, *ptr_or_none("sum", spec.has_sum)]
    if channel:
        stats_args += [*ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta)]
    stats_args += [Buf("partials"), Buf("counters"), Buf("stats"), Scalar("i32", spec.rows), Scalar("f32", spec.eps)]
    stats_launch = Launch.make("rows/split_stats.hip.j2", f"{name}_split_stats", params,
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
        # With a sum output the apply reads the sum row split_stats wrote; else it adds the residual again.
        source = [Buf("sum")] if spec.has_sum else [Buf("x"), *spec.skip_args]
        args = [*source, *ptr_or_none("gamma", spec.has_gamma), *ptr_or_none("beta", spec.has_beta), Buf("stats"),
                Buf(out), Scalar("i32" if idx == "int" else "i64", nvec)]
        apply = Launch.make("rows/split_apply.hip.j2", f"{name}_split_apply", aparams, (grid,), (ablock,), args)
    return Plan((stats_launch, apply), workspaces)
