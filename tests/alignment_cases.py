"""Calls with one array at a time moved off 16-byte alignment (a copy one element past a 16-byte
boundary: what `torch.empty(n + 1)[1:]` gives), shared by tests/test_alignment.py (the emulator)
and tests/test_gpu_alignment.py.

A case is an op call on torch tensors in the API's form (channels_last for NHWC), a float64
reference, and the schedule that reaches its vector kernel on the emulator (whose own heuristic
would pick another). `check` runs it aligned, then with each input and each output (`out=`) moved:
every call must give the reference's result, or, where `may_refuse`, raise an ArgumentError naming
the moved argument (a vector kernel that cannot take it: on a GPU the launch would fault)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest

import jitops
from jitops.errors import ArgumentError
from jitops.ops.conv2d_depthwise import schedule as depthwise_schedule
from jitops.ops.conv2d_mma import mma_schedule
from jitops.ops.conv2d_stem import schedule as stem_schedule

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOL = {torch.float16: 4e-3, torch.float32: 1e-4}


def rand(device: str, *shape: int, dtype: Any = torch.float16, scale: float = 1.0, seed: int = 0,
         channels_last: bool = False) -> Any:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def is_channels_last(t: Any) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def moved(t: Any) -> Any:
    """A copy of `t` (shape, dtype, memory format) whose data starts one element past a 16-byte boundary."""
    cl = is_channels_last(t)
    base = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
    first = (-base.data_ptr() % 16) // t.element_size() + 1
    flat = base[first:first + t.numel()]
    v = flat.view(t.shape[0], t.shape[2], t.shape[3], t.shape[1]).permute(0, 3, 1, 2) if cl else flat.view(t.shape)
    v.copy_(t)
    assert v.data_ptr() % 16 == t.element_size() and is_channels_last(v) == cl
    return v


@dataclass(frozen=True)
class Case:
    name: str
    inputs: Callable[[str], dict[str, Any]]        # device -> the call's arrays by argument name (None: absent)
    call: Callable[..., Any]                       # (arrays, out=None, schedule=None) -> output(s)
    reference: Callable[[dict[str, Any]], tuple]   # float64 arrays -> outputs
    emulator_schedule: Any = None                  # the vector kernel on the emulator (None: the heuristic's)
    may_refuse: bool = False                       # a kernel with vector accesses and no unaligned path
    outputs: tuple[str, ...] = ("out",)            # the argument each output is named by in errors


def _conv(t: dict, padding: int = 1, groups: int = 1, **kw: Any) -> Any:
    return jitops.conv2d(t["x"], t["w"], t["bias"], padding=padding, groups=groups, activation="relu",
                         residual=t["residual"], **kw)


def _conv_ref(t: dict, padding: int = 1, groups: int = 1) -> tuple:
    y = F.conv2d(t["x"], t["w"], t["bias"], padding=padding, groups=groups)
    return (F.relu(y + t["residual"] if t["residual"] is not None else y),)


def _conv_inputs(n: int, c: int, h: int, w: int, cout: int, k: int, groups: int = 1, cl: bool = False,
                 residual: bool = True, dtype: Any = torch.float16) -> Callable[[str], dict]:
    def make(device: str) -> dict:
        oh, ow = h + 2 * (k // 2) - k + 1, w + 2 * (k // 2) - k + 1
        return {"x": rand(device, n, c, h, w, dtype=dtype, channels_last=cl),
                "w": rand(device, cout, c // groups, k, k, dtype=dtype, scale=(c // groups * k * k) ** -0.5, seed=1),
                "bias": rand(device, cout, dtype=dtype, seed=2),
                "residual": rand(device, n, cout, oh, ow, dtype=dtype, seed=3, channels_last=cl) if residual else None}
    return make


def _skip_norm_ref(t: dict, rms: bool) -> tuple:
    """y of the normalised s = x + residual + bias, s rounded to x's dtype first (as jitops does), and s."""
    s = (t["x"] + t["residual"] + t["bias"]).to(torch.float16).double()
    if rms:
        y = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * t["gamma"]
    else:
        y = F.layer_norm(s, s.shape[-1:], t["gamma"], t["beta"], 1e-5)
    return y, s


