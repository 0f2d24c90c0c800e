"""The scheduler's rules for fused_wgmma on sm_90: where it beats fused_mma (`preferred`), which loop
and tiles each kind of call gets (`plain_tma_tiles`, `tma_tiles`, `three_groups`, `four_groups`,
`one_group`, `short_prefill`, `short_keys`, `short_queries`), the bounded softmax step, the trimmed last
key tile and the causal head groups. Each rule's docstring gives the H100 measurement it rests on
(docs/performance.md has the full tables)."""
from __future__ import annotations

from ..device import DeviceInfo
from .attention_mma import padded_dim
from .attention_problem import AttentionProblem
from .attention_wgmma_fit import fits, shared_bytes
from .base import ITEMSIZE, ceil_div


def preferred(p: AttentionProblem, device: DeviceInfo) -> bool:
    """Where the scheduler takes fused_wgmma over fused_mma on an sm_90 device: prefill of 256
    queries and keys or more, and the shorter calls of `short_prefill`, `short_keys` (cross-attention
    over 64-128 keys) and `short_queries` (64-255 queries over long keys). H100, both kernels on the same tensors (scripts/device_attention.py):
    2026-11-23, 1.06-1.18x faster from S = 1024 up (GPT-2, DiT, Whisper, SD, SDXL, Llama-3 prefill,
    B=8 H=16 S=2048); 2026-11-25, CLIP ViT-L/14 (S=257) 1.18x (fp16 20.8 vs 24.6 us, bf16 20.3 vs
    24.7: 3 warpgroups pad 257 rows no worse than fused_mma's 128-row tiles) and Gemma D=256 1.16x;
    slower below 256 (BERT S=128 0.77x, ViT S=197 0.81x, the seed 0.73x: one or two key tiles, or
    rows mostly padding). Decoding and short cross-attention keep fused_mma (split-KV, packing), except
    where blocks walk several query tiles over one key tile (`query_walk`).
    With TMA loads (2026-11-25 afternoon) the plain loop's 128 x 128 tiles also win from 128 queries
    and keys where they are not padding (DP <= 64, at least 90% of rows and keys real): BERT-base
    S=128 1.10x (fp16 11.9 vs 13.1 us), the seed B=256 S=128 1.09-1.11x; ViT's 197 keep fused_mma.
    Calls under a wave of blocks too (2026-11-27 06:20, scripts/device_attention_small.py, H100): the
    native repeat call writes the TMA maps since e511d69, so eager calls cost the same on both kernels
    (9-14 us, SDPA 20-30), and in graph replay the one-warpgroup tiles (`one_group`) run ViT-B/16 b1
    in 5.3 us against 9.1 on fused_mma (SDPA 7.7), BERT-base b1 S=128 3.8 against 5.5 (SDPA 6.1), D = 256
    at 197 tokens b1 11.0 against 22.2 (SDPA 12.7)."""
    if (p.sq >= 256 and p.sk >= 256) or short_prefill(p) or short_keys(p) or short_queries(p) or query_walk(p, device):
        return True
    return (padded_dim(p.d) <= 64 and p.sq >= 128 and p.sk >= 128 and _tile_use(p.sq, 128) >= 0.9
            and _tile_use(p.sk, 128) >= 0.9)


def short_prefill(p: AttentionProblem) -> bool:
    """128-255 queries and keys that 128-key tiles would pad (ViT's 197 tokens), without causal
    masking or a mask: the plain TMA loop, one warpgroup of 64 rows per block (up to 4 blocks per SM)
    with 64-key tiles up to DP = 64, two warpgroups of 64-key tiles above. H100, 2026-11-27 04:47
    (scripts/device_attention_ab.py --rotate --discard-first, fp16 / bf16, against fused_mma, the pick
    before): ViT-B/16 b8 / b32 1.31x / 1.28x, ViT-L/16 b8 / b32 1.27x / 1.35x, DeiT-S b64 1.29x,
    B=16 H=12 S=160 D=64 1.36x, D=128 1.65x (vs SDPA: 1.30x / 0.90x, 1.11x / 0.91x, 0.90x, 1.20x, 0.99x).
    Grids of up to two waves of 64-row blocks take 128-key tiles up to DP = 64; above DP = 64 one
    warpgroup where `one_group` says so."""
    return (128 <= p.sq < 256 and 128 <= p.sk < 256 and p.causal == "none" and not p.has_mask
            and not (padded_dim(p.d) <= 64 and _tile_use(p.sq, 128) >= 0.9 and _tile_use(p.sk, 128) >= 0.9))


