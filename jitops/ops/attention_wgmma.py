"""attention on Hopper's warpgroup MMA (fused_wgmma, sm_90a): the scheduler's schedule, the tuner's
candidates and benchmark mode's shortlist, and the launch. What a tile needs is in attention_wgmma_fit,
the measured rules that pick one (the history below) in attention_wgmma_rules.

templates/attention/fused_wgmma.hip.j2: `groups` warpgroups of 128 threads each own 64 query rows
of one (batch, head) and sweep the keys in tiles of `block_k`; S = Q K^T and O += P V are wgmma
(m64nNk16, fp32 accumulators), P never leaves registers. It covers prefill-like shapes: head dims
that are multiples of 8 up to 256 (padded to 16 inside), GQA, causal, additive masks. Decoding
(few query rows) stays on fused_mma, whose split-KV and head packing fit it. D = 256 (Gemma) runs
2 warpgroups x 64-key tiles in 198 registers (NVRTC 13.5, no spills) and 207 KiB of shared
memory: 1.16x fused_mma on the H100 (2026-11-25, Gemma-7B prefill, 163 vs 189 us).

On sm_90 the scheduler loads K / V by TMA (`tma=1`: 128-byte-swizzled tiles, tensor maps encoded
at bind): in the plain loop, thread 0 issuing over two buffers (`plain_tma_tiles`: every D, except
D <= 64 where 128-key tiles would pad the keys), else in the warp-specialized loop, one thread of
the producer warpgroup issuing (`tma_tiles`: causal calls whose keys pad 128-key tiles; also the
fallback where the plain loop does not fit). H100 model shapes (2026-11-25): 0.773x -> 0.940x SDPA (fp16 geomean) at 15:25,
0.994x at 17:31 with causal D = 72-160 moved to the plain loop; Gemma D = 256 1.83x faster.
2026-11-26: the plain loop skips the running max while probabilities stay bounded (`bounded_exp`),
runs 4 warpgroups where rows are not whole 32-byte sectors (`four_groups`) and 3 warpgroups of 128-key
tiles at D = 128 without causal masking (`three_groups`): 1.02-1.18x the earlier picks.
2026-11-27: causal grids go heaviest first within groups of heads where all heads' K / V exceed 2x L2
(`causal_head_group`, `head_group`): 1.05-1.14x at B=8 H=16 S=2048 D=128 and Llama-2-7B S=4096.
Later that day: calls under a wave of blocks take fused_wgmma too, on one warpgroup per block where
that grid needs no more waves of resident blocks (`preferred`, `one_group`: ViT-B/16 b1 1.8x, BERT-base
b1 S=128 1.4x), and a partial last key tile runs after the loop at its own width (`trim_flag`,
`trimmed_tail`: ViT / DeiT b32-b64 1.09x). With the trimmed tile the plain loop also takes CLIP's 257
keys (`_trimmed_key_use`: 1.26-1.61x SDPA), long queries over 64-128 keys (`short_keys`: SD / SDXL
cross-attention over 77 text tokens, 1.00-1.63x) and 64-255 queries over 1024 keys or more
(`short_queries`: Whisper's decoder cross-attention, 1.21-1.41x), which ran the producer loop or
fused_mma before. Calls over one key tile whose grids fill a wave walk 2-8 query tiles per block over
it, loaded once (`query_walk`, `q_walk`: SDXL cross-attention b8 1.22x, T5 cross 1.15x, PixArt 1.18x).
Padding masks ([B, 1, 1, Sk]) load one value per column (`key_mask`): BERT / T5 with padding masks 1.33-2.18x
faster; since 2026-11-28 their tiles inside the bounds take the fast softmax step and the bounded step (one
FFMA per score adds the mask), and at DP <= 64 the unmasked 128-key tiles, which then fit: 1.20-1.54x more.
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .attention_mma import kv_tensor_map, padded_dim
from .attention_problem import AttentionProblem
from .attention_wgmma_fit import fits, shared_bytes, why_not
from .attention_wgmma_rules import (bounded_exp, causal_head_group, four_groups, four_groups_block_k, grid_blocks,
                                    plain_resident, plain_tma_tiles, query_walk, short_keys, short_queries, tail_keys,
                                    three_groups, tiles_fast, tma_tiles, trim_flag, walk_resident)
from .base import Buf, Launch, Plan, Scalar, Schedule, ceil_div

TEMPLATE = "attention/fused_wgmma.hip.j2"
BLOCK_KS = (64, 128)
GROUPS = (2, 3)
# The plain TMA loop also runs one warpgroup of 64 rows per block (up to 4 blocks per SM), by an
# explicit schedule only: H100, 2026-11-26 20:15, 0.57-1.03x the picks from BERT b32 S=128 up; 1.17x on
# BERT b8 S=128, which stays on fused_mma for its eager host cost (preferred()); docs/performance.md.
# Four warpgroups (256 query rows, 512 threads at 128 registers, one block per SM) share each K/V tile:
# the scheduler's pick for head dims whose rows are not whole 32-byte sectors (four_groups).
PLAIN_GROUPS = (1, 2, 3, 4)
STAGES = (2, 3)         # 2: no overlap inside a warpgroup; 3: FlashAttention-3's softmax / GEMM overlap
MAX_WALK = 64           # q_walk: query tiles one block walks over a single key tile (cross-attention)
RINGS = (2, 3, 4)       # producer=1: K/V buffers between the producer warpgroup and the consumers


def wgmma_schedule(p: AttentionProblem, device: DeviceInfo) -> Schedule:
    """The scheduler's fused_wgmma tiles, with the reasons in `why`."""
    reason = why_not(p, device)
    if reason:
        raise ScheduleError(f"attention fused_wgmma: {reason}")
    dp = padded_dim(p.d)
    plain = plain_tma_tiles(p, device)
    if plain:
        groups, bk, release = plain
        ring = 2
        bounded = bounded_exp(p)
        walk = query_walk(p, device)
        if walk:
            groups, bk, release, ring, bounded = 1, 128, False, 1, False
        elif four_groups(p, device):
            groups, bk, release, ring = 4, four_groups_block_k(p, device), True, 3
        elif three_groups(p, device):
            groups, bk, release, bounded = 3, 128, True, True
        blocks = grid_blocks(p, 64 * groups, walk or 1)
        smem = shared_bytes(p.d, groups, bk, ring, True, 2 if walk else 1)
        why = (f"{p.dtype} on Hopper warpgroup MMA (sm_90a), D={p.d} padded to {dp}: {groups} warpgroup{'s' if groups > 1 else ''} x 64 query "
               f"rows, S = QK^T and O += PV by wgmma (P from registers), {ring} K/V buffer{'s' if ring > 1 else ''} of {bk} keys loaded by TMA "
               f"into the 128-byte swizzle" + (", released per warp on mbarriers" if release else "")
               + (", no running max while the probabilities stay bounded" if bounded else "")
               + f" ({smem // 1024} KiB shared); {blocks} blocks")
        trim = trim_flag(p, bk)
        why += f"; the last key tile at {tail_keys(p, bk)} keys" if trim else ""
        if walk:
            why += (f"; {p.sq} queries over {p.sk} keys: each block walks {walk} query tiles over the one key tile, "
                    f"loaded once, the next tile's Q staged while one computes")
        elif short_keys(p):
            why += f"; {p.sq} queries over {p.sk} keys (cross-attention): one key tile per block, no split"
        elif short_queries(p):
            why += f"; {p.sq} queries over {p.sk} keys: each warpgroup walks every key tile, no split-KV"
        return Schedule.make("fused_wgmma", why=why, groups=groups, block_k=bk, tma=1,
                             **({"stages": ring} if ring != 2 else {}), **({"release": 1} if release else {}),
                             **({"bounded": 1} if bounded else {}), **trim, **({"q_walk": walk} if walk else {}))
    tma = tma_tiles(p, device)
    if tma is None:
        raise ScheduleError(f"attention fused_wgmma: D={p.d} does not fit {device.name}")
    groups, bk, ring = tma
    blocks = grid_blocks(p, 64 * groups)
    smem = shared_bytes(p.d, groups, bk, ring, True)
    why = (f"{p.dtype} on Hopper warpgroup MMA (sm_90a), D={p.d} padded to {dp}: {groups} consumer warpgroups x "
           f"64 query rows, S = QK^T and O += PV by wgmma (P from registers); a producer warpgroup loads "
           f"{ring} K/V buffers of {bk} keys by TMA into the 128-byte swizzle ({smem // 1024} KiB shared); "
           f"{blocks} blocks")
    return Schedule.make("fused_wgmma", why=why, groups=groups, block_k=bk, stages=ring, producer=1, tma=1)


