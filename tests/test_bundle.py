"""Compiled bundles: build, reload in a fresh process with zero compiles, mismatch errors, JIT fallback.

The round trip runs in a subprocess with an empty binary cache, so every kernel it loads must come
from the bundle (the loader's stats prove it); the host libraries (emulator runtime, ORT custom-op
library) are copied in beforehand because they are not kernels.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import jitops  # noqa: E402
from jitops import config  # noqa: E402
from jitops.bundle import BundleMismatch, loaded_bundles  # noqa: E402
from jitops.cache import loader  # noqa: E402
from jitops.errors import BackendUnavailable, JitopsError  # noqa: E402
from jitops.onnx.bundle_build import create_bundle  # noqa: E402
from jitops.onnx.testing import small_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _unload_bundles():
    yield
    for b in loaded_bundles():
        b.unload()
    assert loader().allow_compile


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "small.onnx"
    onnx.save(small_model(), path)
    return path


@pytest.fixture(scope="module")
def cpu_bundle(model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "small.jitops"
    create_bundle(model_path, ["cpu"], out, progress=False)
    return out


def _fresh_cache(tmp_path: Path) -> Path:
    """An empty binary cache holding only the prebuilt host libraries (not kernels)."""
    cache = tmp_path / "fresh-cache"
    shutil.copytree(config.cache_dir() / "native", cache / "native")
    return cache


def _run_fresh(tmp_path: Path, script: str, env: dict[str, str] | None = None) -> dict:
    full_env = {**os.environ, "JITOPS_CACHE_DIR": str(_fresh_cache(tmp_path)), "JITOPS_BACKEND": "cpu",
                "PYTHONPATH": str(REPO), **(env or {})}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         env=full_env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


RUN_MODEL = """
    import json, numpy as np, onnx, jitops, jitops.onnx as jo
    from jitops.cache import loader
    from jitops.onnx.testing import run_native, max_rel_error
    bundle = {load}
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = jo.session(str(bundle.model_path), providers=["CPUExecutionProvider"]).run(None, {{"x": x}})[0]
    ref = run_native(onnx.load({model!r}), {{"x": x}})[0]
    out = {{"error": max_rel_error(y, ref), "compiles": loader().stats.compiles,
           "bundle_hits": loader().stats.bundle_hits, "target": bundle.target.target}}
    try:
        jitops.leaky_relu(np.ones(12345, np.float16), 0.3)     # not in the bundle: strict mode refuses
        out["strict"] = "compiled"
    except jitops.JitopsError as exc:
        out["strict"] = str(exc)
    print(json.dumps(out))
