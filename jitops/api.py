"""The public op functions: typed signatures and docs; the op modules and the engine do the work.

Every function takes arrays of one kind (numpy, torch, CuPy, __cuda_array_interface__ objects or
jitops.DeviceArray) and returns the same kind. Keyword-only `out` receives the result in place of
a new array; `schedule` forces an algorithm by name or a full jitops.Schedule.

A call without `out` or `schedule` first tries engine.repeat_call (the native repeat path of an
earlier call with the same signature); its tuples list the inputs and attributes in the order the
dictionaries given to engine.run do.
"""
from __future__ import annotations

from typing import Any, Sequence

from . import engine
from .engine import MISS, repeat_call
from .ops.base import DEFAULT_FP32_PRECISION, FP32_PRECISIONS, Schedule

ScheduleArg = Schedule | str | None
IntOrPair = int | Sequence[int]


def set_fp32_precision(mode: str) -> None:
    """Default math for fp32 convolutions and attention whose call gives no `precision` (like torch's
    allow_tf32): "highest" (exact fp32 kernels, the default), "tf32" (matrix cores on operands rounded
    to TF32, 10-bit mantissa), "3xtf32" (each operand split into TF32 big + small parts, three products:
    near-fp32 accuracy on the matrix cores; attention keeps its exact fp32 kernels there).
    docs/conv2d.md and docs/performance.md ("fp32 on the matrix cores with TF32 products") give each
    mode's measured error.
    A change drops the prepared plans (calls without `precision` were planned under the old mode)."""
    from .errors import ArgumentError
    if mode not in FP32_PRECISIONS:
        raise ArgumentError("mode", f"one of {', '.join(map(repr, FP32_PRECISIONS))}", repr(mode), op="set_fp32_precision")
    if DEFAULT_FP32_PRECISION[0] != mode:
        DEFAULT_FP32_PRECISION[0] = mode
        engine.clear_prepared()


def get_fp32_precision() -> str:
    return DEFAULT_FP32_PRECISION[0]


def _out(name: str, out: Any) -> dict[str, Any] | None:
    return {name: out} if out is not None else None


def _with_layout(attrs: dict[str, Any], layout: str | None) -> dict[str, Any]:
    """The engine's `layout` attribute only when given, so that plain calls keep the attribute
    order their repeat_call tuples list."""
    return attrs if layout is None else {**attrs, "layout": layout}


def leaky_relu(x: Any, alpha: float = 0.01, *, layout: str | None = None, out: Any = None,
               schedule: ScheduleArg = None) -> Any:
    """y = x if x > 0 else alpha * x (fp32, fp16 or bf16), over any dense memory format: a
    channels_last tensor gives a channels_last result. layout="nhwc": a non-torch 4-d array is
    (N, H, W, C) (the result too). Algorithms: "vectorized", "naive"."""
    if out is None and schedule is None and layout is None and \
            (y := repeat_call("leaky_relu", (x,), (alpha,))) is not MISS:
        return y
    return engine.run("leaky_relu", {"x": x}, _with_layout({"alpha": alpha}, layout), out=_out("y", out),
                      schedule=schedule)


def conv2d(x: Any, w: Any, bias: Any = None, stride: IntOrPair = 1, padding: IntOrPair = 0,
           dilation: IntOrPair = 1, groups: int = 1, activation: str | None = None, alpha: float = 0.01, *,
           residual: Any = None, layout: str | None = None, out: Any = None, schedule: ScheduleArg = None,
           precision: str | None = None) -> Any:
    """2-D convolution, OIHW weights, fp32, fp16 or bf16 (fp32 accumulation).

    x: NCHW, or NHWC (a channels_last torch tensor, or any array of shape (N, H, W, C) with
    layout="nhwc"); y keeps x's memory format, and so should residual (a torch residual in the other
    format is taken, at the cost of one copy into x's). fp16 / bf16 run on the matrix cores
    (implicit GEMM) where the device has them.
    padding: an int, a pair (h, w) or four values (top, left, bottom, right) as in ONNX.
    activation: None, "relu" or "leaky_relu" (with `alpha`), fused into the epilogue.
    residual: an array shaped like the output, added before the activation
    (y = act(conv + bias + residual): ResNet's Add + Relu, fused on the matrix cores).
    precision: fp32 math, "highest" | "tf32" | "3xtf32"; None takes set_fp32_precision's mode.
    Ignored for fp16 / bf16 (exact on the matrix cores already).
    """
    if out is None and schedule is None and layout is None and (y := repeat_call(
            "conv2d", (x, w, bias, residual),
            (stride, padding, dilation, groups, activation, alpha, precision))) is not MISS:
        return y
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
             "activation": activation, "alpha": alpha, "precision": precision}
    return engine.run("conv2d", {"x": x, "w": w, "bias": bias, "residual": residual}, _with_layout(attrs, layout),
                      out=_out("y", out), schedule=schedule)


