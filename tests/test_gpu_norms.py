"""The four normalizations on a real GPU (pytest -m gpu): every strategy against float64 on the
device, fp32/fp16/mixed parameters, large offsets, the split path inside a CUDA graph (counters
reset by the kernel, no memset), re-folding batch-norm parameters changed in place, a side
stream, host arrays, and tensors of more than 2^31 elements (64-bit indexing)."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.bench.layer_norm import call, torch_reference
from jitops.ops import get_op
from jitops.ops.base import ITEMSIZE, TensorSpec
from jitops.ops.norm_common import row_heuristic

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_backend")]   # conftest: the GPU, not the emulator
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)




def make(op_name, shape, dtype, ptype=None, attrs=None, params=("gamma", "beta")):
    """A problem and random device inputs (never zeros)."""
    op = get_op(op_name)
    attrs = dict(attrs or {})
    specs = {"x": TensorSpec(shape, dtype)}
    if op_name == "batch_norm":
        pshape = (shape[1],)
        params = ("mean", "var") + tuple(params)
    elif op_name == "group_norm":
        pshape = (shape[1],)
    else:
        pshape = tuple(shape[-1:])
        attrs.setdefault("normalized_shape", shape[-1])
    if op_name == "rms_norm":
        params = tuple(p for p in params if p != "beta")
    specs.update({p: TensorSpec(pshape, ptype or dtype) for p in params})
    problem = op.make_problem(specs, attrs)
    ins = {"x": (torch.randn(shape, device="cuda") * 2 + 0.5).to(getattr(torch, dtype))}
    for p in params:
        t = torch.rand(pshape, device="cuda") + 0.5 if p == "var" else torch.randn(pshape, device="cuda")
        ins[p] = t.to(getattr(torch, ptype or dtype))
    return problem, ins


def check(op_name, problem, ins, schedule=None, tol=None, out=None):
    op = get_op(op_name)
    out = torch.full(problem.shape, float("nan"), device="cuda", dtype=getattr(torch, problem.dtype)) \
        if out is None else out.fill_(float("nan"))
    y = call(op_name, problem, ins, out=out, schedule=schedule)
    torch.cuda.synchronize()
    assert y is out and not torch.isnan(y).any(), "elements left unwritten"
    ref = torch_reference(op_name, problem, ins)
    if tol is None:
        sched = schedule if isinstance(schedule, jitops.Schedule) else \
            op.heuristic(problem, jitops.get_backend().device, schedule)
        tol = op.tolerance(problem, sched)[0]
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    assert err <= tol, f"{op_name} {problem.shape} {problem.dtype} {schedule}: {err:.3g} > {tol:.3g}"
    return y


ROW_SHAPES = {
    "layer_norm": [(7, 37), (4096, 1024), (512, 4096), (64, 8192), (8, 65536), (3, 300000), (1000, 3)],
    "rms_norm": [(7, 37), (4096, 1024), (64, 8192), (8, 65536), (3, 300000)],
    "group_norm": [(256, 64, 56, 56), (8, 320, 32, 32), (2, 128, 64, 64), (4, 6, 7, 7), (3, 8, 1, 1)],
}
GROUPS = {(256, 64, 56, 56): 32, (8, 320, 32, 32): 32, (2, 128, 64, 64): 4, (4, 6, 7, 7): 3, (3, 8, 1, 1): 8}


@pytest.mark.parametrize("op_name", ["layer_norm", "rms_norm", "group_norm"])
@pytest.mark.parametrize("dtype,ptype", [("float32", "float32"), ("float16", "float16"), ("float16", "float32")])
def test_row_ops_every_strategy(op_name, dtype, ptype):
    shapes = ROW_SHAPES[op_name] if dtype == ptype == "float32" else ROW_SHAPES[op_name][:4]
    algorithms = (None, "warp", "block", "stream", "split", "naive") if dtype == "float32" or ptype == "float32" \
        else (None,)
    _check_strategies(op_name, shapes, dtype, ptype, algorithms)


def _check_strategies(op_name: str, shapes: list, dtype: str, ptype: str, algorithms: tuple) -> None:
    """Each shape with each algorithm's best parameters (those that apply) against float64."""
    for shape in shapes:
        attrs = {"num_groups": GROUPS[shape]} if op_name == "group_norm" else {}
        problem, ins = make(op_name, shape, dtype, ptype, attrs)
        for alg in algorithms:
            try:
                sched = get_op(op_name).heuristic(problem, jitops.get_backend().device, alg)
            except jitops.ScheduleError:
                continue
            if alg == "warp" and int(sched["items"]) > 32:
                continue
            check(op_name, problem, ins, sched)