def wgmma_candidates(p: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """The tuner's fused_wgmma tiles: K / V by TMA only. The cp.async loops stay reachable by an
    explicit schedule, but lost every H100 comparison (2026-11-25: the TMA producer 1.13-1.49x the
    cp.async producer on six shapes, the plain TMA loop 1.83x the plain cp.async loop at D = 256),
    and timing them doubled `jitops tune`'s candidate list."""
    if why_not(p, device):
        return []
    plain = [Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, **({"stages": r} if r != 2 else {}), **rel)
             for rel in ({}, {"release": 1}) for g in GROUPS for bk in BLOCK_KS for r in RINGS
             if fits(p.d, g, bk, device, r, False, True)]
    if tiles_fast(p):           # the scheduler's plain tiles, and 4 warpgroups, without the running max
        pick = plain_tma_tiles(p, device)
        rel = {"release": 1} if (pick[2] if pick else p.causal != "none") else {}
        plain += [Schedule.make("fused_wgmma", groups=2, block_k=bk, tma=1, bounded=1, **rel)
                  for bk in BLOCK_KS if fits(p.d, 2, bk, device, 2, False, True)]
        for bk in (64, 128) if four_groups_block_k(p, device) == 128 else (64,):
            if fits(p.d, 4, bk, device, 3, False, True):
                plain.append(Schedule.make("fused_wgmma", groups=4, block_k=bk, tma=1, stages=3, release=1, bounded=1))
        if fits(p.d, 3, 128, device, 2, False, True):
            plain.append(Schedule.make("fused_wgmma", groups=3, block_k=128, tma=1, release=1, bounded=1))
    plain = [Schedule.make("fused_wgmma", **s.as_dict()["params"], **trim_flag(p, int(s["block_k"]))) for s in plain]
    plain += walk_schedules(p, device)
    specialized = [Schedule.make("fused_wgmma", groups=g, block_k=bk, stages=ring, producer=1, tma=1)
                   for g in GROUPS for bk in BLOCK_KS for ring in RINGS if fits(p.d, g, bk, device, ring, True, True)]
    return specialized + plain