def _skip_norm_inputs(rms: bool) -> Callable[[str], dict]:
    def make(device: str) -> dict:
        out = {"x": rand(device, 6, 256), "gamma": rand(device, 256, dtype=torch.float32, seed=1)}
        if not rms:
            out["beta"] = rand(device, 256, dtype=torch.float32, seed=2)
        out["residual"] = rand(device, 6, 256, seed=3)
        out["bias"] = rand(device, 256, seed=4)
        return out
    return make


def _attention_inputs(dtype: Any) -> Callable[[str], dict]:
    return lambda device: {"q": rand(device, 1, 2, 40, 64, dtype=dtype),
                           "k": rand(device, 1, 2, 48, 64, dtype=dtype, seed=1),
                           "v": rand(device, 1, 2, 48, 64, dtype=dtype, seed=2)}


def _bn_inputs(device: str) -> dict:
    return {"x": rand(device, 2, 16, 4, 4, channels_last=True),
            "mean": rand(device, 16, dtype=torch.float32, scale=0.3, seed=1),
            "var": rand(device, 16, dtype=torch.float32, seed=2).abs() + 0.5,
            "gamma": rand(device, 16, dtype=torch.float32, seed=3),
            "beta": rand(device, 16, dtype=torch.float32, seed=4)}


def _gn_inputs(cl: bool) -> Callable[[str], dict]:
    return lambda device: {"x": rand(device, 2, 16, 4, 4, channels_last=cl),
                           "gamma": rand(device, 16, dtype=torch.float32, seed=1),
                           "beta": rand(device, 16, dtype=torch.float32, seed=2)}


SMALL_MMA = mma_schedule(32, 32, 32, 1, 1, 2)       # one warp per block: fastest on the emulator

