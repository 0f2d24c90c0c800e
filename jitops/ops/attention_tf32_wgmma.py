"""attention fused_tf32 on Hopper's warpgroup MMA (schedule key wgmma=1; sm_90a, precision "tf32").

templates/attention/fused_tf32_wgmma.hip.j2: `groups` consumer warpgroups own 64 query rows each and run
S = Q K^T and O += P V as wgmma m64nNk8 on TF32 operands; one more warpgroup copies K / V tiles of
`block_k` keys through a staging buffer into a ring of `stages` slots, V transposed (TF32 wgmma reads
K-major operands only). D up to 168 on an H100 / H200 (padded to a multiple of 8; the smallest tile's
shared memory decides), masks, causal, GQA, the heads-inner layouts. The scheduler takes it for
encoder-length calls (`preferred`); fused_tf32's mma.sync kernel stays the path elsewhere and off sm_90.

Where it stands (H200, 2026-11-29): 1.06-1.21x the mma.sync pick on BERT / ViT-length calls, 0.82-0.98x on
long sequences, at most ~110 TFLOP/s (a fifth of the TF32 dense peak): the mma.sync kernel's range, not
wgmma's. Not profiled yet; the producer's staging round trip and the consumers' unoverlapped
S -> softmax -> P V chain are the suspects.
"""
from __future__ import annotations

from ..device import DeviceInfo
from ..errors import ScheduleError
from .attention_problem import AttentionProblem
from .base import Buf, Launch, Plan, Scalar, Schedule, ceil_div

TEMPLATE = "attention/fused_tf32_wgmma.hip.j2"
GROUPS = (1, 2, 3)
BLOCK_KS = (32, 64, 128)
STAGES = (2, 3, 4)
TUNED_STAGES = (2, 3)          # rings of 4 were never the fastest (H200, 2026-11-29): not among the candidates


def padded_dim(d: int) -> int:
    return ceil_div(d, 8) * 8


