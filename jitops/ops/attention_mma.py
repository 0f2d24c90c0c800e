"""attention on the matrix cores (fused_mma: fp16 or bf16 operands, fp32 accumulation): tile choice,
split-KV, GQA packing and the launches.

One kernel family (templates/attention/fused_mma.hip.j2) covers every head dim 1..256 (padded
to a multiple of 16 inside the kernel), prefill and decoding:
- prefill: each warp owns 16-row groups of a query tile and sweeps all keys;
- decoding (one 16-row tile per row set): the warps split every K/V tile's keys between them
  and merge their softmax states at the end ("key_warps");
- grouped-query attention with few queries: the query heads that share a kv head are packed
  into the rows of one tile ("pack"), so K/V are read once per group;
- split-KV ("splits"): too few blocks to fill the device -> the keys are split across blocks,
  each writes a partial output and its log-sum-exp, attention_merge combines them;
- sm_90 decoding (tma_decode): K/V tiles by TMA into a swizzled ring ("tma", "stages"), and the
  splits of a row tile as one thread-block cluster merged in distributed shared memory ("cluster")
  instead of the merge kernel where the clusters fit.
"""
from __future__ import annotations

import math

from ..device import DeviceInfo
from ..errors import ScheduleError
from .attention_problem import AttentionProblem
from .base import C_TYPE, Buf, Launch, Plan, Scalar, Schedule, TensorMap, Workspace, ceil_div

MMA_DTYPES = ("float16", "bfloat16")
TEMPLATE = "attention/fused_mma.hip.j2"
MERGE_TEMPLATE = "attention/split_merge.hip.j2"
MERGE_BLOCK = 256
MAX_SPLITS = 128
MAX_CLUSTER = 16        # blocks per cluster: 8 portable, 16 on the H100 (the backend allows it per kernel)
MAX_PORTABLE_CLUSTER = 8
# (warps, row groups per warp, Q fragments in registers or None: by D) to try, preferred first on
# equal cost. H200 (2026-11-22, D=64): 8 warps x 1 group beat 4 x 2 by 10 to 12% on B=256 S=128 and
# B=8 H=16 S=2048 (16 warps per multiprocessor at 119 registers hide latency better than 8 warps at
# 209). H100 (2026-11-23, scripts/device_attention.py sweep): DiT D=72 runs 1.25x faster on 8 x 1
# than on 4 x 1; Llama-3 prefill D=128 1.25x faster on FA-2's 4 warps x 2 groups with Q re-read from
# shared memory than on 4 x 1, and 8 x 1 only 1.06x.
SHAPES_UP_TO_64 = ((8, 1, None), (4, 2, None), (4, 1, None), (2, 1, None))
SHAPES_UP_TO_96 = ((8, 1, None), (4, 1, None), (2, 1, None))
SHAPES_UP_TO_128 = ((4, 2, False), (4, 1, None), (2, 1, None))
SHAPES_ABOVE_128 = ((8, 1, None), (4, 1, None), (2, 1, None))     # Gemma D=256: 8 x 1 1.13x faster than 4 x 1


def mask_pairs(p: AttentionProblem) -> bool:
    """Whether a row mask's two adjacent keys come in one load: where its strides allow, up to DP = 96. The
    A100's picks run on an H200, both trees in one call (2026-11-29 04:20, scripts/device_attention_row_masks.py):
    BERT-base b32 S=384 146.7 -> 123.8 us, T5 80.7 -> 71.9, D = 96 458 -> 428, D = 64 S = 2048 1141 -> 890,
    D = 40 508 -> 462; at D = 128 (two row groups) 427 -> 459 and causal Llama-3 428 -> 435, same registers
    and no spill either way (NVRTC, sm_80), so not there."""
    return p.row_mask_pairs and padded_dim(p.d) <= 96


def padded_dim(d: int) -> int:
    """The head dim the matrix cores see: D rounded up to the 16 of one mma k-step."""
    return ceil_div(max(d, 1), 16) * 16


def q_in_registers(d: int) -> bool:
    """Q fragments stay in registers up to DP = 128; beyond, the O accumulators (DP/2 floats per
    lane) need the room and Q is re-read from shared memory per tile."""
    return padded_dim(d) <= 128


