"""TMA tensor maps: the by-value argument's plumbing (encoded from the buffer's pointer at every
bind, remembered per pointer, empty for pointers off 16-byte alignment), the driver call's
arguments, and fused_wgmma's tma=1 plan and sm_90a compile (the kernels run in test_gpu_attention)."""
from __future__ import annotations

import ctypes

import pytest

from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec
from jitops.runtime.base import PackedArgs

op = get_op("attention")


def test_bind_writes_the_map_encoded_from_the_buffer_pointer():
    from jitops.prepared import Step, Slot, _map_encoder, bind
    from jitops.ops.base import TensorMap

    seen = []

    class Backend:
        def tensor_map(self, ptr, dtype, dims, box, swizzle, strides=None):
            seen.append((ptr, dtype, tuple(dims), tuple(box), swizzle))
            return ptr.to_bytes(8, "little") * 16

    spec = TensorMap("k", "float16", (64, 100, 6), (64, 64, 1))
    packed = PackedArgs(["ptr", "tmap"], ["k", "k_map"])
    step = Step(None, None, packed, (Slot(0, "k", 1000, 2, False),), None, ((1, "k", _map_encoder(Backend(), spec)),))
    for ptr in (0x1000, 0x1000, 0x2000, 0x1000):
        bind(step, {"k": ptr})
        assert packed.values[0].value == ptr
        assert bytes(packed.values[1]) == ptr.to_bytes(8, "little") * 16
    assert seen == [(0x1000, "float16", (64, 100, 6), (64, 64, 1), 128), (0x2000, "float16", (64, 100, 6), (64, 64, 1), 128)]
    bind(step, {"k": 0x3002})                  # off 16-byte alignment: no driver call, an empty map
    assert packed.values[0].value == 0x3002 and bytes(packed.values[1]) == bytes(128) and len(seen) == 2


def test_encode_passes_dense_strides_and_the_swizzle(monkeypatch):
    from jitops.runtime import cuda_driver as drv

    calls = []
    monkeypatch.setattr(drv, "call", lambda name, *a: calls.append((name, a)))
    blob = drv.encode_tensor_map(0xABC0, "bfloat16", (72, 300, 8), (64, 128, 1), 128)
    assert len(blob) == 128
    name, a = calls[0]
    assert name == "cuTensorMapEncodeTiled" and a[0] % 64 == 0
    assert a[1:4] == (9, 3, 0xABC0)
    assert list(a[4]) == [72, 300, 8] and list(a[5])[:2] == [144, 144 * 300]
    assert list(a[6]) == [64, 128, 1] and list(a[7]) == [1, 1, 1]
    assert a[8:] == (0, 3, 3, 0)         # no interleave, 128-byte swizzle, 256-byte L2 promotion, zero fill


def test_wgmma_tma_plan_and_sm90a_compile():
    pytest.importorskip("cuda.bindings.nvrtc")
    from jitops import engine
    from jitops.ops.base import TensorMap
    from jitops.runtime import get_backend
    from conftest import nvrtc_ptx

    backend = get_backend(target="sm_90")
    specs = {"q": TensorSpec((2, 8, 300, 72), "bfloat16"), "k": TensorSpec((2, 2, 500, 72), "bfloat16"),
             "v": TensorSpec((2, 2, 500, 72), "bfloat16"), "mask": None}
    p = op.make_problem(specs, {"causal": True})
    plan = op.plan(p, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, producer=1, tma=1), backend.device)
    launch = plan.launches[0]
    maps = [a for a in launch.args if isinstance(a, TensorMap)]
    assert [(m.name, m.dims, m.box) for m in maps] == [("k", (72, 500, 4), (64, 64, 1)), ("v", (72, 500, 4), (64, 64, 1))]
    source = engine.kernel_source(backend.device, launch)
    ptx, text = nvrtc_ptx(source, b"-arch=sm_90a", b"-std=c++17", b"-default-device", b"--ptxas-options=-v")
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.arrive.expect_tx" in ptx
    assert "0 bytes spill stores" in text and "C7519" not in text, text
    # the plain loop (no producer warpgroup) takes TMA rings of 2-4 buffers too
    plain = op.plan(p, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=3, tma=1), backend.device).launches[0]
    assert plain.block[0] == 256 and sum(isinstance(a, TensorMap) for a in plain.args) == 2
    with pytest.raises(Exception, match="stages=5"):
        op.plan(p, Schedule.make("fused_wgmma", groups=2, block_k=64, stages=5, tma=1), backend.device)
