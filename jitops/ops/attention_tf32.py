"""attention fused_tf32: fp32 attention on the matrix cores with TF32 products (precision "tf32").

The fp32 sibling of fused_mma's prefill path (templates/attention/fused_tf32.hip.j2): one or two
groups of 16 query rows per warp, K / V tiles double-buffered with async copies, Q K^T and P V as
16 x 16 x 8 products (mma.sync m16n8k8 tf32 on NVIDIA sm_80+, v_mfma_f32_16x16x4f32 on AMD CDNA, whose
products are exact fp32), softmax in fp32. Taken only where the caller allowed TF32 (precision="tf32"
or jitops.set_fp32_precision("tf32")): operands keep 11 significant bits, as torch's allow_tf32 does
for matmuls. Any D up to 256 (padded to a multiple of 16 in shared memory), masks, causal, GQA and
the heads-inner layouts. No key splits and no packing of grouped heads: a decoding call (a few query
rows over long keys) runs one block per (batch, head) over all its keys, as the exact fp32 kernels
do (not measured against them there).
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .attention_problem import AttentionProblem
from .attention_tf32_wgmma import plan_tf32_wgmma, preferred, tf32_wgmma_candidates, tf32_wgmma_schedule
from .base import Buf, Launch, Plan, Scalar, Schedule, ceil_div

TEMPLATE = "attention/fused_tf32.hip.j2"
WARPS = (4, 8)
BLOCK_KS = (32, 64)
# (warps, block_k, row_groups) where the picked tile does not fit shared memory (large D; 64 KiB on AMD),
# largest first; the last fits D = 256 in 51 KiB. D = 256 on an H200 (2026-11-29): 8 warps x 16 keys 1.50x
# 4 x 32 (Gemma-7B causal 511 against 766 us), 1.71x non-causal.
FALLBACK_TILES = ((8, 16, 1), (4, 32, 1), (4, 16, 1), (2, 16, 1), (1, 16, 1))
# (warps, block_k, row_groups) that were the fastest candidate on at least one fp32 shape (H200, 2026-11-29)
SHORTLIST_TILES = frozenset({(8, 64, 2), (8, 32, 2), (8, 64, 1), (4, 64, 2), (4, 32, 2), (4, 32, 1), (8, 16, 1)})


def padded_dim(d: int) -> int:
    return ceil_div(d, 16) * 16


def shared_bytes(d: int, warps: int, block_k: int, row_groups: int = 1) -> int:
    """Q [16 row_groups warps][DP + 4] and two K and two V tiles [block_k][DP + 4], fp32."""
    return 4 * (padded_dim(d) + 4) * (16 * row_groups * warps + 4 * block_k)


def why_not_tf32(p: AttentionProblem, device: DeviceInfo) -> str | None:
    """Why fused_tf32 cannot run this problem on this device, or None."""
    if p.dtype != "float32":
        return f"it takes float32 inputs (got {p.dtype}; fp16 / bf16 run fused_mma / fused_wgmma)"
    if p.precision != "tf32":
        return ("TF32 products need precision='tf32' (or jitops.set_fp32_precision('tf32')); "
                f"this call asks for {p.precision!r} fp32 math")
    if not device.matrix_cores:
        return f"{device.name} has no matrix cores"
    if shared_bytes(p.d, *FALLBACK_TILES[-1]) > device.shared_per_block_optin:
        return f"its smallest tile at D={p.d} needs more shared memory than {device.name} has"
    return None


def tf32_schedule(p: AttentionProblem, device: DeviceInfo) -> Schedule:
    """The wgmma form on sm_90 where it was measured to win (attention_tf32_wgmma.preferred: encoder-length
    calls), else the mma.sync tile."""
    if preferred(p, device):       # sm_90, encoder-length calls: attention_tf32_wgmma
        return tf32_wgmma_schedule(p, device)
    return mma_tf32_schedule(p, device)


def mma_tf32_schedule(p: AttentionProblem, device: DeviceInfo) -> Schedule:
    """The mma.sync tile (every device with matrix cores; tf32_schedule's pick off the wgmma region), by the
    grid it makes (H200, 2026-11-29, `scripts/device_attention_tf32.py`, fp32 prefill
    shapes, every candidate timed in two runs): 8 warps x 2 row groups (256 query rows: each K / V fragment
    a warp loads serves 32 rows) where their rows fill at least 85% of their waves (B=8 H=16 S=2048 D=64
    1.05x 8 x 16 rows, 1.40x 4 x 16; Llama-3 1.19x, SD 1.5 D=40 1.15x); 8 warps x 16 rows (128 rows) where
    256-row blocks leave a wave part-empty but 128-row ones fill the device (BERT-base b8 S=384: 60 us in
    both runs, 83 with 256 rows; 4 x 2 x 16 rows ran 54 in one run and 80 in the other; the seed shape
    B=256 S=128 D=64, whose 256-row blocks would be half padding: 19.8 us, 29.2 with 256 rows); 4 warps x 16
    rows for small calls (BERT b1). Two row groups only without a mask (the masked step spills there:
    12-112 bytes at D = 64) and up to DP = 128; 64-key tiles at DP = 64 (D = 64 1.24x 32-key tiles;
    D = 40 took 32: 433-446 against 514 us), 32 above (two row groups of D = 128 with 64 keys spill)."""
    dp = padded_dim(p.d)
    bh = p.batch * p.heads
    sms = device.multiprocessors
    bk = 64 if dp == 64 else 32
    two = not p.has_mask and dp <= 128
    big = bh * ceil_div(max(p.sq, 1), 256)
    if two and bh * p.sq / (256 * ceil_div(big, sms) * sms) >= 0.85:    # rows that do work / rows launched
        warps, groups = 8, 2
    elif bh * ceil_div(max(p.sq, 1), 128) >= sms:
        warps, groups = 8, 1
    else:
        warps, groups = 4, 1
        bk = 64 if dp <= 64 else 32
    if shared_bytes(p.d, warps, bk, groups) > device.shared_per_block_optin:   # D = 256 on an H100: 128 rows x 16 keys
        warps, bk, groups = next(t for t in FALLBACK_TILES if shared_bytes(p.d, *t) <= device.shared_per_block_optin)
    rows = 16 * warps * groups
    blocks = bh * ceil_div(max(p.sq, 1), rows)
    why = (f"float32 with TF32 products on matrix cores, D={p.d} padded to {dp}: {warps} warps x {groups} x 16 "
           f"query rows, K/V tiles of {bk} keys double-buffered "
           f"({shared_bytes(p.d, warps, bk, groups) // 1024} KiB shared); {blocks} blocks")
    return Schedule.make("fused_tf32", why=why, warps=warps, block_k=bk, **({"row_groups": 2} if groups == 2 else {}))


def tf32_candidates(p: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """Warps x row groups x key tiles that fit shared memory and the thread limit; two row groups where
    they do not spill (NVRTC 13.5, sm_90a: no mask, and DP <= 64 or DP <= 128 with 32-key tiles)."""
    out = [Schedule.make("fused_tf32", warps=w, block_k=bk, **({"row_groups": 2} if g == 2 else {}))
           for w in WARPS for g in (1, 2) for bk in (BLOCK_KS if padded_dim(p.d) <= 128 else (16, *BLOCK_KS))
           if shared_bytes(p.d, w, bk, g) <= device.shared_per_block_optin
           and w * device.warp_size <= device.max_threads_per_block
           and (g == 1 or not p.has_mask and (padded_dim(p.d) <= 64 or padded_dim(p.d) <= 128 and bk == 32))]
    pick = mma_tf32_schedule(p, device)
    return (out if pick in out else [pick, *out]) + tf32_wgmma_candidates(p, device)


def tf32_shortlist(p: AttentionProblem, device: DeviceInfo, n: int) -> list[Schedule]:
    """Benchmark mode's schedules: the pick, then the tiles that won elsewhere in the H200 runs (8 x 2 x 16
    rows, 8 x 16, 4 x 2 x 16 and 4 x 16 rows: each the fastest on some shape, the pick 0.89-1.00x of the
    fastest), at most n, each planning on this device."""
    pick = tf32_schedule(p, device)
    out = [pick]
    if int(pick.get("wgmma", 0)) and n > 1:    # the mma.sync pick next: the wgmma region's edges were not swept
        out.append(mma_tf32_schedule(p, device))
    for s in tf32_candidates(p, device):
        if len(out) >= n:
            break
        if s not in out and (int(s.get("warps", 0)), int(s["block_k"]), int(s.get("row_groups", 1))) in SHORTLIST_TILES:
            out.append(s)
    return out


def plan_tf32(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, common: dict, mask_args: tuple,
              tail: tuple, scale_log2: float) -> Plan:
    if int(schedule.get("wgmma", 0)):
        return plan_tf32_wgmma(p, schedule, device, common, mask_args, tail, scale_log2)
    warps, bk, groups = int(schedule["warps"]), int(schedule["block_k"]), int(schedule.get("row_groups", 1))
    if warps <= 0 or groups not in (1, 2) or bk <= 0 or bk % 16:
        raise ScheduleError(f"attention fused_tf32: warps={warps} must be positive, row_groups={groups} 1 or 2 and "
                            f"block_k={bk} a multiple of 16")
    threads = warps * device.warp_size
    smem = shared_bytes(p.d, warps, bk, groups)
    if threads > device.max_threads_per_block:
        raise ScheduleError(f"attention fused_tf32: {threads} threads per block exceed {device.name}'s limit")
    if smem > device.shared_per_block_optin:
        raise ScheduleError(f"attention fused_tf32: {smem} bytes of shared memory exceed "
                            f"{device.shared_per_block_optin} on {device.name}")
    q_tiles = ceil_div(p.sq, 16 * groups * warps)
    blocks = p.batch * p.heads * q_tiles
    if blocks > 2**31 - 1:
        raise ScheduleError(f"attention fused_tf32: {blocks} blocks exceed the grid limit")
    params = {**common, "head_dim": p.d, "warps": warps, "row_groups": groups, "block_k": bk, "threads": threads,
              "min_blocks": int(schedule.get("min_blocks", 0)), "scale_positive": p.scale > 0}
    args = (Buf("q"), Buf("k"), Buf("v"), *mask_args, Buf("out"), *tail, Scalar("i32", q_tiles),
            Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    return Plan(launches=(Launch.make(TEMPLATE, "attention_fused_tf32", params, (blocks,), (threads,), args, smem),))
