"""Hopper warpgroup MMA helpers (templates/common/wgmma.h.j2): a one-warpgroup product
C[64 x N] = A[64 x K] B[N x K]^T through shared-memory descriptors, in fp16 and bf16, and the
register-A form with an N-major B, C = A[64 x K] B[K x N] (attention's P V).

On the CPU: the helpers compile for sm_90 (through the arch-specific sm_90a target) and are refused
for other devices with a clear error. On the device (`pytest -m gpu`): the result against float64,
with the descriptor's two offsets also tried the other way round (which must fail: the test can
tell the layouts apart)."""
from __future__ import annotations

import numpy as np
import pytest

from jitops import codegen
from jitops.errors import CompileError
from jitops.runtime import get_backend
from jitops.runtime.base import PackedArgs

KERNEL = r"""
{% include "common/wgmma.h.j2" %}
// One warpgroup: C = A B^T, A [64][K], B [N][K] row-major in global memory, K a multiple of 16.
JT_KERNEL __launch_bounds__(128) void wgmma_nt(const jt_wgmma_t* a, const jt_wgmma_t* b, float* c, int K, int swap) {
  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned kstep = 128, a_mn = (K / 8) * 128, b_mn = (K / 8) * 128;   // core matrices: K-adjacent first
  unsigned char* As = smem;
  unsigned char* Bs = smem + 64 * K * 2;
  for (int i = threadIdx.x; i < 64 * K; i += 128)
    *reinterpret_cast<jt_wgmma_t*>(As + jt_wgmma_offset(i / K, i % K, kstep, a_mn)) = a[i];
  for (int i = threadIdx.x; i < {{ n }} * K; i += 128)
    *reinterpret_cast<jt_wgmma_t*>(Bs + jt_wgmma_offset(i / K, i % K, kstep, b_mn)) = b[i];
  jt_fence_proxy_async();
  __syncthreads();
  float d[{{ n // 2 }}];
  jt_wgmma_fence();
  for (int k0 = 0; k0 < K; k0 += 16) {
    const unsigned off = (k0 / 8) * kstep;
    const jt_wgmma_desc_t da = swap ? jt_wgmma_desc(As + off, a_mn, kstep) : jt_wgmma_desc(As + off, kstep, a_mn);
    const jt_wgmma_desc_t db = swap ? jt_wgmma_desc(Bs + off, b_mn, kstep) : jt_wgmma_desc(Bs + off, kstep, b_mn);
    jt_wgmma_m64n{{ n }}k16(d, da, db, k0 > 0);
  }
  jt_wgmma_commit();
  jt_wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < {{ n // 2 }}; ++i) c[jt_wgmma_row(warp, lane, i) * {{ n }} + jt_wgmma_col(lane, i)] = d[i];
}
"""


RS_KERNEL = r"""
{% include "common/wgmma.h.j2" %}
// One warpgroup: C = A B, A [64][K] and B [K][N] row-major; A goes to registers as the product of
// an all-ones accumulator would (jt_wgmma_acc_to_a), B to shared memory as K rows of N contiguous
// elements in 16-byte column chunks (chunk step CS), read N-major.
JT_KERNEL __launch_bounds__(128) void wgmma_rs(const float* a, const jt_wgmma_t* b, float* c, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int CS = K * 16 + 64;
  for (int i = threadIdx.x; i < K * {{ n }}; i += 128) {
    const int row = i / {{ n }}, col = i % {{ n }};
    *reinterpret_cast<jt_wgmma_t*>(smem + (col / 8) * CS + row * 16 + (col % 8) * 2) = b[i];
  }
  jt_fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float d[{{ n // 2 }}];
#pragma unroll
  for (int i = 0; i < {{ n // 2 }}; ++i) d[i] = 0.f;
  for (int k0 = 0; k0 < K; k0 += 16) {
    float acc[8];                          // A[:, k0:k0+16] in the accumulator layout of one k-step
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = a[jt_wgmma_row(warp, lane, i) * K + k0 + jt_wgmma_col(lane, i)];
    unsigned ar[4];
    jt_wgmma_acc_to_a(ar, acc, 0);
    jt_wgmma_fence();                      // registers written by ordinary code feed the next wgmma
    jt_wgmma_rs_m64n{{ n }}k16(d, ar, jt_wgmma_desc(smem + k0 * 16, 128, CS), 1);
  }
  jt_wgmma_commit();
  jt_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < {{ n // 2 }}; ++i) c[jt_wgmma_row(warp, lane, i) * {{ n }} + jt_wgmma_col(lane, i)] = d[i];
}
"""


