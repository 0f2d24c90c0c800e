"""`jitops bundle MODEL.onnx --target ... -o DIR`: compile every kernel a model needs, for GPUs not present.

For each target the schedule of each problem is what this machine would pick for that device:
a tuning record (user, then shipped) where there is one, else the op's heuristic; the choice is
written into the bundle as a record, so the loading machine uses the very same schedules.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .. import engine
from .._version import __version__
from ..bundle import FORMAT, MANIFEST, MODEL, Target, target_of
from ..cache import loader
from ..errors import BackendUnavailable, JitopsError
from ..ops import get_op
from ..ops.base import parse_shape
from ..records import op_space
from ..runtime import get_backend
from ..runtime.hostcc import write_atomic
from .graph import load_model
from .nodes import NodeProblem, supported_nodes
from .rewrite import rewrite

log = logging.getLogger("jitops.bundle")


def backend_for_target(target: str) -> Any:
    """A backend compiling for `target`: sm_XX / gfxNNN offline, the emulator (cpu, cpu-w32, cpu-w64), or
    "device": the active device itself, planned with its exact properties (SM count, L2, shared memory)."""
    if target == "device":
        from ..runtime import current_backend
        return current_backend()
    if target == "cpu":
        return get_backend("cpu")
    if target.startswith("cpu-w"):
        return get_backend("cpu", warp_size=int(target[5:]))
    return get_backend(target=target)


def _record_arch(device: Any) -> str:
    try:
        from ..records import record_arch
        return record_arch(device)
    except ImportError:
        return device.arch


def _unique(problems: Iterable[NodeProblem]) -> list[tuple[str, Any, list[str]]]:
    seen: dict[tuple[str, str], tuple[str, Any, list[str]]] = {}
    for p in problems:
        entry = seen.setdefault((p.op, p.key), (p.op, p.problem, []))
        entry[2].extend(p.nodes)
    return list(seen.values())


def _progress(items: list, desc: str, enabled: bool | None) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    # None: a bar when stderr is a terminal (tqdm's rule), nothing in CI logs.
    return tqdm(items, desc=desc, unit="problem", disable=None if enabled is None else not enabled, leave=True,
                bar_format="{desc:<14} {bar:24} {n_fmt}/{total_fmt} [{elapsed}]{postfix}")


ShapeSet = Mapping[str, Sequence[int]]


def _concrete_problems(proto: Any, shape_sets: Sequence[ShapeSet | None], ops: Iterable[str] | None,
                       fuse: bool) -> list[NodeProblem]:
    """The node groups with concrete problems over every shape set (a symbolic model needs sizes)."""
    out: list[NodeProblem] = []
    symbolic: list[NodeProblem] = []
    for shapes in shape_sets:
        for p in supported_nodes(proto, shapes, ops, fuse):
            (out if p.problem is not None else symbolic).append(p)
    if not out and symbolic:
        raise JitopsError("bundle: no node of this model runs on jitops with concrete sizes: its inputs have "
                          "symbolic dimensions; give their sizes with --input-shape NAME=AxBxC (several values "
                          "per dim for several sizes, e.g. x=1,8,32x3x224x224) (see jitops.onnx.map_nodes)")
    return out


def create_bundle(model: Any, targets: Sequence[str], out_dir: str | Path,
                  input_shapes: ShapeSet | Sequence[ShapeSet] | None = None, ops: Iterable[str] | None = None,
                  fuse: bool = True, progress: bool | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Compile the kernels of `model` for each target into `out_dir`; returns the manifest.

    input_shapes: sizes for the model's symbolic dims, or a list of such sets (e.g. batch 1, 8 and
    32): the kernels of every set are compiled, and the bundled model keeps its symbolic dims, its
    ORT kernels planning per actual shape (so each set's records and kernels are found)."""
    if not targets:
        raise JitopsError("bundle: give at least one --target (sm_80, sm_90, gfx90a, gfx942, cpu, ...)")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite and not (out / MANIFEST).exists():
            raise JitopsError(f"bundle: {out} exists and is not a jitops bundle; choose an empty directory")
        shutil.rmtree(out)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    proto = load_model(model)
    sets: list[ShapeSet | None] = list(input_shapes) if isinstance(input_shapes, (list, tuple)) else [input_shapes]
    problems = _concrete_problems(proto, sets or [None], ops, fuse)
    unique = _unique(problems)
    if not unique:
        raise JitopsError("bundle: no node of this model runs on jitops (see jitops.onnx.map_nodes for why)")
    # One set: as before (sizes may fix e.g. SAME padding). Several: the symbolic model serves them all.
    rewritten = rewrite(proto, ops=ops, input_shapes=sets[0] if len(sets) == 1 else None, fuse=fuse)
    write_atomic(out / MODEL, rewritten.SerializeToString())
    manifest: dict[str, Any] = {
        "format": FORMAT, "jitops": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"file": MODEL, "source": str(model) if isinstance(model, (str, Path)) else "<ModelProto>",
                  "input_shapes": ({k: list(v) for k, v in (sets[0] or {}).items()} if len(sets) == 1 else
                                   [{k: list(v) for k, v in (s or {}).items()} for s in sets]),
                  "sha256": hashlib.sha256((out / MODEL).read_bytes()).hexdigest()},
        "problems": [{"op": op, "problem": p.key(), "nodes": nodes} for op, p, nodes in unique],
        "targets": [], "kernels": [], "records": [],
    }
    t_start = time.perf_counter()
    for name in targets:
        try:
            backend = backend_for_target(name)
        except BackendUnavailable as exc:
            raise JitopsError(f"bundle: cannot compile for {name}: {exc}") from exc
        target = target_of(backend, backend.device.arch if name == "device" else name)
        manifest["targets"].append(target.as_dict())
        bar = _progress(unique, f"bundle {target.target}", progress)
        for op_name, problem, _ in bar:
            _compile_problem(op_name, problem, backend, target, out, manifest)
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"{sum(k['target'] == target.target for k in manifest['kernels'])} kernels")
    _add_native_library(out, manifest)
    manifest["seconds"] = round(time.perf_counter() - t_start, 3)
    write_atomic(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    log.info("bundle %s: %d problems x %d targets, %d kernels", out, len(unique), len(targets),
             len(manifest["kernels"]))
    return manifest


def _compile_problem(op_name: str, problem: Any, backend: Any, target: Target, out: Path,
                     manifest: dict[str, Any]) -> None:
    op = get_op(op_name)
    schedule, origin = engine.select_schedule(op, problem, backend.device)
    plan = op.plan(problem, schedule, backend.device)
    for launch in (*plan.prepare, *plan.launches):
        source = engine.kernel_source(backend.device, launch)
        built = loader().binary(backend, source, [launch.kernel], f"{op_name}.{launch.kernel}")
        rel = f"kernels/{built.key}.bin"
        if not (out / rel).exists():
            write_atomic(out / rel, built.binary)
        manifest["kernels"].append({
            "key": built.key, "target": target.target, "op": op_name, "problem": problem.key(),
            "kernel": launch.kernel, "template": launch.template, "file": rel, "bytes": len(built.binary),
            "sha256": hashlib.sha256(built.binary).hexdigest(), "compile_seconds": round(built.compile_seconds, 4)})
    # The op's schedule-space generation, as a tuner stamps it: without it a loading process takes the
    # record for generation 0 and skips it for an op past that (attention), and the heuristic then asks
    # for a kernel the bundle does not hold whenever a tuned schedule was bundled.
    manifest["records"].append({
        "target": target.target, "arch": _record_arch(backend.device), "device": backend.device.key, "op": op_name,
        "problem": problem.key(), "schedule": schedule.as_dict(), "origin": origin, "jitops": __version__,
        "space": op_space(op)})


def _add_native_library(out: Path, manifest: dict[str, Any]) -> None:
    """Ship the ONNX Runtime custom-op library too, for hosts with no C++ compiler."""
    from .native import library_path, sources_digest
    try:
        lib = library_path()
    except (BackendUnavailable, JitopsError) as exc:
        log.warning("bundle: no custom-op library included (%s)", exc)
        return
    rel = "native/libjitops_ort.so"
    write_atomic(out / rel, lib.read_bytes())
    manifest["native"] = {"file": rel, "sources": sources_digest(), "platform": _platform()}


def _platform() -> str:
    import platform
    return f"{platform.system().lower()}-{platform.machine()}"


# ---------------------------------------------------------------- command line

def parse_input_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]] | list[dict[str, tuple[int, ...]]]:
    """['x=1x3x8x8'] -> {'x': (1, 3, 8, 8)}; several values per dim ('x=1,8x3x8x8') or a repeated
    name give several sets (a list), taken index by index across inputs (an input with one shape
    joins every set)."""
    per_input: dict[str, list[tuple[int, ...]]] = {}
    for item in items:
        if "=" not in item:
            raise JitopsError(f"--input-shape takes NAME=AxBxC, got '{item}'")
        name, dims = item.split("=", 1)
        options = [d.split(",") for d in dims.strip().lower().split("x")]
        for combo in itertools.product(*options):
            per_input.setdefault(name.strip(), []).append(parse_shape("x".join(combo)))
    count = max((len(v) for v in per_input.values()), default=1)
    if count == 1:
        return {n: v[0] for n, v in per_input.items()}
    uneven = {n: len(v) for n, v in per_input.items() if len(v) not in (1, count)}
    if uneven:
        raise JitopsError(f"--input-shape: inputs give {count} and {sorted(uneven.items())} shapes; give each "
                          f"input one shape or the same number of shapes")
    return [{n: v[i if len(v) > 1 else 0] for n, v in per_input.items()} for i in range(count)]