def short_keys(p: AttentionProblem) -> bool:
    """Long queries over one tile of 64-128 keys (Stable Diffusion's cross-attention over the text encoder's
    77 tokens), without causal masking or a mask, at DP = 64 and 160: the plain TMA loop, one warpgroup of
    64 rows per block, the keys in one 128-key tile trimmed to their width (77 -> 80). H100, 2026-11-27
    08:21 (scripts/device_attention_ab.py --rotate --discard-first, fp16, against fused_mma, the pick
    before): SDXL at 64 x 64 latents (B=2 H=10 S=4096 D=64) 18.1 -> 15.2 us (SDPA 15.1), 32 x 32 (B=2
    H=20 S=1024) 11.8 -> 9.3 (10.6), at batch 8 (B=16) 121.2 -> 99.4 (86.5: still 0.87x, bound by the
    per-block fixed cost of a single key tile); SD 1.5 at 16 x 16 (D=160, S=256) 9.4 -> 5.4 (8.9). Not at
    DP = 48 (SD 1.5 64 x 64, D=40: fused_mma 13.4 against 14.1 at best) nor DP = 80 (SD 1.5 32 x 32 1.10x,
    but PixArt's 120 keys at D=72 0.89x with two warpgroups and 0.64x with one)."""
    return (p.sq >= 256 and 64 <= p.sk <= 128 and p.causal == "none" and not p.has_mask
            and padded_dim(p.d) in (64, 160))


def query_walk(p: AttentionProblem, device: DeviceInfo) -> int:
    """Query tiles of 64 rows that each block of the plain TMA loop walks over one key tile loaded once
    (q_walk; 0: none): 64-128 keys (cross-attention over a text encoder's tokens, T5's 128 encoder
    positions, BERT at S = 128), up to DP = 160, not causal, no mask or a padding mask (`key_mask`). One tile per
    block leaves these memory-bound calls with one Q load in flight per block life; a walking block
    stages the next tile's Q while this one computes. The longest walk of 8, 4, 2 whose grid is 4 waves of
    resident blocks or more (a short tail), else the longest that still fills 90% of a wave (fewer
    blocks than slots idle SMs; 1-4 waves leave a partial last round of long walks). H100, 2026-11-27 10:06
    (scripts/device_attention_ab.py --rotate --discard-first, fp16, one warpgroup, walks of 1-16, µs, the
    pick before -> the walk, SDPA): SDXL cross b8 (16 x 10 x 4096 over 77) 100.7 -> 82.0 (w4; w8 85.6),
    87.2; SDXL 64 x 64 b2 15.2 -> 13.0 (w2), 14.9; T5 cross (8 x 12 x 512 over 128) 11.4 -> 9.8 (w2), 10.2;
    BERT-base b32 S=128 12.0 -> 10.5 (w2), 10.3; PixArt-alpha (D = 72 over 120) 35.6 (fused_mma) -> 30.9
    (w8), 31.1; SD 1.5 D = 40 13.5 (fused_mma) -> 13.1 (w2; 11.5 at w4), 14.4. Grids under a wave lose
    with it (SDXL 32 x 32 b2: w2 8.4 against 9.3 is the exception; SD 1.5 16 x 16 at D = 160, 32 blocks:
    7.7 against 5.2), as do walks longer than the grid allows (T5 w4 13.1). With a padding mask
    (10:40, scripts/device_attention_padding_mask.py, the pick of the time -> the walk, SDPA with the mask):
    BERT-base b32 S=128 21.4 -> 11.9 (14.3), T5 cross 20.1 -> 10.6 (13.9), 16 x 10 x 4096 over 77 keys
    169.4 (fused_mma) -> 91.9 (w4; SDPA 265.0); other masks (per query row) are not measured."""
    q_tiles = ceil_div(p.sq, 64)
    if (p.causal != "none" or (p.has_mask and not p.key_mask) or not 64 <= p.sk <= 128 or padded_dim(p.d) > 160
            or q_tiles < 2 or not fits(p.d, 1, 128, device, 1, False, True)):
        return 0
    slots = walk_resident(p, device) * device.multiprocessors
    walks = [w for w in (8, 4, 2) if w <= q_tiles]
    waves = {w: grid_blocks(p, 64, w) / slots for w in walks}
    return max([w for w in walks if waves[w] >= 4] or [w for w in walks if waves[w] >= 0.9] or [0])


