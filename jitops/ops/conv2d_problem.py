"""conv2d problems: validation and normalisation of shapes and attributes.

Everything the scheduler and the plans need is derived here once (output size, channels per
group, GEMM extents), so the rest of the op reads plain fields.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ..arrays import same_memory_order
from ..errors import ArgumentError
from .base import FLOAT_DTYPES, ITEMSIZE, TensorSpec, parse_shape, parse_value, problem_key, \
    require_dtype, require_rank, require_same_dtype, resolve_precision

NAME = "conv2d"
ACTIVATIONS = ("relu", "leaky_relu")
DTYPES = FLOAT_DTYPES + ("bfloat16",)


@dataclass(frozen=True)
class Conv2dProblem:
    """NCHW input, OIHW weights, optional bias; fp32 or fp16 with fp32 accumulation."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]          # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int
    dtype: str
    has_bias: bool
    activation: str                         # "none" | "relu" | "leaky_relu"
    alpha: float
    has_residual: bool = False              # y = act(conv + bias + residual), residual shaped like y
    layout: str = ""                        # x, residual and y: "" NCHW, "nhwc" stored N, H, W, C
    precision: str = "highest"              # fp32 only (base.FP32_PRECISIONS); always "highest" for 16-bit types
    w_layout: str = ""                      # "nhwc": OIHW weights stored O, H, W, I (channels_last torch weights)
    residual_other_format: bool = False     # the residual stored NCHW where x is NHWC, or the reverse

    # ---- derived sizes
    @property
    def oh(self) -> int:
        return (self.h + self.pad[0] + self.pad[2] - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pad[1] + self.pad[3] - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    @property
    def gemm_k(self) -> int:
        """Reduction length of one output: input channels per group times kernel taps."""
        return self.cin_g * self.kh * self.kw

    @property
    def pixels(self) -> int:
        """Output pixels over the batch: the GEMM's N."""
        return self.n * self.oh * self.ow

    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 flops, as vendors count them (bias and activation not counted)."""
        return 2 * self.pixels * self.cout * self.gemm_k

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: the input is the GEMM's B matrix as it lies."""
        return (self.kh, self.kw) == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0, 0, 0)

    @property
    def winograd_ok(self) -> bool:
        return (self.kh, self.kw) == (3, 3) and self.stride == (1, 1) and self.dilation == (1, 1) \
            and self.groups == 1

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def io_bytes(self) -> int:
        """The fewest bytes a direct kernel moves: x read once, y (and the residual) once."""
        y = self.n * self.cout * self.oh * self.ow * (2 if self.has_residual else 1)
        return (self.n * self.cin * self.h * self.w + y) * self.itemsize

    def inputs(self) -> dict[str, TensorSpec]:
        out = {"x": TensorSpec((self.n, self.cin, self.h, self.w), self.dtype, self.layout),
               "w": TensorSpec((self.cout, self.cin_g, self.kh, self.kw), self.dtype, self.w_layout)}
        if self.has_bias:
            out["bias"] = TensorSpec((self.cout,), self.dtype)
        if self.has_residual:
            r = self.outputs()["y"]
            out["residual"] = replace(r, layout="" if self.layout else "nhwc") if self.residual_other_format else r
        return out

    def outputs(self) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((self.n, self.cout, self.oh, self.ow), self.dtype, self.layout)}

    def key(self) -> str:
        attrs = {"stride": list(self.stride), "pad": list(self.pad), "dilation": list(self.dilation),
                 "groups": self.groups, "activation": self.activation}
        if self.precision != "highest":
            attrs["precision"] = self.precision
        return problem_key(NAME, self.inputs(), attrs)

    def describe(self) -> str:
        s = f"{self.n}x{self.cin}x{self.h}x{self.w} * {self.cout}x{self.cin_g}x{self.kh}x{self.kw}"
        if self.stride != (1, 1):
            s += f" stride {self.stride[0]},{self.stride[1]}"
        if any(self.pad):
            s += f" pad {','.join(map(str, self.pad))}"
        if self.dilation != (1, 1):
            s += f" dilation {self.dilation[0]},{self.dilation[1]}"
        if self.groups != 1:
            s += f" groups {self.groups}"
        if self.has_residual:
            s += " + residual"
        if self.layout:
            s += f" {self.layout}"
        if self.precision != "highest":
            s += f" precision {self.precision}"
        if self.w_layout:
            s += f" weights {self.w_layout}"
        if self.residual_other_format:
            s += f" residual {'nchw' if self.layout else 'nhwc'}"
        return s + f" {self.dtype}"


