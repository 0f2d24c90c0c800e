"""The public op functions. Each validates nothing itself: the op module and the engine do."""
from __future__ import annotations

from typing import Any

from . import engine
from .ops.base import Schedule

ScheduleArg = Schedule | str | None


def leaky_relu(x: Any, alpha: float = 0.01, *, out: Any = None, schedule: ScheduleArg = None) -> Any:
    """y = x if x > 0 else alpha * x (fp32 or fp16), as the same kind of array as x.

    `out` receives the result in place of a new array; `schedule` forces an algorithm
    ("vectorized", "naive") or a full Schedule.
    """
    return engine.run("leaky_relu", {"x": x}, {"alpha": alpha}, out={"y": out} if out is not None else None,
                      schedule=schedule)
