"""The op registry: every list of ops derives from jitops.ops (OP_MODULES + each module's
REGISTRATION), and whatever an op declares exists. A throwaway op registered here shows that
adding an op is its module plus one registration line."""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import numpy as np
import pytest

import jitops.ops as ops
from jitops import bench, engine
from jitops.ops.base import Registration, TensorSpec
from jitops.tuning import shipped, vendor


def registry_errors(op: str) -> list[str]:
    """What `op` declares but is missing (empty: consistent)."""
    errors = []
    mod = ops.get_op(op)
    if getattr(mod, "NAME", None) != op:
        errors.append(f"{op}: its module's NAME is {getattr(mod, 'NAME', None)!r}")
    reg = ops.registration(op)
    bench_name = ops.bench_module(op)
    if bench_name is not None:
        try:
            b = importlib.import_module(bench_name)
        except ImportError as exc:
            return errors + [f"{op}: bench module {bench_name} does not import ({exc})"]
        if not callable(getattr(b, "cases", None)):
            errors.append(f"{op}: bench module {bench_name} has no cases(ctx)")
    for what, ref in (("tuning_problems", reg.tuning_problems), ("vendor", reg.vendor)):
        if ref:
            try:
                if not callable(ops.resolve(ref)):
                    errors.append(f"{op}: {what} {ref} is not callable")
            except (ImportError, AttributeError, ValueError) as exc:
                errors.append(f"{op}: {what} {ref} does not resolve ({exc})")
    if reg.onnx:
        from jitops.onnx import matchers, optypes
        errors += [f"{op}: ONNX op {o} has no matcher" for o in reg.onnx if o not in matchers.MATCHERS]
        if not any(t.op == op for t in optypes.OP_TYPES.values()):
            errors.append(f"{op}: no jitops node type in onnx/optypes.OP_TYPES runs it")
    return errors


@pytest.mark.parametrize("op", ops.op_names())
def test_every_declaration_exists(op):
    assert registry_errors(op) == []


def test_derived_lists_follow_the_registry():
    names = ops.op_names()
    assert names == sorted(ops.OP_MODULES) and len(names) >= 7
    assert bench.bench_ops() == [op for op in names if ops.registration(op).bench is not None]
    problem_ops = {mod.NAME for _, mod, _ in shipped.benchmark_problems()}
    assert problem_ops == set(bench.bench_ops())
    for op in names:
        assert (vendor.builder(op) is not None) == bool(ops.registration(op).vendor)


def test_onnx_tables_match_the_registry():
    """Every matched ONNX op is declared by exactly one op, and every jitops node type has an op, an
    attribute converter and a fallback body."""
    from jitops.onnx import matchers, optypes
    table = matchers.onnx_to_op()
    assert set(table) == set(matchers.MATCHERS)
    for t in optypes.OP_TYPES.values():
        assert t.op in ops.op_names() and t.op in optypes._CONVERT, t.name
    pytest.importorskip("onnx")
    from jitops.onnx.functions import function_for
    for name in optypes.OP_TYPES:
        assert function_for(name, 21).name == name


def test_an_undeclared_onnx_mapping_fails():
    with pytest.raises(ValueError, match="declared by both"):
        _with_op("tiny_twice", Registration(bench=None, onnx=("LeakyRelu",)), ops.onnx_ops)


# ---- a throwaway op: leaky_relu's functions under another name, with its own bench module

BENCH_MODULE = "jitops_test_tiny_bench"
TINY = "tiny_relu"


def _tiny_bench() -> types.ModuleType:
    b = types.ModuleType(BENCH_MODULE)
    op = lambda: ops.get_op(TINY)    # noqa: E731

    def problems(ctx: Any = None) -> list[tuple[str, Any]]:
        return [("n=300", op().make_problem({"x": TensorSpec((300,), "float32")}, {"alpha": 0.25}))]

    def cases(ctx: Any):
        x = np.random.default_rng(3).standard_normal(300).astype(np.float32) - 0.1
        ref = np.where(x > 0, x, 0.25 * x.astype(np.float64))

        def check() -> float:
            y = engine.run(TINY, {"x": x}, {"alpha": 0.25})
            err = float(np.abs(y - ref).max())
            assert err <= 1e-6, err
            return err
        yield bench.Case(TINY, "n=300", "heuristic", jitops=lambda: engine.run(TINY, {"x": x}, {"alpha": 0.25}),
                         check=check, repeats=2)

    b.problems, b.cases = problems, cases
    b.vendor = lambda p, t, torch: (lambda: None)
    return b


def _tiny_module(registration: Registration, name: str = TINY) -> types.ModuleType:
    lr = ops.get_op("leaky_relu")
    mod = types.ModuleType(f"jitops_test_{name}")
    for attr in ("INPUTS", "make_problem", "parse_problem", "heuristic", "candidates", "plan", "variants",
                 "reference", "random_inputs", "tolerance"):
        setattr(mod, attr, getattr(lr, attr))
    mod.NAME = name
    mod.REGISTRATION = registration
    return mod


def _with_op(name: str, registration: Registration, fn: Any) -> Any:
    ops.register(name, _tiny_module(registration, name))      # the one registration line
    try:
        return fn()
    finally:
        ops.unregister(name)


def test_a_new_op_is_one_registration_line(monkeypatch):
    monkeypatch.setitem(sys.modules, BENCH_MODULE, _tiny_bench())
    reg = Registration(bench=BENCH_MODULE, tuning_problems=f"{BENCH_MODULE}:problems", vendor=f"{BENCH_MODULE}:vendor",
                       onnx=("TinyRelu",))

    def everywhere() -> None:
        assert TINY in ops.op_names() and ops.get_op(TINY).NAME == TINY
        order = bench.bench_ops()
        assert TINY in order and order == sorted(order)
        assert [(n, m.NAME) for n, m, _ in shipped.benchmark_problems([TINY])] == [("n=300", TINY)]
        assert vendor.builder(TINY) is sys.modules[BENCH_MODULE].vendor
        from jitops.onnx import matchers
        assert matchers.onnx_to_op()["TinyRelu"] == TINY
        # the declared ONNX type has no matcher: the registry check names it
        assert registry_errors(TINY) == [f"{TINY}: ONNX op TinyRelu has no matcher",
                                         f"{TINY}: no jitops node type in onnx/optypes.OP_TYPES runs it"]
        lines: list[str] = []
        report = bench.run(ops=[TINY], quick=True, echo=lines.append)     # runs and checks it (emulator)
        assert [r["op"] for r in report["rows"]] == [TINY] and report["rows"][0]["error"] <= 1e-6

    _with_op(TINY, reg, everywhere)
    assert TINY not in ops.op_names() and TINY not in bench.bench_ops()


def test_a_missing_bench_module_is_named():
    reg = Registration(bench="jitops.bench.no_such_module")
    errors = _with_op("tiny_nobench", reg, lambda: registry_errors("tiny_nobench"))
    assert len(errors) == 1 and "jitops.bench.no_such_module does not import" in errors[0]
    with pytest.raises(ImportError):
        _with_op("tiny_nobench", reg, lambda: bench.run(ops=["tiny_nobench"], quick=True, echo=lambda s: None))