def shared_bytes(d: int, block_q: int, block_k: int, key_warps: int = 1, split: bool = False,
                 stages: int = 2, elem: int = 2, tma: bool = False, cluster: bool = False) -> int:
    """Q tile plus `stages` buffers of K and V tiles (rows padded by 8 elements); the merge
    epilogue reuses that space for fp32 per-warp states and may need more. tma: K / V slots of
    ceil(DP/64) blocks of block_k rows x 128 bytes (the 128-byte swizzle), 1024-byte aligned (1 KiB
    of slack), and the slots' mbarriers (static, 8 bytes each, counted here). cluster: the split's
    fp32 partial and log-sum-exp after the per-warp states, read by the other blocks of the cluster."""
    dp = padded_dim(d)
    if tma:
        main = elem * (dp + 8) * block_q + 1024 + 2 * stages * ceil_div(dp, 64) * block_k * 128 + 8 * stages
    else:
        main = elem * (dp + 8) * (block_q + 2 * stages * block_k)
    if key_warps == 1 and not split:
        return main
    merge = 4 * key_warps * block_q * (dp + 4 + 2) + (4 * block_q * (d + 1) if cluster else 0)
    return max(main, merge)


def _registers(d: int, groups: int, block_k: int, key_warps: int, q_regs: bool) -> int:
    """Rough registers per thread: O accumulators, scores, Q fragments (when kept) and ~64 for
    addresses and softmax state (the D=64 prefill kernel reported 119 on NVRTC 13)."""
    dt = padded_dim(d) // 16
    per_lane = 8 * groups * dt + 8 * groups * (block_k // 16 // key_warps)
    return 64 + per_lane + (4 * groups * dt if q_regs else 0)


def _blocks_per_sm(device: DeviceInfo, threads: int, smem: int, registers: int) -> int:
    return min(device.resident_blocks(threads, smem + 1024, min(registers, 255)), 32)   # 1 KiB reserved per block


def choose_splits(device: DeviceInfo, blocks: int, kv_tiles: int, per_sm: int) -> int:
    """FA-2's rule with our occupancy: split only when the blocks fill less than 80% of the
    device's block slots, then take the smallest split count whose wave efficiency is within
    85% of the best (at most 128 splits, at least 2 K/V tiles per split)."""
    slots = device.multiprocessors * per_sm
    if blocks >= 0.8 * slots or kv_tiles < 8:
        return 1
    most = min(MAX_SPLITS, kv_tiles // 2)
    effs = []
    for s in range(1, most + 1):
        waves = blocks * s / slots
        effs.append(waves / math.ceil(waves) if waves else 0.0)
    best = max(effs)
    return next(s for s, e in enumerate(effs, 1) if e >= 0.85 * best)


def decode_splits(device: DeviceInfo, blocks: int, kv_tiles: int, row_tiles: int = 1) -> int:
    """Decoding reads K/V once and is memory-bound; H100 sweeps (2026-11-25, same process, fp16):
    - Enough kv heads to give each multiprocessor a block: no split, each block streams its keys
      (Llama-3-8B B=16, 128 blocks: 94 us unsplit, 104-107 us with 2-3 splits + the merge).
    - Fewer, one row tile each: about two blocks per multiprocessor, but at least 4 K/V tiles per
      block (Llama-3 B=1, 8 blocks: 13.6 us with 16 splits, 15.0 / 17.9 / 28.8 with 32 / 8 / 4;
      B=2, 16 blocks: 16.5 us with 16, 18.3-18.7 with 8 / 12 / 24; B=4, 32 blocks: 33.8 us with 8,
      34.7 / 35.1 / 35.7 / 37.5 with 6 / 10 / 5 / 3).
    - Several row tiles per kv head (MQA with many query heads re-reading K/V through L2): about
      three per multiprocessor (Falcon-7B, 48 blocks: 16.4 us with 8 splits, 16.7 / 20.5 / 29.6 with
      4 / 3 / 1)."""
    if kv_tiles < 4 or blocks >= 0.9 * device.multiprocessors:
        return 1
    if row_tiles > 1:
        want = round(3 * device.multiprocessors / max(blocks, 1))
    else:
        want = min(math.ceil(2 * device.multiprocessors / max(blocks, 1)), kv_tiles // 4)
    want = max(1, min(want, MAX_SPLITS, kv_tiles // 2))
    return math.ceil(kv_tiles / math.ceil(kv_tiles / want))     # splits of whole tiles: none empty


TMA_DECODE_MAX_DP = 128     # the TMA decode tiles were measured at D = 64 (Falcon) and D = 128 (Llama-3)
TMA_SPLIT_TILE = (8, 8, 128)      # (warps, key warps, block_k) of split decoding on TMA: 8 warps x 16 of 128 keys


def tma_decode_applies(p: AttentionProblem, device: DeviceInfo) -> bool:
    """Decoding loads K / V by TMA (tma=1) on sm_90 for fp16 / bf16 with 16-byte rows (D a multiple of
    8) up to DP = 128; elsewhere the cp.async ring (and decode_splits) stays."""
    return device.hopper and p.dtype in MMA_DTYPES and p.d % 8 == 0 and padded_dim(p.d) <= TMA_DECODE_MAX_DP


def tma_decode(device: DeviceInfo, blocks: int, sk: int, row_tiles: int) -> tuple[dict, str]:
    """Decoding on sm_90 with K / V by TMA into a swizzled ring: the tile, ring depth and split (keys
    over blocks, merged by the merge kernel or inside a thread-block cluster). H100, 2026-11-26,
    scripts/device_decode_probe.py, fp16, graph replay, same process (us; SDPA in brackets):
    - Enough kv heads to give each SM a block (Llama-3-8B B=16, 128 blocks): no split, the scheduler's
      4 warps x 64-key tiles, a ring of 2 slots: 90.7-91.5 (90.7-91.3); the cp.async pick 93.6-95.7;
      8 warps x 128 keys 90.6-91.9; rings of 3 / 4 / 6: 91.3 / 91.4 / 92.0 (more bytes in flight do not
      help: the DRAM is busy; 2.96 TB/s of K / V against a device copy's 2.99).
    - Several row tiles per kv head (Falcon-7B MQA, 48 blocks of 3 row tiles): decode_splits' 8 splits +
      merge kernel, a ring of 3: 14.9 (16.0); ring of 2: 15.0-16.7, 4 splits 15.1, the cp.async pick 16.2-16.4;
      clusters 17.4-19.0.
    - One row tile per kv head, fewer than 0.9 per SM: 8 warps x 128-key tiles (fewer, larger copies
      per block: Llama-3 B=1 9.6 against 11.0 with 64-key tiles), a ring of 2. Where 8 splits of each
      kv head fit on half the SMs (B=1: 8 kv heads, 64 blocks), the splits are one cluster and merge
      through distributed shared memory: B=1 9.3-9.6 (9.8-9.9), against 10.9 with 16 splits + the merge
      kernel and 13.3-13.7 for the cp.async pick. Otherwise about one block per SM + the merge kernel:
      B=2 (16 kv heads) 8 splits 11.9 (11.5-12.0; clusters of 8 did not fit one wave at one block per
      SM: 13.5-20.7), B=4 (32) 4 splits 29.4 (29.2-29.6; clusters of 4 or 6 at two or three blocks per
      SM 29.1-29.5, of 4 at one 38.0)."""
    sms = device.multiprocessors
    if blocks >= 0.9 * sms:
        return {"stages": 2}, ", each block streams its keys once through a ring of 2 TMA tiles"
    if row_tiles > 1:
        return {"stages": 3}, ", a ring of 3 TMA tiles"
    warps, key_warps, bk = TMA_SPLIT_TILE
    kv_tiles = ceil_div(sk, bk)
    params = {"warps": warps, "key_warps": key_warps, "block_k": bk, "stages": 2}
    cluster = min(MAX_PORTABLE_CLUSTER, kv_tiles // 2)
    if cluster >= 2 and blocks * cluster <= sms // 2:
        return ({**params, "splits": cluster, "cluster": 1},
                f", keys split {cluster} ways over one thread-block cluster per kv head ({blocks * cluster} blocks), "
                f"merged in distributed shared memory; a ring of 2 TMA tiles of {bk} keys")
    splits = max(1, min(round(sms / blocks), kv_tiles // 2))
    if splits > 1:
        params["splits"] = splits
    return (params, f", keys split {splits} ways ({blocks * splits} blocks, about one per SM) + merge kernel; "
                    f"a ring of 2 TMA tiles of {bk} keys" if splits > 1 else ", a ring of 2 TMA tiles")


def _pack(p: AttentionProblem) -> bool:
    """Pack a kv head's query heads into one row set when each head has few query rows (decoding,
    speculative decoding): K/V are then read once per kv head (MQA: once for all 71 Falcon heads)."""
    return p.group > 1 and p.sq <= 16


def _small_sk_block(sk: int, options: tuple[int, ...]) -> int:
    """For short key ranges (cross-attention to 77 tokens) the tile that wastes the fewest padded
    keys, charging each tile 16 keys' worth of fixed cost."""
    return min(options, key=lambda bk: (ceil_div(max(sk, 1), bk) * (bk + 16), -bk))


def mma_schedule(p: AttentionProblem, device: DeviceInfo) -> Schedule:
    """The scheduler's fused_mma tiles for this problem, with the reasons in `why`."""
    dp = padded_dim(p.d)
    pack = _pack(p)
    rows = (p.group if pack else 1) * p.sq
    sets = p.batch * p.heads // (p.group if pack else 1)
    shapes: tuple[tuple[int, int, int, bool | None, tuple[int, ...]], ...]   # (warps, groups, key warps, Q, tiles)
    decoding = rows <= 16 or (pack and rows <= 128)
    if decoding:                         # one or two 16-row tiles per set: the warps split each tile's keys
        row_warps = 1 if rows <= 16 else 2
        shapes = tuple((row_warps * bk // 16, 1, bk // 16, None, (bk,))            # one 16-key slice per warp
                       for bk in ((64, 32, 16) if dp <= 128 else (32, 16)))
    else:
        base = (SHAPES_UP_TO_64 if dp <= 64 else SHAPES_UP_TO_96 if dp <= 96 else SHAPES_UP_TO_128 if dp <= 128
                else SHAPES_ABOVE_128)
        bks = (64, 32, 16) if dp <= 128 else (32, 16)
        if p.sk <= 128:
            bks = tuple(sorted(bks, key=lambda bk: bk != _small_sk_block(p.sk, bks)))
        shapes = tuple((w, g, 1, q, bks) for w, g, q in base)
    best = None
    for w, groups, key_warps, q_regs, bks in shapes:
        threads = w * device.warp_size
        if threads > device.max_threads_per_block:
            continue
        block_q = 16 * groups * (w // key_warps)
        for bk in bks:
            smem = shared_bytes(p.d, block_q, bk, key_warps, True)
            if smem <= device.shared_per_block_optin:
                break
        else:
            continue
        blocks = sets * ceil_div(max(rows, 1), block_q)
        cost = ceil_div(blocks, device.multiprocessors) * (block_q + 32)
        if best is None or cost < best[0]:
            best = (cost, w, groups, key_warps, bk, blocks, threads, q_regs)
    if best is None:
        raise ScheduleError(f"attention fused_mma: no tile of D={p.d} fits {device.shared_per_block_optin} bytes "
                            f"of shared memory on {device.name}")
    _, w, groups, key_warps, bk, blocks, threads, q_regs = best
    block_q = 16 * groups * (w // key_warps)
    per_sm = _blocks_per_sm(device, threads, shared_bytes(p.d, block_q, bk, key_warps, True),
                            _registers(p.d, groups, bk, key_warps, q_in_registers(p.d) if q_regs is None else q_regs))
    kv_tiles = ceil_div(p.sk, bk)
    row_tiles = ceil_div(max(rows, 1), block_q)
    splits = (decode_splits(device, blocks, kv_tiles, row_tiles) if decoding
              else choose_splits(device, blocks, kv_tiles, per_sm))
    params: dict = dict(warps=w, row_groups=groups, block_k=bk)
    if key_warps > 1:
        params["key_warps"] = key_warps
    if q_regs is not None and q_regs != q_in_registers(p.d):
        params["q_regs"] = q_regs
    if pack:
        params["pack"] = True
    if decoding and tma_decode_applies(p, device):
        tma, tail = tma_decode(device, blocks, p.sk, row_tiles)
        if row_tiles > 1 and splits > 1:        # several row tiles per kv head: decode_splits' count
            tma["splits"] = splits
        params.update(tma=1, **tma)
        w, key_warps, bk = params["warps"], params.get("key_warps", 1), params["block_k"]
        s_eff = int(params.get("splits", 1))
        smem = shared_bytes(p.d, block_q, bk, key_warps, s_eff > 1, int(params["stages"]), tma=True,
                            cluster=bool(params.get("cluster")))
        why = (f"{p.dtype} on matrix cores, D={p.d} padded to {dp}: {w} warps, {block_q} query rows, each warp "
               f"1/{key_warps} of every K/V tile of {bk} keys, K/V by TMA ({smem // 1024} KiB shared); {blocks} blocks"
               + (f" ({p.group} query heads per kv head packed into one row set)" if pack else "")
               + (f", keys split {s_eff} ways + merge kernel" if row_tiles > 1 and s_eff > 1 else "") + tail)
        return Schedule.make("fused_mma", why=why, **params)
    if splits > 1:
        params["splits"] = splits
    elif decoding:      # a block streams its kv head's keys once: L2 fetches 256 bytes per request
        params["prefetch"] = 256     # (H100 Llama-3 decode 95.6 -> 94.2 us; 128 B: 94.8)
    smem = shared_bytes(p.d, block_q, bk, key_warps, splits > 1)
    why = (f"{p.dtype} on matrix cores, D={p.d} padded to {dp}: {w} warps, "
           + (f"{block_q} query rows, each warp 1/{key_warps} of every K/V tile" if key_warps > 1
              else f"{groups} x 16 query rows per warp")
           + f"; K/V tiles of {bk} keys double-buffered ({smem // 1024} KiB shared); {blocks} blocks"
           + (f" ({p.group} query heads per kv head packed into one row set)" if pack else "")
           + (f", keys split {splits} ways ({blocks * splits} blocks; {per_sm} per SM fit) + merge"
              if splits > 1 else ", each block streams its keys once (L2 prefetch 256 B)" if decoding else ""))
    return Schedule.make("fused_mma", why=why, **params)


def kv_tensor_map(p: AttentionProblem, name: str, block_k: int) -> TensorMap:
    """K or V for TMA in boxes of 64 columns x block_k rows: a dense (D, Sk, B * Hk) tensor, or for
    heads-inner storage (D, Sk, Hk, B) with its strides (the kernels pass (head, batch) then)."""
    if p.kv_layout:
        sb, sh, ss = p.kv_strides()
        return TensorMap(name, p.dtype, (p.d, p.sk, p.kv_heads, p.batch), (64, block_k, 1, 1), strides=(ss, sh, sb))
    return TensorMap(name, p.dtype, (p.d, p.sk, p.batch * p.kv_heads), (64, block_k, 1))


def mma_candidates(p: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """Tile variants for the tuner: warps x row groups x block_k, and split counts around the
    heuristic's when it splits."""
    out = []
    dp = padded_dim(p.d)
    for warps in (2, 4, 8, 16):
        for groups in ((1, 2) if dp <= 64 and warps <= 8 else (1,)):
            if dp > 128 and warps > 4:
                continue
            if warps * device.warp_size > device.max_threads_per_block:
                continue
            for bk in ((32, 64, 128) if dp <= 64 else (32, 64)):
                if shared_bytes(p.d, 16 * warps * groups, bk) > device.shared_per_block_optin:
                    continue
                out.append(Schedule.make("fused_mma", warps=warps, row_groups=groups, block_k=bk))
                if groups == 2 and warps == 4 and device.backend == "cuda":
                    # three resident blocks instead of two: registers capped near 168 per thread
                    out.append(Schedule.make("fused_mma", warps=4, row_groups=2, block_k=bk, min_blocks=3))
    if 64 < dp <= 128:                   # FA-2's D=128 shape: 4 warps x 32 rows, Q re-read from shared memory
        for bk in (32, 64):
            if shared_bytes(p.d, 128, bk) <= device.shared_per_block_optin:
                out.append(Schedule.make("fused_mma", warps=4, row_groups=2, block_k=bk, q_regs=False))
    h = mma_schedule(p, device)
    out.append(h)
    s = int(h.get("splits", 1))
    if s > 1 or h.get("key_warps", 1) > 1:
        base = {k: v for k, v in h.params if k not in ("splits", "cluster")}
        for alt in sorted({max(1, s // 2), s * 2, s * 4} - {s}):
            if alt <= MAX_SPLITS:
                out.append(Schedule.make("fused_mma", **base, **({"splits": alt} if alt > 1 else {})))
    if h.get("tma"):
        out.extend(_tma_decode_candidates(p, device, h))
    return out


def _tma_decode_candidates(p: AttentionProblem, device: DeviceInfo, h: Schedule) -> list[Schedule]:
    """The TMA decode pick's neighbours (the H100 sweeps' alternatives): the pick with the other ring
    depth (2 or 3), then 64- and 128-key tiles with a ring of 2 at half, the same and twice the pick's
    split count, each merged by the kernel or, up to 16 splits, in a cluster (about 10-14 schedules)."""
    rows = (p.group if h.get("pack") else 1) * p.sq
    row_warps = 1 if rows <= 16 else 2
    s = int(h.get("splits", 1))
    other_ring = {2: 3, 3: 2}.get(int(h["stages"]))
    out = [Schedule.make("fused_mma", **{**dict(h.params), "stages": other_ring})] if other_ring else []
    base = {k: v for k, v in h.params if k not in ("warps", "key_warps", "block_k", "stages", "splits", "cluster")}
    for bk in (64, 128):
        kw = bk // 16 if row_warps == 1 else 4
        if kw * row_warps * device.warp_size > device.max_threads_per_block:
            continue
        for splits in sorted({max(1, s // 2), s, 2 * s}):
            if ceil_div(p.sk, splits) < bk:
                continue
            for cluster in ((0, 1) if 1 < splits <= MAX_CLUSTER else (0,)):
                smem = shared_bytes(p.d, 16 * row_warps, bk, kw, splits > 1, 2, tma=True, cluster=bool(cluster))
                if smem <= device.shared_per_block_optin:
                    out.append(Schedule.make("fused_mma", **base, warps=kw * row_warps, key_warps=kw, block_k=bk,
                                             stages=2, **({"splits": splits} if splits > 1 else {}),
                                             **({"cluster": 1} if cluster else {})))
    return out


def plan_mma(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, idx: str, common: dict,
             mask_args: tuple, tail: tuple, scale_log2: float) -> Plan:
    """The fused_mma launch, plus the merge launch and fp32 workspaces when the keys are split."""
    warps, groups, bk = (int(schedule[n]) for n in ("warps", "row_groups", "block_k"))
    key_warps = int(schedule.get("key_warps", 1))
    splits = int(schedule.get("splits", 1))
    stages = int(schedule.get("stages", 2))
    pack = bool(schedule.get("pack", False)) and p.group > 1
    prefetch = int(schedule.get("prefetch", 0))
    tma = bool(int(schedule.get("tma", 0)))
    cluster = bool(int(schedule.get("cluster", 0)))
    if tma and not (device.hopper or device.backend == "cpu"):
        raise ScheduleError(f"attention fused_mma: tma=1 (K / V by Hopper bulk copies) needs an sm_90 device, "
                            f"not {device.name} ({device.arch}); the CPU emulator runs its tiles with plain loads")
    if tma and (p.d % 8 or prefetch):
        raise ScheduleError(f"attention fused_mma: tma=1 needs D a multiple of 8 (16-byte rows; D={p.d}) and "
                            f"no cp.async prefetch (prefetch={prefetch})")
    if cluster and not device.hopper:
        raise ScheduleError(f"attention fused_mma: cluster=1 (split-KV merged through distributed shared memory) "
                            f"needs an sm_90 device, not {device.name} ({device.arch})")
    if prefetch not in (0, 64, 128, 256):
        raise ScheduleError(f"attention fused_mma: prefetch={prefetch} must be 0, 64, 128 or 256 (bytes of L2 prefetch)")
    if (bk % 16 or bk <= 0 or warps <= 0 or groups <= 0 or key_warps <= 0 or warps % key_warps
            or (bk // 16) % key_warps or splits < 1 or not 2 <= stages <= 8):
        raise ScheduleError(f"attention fused_mma: block_k={bk} must be a multiple of 16 whose 16-key slices "
                            f"divide among key_warps={key_warps}, which must divide warps={warps}")
    threads = warps * device.warp_size
    block_q = 16 * groups * (warps // key_warps)
    rows = (p.group if pack else 1) * p.sq
    sets = p.batch * p.heads // (p.group if pack else 1)
    q_tiles = ceil_div(rows, block_q)
    chunk = ceil_div(ceil_div(max(p.sk, 1), splits), bk) * bk
    splits = ceil_div(max(p.sk, 1), chunk) if splits > 1 else 1     # no empty splits
    if cluster and splits > MAX_CLUSTER:
        raise ScheduleError(f"attention fused_mma: cluster=1 merges at most {MAX_CLUSTER} splits (one thread-block "
                            f"cluster), not {splits}")
    cluster = cluster and splits > 1
    smem = shared_bytes(p.d, block_q, bk, key_warps, splits > 1, stages, tma=tma, cluster=cluster)
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"attention fused_mma: {threads} threads per block exceed {device.name}'s limit")
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"attention fused_mma: {smem} bytes of shared memory exceed "
                            f"{device.shared_per_block_optin} on {device.name}")
    blocks = sets * q_tiles * splits
    if blocks > 2**31 - 1:
        raise ScheduleError(f"attention fused_mma: {blocks} blocks exceed the grid limit")
    params = {**common, "head_dim": p.d, "warps": warps, "row_groups": groups, "block_k": bk,
              "key_warps": key_warps, "threads": threads, "min_blocks": int(schedule.get("min_blocks", 0)),
              "scale_positive": p.scale > 0, "q_in_regs": bool(schedule.get("q_regs", q_in_registers(p.d))),
              "packed": pack, "split": splits > 1, "stages": stages, **({"key_mask": True} if p.key_mask else {}),
              **({"row_mask": True} if p.row_mask else {}), **({"mask_pairs": True} if mask_pairs(p) else {}),
              "l2_prefetch": prefetch, "tma": tma, "tma_maps": tma and device.backend == "cuda",
              "cluster": splits if cluster else 0}
    total_rows = p.batch * p.heads * p.sq
    ikind = "i32" if idx == "int" else "i64"
    if cluster:
        dest: tuple = (Buf("out"), Scalar("i32", chunk))
    elif splits > 1:
        dest = (Buf("opart"), Buf("lse"), Scalar("i32", splits), Scalar("i32", chunk), Scalar(ikind, total_rows))
    else:
        dest = (Buf("out"),)
    args = (Buf("q"), Buf("k"), Buf("v"), *mask_args, *dest, *tail, Scalar("i32", q_tiles),
            Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    if params["tma_maps"]:
        args += tuple(kv_tensor_map(p, n, bk) for n in ("k", "v"))
    launch = Launch.make(TEMPLATE, "attention_fused_mma", params, (blocks,), (threads,), args, smem)
    if splits == 1 or cluster:
        return Plan(launches=(launch,))
    n = total_rows * p.d
    merge = Launch.make(MERGE_TEMPLATE, "attention_merge",
                        {"index_type": idx, "ctype": C_TYPE[p.dtype], "head_dim": p.d, "block": MERGE_BLOCK,
                         "q_layout": common["q_layout"]},
                        (ceil_div(n, MERGE_BLOCK),), (MERGE_BLOCK,),
                        (Buf("opart"), Buf("lse"), Buf("out"), Scalar(ikind, total_rows), Scalar("i32", splits),
                         Scalar("i32", p.heads), Scalar("i32", p.sq), Scalar("i32", p.batch)))
    return Plan(launches=(launch, merge), workspaces=(Workspace("opart", 4 * splits * n),
                                                       Workspace("lse", 4 * splits * total_rows)))