def walk_resident(p: AttentionProblem, device: DeviceInfo, groups: int = 1, block_k: int = 128, stages: int = 1) -> int:
    """Blocks per SM of a q_walk plan (its min_blocks): as `plain_resident` with two Q buffers, at most 3
    where a whole 128-key tile at DP <= 64 would otherwise get 128 registers (NVRTC 13.5: the walk then
    spills 76 bytes, C7512)."""
    resident = plain_resident(p.d, groups, block_k, device, stages, 2)
    whole_128 = block_k == 128 and not tail_keys(p, 128) and padded_dim(p.d) <= 64
    return min(resident, 3) if whole_128 else resident


def short_queries(p: AttentionProblem) -> bool:
    """64-255 queries over 1024 keys or more (Whisper's decoder attending to its 1500 encoder frames, a
    chunk of queries against a long context), without causal masking or a mask, up to DP = 128: the
    plain TMA loop, one warpgroup per 64 query rows walking every key tile (128-key tiles up to DP = 64,
    64 above), where fused_mma split the keys. H100, 2026-11-27 08:28-08:29 (scripts/device_attention_ab.py
    --rotate --discard-first, fp16, against fused_mma, the pick before), Whisper (H=20, 64 queries, 1500
    keys, D=64): B=1 17.9 -> 16.2 us, B=4 26.4 -> 16.4, B=8 58.1 -> 29.2 (64-key tiles), B=16 53.9 ->
    50.0; B=8 H=16 with 100 queries over 2048 keys 51.8 -> 29.3, 64 over 4096 at D=128 126.3 -> 94.1
    (SDPA 19.5-19.9, 57.1, 29.8, 96.8). Those with 128-255 queries whose 128-row tiles are at least 90%
    real already run the plain loop (`preferred`)."""
    return (64 <= p.sq < 256 and p.sk >= 1024 and p.causal == "none" and not p.has_mask
            and padded_dim(p.d) <= 128)


def three_group_gain(d: int, causal: bool) -> float:
    """How much faster 3 consumer warpgroups (192 query rows, 64-key tiles, a ring of 4) run than 2
    (128 rows, 128-key tiles, a ring of 3) per unit of work, both on TMA loads. H100, 2026-11-25 (fp16,
    graph replay, same run; the time ratio corrected for padding and waves by _occupancy): SD 1.5
    D = 40 1.18, B=8 H=16 S=2048 causal 1.10 (64-key tiles waste less of the diagonal), without
    causal masking at D = 64 0.98-1.00 (B=8 H=16 S=2048, SDXL)."""
    if padded_dim(d) < 64:
        return 1.18
    return 1.10 if causal else 1.0


def _tile_use(n: int, tile: int) -> float:
    """The share of `n` rows (or keys) in whole tiles of `tile` that is real, not padding."""
    return n / (ceil_div(n, tile) * tile)


def grid_blocks(p: AttentionProblem, rows: int, walk: int = 1) -> int:
    """The grid of blocks of `rows` query rows each: one per query tile of every (batch, head), or per
    `walk` consecutive ones where blocks walk several (q_walk)."""
    return p.batch * p.heads * ceil_div(ceil_div(p.sq, rows), walk)


