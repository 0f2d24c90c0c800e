"""Arrays that are not 16-byte aligned on a real GPU (pytest -m gpu): torch CUDA views one element
into their storage (`torch.empty(n + 1)[1:]`), one input or `out=` at a time, for every op family
with vector accesses (tests/alignment_cases.py). Each call gives the float64 reference's result or,
for a kernel with vector accesses and no unaligned path, raises an ArgumentError naming the
argument; never a fault (a synchronize after every call would raise it, and the context would be
gone for the calls after). The first, aligned, call of each case binds the repeat paths (Python and
native), so the moved calls after it go through their checks. Small problems: seconds in all."""
from __future__ import annotations

import pytest

import jitops

from alignment_cases import CASES, check, moved, torch  # noqa: E402  (skips the module without torch)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]     # conftest's: the GPU backend
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)


# The heuristic's pick on this GPU, and for conv2d the matrix-core kernel forced as well (the pick
# of a 16-bit NHWC layer may be wgmma on sm_90 or mma.sync elsewhere).
SCHEDULES = {"conv2d_mma_nhwc": [None, "implicit_gemm_mma"], "conv2d_mma_nchw_1x1": [None, "implicit_gemm_mma"]}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_moved_arrays_work_or_are_refused(case):
    for schedule in SCHEDULES.get(case.name, [None]):
        refused = check(case, "cuda", schedule, allow_refusal=True, after=torch.cuda.synchronize)
        if not case.may_refuse:
            assert refused == []


def test_refusal_leaves_the_context_usable():
    """A refused call launches nothing: the same aligned call runs right after it."""
    case = next(c for c in CASES if c.name == "conv2d_depthwise_nhwc")
    t = case.inputs("cuda")
    y = case.call(t, schedule="depthwise")            # 8 fp16 channels per 16-byte access
    with pytest.raises(jitops.ArgumentError, match="'out'.*aligned to 16 bytes"):
        case.call(t, out=moved(torch.empty_like(y)), schedule="depthwise")
    torch.cuda.synchronize()
    assert torch.equal(case.call(t, schedule="depthwise"), y)
