"""group_norm cases: the seed shape (256 x 64 x 56 x 56, G = 32) in fp32 and fp16, a Stable
Diffusion-like shape (8 x 320 x 64 x 64, G = 32: groups of 160 KB) and few large groups
(2 x 128 x 128 x 128, G = 8: the split path), against torch.nn.functional.group_norm."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ..ops import get_op
from ..ops.base import TensorSpec
from . import Case, Context
from .layer_norm import ROW_ALGORITHMS, norm_cases


def problems(ctx: Context) -> list[tuple[str, Any]]:
    op = get_op("group_norm")
    if not ctx.on_gpu:
        shapes = [((2, 64, 14, 14), 32, "float32")] + ([] if ctx.quick else [((1, 16, 32, 32), 2, "float16")])
    else:
        shapes = [((256, 64, 56, 56), 32, "float32"), ((256, 64, 56, 56), 32, "float16")]
        if not ctx.quick:
            shapes += [((8, 320, 64, 64), 32, "float32"), ((8, 320, 64, 64), 32, "float16"),
                       ((2, 128, 128, 128), 8, "float32")]
    out = []
    for shape, groups, dtype in shapes:
        p = TensorSpec((shape[1],), dtype)
        prob = op.make_problem({"x": TensorSpec(shape, dtype), "gamma": p, "beta": p}, {"num_groups": groups})
        out.append((f"{'x'.join(map(str, shape))} G={groups} {dtype}", prob))
    return out


def cases(ctx: Context) -> Iterator[Case]:
    def vendor(problem: Any) -> Callable[[dict[str, Any]], Any]:
        f = ctx.torch.nn.functional.group_norm
        return lambda ins: f(ins["x"], problem.groups, ins["gamma"], ins["beta"], problem.eps)

    yield from norm_cases(ctx, "group_norm", problems(ctx), ROW_ALGORITHMS, vendor)
