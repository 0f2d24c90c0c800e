"""Real exported models through jitops.onnx: what is taken with a symbolic batch, what is not and why.

    python3 scripts/onnx_models.py [--opset 17 --opset 14] [--dynamo] [--json out.json] [--models resnet50,...]

Exports torchvision ResNet-50, MobileNet-V3 (large), ConvNeXt-T and ViT-B/16 (random weights; needs
torchvision), a BERT-base-style encoder (jitops/onnx/corpus.py at width 768, 12 heads, 12 layers) and
two decoders (DECODERS: GPT-2-small-sized blocks with a tril buffer, Llama-style layers with GQA)
with `torch.onnx.export(..., dynamo=False, dynamic_axes=...)`, then for each model: map_nodes and
rewrite with no input_shapes (timed), every Conv / BatchNormalization / GroupNormalization /
LayerNormalization / RMSNormalization / LeakyRelu / Softmax of the exported graph accounted for (taken
in a jitops group, or a stated reason), crashes counted, and the rewritten model's fallback bodies
checked against ORT on the original at batch 2 (ORT CPU, float32).
"""
from __future__ import annotations

import argparse
import io
import json
import time
import traceback
import warnings

import numpy as np

WATCHED = {"Conv", "BatchNormalization", "GroupNormalization", "LayerNormalization", "RMSNormalization",
           "LeakyRelu", "Softmax", "Attention", "InstanceNormalization"}
TORCHVISION = ("resnet50", "mobilenet_v3_large", "convnext_tiny", "vit_b_16")
# Decoders from jitops/onnx/corpus.py at real widths: (builder, width, exported sequence length)
DECODERS = {
    # GPT-2-small-sized: 12 heads of 64, the tril buffer (1024 positions) + masked_fill, 4 blocks
    "gpt2_small": (lambda c: _stack(c.gpt_like(768, 12, 1024), 4), 768, 16),
    # Llama-style at 1024 wide: 16 heads of 64, 4 kv heads (repeat_kv), rotary, SDPA(is_causal), 4 layers
    "llama_1b_like": (lambda c: c.llama_like(1024, 16, 4, 2048, layers=4), 1024, 16),
}


def _stack(block, n: int):
    """n copies of one block, one after another (random weights: the export's patterns are what count)."""
    import copy

    import torch
    return torch.nn.Sequential(*(copy.deepcopy(block) for _ in range(n)))


def export(name: str, opset: int, dynamo: bool = False, dtype: str = "float32",
           device: str = "cpu") -> tuple[bytes, dict[str, np.ndarray]]:
    """The model exported with a symbolic batch (and sequence), and example feeds. dtype="float16"
    exports a half-precision model (weights and activations; export it on "cuda" where CPU kernels
    lack half support)."""
    import torch
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name in DECODERS:
        from jitops.onnx import corpus
        build, width, seq = DECODERS[name]
        model, names = build(corpus).eval(), ["x"]
        example = (torch.randn(2, seq, width),)
        axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch"}}
        feeds = {"x": rng.standard_normal((2, seq, width)).astype(np.float32)}
    elif name == "bert_base":
        from jitops.onnx import corpus
        width, heads, layers, seq = 768, 12, 12, 16

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList(corpus.bert_like(width, heads) for _ in range(layers))

            def forward(self, x, mask):
                for layer in self.layers:
                    x = layer(x, mask)
                return x

        model, names = Encoder().eval(), ["x", "mask"]
        example = (torch.randn(2, seq, width), torch.ones(2, seq))   # 2: torch.export specialises a 1
        axes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}, "y": {0: "batch"}}
        mask = np.ones((2, seq), np.float32)
        mask[:, -3:] = 0
        feeds = {"x": rng.standard_normal((2, seq, width)).astype(np.float32), "mask": mask}
    else:
        import torchvision
        model, names = getattr(torchvision.models, name)().eval(), ["x"]
        for p in model.parameters():        # ViT's head starts at zero: its output would compare vacuously
            if p.dim() > 1 and not p.detach().abs().sum():
                torch.nn.init.normal_(p, std=0.02)
        example = (torch.randn(2, 3, 224, 224),)
        axes = {"x": {0: "batch"}, "y": {0: "batch"}}
        feeds = {"x": rng.standard_normal((2, 3, 224, 224)).astype(np.float32)}
    if dtype != "float32":
        model = model.to(device=device, dtype=getattr(torch, dtype))
        example = tuple(t.to(device=device, dtype=getattr(torch, dtype)) for t in example)
        feeds = {k: v.astype(dtype) for k, v in feeds.items()}
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:      # torch.export's exporter (torch's default since 2.9; needs onnxscript), its own opset
            dims = {n: torch.export.Dim(n, min=1 if n == "batch" else 2, max=512) for a in axes.values()
                    for n in a.values()}
            program = torch.onnx.export(model, example, dynamo=True, input_names=names, dynamic_shapes=tuple(
                {i: dims[n] for i, n in axes[k].items()} for k in names))
            return program.model_proto.SerializeToString(), feeds
        torch.onnx.export(model, example, buf, input_names=names, output_names=["y"], dynamic_axes=axes,
                          opset_version=opset, dynamo=False)
    return buf.getvalue(), feeds


