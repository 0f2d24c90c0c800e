"""channels_last torch tensors on the repeat path, and channels_last tensors where an op reads C order.

A repeat call with channels_last inputs reuses its bound plan (it used to take the general path on
every call); the plan is keyed by the memory format, so a contiguous tensor of the same shape never
runs a channels_last plan. Conv weights of a model moved to channels_last are read through a
contiguous copy (correct, warned once) instead of refused.
"""
from __future__ import annotations

import logging

import pytest

import jitops
from jitops.prepared import _cache

torch = pytest.importorskip("torch")


def _nhwc_bound(op: str) -> int:
    return sum(1 for k in _cache.bound if k[0] == op and any(isinstance(e, tuple) and "nhwc" in e for e in k))


def test_channels_last_repeat_call_reuses_its_plan_and_keeps_the_format():
    x = torch.randn(2, 8, 5, 7).to(memory_format=torch.channels_last)
    ref = torch.nn.functional.leaky_relu(x, 0.2)
    first = jitops.leaky_relu(x, 0.2)
    before = _nhwc_bound("leaky_relu")
    assert before >= 1                                   # the first call left a bound plan for NHWC
    x2 = (x * 3).contiguous(memory_format=torch.channels_last)
    again = jitops.leaky_relu(x2, 0.2)
    assert _nhwc_bound("leaky_relu") == before           # reused, not bound anew
    for y, want in ((first, ref), (again, torch.nn.functional.leaky_relu(x2, 0.2))):
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        assert torch.equal(y, want)
    plain = x.contiguous()                                # same shape, C order: another plan
    y = jitops.leaky_relu(plain, 0.2)
    assert y.is_contiguous() and torch.equal(y, ref)


def test_channels_last_group_norm_repeat_matches_torch():
    x = torch.randn(2, 16, 4, 6).to(memory_format=torch.channels_last)
    g, b = torch.randn(16), torch.randn(16)
    want = torch.nn.functional.group_norm(x, 4, g, b, eps=1e-5)
    for _ in range(3):
        y = jitops.group_norm(x, 4, g, b, eps=1e-5)
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert float((y - want).abs().max()) <= 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_channels_last_conv_weights_are_read_as_they_are(caplog, dtype):
    """Weights of a model moved to channels_last (OIHW stored OHWI): transposed once into a derived
    OIHW copy, redone when w changes in place; no warning, no copy per call."""
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).to(memory_format=torch.channels_last)
    w, b = conv.weight.detach().to(dtype), conv.bias.detach().to(dtype)
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    x = torch.randn(2, 8, 6, 5, dtype=dtype).to(memory_format=torch.channels_last)
    tol = 1e-5 if dtype == torch.float32 else 2e-3

    def check():
        want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
        got = jitops.conv2d(x, w, b, padding=1)
        assert got.dtype == dtype and float((got.double() - want).abs().max()) <= tol * float(want.abs().max())

    with caplog.at_level(logging.WARNING, logger="jitops.engine"):
        check()
        check()
    assert not [r for r in caplog.records if "channels_last" in r.message]
    with torch.no_grad():
        w.mul_(-0.5)                                      # in place: the derived OIHW copy is redone
    check()


def test_channels_last_repeat_runs_natively_and_never_for_c_order(probe):
    """On a backend whose launches go through the native launcher (the probe records them), the
    NHWC plan's repeat call is the C one; a C-order or otherwise strided tensor never matches it."""
    from jitops import engine
    if engine.dispatch_table("leaky_relu") is None:
        pytest.skip("native module unavailable")
    x = torch.randn(2, 6, 3, 5).to(memory_format=torch.channels_last)
    jitops.leaky_relu(x, 0.3)                                    # binds the NHWC plan
    y = engine.repeat_call("leaky_relu", (x,), (0.3,))          # the C repeat call
    assert y is not engine.MISS and y.is_contiguous(memory_format=torch.channels_last) and y.shape == x.shape
    assert engine.repeat_call("leaky_relu", (x.contiguous(),), (0.3,)) is engine.MISS   # C order: not this plan
    odd = torch.randn(2, 6, 5, 3).transpose(2, 3)               # neither format: never a repeat call
    assert engine.repeat_call("leaky_relu", (odd,), (0.3,)) is engine.MISS


def test_declared_nhwc_torch_arrays_give_the_same_result_on_every_call():
    """A contiguous torch array declared layout="nhwc" (its own shape N, H, W, C) takes the general
    path each time: a repeat path allocating 'like' the input would change the result's shape."""
    x = torch.randn(2, 5, 7, 8)                        # N, H, W, C
    first = jitops.leaky_relu(x, 0.1, layout="nhwc")
    second = jitops.leaky_relu(x, 0.1, layout="nhwc")
    assert first.shape == second.shape and first.stride() == second.stride()
    assert torch.equal(first, second)