"""


def test_round_trip_runs_the_model_with_zero_compiles(cpu_bundle, model_path, tmp_path):
    out = _run_fresh(tmp_path, RUN_MODEL.format(load=f"jitops.load_bundle({str(cpu_bundle)!r})",
                                                model=str(model_path)))
    assert out["compiles"] == 0 and out["bundle_hits"] >= 5 and out["target"] == "cpu"
    assert out["error"] < 1e-4
    assert "not in the loaded bundle" in out["strict"] and "fallback='jit'" in out["strict"]


def test_jitops_bundle_environment_variable(cpu_bundle, model_path, tmp_path):
    out = _run_fresh(tmp_path, RUN_MODEL.format(load="jitops.bundle.loaded_bundles()[0]", model=str(model_path)),
                     env={"JITOPS_BUNDLE": str(cpu_bundle)})
    assert out["compiles"] == 0 and out["error"] < 1e-4


def test_manifest_records_targets_kernels_and_schedules(cpu_bundle):
    m = json.loads((cpu_bundle / "manifest.json").read_text())
    assert m["jitops"] == jitops.__version__ and [t["target"] for t in m["targets"]] == ["cpu"]
    assert m["targets"][0]["compiler"] == jitops.get_backend("cpu").compiler_id()
    assert {p["op"] for p in m["problems"]} == {"conv2d", "group_norm", "leaky_relu", "layer_norm", "attention"}
    assert len(m["records"]) == len(m["problems"]) and all(r["schedule"]["algorithm"] for r in m["records"])
    for k in m["kernels"]:
        assert (cpu_bundle / k["file"]).stat().st_size == k["bytes"] and len(k["key"]) == 64
    assert (cpu_bundle / "model.onnx").is_file() and (cpu_bundle / m["native"]["file"]).is_file()


def test_bundle_records_are_found_for_every_op(cpu_bundle):
    """A loaded bundle's records choose the schedules again for every op, attention included, whose
    schedule space is past generation 0: the records carry the op's generation. (They once had none,
    so on reload a tuned attention schedule gave way to the heuristic, whose kernel the bundle did not
    hold: the GPU demo's step 6 failed so on an H100, 2026-11-26.)"""
    from jitops.ops import get_op
    from jitops.ops.base import Schedule
    from jitops.records import op_space, store
    m = json.loads((cpu_bundle / "manifest.json").read_text())
    assert all(r["space"] == op_space(get_op(r["op"])) for r in m["records"])
    assert op_space(get_op("attention")) >= 1          # the case that failed
    bundle = jitops.load_bundle(cpu_bundle)
    device = jitops.get_backend("cpu").device
    for r in m["records"]:
        found = store().lookup(device, r["op"], r["problem"], op_space(get_op(r["op"])))
        assert found is not None and found[1] == "bundle", (r["op"], found)
        assert found[0] == Schedule.from_dict(r["schedule"])
    bundle.unload()