def account(model, groups) -> dict:
    """Every watched node of the graph: taken (in a supported group), left with a reason, or missed."""
    from jitops.onnx.nodes import _node_id
    covered = {}
    for p in groups:
        for n in p.covered:
            covered[id(n)] = p
    out = {"taken": {}, "reasons": {}, "missed": []}
    for node in model.graph.node:
        if node.op_type not in WATCHED:
            continue
        p = covered.get(id(node))
        if p is not None and p.supported:
            out["taken"][node.op_type] = out["taken"].get(node.op_type, 0) + 1
        elif p is not None:
            out["reasons"].setdefault(p.reason, []).append(_node_id(node))
        elif node.op_type == "Softmax":
            out["reasons"].setdefault("Softmax outside an attention pattern (no jitops op)", []).append(
                _node_id(node))
        else:
            out["missed"].append(_node_id(node))
    return out


class ExportFailed(Exception):
    """torch could not export the model: not a jitops result either way."""


def run_one(name: str, opset: int, dynamo: bool = False) -> dict:
    import onnx

    import jitops.onnx as jo
    from jitops.onnx.testing import max_rel_error, ort_session
    t0 = time.perf_counter()
    try:
        data, feeds = export(name, opset, dynamo)
    except ImportError:
        raise
    except Exception as exc:
        raise ExportFailed(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    model = onnx.load_from_string(data)
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    t1 = time.perf_counter()
    groups = jo.map_nodes(model)
    t2 = time.perf_counter()
    rewritten = jo.rewrite(model)
    t3 = time.perf_counter()
    onnx.checker.check_model(rewritten)
    ref = ort_session(model).run(None, feeds)[0]
    got = ort_session(rewritten).run(None, feeds)[0]
    types: dict[str, int] = {}
    for p in groups:
        if p.supported:
            types[p.op_type] = types.get(p.op_type, 0) + 1
    acc = account(model, groups)
    causal = sum(n.domain == jo.DOMAIN and any(a.name == "is_causal" and a.i for a in n.attribute)
                 for n in rewritten.graph.node)
    return {"model": name, "exporter": "dynamo" if dynamo else "torchscript", "opset": opset, "export_s": round(t1 - t0, 2), "map_s": round(t2 - t1, 3),
            "rewrite_s": round(t3 - t2, 3), "groups_taken": sum(types.values()), "jitops_types": types,
            "causal_nodes": causal, "expand_nodes_left": sum(n.op_type == "Expand" for n in rewritten.graph.node),
            "onnx_nodes_taken": acc["taken"], "left_with_reason": {r: len(v) for r, v in acc["reasons"].items()},
            "missed": acc["missed"], "fallback_rel_error_batch2": max_rel_error(got, ref)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opset", type=int, action="append")
    ap.add_argument("--models", default=",".join((*TORCHVISION, "bert_base", *DECODERS)))
    ap.add_argument("--json")
    ap.add_argument("--dynamo", action="store_true", help="torch.export's exporter instead (needs onnxscript)")
    args = ap.parse_args()
    results, crashes = [], 0
    for opset in args.opset or [17]:
        for name in args.models.split(","):
            try:
                r = run_one(name, opset, args.dynamo)
            except ImportError as exc:
                r = {"model": name, "opset": opset, "skipped": str(exc)}
            except ExportFailed as exc:
                r = {"model": name, "opset": opset, "export_failed": str(exc)}
            except Exception as exc:  # counted: the target is zero
                crashes += 1
                r = {"model": name, "opset": opset, "crash": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()[-2000:]}
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "traceback"}), flush=True)
    summary = {"crashes": crashes, "missed": sum(len(r.get("missed", [])) for r in results), "results": results}
    print(f"crashes: {crashes}, watched nodes neither taken nor given a reason: {summary['missed']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if crashes or summary["missed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
