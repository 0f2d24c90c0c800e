"""conv2d on a real GPU (pytest -m gpu): every algorithm, the 15 benchmark problems in fp32 and
fp16, the cached Winograd filter transform under weight updates, streams and graph capture,
numpy inputs, misaligned outputs and 64-bit offsets. References are float64 convolutions."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.bench.conv2d import PROBLEMS, reference_f64
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

op = get_op("conv2d")
F = torch.nn.functional
# Tolerances relative to max |reference|, the same reasoning as tests/test_conv2d.py (larger K
# here: up to 17280 for k100_4, sqrt(K) * 2^-24 ~ 8e-6 for fp32 sums).
TOL = {"float32": 2e-5, "float16": 2e-3}
TOL_WINOGRAD = {("float32", "winograd_2x2"): 5e-5, ("float32", "winograd_4x4"): 3e-4,
                ("float16", "winograd_2x2"): 3e-3, ("float16", "winograd_4x4"): 5e-3}


@pytest.fixture(autouse=True)
def _on_gpu_without_tf32(gpu_backend):
    """Every test on the GPU backend (conftest), cuDNN references without TF32."""
    torch.backends.cudnn.allow_tf32 = False
    yield gpu_backend


def rand(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def check(y, x, w, bias=None, tol=2e-5, **attrs):
    act = attrs.pop("activation", None)
    alpha = attrs.pop("alpha", 0.01)
    ref = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), **attrs)
    if act == "relu":
        ref = F.relu(ref)
    elif act == "leaky_relu":
        ref = F.leaky_relu(ref, alpha)
    assert not torch.isnan(y).any(), "unwritten output"
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    assert err <= tol, err


def tol_for(dtype, algorithm):
    name = str(dtype).split(".")[-1]
    return TOL_WINOGRAD.get((name, algorithm), TOL[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("algorithm", [None, "naive", "direct", "implicit_gemm", "split_k", "winograd_2x2",
                                       "winograd_4x4"])
def test_algorithms(dtype, algorithm):
    x = rand(3, 24, 37, 30, dtype=dtype)
    w = rand(40, 24, 3, 3, dtype=dtype, scale=0.2, seed=1)
    b = rand(40, dtype=dtype, seed=2)
    out = torch.full((3, 40, 37, 29), float("nan"), device="cuda", dtype=dtype)
    y = jitops.conv2d(x, w, b, padding=(1, 0, 1, 1), activation="leaky_relu", alpha=0.1, out=out,
                      schedule=algorithm)
    torch.cuda.synchronize()
    # padding (top 1, left 0, bottom 1, right 1) == F.pad(left 0, right 1, top 1, bottom 1), then no padding
    check(y, F.pad(x, (0, 1, 1, 1)), w, b, tol_for(dtype, algorithm), activation="leaky_relu", alpha=0.1)


@pytest.mark.parametrize("attrs, shapes", [
    (dict(stride=2, padding=1), ((4, 32, 57, 57), (64, 32, 3, 3))),
    (dict(dilation=2, padding=2), ((2, 16, 40, 40), (32, 16, 3, 3))),
    (dict(groups=4, padding=1), ((2, 64, 28, 28), (64, 16, 3, 3))),
    (dict(groups=96, padding=1), ((2, 96, 56, 56), (96, 1, 3, 3))),            # depthwise
    (dict(groups=32, padding=2, stride=2), ((1, 32, 64, 64), (64, 1, 5, 5))),  # depthwise x2
    (dict(padding=0), ((2, 256, 14, 14), (1024, 256, 1, 1))),
    (dict(padding=3, stride=2), ((2, 3, 224, 224), (64, 3, 7, 7))),            # a ResNet stem
])
def test_shapes(attrs, shapes):
    x = rand(*shapes[0])
    w = rand(*shapes[1], scale=0.1, seed=3)
    for algorithm in (None, "direct", "implicit_gemm"):
        y = jitops.conv2d(x, w, schedule=algorithm, **attrs)
        torch.cuda.synchronize()
        check(y, x, w, tol=TOL["float32"], **attrs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("cp", PROBLEMS, ids=[p.name for p in PROBLEMS])
def test_benchmark_problems(cp, dtype):
    x = rand(cp.n, cp.cin, cp.h, cp.w, dtype=dtype)
    w = rand(cp.cout, cp.cin, cp.k, cp.k, dtype=dtype, scale=(cp.cin * cp.k * cp.k) ** -0.5, seed=4)
    out = torch.full((cp.n, cp.cout, cp.h + 2 * cp.pad - cp.k + 1, cp.w + 2 * cp.pad - cp.k + 1), float("nan"),
                     device="cuda", dtype=dtype)
    jitops.conv2d(x, w, padding=cp.pad, out=out)
    torch.cuda.synchronize()
    p = op.make_problem({"x": _spec(x), "w": _spec(w)}, {"padding": cp.pad})
    s = op.heuristic(p, jitops.get_backend().device)
    ref = reference_f64(torch, x, w, cp.pad)               # float64 im2col + DGEMM: fast at every size
    assert not torch.isnan(out).any(), "unwritten output"
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err <= op.tolerance(p, s)[0], (str(s), err)


def _spec(t):
    from jitops.ops.base import TensorSpec
    return TensorSpec(tuple(t.shape), str(t.dtype).split(".")[-1])


@pytest.mark.parametrize("algorithm", ["winograd_4x4", "winograd_2x2", "implicit_gemm"])
def test_weight_updates_are_retransformed(algorithm):
    x = rand(2, 32, 20, 20)
    w = rand(48, 32, 3, 3, scale=0.1, seed=5)
    for _ in range(2):
        check(jitops.conv2d(x, w, padding=1, schedule=algorithm), x, w, tol=tol_for(torch.float32, algorithm),
              padding=1)
    w.mul_(-0.5).add_(0.01)                                  # in place: new version counter
    check(jitops.conv2d(x, w, padding=1, schedule=algorithm), x, w, tol=tol_for(torch.float32, algorithm), padding=1)
    w2 = rand(48, 32, 3, 3, scale=0.1, seed=6)               # another tensor
    check(jitops.conv2d(x, w2, padding=1, schedule=algorithm), x, w2, tol=tol_for(torch.float32, algorithm),
          padding=1)


@pytest.mark.parametrize("algorithm", ["winograd_4x4", "winograd_2x2"])
def test_new_weight_at_a_freed_weights_address(algorithm):
    """torch's caching allocator hands a freed weight's block to the next tensor of its size, with
    a fresh version counter: its filters must be transformed anew, not taken from the old weight."""
    x = rand(2, 32, 20, 20)
    addresses = set()
    for seed in range(4):
        w = rand(48, 32, 3, 3, scale=0.1, seed=10 + seed)
        addresses.add(w.data_ptr())
        check(jitops.conv2d(x, w, padding=1, schedule=algorithm), x, w, tol=tol_for(torch.float32, algorithm),
              padding=1)
        del w
    assert len(addresses) < 4      # the allocator did reuse memory: the case this test is about


def test_stream_and_graph_capture():
    x = rand(4, 64, 32, 32)
    w = rand(64, 64, 3, 3, scale=0.05, seed=7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        x.mul_(2.0)
        y = jitops.conv2d(x, w, padding=1, schedule="winograd_4x4")
    s.synchronize()
    check(y, x, w, tol=3e-4, padding=1)
    out = torch.empty_like(y)
    jitops.conv2d(x, w, padding=1, out=out, schedule="winograd_4x4")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        jitops.conv2d(x, w, padding=1, out=out, schedule="winograd_4x4")
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, x, w, tol=3e-4, padding=1)


def test_numpy_inputs_on_gpu_backend():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 17, 19)).astype(np.float32)
    w = (rng.standard_normal((12, 8, 3, 3)) * 0.2).astype(np.float32)
    for algorithm in (None, "winograd_4x4", "implicit_gemm"):
        y = jitops.conv2d(x, w, padding=1, schedule=algorithm)
        assert isinstance(y, np.ndarray)
        check(torch.from_numpy(y).cuda(), torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), tol=3e-4,
              padding=1)


def test_misaligned_output_view():
    x = rand(1, 16, 16, 16)
    w = rand(8, 16, 1, 1, seed=8)
    base = torch.full((8 * 256 + 1,), float("nan"), device="cuda")
    out = base[1:].view(1, 8, 16, 16)                        # 4 bytes off a 16-byte boundary
    jitops.conv2d(x, w, out=out, schedule="gemm_1x1")
    torch.cuda.synchronize()
    assert torch.isnan(base[:1]).all()
    check(out, x, w, tol=TOL["float32"])


def test_64_bit_offsets():
    x = rand(1, 40, 7400, 7400, dtype=torch.float16)          # 2.19e9 elements
    w = rand(4, 40, 1, 1, dtype=torch.float16, seed=9)
    y = jitops.conv2d(x, w)
    torch.cuda.synchronize()
    tail = slice(7400 - 3, 7400)
    check(y[:, :, tail, :], x[:, :, tail, :], w, tol=TOL["float16"])
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_fp32_on_matrix_cores(precision, layout):
    """fp32 with precision tf32 / 3xtf32 forced onto the matrix-core kernel (fused and split-K),
    stride 2 with 20 channels (padded copy) and a long K; tolerances of conv2d.tolerance (tf32
    4e-3 and above 1e-5, so the rounding happened; 3xtf32 twice the fp32 allowance)."""
    from jitops.ops.conv2d_mma import mma_schedule
    for xs, ws, attrs in (((2, 20, 17, 15), (24, 20, 3, 3), {"padding": 1, "stride": 2}),
                          ((2, 512, 7, 7), (40, 512, 3, 3), {"padding": 1})):
        x, w = rand(*xs), rand(*ws, scale=(ws[1] * 9) ** -0.5, seed=1)
        if layout == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        ref = F.conv2d(x.double(), w.double(), **attrs)
        for s in (mma_schedule(64, 64, 32, 2, 2, 4), mma_schedule(64, 32, 16, 2, 1, 4, split_k=3)):
            y = jitops.conv2d(x, w, precision=precision, schedule=s, **attrs)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert not torch.isnan(y).any()
            if precision == "tf32":
                assert 1e-5 < err <= 4e-3, err
            else:
                assert err <= 4e-5, err


def _hopper(be) -> bool:
    return be.device.arch.rstrip("a") == "sm_90"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_wgmma_matches_float64(gpu_backend, dtype, layout):
    """The Hopper warpgroup-MMA kernel (sm_90 only) on edge shapes: M, N and K not multiples of the
    tile, 20 channels (padded copy), stride 2, dilation, groups, 1x1, residual + activation, both
    loop variants (all threads copy / a copying warpgroup) and split-K."""
    if not _hopper(gpu_backend):
        pytest.skip(f"wgmma needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops.conv2d_wgmma import schedule
    tol = 4e-3 if dtype == torch.float16 else 2e-2
    cases = (((2, 20, 17, 15), (24, 20, 3, 3), {"padding": 1, "stride": 2, "activation": "relu"}),
             ((1, 32, 19, 21), (40, 32, 3, 3), {"padding": 2, "dilation": 2}),
             ((2, 64, 12, 12), (64, 16, 3, 3), {"padding": 1, "groups": 4}),
             ((2, 64, 14, 14), (72, 64, 1, 1), {}),
             ((2, 512, 7, 7), (36, 512, 3, 3), {"padding": 1, "activation": "leaky_relu", "alpha": 0.1}),
             # Cout past one 192-column tile: every row of a B tile is read (a tile's rows that were
             # never copied showed only where a real output column read them)
             ((1, 64, 9, 9), (200, 64, 3, 3), {"padding": 1}))
    for i, (xs, ws, attrs) in enumerate(cases):
        x = rand(*xs, dtype=dtype, seed=i)
        w = rand(*ws, dtype=dtype, scale=(ws[1] * ws[2] * ws[3]) ** -0.5, seed=i + 10)
        b = rand(ws[0], dtype=dtype, seed=i + 20)
        if layout == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        act, alpha = attrs.get("activation"), attrs.get("alpha", 0.01)
        conv = {k: v for k, v in attrs.items() if k not in ("activation", "alpha")}
        ref = F.conv2d(x.double(), w.double(), b.double(), **conv)
        r = rand(*ref.shape, dtype=dtype, seed=i + 30)
        if layout == "nhwc":
            r = r.to(memory_format=torch.channels_last)
        ref = ref + r.double()
        ref = F.relu(ref) if act == "relu" else F.leaky_relu(ref, alpha) if act == "leaky_relu" else ref
        # 192 x 128 without the producer: 384 copying threads, a partial last pass over B's rows
        for s in (schedule(128, 128, 4, 0), schedule(256, 128, 4, 0), schedule(192, 128, 4, 0),
                  schedule(128, 192, 4, 0), schedule(64, 64, 4, 0, split_k=2), schedule(128, 128, 4, 1),
                  schedule(192, 128, 4, 1), schedule(128, 64, 3, 0), schedule(192, 64, 3, 0)):
            y = jitops.conv2d(x, w, b, residual=r, schedule=s, **attrs)
            assert not torch.isnan(y).any(), s
            assert y.is_contiguous(memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (s, xs, ws, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_persistent_matches_float64(gpu_backend, dtype):
    """The persistent wgmma grid (each block loops over tiles, the next tile's loads overlapping
    the epilogue, which stores from registers) on problems with more tiles than resident blocks:
    bias + residual + activation, channels per group not a multiple of 8 (scalar stores), groups,
    stride 2, 1x1; every persistent tile, into a NaN-filled output. fp32 runs with precision tf32."""
    if not _hopper(gpu_backend):
        pytest.skip(f"wgmma needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    cases = (((2, 24, 120, 120), (40, 24, 3, 3), {"padding": 1, "activation": "relu"}),
             ((2, 64, 96, 96), (36, 16, 3, 3), {"padding": 1, "groups": 4}),
             ((4, 64, 80, 80), (72, 64, 1, 1), {"activation": "leaky_relu", "alpha": 0.1}),
             ((2, 32, 241, 239), (64, 32, 3, 3), {"padding": 1, "stride": 2}))
    looped = 0
    for i, (xs, ws, attrs) in enumerate(cases):
        x = rand(*xs, dtype=dtype, seed=i).to(memory_format=torch.channels_last)
        w = rand(*ws, dtype=dtype, scale=(ws[1] * ws[2] * ws[3]) ** -0.5, seed=i + 10)
        b = rand(ws[0], dtype=dtype, seed=i + 20)
        act, alpha = attrs.get("activation"), attrs.get("alpha", 0.01)
        conv = {k: v for k, v in attrs.items() if k not in ("activation", "alpha")}
        ref = F.conv2d(x.double(), w.double(), b.double(), **conv)
        r = rand(*ref.shape, dtype=dtype, seed=i + 30).to(memory_format=torch.channels_last)
        ref = ref + r.double()
        ref = F.relu(ref) if act == "relu" else F.leaky_relu(ref, alpha) if act == "leaky_relu" else ref
        nhwc = {"x": TensorSpec(xs, _spec(x).dtype, "nhwc"), "w": _spec(w), "bias": _spec(b),
                "residual": TensorSpec(tuple(r.shape), _spec(r).dtype, "nhwc")}
        p = get_op("conv2d").make_problem(nhwc, {**attrs, **extra})
        for tile in wg.PERSISTENT_TILES:
            s = wg.schedule(*tile, bk=wg.bk_of(p), persistent=True)
            plan = get_op("conv2d").plan(p, s, gpu_backend.device)
            grid = next(l.grid for l in plan.launches if l.kernel == "conv2d_implicit_gemm_wgmma")
            tiles = -(-p.pixels // tile[0]) * -(-p.cout_g // tile[1]) * p.groups
            looped += grid[0] < tiles
            out = torch.full_like(r, float("nan"))
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, **attrs, **extra)
            assert not torch.isnan(y).any(), (s, xs)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (s, xs, ws, err)
            if dtype == torch.float32:
                assert err > 1e-5, (s, xs, "tf32 rounding expected")
    assert looped >= 8          # most of them ran blocks over several tiles


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_window_rows_matches_float64(gpu_backend, dtype):
    """The window-rows wgmma GEMM (RGB stems: K as window rows of 4-channel pixel pairs read from a
    zero-padded copy) on edge shapes: 3 and 4 channels, 7x7 / 5x5 / 3x3 / 4x4 / 16x16 windows, M and N
    not multiples of the tile, uneven padding, stride (1, 2), NCHW and NHWC, bias + residual +
    activation; plain and persistent grids of several tiles and split-K, into NaN-filled outputs. fp32
    runs with precision tf32 (one pixel per 16-byte chunk: any stride, KW <= 8)."""
    if not _hopper(gpu_backend):
        pytest.skip(f"wgmma needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    from jitops.ops.conv2d_mma import window_rows_why_not
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    bk = 32 if dtype == torch.float32 else 64
    cases = (((3, 3, 37, 53), (72, 3, 7, 7), {"padding": 3, "stride": 2, "activation": "relu"}, "nhwc"),
             ((2, 4, 31, 45), (40, 4, 5, 5), {"padding": (2, 1), "stride": (1, 2)}, "nchw"),
             ((2, 3, 64, 66), (24, 3, 3, 3), {"padding": 1, "stride": 2, "activation": "leaky_relu", "alpha": 0.1},
              "nhwc"),
             ((4, 3, 56, 56), (96, 3, 4, 4), {"stride": 4}, "nhwc"),
             ((2, 3, 64, 48), (200, 3, 16, 16), {"stride": 16}, "nchw"),
             ((16, 3, 96, 96), (64, 3, 7, 7), {"padding": 3, "stride": 2, "activation": "relu"}, "nhwc"))
    tiles = ((128, 64, 4, 0), (64, 64, 4, 0), (128, 128, 4, 0), (64, 128, 4, 0), (128, 192, 4, 0), (256, 128, 4, 0))
    for i, (xs, ws, attrs, layout) in enumerate(cases):
        spec = {"x": TensorSpec(xs, str(dtype).split(".")[-1], layout if layout == "nhwc" else ""),
                "w": TensorSpec(ws, str(dtype).split(".")[-1]), "bias": None}
        if window_rows_why_not(get_op("conv2d").make_problem(spec, {**attrs, **extra})):
            continue                        # fp32: KW > 8
        cl = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        x = rand(*xs, dtype=dtype, seed=i).to(memory_format=cl)
        w = rand(*ws, dtype=dtype, scale=(ws[1] * ws[2] * ws[3]) ** -0.5, seed=i + 10)
        b = rand(ws[0], dtype=dtype, seed=i + 20)
        act, alpha = attrs.get("activation"), attrs.get("alpha", 0.01)
        conv = {k: v for k, v in attrs.items() if k not in ("activation", "alpha")}
        ref = F.conv2d(x.double(), w.double(), b.double(), **conv)
        r = rand(*ref.shape, dtype=dtype, seed=i + 30).to(memory_format=cl)
        ref = ref + r.double()
        ref = F.relu(ref) if act == "relu" else F.leaky_relu(ref, alpha) if act == "leaky_relu" else ref
        runs = [wg.schedule(*tile, bk=bk, persistent=persistent, rows=True) for tile in tiles
                for persistent in ((False, True) if layout == "nhwc" else (False,))]
        runs.append(wg.schedule(64, 64, 4, 0, split_k=2, bk=bk, rows=True))       # split-K: K tiles from kt0 on
        for s in runs:
            out = torch.full_like(r, float("nan"))
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, **attrs, **extra)
            assert not torch.isnan(y).any(), (s, xs)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (s, xs, ws, err)


def _nchw_1x1_case(xs, ws, dtype, seed):
    """An NCHW 1x1 conv with bias, residual and ReLU: its tensors, the float64 result and the problem."""
    x = rand(*xs, dtype=dtype, seed=seed)
    w = rand(*ws, dtype=dtype, scale=ws[1] ** -0.5, seed=seed + 10)
    b = rand(ws[0], dtype=dtype, seed=seed + 20)
    r = rand(xs[0], ws[0], xs[2], xs[3], dtype=dtype, seed=seed + 30)
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double()) + r.double())
    p = get_op("conv2d").make_problem({"x": _spec(x), "w": _spec(w), "bias": _spec(b), "residual": _spec(r)},
                                      {"activation": "relu"})
    return x, w, b, r, ref, p


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wgmma_nchw_1x1_matches_float64(gpu_backend, dtype):
    """The NCHW 1x1 wgmma kernel (weights as A, the image read in place as a transposed B): input
    channels below one K tile and past it, output channels and pixels past the tile, H * W a
    multiple of 4 but not 8 (8-byte copies and stores), bias + residual + ReLU, every tile, into a
    NaN-filled output."""
    if not _hopper(gpu_backend):
        pytest.skip(f"wgmma needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    tol = 4e-3 if dtype == torch.float16 else 2e-2
    for i, (xs, ws) in enumerate((((2, 20, 12, 10), (24, 20, 1, 1)), ((3, 96, 8, 8), (200, 96, 1, 1)),
                                  ((1, 256, 16, 16), (64, 256, 1, 1)), ((2, 72, 28, 28), (72, 72, 1, 1)),
                                  ((3, 40, 14, 14), (200, 40, 1, 1)), ((2, 96, 6, 10), (24, 96, 1, 1)))):
        x, w, b, r, ref, p = _nchw_1x1_case(xs, ws, dtype, seed=i)
        scheds = [s for s in wg.candidates(p, gpu_backend.device) if wg.is_nchw_1x1(s)]     # 14x14, 6x10: 4-pixel copies
        assert scheds, xs
        for s in scheds:
            plan = get_op("conv2d").plan(p, s, gpu_backend.device)
            assert [l.kernel for l in plan.launches] == ["conv2d_wgmma_nchw_1x1"]       # no NHWC copy
            out = torch.full_like(ref, float("nan"), dtype=dtype)
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation="relu")
            assert not torch.isnan(y).any(), s
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (xs, ws, s, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mma_reads_nchw_in_place(gpu_backend, dtype):
    """a_nchw (mma.sync reading an NCHW input in place, no NHWC copy) on 1x1 convs: M tiles across
    two images, K past the channels, N past the tile, split-K, bias + residual + ReLU, every tile;
    14x14 (4-pixel chunks)."""
    from jitops.ops.conv2d_mma import candidates
    tol = 4e-3 if dtype == torch.float16 else 2e-2
    for i, (xs, ws) in enumerate((((2, 20, 12, 10), (24, 20, 1, 1)), ((3, 96, 8, 8), (200, 96, 1, 1)),
                                  ((1, 256, 16, 16), (64, 256, 1, 1)), ((2, 64, 14, 14), (72, 64, 1, 1)))):
        x, w, b, r, ref, p = _nchw_1x1_case(xs, ws, dtype, seed=i)
        scheds = [s for s in candidates(p, gpu_backend.device) if int(s.get("a_nchw", 0))]
        assert scheds
        for s in scheds:
            out = torch.full_like(ref, float("nan"), dtype=dtype)
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation="relu")
            assert not torch.isnan(y).any(), s
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (xs, ws, s, err)


# Odd shapes for the TMA kernel (A by TMA im2col, B by TMA, warp-specialized): C below one chunk and
# not a multiple of 8 (padded copy), C past one chunk, odd H / W, stride 2, dilation 2, padding 0 and 2,
# 1x1 / 3x3 / 5x5 / 7x7, tiles crossing images, Cout not a multiple of the tile (and of 8).
TMA_CASES = (((2, 20, 17, 15), (24, 20, 3, 3), {"padding": 1, "stride": 2}),
             ((1, 40, 19, 21), (40, 40, 3, 3), {"padding": 2, "dilation": 2}),
             ((3, 96, 13, 11), (72, 96, 5, 5), {"padding": 2}),
             ((2, 64, 14, 14), (200, 64, 1, 1), {}),
             ((2, 72, 15, 17), (36, 72, 3, 3), {"padding": 0}),
             ((2, 16, 23, 19), (20, 16, 7, 7), {"padding": 3, "stride": 2}),
             ((4, 136, 9, 9), (132, 136, 3, 3), {"padding": 1, "stride": 2, "dilation": 2}))


def _tma_case(xs, ws, attrs, dtype, seed, act="relu", alpha=0.01):
    x = rand(*xs, dtype=dtype, seed=seed).to(memory_format=torch.channels_last)
    w = rand(*ws, dtype=dtype, scale=(ws[1] * ws[2] * ws[3]) ** -0.5, seed=seed + 10)
    b = rand(ws[0], dtype=dtype, seed=seed + 20)
    ref = F.conv2d(x.double(), w.double(), b.double(), **attrs)
    r = rand(*ref.shape, dtype=dtype, seed=seed + 30).to(memory_format=torch.channels_last)
    ref = ref + r.double()
    ref = F.relu(ref) if act == "relu" else F.leaky_relu(ref, alpha) if act == "leaky_relu" else ref
    return x, w, b, r, ref


def test_wgmma_tma_im2col_gathers(gpu_backend):
    """The im2col map's walk, exactly: with one-hot weights (output channel tap * C + c takes input
    channel c at tap (r, s)) the convolution is the im2col matrix itself; small integers in fp16 make
    it exact. Padding 0 / 1 / 2, stride 1 / 2, dilation 1 / 2, tiles crossing image boundaries and
    running past the last pixel, C below one chunk and past it."""
    if not _hopper(gpu_backend):
        pytest.skip(f"TMA needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    for i, (xs, k, attrs) in enumerate((((3, 8, 7, 9), 3, {"padding": 1}), ((2, 16, 11, 10), 3, {"padding": 2, "stride": 2}),
                                        ((2, 24, 9, 13), 3, {"padding": 2, "dilation": 2}), ((3, 8, 10, 7), 2, {}),
                                        ((2, 72, 6, 5), 1, {"stride": 2}))):
        n, c = xs[:2]
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randint(-8, 9, xs, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
        w = torch.zeros(k * k * c, c, k, k, device="cuda", dtype=torch.float16)
        for tap in range(k * k):
            for ch in range(c):
                w[tap * c + ch, ch, tap // k, tap % k] = 1
        ref = F.conv2d(x.double(), w.double(), **attrs)
        p = get_op("conv2d").make_problem({"x": TensorSpec(xs, "float16", "nhwc"), "w": _spec(w)}, attrs)
        for tile in ((64, 128, 6, 1, 0), (128, 64, 6, 2, 0), (256, 128, 4, 2, 232), (64, 128, 6, 2, 0, 1)):
            out = torch.full(tuple(ref.shape), float("nan"), dtype=torch.float16, device="cuda").to(
                memory_format=torch.channels_last)
            y = jitops.conv2d(x, w, out=out, schedule=wg.tma_schedule(tile, wg.bk_of(p)), **attrs)
            bad = (y.double() != ref).nonzero()
            assert len(bad) == 0, (xs, k, attrs, tile, bad[:8].tolist())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_tma_narrow_tiles(gpu_backend, dtype):
    """The 160-channel TMA tiles on Stable Diffusion-like 320-channel layers (the heuristic's pick and the
    two-blocks-per-SM tile, plain and persistent, split-K) and on a layer whose last tile is partial (200
    channels), bias + residual + ReLU, against float64, into a NaN-filled output."""
    if not _hopper(gpu_backend):
        pytest.skip(f"TMA needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    for i, (xs, ws) in enumerate((((2, 320, 64, 64), (320, 320, 3, 3)), ((1, 96, 13, 11), (200, 96, 3, 3)))):
        x, w, b, r, ref = _tma_case(xs, ws, {"padding": 1}, dtype, seed=40 + i)
        spec = {"x": TensorSpec(xs, _spec(x).dtype, "nhwc"), "w": _spec(w), "bias": _spec(b),
                "residual": TensorSpec(tuple(r.shape), _spec(r).dtype, "nhwc")}
        p = get_op("conv2d").make_problem(spec, {"padding": 1, "activation": "relu", **extra})
        scheds = [wg.tma_schedule(t, wg.bk_of(p), persistent=pers, split_k=k)
                  for t in sorted(wg.NARROW_TILES) for pers, k in ((False, 1), (True, 1), (False, 3))]
        if i == 0:
            pick = get_op("conv2d").heuristic(p, gpu_backend.device)
            assert wg.is_tma(pick) and int(pick["bn"]) == 160, pick
            scheds.append(pick)
        for s in scheds:
            out = torch.full_like(r, float("nan"))
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, padding=1, activation="relu", **extra)
            assert not torch.isnan(y).any(), (s, xs)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (s, xs, ws, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_tma_matches_float64(gpu_backend, dtype):
    """The TMA kernel on TMA_CASES, four tiles each (every tile over the cases, ping-pong ones too), plain
    and persistent grids, and split-K (2-4 splits, the reduction adding bias, residual, activation), with bias +
    residual and each activation, into a NaN-filled output; fp32 runs with precision tf32."""
    if not _hopper(gpu_backend):
        pytest.skip(f"TMA needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    acts = ("relu", "leaky_relu", None)
    for i, (xs, ws, attrs) in enumerate(TMA_CASES):
        act = acts[i % 3]
        x, w, b, r, ref = _tma_case(xs, ws, attrs, dtype, seed=i, act=act, alpha=0.1)
        spec = {"x": TensorSpec(xs, _spec(x).dtype, "nhwc"), "w": _spec(w), "bias": _spec(b),
                "residual": TensorSpec(tuple(r.shape), _spec(r).dtype, "nhwc")}
        more = {"activation": act, "alpha": 0.1} if act else {}
        p = get_op("conv2d").make_problem(spec, {**attrs, **extra, **more})
        # four tiles per case, plain and persistent grids (every tile over the cases), and split-K
        plain = [t for t in wg.TMA_TILES if len(t) == 5]       # ping-pong tiles take no split-K
        for j in range(5):
            tile, persistent = wg.TMA_TILES[(3 * i + j) % len(wg.TMA_TILES)], j % 2 == 1
            if j == 4:
                tile = plain[i % len(plain)]
            s = wg.tma_schedule(tile, wg.bk_of(p), persistent=persistent, split_k=2 + i % 3 if j == 4 else 1)
            out = torch.full_like(r, float("nan"))
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, **attrs, **extra, **more)
            assert not torch.isnan(y).any(), (s, xs)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (s, xs, ws, attrs, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_tma_a_rows_matches_float64(gpu_backend, dtype):
    """1x1 stride-1 layers with A read by a tiled map (a_rows): every TMA tile, plain / persistent / split-K,
    on pixel counts no tile divides, channels under one chunk (40), past it (136) and padded by the NHWC copy
    (20 -> 24), bias + residual + ReLU into a NaN-filled output, against float64; fp32 with TF32."""
    if not _hopper(gpu_backend):
        pytest.skip(f"TMA needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.errors import ScheduleError
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    for i, (xs, ws) in enumerate((((3, 40, 9, 7), (200, 40, 1, 1)), ((2, 136, 15, 13), (72, 136, 1, 1)),
                                  ((1, 20, 11, 11), (64, 20, 1, 1)))):
        x, w, b, r, ref = _tma_case(xs, ws, {}, dtype, seed=60 + i)
        spec = {"x": TensorSpec(xs, _spec(x).dtype, "nhwc"), "w": _spec(w), "bias": _spec(b),
                "residual": TensorSpec(tuple(r.shape), _spec(r).dtype, "nhwc")}
        p = get_op("conv2d").make_problem(spec, {"activation": "relu", **extra})
        ran = 0
        for tile in wg.TMA_TILES:
            for persistent, k in ((False, 1), (True, 1), (False, 2)):
                if len(tile) > 5 and k > 1:
                    continue
                s = wg.tma_schedule(tile, wg.bk_of(p), persistent=persistent, split_k=k, a_rows=True)
                try:
                    get_op("conv2d").plan(p, s, gpu_backend.device)
                except ScheduleError:
                    continue
                out = torch.full_like(r, float("nan"))
                y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation="relu", **extra)
                assert not torch.isnan(y).any(), (s, xs)
                err = float((y.double() - ref).abs().max() / ref.abs().max())
                assert err <= tol, (s, xs, ws, err)
                ran += 1
        assert ran >= 20, (xs, ran)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_wgmma_tma_deep_ring_matches_float64(gpu_backend, dtype):
    """The deep rings one-wave grids take (TMA_ONE_WAVE_DEEPER: 64 x 64 / 64 x 128 / 128 x 64 with 8 stages),
    plain / persistent / split-K, 1x1 through the tiled map and 3x3 / strided through im2col, odd pixel counts,
    a channel tile past Cout, bias + residual + ReLU into a NaN-filled output, against float64; fp32 with TF32."""
    if not _hopper(gpu_backend):
        pytest.skip(f"TMA needs an sm_90 device, this is {gpu_backend.device.arch}")
    from jitops.ops import conv2d_wgmma as wg
    from jitops.ops.base import TensorSpec
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 4e-3}[dtype]
    extra = {"precision": "tf32"} if dtype == torch.float32 else {}
    cases = (((3, 40, 9, 7), (200, 40, 1, 1), {}), ((2, 136, 15, 13), (112, 136, 3, 3), {"padding": 1}),
             ((2, 200, 13, 9), (72, 200, 3, 3), {"padding": 1, "stride": 2}))
    for i, (xs, ws, attrs) in enumerate(cases):
        x, w, b, r, ref = _tma_case(xs, ws, attrs, dtype, seed=80 + i)
        spec = {"x": TensorSpec(xs, _spec(x).dtype, "nhwc"), "w": _spec(w), "bias": _spec(b),
                "residual": TensorSpec(tuple(r.shape), _spec(r).dtype, "nhwc")}
        p = get_op("conv2d").make_problem(spec, {**attrs, "activation": "relu", **extra})
        for tile in sorted(set(wg.TMA_ONE_WAVE_DEEPER.values())):
            for persistent, k in ((False, 1), (True, 1), (False, 2)):
                s = wg.tma_schedule(tile, wg.bk_of(p), persistent=persistent, split_k=k, a_rows=p.is_pointwise)
                out = torch.full_like(r, float("nan"))
                y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation="relu", **attrs, **extra)
                assert not torch.isnan(y).any(), (s, xs)
                err = float((y.double() - ref).abs().max() / ref.abs().max())
                assert err <= tol, (s, xs, ws, err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pointwise_stream_matches_float64(gpu_backend, dtype):
    """The few-channel 1x1 stream (pointwise_mma), every schedule: K and N padded to 16 (24 -> 20), a
    partial last tile, many tiles per block (16 -> 16 over 2 x 56 x 56 pixels), Cout odd (scalar stores),
    K = 256 and N = 128 (the largest it takes), bias + residual + ReLU and leaky ReLU, NaN-filled outputs;
    the same in NCHW; the heuristic's pick for MobileNet-v3's 16 -> 16 at 112 x 112."""
    from jitops.ops import conv2d_pointwise as pw
    if not gpu_backend.device.matrix_cores:
        pytest.skip("pointwise_mma needs matrix cores")
    tol = 4e-3 if dtype == torch.float16 else 2e-2
    cases = (((1, 24, 9, 7), (20, 24, 1, 1), "relu"), ((2, 16, 56, 56), (16, 16, 1, 1), "relu"),
             ((1, 40, 5, 7), (21, 40, 1, 1), "leaky_relu"), ((2, 256, 7, 9), (128, 256, 1, 1), "relu"))
    for i, (xs, ws, act) in enumerate(cases):
        x, w, b, r, ref = _tma_case(xs, ws, {}, dtype, seed=i, act=act, alpha=0.1)
        name = str(dtype).split(".")[-1]
        p = op.make_problem({"x": TensorSpec(xs, name, "nhwc"), "w": TensorSpec(ws, name), "bias": None}, {})
        scheds = pw.candidates(p, gpu_backend.device)
        assert scheds, xs
        for s in scheds:
            out = torch.full_like(ref, float("nan"), dtype=dtype).to(memory_format=torch.channels_last)
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation=act, alpha=0.1)
            assert not torch.isnan(y).any(), (xs, s)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (xs, ws, s, err)
    # NCHW (torch's default format): tiles across images (H * W = 40), Cout odd, K = 256 / N = 128.
    for i, (xs, ws, act) in enumerate((((5, 16, 5, 8), (16, 16, 1, 1), "relu"), ((2, 24, 4, 6), (21, 24, 1, 1), "leaky_relu"),
                                       ((2, 256, 8, 9), (128, 256, 1, 1), "relu"), ((2, 16, 56, 56), (64, 16, 1, 1), "relu"))):
        x, w, b, r, ref = _tma_case(xs, ws, {}, dtype, seed=10 + i, act=act, alpha=0.1)
        x, r = x.contiguous(), r.contiguous()
        name = str(dtype).split(".")[-1]
        p = op.make_problem({"x": TensorSpec(xs, name), "w": TensorSpec(ws, name), "bias": None}, {})
        scheds = pw.candidates(p, gpu_backend.device)
        assert scheds, xs
        for s in scheds:
            out = torch.full_like(ref, float("nan"), dtype=dtype).contiguous()
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation=act, alpha=0.1)
            assert not torch.isnan(y).any(), (xs, s)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, ("nchw", xs, ws, s, err)
    name = str(dtype).split(".")[-1]
    mobilenet = op.make_problem({"x": TensorSpec((32, 16, 112, 112), name, "nhwc"),
                                 "w": TensorSpec((16, 16, 1, 1), name), "bias": None}, {})
    assert op.heuristic(mobilenet, gpu_backend.device).algorithm == pw.ALGORITHM


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_few_pixel_gemv_matches_float64(gpu_backend, dtype):
    """The few-pixel 1x1 kernel (gemv_1x1), every schedule: squeeze-and-excitation convolutions at 1 x 1 (NCHW
    and channels_last alike) reducing 1152 -> 48 and expanding 20 -> 480 at batch 32, Cin 34 (2-channel
    vectors) into 3 channels, 49 channels_last pixels at 7 x 7 over two row tiles, Cin 9 (scalar loads); bias +
    residual + ReLU / leaky ReLU into NaN-filled outputs; on sm_90 the heuristic's pick for the SE layers."""
    from jitops.ops import conv2d_gemv as gemv
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dtype]
    name = str(dtype).split(".")[-1]
    cases = (((32, 1152, 1, 1), (48, 1152, 1, 1), "relu", False), ((32, 20, 1, 1), (480, 20, 1, 1), "relu", True),
             ((3, 34, 1, 1), (3, 34, 1, 1), "leaky_relu", True), ((1, 64, 7, 7), (40, 64, 1, 1), "relu", False),
             ((2, 9, 1, 1), (21, 9, 1, 1), "leaky_relu", False))
    for i, (xs, ws, act, nchw) in enumerate(cases):
        x, w, b, r, ref = _tma_case(xs, ws, {}, dtype, seed=40 + i, act=act, alpha=0.1)
        if nchw:
            x, r = x.contiguous(), r.contiguous()
        p = op.make_problem({"x": TensorSpec(xs, name) if nchw else TensorSpec(xs, name, "nhwc"),
                             "w": TensorSpec(ws, name), "bias": None}, {})
        scheds = gemv.candidates(p, gpu_backend.device)
        assert scheds, xs
        for s in scheds:
            out = torch.full_like(ref, float("nan"), dtype=dtype)
            out = out.contiguous() if nchw else out.to(memory_format=torch.channels_last)
            y = jitops.conv2d(x, w, b, residual=r, out=out, schedule=s, activation=act, alpha=0.1)
            assert not torch.isnan(y).any(), (xs, s)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (xs, ws, s, err)
        if _hopper(gpu_backend) and xs[2] == 1:
            assert op.heuristic(p, gpu_backend.device).algorithm == gemv.ALGORITHM, xs


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_residual_in_the_other_memory_format(gpu_backend, dtype):
    """A residual in the other memory format than x (NCHW beside channels_last, or the reverse) is copied into
    x's format by the plan: the heuristic's picks (the TMA kernel on sm_90 for the larger NHWC fp16 layer) and
    the cp.async / SIMT kernels, bias + residual + ReLU into a NaN-filled output, against float64."""
    tol = {torch.float16: 4e-3, torch.float32: 1e-4}[dtype]
    for i, (xs, ws, attrs) in enumerate((((8, 256, 28, 28), (256, 256, 3, 3), {"padding": 1}),
                                         ((2, 40, 9, 7), (24, 40, 1, 1), {}),
                                         ((2, 64, 15, 13), (72, 64, 3, 3), {"padding": 1, "stride": 2}))):
        for xf, rf in ((torch.channels_last, torch.contiguous_format), (torch.contiguous_format, torch.channels_last)):
            x = rand(*xs, dtype=dtype, seed=90 + i).contiguous(memory_format=xf)
            w = rand(*ws, dtype=dtype, scale=(ws[1] * ws[2] * ws[3]) ** -0.5, seed=91 + i)
            b = rand(ws[0], dtype=dtype, seed=92 + i)
            ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), **attrs)
            r = rand(*ref.shape, dtype=dtype, seed=93 + i).contiguous(memory_format=rf)
            ref = torch.relu(ref + r.double())
            out = torch.full(ref.shape, float("nan"), dtype=dtype, device="cuda").contiguous(memory_format=xf)
            y = jitops.conv2d(x, w, b, residual=r, activation="relu", out=out, **attrs)
            assert not torch.isnan(y).any(), (xs, xf)
            err = float((y.double() - ref).abs().max() / ref.abs().max())
            assert err <= tol, (xs, xf, err)