def _occupancy(p: AttentionProblem, groups: int, device: DeviceInfo) -> float:
    """The share of the launched work that is real: query rows over padded rows, blocks over whole
    waves of one block per multiprocessor (these kernels keep one block per SM)."""
    blocks = grid_blocks(p, 64 * groups)
    waves = ceil_div(blocks, device.multiprocessors)
    return _tile_use(p.sq, 64 * groups) * (blocks / (waves * device.multiprocessors))


def tma_tiles(p: AttentionProblem, device: DeviceInfo) -> tuple[int, int, int] | None:
    """(groups, block_k, ring) of the warp-specialized loop with TMA loads, or None where it does not
    fit (D > 160: a producer warpgroup leaves the consumers too few registers). H100, 2026-11-25, the
    same run against the cp.async producer's picks: B=8 H=16 S=2048 1.21x (causal 1.13x), SD 1.5
    1.15x, SDXL 1.29x, Llama-3 prefill 1.49x, DiT-XL 1.21x."""
    causal = p.causal != "none"
    if padded_dim(p.d) > 64:
        return (2, 64, 3) if fits(p.d, 2, 64, device, 3, True, True) else None
    options = [t for t in ((2, 128, 3), (3, 64, 4)) if fits(p.d, t[0], t[1], device, t[2], True, True)]
    if not options:
        return None
    gain = {2: 1.0, 3: three_group_gain(p.d, causal)}
    # key tiles' padding counts too (CLIP: 257 keys)
    return max(options, key=lambda t: gain[t[0]] * _occupancy(p, t[0], device) * _tile_use(p.sk, t[1]))


def tiles_unchecked(p: AttentionProblem) -> bool:
    """Whether key tiles inside the bounds skip the checked softmax (the template's checked_always is
    the opposite: a mask, or a scale <= 0, checks every tile); bounded=1 acts only on such tiles."""
    return not p.has_mask and p.scale > 0


def tiles_fast(p: AttentionProblem) -> bool:
    """Whether key tiles inside the bounds take the fast softmax step (the template's checked_always is
    the opposite): no mask, a padding mask (`key_mask`: its one value per column is added by an FFMA
    with the scale) or a mask of contiguous rows (`row_mask`: a load per score at an immediate offset from
    the row's pointer), and a positive scale. The rules measured without masks keep `tiles_unchecked`."""
    return p.scale > 0 and (not p.has_mask or p.key_mask or p.row_mask)


def bounded_exp(p: AttentionProblem) -> bool:
    """Whether the plain TMA loop skips the running max on key tiles after the first (bounded=1:
    probabilities against the max as it stands while every row sum of a thread stays <= 2^15; else S
    runs again with the full step). It removes the per-score max and the row reductions, a third of
    the softmax's instructions. H100, 2026-11-26 22:04 and 22:07, two runs, same process as the picks
    without it (scripts/device_attention_ab.py, fp16 / bf16): SDXL 1.07-1.09x, Llama-3 prefill
    1.07-1.08x, D = 80 / 96 1.03-1.09x, Whisper 1.04x, GPT-2 causal 1.03x, B=8 H=16 S=2048 D=64 1.01-1.02x
    and causal D = 128 1.00-1.03x; without causal masking at DP = 128 0.95-0.99x, so not there (nor
    above 128 without it: not measured; at DP = 128 `three_groups` takes it with 128-key tiles). A third
    run (22:13) with Gemma's causal D = 256: 1.02-1.03x.
    Padding masks (`key_mask`) and masks of whole rows (`row_mask`) take it too up to DP = 112, adding the
    mask value inside the exponent (a padding mask at causal DP = 128 would spill 84 bytes against 44
    without it: NVRTC 13.5 offline); other masks and negative scales check every tile, so it would never
    apply."""
    dp = padded_dim(p.d)
    if p.has_mask and dp > 112:
        return False
    return tiles_fast(p) and (dp <= 112 or p.causal != "none")