def cmd_bundle(args: argparse.Namespace) -> int:
    shapes = parse_input_shapes(args.input_shape)
    t0 = time.perf_counter()
    manifest = create_bundle(args.model, args.target, args.output, input_shapes=shapes,
                             ops=[o for part in (args.ops or []) for o in part.split(",") if o] or None,
                             fuse=not args.no_fuse, overwrite=args.force)
    kernels = manifest["kernels"]
    print(f"\nbundle {args.output}: {len(manifest['problems'])} problems, {len(kernels)} kernels, "
          f"{sum(k['bytes'] for k in kernels) / 1024:.0f} KiB, {time.perf_counter() - t0:.1f} s")
    for t in manifest["targets"]:
        mine = [k for k in kernels if k["target"] == t["target"]]
        origins: dict[str, int] = {}
        for r in manifest["records"]:
            if r["target"] == t["target"]:
                origins[r["origin"]] = origins.get(r["origin"], 0) + 1
        print(f"  {t['target']:<8} {t['backend']:<5} {t['compiler']:<40} {len(mine):>3} kernels  schedules: "
              + ", ".join(f"{n} {o}" for o, n in sorted(origins.items())))
    print(f"  model    {Path(args.output) / MODEL} (rewritten: jitops nodes with ONNX fallbacks)")
    print(f"load with: jitops.load_bundle({str(args.output)!r})  or  JITOPS_BUNDLE={args.output}")
    return 0


def add_subcommand(sub: Any) -> None:
    s = sub.add_parser("bundle", help="compile every kernel an ONNX model needs, for GPUs not present",
                       description="Example: jitops bundle model.onnx --target sm_90 --target gfx90a -o model.jitops")
    s.add_argument("model", help="the ONNX model")
    s.add_argument("--target", action="append", required=True,
                   help="sm_80, sm_90, gfx90a, gfx942, ...; 'device' for this machine's GPU with its exact "
                        "properties; cpu / cpu-w64 for the emulator (repeatable)")
    s.add_argument("-o", "--output", required=True, help="bundle directory to write")
    s.add_argument("--input-shape", action="append", default=[], metavar="NAME=AxBxC",
                   help="size of a model input with dynamic dimensions (repeatable); several values per "
                        "dim compile for each, e.g. x=1,8,32x3x224x224")
    s.add_argument("--ops", action="append", help="only these jitops ops (comma-separated or repeated)")
    s.add_argument("--no-fuse", action="store_true", help="no Conv+BN+activation or attention fusion")
    s.add_argument("--force", action="store_true", help="replace an existing directory")
    s.set_defaults(func=cmd_bundle)
