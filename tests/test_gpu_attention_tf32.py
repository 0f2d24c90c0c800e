"""fp32 attention with TF32 products (fused_tf32) on a real GPU (pytest -m gpu): every candidate tile
against float64 into NaN-filled outputs, padded head dims, both causal diagonals, masks, grouped heads,
[B, S, H, D] views, unaligned inputs, and the process-wide precision switch. Each error must also be
above the exact kernels' (FLOOR): the products really ran in TF32."""
from __future__ import annotations

import pytest

import jitops
from jitops.ops import get_op
from jitops.ops.attention_problem import TF32_TOLERANCE
from jitops.ops.base import TensorSpec

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

from test_gpu_attention import reference   # noqa: E402  (float64, the op's conventions)

FLOOR = 2e-5
op = get_op("attention")


def error(q, k, v, mask=None, causal=False, schedule=None, precision="tf32") -> float:
    if q.is_contiguous():
        out = torch.full_like(q, float("nan"))
        jitops.attention(q, k, v, mask, causal=causal, out=out, schedule=schedule, precision=precision)
    else:
        out = jitops.attention(q, k, v, mask, causal=causal, schedule=schedule, precision=precision)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), f"{schedule}: unwritten or NaN output"
    ref = reference(q, k, v, mask, causal)
    return float((out.double() - ref).abs().max() / ref.abs().max())


def candidates(q, k, mask=None, causal=False):
    specs = {"q": TensorSpec(tuple(q.shape), "float32"), "k": TensorSpec(tuple(k.shape), "float32"),
             "v": TensorSpec(tuple(k.shape), "float32"),
             "mask": TensorSpec(tuple(mask.shape), "float32") if mask is not None else None}
    p = op.make_problem(specs, {"causal": causal, "precision": "tf32"})
    device = jitops.get_backend().device
    return [s for s in op.candidates(p, device) if s.algorithm == "fused_tf32"]


CASES = {   # q, kv, causal, mask
    "d40_gqa_bottom_right": ((2, 4, 150, 40), (2, 2, 300, 40), "bottom_right", None),
    "d64_padding_mask": ((2, 4, 200, 64), (2, 4, 200, 64), False, (2, 1, 1, 200)),
    "d72_causal": ((1, 4, 333, 72), (1, 4, 333, 72), True, None),
    "d128_full_mask": ((1, 2, 130, 128), (1, 2, 90, 128), False, (130, 90)),
    "d256_causal": ((1, 2, 100, 256), (1, 2, 100, 256), True, None),
    "rank3_d32": ((3, 77, 32), (3, 50, 32), False, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_tf32_tile_against_float64(case):
    qs, kvs, causal, ms = CASES[case]
    q, k, v = torch.randn(qs, device="cuda"), torch.randn(kvs, device="cuda"), torch.randn(kvs, device="cuda")
    mask = None
    if ms is not None:
        mask = torch.randn(ms, device="cuda")
        if ms[-2] == 1:         # a padding mask: the second sequence's last 40% of keys hidden
            mask.zero_()
            mask[1, ..., 3 * ms[-1] // 5:] = float("-inf")
    scheds = candidates(q, k, mask, causal)
    assert scheds
    for s in scheds + [None]:
        err = error(q, k, v, mask, causal, s)
        assert FLOOR < err <= TF32_TOLERANCE, f"{case} {s}: {err:.3e}"


def test_tf32_heads_inner_views_and_unaligned_inputs():
    x = torch.randn(2, 70, 4, 128, device="cuda")                 # [B, S, H, D] storage, read in place
    view = x.transpose(1, 2)
    assert FLOOR < error(view, view, view, causal=True) <= TF32_TOLERANCE
    flat = torch.randn(1 + 2 * 4 * 50 * 64, device="cuda")         # off 16-byte alignment: plain loads
    u = flat[1:].view(2, 4, 50, 64)
    assert FLOOR < error(u, u, u) <= TF32_TOLERANCE


def test_fp32_precision_switch_on_gpu():
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda") for _ in range(3))
    try:
        jitops.set_fp32_precision("tf32")
        assert FLOOR < error(q, k, v, precision=None) <= TF32_TOLERANCE      # the process default: TF32
        assert error(q, k, v, precision="highest") <= 2e-5                   # the call's own precision wins
    finally:
        jitops.set_fp32_precision("highest")
    assert error(q, k, v, precision=None) <= 2e-5


def wgmma_schedules() -> list:
    """The wgmma form's small tiles (sm_90 only): one / two / three consumer warpgroups, 32 / 64-key tiles,
    rings of 2-4 buffers (1-3 tiles copied ahead)."""
    if not jitops.get_backend().device.hopper:
        pytest.skip("wgmma needs an sm_90 device")
    from jitops.ops.base import Schedule
    return [Schedule.make("fused_tf32", wgmma=1, groups=g, block_k=bk, stages=st)
            for g, bk, st in ((1, 32, 2), (2, 64, 2), (3, 32, 3), (2, 32, 4), (1, 64, 3))]


@pytest.mark.parametrize("d", [20, 42, 64, 72])
def test_tf32_wgmma_odd_dims_views_and_unaligned(d):
    """Head dims off multiples of 8 (20 -> 24) and of 4 (42: plain loads), [B, S, H, D] views read in place,
    inputs off 16-byte alignment, partial query / key tiles, GQA, both causal diagonals."""
    x = torch.randn(2, 70, 4, d, device="cuda")
    view = x.transpose(1, 2)
    flat = torch.randn(1 + 2 * 4 * 50 * d, device="cuda")
    u = flat[1:].view(2, 4, 50, d)
    q = torch.randn(1, 4, 97, d, device="cuda")
    k, v = (torch.randn(1, 2, 131, d, device="cuda") for _ in range(2))
    for s in wgmma_schedules():
        assert FLOOR < error(view, view, view, causal=True, schedule=s) <= TF32_TOLERANCE, s
        assert FLOOR < error(u, u, u, schedule=s) <= TF32_TOLERANCE, s
        for causal in (False, "top_left", "bottom_right"):
            assert FLOOR < error(q, k, v, causal=causal, schedule=s) <= TF32_TOLERANCE, (s, causal)


def test_tf32_wgmma_large_scores_and_empty_rows():
    """Scores far apart (the lazy running max must move) and query rows that see no key (zeros)."""
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda") for _ in range(3))
    q *= 6.0
    mask = torch.zeros(200, 200, device="cuda")
    mask[:10] = float("-inf")                                    # the first 10 queries see nothing
    for s in wgmma_schedules():
        out = torch.full_like(q, float("nan"))
        jitops.attention(q, k, v, mask, out=out, schedule=s, precision="tf32")
        torch.cuda.synchronize()
        assert bool((out[:, :, :10] == 0).all()), s
        ref = reference(q[:, :, 10:], k, v, mask[10:], False)
        err = float((out[:, :, 10:].double() - ref).abs().max() / ref.abs().max())
        assert err <= TF32_TOLERANCE, (s, err)
