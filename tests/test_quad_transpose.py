"""jt_quad_transpose (templates/common/quad.h.j2), which the wgmma conv2d epilogues use to turn
each lane's accumulator pairs into 8 adjacent outputs: on the CPU emulator at warp 32 and 64, every
lane's result against the transpose written out in numpy; and compiled for sm_80 and gfx90a."""
from __future__ import annotations

import numpy as np
import pytest

from jitops import codegen
from jitops.runtime import get_backend
from jitops.runtime.base import PackedArgs

KERNEL = r"""
{% include "common/quad.h.j2" %}
// Lane l fills v[u][e] = x[l][u][e], transposes within its quad, writes y[l][u][e].
JT_KERNEL void quad_transpose(const float* x, float* y) {
  const int l = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  float v[4][2];
  for (int u = 0; u < 4; ++u)
    for (int e = 0; e < 2; ++e) v[u][e] = x[l * 8 + u * 2 + e];
  jt_quad_transpose(v, (int)threadIdx.x & 3);
  for (int u = 0; u < 4; ++u)
    for (int e = 0; e < 2; ++e) y[l * 8 + u * 2 + e] = v[u][e];
}
"""


@pytest.mark.parametrize("warp", [32, 64])
def test_quad_transpose_on_the_emulator(warp):
    backend = get_backend("cpu", warp_size=warp, checked=True)
    lanes = 2 * warp                                           # two blocks of one warp each
    x = np.random.default_rng(warp).standard_normal((lanes, 4, 2)).astype(np.float32)
    y = np.full_like(x, np.nan)
    source = codegen.prelude("cpu", "cpu", warp) + codegen.environment().from_string(KERNEL).render()
    kernel = backend.load(backend.compile(source, ["quad_transpose"], f"quad_transpose_{warp}"), ["quad_transpose"])
    packed = PackedArgs(["ptr", "ptr"], ["x", "y"])
    for i, a in enumerate((x, y)):
        packed.set_buffer(i, a.ctypes.data, a.nbytes, a.itemsize)
    backend.launch(kernel["quad_transpose"], (2, 1, 1), (warp, 1, 1), 0, packed, 0)
    # lane 4k + q ends with slot u = lane 4k + u's slot q
    want = x.reshape(lanes // 4, 4, 4, 2).transpose(0, 2, 1, 3).reshape(lanes, 4, 2)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("target", ["sm_80", "gfx90a"])
def test_quad_transpose_compiles_for_gpu_targets(target):
    from jitops.errors import BackendUnavailable
    try:
        backend = get_backend(target=target)
    except BackendUnavailable as exc:
        pytest.skip(f"no compiler for {target} here: {exc}")    # CI installs them (scripts/setup.sh)
    source = codegen.prelude(backend.name, target, backend.device.warp_size) + \
        codegen.environment().from_string(KERNEL).render()
    assert backend.compile(source, ["quad_transpose"], f"quad_transpose_{target}")