@pytest.mark.parametrize("dtype,ptype", [("float32", "float32"), ("float16", "float16"), ("float16", "float32")])
def test_batch_norm(dtype, ptype):
    for shape in [(256, 64, 56, 56), (8, 3, 7, 7), (4096, 1000), (33, 5), (2, 16, 3, 5, 7)]:
        problem, ins = make("batch_norm", shape, dtype, ptype)
        for alg in (None, "naive"):
            check("batch_norm", problem, ins, alg)


@pytest.mark.parametrize("activation", ["relu", "leaky_relu"])
def test_batch_norm_activation(activation):
    for shape in [(64, 64, 28, 28), (8, 3, 7, 7)]:
        problem, ins = make("batch_norm", shape, "float32", attrs={"activation": activation, "alpha": 0.2})
        for alg in (None, "naive"):
            check("batch_norm", problem, ins, alg)


def test_batch_norm_refolds_parameters_changed_in_place():
    problem, ins = make("batch_norm", (8, 16, 10, 10), "float32")
    check("batch_norm", problem, ins)
    ins["gamma"].mul_(-2.0)       # same tensor, new version counter
    ins["mean"].add_(1.0)
    check("batch_norm", problem, ins)


@pytest.mark.parametrize("op_name,shape,params", [
    ("layer_norm", (64, 4096), dict(algorithm="block")),
    ("layer_norm", (64, 4096), dict(algorithm="block", stats="welford")),
    ("layer_norm", (64, 4096), dict(algorithm="warp", stats="two_pass")),
    ("layer_norm", (64, 4096), dict(algorithm="stream")),
    ("layer_norm", (4, 1 << 20), dict(algorithm="split")),
    ("group_norm", (16, 64, 56, 56), dict(algorithm="block")),
    ("group_norm", (2, 64, 128, 128), dict(algorithm="split")),
])
def test_large_offset(op_name, shape, params):
    """Seed 003: 1e4 + N(0, 1): outputs (hence mean and variance) within 4e-6 of float64."""
    attrs = {"num_groups": 32} if op_name == "group_norm" else {}
    problem, ins = make(op_name, shape, "float32", attrs=attrs, params=())
    ins["x"] = torch.randn(shape, device="cuda").add_(1e4)
    params = dict(params)
    sched = row_heuristic(problem.row_spec(), jitops.get_backend().device, params.pop("algorithm"), **params)
    check(op_name, problem, ins, sched, tol=4e-6)


