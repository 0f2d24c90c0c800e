"""attention on a real GPU (pytest -m gpu): every algorithm against float64 torch, odd lengths, masks,
both causal diagonals, grouped heads, head dims 32/64/128, unaligned views, large logits, the
matrix-core kernel on the benchmark shape, SDPA agreement, streams and graph capture."""
from __future__ import annotations

import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]   # conftest: the GPU, not the emulator
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}




def hopper():
    return jitops.get_backend().device.arch.rstrip("a") == "sm_90" and torch.version.hip is None


def algorithms(dtype):
    out = ["fused", "three_stage", "naive", None]
    if dtype in (torch.float16, torch.bfloat16) and jitops.get_backend().device.matrix_cores:
        out.insert(0, "fused_mma")
        if hopper():
            out.insert(0, "fused_wgmma")
    return out


def reference(q, k, v, mask=None, causal=False, scale=None):
    """float64, with the op's conventions: grouped heads, top_left/bottom_right, zeros for unseen rows."""
    qd, kd, vd = q.double(), k.double(), v.double()
    if q.dim() == 4 and k.shape[1] != q.shape[1]:
        kd = kd.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        vd = vd.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (qd @ kd.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s + mask.double()
    if causal:
        sq, sk = s.shape[-2:]
        off = sk - sq if causal == "bottom_right" else 0
        i = torch.arange(sq, device=s.device)[:, None]
        j = torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(j > i + off, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    out = (e @ vd) / torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, out, torch.zeros_like(out))


def check(q, k, v, mask=None, causal=False, scale=None, schedule=None, tol=None):
    out = torch.full_like(q, float("nan"))
    jitops.attention(q, k, v, mask, causal=causal, scale=scale, out=out, schedule=schedule)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), f"{schedule}: unwritten or NaN output"
    ref = reference(q, k, v, mask, causal, scale)
    err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    assert err <= (tol or TOL[q.dtype]), f"{schedule}: error {err:.3g}"
    return out


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, device="cuda", dtype=dtype)


