"""direct_stem (few input channels, a network's first layer) on the emulator against float64.

NaN-poisoned outputs, errors max |y - ref| / max |ref|; the tolerances of test_conv2d_mma (fp32
accumulation, one rounding of the output: fp16 2e-3, bf16 1e-2, fp32 1e-5).
"""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ScheduleError
from jitops.ops import conv2d_stem as stem
from jitops.ops import get_op
from jitops.ops.base import TensorSpec

from test_conv2d_mma import TOL, run

op = get_op("conv2d")

# (x, w, attrs, cot): C from 1 to 8; Cout a multiple of 8 (16-byte NHWC stores) or not, above and
# below the channels per thread; stride, asymmetric padding, dilation, every activation.
CASES = {
    "rgb_3x3_s2": ((2, 3, 9, 11), (16, 3, 3, 3), {"padding": 1, "stride": 2, "activation": "relu"}, 16),
    "rgb_7x7_s2": ((1, 3, 13, 12), (20, 3, 7, 7), {"padding": 3, "stride": 2}, 16),
    "c4_patchify": ((1, 4, 12, 8), (24, 4, 4, 4), {"stride": 4, "activation": "leaky_relu", "alpha": 0.1}, 8),
    "c1_dilated": ((2, 1, 9, 9), (12, 1, 3, 3), {"padding": (4, 1, 0, 2), "dilation": (2, 1)}, 32),
    "c8_1x1": ((1, 8, 5, 7), (40, 8, 1, 1), {"activation": "relu"}, 32),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", [None, "nhwc"])
def test_stem_numerics(emu, rng, case, layout):
    x, w, attrs, cot = CASES[case]
    for dtype in ("float32", "float16", "bfloat16"):
        err = run(rng, x, w, attrs, dtype, stem.schedule(cot, 128), residual=case != "c8_1x1", layout=layout)
        assert err <= TOL[dtype], f"{case} {layout} {dtype}: {err:.3e}"


def test_stem_without_bias(emu, rng):
    err = run(rng, (1, 3, 6, 6), (8, 3, 3, 3), {"padding": 1}, "float16", stem.schedule(8), bias=False,
              layout="nhwc")
    assert err <= TOL["float16"]


def test_stem_refusals(emu):
    x = np.ones((1, 16, 6, 6), np.float16)
    with pytest.raises(ScheduleError, match="at most 8 input channels"):
        jitops.conv2d(x, np.ones((8, 16, 3, 3), np.float16), schedule="direct_stem")
    with pytest.raises(ScheduleError, match="groups = 1"):
        jitops.conv2d(np.ones((1, 4, 6, 6), np.float16), np.ones((8, 2, 3, 3), np.float16), groups=2,
                      schedule="direct_stem")


def test_stem_picked_for_rgb_stems_only():
    """On an H100 the 3x3 RGB stems (MobileNet, EfficientNet, RegNet) take direct_stem; ResNet's
    7x7 stem in fp16 (K = 147, 64 channels) stays on the matrix cores, where it beats cuDNN."""
    hopper = jitops.get_backend(target="sm_90").device

    def pick(x, w, dtype, layout="", **attrs):
        p = op.make_problem({"x": TensorSpec(x, dtype, layout), "w": TensorSpec(w, dtype), "bias": None}, attrs)
        return op.heuristic(p, hopper)

    for layout in ("", "nhwc"):
        for cout in (16, 32):
            s = pick((8, 3, 224, 224), (cout, 3, 3, 3), "float16", layout, stride=2, padding=1)
            assert s.algorithm == "direct_stem", s
            assert "direct_stem" in s.why
    assert pick((8, 3, 224, 224), (64, 3, 7, 7), "float16", "nhwc", stride=2, padding=3).algorithm == \
        "implicit_gemm_wgmma"
    assert pick((8, 16, 112, 112), (16, 16, 1, 1), "float16", "nhwc").algorithm != "direct_stem"


def test_stem_reads_channels_last_torch_weights(emu):
    """A model moved to channels_last stores its stem's weights OHWI: read through the derived OIHW
    copy, redone when the weight changes in place."""
    torch = pytest.importorskip("torch")
    conv = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1).to(memory_format=torch.channels_last)
    w, b = conv.weight.detach(), conv.bias.detach()
    assert not w.is_contiguous()
    x = torch.randn(2, 3, 9, 10).to(memory_format=torch.channels_last)
    for _ in range(2):
        want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), stride=2, padding=1)
        got = jitops.conv2d(x, w, b, stride=2, padding=1, schedule="direct_stem")
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert float((got.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())
        with torch.no_grad():
            w.mul_(-0.5)