def rs_source(backend, dtype: str, n: int) -> str:
    mma_type = "jt_bf16" if dtype == "bfloat16" else "jt_half"
    body = codegen.environment().from_string(RS_KERNEL).render(mma_type=mma_type, wgmma_rs_ns=[n], n=n)
    return codegen.prelude(backend.name, backend.device.arch, backend.device.warp_size) + body


def source(backend, dtype: str, n: int) -> str:
    mma_type = "jt_bf16" if dtype == "bfloat16" else "jt_half"
    body = codegen.environment().from_string(KERNEL).render(mma_type=mma_type, wgmma_ns=[n], n=n)
    return codegen.prelude(backend.name, backend.device.arch, backend.device.warp_size) + body


def test_wgmma_helpers_compile_for_hopper_only():
    hopper = get_backend(target="sm_90")
    for dtype, n in (("float16", 64), ("bfloat16", 128)):
        assert hopper.compile(source(hopper, dtype, n), ["wgmma_nt"], f"wgmma_{dtype}_{n}")
    assert hopper.compile(rs_source(hopper, "float16", 80), ["wgmma_rs"], "wgmma_rs_float16_80")
    ampere = get_backend(target="sm_80")
    with pytest.raises(CompileError, match="sm_90a"):
        ampere.compile(source(ampere, "float16", 64), ["wgmma_nt"], "wgmma_on_sm80")


def _run(backend, torch, dtype: str, n: int, k: int, swap: bool, rng) -> tuple[np.ndarray, np.ndarray]:
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    a = torch.tensor(rng.standard_normal((64, k)), dtype=tdt, device="cuda")
    b = torch.tensor(rng.standard_normal((n, k)), dtype=tdt, device="cuda")
    c = torch.full((64, n), float("nan"), dtype=torch.float32, device="cuda")
    kernel = backend.load(backend.compile(source(backend, dtype, n), ["wgmma_nt"], f"wgmma_{dtype}_{n}"),
                          ["wgmma_nt"])["wgmma_nt"]
    packed = PackedArgs(["ptr", "ptr", "ptr", "i32", "i32"], ["a", "b", "c", "K", "swap"])
    for i, t in enumerate((a, b, c)):
        packed.set_buffer(i, t.data_ptr(), t.numel() * t.element_size(), t.element_size())
    packed.set(3, k)
    packed.set(4, int(swap))
    backend.launch(kernel, (1, 1, 1), (128, 1, 1), (64 + n) * k * 2, packed, 0)
    torch.cuda.synchronize()
    want = a.double().cpu().numpy() @ b.double().cpu().numpy().T
    return c.cpu().numpy(), want


def _hopper():
    """The CUDA backend, failing (not skipping) on a GPU that is not sm_90: these tests exist for it."""
    backend = get_backend("cuda")
    if backend.device.arch != "sm_90":
        pytest.fail(f"the wgmma test needs an sm_90 device, got {backend.device.arch}")
    return backend


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,k", [(64, 16), (64, 64), (128, 32)])
def test_wgmma_product_matches_float64(dtype, n, k):
    torch = pytest.importorskip("torch")
    backend = _hopper()
    rng = np.random.default_rng(n + k)
    got, want = _run(backend, torch, dtype, n, k, False, rng)
    # fp32 accumulation of exact products of 16-bit inputs: only summation rounding remains
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max() * k
    wrong, want2 = _run(backend, torch, dtype, n, k, True, rng)   # offsets swapped: another layout
    assert not np.allclose(wrong, want2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,k", [(48, 16), (80, 64), (128, 32)])
def test_wgmma_registers_a_n_major_b_matches_float64(dtype, n, k):
    torch = pytest.importorskip("torch")
    backend = _hopper()
    rng = np.random.default_rng(n * k)
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    a = torch.tensor(rng.standard_normal((64, k)), dtype=tdt, device="cuda").float()   # representable
    b = torch.tensor(rng.standard_normal((k, n)), dtype=tdt, device="cuda")
    c = torch.full((64, n), float("nan"), dtype=torch.float32, device="cuda")
    kernel = backend.load(backend.compile(rs_source(backend, dtype, n), ["wgmma_rs"], f"wgmma_rs_{dtype}_{n}"),
                          ["wgmma_rs"])["wgmma_rs"]
    packed = PackedArgs(["ptr", "ptr", "ptr", "i32"], ["a", "b", "c", "K"])
    for i, t in enumerate((a, b, c)):
        packed.set_buffer(i, t.data_ptr(), t.numel() * t.element_size(), t.element_size())
    packed.set(3, k)
    backend.launch(kernel, (1, 1, 1), (128, 1, 1), (n // 8) * (k * 16 + 64), packed, 0)
    torch.cuda.synchronize()
    want = a.double().cpu().numpy() @ b.double().cpu().numpy()
    got = c.cpu().numpy()
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max() * k