def attention(q: Any, k: Any, v: Any, mask: Any = None, causal: bool | str = False, scale: float | None = None, *,
              layout: str | None = None, out: Any = None, schedule: ScheduleArg = None,
              precision: str | None = None) -> Any:
    """softmax(scale * q k^T + mask) v for q of shape [B, Sq, D] or [B, H, Sq, D]; fp32, fp16 or bf16.

    k, v: [B, Sk, D] or [B, Hk, Sk, D] with Hk dividing H (grouped-query attention). mask: additive,
    float32 or q's dtype, broadcastable to [B, H, Sq, Sk]. scale: default 1/sqrt(D).
    Heads-inner storage is read in place: a torch tensor x.transpose(1, 2) of a contiguous
    [B, S, H, D] x (the result is then such a view too), or with layout="bshd" arrays whose own
    shapes are [B, Sq, H, D] and [B, Sk, Hk, D] (the result [B, Sq, H, D]), FlashAttention's layout.
    causal: True or "top_left" (key j visible to query i when j <= i, as torch SDPA's is_causal, also
    for Sq != Sk), or "bottom_right" (j <= i + Sk - Sq, for KV caches). Queries that see no key get 0.
    precision: fp32 math, "highest" | "tf32" | "3xtf32"; None takes set_fp32_precision's mode. "tf32"
    runs Q K^T and P V on the matrix cores with operands rounded to TF32 (fused_tf32); "3xtf32" and
    "highest" keep the exact fp32 kernels. Ignored for fp16 / bf16.
    D: 1..256. Algorithms: "fused_wgmma" (sm_90 only, fp16/bf16, D a multiple of 8 up to 256: Hopper's
    warpgroup MMA, picked for long prefill), "fused_mma" (fp16/bf16 on matrix cores: any D, padded inside
    the kernel; grouped-query heads packed and keys split across blocks for decoding), "fused_tf32" (fp32
    with precision "tf32" on matrix cores, any D), "fused", "three_stage", "naive".
    """
    if out is None and schedule is None and layout is None and (y := repeat_call(
            "attention", (q, k, v, mask), (causal, scale, precision))) is not MISS:
        return y
    return engine.run("attention", {"q": q, "k": k, "v": v, "mask": mask},
                      _with_layout({"causal": causal, "scale": scale, "precision": precision}, layout),
                      out=_out("out", out), schedule=schedule)


def batch_norm(x: Any, mean: Any, var: Any, gamma: Any, beta: Any, eps: float = 1e-5,
               activation: str | None = None, alpha: float = 0.01, *, layout: str | None = None,
               out: Any = None, schedule: ScheduleArg = None) -> Any:
    """Inference batch norm over axis 1 (NCHW or any rank >= 2), optional fused activation; fp32,
    fp16 or bf16 x, parameters in x's dtype or fp32. A channels_last x gives a channels_last
    result; layout="nhwc": a non-torch 4-d x is (N, H, W, C) (the result too)."""
    if out is None and schedule is None and layout is None and (y := repeat_call(
            "batch_norm", (x, mean, var, gamma, beta), (eps, activation, alpha))) is not MISS:
        return y
    return engine.run("batch_norm", {"x": x, "mean": mean, "var": var, "gamma": gamma, "beta": beta},
                      _with_layout({"eps": eps, "activation": activation, "alpha": alpha}, layout),
                      out=_out("y", out), schedule=schedule)