# ---------------------------------------------------------------- validation

def _int(value: Any) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


def _pair(name: str, value: Any, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints, each >= minimum."""
    items = (value, value) if _int(value) is not None else value
    ok = isinstance(items, (tuple, list)) and len(items) == 2 and all(_int(v) is not None for v in items)
    if not ok:
        raise ArgumentError(name, "an int or a pair of ints (h, w)", repr(value), op=NAME)
    pair = (int(items[0]), int(items[1]))
    if min(pair) < minimum:
        raise ArgumentError(name, f"values >= {minimum}", repr(value), op=NAME)
    return pair


def _padding(value: Any) -> tuple[int, int, int, int]:
    """int, (h, w) or (top, left, bottom, right) as in ONNX's pads (begin values, then end values)."""
    if _int(value) is not None:
        items: Any = (value,) * 4
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        items = (value[0], value[1], value[0], value[1])
    else:
        items = value
    if not (isinstance(items, (tuple, list)) and len(items) == 4 and all(_int(v) is not None for v in items)):
        raise ArgumentError("padding", "an int, a pair (h, w) or four ints (top, left, bottom, right)",
                            repr(value), op=NAME)
    pads = tuple(int(v) for v in items)
    if min(pads) < 0:
        raise ArgumentError("padding", "non-negative values", repr(value), op=NAME)
    return pads  # type: ignore[return-value]


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> Conv2dProblem:
    x, w, bias, residual = inputs.get("x"), inputs.get("w"), inputs.get("bias"), inputs.get("residual")
    if x is None:
        raise ArgumentError("x", "an NCHW tensor", None, op=NAME)
    if w is None:
        raise ArgumentError("w", "an OIHW weight tensor", None, op=NAME)
    require_dtype(NAME, "x", x, DTYPES)
    require_rank(NAME, "x", x, 4)
    require_same_dtype(NAME, "w", w, x, "x")
    require_rank(NAME, "w", w, 4)
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape

    groups = attrs.get("groups", 1)
    if _int(groups) is None or groups < 1:
        raise ArgumentError("groups", "a positive int", repr(groups), op=NAME)
    groups = int(groups)
    if cin == 0 or cin % groups:
        raise ArgumentError("groups", f"a divisor of the input channels (x.shape[1] = {cin}), non-zero",
                            groups, op=NAME)
    if cout == 0 or cout % groups:
        raise ArgumentError("groups", f"a divisor of the output channels (w.shape[0] = {cout}), non-zero",
                            groups, op=NAME)
    if cin_g * groups != cin:
        raise ArgumentError("w", f"w.shape[1] = in_channels / groups = {cin} / {groups} = {cin // groups}",
                            f"shape {tuple(w.shape)}", op=NAME)
    if kh == 0 or kw == 0:
        raise ArgumentError("w", "a kernel of at least 1x1", f"shape {tuple(w.shape)}", op=NAME)
    if bias is not None:
        require_same_dtype(NAME, "bias", bias, x, "x")
        if tuple(bias.shape) != (cout,):
            raise ArgumentError("bias", f"shape ({cout},) (one value per output channel)",
                                f"shape {tuple(bias.shape)}", op=NAME)

    stride = _pair("stride", attrs.get("stride", 1), 1)
    dilation = _pair("dilation", attrs.get("dilation", 1), 1)
    pad = _padding(attrs.get("padding", 0))
    extent = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
    # A pad beyond the dilated kernel extent only adds outputs that see nothing but zeros.
    for side, p, e in zip(("top", "left", "bottom", "right"), pad, extent * 2):
        if p > e:
            raise ArgumentError("padding", f"{side} padding at most dilation * (kernel - 1) = {e}", p, op=NAME)

    activation = attrs.get("activation", None)
    if activation is None or activation == "none":
        activation = "none"
    elif activation not in ACTIVATIONS:
        raise ArgumentError("activation", "None, 'relu' or 'leaky_relu'", repr(activation), op=NAME)
    alpha = attrs.get("alpha", 0.01)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)) \
            or not np.isfinite(float(alpha)):
        raise ArgumentError("alpha", "a finite real number", repr(alpha), op=NAME)

    precision = resolve_precision(NAME, attrs.get("precision", None), x.dtype)

    p = Conv2dProblem(int(n), int(cin), int(h), int(wd), int(cout), int(kh), int(kw), stride, pad, dilation,
                      groups, x.dtype, bias is not None, activation,
                      float(alpha) if activation == "leaky_relu" else 0.0, residual is not None,
                      getattr(x, "layout", ""), precision, getattr(w, "layout", ""))
    if p.oh < 1 or p.ow < 1:
        raise ArgumentError("x", f"a padded input of at least the dilated kernel size "
                                 f"({extent[0] + 1}x{extent[1] + 1}); output would be {p.oh}x{p.ow}",
                            f"input {h}x{wd} with padding {pad}", op=NAME)
    if residual is not None:
        require_same_dtype(NAME, "residual", residual, x, "x")
        if tuple(residual.shape) != (p.n, p.cout, p.oh, p.ow):
            raise ArgumentError("residual", f"the output's shape ({p.n}, {p.cout}, {p.oh}, {p.ow})",
                                f"shape {tuple(residual.shape)}", op=NAME)
        # one pixel per image (or one channel) stores NCHW and NHWC alike: either is the layout of x; the other
        # format is taken too, copied into x's before the kernels read it (one more pass over the residual)
        r_layout = getattr(residual, "layout", "")
        if not same_memory_order(tuple(residual.shape), r_layout, p.layout):
            if r_layout not in ("", "nhwc"):
                raise ArgumentError("residual", f"an NCHW or NHWC tensor like x ({p.layout or 'NCHW'})", r_layout,
                                    op=NAME)
            p = replace(p, residual_other_format=True)
    return p