CASES = [
    # conv2d kernels with vector accesses and no unaligned path (the engine stages or refuses)
    Case("conv2d_depthwise_nchw", _conv_inputs(2, 8, 6, 16, 8, 3, groups=8),
         lambda t, **kw: _conv(t, groups=8, **kw), lambda t: _conv_ref(t, groups=8),
         depthwise_schedule(1, 4), may_refuse=True),                      # rows of 4 outputs as one vector
    Case("conv2d_depthwise_nhwc", _conv_inputs(2, 16, 6, 6, 16, 3, groups=16, cl=True),
         lambda t, **kw: _conv(t, groups=16, **kw), lambda t: _conv_ref(t, groups=16),
         depthwise_schedule(1, 2), may_refuse=True),                      # 8 channels as one vector
    Case("conv2d_stem_nhwc", _conv_inputs(1, 3, 8, 8, 16, 3, cl=True), _conv, _conv_ref,
         stem_schedule(16), may_refuse=True),
    Case("conv2d_mma_nhwc", _conv_inputs(2, 16, 6, 6, 16, 3, cl=True), _conv, _conv_ref, SMALL_MMA,
         may_refuse=True),                                                # x by cp.async, 16-byte epilogue
    Case("conv2d_mma_nchw_1x1", _conv_inputs(2, 16, 8, 8, 16, 1),
         lambda t, **kw: _conv(t, padding=0, **kw), lambda t: _conv_ref(t, padding=0),
         mma_schedule(32, 32, 32, 1, 1, 2, a_nchw=True), may_refuse=True),  # NCHW x read in place
    # kernels that branch on alignment at run time: every call must work
    Case("leaky_relu", lambda device: {"x": rand(device, 3000)},
         lambda t, **kw: jitops.leaky_relu(t["x"], 0.1, **kw), lambda t: (F.leaky_relu(t["x"], 0.1),)),
    Case("batch_norm_nhwc", _bn_inputs,
         lambda t, **kw: jitops.batch_norm(t["x"], t["mean"], t["var"], t["gamma"], t["beta"], **kw),
         lambda t: (F.batch_norm(t["x"], t["mean"], t["var"], t["gamma"], t["beta"], False, 0.0, 1e-5),)),
    Case("group_norm_nhwc", _gn_inputs(True),
         lambda t, **kw: jitops.group_norm(t["x"], 4, t["gamma"], t["beta"], **kw),
         lambda t: (F.group_norm(t["x"], 4, t["gamma"], t["beta"], 1e-5),)),
    Case("group_norm_nchw", _gn_inputs(False),
         lambda t, **kw: jitops.group_norm(t["x"], 4, t["gamma"], t["beta"], **kw),
         lambda t: (F.group_norm(t["x"], 4, t["gamma"], t["beta"], 1e-5),)),
    Case("layer_norm_skip", _skip_norm_inputs(False),
         lambda t, **kw: jitops.layer_norm(t["x"], 256, t["gamma"], t["beta"], residual=t["residual"],
                                           bias=t["bias"], return_sum=True, **kw),
         lambda t: _skip_norm_ref(t, rms=False), outputs=("out['y']", "out['sum']")),
    Case("rms_norm_skip", _skip_norm_inputs(True),
         lambda t, **kw: jitops.rms_norm(t["x"], 256, t["gamma"], residual=t["residual"], bias=t["bias"],
                                         return_sum=True, **kw),
         lambda t: _skip_norm_ref(t, rms=True), outputs=("out['y']", "out['sum']")),
    Case("attention_fp16", _attention_inputs(torch.float16),
         lambda t, **kw: jitops.attention(t["q"], t["k"], t["v"], **kw),
         lambda t: (F.scaled_dot_product_attention(t["q"], t["k"], t["v"]),), "fused_mma"),
    Case("attention_fp32", _attention_inputs(torch.float32),
         lambda t, **kw: jitops.attention(t["q"], t["k"], t["v"], **kw),
         lambda t: (F.scaled_dot_product_attention(t["q"], t["k"], t["v"]),), "fused"),
]


def _tuple(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def assert_close(got: Any, want: tuple, what: str) -> None:
    for g, w in zip(_tuple(got), want, strict=True):
        assert not torch.isnan(g).any(), f"{what}: unwritten output"
        err = float((g.double() - w).abs().max() / w.abs().max())
        assert err <= TOL[g.dtype], f"{what}: max error {err:.3g} of max |reference|"


def check(case: Case, device: str, schedule: Any = None, allow_refusal: bool = False,
          after: Callable[[], None] = lambda: None) -> list[str]:
    """Run `case` aligned, then with each array moved; returns the arguments that were refused.
    `after` runs after every call (on a GPU: a synchronize, where a faulting launch would surface)."""
    t = case.inputs(device)
    want = case.reference({n: None if v is None else v.double() for n, v in t.items()})
    aligned = case.call(t, schedule=schedule)
    after()
    assert_close(aligned, want, f"{case.name} aligned")
    trials: list[tuple[str, Callable[[], Any]]] = []
    for name in (n for n, v in t.items() if v is not None):
        trials.append((name, lambda name=name: case.call({**t, name: moved(t[name])}, schedule=schedule)))
    for k, argument in enumerate(case.outputs):
        def with_out(k: int = k) -> Any:
            outs = [torch.full_like(o, float("nan")) for o in _tuple(aligned)]
            outs[k] = moved(outs[k])
            return case.call(t, out=tuple(outs) if len(outs) > 1 else outs[0], schedule=schedule)
        trials.append((argument, with_out))
    refused = []
    for argument, run in trials:
        try:
            got = run()
            after()
        except ArgumentError as exc:
            if not (allow_refusal and case.may_refuse):
                raise
            assert exc.argument == argument and "aligned to" in str(exc) and ".clone()" in str(exc), str(exc)
            after()
            refused.append(argument)
            continue
        assert_close(got, want, f"{case.name}, '{argument}' moved")
    return refused
