"""The CPU emulator: block barriers, warp operations for 32 and 64 lanes, shared memory,
atomics, and the planted bugs checked mode must catch (off-by-one store, divergent barrier), and
the misaligned vector access its alignment check must catch (x86 performs it, a GPU faults)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from jitops import codegen
from jitops.errors import EmulatorFault
from jitops.runtime import get_backend
from jitops.runtime.base import PackedArgs

REDUCE = codegen.render("common/reduce.h.j2", {})


def launch(backend, body: str, name: str, grid, block, args, shared: int = 0):
    """Compile `body` with the prelude for `backend` and launch it on numpy buffers / scalars."""
    source = codegen.prelude("cpu", "cpu", backend.device.warp_size) + REDUCE + body
    kernel = backend.load(backend.compile(source, [name], name), [name])[name]
    packed = PackedArgs([a[0] for a in args], [a[2] if len(a) > 2 else f"arg{i}" for i, a in enumerate(args)])
    for i, a in enumerate(args):
        if a[0] == "ptr":
            packed.set_buffer(i, a[1].ctypes.data, a[1].nbytes, a[1].itemsize)
        else:
            packed.set(i, a[1])
    backend.launch(kernel, grid, block, shared, packed, 0)


@pytest.fixture(params=[32, 64], ids=["warp32", "warp64"])
def backend(request):
    return get_backend("cpu", warp_size=request.param, checked=True)


BLOCK_SUM = r"""
JT_KERNEL void block_sum(const float* x, float* out, int n) {
  JT_SHARED(float, part, [32]);
  float v = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
  v = jt_warp_sum(v);
  const int lane = threadIdx.x % JT_WARP_SIZE, warp = threadIdx.x / JT_WARP_SIZE;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x / JT_WARP_SIZE) ? part[lane] : 0.f;
    v = jt_warp_sum(v);
    if (lane == 0) out[blockIdx.x] = v;
  }
}
"""


def test_block_reduction(backend):
    x = np.random.default_rng(0).random((37, 1001)).astype(np.float32)
    out = np.full(37, np.nan, np.float32)
    launch(backend, BLOCK_SUM, "block_sum", (37, 1, 1), (256, 1, 1), [("ptr", x), ("ptr", out), ("i32", 1001)])
    np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5)


SHUFFLES = r"""
JT_KERNEL void shuffles(int* out) {
  const int lane = threadIdx.x % JT_WARP_SIZE;
  const int t = threadIdx.x;
  out[4 * t + 0] = jt_shfl_down(lane, 1);
  out[4 * t + 1] = jt_shfl_xor(lane, 3);
  out[4 * t + 2] = jt_shfl(lane * 10, 5);
  out[4 * t + 3] = jt_shfl_down(lane, 2, 8);   // segments of 8 lanes
}
"""


def test_shuffle_semantics(backend):
    ws = backend.device.warp_size
    n = 2 * ws
    out = np.full(4 * n, -1, np.int32)
    launch(backend, SHUFFLES, "shuffles", (1, 1, 1), (n, 1, 1), [("ptr", out)])
    got = out.reshape(n, 4)
    lane = np.arange(n) % ws
    np.testing.assert_array_equal(got[:, 0], np.where(lane + 1 < ws, lane + 1, lane))
    np.testing.assert_array_equal(got[:, 1], lane ^ 3)
    np.testing.assert_array_equal(got[:, 2], np.full(n, 50))
    np.testing.assert_array_equal(got[:, 3], np.where(lane % 8 + 2 < 8, lane + 2, lane))


WELFORD = r"""
JT_KERNEL void welford(const float* x, float* out, int n) {
  jt_welford w = jt_welford_init();
  for (int i = threadIdx.x; i < n; i += JT_WARP_SIZE) jt_welford_add(w, x[i]);
  w = jt_warp_welford(w);
  if (threadIdx.x == 0) { out[0] = w.mean; out[1] = w.m2 / w.count; }
}
"""


def test_warp_welford_large_offset(backend):
    # Seed 003: data of the form 1e4 + N(0, 1); variance must stay close and positive.
    x = (1e4 + np.random.default_rng(3).standard_normal(4099)).astype(np.float32)
    out = np.zeros(2, np.float32)
    launch(backend, WELFORD, "welford", (1, 1, 1), (backend.device.warp_size, 1, 1),
           [("ptr", x), ("ptr", out), ("i32", x.size)])
    xd = x.astype(np.float64)
    assert abs(out[0] - xd.mean()) / xd.mean() < 1e-6
    assert out[1] > 0 and abs(out[1] - xd.var()) / xd.var() < 1e-3


ATOMICS = r"""
JT_KERNEL void atomics(float* acc, unsigned* counter, float* dyn_out) {
  float* tile = jt_dynamic_shared<float>();
  tile[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  atomicAdd(acc, tile[blockDim.x - 1 - threadIdx.x]);
  if (threadIdx.x == 0) {
    unsigned ticket = atomicAdd(counter, 1u);
    dyn_out[blockIdx.x] = (float)(ticket < gridDim.x);
  }
}
"""


def test_atomics_and_dynamic_shared(backend):
    acc = np.zeros(1, np.float32)
    counter = np.zeros(1, np.uint32)
    flags = np.zeros(50, np.float32)
    launch(backend, ATOMICS, "atomics", (50, 1, 1), (128, 1, 1),
           [("ptr", acc), ("ptr", counter), ("ptr", flags)], shared=128 * 4)
    assert acc[0] == 50 * sum(range(128))
    assert counter[0] == 50 and flags.all()


OFF_BY_ONE = r"""
JT_KERNEL void scale(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) y[i] = 2.f * x[i < n ? i : 0];   // planted bug: <= instead of <
}
"""


def test_checked_mode_reports_off_by_one_store(backend):
    x = np.ones(1000, np.float32)
    y = np.zeros(1000, np.float32)
    with pytest.raises(EmulatorFault) as info:
        launch(backend, OFF_BY_ONE, "scale", (4, 1, 1), (256, 1, 1), [("ptr", x, "x"), ("ptr", y, "y"), ("i32", 1000)])
    msg = str(info.value)
    assert "scale" in msg and "out-of-bounds write" in msg and "'y'" in msg
    assert "element 1000 " in msg or msg.endswith("element 1000")
    assert "block (3,0,0) thread (232,0,0)" in msg


DIVERGENT = r"""
JT_KERNEL void divergent(float* y) {
  if (threadIdx.x < 100) {
    __syncthreads();                            // planted bug: not every thread reaches it
    y[threadIdx.x] = 1.f;
  }
}
"""


def test_divergent_syncthreads_is_reported_not_hung(backend):
    y = np.zeros(128, np.float32)
    t0 = time.perf_counter()
    # Both blocks deadlock; whichever worker thread gets there first reports.
    with pytest.raises(EmulatorFault, match=r"divergent: __syncthreads deadlock in block \([01],0,0\): 100 thread"):
        launch(backend, DIVERGENT, "divergent", (2, 1, 1), (128, 1, 1), [("ptr", y)])
    assert time.perf_counter() - t0 < 30


WARP_EXIT = r"""
JT_KERNEL void warp_exit(float* y, int n) {
  int i = threadIdx.x;
  if (i >= n) return;                           // lanes leave before the shuffle
  y[i] = jt_warp_sum(1.f);
}
"""


def test_shuffle_with_exited_lanes_is_reported(backend):
    y = np.zeros(64, np.float32)
    with pytest.raises(EmulatorFault, match=r"warp deadlock"):
        launch(backend, WARP_EXIT, "warp_exit", (1, 1, 1), (64, 1, 1), [("ptr", y), ("i32", 10)])


SHARED_OOB = r"""
JT_KERNEL void shared_oob(float* y) {
  JT_SHARED(float, tile, [64]);
  tile[threadIdx.x] = 1.f;                      // 128 threads, 64 slots
  __syncthreads();
  y[threadIdx.x] = tile[threadIdx.x % 64];
}
"""


def test_shared_out_of_bounds(backend):
    y = np.zeros(128, np.float32)
    with pytest.raises(EmulatorFault, match=r"out-of-bounds write .* shared array 'tile' of 256 bytes .* element 64"):
        launch(backend, SHARED_OOB, "shared_oob", (1, 1, 1), (128, 1, 1), [("ptr", y)])


def test_unchecked_mode_runs_and_warp_size_from_env(monkeypatch):
    monkeypatch.setenv("JITOPS_CPU_WARP_SIZE", "64")
    be = get_backend("cpu")
    assert be.device.warp_size == 64
    x = np.random.default_rng(0).random((3, 500)).astype(np.float32)
    out = np.zeros(3, np.float32)
    launch(be, BLOCK_SUM, "block_sum", (3, 1, 1), (128, 1, 1), [("ptr", x), ("ptr", out), ("i32", 500)])
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5)


VECTOR_COPY = r"""
JT_KERNEL void vector_copy(const float* x, float* y, int offset) {
  typedef jt_vec<float, 4> F4;                  // 16 bytes: a GPU needs a 16-byte aligned address
  reinterpret_cast<F4*>(y)[threadIdx.x] = reinterpret_cast<const F4*>(x + offset)[threadIdx.x];
}
"""


@pytest.mark.parametrize("check", [False, True], ids=["plain", "alignment_check"])
def test_alignment_check_traps_misaligned_vectors(check):
    """A 16-byte vector at a 4-byte boundary: a GPU faults; x86 may copy it or fault without an
    address (an aligned SSE access, depending on the compiler); the alignment-checked build always
    reports it, with kernel, block and thread."""
    be = get_backend("cpu", warp_size=32, checked=True, check_alignment=check)
    assert ("-fsanitize=alignment" in be.compile_options()) == check
    x = np.arange(260, dtype=np.float32)
    y = np.zeros(256, np.float32)
    assert x.ctypes.data % 16 == 0 and y.ctypes.data % 16 == 0
    args = [("ptr", x, "x"), ("ptr", y, "y"), ("i32", 0)]
    launch(be, VECTOR_COPY, "vector_copy", (1, 1, 1), (64, 1, 1), args)      # aligned: fine either way
    np.testing.assert_array_equal(y, x[:256])
    args[2] = ("i32", 1)
    if not check:       # either x86 copies it, or (an aligned SSE access) it faults without an address
        try:
            launch(be, VECTOR_COPY, "vector_copy", (1, 1, 1), (64, 1, 1), args)
        except EmulatorFault as exc:
            assert "general-protection fault" in str(exc) and "misaligned" in str(exc)
        else:
            np.testing.assert_array_equal(y, x[1:257])
        return
    with pytest.raises(EmulatorFault, match=r"vector_copy: misaligned access in block \(0,0,0\) thread \(0,0,0\)"):
        launch(be, VECTOR_COPY, "vector_copy", (1, 1, 1), (64, 1, 1), args)


def test_matrix_cores_absent():
    assert get_backend("cpu").device.matrix_cores is False


VOTES = r"""
JT_KERNEL void votes(unsigned long long* ballots, int* flags) {
  const int lane = threadIdx.x % JT_WARP_SIZE, warp = threadIdx.x / JT_WARP_SIZE;
  jt_uint64 b = jt_ballot(lane % 3 == 0);
  bool any_big = jt_any(lane == JT_WARP_SIZE - 1);
  bool all_pos = jt_all(lane >= 0);
  bool all_even = jt_all(lane % 2 == 0);
  if (lane == 0) {
    ballots[warp] = b;
    flags[3 * warp + 0] = any_big;
    flags[3 * warp + 1] = all_pos;
    flags[3 * warp + 2] = all_even;
  }
}
"""


def test_votes(backend):
    ws = backend.device.warp_size
    ballots = np.zeros(2, np.uint64)
    flags = np.full(6, -1, np.int32)
    launch(backend, VOTES, "votes", (1, 1, 1), (2 * ws, 1, 1), [("ptr", ballots), ("ptr", flags)])
    want = sum(1 << l for l in range(ws) if l % 3 == 0)
    assert list(ballots) == [want, want]
    assert list(flags) == [1, 1, 0, 1, 1, 0]


def test_done_when_commands_of_issue_3():
    """The issue's acceptance commands, run as a user would (fresh processes, both warp sizes)."""
    import subprocess
    import sys
    code = ("import jitops, numpy as np; x = np.random.randn(1000003).astype('float32'); "
            "print(abs(jitops.leaky_relu(x, 0.1) - np.where(x > 0, x, 0.1 * x)).max())")
    import os
    for ws in ("32", "64"):
        env = {**os.environ, "JITOPS_BACKEND": "cpu", "JITOPS_CPU_WARP_SIZE": ws}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "0.0", (ws, out.stdout)
