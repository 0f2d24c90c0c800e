"""bfloat16 in the prelude and at the array boundary; the NHWC (channels_last) memory format as the
engine hands it to ops. Op-specific bf16 / NHWC kernels are tested with their ops."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jitops import arrays, codegen, engine
from jitops.errors import ArgumentError
from jitops.ops.base import TensorSpec
from jitops.runtime import get_backend
from jitops.runtime.base import PackedArgs

ROUND_TRIP = r"""
JT_KERNEL void bf16_round_trip(const float* x, jt_bf16* y, float* back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const jt_bf16 h = jt_from_f32<jt_bf16>(x[i]);
    y[i] = h;
    back[i] = jt_to_f32(h);
  }
}
"""


def _awkward_floats(rng: np.random.Generator) -> np.ndarray:
    """Random values plus the cases rounding gets wrong: exact ties (even and odd), values just past
    a tie, the largest finite, overflow to inf, subnormals, signed zero, inf and NaN."""
    ties = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7F0000, 0x7F7FFFFF, 0x00010000, 0x00008000,
                     0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001], np.uint32).view(np.float32)
    return np.concatenate([rng.standard_normal(200).astype(np.float32) * 1e3, ties])


@pytest.mark.parametrize("warp", [32, 64])
def test_bf16_rounds_to_nearest_even_like_ml_dtypes(warp):
    backend = get_backend("cpu", warp_size=warp, checked=True)
    x = _awkward_floats(np.random.default_rng(7))
    y = np.full(x.size, 0x7FFF, np.uint16)      # poison: a NaN pattern nothing else produces here
    back = np.full(x.size, np.nan, np.float32)
    source = codegen.prelude("cpu", "cpu", warp) + ROUND_TRIP
    kernel = backend.load(backend.compile(source, ["bf16_round_trip"], "bf16_round_trip"), ["bf16_round_trip"])
    packed = PackedArgs(["ptr", "ptr", "ptr", "i32"], ["x", "y", "back", "n"])
    for i, a in enumerate((x, y, back)):
        packed.set_buffer(i, a.ctypes.data, a.nbytes, a.itemsize)
    packed.set(3, x.size)
    backend.launch(kernel["bf16_round_trip"], ((x.size + 63) // 64, 1, 1), (64, 1, 1), 0, packed, 0)
    with np.errstate(invalid="ignore"):     # NaN inputs
        want = x.astype(ml_dtypes.bfloat16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(y[finite], want.view(np.uint16)[finite])
    assert np.isnan(back[~finite]).all() and np.isnan(y[~finite].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    np.testing.assert_array_equal(back[finite], want.astype(np.float32)[finite])


@pytest.mark.parametrize("target", ["sm_80", "gfx90a"])
def test_bf16_prelude_compiles_for_gpu_targets(target):
    backend = get_backend(target=target)
    source = codegen.prelude(backend.name, target, backend.device.warp_size) + ROUND_TRIP
    assert backend.compile(source, ["bf16_round_trip"], "bf16_round_trip")


def test_numpy_bf16_arrays_are_accepted():
    a = np.ones((2, 3), ml_dtypes.bfloat16)
    ref = arrays.wrap(a, "x", "op")
    assert (ref.dtype, ref.shape, ref.layout, ref.nbytes) == ("bfloat16", (2, 3), "", 12)
    backend = get_backend("cpu")
    out, _ = arrays.allocate_like(ref, (4,), "bfloat16", backend)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (4,)


def test_declared_nhwc_arrays_carry_the_logical_shape():
    a = np.zeros((2, 5, 7, 3), np.float32)          # N, H, W, C
    ref = arrays.wrap(a, "x", "conv2d", "nhwc")
    assert ref.shape == (2, 3, 5, 7) and ref.layout == "nhwc"
    spec = TensorSpec(ref.shape, ref.dtype, ref.layout)
    assert spec.storage_shape == (2, 5, 7, 3) and str(spec) == "2x3x5x7:float32:nhwc"
    out, _ = arrays.allocate_like(ref, (2, 4, 5, 7), "float32", get_backend("cpu"), "nhwc")
    assert out.shape == (2, 5, 7, 4)
    with pytest.raises(ArgumentError, match="'x'.*N, H, W, C"):
        arrays.wrap(np.zeros((5, 7, 3), np.float32), "x", "conv2d", "nhwc")


def test_torch_channels_last_and_bf16_tensors():
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 5, 7).to(memory_format=torch.channels_last)
    ref = arrays.wrap(t, "x", "conv2d")
    assert ref.shape == (2, 3, 5, 7) and ref.layout == "nhwc"
    # memory order N, H, W, C for host copies
    np.testing.assert_array_equal(arrays.host_view(ref), t.permute(0, 2, 3, 1).numpy())
    out, ptr = arrays.allocate_like(ref, (2, 4, 5, 7), "bfloat16", None, "nhwc")
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (2, 4, 5, 7)
    assert out.dtype == torch.bfloat16 and ptr == out.data_ptr()
    b = torch.randn(6).to(torch.bfloat16)
    np.testing.assert_array_equal(arrays.host_storage(b).view(ml_dtypes.bfloat16).astype(np.float32),
                                  b.float().numpy())
    with pytest.raises(ArgumentError, match="'x'.*channels_last"):
        arrays.wrap(torch.randn(4, 6)[:, ::2], "x", "op")


def test_ops_without_layout_inputs_read_channels_last_through_a_copy(caplog):
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, 5, 7).to(memory_format=torch.channels_last)
    # layer_norm normalizes trailing dims: it declares no LAYOUT_INPUTS (leaky_relu now does), so
    # a channels_last x is read through a contiguous copy (the logical values, warned about)
    with caplog.at_level("WARNING", logger="jitops.engine"):
        y = engine.run("layer_norm", {"x": t}, {"normalized_shape": 7})
        y_plain = engine.run("layer_norm", {"x": t.contiguous()}, {"normalized_shape": 7})
    assert torch.equal(y, y_plain) and y.is_contiguous()
    with pytest.raises(ArgumentError, match="'layout'"):
        engine.run("layer_norm", {"x": np.zeros((2, 4), np.float32)}, {"normalized_shape": 4, "layout": "nhwc"})


MMA_NT = r"""
{% include "common/mma.h.j2" %}
// C = A B^T for one 16x16x16 tile, through the fragments, stored as operand elements (a warp).
JT_KERNEL void mma_nt(const jt_mma_t* a, const jt_mma_t* b, jt_mma_t* c) {
  JT_SHARED(jt_mma_t, As, [16 * 24]);
  JT_SHARED(jt_mma_t, Bs, [16 * 24]);
  JT_SHARED(jt_mma_t, Cs, [16 * 24]);
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += JT_WARP_SIZE) {
    As[(i / 16) * 24 + i % 16] = a[i];
    Bs[(i / 16) * 24 + i % 16] = b[i];
  }
  __syncthreads();
  jt_mma_frag fa, fb;
  jt_mma_acc acc;
  jt_mma_zero(acc);
  jt_mma_load(fa, As, 24, lane);
  jt_mma_load(fb, Bs, 24, lane);
  jt_mma_nt(acc, fa, fb);
  float v[JT_MMA_ELEMS];
  for (int i = 0; i < JT_MMA_ELEMS; ++i) v[i] = acc.v[i];
  jt_mma_store_half(Cs, 24, v, lane);
  __syncthreads();
  for (int i = lane; i < 256; i += JT_WARP_SIZE) c[i] = Cs[(i / 16) * 24 + i % 16];
}
"""


def _mma_source(backend_name: str, arch: str, warp: int, mma_type: str) -> str:
    body = codegen.environment().from_string(MMA_NT).render(mma_type=mma_type)
    return codegen.prelude(backend_name, arch, warp) + body


@pytest.mark.parametrize("warp", [32, 64])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_fragments_for_each_element_type(warp, dtype):
    """The software fragments (the same layouts as mma.sync at warp 32 and MFMA at warp 64) compute
    A B^T in fp32 and round once to the element type."""
    backend = get_backend("cpu", warp_size=warp, checked=True)
    mma_type = "jt_bf16" if dtype == "bfloat16" else "jt_half"
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 16)).astype(dtype)
    b = rng.standard_normal((16, 16)).astype(dtype)
    c = np.full((16, 16), np.nan, dtype)
    kernel = backend.load(backend.compile(_mma_source("cpu", "cpu", warp, mma_type), ["mma_nt"], "mma_nt"), ["mma_nt"])
    packed = PackedArgs(["ptr", "ptr", "ptr"], ["a", "b", "c"])
    for i, arr in enumerate((a, b, c)):
        packed.set_buffer(i, arr.ctypes.data, arr.nbytes, arr.itemsize)
    backend.launch(kernel["mma_nt"], (1, 1, 1), (warp, 1, 1), 0, packed, 0)
    want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32).astype(dtype)
    # one rounding of an fp32 sum: at most one unit in the last place of the element type apart
    ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
    got, ref = c.astype(np.float64), want.astype(np.float64)
    assert np.all(np.abs(got - ref) <= ulp * np.abs(ref) + 1e-6), np.abs(got - ref).max()


@pytest.mark.parametrize("target", ["sm_80", "gfx90a"])
def test_bf16_mma_fragments_compile_for_gpu_targets(target):
    backend = get_backend(target=target)
    assert backend.compile(_mma_source(backend.name, target, backend.device.warp_size, "jt_bf16"), ["mma_nt"], "mma_nt")