def shared_bytes(d: int, groups: int, block_k: int, stages: int) -> int:
    """Q (per consumer warpgroup, 64 rows), `stages` K / V^T slots in the template's chunk layouts,
    two staging buffers of K and V as loaded (rows of DP + 4 floats), and the ring's barriers (static)."""
    dp = padded_dim(d)
    chunks = dp // 4
    q = groups * chunks * (64 * 16 + 16)
    slot = chunks * (block_k * 16 + 16) + (block_k // 4) * (dp // 8) * 144
    return q + stages * slot + 2 * 2 * block_k * (dp * 4 + 16) + 16 * stages


def registers(d: int, block_k: int) -> int:
    """Rough registers per thread: the O (DP/2) and S (BK/2) accumulators (P is S, in place), ~40 more."""
    return padded_dim(d) // 2 + block_k // 2 + 40


def fits(d: int, groups: int, block_k: int, stages: int, device: DeviceInfo) -> bool:
    threads = 128 * (groups + 1)
    cap = min(255, device.registers_per_multiprocessor // threads // 8 * 8)
    return (threads <= device.max_threads_per_block and registers(d, block_k) <= cap
            and shared_bytes(d, groups, block_k, stages) <= device.shared_per_block_optin)


def why_not_tf32_wgmma(p: AttentionProblem, device: DeviceInfo) -> str | None:
    """Why the wgmma form cannot run this (fp32, precision "tf32") problem on this device, or None."""
    if not device.hopper:
        return f"wgmma needs an sm_90 device ({device.name} is {device.arch})"
    if not fits(p.d, 1, 32, 2, device):        # shared memory bounds D (168 on an H100 / H200)
        return f"its smallest tile at D={p.d} does not fit {device.name}"
    return None


# Where the wgmma form is the pick (H200, 2026-11-29 08:49, `scripts/device_attention_tf32.py --wgmma`, against
# the mma.sync pick in the same run): encoder-length calls, D <= 64, keys <= 512, no causal masking: BERT-base
# b8 S=384 1.14x (1.15x with a padding mask), b1 S=128 1.21x, ViT-B/16 b8 1.10x, B=256 S=128 1.06x. Longer
# keys lose (Whisper S=1500 0.92x, S=2048 0.98x, D=40 S=4096 0.82x) and so do D = 80 / 128 (0.83-0.86x).
MAX_KEYS = 512
MAX_PREFERRED_DIM = 64


def preferred(p: AttentionProblem, device: DeviceInfo) -> bool:
    """Whether the wgmma form is the scheduler's pick for this fp32 TF32 problem (the measured region above)."""
    return (why_not_tf32_wgmma(p, device) is None and padded_dim(p.d) <= MAX_PREFERRED_DIM and p.sk <= MAX_KEYS
            and p.sq >= 64 and p.causal == "none")


def tf32_wgmma_schedule(p: AttentionProblem, device: DeviceInfo) -> Schedule:
    """Warpgroups by the grid they make: 3 x 64 rows with 64-key tiles where 192-row blocks are at least 90%
    rows that exist and fill a wave (BERT b8 S=384); 2 x 64 rows with 32-key tiles where 128-row blocks make at
    least half a wave (B=256 S=128, ViT-B/16 b8 at 197 tokens); else 1 x 64 rows with 64-key tiles (BERT b1).
    Rings of 2 (3 and 4 were no faster on any shape)."""
    bh, sms = p.batch * p.heads, device.multiprocessors
    tiles3 = ceil_div(p.sq, 192)
    if p.sq / (192 * tiles3) >= 0.9 and bh * tiles3 >= sms and fits(p.d, 3, 64, 2, device):
        groups, bk = 3, 64
    elif 2 * bh * ceil_div(p.sq, 128) >= sms:
        groups, bk = 2, 32
    else:
        groups, bk = 1, 64
    why = (f"float32 with TF32 products on wgmma (sm_90a), D={p.d} padded to {padded_dim(p.d)}: {groups} consumer "
           f"warpgroups x 64 query rows and a producer warpgroup, K/V tiles of {bk} keys in a ring of 2 "
           f"({shared_bytes(p.d, groups, bk, 2) // 1024} KiB shared); {bh * ceil_div(p.sq, 64 * groups)} blocks")
    return Schedule.make("fused_tf32", why=why, wgmma=1, groups=groups, block_k=bk, stages=2)


def tf32_wgmma_candidates(p: AttentionProblem, device: DeviceInfo) -> list[Schedule]:
    """Every (groups, block_k, ring of 2 or 3) that fits registers and shared memory."""
    if why_not_tf32_wgmma(p, device):
        return []
    return [Schedule.make("fused_tf32", wgmma=1, groups=g, block_k=bk, stages=st)
            for g in GROUPS for bk in BLOCK_KS for st in TUNED_STAGES if fits(p.d, g, bk, st, device)]


def plan_tf32_wgmma(p: AttentionProblem, schedule: Schedule, device: DeviceInfo, common: dict, mask_args: tuple,
                    tail: tuple, scale_log2: float) -> Plan:
    reason = why_not_tf32_wgmma(p, device)
    if reason:
        raise ScheduleError(f"attention fused_tf32 wgmma=1: {reason}")
    groups, bk, stages = int(schedule["groups"]), int(schedule["block_k"]), int(schedule.get("stages", 2))
    if groups not in GROUPS or bk not in BLOCK_KS or stages not in STAGES:
        raise ScheduleError(f"attention fused_tf32 wgmma=1: groups={groups}, block_k={bk} and stages={stages} must be "
                            f"in {GROUPS}, {BLOCK_KS} and {STAGES}")
    if not fits(p.d, groups, bk, stages, device):
        raise ScheduleError(f"attention fused_tf32 wgmma=1: {groups} warpgroups x {bk} keys x {stages} stages at D={p.d} "
                            f"need ~{registers(p.d, bk)} registers per thread and "
                            f"{shared_bytes(p.d, groups, bk, stages)} bytes of shared memory: more than {device.name} has")
    q_tiles = ceil_div(p.sq, 64 * groups)
    blocks = p.batch * p.heads * q_tiles
    if blocks > 2**31 - 1:
        raise ScheduleError(f"attention fused_tf32 wgmma=1: {blocks} blocks exceed the grid limit")
    threads = 128 * (groups + 1)
    params = {**common, "head_dim": p.d, "groups": groups, "block_k": bk, "stages": stages, "threads": threads,
              "scale_positive": p.scale > 0}
    args = (Buf("q"), Buf("k"), Buf("v"), *mask_args, Buf("out"), *tail, Scalar("i32", q_tiles),
            Scalar("f32", scale_log2), Scalar("i32", p.causal_offset))
    return Plan(launches=(Launch.make(TEMPLATE, "attention_fused_tf32_wgmma", params, (blocks,), (threads,), args,
                                      shared_bytes(p.d, groups, bk, stages)),))
