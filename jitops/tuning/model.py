"""`jitops tune MODEL.onnx`: the unique jitops problems of a model, tuned within one budget.

Which nodes jitops runs, and as which problems, is decided in one place: jitops.onnx.nodes
(map_nodes, shared with the ONNX rewrite and bundles), so the records tuned here are exactly the
ones the rewritten model looks up (fused Conv+BatchNorm+activation included). This module adds
what tuning needs on top: dynamic-dimension checks, de-duplication with counts, and the run.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ArgumentError, JitopsError
from ..ops import get_op
from ..ops.base import parse_shape
from .tuner import TuneOptions, TuneResult, tune_problems

log = logging.getLogger("jitops.tune")


@dataclass
class ModelProblem:
    """One unique problem of the model and the nodes that share it."""

    op: str
    problem: Any
    nodes: list[str] = field(default_factory=list)
    onnx_ops: str = ""
    count: int = 0                      # places in the model (node groups) that run this problem


@dataclass
class Skipped:
    """Nodes jitops recognises but will not run, and why."""

    nodes: list[str]
    onnx_ops: str
    reason: str


@dataclass
class ModelReport:
    path: str
    problems: list[ModelProblem]
    skipped: list[Skipped]
    results: list[TuneResult] = field(default_factory=list)
    seconds: float = 0.0


def parse_input_shapes(items: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """['x=1x3x224x224', ...] -> {'x': (1, 3, 224, 224)}."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, sep, shape = item.rpartition("=")
        if not sep or not name:
            raise ArgumentError("--input-shape", "NAME=AxBxC (e.g. image=1x3x224x224)", item)
        out[name.strip()] = parse_shape(shape.strip())
    return out


def _load(model: Any) -> Any:
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise JitopsError(f"no ONNX model at {path}")
    return onnx.load(str(path))


def missing_dims(model: Any, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, list[str]]:
    """Graph inputs (not initializers) with dimensions that are unknown and not given by the user."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, list[str]] = {}
    for inp in model.graph.input:
        if inp.name in inits or inp.name in input_shapes or not inp.type.HasField("tensor_type"):
            continue
        dims = inp.type.tensor_type.shape.dim
        names = [str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                 for d in dims]
        if any(not n.isdigit() for n in names):
            out[inp.name] = names
    return out


def collect(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None
            ) -> tuple[list[ModelProblem], list[Skipped]]:
    """Unique problems (in graph order, with the nodes that share each) and the nodes left to ONNX."""
    try:
        from ..onnx.nodes import map_nodes
    except ImportError as exc:
        raise JitopsError(f"tuning a model needs jitops.onnx and the onnx package ({exc})") from exc
    proto = _load(model)
    shapes = dict(input_shapes or {})
    missing = missing_dims(proto, shapes)
    if missing:
        example = " ".join(f"--input-shape {n}={'x'.join(d if d.isdigit() else '1' for d in dims)}"
                           for n, dims in missing.items())
        raise JitopsError("the model has dynamic input dimensions; give their sizes: "
                          + "; ".join(f"{n} [{', '.join(d)}]" for n, d in missing.items())
                          + f"  (e.g. {example})")
    unique: dict[tuple[str, str], ModelProblem] = {}
    skipped: list[Skipped] = []
    for np_ in map_nodes(proto, shapes):
        ops = "+".join(np_.onnx_ops)
        if np_.problem is None:
            skipped.append(Skipped(list(np_.nodes), ops, np_.reason or np_.describe()))   # symbolic sizes
            continue
        k = (np_.op, np_.problem.key())
        entry = unique.setdefault(k, ModelProblem(np_.op, np_.problem, onnx_ops=ops))
        entry.nodes += list(np_.nodes)
        entry.count += 1
    return list(unique.values()), skipped


def tune_model(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
               options: TuneOptions | None = None, backend: Any = None) -> ModelReport:
    """Tune every unique problem of the model on this device, within options.budget_s."""
    t0 = time.monotonic()
    problems, skipped = collect(model, input_shapes)
    report = ModelReport(str(model) if not hasattr(model, "graph") else "<model>", problems, skipped)
    items = [(get_op(p.op), p.problem) for p in problems]
    log.info("%d unique problems (%d nodes); %d node groups stay ONNX", len(problems),
             sum(p.count for p in problems), len(skipped))
    report.results = tune_problems(items, backend=backend, options=options) if items else []
    report.seconds = time.monotonic() - t0
    return report