@pytest.mark.parametrize("op_name,shape,attrs", [
    ("layer_norm", (4, 1 << 20), {}), ("rms_norm", (4, 1 << 20), {}),
    ("group_norm", (2, 64, 128, 128), {"num_groups": 4}),
])
def test_split_in_a_cuda_graph(op_name, shape, attrs):
    """Grid-reduction counters reset by the last block: graph replays on new data stay right."""
    problem, ins = make(op_name, shape, "float32", attrs=attrs)
    assert get_op(op_name).heuristic(problem, jitops.get_backend().device).algorithm == "split"
    out = torch.empty(shape, device="cuda")
    call(op_name, problem, ins, out=out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call(op_name, problem, ins, out=out)
    for _ in range(3):
        ins["x"].copy_(torch.randn(shape, device="cuda") * 3 - 1)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = torch_reference(op_name, problem, ins)
        assert float((out.double() - ref).abs().max() / ref.abs().max()) <= 4e-6


def test_side_stream_and_host_arrays():
    problem, ins = make("layer_norm", (2048, 2048), "float32")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        ins["x"].mul_(2.0)
        y = jitops.layer_norm(ins["x"], 2048, ins["gamma"], ins["beta"])
    s.synchronize()
    ref = torch_reference("layer_norm", problem, ins)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) <= 4e-6
    x = np.random.default_rng(0).standard_normal((64, 6, 9, 9)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal(6).astype(np.float32)
    yh = jitops.group_norm(x, 3, g, g)
    assert isinstance(yh, np.ndarray)
    ref = get_op("group_norm").reference(
        get_op("group_norm").make_problem({"x": TensorSpec(x.shape, "float32"), "gamma": TensorSpec((6,), "float32"),
                                           "beta": TensorSpec((6,), "float32")}, {"num_groups": 3}),
        {"x": x, "gamma": g, "beta": g})["y"]
    assert np.abs(yh - ref).max() / np.abs(ref).max() <= 4e-6


def _slices_match(op_name, ins, y, index, attrs, channels=None):
    """Compare a slice of a huge output with float64 on that slice only (`channels` slices the
    per-channel parameters along with x)."""
    sub = {k: (v[channels] if channels is not None else v) for k, v in ins.items() if k != "x"}
    sub["x"] = ins["x"][index]
    specs = {k: TensorSpec(tuple(v.shape), str(v.dtype).split(".")[1]) for k, v in sub.items()}
    subp = get_op(op_name).make_problem(specs, attrs)
    ref = torch_reference(op_name, subp, sub)
    err = float((y[index].double() - ref).abs().max() / ref.abs().max())
    assert err <= 2e-3, f"{op_name} {index}: {err}"


def test_more_than_2_to_31_elements():
    """2 x 64 x 16385 x 1024 fp16 = 2^31 + 131072 elements: every op takes 64-bit offsets."""
    shape = (2, 64, 16385, 1024)
    x = torch.randn(shape, device="cuda", dtype=torch.float16)
    assert x.numel() > 2 ** 31
    y = torch.empty_like(x)
    p = lambda: torch.randn(64, device="cuda", dtype=torch.float32)  # noqa: E731
    bn_ins = {"x": x, "mean": p(), "var": torch.rand(64, device="cuda") + 0.5, "gamma": p(), "beta": p()}
    bn = get_op("batch_norm").make_problem({k: TensorSpec(tuple(v.shape), str(v.dtype).split(".")[1])
                                            for k, v in bn_ins.items()}, {})
    y.fill_(float("nan"))
    call("batch_norm", bn, bn_ins, out=y)
    for idx in ((slice(None), slice(None), slice(0, 4)), (slice(None), slice(None), slice(16380, 16385))):
        _slices_match("batch_norm", bn_ins, y, idx, {})
    assert not torch.isnan(y).any()

    gn_ins = {"x": x, "gamma": p(), "beta": p()}
    gn = get_op("group_norm").make_problem({k: TensorSpec(tuple(v.shape), str(v.dtype).split(".")[1])
                                            for k, v in gn_ins.items()}, {"num_groups": 16})
    y.fill_(float("nan"))
    call("group_norm", gn, gn_ins, out=y)
    # The last group of the last sample (4 channels, past element 2^31) and the first one.
    _slices_match("group_norm", gn_ins, y, (slice(1, 2), slice(60, 64)), {"num_groups": 1}, slice(60, 64))
    _slices_match("group_norm", gn_ins, y, (slice(0, 1), slice(0, 4)), {"num_groups": 1}, slice(0, 4))
    assert not torch.isnan(y).any()

    rows = x.view(-1, 2048)
    yr = y.view(-1, 2048)
    for op_name in ("layer_norm", "rms_norm"):
        ins = {"x": rows, "gamma": torch.randn(2048, device="cuda", dtype=torch.float16)}
        if op_name == "layer_norm":
            ins["beta"] = torch.randn(2048, device="cuda", dtype=torch.float16)
        prob = get_op(op_name).make_problem({k: TensorSpec(tuple(v.shape), "float16") for k, v in ins.items()},
                                            {"normalized_shape": 2048})
        yr.fill_(float("nan"))
        call(op_name, prob, ins, out=yr)
        _slices_match(op_name, ins, yr, (slice(0, 64),), {"normalized_shape": 2048})
        _slices_match(op_name, ins, yr, (slice(rows.shape[0] - 64, rows.shape[0]),), {"normalized_shape": 2048})
        assert not torch.isnan(yr[-1]).any()
    del x, y
    torch.cuda.empty_cache()


# ---- bfloat16 and channels_last (issue 18)

@pytest.mark.parametrize("op_name", ["layer_norm", "rms_norm", "group_norm"])
@pytest.mark.parametrize("ptype", ["float32", "bfloat16"])
def test_bf16_every_strategy(op_name, ptype):
    _check_strategies(op_name, ROW_SHAPES[op_name][:4], "bfloat16", ptype,
                      (None, "warp", "block", "stream", "split", "naive") if ptype == "float32" else (None,))


def _nhwc_check(op_name, shape, dtype, ptype="float32", groups=32, schedule=None, x=None, tol=None):
    """channels_last torch tensors in, a channels_last output (NaN-poisoned) out, float64 on the device."""
    c = shape[1]
    x = (torch.randn(shape, device="cuda") * 2 + 0.5).to(getattr(torch, dtype)) if x is None else x
    x = x.contiguous(memory_format=torch.channels_last)
    pt = getattr(torch, ptype)
    g, b = (torch.randn(c, device="cuda") * 0.5 + 1).to(pt), torch.randn(c, device="cuda").to(pt)
    out = torch.full_like(x, float("nan"))
    xd, gd, bd = x.double(), g.double().view(1, c, 1, 1), b.double().view(1, c, 1, 1)
    if op_name == "group_norm":
        y = jitops.group_norm(x, groups, g, b, out=out, schedule=schedule)
        r = xd.reshape(shape[0], groups, -1)
        ref = ((r - r.mean(-1, keepdim=True)) / (r.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt())
        ref = ref.reshape(shape) * gd + bd
    else:
        m, v = torch.randn(c, device="cuda").to(pt), (torch.rand(c, device="cuda") + 0.5).to(pt)
        y = jitops.batch_norm(x, m, v, g, b, out=out, schedule=schedule)
        ref = (xd - m.double().view(1, c, 1, 1)) / (v.double().view(1, c, 1, 1) + 1e-5).sqrt() * gd + bd
    torch.cuda.synchronize()
    assert y is out and not torch.isnan(y).any(), "elements left unwritten"
    assert jitops.group_norm(x, groups, g, b).is_contiguous(memory_format=torch.channels_last) \
        if op_name == "group_norm" else True
    err = float((y.double() - ref).abs().max() / ref.abs().max())
    tol = tol or {"float32": 4e-6, "float16": 2e-3, "bfloat16": 5e-3}[dtype]
    assert err <= tol, f"{op_name} {shape} {dtype} {schedule}: {err:.3g} > {tol:.3g}"


NHWC_SHAPES = [(2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 8, 8), (2, 1920, 16, 16), (8, 320, 64, 64),
               (256, 64, 56, 56), (3, 96, 7, 7), (2, 24, 5, 3)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_group_norm_nhwc(dtype):
    from jitops.ops import group_norm_onchip
    from jitops.ops.norm_common import vector_width
    dev = jitops.get_backend().device
    for shape in NHWC_SHAPES:
        groups = 32 if shape[1] % 32 == 0 else 4
        prob = get_op("group_norm").make_problem(
            {"x": TensorSpec(shape, dtype, "nhwc"), "gamma": TensorSpec((shape[1],), "float32"),
             "beta": TensorSpec((shape[1],), "float32")}, {"num_groups": groups})
        onchip = [s for _, s in group_norm_onchip.options(prob, dev, vector_width(shape[1], ITEMSIZE[dtype]))]
        for alg in (None, "nhwc", "naive", *onchip[:1], *onchip[-1:]):
            _nhwc_check("group_norm", shape, dtype, groups=groups, schedule=alg)


def test_group_norm_nhwc_large_offset_and_graph():
    """1e4 + N(0, 1) in fp32 through the NHWC statistics (within 4e-6 of float64), then graph
    replays on new data (the per-sample counters reset themselves)."""
    shape = (2, 320, 32, 32)
    _nhwc_check("group_norm", shape, "float32", x=torch.randn(shape, device="cuda").add_(1e4), tol=4e-6)
    x = torch.randn(shape, device="cuda").contiguous(memory_format=torch.channels_last)
    g, b = torch.randn(320, device="cuda"), torch.randn(320, device="cuda")
    out = torch.empty_like(x)
    jitops.group_norm(x, 32, g, b, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jitops.group_norm(x, 32, g, b, out=out)
    for _ in range(3):
        x.copy_(torch.randn(shape, device="cuda") * 3 - 1)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.nn.functional.group_norm(x.double(), 32, g.double(), b.double())
        assert float((out.double() - ref).abs().max() / ref.abs().max()) <= 4e-6


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_batch_norm_nhwc(dtype):
    for shape in [(256, 64, 56, 56), (8, 3, 7, 7), (2, 40, 5, 5), (4, 1, 3, 3)]:
        for alg in (None, "naive"):
            _nhwc_check("batch_norm", shape, dtype, schedule=alg)


@pytest.mark.parametrize("residual", [False, True])
def test_row_of_48_kib_in_shared_memory_launches(residual):
    """A 12288-wide fp32 row held in shared memory is 48 KiB of dynamic shared memory; with the reduction's
    static scratch that is past the default per-block limit, so the kernel must be opted in (it failed to
    launch, CUDA_ERROR_INVALID_VALUE: found by scripts/fuzz_ops.py, 2026-11-29)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1024, 12288, device="cuda", generator=g)
    gamma = torch.randn(12288, device="cuda", generator=g)
    res = torch.randn(1024, 12288, device="cuda", generator=g) if residual else None
    s = x.double() + (res.double() if residual else 0)
    want = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * gamma.double()
    out = torch.full_like(x, float("nan"))
    jitops.rms_norm(x, 12288, gamma, residual=res, out=out)
    assert float((out.double() - want).abs().max()) < 1e-4
    ln = jitops.layer_norm(x, 12288, gamma, gamma, residual=res)
    want_ln = torch.nn.functional.layer_norm(s, (12288,), gamma.double(), gamma.double(), 1e-5)
    assert float((ln.double() - want_ln).abs().max()) < 1e-4