def walk_schedules(p: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """One warpgroup walking 2, 4 or 8 query tiles over the one key tile (q_walk), where a walk applies:
    not causal, Sk <= 128, more query tiles than the walk."""
    if p.causal != "none" or p.sk > 128 or not fits(p.d, 1, 128, device, 1, False, True):
        return []
    return [Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, stages=1, q_walk=w, **trim_flag(p, 128))
            for w in (2, 4, 8) if w <= ceil_div(p.sq, 64)]


def wgmma_shortlist(p: AttentionProblem, device: DeviceInfo, pick: Schedule, n: int) -> list[Schedule]:
    """The pick and its nearest plain-TMA neighbours, at most n (benchmark mode times them): the same
    loop with the other key-tile size, with release toggled, with the bounded step toggled where it
    applies, and the 3- and 4-warpgroup bounded tiles. There is no rated order among them (the
    scheduler's rules are measured thresholds, not a cost model), so nearest first."""
    if pick.get("q_walk"):                      # the other walks, then the plain tile without one
        walks = [s for s in walk_schedules(p, device) if s != pick]
        plain = Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, **trim_flag(p, 128))
        return ([pick] + walks + [plain])[:n]
    groups, bk = int(pick["groups"]), int(pick["block_k"])
    flags = {k: int(pick.get(k, 0)) for k in ("release", "bounded")}
    stages = int(pick.get("stages", 2))
    near = [dict(groups=groups, block_k=192 - bk, stages=stages, **flags),
            dict(groups=groups, block_k=bk, stages=stages, **{**flags, "release": 1 - flags["release"]})]
    if tiles_fast(p):
        near.append(dict(groups=groups, block_k=bk, stages=stages, **{**flags, "bounded": 1 - flags["bounded"]}))
        near += [dict(groups=3, block_k=128, stages=2, release=1, bounded=1),
                 dict(groups=4, block_k=64, stages=3, release=1, bounded=1),
                 dict(groups=2, block_k=64, stages=2, release=flags["release"], bounded=1)]
    out = [pick]
    for params in near:
        if len(out) >= n:
            break
        g, k, r = params.pop("groups"), params.pop("block_k"), params.pop("stages")
        if not fits(p.d, g, k, device, r, False, True):
            continue
        s = Schedule.make("fused_wgmma", groups=g, block_k=k, tma=1, **({"stages": r} if r != 2 else {}),
                          **{name: 1 for name, on in params.items() if on}, **trim_flag(p, k))
        if s not in out:
            out.append(s)
    return out


def trimmed_tail(p: AttentionProblem, block_k: int, trim: bool) -> dict:
    """trim=1: template parameters for a last key tile of Sk % block_k keys, run at that width rounded
    up to 16 (S = Q K^T of m64nNk16, P V over N / 16 steps) after the loop over whole tiles; none where
    `tail_keys` finds nothing to trim (causal: each warpgroup's last tile differs). Only passed when
    on, so the other schedules' sources stay as they were."""
    keys = tail_keys(p, block_k) if trim else 0
    return {"tail_keys": keys} if keys else {}