def problem_of(q, k, v, mask=None):
    """The attention problem of these tensors (default attributes)."""
    dtype = str(q.dtype).split(".")[-1]
    specs = {n: TensorSpec(tuple(t.shape), dtype) if t is not None else None
             for n, t in (("q", q), ("k", k), ("v", v), ("mask", mask))}
    return get_op("attention").make_problem(specs, {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_odd_lengths_gqa_mask_causal(dtype):
    q, k, v = randn(2, 4, 197, 64, dtype=dtype), randn(2, 2, 77, 64, dtype=dtype), randn(2, 2, 77, 64, dtype=dtype)
    mask = randn(4, 1, 77)
    for algorithm in algorithms(dtype):
        check(q, k, v, schedule=algorithm)
        check(q, k, v, mask, causal=True, schedule=algorithm)
        check(q, k, v, causal="bottom_right", schedule=algorithm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_head_dims(dtype, d):
    q, k, v = randn(3, 2, 150, d, dtype=dtype), randn(3, 2, 333, d, dtype=dtype), randn(3, 2, 333, d, dtype=dtype)
    for algorithm in algorithms(dtype):
        check(q, k, v, schedule=algorithm)
        check(q, k, v, causal=True, schedule=algorithm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sq_longer_than_sk_and_hidden_rows(dtype):
    q, k, v = randn(1, 2, 300, 64, dtype=dtype), randn(1, 2, 100, 64, dtype=dtype), randn(1, 2, 100, 64, dtype=dtype)
    mask = torch.zeros(300, 100, device="cuda", dtype=dtype)
    mask[7] = float("-inf")
    for algorithm in algorithms(dtype):
        out = check(q, k, v, causal="bottom_right", schedule=algorithm)
        assert torch.all(out[:, :, :200] == 0)
        out = check(q, k, v, mask, schedule=algorithm)
        assert torch.all(out[:, :, 7] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_large_logits(dtype):
    q, k, v = randn(2, 2, 130, 64, dtype=dtype), randn(2, 2, 190, 64, dtype=dtype), randn(2, 2, 190, 64, dtype=dtype)
    mask = torch.full((130, 190), 1000.0, device="cuda", dtype=dtype)
    for algorithm in algorithms(dtype):
        check(q, k, v, mask, schedule=algorithm, tol=2e-4 if dtype == torch.float32 else None)
        check(q, k, v, scale=1.0, schedule=algorithm, tol=1e-3 if dtype == torch.float32 else 4e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unaligned_views(dtype):
    shape = (2, 2, 97, 64)
    n = 2 * 2 * 97 * 64
    q, k, v = (randn(n + 1, dtype=dtype)[1:].view(shape) for _ in range(3))
    assert q.data_ptr() % 16
    for algorithm in algorithms(dtype):
        check(q, k, v, schedule=algorithm)


def test_seed_shape_matches_sdpa():
    for dtype in (torch.float32, torch.float16):
        q, k, v = randn(256, 128, 64, dtype=dtype), randn(256, 128, 64, dtype=dtype), randn(256, 128, 64, dtype=dtype)
        out = check(q, k, v)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        assert float((out.double() - sdpa.double()).abs().max()) <= 4 * TOL[dtype] * float(sdpa.abs().max())


def test_long_sequence_matrix_cores():
    q, k, v = (randn(2, 16, 2048, 64, dtype=torch.float16) for _ in range(3))
    check(q, k, v)
    check(q, k, v, causal=True)
    op = get_op("attention")
    schedule = op.heuristic(problem_of(q, k, v), jitops.get_backend().device)
    device = jitops.get_backend().device
    if device.matrix_cores:     # Hopper's warpgroup kernel where it applies, else mma.sync
        assert schedule.algorithm == ("fused_wgmma" if hopper() else "fused_mma")


def test_non_default_stream_and_graph_capture():
    q, k, v = (randn(4, 8, 256, 64, dtype=torch.float16) for _ in range(3))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        q.mul_(0.5)
        out = jitops.attention(q, k, v)
    s.synchronize()
    ref = reference(q, k, v)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) <= TOL[torch.float16]
    for schedule in (None, "three_stage"):
        g = torch.cuda.CUDAGraph()
        res = torch.empty_like(q)
        jitops.attention(q, k, v, out=res, schedule=schedule)
        with torch.cuda.graph(g):
            jitops.attention(q, k, v, out=res, schedule=schedule)
        res.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert float((res.double() - ref).abs().max() / ref.abs().max()) <= TOL[torch.float16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [8, 40, 72, 80, 96, 160, 256])
def test_any_head_dim_on_matrix_cores(dtype, d):
    """Every D runs fused_mma (padded to a multiple of 16 in the kernel), with a mask and causal; the
    scheduler's pick (fused_wgmma on sm_90 from 256 queries and keys when D is a multiple of 8) too."""
    q, k, v = randn(2, 4, 300, d, dtype=dtype), randn(2, 2, 333, d, dtype=dtype), randn(2, 2, 333, d, dtype=dtype)
    mask = randn(300, 333)
    check(q, k, v, schedule="fused_mma")
    check(q, k, v, mask, causal=True, schedule="fused_mma")
    check(q, k, v)
    check(q, k, v, mask, causal=True)
    op = get_op("attention")
    specs = {n: TensorSpec(tuple(t.shape), str(dtype).split(".")[1]) for n, t in (("q", q), ("k", k), ("v", v))}
    if jitops.get_backend().device.matrix_cores:
        expect = "fused_wgmma" if hopper() and d % 8 == 0 else "fused_mma"
        assert op.heuristic(op.make_problem({**specs, "mask": None}, {}), jitops.get_backend().device).algorithm \
            == expect


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(32, 32), (32, 8), (32, 4), (16, 1)])
def test_decode_split_kv(dtype, heads, kv_heads):
    """Sq = 1 and 4 against Sk up to 8192: GQA ratios 1/4/8 and MQA; the scheduler packs heads and splits keys."""
    for sq, sk in ((1, 8192), (4, 1000)):
        q = randn(2, heads, sq, 128, dtype=dtype)
        k, v = randn(2, kv_heads, sk, 128, dtype=dtype), randn(2, kv_heads, sk, 128, dtype=dtype)
        check(q, k, v)
        check(q, k, v, causal="bottom_right")
    mask = torch.zeros(2, heads, 1, 8192, device="cuda")
    mask[..., :4096] = float("-inf")          # whole splits without a visible key
    q = randn(2, heads, 1, 128, dtype=dtype)
    k, v = randn(2, kv_heads, 8192, 128, dtype=dtype), randn(2, kv_heads, 8192, 128, dtype=dtype)
    check(q, k, v, mask)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_unsplit_streams_with_l2_prefetch(dtype):
    """Decoding whose kv heads fill the device: one block per kv head streams all its keys (no split,
    no merge) with 256-byte L2 prefetches (on sm_90: TMA into a ring of 2 tiles), on the scheduler's
    pick; partial last tile, GQA 4:1 and MHA."""
    sms = jitops.get_backend().device.multiprocessors
    for heads, kv_heads in ((32, 8), (8, 8)):
        batch = -(-sms // kv_heads)                                  # at least one kv head per SM
        q = randn(batch, heads, 1, 128, dtype=dtype)
        k, v = randn(batch, kv_heads, 1000, 128, dtype=dtype), randn(batch, kv_heads, 1000, 128, dtype=dtype)
        specs = {n: TensorSpec(tuple(t.shape), str(dtype).split(".")[-1]) for n, t in (("q", q), ("k", k), ("v", v))}
        op = get_op("attention")
        pick = op.heuristic(op.make_problem({**specs, "mask": None}, {}), jitops.get_backend().device)
        if pick.algorithm == "fused_mma":
            assert pick.get("splits", 1) == 1, pick
            assert (pick.get("tma") and pick["stages"] == 2) if hopper() else pick["prefetch"] == 256, pick
        check(q, k, v)
        check(q, k, v, causal="bottom_right")


def test_bf16_matches_sdpa():
    q, k, v = (randn(4, 8, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    out = check(q, k, v, causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert float((out.double() - sdpa.double()).abs().max()) <= 2 * TOL[torch.bfloat16] * float(sdpa.abs().max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [8, 40, 72, 80, 96, 128, 160, 256])
def test_wgmma_padded_dims_gqa_causal_tiles(dtype, d):
    """fused_wgmma (sm_90a) on each loop (stages 2 / 3) and tile shape: padded head dims, GQA 4:1, both
    diagonals with Sq != Sk."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.attention_wgmma_fit import fits
    from jitops.ops.base import Schedule
    q = randn(2, 8, 200, d, dtype=dtype)
    k, v = randn(2, 2, 333, d, dtype=dtype), randn(2, 2, 333, d, dtype=dtype)
    device = jitops.get_backend().device
    tiles = [t for t in ((2, 64, 2), (2, 128, 3), (3, 64, 3)) if fits(d, t[0], t[1], device, t[2])]
    assert tiles, f"no fused_wgmma tile fits D={d}"       # (2, 64, 2) fits every D up to 256
    for groups, block_k, stages in tiles:
        sched = Schedule.make("fused_wgmma", groups=groups, block_k=block_k, stages=stages)
        check(q, k, v, schedule=sched)
        check(q, k, v, causal=True, schedule=sched)
        check(q, k, v, causal="bottom_right", schedule=sched)


def test_wgmma_tma_repeat_calls_encode_each_pointer():
    """Repeat calls of one TMA plan on new tensors (the straight-line fast path, out= or not): each
    call's tensor maps are encoded from its own K / V (a stale map would read the first call's data)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.base import Schedule
    sched = Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1)
    for i in range(4):
        q, k, v = (randn(2, 4, 300, 64, dtype=torch.float16) for _ in range(3))
        out = torch.full_like(q, float("nan")) if i % 2 else None
        got = jitops.attention(q, k, v, schedule=sched, out=out)
        ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8.0, -1) @ v.double()
        err = float((got.double() - ref).abs().max() / ref.abs().max())
        assert err <= 2e-3, (i, err)


@pytest.mark.parametrize("group", [1, 3, 4, 10])
def test_wgmma_causal_head_groups(group):
    """Causal grids ordered heaviest first within groups of (batch, head) pairs (head_group, also one
    that does not divide B * H = 10, and all of them): every query tile of every head computed once,
    into a NaN-filled output, against float64; with GQA (2 query heads per kv head)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.base import Schedule
    q = randn(2, 10, 700, 64, dtype=torch.float16)
    k, v = randn(2, 5, 700, 64, dtype=torch.float16), randn(2, 5, 700, 64, dtype=torch.float16)
    sched = Schedule.make("fused_wgmma", groups=2, block_k=64, tma=1, bounded=1, head_group=group)
    out = torch.full_like(q, float("nan"))
    jitops.attention(q, k, v, causal=True, schedule=sched, out=out)
    torch.cuda.synchronize()
    want = reference(q, k, v, causal=True)
    assert bool(torch.isfinite(out).all())
    assert float((out.double() - want).abs().max() / want.abs().max()) <= TOL[torch.float16]


def test_wgmma_tma_native_repeat_calls_encode_each_pointer():
    """Eager repeat calls of a TMA pick (tensor maps among the kernel's arguments) run in the native
    RepeatCall, which encodes each call's maps for its own K / V: new tensors on every call (a stale
    map would read an earlier call's data), the same tensors again, and an output view passed as out=."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.engine import _cache
    shape = (1, 8, 300, 64)
    op = get_op("attention")
    pick = op.heuristic(op.make_problem({n: TensorSpec(shape, "float16") for n in ("q", "k", "v")} | {"mask": None},
                                        {}), jitops.get_backend().device)
    assert pick.get("tma"), pick
    tensors = [tuple(randn(*shape, dtype=torch.float16) for _ in range(3)) for _ in range(3)]
    for q, k, v in tensors + tensors[:1] + tensors[::-1]:
        got = jitops.attention(q, k, v)
        torch.cuda.synchronize()
        want = reference(q, k, v)
        assert float((got.double() - want).abs().max() / want.abs().max()) <= TOL[torch.float16]
    bound = [b for key, b in _cache.bound.items() if key[0] == "attention" and b is not None and
             b.prepared.schedule.get("tma")]
    assert any(b.native is not None for b in bound), "the TMA plan missed the native repeat path"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [40, 64, 72, 128, 256])
def test_wgmma_tma_loads(dtype, d):
    """fused_wgmma with K / V tiles loaded by TMA into the 128-byte swizzle (tma=1, the sm_90 pick),
    in the warp-specialized loop (a producer warpgroup: up to D = 160) and in the plain loop over a
    ring of 2-4 buffers (thread 0 issues the loads; D = 256 too; one warpgroup per block too): rows past Sk and columns past D (40, 72: partial
    64-column blocks) land as zeros, a ring that wraps, a warpgroup past the last row, GQA 4:1, both
    causal diagonals; and views off 16-byte alignment (no map is encoded: the threads store the
    swizzled tiles themselves)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.attention_wgmma_fit import fits
    from jitops.ops.base import Schedule
    q = randn(2, 8, 90, d, dtype=dtype)
    k, v = randn(2, 2, 900, d, dtype=dtype), randn(2, 2, 900, d, dtype=dtype)
    device = jitops.get_backend().device
    producer = [Schedule.make("fused_wgmma", groups=g, block_k=bk, stages=ring, producer=1, tma=1)
                for g, bk, ring in ((2, 64, 3), (2, 128, 3), (3, 64, 4), (2, 64, 2))
                if fits(d, g, bk, device, ring, True, True)]
    plain = [Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, stages=ring, **extra)
             for g, bk, ring, extra in ((2, 64, 2, {}), (2, 128, 3, {}), (3, 64, 4, {}), (2, 64, 2, {"release": 1}),
                                        (3, 64, 3, {"release": 1}), (1, 128, 2, {}), (1, 64, 2, {"release": 1}),
                                        (4, 128, 3, {"release": 1, "bounded": 1}),     # the D = 40 pick
                                        (1, 64, 2, {"bounded": 1}),                    # ViT's 197 tokens
                                        (1, 128, 2, {"bounded": 1}),                   # small grids' pick
                                        (2, 128, 2, {"release": 1, "bounded": 1}))     # BERT-length encoders' pick
             if fits(d, g, bk, device, ring, False, True)]
    assert plain and (producer or d > 160), f"no TMA tile fits D={d}"
    for sched in producer + plain:
        check(q, k, v, schedule=sched)
        check(q, k, v, causal=True, schedule=sched)
        check(q, k, v, causal="bottom_right", schedule=sched)
    uq, uk, uv = (randn(t.numel() + 1, dtype=dtype)[1:].view(t.shape) for t in (q, k, v))
    assert uk.data_ptr() % 16 and uv.data_ptr() % 16
    for sched in producer[:2] + plain[:1] + plain[-1:]:
        check(uq, uk, uv, schedule=sched)
        check(uq, uk, uv, causal=True, schedule=sched)
        check(q, uk, v, schedule=sched)      # one tensor off alignment is enough for the plain path


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_wgmma_padding_mask(dtype, d):
    """fused_wgmma with a padding mask ([B, 1, 1, Sk], one additive value per key: the key_mask loads),
    -inf on each batch's padded keys and random values on the rest, against float64: the scheduler's
    pick, 1-3 warpgroups, 64- and 128-key tiles, the bounded step, the overlap loop, a walk over one key
    tile, causal, GQA, partial tiles. Then padding at the dtype's lowest finite value (HF exports) with a
    key 30 units above the rest past the first tile, where the bounded step must run S again."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.errors import ScheduleError
    from jitops.ops.base import Schedule

    def padding_mask(batch, sk):
        mask = randn(batch, 1, 1, sk, dtype=dtype)
        lengths = torch.tensor([sk, sk // 2 + 3][:batch], device="cuda")
        return mask.masked_fill(torch.arange(sk, device="cuda").view(1, 1, 1, sk) >= lengths.view(-1, 1, 1, 1),
                                float("-inf"))

    q = randn(2, 8, 300, d, dtype=dtype)
    k, v = randn(2, 2, 260, d, dtype=dtype), randn(2, 2, 260, d, dtype=dtype)
    mask = padding_mask(2, 260)
    jump = mask.masked_fill(mask == float("-inf"), torch.finfo(dtype).min)
    jump[0, 0, 0, 200] = 30.0
    scheds = [None] + [Schedule.make("fused_wgmma", groups=g, block_k=bk, **{"tma": 1, **extra})
                       for g, bk, extra in ((2, 128, {}), (2, 64, {}), (1, 128, {}), (3, 128, {"release": 1}),
                                            (2, 64, {"bounded": 1}), (2, 128, {"bounded": 1, "release": 1}),
                                            (2, 64, {"stages": 3, "producer": 1}), (2, 64, {"stages": 3, "tma": 0}))]
    ran = 0
    for sched in scheds:
        try:
            check(q, k, v, mask=mask, schedule=sched)
        except ScheduleError:              # a tile that does not fit D = 128
            continue
        check(q, k, v, mask=mask, causal=True, schedule=sched)
        check(q, k, v, mask=jump, schedule=sched)
        ran += 1
    assert ran >= 6, ran
    short_k, short_v, short_mask = k[:, :, :100].contiguous(), v[:, :, :100].contiguous(), padding_mask(2, 100)
    for sched in (None, Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, stages=1, q_walk=3, trim=1)):
        check(q, short_k, short_v, mask=short_mask, schedule=sched)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_released_pick_over_short_keys(dtype):
    """The scheduler's pick for BERT-length encoders (two warpgroups of 128-key tiles over at most 4 key
    tiles: buffers released per warp, the bounded softmax step) against float64: BERT-base b32 S=384, and
    a partial last query tile over keys that end inside a tile."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    device = jitops.get_backend().device
    for qs, kvs in (((32, 12, 384, 64), (32, 12, 384, 64)), ((30, 12, 390, 64), (30, 12, 500, 64))):
        q, k, v = randn(*qs, dtype=dtype), randn(*kvs, dtype=dtype), randn(*kvs, dtype=dtype)
        s = get_op("attention").heuristic(problem_of(q, k, v), device)
        assert (s.algorithm, s["groups"], s["block_k"], s.get("release"), s.get("bounded")) == \
            ("fused_wgmma", 2, 128, 1, 1), s
        check(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_mma_padding_mask(dtype, d):
    """fused_mma (mma.sync: the pick off Hopper) with a padding mask ([B, 1, 1, Sk]: key_mask, the fast step
    on tiles inside the bounds) against float64: the A100's pick and this device's fused_mma pick, causal
    and not, GQA, a partial last tile; padding at the dtype's lowest value with a key 30 units above the rest."""
    from jitops.device import KNOWN_TARGETS
    op = get_op("attention")
    q = randn(2, 8, 300, d, dtype=dtype)
    k, v = randn(2, 2, 260, d, dtype=dtype), randn(2, 2, 260, d, dtype=dtype)
    mask = randn(2, 1, 1, 260, dtype=dtype)
    mask[1, ..., 140:] = float("-inf")
    jump = mask.masked_fill(mask == float("-inf"), torch.finfo(dtype).min)
    jump[0, 0, 0, 200] = 30.0
    problem = problem_of(q, k, v, mask)
    assert problem.key_mask
    scheds = {op.heuristic(problem, KNOWN_TARGETS["sm_80"]), op.heuristic(problem, jitops.get_backend().device, "fused_mma")}
    for sched in scheds:
        assert sched.algorithm == "fused_mma", sched
        check(q, k, v, mask=mask, schedule=sched)
        check(q, k, v, mask=mask, causal=True, schedule=sched)
        check(q, k, v, mask=jump, schedule=sched)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_row_masks(dtype, d):
    """Masks with a row per query row and contiguous keys (row_mask: the fast step adds them; the bounded
    step on fused_wgmma) against float64: [B, 1, Sq, Sk] with -inf padding, a decoder's causal + left
    padding at the dtype's lowest value, [1, H, Sq, Sk] bias
    with a key 30 units above the rest; this device's pick, the A100's fused_mma pick and, on Hopper,
    fused_wgmma's 64- / 128-key tiles with and without the bounded step; each mask also as a view one
    element off (Sk = 260 is even: two keys' values per load, single loads from that view)."""
    from jitops.device import KNOWN_TARGETS
    from jitops.errors import ScheduleError
    from jitops.ops.base import Schedule
    op = get_op("attention")
    q = randn(2, 8, 300, d, dtype=dtype)
    k, v = randn(2, 2, 260, d, dtype=dtype), randn(2, 2, 260, d, dtype=dtype)
    keys = torch.arange(260, device="cuda")
    padding = randn(2, 1, 300, 260, dtype=dtype)
    padding[1, ..., 140:] = float("-inf")
    low = torch.finfo(dtype).min
    future = keys.view(1, 260) > torch.arange(300, device="cuda").view(300, 1) + 50   # every row sees a key
    decoder = torch.zeros(2, 1, 300, 260, device="cuda", dtype=dtype).masked_fill(future, low)
    decoder[1, ..., :30] = low                                   # batch 1 left-padded
    bias = randn(1, 8, 300, 260, dtype=dtype)
    bias[0, 3, 10, 200] = 30.0
    for mask in (padding, decoder, bias):
        problem = problem_of(q, k, v, mask)
        assert problem.row_mask and problem.row_mask_pairs
        scheds = [None, op.heuristic(problem, KNOWN_TARGETS["sm_80"])]
        if hopper():
            scheds += [Schedule.make("fused_wgmma", groups=2, block_k=bk, tma=1, **extra)
                       for bk in (64, 128) for extra in ({}, {"bounded": 1})]
        for sched in scheds:
            try:
                check(q, k, v, mask=mask, schedule=sched)
            except ScheduleError:          # a tile that does not fit D = 128
                continue
            if mask is padding:
                check(q, k, v, mask=mask, causal=True, schedule=sched)
            # a view one element off: the paired loads (Sk even) would fault there; it reads single values
            odd = torch.empty(mask.numel() + 1, device="cuda", dtype=dtype)[1:].view(mask.shape)
            odd.copy_(mask)
            check(q, k, v, mask=odd, schedule=sched)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [40, 64, 160])
def test_wgmma_query_walk_over_one_key_tile(dtype, d):
    """fused_wgmma blocks that walk several query tiles over one key tile loaded once (q_walk, the
    cross-attention pick), against float64: 1-3 warpgroups, trimmed and whole 128-key tiles, a walk
    that ends past the last row (Sq = 1000), GQA, a mask, a negative scale, K / V off 16-byte alignment,
    and the refusals (causal; keys over one tile)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.errors import ScheduleError
    from jitops.ops.attention_wgmma_fit import fits
    from jitops.ops.base import Schedule
    device = jitops.get_backend().device
    q = randn(2, 8, 1000, d, dtype=dtype)
    walked = 0
    for g, walk, sk, trim in ((1, 4, 77, 1), (1, 3, 128, 0), (2, 2, 5, 1), (3, 5, 64, 0), (1, 2, 100, 0)):
        if not fits(d, g, 128, device, 1, False, True):
            continue
        k, v = randn(2, 2, sk, d, dtype=dtype), randn(2, 2, sk, d, dtype=dtype)
        sched = Schedule.make("fused_wgmma", groups=g, block_k=128, tma=1, stages=1, q_walk=walk,
                              **({"trim": 1} if trim else {}))
        try:
            check(q, k, v, schedule=sched)
        except ScheduleError:              # shared memory of D = 160 x 3 warpgroups
            continue
        check(q, k, v, scale=-0.2, schedule=sched)
        check(q, k, v, mask=randn(2, 8, 1000, sk, dtype=dtype), schedule=sched)
        walked += 1
    assert walked >= 4, walked
    k, v = randn(2, 2, 77, d, dtype=dtype), randn(2, 2, 77, d, dtype=dtype)
    uk, uv = (randn(t.numel() + 1, dtype=dtype)[1:].view(t.shape) for t in (k, v))
    assert uk.data_ptr() % 16 and uv.data_ptr() % 16
    sched = Schedule.make("fused_wgmma", groups=1, block_k=128, tma=1, stages=1, q_walk=4, trim=1)
    check(q, uk, uv, schedule=sched)
    for bad, kv_len in ((dict(causal=True), 77), ({}, 200)):
        k = randn(2, 2, kv_len, d, dtype=dtype)
        with pytest.raises(ScheduleError, match="q_walk"):
            jitops.attention(q, k, k, schedule=sched, **bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [40, 64, 128, 256])
def test_wgmma_trimmed_last_tile(dtype, d):
    """trim=1: the last key tile of Sk % block_k keys runs at that width rounded up to 16 after the loop
    (S of m64nNk16, P V over N / 16 steps): tails of 1, 5, 16, 17, 60, 69, 92 keys (60 of 64: no tail), a call
    whose only tile is the tail (77 keys), with a mask, GQA and K / V off 16-byte alignment; causal calls keep every tile
    (no tail) and stay right; against float64."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.attention_wgmma_fit import fits
    from jitops.ops.base import Schedule
    device = jitops.get_backend().device
    tiles = [(g, bk, extra) for g, bk, extra in ((1, 64, {"bounded": 1}), (1, 128, {"bounded": 1}), (2, 64, {}),
                                                (2, 128, {"release": 1}), (3, 128, {"release": 1, "bounded": 1}))
             if fits(d, g, bk, device, 2, False, True)]
    assert tiles
    for sk in (197, 208, 209, 257, 77, 700, 1500 if d <= 64 else 300):   # 700: 60 keys past 640, nothing to trim at 64
        q = randn(2, 4, 197, d, dtype=dtype)
        k, v = randn(2, 2, sk, d, dtype=dtype), randn(2, 2, sk, d, dtype=dtype)
        for g, bk, extra in tiles:
            sched = Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, trim=1, **extra)
            check(q, k, v, schedule=sched)
        g, bk, extra = tiles[0]
        sched = Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, trim=1, **extra)
        mask = torch.randn(4, 197, sk, device="cuda")
        check(q, k, v, mask, schedule=sched)
        check(q, k, v, causal=True, schedule=sched)
        uk, uv = (randn(t.numel() + 1, dtype=dtype)[1:].view(t.shape) for t in (k, v))
        check(q, uk, uv, schedule=sched)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_small_calls_take_wgmma(dtype):
    """Calls under a wave of blocks (batch-1 encoders) run the scheduler's one-warpgroup fused_wgmma
    tiles on sm_90 (ViT's 197 tokens, BERT's 128, 160 at D = 128, D = 256), checked against float64
    on the first call and on the native repeat call."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    op = get_op("attention")
    device = jitops.get_backend().device
    for shape in ((1, 12, 197, 64), (1, 8, 128, 64), (1, 12, 160, 128), (1, 8, 197, 256), (1, 16, 257, 64)):
        q, k, v = (randn(*shape, dtype=dtype) for _ in range(3))
        specs = {n: TensorSpec(shape, str(dtype).split(".")[-1]) for n in "qkv"}
        pick = op.heuristic(op.make_problem({**specs, "mask": None}, {}), device)
        assert pick.algorithm == "fused_wgmma" and pick["groups"] == 1, (shape, pick)
        check(q, k, v)
        ref = reference(q, k, v)
        for _ in range(3):          # the first call, then the repeat calls (native where built)
            out = jitops.attention(q, k, v)
            torch.cuda.synchronize()
            err = float((out.double() - ref).abs().max() / ref.abs().max())
            assert err <= TOL[dtype], (shape, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cross_attention_over_short_keys_takes_wgmma(dtype):
    """Long queries over 77 keys (Stable Diffusion's cross-attention) at D = 64 and 160 run the
    scheduler's one-warpgroup fused_wgmma tile on sm_90 (one key tile trimmed to 80), against float64;
    also with 64 and 128 keys (one tile); and 64-100 queries over 1030-1500 keys (Whisper's decoder
    cross-attention: one warpgroup walking every key tile, the last one trimmed)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    op = get_op("attention")
    device = jitops.get_backend().device
    for qs, sk, bk in (((2, 10, 1024, 64), 77, 128), ((1, 8, 256, 160), 77, 128), ((1, 4, 300, 64), 64, 128),
                       ((1, 4, 300, 64), 128, 128),
                       ((2, 4, 64, 64), 1500, 128), ((1, 4, 100, 64), 1100, 128), ((2, 2, 64, 128), 1030, 64)):
        kvs = (*qs[:2], sk, qs[3])
        q, k, v = randn(*qs, dtype=dtype), randn(*kvs, dtype=dtype), randn(*kvs, dtype=dtype)
        dt = str(dtype).split(".")[-1]
        pick = op.heuristic(op.make_problem({"q": TensorSpec(qs, dt), "k": TensorSpec(kvs, dt),
                                             "v": TensorSpec(kvs, dt), "mask": None}, {}), device)
        assert pick.algorithm == "fused_wgmma" and pick["groups"] == 1 and pick["block_k"] == bk, (qs, sk, pick)
        check(q, k, v)
    # grids big enough that blocks walk query tiles over the one key tile (q_walk): SDXL cross b8 at 32 x 32,
    # PixArt's 120 keys at D = 72, BERT b32 S=128
    for qs, sk, walk in (((16, 10, 1024, 64), 77, 4), ((2, 16, 4096, 72), 120, 8), ((32, 12, 128, 64), 128, 2),
                         ((16, 10, 4096, 64), 77, 4)):
        kvs = (*qs[:2], sk, qs[3])
        q, k, v = randn(*qs, dtype=dtype), randn(*kvs, dtype=dtype), randn(*kvs, dtype=dtype)
        dt = str(dtype).split(".")[-1]
        pick = op.heuristic(op.make_problem({"q": TensorSpec(qs, dt), "k": TensorSpec(kvs, dt),
                                             "v": TensorSpec(kvs, dt), "mask": None}, {}), device)
        assert pick.algorithm == "fused_wgmma" and pick.get("q_walk") == walk, (qs, sk, pick)
        check(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_wgmma_lazy_rescale(dtype, d):
    """fused_wgmma moves a row's running max only when a score exceeds it by more than 2^8 (then the
    whole warp rescales O): scores that rise along the keys in steps below and above that threshold,
    rows whose first key tiles are all hidden (causal, bottom right), every loop, against float64."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.base import Schedule
    q = randn(1, 4, 300, d, dtype=dtype)
    k, v = randn(1, 4, 700, d), randn(1, 4, 700, d, dtype=dtype)
    # key j's scores scale with a ramp of slow and sudden rises (x 1.05 per 64 keys, x 4 at 256 and 512)
    ramp = torch.tensor([1.05 ** (j // 64) * (4.0 if j >= 256 else 1.0) * (4.0 if j >= 512 else 1.0)
                         for j in range(700)], device="cuda")
    k = (k * ramp[None, None, :, None]).to(dtype)      # scaled scores up to ~100: log2 steps of 1-60
    bounded = [Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, bounded=1, **extra)
               for g, bk, extra in ((2, 64, {}), (2, 128, {"release": 1}), (4, 64, {"stages": 3, "release": 1}),
                                    (3, 128, {"release": 1}))]
    scheds = [None] + [Schedule.make("fused_wgmma", groups=g, block_k=bk, tma=1, **extra)
                       for g, bk, extra in ((2, 64, {}), (2, 128, {"release": 1}), (3, 64, {}))]
    scheds += [Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1),
               Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3)] + bounded
    for sched in scheds:
        check(q, k, v, schedule=sched or "fused_wgmma")
        check(q, k, v, causal="bottom_right", schedule=sched or "fused_wgmma")
        check(q, k, v, causal=True, schedule=sched or "fused_wgmma")
    # bounded=1 takes no max on tiles after the first: a rise of ~150 log2 units at key 448 makes its
    # probabilities overflow fp32 (inf) against the old max, which must send the tile back through S
    jump = torch.tensor([1.0 if j < 448 else 48.0 for j in range(700)], device="cuda")
    k2 = (randn(1, 4, 700, d) * jump[None, None, :, None]).to(dtype)
    for sched in [None] + bounded:
        check(q, k2, v, schedule=sched or "fused_wgmma")
        check(q, k2, v, causal="bottom_right", schedule=sched or "fused_wgmma")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [40, 64, 128])
def test_wgmma_producer_warpgroup(dtype, d):
    """The warp-specialized fused_wgmma (a producer warpgroup, mbarrier ring of 2-4 K/V buffers):
    more key tiles than buffers (the free barriers wrap several times), a warpgroup past the last
    query row, GQA 4:1, both causal diagonals with Sq != Sk (warpgroups stopping at different tiles)."""
    if not hopper():
        pytest.skip("fused_wgmma needs an sm_90 device")
    from jitops.ops.attention_wgmma_fit import fits
    from jitops.ops.base import Schedule
    q = randn(2, 8, 90, d, dtype=dtype)
    k, v = randn(2, 2, 900, d, dtype=dtype), randn(2, 2, 900, d, dtype=dtype)
    device = jitops.get_backend().device
    tiles = [(g, bk, ring) for g in (2, 3) for bk in (64, 128) for ring in (2, 3, 4)
             if fits(d, g, bk, device, ring, True)]
    assert tiles, f"no producer tile fits D={d}"
    for groups, block_k, ring in tiles:
        sched = Schedule.make("fused_wgmma", groups=groups, block_k=block_k, stages=ring, producer=1)
        check(q, k, v, schedule=sched)
        check(q, k, v, causal=True, schedule=sched)
        check(q, k, v, causal="bottom_right", schedule=sched)
    # views 2 bytes off 16-byte alignment: the producer's plain-store path, released by the barrier
    uq, uk, uv = (randn(t.numel() + 1, dtype=dtype)[1:].view(t.shape) for t in (q, k, v))
    assert uk.data_ptr() % 16
    groups, block_k, ring = tiles[0]
    check(uq, uk, uv, schedule=Schedule.make("fused_wgmma", groups=groups, block_k=block_k, stages=ring, producer=1))


def _decode_case(batch, heads, kv_heads, sq, sk, d, dtype):
    return (randn(batch, heads, sq, d, dtype=dtype), randn(batch, kv_heads, sk, d, dtype=dtype),
            randn(batch, kv_heads, sk, d, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 72, 128])
def test_decode_tma_ring_and_cluster_merge(dtype, d):
    """fused_mma decoding on sm_90 with K / V by TMA into a swizzled ring (tma=1: 2, 3 and 6 slots, the
    ring wrapping several times, a partial last tile, D = 72's partial 64-column block) unsplit, split
    with the merge kernel, and split over a thread-block cluster merged through distributed shared
    memory (cluster=1: 2, 4 and 8 splits; also on the cp.async loop): GQA 4:1 and MQA, Sq = 1 and 4,
    both causal diagonals, a mask hiding whole splits, and views off 16-byte alignment (no map: the
    threads store the swizzled tiles)."""
    if not hopper():
        pytest.skip("TMA and clusters need an sm_90 device")
    from jitops.ops.base import Schedule
    op = get_op("attention")
    base = dict(pack=True, row_groups=1, warps=4, key_warps=4, block_k=64)
    scheds = [Schedule.make("fused_mma", **base, tma=1, stages=s) for s in (2, 3, 6)]
    scheds += [Schedule.make("fused_mma", **base, tma=1, stages=3, splits=3),
               Schedule.make("fused_mma", pack=True, row_groups=1, warps=8, key_warps=8, block_k=128, tma=1, stages=2)]
    clusters = [Schedule.make("fused_mma", **base, tma=1, stages=4, splits=s, cluster=1) for s in (2, 4, 8)]
    clusters += [Schedule.make("fused_mma", **base, splits=4, cluster=1)]
    for heads, kv_heads in ((32, 8), (16, 1)):
        for sq, sk in ((1, 1000), (4, 333)):
            q, k, v = _decode_case(2, heads, kv_heads, sq, sk, d, dtype)
            for sched in scheds + clusters:
                check(q, k, v, schedule=sched)
                check(q, k, v, causal="bottom_right", schedule=sched)
    q, k, v = _decode_case(2, 32, 8, 1, 1000, d, dtype)
    specs = {n: TensorSpec(tuple(t.shape), str(dtype).split(".")[-1]) for n, t in (("q", q), ("k", k), ("v", v))}
    for sched in clusters:
        plan = op.plan(op.make_problem({**specs, "mask": None}, {}), sched, jitops.get_backend().device)
        assert [launch.kernel for launch in plan.launches] == ["attention_fused_mma"] and not plan.workspaces
    mask = torch.zeros(2, 32, 1, 1000, device="cuda")
    mask[..., :600] = float("-inf")             # splits that see no key (log-sum-exp -inf)
    mask[0, 5] = float("-inf")                  # a query that sees nothing: 0
    for sched in clusters[:3] + scheds[3:4]:
        out = check(q, k, v, mask, schedule=sched)
        assert torch.all(out[0, 5] == 0)
    uq, uk, uv = (randn(t.numel() + 1, dtype=dtype)[1:].view(t.shape) for t in (q, k, v))
    assert uk.data_ptr() % 16 and uv.data_ptr() % 16
    for sched in scheds[1:2] + clusters[1:2]:
        check(uq, uk, uv, schedule=sched)
        check(q, uk, v, causal="bottom_right", schedule=sched)


def test_decode_tma_repeat_calls_encode_each_pointer():
    """The TMA decode plan's repeat calls (straight-line path) encode each call's own K / V maps."""
    if not hopper():
        pytest.skip("TMA needs an sm_90 device")
    from jitops.ops.base import Schedule
    sched = Schedule.make("fused_mma", pack=True, row_groups=1, warps=4, key_warps=4, block_k=64, tma=1, stages=4,
                          splits=4, cluster=1)
    for i in range(4):
        q, k, v = _decode_case(2, 32, 8, 1, 700, 128, torch.float16)
        out = torch.full_like(q, float("nan")) if i % 2 else None
        got = jitops.attention(q, k, v, schedule=sched, out=out)
        err = float((got.double() - reference(q, k, v)).abs().max() / reference(q, k, v).abs().max())
        assert err <= 2e-3, (i, err)


def bshd(b, h, s, d, dtype, offset=0, layout="bshd"):
    """[B, H, S, D] view of a contiguous [B, S, H, D] tensor (x.transpose(1, 2)), or with layout
    "sbhd" of a contiguous [S, B, H, D] one (x.permute(1, 2, 0, 3)); offset elements in."""
    flat = randn(b * s * h * d + offset, dtype=dtype)[offset:]
    if layout == "sbhd":
        return flat.view(s, b, h, d).permute(1, 2, 0, 3)
    return flat.view(b, s, h, d).transpose(1, 2)


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "bshd"), (torch.float16, "bshd"), (torch.bfloat16, "bshd"),
                                          (torch.float16, "sbhd"), (torch.bfloat16, "sbhd")])
def test_heads_inner_views_every_kernel(dtype, layout):
    """q / k / v as transposed [B, S, H, D] tensors (SDPA users' and the ONNX rewrite's layout), read in
    place by every algorithm and tile family: fused_wgmma's 4-d tensor maps (plain and producer loops),
    fused_mma prefill and decoding (packed GQA heads, split-KV merged by the kernel or, on sm_90, in a
    cluster over TMA tiles), the SIMT kernels; mixed with a [B, H, S, D] KV cache; outputs are views of
    the same form; views off 16-byte alignment take the plain-load paths."""
    from jitops.ops.base import Schedule
    if dtype == torch.bfloat16 and not jitops.get_backend().device.matrix_cores:
        pytest.skip("bf16 runs on matrix cores")
    q, k, v = (bshd(2, h, n, 64, dtype, layout=layout) for h, n in ((8, 201), (2, 333), (2, 333)))
    mask = torch.randn(201, 333, device="cuda")
    algs = [a for a in algorithms(dtype) if not (dtype == torch.bfloat16 and a in ("fused", "three_stage", "naive"))]
    for alg in algs:
        out = check(q, k, v, causal=True, schedule=alg)
        assert out.stride() == q.stride()
        check(q, k, v, mask, schedule=alg)
        check(q, k.contiguous(), v.contiguous(), schedule=alg)
    got = jitops.attention(q, k, v, causal=True)
    assert got.stride() == q.stride() and got.shape == q.shape
    if dtype == torch.float32 or not jitops.get_backend().device.matrix_cores:
        return
    dq, dk, dv = (bshd(2, h, n, 128, dtype, layout=layout) for h, n in ((32, 3), (8, 5000), (8, 5000)))
    check(dq, dk, dv)
    check(dq, dk, dv, causal="bottom_right")
    decode = [Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=8)]
    if hopper():
        decode += [Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=s,
                                 tma=1, stages=3, **c) for s, c in ((1, {}), (4, {}), (4, {"cluster": 1}))]
        decode += [Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1),
                   Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1)]
    for sched in decode:
        if sched.algorithm == "fused_wgmma":
            check(q, k, v, causal=True, schedule=sched)
            uq, uk, uv = (bshd(2, h, n, 64, dtype, 1, layout) for h, n in ((8, 201), (2, 333), (2, 333)))
            check(uq, uk, uv, causal=True, schedule=sched)
        else:
            check(dq, dk, dv, causal="bottom_right", schedule=sched)


def test_heads_inner_views_take_the_native_repeat_path():
    """Eager calls on x.transpose(1, 2) views repeat through the native RepeatCall (its format check
    compares strides with the layout's axis order, torch having no memory format for it), give heads-inner
    views back, and a contiguous tensor of the same shape never runs the heads-inner plan."""
    from jitops.engine import _cache
    q, k, v = bshd(8, 12, 197, 64, torch.float16), bshd(8, 12, 197, 64, torch.float16), bshd(8, 12, 197, 64, torch.float16)
    want = reference(q, k, v)
    for _ in range(3):
        out = jitops.attention(q, k, v)
        torch.cuda.synchronize()
        assert out.transpose(1, 2).is_contiguous()
        assert float((out.double() - want).abs().max() / want.abs().max()) <= TOL[torch.float16]
    bound = [b for key, b in _cache.bound.items()
             if key[0] == "attention" and any(isinstance(e, tuple) and "bshd" in e for e in key)]
    assert bound and all(b is not None for b in bound)
    assert any(b.native is not None for b in bound), "heads-inner views missed the native path"
    plain = jitops.attention(q.contiguous(), k.contiguous(), v.contiguous())
    torch.cuda.synchronize()
    assert plain.is_contiguous() and float((plain.double() - want).abs().max() / want.abs().max()) <= TOL[torch.float16]


def packed(b, s, h, d, dtype, hk=None, extra=0, offset=0):
    """q, k, v as column slices of one packed projection [B, S, (H + 2 Hk) D + extra] (`offset` elements
    into its memory): timm's ViT (`.unbind(0)`), GPT-2 (`.split(E, 2)`) and fused-qkv GQA models hand
    SDPA these views, [B, S, H, D] storage with rows P = (H + 2 Hk) D + extra elements apart."""
    hk = hk or h
    pitch = (h + 2 * hk) * d + extra
    rows = randn(b * s * pitch + offset, dtype=dtype)[offset:].view(b, s, pitch)
    cuts, heads = (0, h * d, (h + hk) * d, (h + 2 * hk) * d), (h, hk, hk)
    return tuple(rows[..., lo:hi].unflatten(2, (n, d)).transpose(1, 2) for lo, hi, n in zip(cuts, cuts[1:], heads))


def check_packed(q, k, v, mask=None, causal=False, schedule=None, tol=None, **kw):
    """check() for packed views: the output (dense [B, Sq, H, D], viewed [B, H, Sq, D]) NaN-poisoned first."""
    b, h, s, d = q.shape
    out = torch.full((b, s, h, d), float("nan"), dtype=q.dtype, device=q.device).transpose(1, 2)
    got = jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule, **kw)
    torch.cuda.synchronize()
    assert got is out and not torch.isnan(out).any(), f"{schedule}: unwritten or NaN output"
    ref = reference(q, k, v, mask, causal)
    err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    assert err <= (tol or TOL[q.dtype]), f"{schedule}: error {err:.3g}"
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_packed_projection_views_every_kernel(dtype):
    """q / k / v sliced out of one packed projection (row pitch > H * D) read in place by every algorithm:
    timm-style (H = Hk) and GQA packs, causal and masked, pitches and bases off 16 bytes (plain-load paths,
    no tensor maps), decoding (Sq = 1..3) from a packed KV with packed GQA rows, split merges, TMA rings and
    clusters, both fused_wgmma loops, TF32 for fp32; the output is dense whatever q's pitch."""
    from jitops.ops.base import Schedule
    mma = jitops.get_backend().device.matrix_cores
    if dtype == torch.bfloat16 and not mma:
        pytest.skip("bf16 runs on matrix cores")
    algs = [a for a in algorithms(dtype) if not (dtype == torch.bfloat16 and a in ("fused", "three_stage", "naive"))]
    mask = torch.randn(201, 201, device="cuda")
    for hk, extra, offset in ((8, 0, 0), (2, 0, 0), (2, 4, 0), (2, 0, 1)):     # timm, GQA, off 16 bytes twice
        q, k, v = packed(2, 201, 8, 64, dtype, hk, extra, offset)
        for alg in algs:
            out = check_packed(q, k, v, causal=True, schedule=alg)
            assert out.transpose(1, 2).is_contiguous()
            if hk == 8:
                check_packed(q, k, v, mask, schedule=alg)
    if dtype == torch.float32 and mma:
        q, k, v = packed(2, 201, 8, 64, dtype, 2)
        check_packed(q, k, v, causal=True, precision="tf32", tol=4e-3)
        q, k, v = packed(2, 201, 8, 64, dtype, 2, extra=1)
        check_packed(q, k, v, precision="tf32", tol=4e-3)
    if dtype == torch.float32 or not mma:
        return
    decode = [None, Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=8)]
    if hopper():
        decode += [Schedule.make("fused_mma", warps=4, row_groups=1, block_k=64, key_warps=4, pack=True, splits=s,
                                 tma=1, stages=3, **c) for s, c in ((1, {}), (4, {}), (4, {"cluster": 1}))]
    for extra in (0, 4):
        _, dk, dv = packed(2, 5000, 32, 128, dtype, 8, extra)
        for sq in (1, 2, 3):
            dq = packed(2, sq, 32, 128, dtype, 8, extra)[0]
            for sched in decode:
                check_packed(dq, dk, dv, causal="bottom_right", schedule=sched)
    if hopper():
        for extra, offset in ((0, 0), (4, 0), (0, 1)):
            q, k, v = packed(2, 333, 8, 64, dtype, 2, extra, offset)
            for sched in (Schedule.make("fused_wgmma", groups=2, block_k=128, tma=1),
                          Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1)):
                check_packed(q, k, v, causal=True, schedule=sched)


def test_packed_projection_views_take_the_native_repeat_path():
    """Eager calls on a ViT's packed q / k / v views repeat through the native RepeatCall, and the plan bound
    for that pitch never runs on dense [B, S, H, D] views of the same shape, nor on another pitch (calls
    alternate; every result against float64)."""
    from jitops.engine import _cache
    views = {"packed": packed(8, 197, 12, 64, torch.float16),
             "dense": tuple(bshd(8, 12, 197, 64, torch.float16) for _ in range(3)),
             "wider": packed(8, 197, 12, 64, torch.float16, extra=8)}
    want = {name: reference(*v) for name, v in views.items()}
    for name in ("packed", "packed", "dense", "packed", "wider", "dense", "wider", "packed"):
        out = jitops.attention(*views[name])
        torch.cuda.synchronize()
        assert out.transpose(1, 2).is_contiguous()
        err = float((out.double() - want[name]).abs().max() / want[name].abs().max())
        assert err <= TOL[torch.float16], (name, err)
    bound = [b for key, b in _cache.bound.items()
             if key[0] == "attention" and any(isinstance(e, tuple) and ("bshd", 12 * 64 * 3) in e for e in key)]
    assert bound and all(b is not None for b in bound)
    assert any(b.native is not None for b in bound), "packed views missed the native path"
