"""Autotuning: measure an op's candidate schedules on this device and keep the winner as a record.

    import jitops
    r = jitops.tune("leaky_relu", x=(1 << 24,), dtype="float32")       # from a problem spec
    r = jitops.tune("conv2d", x=x, w=w, padding=1)                     # from arrays (shapes only)
    print(r.schedule, r.time_us, r.speedup)

Later calls with the same problem on this device use the winner (user records in the cache
dir). Tuning a problem that already has a record for this device returns the record at once;
`force=True` measures again. See docs/tuning.md.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from ..ops import get_op
from ..ops.base import TensorSpec
from .tuner import CandidateResult, TuneOptions, TuneResult, tune_problems

__all__ = ["tune", "problem_from_args", "tune_problems", "TuneOptions", "TuneResult", "CandidateResult"]


def _is_array(v: Any) -> bool:
    return isinstance(v, TensorSpec) or (hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, type))


def _spec_text(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return "x".join(str(int(d)) for d in v) if all(isinstance(d, int) for d in v) else ",".join(map(str, v))
    return str(v)


def problem_from_args(op: ModuleType, problem: Any = None, **args: Any) -> Any:
    """A Problem from a Problem, from arrays (+ attributes, as the op's jitops function takes them),
    or from a spec (the `jitops compile` form: shapes as tuples or 'AxBxC' strings)."""
    if problem is not None:
        if args:
            raise TypeError("give either a problem or problem arguments, not both")
        return problem
    if any(k in op.INPUTS and _is_array(v) for k, v in args.items()):
        from ..arrays import wrap
        specs: dict[str, TensorSpec | None] = {}
        attrs: dict[str, Any] = {}
        for k, v in args.items():
            if k in op.INPUTS:
                if v is None or isinstance(v, TensorSpec):
                    specs[k] = v
                else:
                    ref = wrap(v, k, op.NAME)
                    specs[k] = TensorSpec(tuple(int(s) for s in ref.shape), ref.dtype, ref.layout, ref.pitch)
            else:
                attrs[k] = v
        return op.make_problem(specs, attrs)
    return op.parse_problem({k: _spec_text(v) for k, v in args.items()})


def tune(op: str | ModuleType, problem: Any = None, *, backend: Any = None, budget: float | None = 60.0,
         force: bool = False, save: bool = True, max_candidates: int | None = 256, workers: int | None = None,
         compile_timeout: float = 60.0, vendor: bool = False, progress: bool | None = None,
         **problem_args: Any) -> TuneResult:
    """Tune one problem of `op` on this device and record the winner (see the module docstring).

    budget: seconds for compile + timing (None: no limit); candidates not reached are skipped.
    force: measure again even when a record for this device exists.
    save: write the winner to the user records (and make later calls use it).
    """
    mod = get_op(op) if isinstance(op, str) else op
    prob = problem_from_args(mod, problem, **problem_args)
    opts = TuneOptions(budget_s=budget, force=force, save=save, max_candidates=max_candidates, workers=workers,
                       compile_timeout_s=compile_timeout, vendor=vendor, progress=progress)
    return tune_problems([(mod, prob)], backend=backend, options=opts)[0]