def plain_tma_tiles(p: AttentionProblem, device: DeviceInfo) -> tuple[int, int, bool] | None:
    """(groups, block_k, release) of the plain loop with TMA loads (no producer warpgroup, thread 0
    issues, two buffers), where it is the pick, else None. H100, 2026-11-25, fp16, one run of every tile
    and ring (scripts/device_attention.py; raw: docs/data/attention_tma_h100_2026-11-25/):
    - up to DP = 64, 2 warpgroups and 128-key tiles: 1.09-1.30x the producer's best on B=8 H=16
      S=2048 (with and without causal masking), SDXL, Whisper and GPT-2; 0.98x on SD 1.5 (D = 40);
      not where 128-key tiles pad the keys (CLIP's 257 untrimmed: 0.88x the 3-warpgroup producer pick);
    - D = 72 .. 160: 64-key tiles (DiT 1.06x, B=8 H=16 S=2048 D=128 1.08x). With causal masking
      the producer loop was as fast until the descriptors moved to uniform registers and ptxas was
      asked for two blocks per SM (17:28 UTC): since then the plain loop runs Llama-3 prefill in
      78.3 us against 91.3 (1.17x) and causal B=8 H=16 S=2048 D=128 in 332.5 against 434.5 (1.31x);
    - D > 160 (Gemma's 256): no room for a producer warpgroup; 1.83x the cp.async loop;
    - 128-255 queries and keys padded by 128-key tiles up to DP = 64 (`short_prefill`, 2026-11-27): one
      warpgroup per block and 64-key tiles, 128-key tiles on up to two waves of blocks (one warpgroup
      of 64-key tiles above DP = 64 there);
    - up to DP = 64 over whole 128-key tiles, one warpgroup per block where its grid takes no more waves
      of resident blocks than two warpgroups' (`one_group`: calls of a few waves, batch-1 encoders);
    - from 256 keys, the same where the keys fill 128-key tiles once the last one is trimmed
      (`_trimmed_key_use`: CLIP's 257 tokens, 256 + 16 keys). H100, 2026-11-27 08:12
      (scripts/device_attention_ab.py --rotate --discard-first, fp16, CLIP-L/14 B x 16 x 257 x 64):
      b1 8.8 -> 5.6 us (SDPA 8.7), b8 17.9 -> 14.8 (18.5), b32 65.3 -> 48.4 (62.1) against the producer
      loop, the pick before.
    Rings of 3-4 buffers ran 0.7-0.97x the two-buffer ring, 3 warpgroups 0.5-0.9x.
    release: consumer warps free each buffer on an mbarrier instead of a block barrier per tile (one
    warpgroup may run a tile ahead). Same H100, 15:42: causal B=8 H=16 S=2048 1.03x, GPT-2 1.03x,
    Gemma 1.04-1.06x; 0.99-1.01x without causal masking at D = 64; 0.71x at D = 128 (not taken there)."""
    dp = padded_dim(p.d)
    causal = p.causal != "none"
    if query_walk(p, device):       # one warpgroup walking query tiles over one 128-key tile
        return (1, 128, False)
    if dp <= 64:
        # whole 128-key tiles, or from 256 keys (never short_prefill's) ones that the trimmed tile fills
        if _tile_use(p.sk, 128) >= 0.9 or (p.sk >= 256 and _trimmed_key_use(p, 128) >= 0.9):
            # with a mask, 128-key tiles at 128 registers (two blocks per SM) spill (NVRTC 13.5: 276-316
            # bytes, wgmma serialized, C7512): 64-key tiles. H100, 2026-11-27 10:40, padding masks: BERT-base
            # b32 S=384 106.6 -> 80.3 us, BERT-large b16 S=512 110.1 -> 83.0, b64 S=128 39.6 -> 32.0. Padding
            # masks on the bounded step fit (0 bytes) and take the unmasked tiles; masks of whole rows
            # (`row_mask`) spill there (224-248 bytes) and keep 64 keys, except at D = 64 on one warpgroup
            # (up to 3 blocks per SM, 167 registers, no spill) without causal masking. H200, 2026-11-29
            # (scripts/device_attention_row_masks.py --variants, two keys per mask load): BERT-base b32
            # S=384 [B,1,S,S] 83.2 -> 76.2 us (SDPA 84.9), T5-base b8 S=512 bias 44.2 -> 37.2 (41.4), B=8
            # H=16 S=2048 531.1 -> 498.5 (548.4); not at D = 40 (b2 H=8 S=4096: 309.1 -> 447.4, SDPA 304.0).
            if p.row_mask and not causal and dp == 64 and bounded_exp(p):
                return (1, 128, False) if fits(p.d, 1, 128, device, 2, False, True) else None
            spills = p.has_mask and not (p.key_mask and bounded_exp(p))
            groups, bk = (1 if one_group(p, 128, device) else 2), (64 if spills else 128)
            tiles = (groups, bk, causal or released_short_keys(p, groups, bk))
        elif short_prefill(p):
            tiles = (1, 128 if grid_blocks(p, 64) <= 2 * device.multiprocessors else 64, causal)
        elif short_keys(p) or short_queries(p):
            tiles = (1, 128, False)
        else:
            tiles = None
    elif short_keys(p):
        tiles = (1, 128, False)
    elif short_queries(p):
        tiles = (1, 64, False)
    else:
        tiles = (1 if short_prefill(p) and one_group(p, 64, device) else 2, 64, dp > 160)
    return tiles if tiles and fits(p.d, tiles[0], tiles[1], device, 2, False, True) else None