def group_norm(x: Any, num_groups: int, gamma: Any, beta: Any, eps: float = 1e-5, *, layout: str | None = None,
               out: Any = None, schedule: ScheduleArg = None) -> Any:
    """Group norm of NCHW input with per-channel gamma and beta; fp32, fp16 or bf16 x, parameters
    in x's dtype or fp32. A channels_last x is read in place (the NHWC kernels) and gives a
    channels_last result; layout="nhwc": a non-torch 4-d x is (N, H, W, C) (the result too)."""
    if out is None and schedule is None and layout is None and (y := repeat_call(
            "group_norm", (x, gamma, beta), (num_groups, eps))) is not MISS:
        return y
    return engine.run("group_norm", {"x": x, "gamma": gamma, "beta": beta},
                      _with_layout({"num_groups": num_groups, "eps": eps}, layout), out=_out("y", out),
                      schedule=schedule)


def _norm_out(out: Any, return_sum: bool) -> dict[str, Any] | None:
    """`out` of a norm: y, or with return_sum a pair (y, sum) (either may be None)."""
    if out is None:
        return None
    if not return_sum:
        return {"y": out}
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        from .errors import ArgumentError
        raise ArgumentError("out", "a pair (y, sum) when return_sum=True", type(out).__name__)
    return {"y": out[0], "sum": out[1]}


def layer_norm(x: Any, normalized_shape: int | Sequence[int], gamma: Any = None, beta: Any = None,
               eps: float = 1e-5, *, residual: Any = None, bias: Any = None, return_sum: bool = False,
               out: Any = None, schedule: ScheduleArg = None) -> Any:
    """Layer norm over the trailing `normalized_shape` dims; fp32, fp16 or bf16 x (fp32 statistics),
    gamma / beta in x's dtype or fp32.

    residual (x's shape and dtype) and bias (`normalized_shape`, x's dtype or fp32): normalize
    s = x + residual + bias instead of x, one kernel (ONNX's SkipLayerNormalization, a transformer's
    post-attention Add + LayerNorm). s is added in fp32 and rounded to x's dtype before the
    statistics, as torch's F.layer_norm(x + residual) sees it. return_sum=True returns (y, s): the
    next residual branch reads s. out: y, or the pair (y, s) with return_sum."""
    if out is None and schedule is None and (y := repeat_call(
            "layer_norm", (x, gamma, beta, residual, bias), (normalized_shape, eps, return_sum))) is not MISS:
        return y
    return engine.run("layer_norm", {"x": x, "gamma": gamma, "beta": beta, "residual": residual, "bias": bias},
                      {"normalized_shape": normalized_shape, "eps": eps, "return_sum": return_sum},
                      out=_norm_out(out, return_sum), schedule=schedule)


def rms_norm(x: Any, normalized_shape: int | Sequence[int], gamma: Any = None, eps: float = 1e-6, *,
             residual: Any = None, bias: Any = None, return_sum: bool = False,
             out: Any = None, schedule: ScheduleArg = None) -> Any:
    """RMS norm over the trailing `normalized_shape` dims; fp32, fp16 or bf16 x (fp32 accumulation),
    gamma in x's dtype or fp32. residual / bias / return_sum as in layer_norm (Llama's
    "h = h + attn; x = rms_norm(h)" in one kernel: return_sum=True gives (y, h))."""
    if out is None and schedule is None and (y := repeat_call(
            "rms_norm", (x, gamma, residual, bias), (normalized_shape, eps, return_sum))) is not MISS:
        return y
    return engine.run("rms_norm", {"x": x, "gamma": gamma, "residual": residual, "bias": bias},
                      {"normalized_shape": normalized_shape, "eps": eps, "return_sum": return_sum},
                      out=_norm_out(out, return_sum), schedule=schedule)


# The public functions as native entries (C callables that run a repeat call with no Python frame,
# and hand every other call to the functions above): see native_entry.py.
from .native_entry import native_entries as _native_entries  # noqa: E402

leaky_relu, conv2d, attention, batch_norm, group_norm, layer_norm, rms_norm = _native_entries(
    leaky_relu, conv2d, attention, batch_norm, group_norm, layer_norm, rms_norm)