def parse_problem(spec: Mapping[str, str]) -> Conv2dProblem:
    """`jitops compile conv2d x=1x64x56x56 w=128x64x3x3 padding=1 [bias=1] [dtype=float16] ...`"""
    known = {"x", "w", "bias", "residual", "layout", "dtype", "stride", "padding", "dilation", "groups", "activation",
             "alpha", "precision"}
    extra = set(spec) - known
    if extra:
        raise ArgumentError(sorted(extra)[0], f"one of {', '.join(sorted(known))}", op=NAME)
    if "x" not in spec or "w" not in spec:
        raise ArgumentError("x" if "x" not in spec else "w", "a shape, e.g. x=1x64x56x56 w=128x64x3x3", op=NAME)
    dtype = spec.get("dtype", "float32")
    layout = spec.get("layout", "")
    if layout not in ("", "nchw", "nhwc"):
        raise ArgumentError("layout", "nchw or nhwc (x given as N x C x H x W either way)", layout, op=NAME)
    x = TensorSpec(parse_shape(spec["x"]), dtype, "nhwc" if layout == "nhwc" else "")
    w = TensorSpec(parse_shape(spec["w"]), dtype)
    bias_flag = str(spec.get("bias", "0")).lower() in ("1", "true", "yes")
    bias = TensorSpec((w.shape[0],), dtype) if bias_flag and len(w.shape) == 4 else None
    attrs: dict[str, Any] = {}
    residual_flag = str(spec.get("residual", "0")).lower() in ("1", "true", "yes")
    for key in ("stride", "padding", "dilation", "groups"):
        if key in spec:
            attrs[key] = parse_value(spec[key])
    if "activation" in spec:
        attrs["activation"] = None if spec["activation"] in ("none", "None") else spec["activation"]
    if "alpha" in spec:
        attrs["alpha"] = float(spec["alpha"])
    if "precision" in spec:
        attrs["precision"] = spec["precision"]
    p = make_problem({"x": x, "w": w, "bias": bias}, attrs)
    if residual_flag:
        p = make_problem({"x": x, "w": w, "bias": bias, "residual": p.outputs()["y"]}, attrs)
    return p
