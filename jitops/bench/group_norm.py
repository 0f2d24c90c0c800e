"""group_norm cases: the seed shape (256 x 64 x 56 x 56, G = 32) in fp32, fp16 and bf16, a Stable
Diffusion-like shape (8 x 320 x 64 x 64, G = 32: groups of 160 KB), few large groups
(2 x 128 x 128 x 128, G = 8: the split path), and SD-UNet shapes in channels_last (batch 2,
320-1280 channels, 8x8 to 64x64; fp16, bf16 and two fp32: the NHWC kernels), against
torch.nn.functional.group_norm on the same tensors (parameters in x's dtype for torch)."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ..ops import get_op
from ..ops.base import TensorSpec
from . import Case, Context
from .layer_norm import ROW_ALGORITHMS, like_x, norm_cases


def problems(ctx: Context) -> list[tuple[str, Any]]:
    op = get_op("group_norm")
    if not ctx.on_gpu:
        shapes = [((2, 64, 14, 14), 32, "float32", "")] + ([] if ctx.quick else [
            ((1, 16, 32, 32), 2, "float16", ""), ((2, 64, 8, 8), 32, "bfloat16", "nhwc")])
    else:
        shapes = [((256, 64, 56, 56), 32, dt, "") for dt in ("float32", "float16", "bfloat16")]
        shapes += [((2, 320, 64, 64), 32, dt, "nhwc") for dt in ("float16", "bfloat16")]
        if not ctx.quick:
            shapes += [((8, 320, 64, 64), 32, "float32", ""), ((8, 320, 64, 64), 32, "float16", ""),
                       ((2, 128, 128, 128), 8, "float32", "")]
            shapes += [(s, 32, dt, "nhwc") for s in ((2, 640, 32, 32), (2, 1280, 16, 16), (2, 1280, 8, 8),
                                                     (8, 320, 64, 64)) for dt in ("float16", "bfloat16")]
            shapes += [((2, 320, 64, 64), 32, "float32", "nhwc"), ((2, 640, 32, 32), 32, "float32", "nhwc")]
    out = []
    for shape, groups, dtype, layout in shapes:
        p = TensorSpec((shape[1],), "float32" if dtype == "bfloat16" else dtype)   # bf16: fp32 weights
        prob = op.make_problem({"x": TensorSpec(shape, dtype, layout), "gamma": p, "beta": p}, {"num_groups": groups})
        out.append((f"{'x'.join(map(str, shape))} G={groups} {dtype}" + (" channels_last" if layout else ""), prob))
    return out


def cases(ctx: Context) -> Iterator[Case]:
    def vendor(problem: Any) -> Callable[[dict[str, Any]], Any]:
        f = ctx.torch.nn.functional.group_norm
        return lambda ins: f(ins["x"], problem.groups, like_x(ins, "gamma"), like_x(ins, "beta"), problem.eps)

    yield from norm_cases(ctx, "group_norm", problems(ctx), ROW_ALGORITHMS, vendor)