@pytest.mark.parametrize("mode", [True, None], ids=["on", "auto"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_programmatic_launch_chain_matches_float64(gpu_backend, dtype, mode):
    """With programmatic dependent launch (sm_90; on: every launch, auto: in graph captures after a jitops
    kernel), a chain of convolutions where each reads the last one's output and the last writes over the
    first's input (read-after-write and write-after-read across launches that may overlap), eagerly and
    replayed from a CUDA graph into NaN-filled buffers, against float64."""
    if not gpu_backend.can_launch_programmatic():
        pytest.skip("programmatic dependent launch needs sm_90+ and cuLaunchKernelEx")
    tol = {torch.float16: 6e-3, torch.bfloat16: 3e-2}[dtype]
    jitops.set_programmatic_launch(mode)
    try:
        for i, (n, c, hw, mid) in enumerate(((32, 256, 14, 256), (8, 128, 28, 512), (2, 512, 7, 512))):
            x0 = rand(n, c, hw, hw, seed=100 + i)
            ws = [rand(mid, c, 3, 3, scale=(9 * c) ** -0.5, seed=101 + i), rand(c, mid, 1, 1, scale=mid ** -0.5,
                                                                            seed=102 + i),
                  rand(c, c, 1, 1, scale=c ** -0.5, seed=103 + i)]
            bs = [rand(mid, seed=104 + i), rand(c, seed=105 + i)]
            r1 = torch.relu(F.conv2d(x0.double(), ws[0].double(), bs[0].double(), padding=1))
            r2 = F.conv2d(r1, ws[1].double(), bs[1].double()) + x0.double()
            r3 = torch.relu(F.conv2d(r2, ws[2].double()))
            wt, bt = [w.to(dtype) for w in ws], [b.to(dtype) for b in bs]

            def chain(x):
                y1 = jitops.conv2d(x, wt[0], bt[0], padding=1, activation="relu")
                y2 = jitops.conv2d(y1, wt[1], bt[1], residual=x)
                jitops.conv2d(y2, wt[2], None, activation="relu", out=x)
                return y1, y2

            def fresh():
                return x0.to(dtype).contiguous(memory_format=torch.channels_last)

            x = fresh()
            chain(x.clone())                                  # compile and bind outside the capture
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
                g1, g2 = chain(x)
            torch.cuda.current_stream().wait_stream(s)
            for replay in (False, True):
                if replay:
                    x.copy_(fresh())
                    g1.fill_(float("nan"))
                    g2.fill_(float("nan"))
                    graph.replay()
                    y1, y2, y3 = g1, g2, x
                else:
                    y3 = fresh()
                    y1, y2 = chain(y3)
                torch.cuda.synchronize()
                for y, ref in ((y1, r1), (y2, r2), (y3, r3)):
                    assert not torch.isnan(y).any(), (n, c, hw, replay)
                    err = float((y.double() - ref).abs().max() / ref.abs().max())
                    assert err <= tol, (n, c, hw, replay, err)
    finally:
        jitops.set_programmatic_launch(None)
