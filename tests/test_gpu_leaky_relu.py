"""leaky_relu on a real GPU (pytest -m gpu): numpy / torch / CuPy / DeviceArray inputs, sizes
1 ... 2^28 and past 2^31 elements, misaligned views, fp32 and fp16, a non-default stream."""
from __future__ import annotations

import numpy as np
import pytest

import jitops

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]   # conftest: the GPU, not the emulator
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

SIZES = [1, 2, 3, 7, 8, 9, 31, 1000, 4097, (1 << 20) + 7, 1 << 24, 1 << 28]
TOL = {"float32": 1.2e-7, "float16": 1e-3}




def torch_check(x, y, alpha):
    xd = x.double()
    ref = torch.where(xd > 0, xd, alpha * xd)
    assert not torch.isnan(y).any()
    err = float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    assert err <= TOL[str(x.dtype).split(".")[1]], err


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("algorithm", [None, "naive"])
def test_torch_sizes(dtype, algorithm):
    for n in SIZES:
        x = torch.randn(n, device="cuda", dtype=getattr(torch, dtype))
        out = torch.full_like(x, float("nan"))
        y = jitops.leaky_relu(x, 0.1, out=out, schedule=algorithm)
        torch.cuda.synchronize()
        torch_check(x, y, 0.1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_inputs(dtype):
    rng = np.random.default_rng(0)
    for n in [1, 3, 1000, (1 << 20) + 3, 1 << 26]:
        x = rng.standard_normal(n).astype(dtype)
        y = jitops.leaky_relu(x, 0.2)
        assert isinstance(y, np.ndarray) and y.dtype == x.dtype
        xd = x.astype(np.float64)
        ref = np.where(xd > 0, xd, 0.2 * xd)
        assert np.abs(y - ref).max() / np.abs(ref).max() <= TOL[dtype]


@pytest.mark.parametrize("offset", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_misaligned_views(dtype, offset):
    base = torch.randn((1 << 20) + 11, device="cuda", dtype=getattr(torch, dtype))
    x = base[offset:]
    torch_check(x, jitops.leaky_relu(x, 0.1), 0.1)
    out_base = torch.full_like(base, float("nan"))
    jitops.leaky_relu(x, 0.1, out=out_base[offset:])
    assert torch.isnan(out_base[:offset]).all()
    torch_check(x, out_base[offset:], 0.1)


def test_more_than_2_to_31_elements():
    n = (1 << 31) + 17                      # 64-bit indexing
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = jitops.leaky_relu(x, 0.1)
    ref = torch.nn.functional.leaky_relu(x, 0.1)
    assert torch.equal(y, ref)
    del x, y, ref
    torch.cuda.empty_cache()


def test_non_default_stream_and_graph_capture():
    x = torch.randn(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)        # keep s busy; the op must queue behind it on s
        x.mul_(2.0)
        y = jitops.leaky_relu(x, 0.1)
    s.synchronize()
    torch_check(x, y, 0.1)
    # Capturing into a graph only works when every launch goes to the capturing stream.
    g = torch.cuda.CUDAGraph()
    out = torch.empty_like(x)
    jitops.leaky_relu(x, 0.1, out=out)
    with torch.cuda.graph(g):
        jitops.leaky_relu(x, 0.1, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch_check(x, out, 0.1)


def test_native_repeat_calls_use_their_own_arrays_and_stream():
    """Repeat calls go through the native dispatch (C): each must launch on the current stream with
    its own input and a fresh output. x is changed on a busy side stream just before the call, so
    a launch anywhere else would read it unchanged."""
    from jitops import engine
    xs = [torch.randn(1 << 20, device="cuda") for _ in range(4)]
    jitops.leaky_relu(xs[0], 0.2)
    assert len(engine._cache.dispatch["leaky_relu"]) >= 1
    s = torch.cuda.Stream()
    ys = []
    for x in xs:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(5_000_000)
            x.mul_(-3.0)
            ys.append(jitops.leaky_relu(x, 0.2))
    s.synchronize()
    assert len({y.data_ptr() for y in ys}) == len(ys)
    for x, y in zip(xs, ys):
        torch_check(x, y, 0.2)


def test_cupy_inputs_on_its_stream():
    cupy = pytest.importorskip("cupy")
    with cupy.cuda.Stream(non_blocking=True):
        x = cupy.random.standard_normal(1_000_003, dtype=cupy.float32)
        y = jitops.leaky_relu(x, 0.3)
        assert isinstance(y, cupy.ndarray)
        ref = cupy.where(x > 0, x, cupy.float32(0.3) * x)
        cupy.cuda.get_current_stream().synchronize()
        assert float(cupy.abs(y - ref).max()) == 0.0


def test_device_array_round_trip():
    x = np.random.default_rng(1).standard_normal(12345).astype(np.float32)
    dx = jitops.to_device(x)
    dy = jitops.leaky_relu(dx, 0.1)
    assert isinstance(dy, jitops.DeviceArray)
    assert np.abs(dy.numpy() - np.where(x > 0, x, np.float32(0.1) * x)).max() == 0.0
    t = torch.as_tensor(dy, device="cuda")   # __cuda_array_interface__
    assert t.shape == (12345,)


def test_device_mismatch_is_an_error():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    x = torch.randn(10, device="cuda:1")
    with pytest.raises(jitops.ArgumentError, match="device"):
        jitops.leaky_relu(x)


@pytest.mark.parametrize("algorithm", [None, "naive"])
def test_bf16_and_channels_last(algorithm):
    """bf16 (one rounding: 2^-8 relative) over the sizes, and channels_last tensors (dense storage,
    output in the same format) in every dtype."""
    for n in SIZES:
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.full_like(x, float("nan"))
        y = jitops.leaky_relu(x, 0.1, out=out, schedule=algorithm)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.nn.functional.leaky_relu(x, 0.1))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(2, 40, 7, 5, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        y = jitops.leaky_relu(x, 0.1, schedule=algorithm)
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(y, torch.nn.functional.leaky_relu(x, 0.1))