def released_short_keys(p: AttentionProblem, groups: int, block_k: int) -> bool:
    """Whether two warpgroups of 128-key tiles (DP <= 64, not causal) free each K / V buffer per warp
    (release) rather than by a block barrier per tile: over at most 4 key tiles (Sk <= 512: BERT / ViT-
    length encoders), where the per-tile barrier holds the block's two warpgroups to one pace through a
    loop too short to even out; not over long keys. H200, 2026-11-29 05:36-05:38 (scripts/device_
    attention_ab.py --rotate --discard-first --variant r=pick:release=1, two runs, fp16 / bf16, µs):
    BERT-base b32 S=384 47.8 -> 45.8 (SDPA 43.7-43.9), BERT-large b16 S=512 50.8 -> 48.7-48.8 (48.2),
    16 x 12 x 512 39.5 -> 37.7-38.0, 32 x 16 x 384 60.9 -> 58.0-58.6, 64 x 12 x 256 49.9-50.7 -> 49.1-50.0;
    longer keys lose: Whisper's 1500 0.98x, B=8 H=16 S=2048 0.95-1.02x, SDXL's 4096 0.89-0.90x, SD2's
    9216 0.92-0.94x; with 64-key tiles (D = 80 / 96) 0.93-0.95x. Without a mask (masked calls: not measured)."""
    return (groups == 2 and block_k == 128 and p.causal == "none" and not p.has_mask
            and ceil_div(p.sk, block_k) <= 4)


