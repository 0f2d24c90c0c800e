"""rms_norm cases: 4096 x 4096 and 8192 tokens x hidden 1024 ... 8192, fp32, fp16 and bf16, against
torch.nn.functional.rms_norm; every algorithm when ctx.algorithms == "all"."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ..ops import get_op
from ..ops.base import TensorSpec
from . import Case, Context
from .layer_norm import ROW_ALGORITHMS, like_x, norm_cases, problems as layer_problems


def problems(ctx: Context) -> list[tuple[str, Any]]:
    op = get_op("rms_norm")
    out = []
    for label, lp in layer_problems(ctx):
        p = TensorSpec(lp.normalized_shape, lp.ptype)
        out.append((label, op.make_problem({"x": TensorSpec(lp.shape, lp.dtype), "gamma": p},
                                           {"normalized_shape": lp.normalized_shape, "eps": 1e-6})))
    return out


def cases(ctx: Context) -> Iterator[Case]:
    def vendor(problem: Any) -> Callable[[dict[str, Any]], Any]:
        f = ctx.torch.nn.functional.rms_norm
        return lambda ins: f(ins["x"], problem.normalized_shape, like_x(ins, "gamma"), problem.eps)

    yield from norm_cases(ctx, "rms_norm", problems(ctx), ROW_ALGORITHMS, vendor)
