"""One plan on several streams at once (pytest -m gpu). Persistent workspaces (grid-barrier
counters, partial sums, statistics) are kept per stream (prepared.persistent_workspace), so
launches of group_norm's one-launch NHWC kernel or layer_norm's split path running at once on two
streams give the results they give alone; and a plan first used on a stream inside a CUDA-graph
capture allocates that stream's workspaces without ending the capture."""
from __future__ import annotations

import pytest

import jitops

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)


def _group_norm_case(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(2, 320, 64, 64, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
    gamma = torch.rand(320, device="cuda", generator=g) + 0.5
    beta = torch.randn(320, device="cuda", generator=g)
    reference = lambda: torch.nn.functional.group_norm(x.double(), 32, gamma.double(), beta.double(), 1e-5)  # noqa: E731
    return (lambda: jitops.group_norm(x, 32, gamma, beta)), x, reference


def _layer_norm_case(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(4, 1 << 16, device="cuda", generator=g)
    reference = lambda: torch.nn.functional.layer_norm(x.double(), (1 << 16,), eps=1e-5)  # noqa: E731
    return (lambda: jitops.layer_norm(x, 1 << 16, schedule="split")), x, reference


CASES = {"group_norm_nhwc_one_launch": _group_norm_case, "layer_norm_split": _layer_norm_case}


def _error(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("case", list(CASES))
def test_two_streams_at_once_give_each_its_own_result(case):
    runs = [(fn, x, reference()) for fn, x, reference in (CASES[case](seed) for seed in (1, 2))]
    for fn, _, ref in runs:                      # compile, bind, check on the default stream
        assert _error(fn(), ref) < 2e-3
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    outs: list[list] = [[], []]
    for _ in range(40):                          # interleaved: both streams' launches in flight together
        for k, ((fn, _, _), s) in enumerate(zip(runs, streams)):
            with torch.cuda.stream(s):
                outs[k].append(fn())
    torch.cuda.synchronize()
    for k, (_, _, ref) in enumerate(runs):
        errors = [_error(y, ref) for y in outs[k]]
        assert max(errors) < 2e-3, (case, k, max(errors))


@pytest.mark.parametrize("case", list(CASES))
def test_first_use_of_a_stream_inside_a_graph_capture(case):
    fn, x, reference = CASES[case](3)
    assert _error(fn(), reference()) < 2e-3      # compiled and bound outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):                # torch's capture stream: new to this plan
        y = fn()
    x.copy_(torch.randn_like(x))                 # new data, same parameters
    y.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert _error(y, reference()) < 2e-3
