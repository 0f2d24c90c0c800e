"""`jitops tune MODEL.onnx`: --dry-run (no device), dynamic input shapes, a tiny end-to-end tune on the emulator."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from jitops.cli import main  # noqa: E402
from jitops.records import store  # noqa: E402
from jitops.tuning.model import collect, parse_input_shapes  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


pytestmark = pytest.mark.usefixtures("isolated")   # conftest: private records for every test


def _init(name: str, shape: tuple[int, ...], rng: np.random.Generator, positive: bool = False) -> object:
    v = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return numpy_helper.from_array(v.astype(np.float32), name)


def small_model(batch: object = "N") -> object:
    """Conv+BN+LeakyRelu, GroupNorm, LeakyRelu, LayerNorm and a MatMul/Softmax/MatMul attention."""
    rng = np.random.default_rng(0)
    inits = [_init("w", (8, 3, 3, 3), rng), _init("s", (8,), rng, True), _init("b", (8,), rng),
             _init("m", (8,), rng), _init("v", (8,), rng, True), _init("gs", (8,), rng, True),
             _init("gb", (8,), rng), _init("ls", (64,), rng, True), _init("lb", (64,), rng),
             numpy_helper.from_array(np.array([0, 8, 64], dtype=np.int64), "shape3"),
             numpy_helper.from_array(np.array(0.125, dtype=np.float32), "scale")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("LeakyRelu", ["bn"], ["a"], alpha=0.1),
        helper.make_node("GroupNormalization", ["a", "gs", "gb"], ["g"], num_groups=4),
        helper.make_node("LeakyRelu", ["g"], ["g2"], alpha=0.2),
        helper.make_node("Reshape", ["g2", "shape3"], ["t"]),                     # [N, 8, 64]
        helper.make_node("LayerNormalization", ["t", "ls", "lb"], ["ln"], axis=-1),
        helper.make_node("Transpose", ["ln"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["ln", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["qks"]),
        helper.make_node("Softmax", ["qks"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "ln"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "small",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, 64])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def test_parse_input_shapes():
    assert parse_input_shapes(["x=1x3x224x224", "ids=4x128"]) == {"x": (1, 3, 224, 224), "ids": (4, 128)}
    with pytest.raises(Exception, match="NAME=AxBxC"):
        parse_input_shapes(["1x3"])


def test_collect_unique_problems():
    problems, skipped = collect(small_model(), {"x": (2, 3, 8, 8)})
    ops = [p.op for p in problems]
    assert ops == ["conv2d", "group_norm", "leaky_relu", "layer_norm", "attention"]
    assert problems[0].onnx_ops == "Conv+BatchNormalization+LeakyRelu"
    assert all(p.count == 1 for p in problems) and skipped == []


def test_dry_run_lists_problems_without_a_device(tmp_path, capsys):
    path = tmp_path / "small.onnx"
    onnx.save(small_model(), str(path))
    assert main(["tune", str(path), "--dry-run", "--input-shape", "x=2x3x8x8", "--target", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100/H200 (offline target) (sm_90); 5 unique problems, 5 uses (11 ONNX nodes)" in out
    for op in ("conv2d", "group_norm", "leaky_relu", "layer_norm", "attention"):
        assert f" {op} " in out
    assert out.count("[heuristic]") == 5
    # A dynamic batch without --input-shape: a clear error naming the input and the flag.
    assert main(["tune", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "dynamic input dimensions" in err and "--input-shape x=1x3x8x8" in err


def test_dry_run_of_the_example_model(capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("make_model", EXAMPLES / "make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "unet.onnx"
    onnx.save(mod.build_model(size=32), str(path))
    problems, _ = collect(str(path), {"image": (2, 3, 32, 32)})
    conv_norm = [p for p in problems if p.op in ("conv2d", "batch_norm", "group_norm", "layer_norm", "rms_norm")]
    assert len(conv_norm) == 19 and {p.op for p in problems} >= {"conv2d", "group_norm", "layer_norm", "batch_norm",
                                                                  "leaky_relu", "attention"}
    assert main(["tune", str(path), "--dry-run", "--input-shape", "image=2x3x32x32"]) == 0
    assert "23 unique problems" in capsys.readouterr().out


def test_tune_tiny_model_on_the_emulator(tmp_path, capsys, isolated):
    """End to end: two LeakyRelu problems (one shared by two nodes), tuned, then answered from records."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1024])
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
             helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.3),     # same problem: alpha is an argument
             helper.make_node("Concat", ["b", "b"], ["c"], axis=1),
             helper.make_node("LeakyRelu", ["c"], ["d"], alpha=0.1)]
    graph = helper.make_graph(nodes, "tiny", [x], [helper.make_tensor_value_info("d", TensorProto.FLOAT, [4, 2048])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    args = ["tune", str(path), "--max-candidates", "3", "--workers", "2", "--budget", "0", "--no-vendor"]
    assert main(args + ["--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "2 unique problems, 3 uses (3 ONNX nodes)" in out and "2 tuned now, 0 from records" in out
    assert "geometric-mean speedup over the heuristic" in out and "0 problem(s) slower" in out
    assert len(store().user_records()) == 2
    assert main(args) == 0
    assert "0 tuned now, 2 from records" in capsys.readouterr().out