def plan_wgmma(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, common: dict, mask_args: tuple,
               tail: tuple, scale_log2: float) -> Plan:
    reason = why_not(p, device)
    if reason:
        raise ScheduleError(f"attention fused_wgmma: {reason}")
    groups, bk = int(schedule["groups"]), int(schedule["block_k"])
    stages, producer = int(schedule.get("stages", 2)), bool(int(schedule.get("producer", 0)))
    tma = bool(int(schedule.get("tma", 0)))
    release = bool(int(schedule.get("release", 0)))
    bounded = bool(int(schedule.get("bounded", 0)))
    trim = bool(int(schedule.get("trim", 0)))
    walk = int(schedule.get("q_walk", 0))
    ring = producer or tma       # stages = the ring's buffers (else 2: plain loop, 3: the overlap loop)
    for name, on in (("release", release), ("bounded", bounded), ("trim", trim)):
        if on and (producer or not tma):
            raise ScheduleError(f"attention fused_wgmma: {name}=1 is an option of the plain TMA loop (tma=1, producer=0)")
    if walk and not (2 <= walk <= MAX_WALK and tma and not producer and p.causal == "none" and p.sk <= bk):
        raise ScheduleError(f"attention fused_wgmma: q_walk={walk} (query tiles per block over one key tile) needs "
                            f"2 <= q_walk <= {MAX_WALK}, the plain TMA loop (tma=1, producer=0), no causal masking and "
                            f"Sk <= block_k (got Sk={p.sk}, block_k={bk}, causal={p.causal!r})")
    allowed = PLAIN_GROUPS if tma and not producer else GROUPS
    if groups not in allowed or bk not in BLOCK_KS or stages not in ((1,) if walk else ()) + (RINGS if ring else STAGES):
        raise ScheduleError(f"attention fused_wgmma: groups={groups}, block_k={bk} and stages={stages} must be "
                            f"in {allowed}, {BLOCK_KS} and {RINGS if ring else STAGES}")
    smem = shared_bytes(p.d, groups, bk, stages, tma, 2 if walk else 1)
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"attention fused_wgmma: {smem} bytes of shared memory exceed "
                            f"{device.shared_per_block_optin} on {device.name}")
    blocks = grid_blocks(p, 64 * groups, walk or 1)
    q_tiles = blocks // (p.batch * p.heads)      # per (batch, head): blocks, each walking q_walk tiles
    if blocks > 2**31 - 1:
        raise ScheduleError(f"attention fused_wgmma: {blocks} blocks exceed the grid limit")
    threads = 128 * (groups + producer)       # producer=1: one more warpgroup that only copies K/V
    if not fits(p.d, groups, bk, device, stages, producer, tma):
        raise ScheduleError(f"attention fused_wgmma: {threads} threads with D={p.d}, block_k={bk} do not fit "
                            f"{device.name}'s registers")
    # The plain TMA loop's speed comes from two blocks sharing an SM (H100: a ring of 3 buffers that
    # left room for one ran 0.74x): where two fit in shared memory, ask ptxas for registers that fit too.
    # Only where each thread keeps 128 registers (2 warpgroups): three warpgroups at two blocks get 85,
    # and ptxas then refuses the wgmma accumulators (H100, 2026-11-25: compile error, not a spill).
    if walk:
        min_blocks = walk_resident(p, device, groups, bk, stages)
    else:
        min_blocks = plain_resident(p.d, groups, bk, device, stages) if tma and not producer else 1
    group = int(schedule.get("head_group", 0)) or causal_head_group(p, device, blocks, min_blocks)   # explicit: sweeps
    if group < 1:
        raise ScheduleError(f"attention fused_wgmma: head_group={group} must be >= 1")
    ordering = {"head_group": min(group, p.batch * p.heads)} if p.causal != "none" else {}
    params = {**common, **ordering, "head_dim": p.d, "groups": groups, "block_k": bk, "threads": threads,
              "stages": stages,
              "min_blocks": min_blocks,
              "scale_positive": p.scale > 0, "producer": producer, "tma": tma,
              "release": release, "bounded": bounded, **trimmed_tail(p, bk, trim), **({"q_walk": walk} if walk else {}),
              **({"key_mask": True} if p.key_mask else {}), **({"row_mask": True} if p.row_mask else {}),
              **({"mask_pairs": True} if p.row_mask_pairs else {})}
    args = (Buf("q"), Buf("k"), Buf("v"), *mask_args, Buf("out"), *tail, Scalar("i32", q_tiles),
            Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    if tma:
        args += tuple(kv_tensor_map(p, n, bk) for n in ("k", "v"))
    return Plan(launches=(Launch.make(TEMPLATE, "attention_fused_wgmma", params, (blocks,), (threads,), args,
                                      smem),))