def plain_resident(d: int, groups: int, block_k: int, device: DeviceInfo, stages: int = 2, q_buffers: int = 1) -> int:
    """Blocks per SM of the plain TMA loop, which its plan asks ptxas for (min_blocks): two where two fit
    in shared memory at 128 registers per thread, one warpgroup as many as shared memory holds, up to 4."""
    smem = shared_bytes(d, groups, block_k, stages, True, q_buffers)
    if not (2 * (smem + 1024) <= device.shared_per_multiprocessor
            and device.resident_blocks(128 * groups, 0, 128) >= 2):
        return 1
    return min(4, device.shared_per_multiprocessor // (smem + 1024)) if groups == 1 else 2


def one_group(p: AttentionProblem, block_k: int, device: DeviceInfo) -> bool:
    """Whether the plain TMA loop runs one warpgroup of 64 rows per block instead of two: where its grid
    takes no more waves of resident blocks (3 per SM at DP = 64 with 128-key tiles against 2) than the
    two-warpgroup grid, so twice the blocks reach more multiprocessors; not causal, no mask (measured
    without both). H100, fp16 / bf16, graph replay, 2026-11-27 06:20-06:35 (scripts/device_attention_small.py,
    fused_wgmma's tiles side by side): BERT-base b1 S=128 3.8-3.9 us against 5.3-5.6 (two warpgroups), b4
    4.2 against 5.3-5.5, b1 S=384 6.2 against 8.2-8.4, b8 S=384 (2 waves each) 15.4-15.8 against 17.8-18.1,
    b32 S=128 (2 each) 11.9-12.0 against 12.0-12.3; 160 queries at D = 128 b1 6.6-6.8 against 8.6-8.7. Where
    one warpgroup takes more waves it loses: Whisper's encoder (1 x 20 x 1500 x 64; 2 waves against 1)
    40.3-41.1 against 30.0-30.2, BERT-large b16 S=512 and BERT-base b32 S=384 (6 against 4-5) 0.96-0.98x."""
    if p.causal != "none" or not (tiles_unchecked(p) or (p.key_mask and tiles_fast(p))):   # row masks: not measured
        return False

    def waves(groups: int) -> int:
        return ceil_div(grid_blocks(p, 64 * groups), plain_resident(p.d, groups, block_k, device) * device.multiprocessors)
    return waves(1) <= waves(2)


def four_groups(p: AttentionProblem, device: DeviceInfo) -> bool:
    """Whether the plain TMA loop runs 4 warpgroups of 64-key tiles on a ring of 3 released buffers: head
    dims whose rows are not whole 32-byte sectors (D = 40: 80-byte rows, D = 72: 144), where each K/V
    tile costs more to load and four warpgroups share it. H100, 2026-11-26 (scripts/device_attention_ab.py,
    same process): DiT-XL D = 72 1.17-1.20x the 2-warpgroup pick (fp16 / bf16, three runs), SD 1.5 D = 40
    1.10-1.11x (one run); at D = 80 0.95-1.0x, D = 96 0.96x, D = 64 / 128 0.64-1.0x, so not there. All
    without masks (with one the checked softmax runs on every tile: not measured)."""
    return (not p.has_mask and padded_dim(p.d) <= 128 and (p.d * 2) % 32 != 0
            and fits(p.d, 4, 64, device, 3, False, True))


def four_groups_block_k(p: AttentionProblem, device: DeviceInfo) -> int:
    """Keys per tile of the 4-warpgroup loop: 128 where DP <= 48 and they fit, else 64. H100,
    2026-11-27 (scripts/device_attention_ab.py --rotate --discard-first, and benchmark mode picking it
    on its own): SD 1.5's D = 40 at B = 2 and 8, S = 4096, 1.23-1.27x the 64-key tile, fp16 and bf16
    (158.4 -> 128.6 us; 626.4 -> 497.8). At D = 72 a 128-key ring does not fit."""
    return 128 if padded_dim(p.d) <= 48 and fits(p.d, 4, 128, device, 3, False, True) else 64


def three_groups(p: AttentionProblem, device: DeviceInfo) -> bool:
    """Whether the plain TMA loop runs 3 warpgroups of 128-key tiles (one block per SM, 158-162
    registers), released per warp and with the bounded softmax step: DP = 128 without causal masking or
    a mask, where 64-key tiles at two blocks per SM read Q and K from shared memory at its full rate.
    H100, 2026-11-26 22:45 / 22:50 (scripts/device_attention_ab.py, same process as the pick): B=8 H=16
    S=2048 D=128 1.07x / 1.05x fp16, 1.02x bf16; Flux / SD3 (H=24 S=4096) 1.05x fp16, 1.04x bf16. Slower
    with causal masking (0.83x), at DP <= 96 (0.79-0.94x), without release (0.86x) or the bounded step.
    Only where the 192-row and 128-key tiles are mostly real and the blocks fill a wave."""
    blocks = grid_blocks(p, 192)
    return (padded_dim(p.d) == 128 and p.causal == "none" and tiles_unchecked(p)
            and _tile_use(p.sq, 192) >= 0.9 and _tile_use(p.sk, 128) >= 0.9
            and blocks >= device.multiprocessors and fits(p.d, 3, 128, device, 2, False, True))


def causal_head_group(p: AttentionProblem, device: DeviceInfo, blocks: int, resident: int) -> int:
    """(batch, head) pairs whose query tiles a causal grid orders heaviest first together. All of them
    (the grid heaviest first overall, best for the tail) unless the K / V of all heads exceed twice L2:
    there the resident blocks of the all-heads order belong to nearly as many heads as there are blocks
    and read every head's K / V from memory, so groups of heads go one after the other, heaviest first
    inside each. A group is the largest divisor of the head count (a multiple of the GQA group where
    one fits) whose K / V fill at most half of L2 and whose blocks fill at least half of the resident
    slots: a ragged last group or one that leaves the device half idle gives the tail away (H100,
    2026-11-27 04:17, fp16 explicit sweep: Gemma's 16 heads in groups of 12 1.45x slower, Llama-3-8B's
    32 in groups of 8 1.33x slower). Same sweep: groups of 16 (8, 32 alike) 1.08x the all-heads order
    at B=8 H=16 S=2048 D=128 (128 MB), groups of 8 1.06x at B=2 H=32 S=4096 (128 MB) and 1.05x the
    earlier groups of 12 at B=4 H=32 S=4096 (256 MB); at D=64 (64 MB), GPT-2 and Gemma the all-heads
    order was as fast or faster. The rule against the old one, 04:20: 1.10-1.11x, 1.00-1.06x and
    1.02-1.04x on those three shapes, fp16 / bf16."""
    heads = p.batch * p.heads
    kv_bytes_per_query_head = 2 * p.sk * p.d * ITEMSIZE[p.dtype] / p.group
    if heads * kv_bytes_per_query_head <= 2 * device.l2_bytes:
        return heads
    q_tiles = blocks // heads
    slots = resident * device.multiprocessors
    cap = device.l2_bytes / 2 // kv_bytes_per_query_head
    sizes = [g for g in range(1, heads + 1) if heads % g == 0 and g <= cap and 2 * g * q_tiles >= slots]
    whole_kv_heads = [g for g in sizes if g % p.group == 0]
    return max(whole_kv_heads or sizes or [heads])


def trim_flag(p: AttentionProblem, block_k: int) -> dict:
    """{"trim": 1} where the plain TMA loop's last key tile has something to trim (`tail_keys`), else {}: the
    scheduler's and the tuner's plain schedules take it. H100, 2026-11-27 06:54 (scripts/device_attention_ab.py
    --rotate --discard-first, the pick with and without it, fp16 / bf16): ViT-B/16 b32 (197 keys: a
    last tile of 5 in 64-key tiles) 29.0 -> 26.4 us, ViT-L/16 b32 36.6 -> 33.7, DeiT-S b64 28.8 -> 26.6,
    ViT-B/16 b8 / b1 1.06x, 160 keys at D = 128 1.07x, Whisper's 1500 (92 of 128) 1.00x; never slower."""
    return {"trim": 1} if tail_keys(p, block_k) else {}


def _trimmed_key_use(p: AttentionProblem, block_k: int) -> float:
    """The share of the keys the plain TMA loop runs that is real, with its last tile trimmed where
    `tail_keys` trims it (else padded to a whole tile)."""
    tail = tail_keys(p, block_k)
    return p.sk / (p.sk // block_k * block_k + tail) if tail else _tile_use(p.sk, block_k)


def tail_keys(p: AttentionProblem, block_k: int) -> int:
    """Keys of the trimmed last tile (Sk % block_k rounded up to 16), 0 where there is nothing to trim:
    whole tiles, a remainder within 16 of a whole tile, or causal masking."""
    width = ceil_div(p.sk % block_k, 16) * 16
    return width if 0 < width < block_k and p.causal == "none" else 0