def _copy_with(bundle: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "edited.jitops"
    shutil.copytree(bundle, copy)
    m = json.loads((copy / "manifest.json").read_text())
    change(m)
    (copy / "manifest.json").write_text(json.dumps(m))
    return copy


def test_version_mismatch_is_an_error_or_a_warning_with_jit(cpu_bundle, tmp_path):
    old = _copy_with(cpu_bundle, tmp_path, lambda m: m.update(jitops="0.0.1"))
    with pytest.raises(BundleMismatch, match=r"built by jitops 0\.0\.1.*fallback='jit'"):
        jitops.load_bundle(old)
    with pytest.warns(RuntimeWarning, match="compiling kernels just in time"):
        b = jitops.load_bundle(old, fallback="jit")
    assert b.target is None and loader().allow_compile and b not in loaded_bundles()


def test_arch_mismatch_names_both_sides(cpu_bundle, tmp_path):
    def to_sm90(m):
        m["targets"][0].update(target="sm_90", backend="cuda", arch="sm_90")
    other = _copy_with(cpu_bundle, tmp_path, to_sm90)
    with pytest.raises(BundleMismatch, match=r"built for sm_90 \(cuda, warp 32\); the active device is cpu"):
        jitops.load_bundle(other)
    with pytest.raises(BundleMismatch, match="warp 64"):
        jitops.load_bundle(cpu_bundle, backend=jitops.get_backend("cpu", warp_size=64))


def test_corrupt_kernel_is_detected(cpu_bundle, tmp_path):
    copy = _copy_with(cpu_bundle, tmp_path, lambda m: None)
    b = jitops.load_bundle(copy)
    key, entry = next(iter(b.kernels.items()))
    data = bytearray((copy / entry["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / entry["file"]).write_bytes(bytes(data))
    with pytest.raises(JitopsError, match="checksum"):
        b.lookup(key)
    b.unload()
    assert loader().allow_compile


def test_cli_bundles_for_offline_gpu_targets(model_path, tmp_path, capsys):
    from jitops.cli import main
    targets = []
    for t in ("sm_90", "gfx90a"):
        try:
            jitops.get_backend(target=t)
            targets.append(t)
        except BackendUnavailable:
            pass
    if not targets:
        pytest.skip("no offline GPU compiler here (NVRTC / hiprtc)")
    out = tmp_path / "gpu.jitops"
    assert main(["bundle", str(model_path), *sum((["--target", t] for t in targets), []), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert [t["target"] for t in m["targets"]] == targets and "load with: jitops.load_bundle" in text
    for k in m["kernels"]:
        assert (out / k["file"]).read_bytes()[:4] == b"\x7fELF"      # cubin / hsaco code objects
    with pytest.raises(BundleMismatch, match="the active device is cpu"):
        jitops.load_bundle(out)                                      # no such GPU here


def test_dynamic_model_needs_input_shapes(tmp_path):
    from jitops.onnx.testing import single_op_model
    model = single_op_model("LeakyRelu", {"x": ("N", 16)}, {}, output_shape=("N", 16))
    with pytest.raises(JitopsError, match="no node of this model runs on jitops"):
        create_bundle(model, ["cpu"], tmp_path / "a", progress=False)
    m = create_bundle(model, ["cpu"], tmp_path / "b", input_shapes={"x": (4, 16)}, progress=False)
    assert m["problems"][0]["problem"].startswith("leaky_relu:x=64")
    assert np.asarray(m["model"]["input_shapes"]["x"]).tolist() == [4, 16]


def test_input_shape_values_per_dim_make_shape_sets():
    from jitops.onnx.bundle_build import parse_input_shapes
    assert parse_input_shapes(["x=1x3x8x8"]) == {"x": (1, 3, 8, 8)}
    assert parse_input_shapes(["x=1,8x3x8x8", "m=2x3"]) == [{"x": (1, 3, 8, 8), "m": (2, 3)},
                                                             {"x": (8, 3, 8, 8), "m": (2, 3)}]
    assert parse_input_shapes(["x=1x4", "x=2x4"]) == [{"x": (1, 4)}, {"x": (2, 4)}]
    with pytest.raises(JitopsError, match="same number of shapes"):
        parse_input_shapes(["x=1,2,3x4", "m=1,2x4"])


def test_bundle_of_several_batch_sizes_serves_each_with_zero_compiles(tmp_path):
    """A symbolic-batch model bundled for batch 1 and 4: one rewritten model, kernels of both sizes."""
    from jitops.onnx.testing import single_op_model
    rng = np.random.default_rng(5)
    model = single_op_model("LayerNormalization", {"x": ("N", 24)},
                            {"s": rng.random(24).astype(np.float32) + 0.5, "b": rng.random(24).astype(np.float32)},
                            {"axis": -1}, opset=17, output_shape=("N", 24))
    path = tmp_path / "ln.onnx"
    onnx.save(model, path)
    out = tmp_path / "ln.jitops"
    m = create_bundle(path, ["cpu"], out, input_shapes=[{"x": (1, 24)}, {"x": (4, 24)}], progress=False)
    assert sorted(p["problem"].split(":")[1].split(",")[0] for p in m["problems"]) == ["x=1x24", "x=4x24"]
    assert m["model"]["input_shapes"] == [{"x": [1, 24]}, {"x": [4, 24]}]
    bundled = onnx.load(out / "model.onnx")
    assert bundled.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"     # still symbolic
    script = f"""
        import json, numpy as np, onnx, jitops, jitops.onnx as jo
        from jitops.cache import loader
        from jitops.onnx.testing import run_native, max_rel_error
        bundle = jitops.load_bundle({str(out)!r})
        sess = jo.session(str(bundle.model_path), providers=["CPUExecutionProvider"])
        errors = []
        for n in (1, 4):
            x = np.random.default_rng(n).standard_normal((n, 24)).astype(np.float32)
            ref = run_native(onnx.load({str(path)!r}), {{"x": x}})[0]
            errors.append(max_rel_error(sess.run(None, {{"x": x}})[0], ref))
        print(json.dumps({{"errors": errors, "compiles": loader().stats.compiles, "hits": loader().stats.bundle_hits}}))
    """
    res = _run_fresh(tmp_path, script)
    assert res["compiles"] == 0 and res["hits"] >= 1 and max(res["errors"]) < 1e-5
