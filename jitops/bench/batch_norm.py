"""batch_norm (inference) cases: the seed shape 256 x 64 x 56 x 56 in fp32, fp16 and bf16 (fp32
running statistics and affine, as models keep them), in NCHW and channels_last, and fp32 with a
fused ReLU against torch's batch_norm followed by relu; rank 2 (4096 x 4096) as well."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ..ops import get_op
from ..ops.base import TensorSpec
from . import Case, Context
from .layer_norm import norm_cases


def problems(ctx: Context) -> list[tuple[str, Any]]:
    op = get_op("batch_norm")
    if not ctx.on_gpu:
        shapes = [((4, 64, 28, 28), "float32", None, "")] + ([] if ctx.quick else [
            ((64, 256), "float16", "relu", ""), ((2, 24, 7, 7), "bfloat16", None, "nhwc")])
    else:
        seed = (256, 64, 56, 56)
        shapes = [(seed, "float32", None, ""), (seed, "float16", None, ""), (seed, "bfloat16", None, ""),
                  (seed, "float16", None, "nhwc"), (seed, "bfloat16", None, "nhwc")]
        if not ctx.quick:
            shapes += [(seed, "float32", "relu", ""), ((4096, 4096), "float32", None, "")]
    out = []
    for shape, dtype, act, layout in shapes:
        p = TensorSpec((shape[1],), "float32")
        prob = op.make_problem({"x": TensorSpec(shape, dtype, layout), "mean": p, "var": p, "gamma": p, "beta": p},
                               {"activation": act})
        out.append((f"{'x'.join(map(str, shape))} {dtype}" + (" channels_last" if layout else "")
                    + (f" +{act}" if act else ""), prob))
    return out


def cases(ctx: Context) -> Iterator[Case]:
    def vendor(problem: Any) -> Callable[[dict[str, Any]], Any]:
        F = ctx.torch.nn.functional

        def run(ins: dict[str, Any]) -> Any:
            y = F.batch_norm(ins["x"], ins["mean"], ins["var"], ins["gamma"], ins["beta"], training=False,
                             eps=problem.eps)
            return F.relu(y) if problem.activation == "relu" else y
        return run

    yield from norm_cases(ctx, "batch_norm", problems(ctx), ("naive",), vendor)
