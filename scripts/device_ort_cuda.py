"""Real exported models end to end on ONNX Runtime's CUDA execution provider: ORT's own kernels
against the same model rewritten for jitops (`jo.session`), in one run (issue 17).

    python3 scripts/device_ort_cuda.py --out DIR [--budget-s 200] [--cases resnet50:1,...] [--dtypes float32,float16]
        [--variants default,no_skip]

    # a dry run of the whole script on the CPU EP (jitops on the emulator), tiny corpus models:
    python3 scripts/device_ort_cuda.py --provider cpu --cases corpus_bert:2,corpus_vit:1 --dtypes float32 \
        --variants default,no_skip --reps 2 --out /tmp/ort_dry

Needs onnxruntime-gpu (scripts/device_ort_gpu.sh installs the carried wheel). Each case exports the
torchvision model (or the BERT-base-style encoder) with a symbolic batch, builds both sessions on
the CUDA EP, binds inputs and outputs to device memory (io_binding, so no host copies are timed on
either side), checks both outputs against ORT's float32 CPU run of the float32 export, and times
the median of `--reps` runs after warm-ups, the sessions taking turns (the first jitops run compiles). fp32 runs with TF32
off on both sides (ORT's `use_tf32=0`, jitops' exact fp32 kernels); fp16 runs the half export.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BERT_SEQ = 128


def feeds_for(name: str, batch: int, dtype: str) -> dict[str, np.ndarray]:
    if name.startswith("corpus_"):
        from jitops.onnx import corpus
        sizes = {"x_0": batch, "mask_0": batch, "x_1": 8, "mask_1": 8} if name == "corpus_bert" else {"x_0": batch}
        return {k: v.astype(dtype) for k, v in corpus.example_inputs(name[7:], seed=batch, **sizes).items()}
    rng = np.random.default_rng(batch)
    if name == "bert_base":
        mask = np.ones((batch, BERT_SEQ), dtype)
        mask[:, -7:] = 0
        return {"x": rng.standard_normal((batch, BERT_SEQ, 768)).astype(dtype), "mask": mask}
    return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(dtype)}


class Bound:
    """A session with device-resident inputs and outputs bound (io_binding): no host copy is timed."""

    def __init__(self, ort, sess, feeds: dict[str, np.ndarray], device: str = "cuda"):
        self.sess, self.binding = sess, sess.io_binding()
        for k, v in feeds.items():
            self.binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, device, 0))
        self.binding.bind_output(sess.get_outputs()[0].name, device)
        t0 = time.perf_counter()
        self.run()
        self.first_s = time.perf_counter() - t0
        self.times: list[float] = []

    def run(self) -> None:
        self.sess.run_with_iobinding(self.binding)

    def output(self) -> np.ndarray:
        return self.binding.copy_outputs_to_cpu()[0]


def take_turns(bound: dict[str, Bound], reps: int, warmup: int = 3) -> dict[str, float]:
    """Median ms per session, the sessions taking turns run by run (host drift hits all alike)."""
    for _ in range(warmup):
        for b in bound.values():
            b.run()
    for _ in range(reps):
        for b in bound.values():
            t0 = time.perf_counter()
            b.run()
            b.times.append(time.perf_counter() - t0)
    return {k: statistics.median(b.times) * 1e3 for k, b in bound.items()}


# Rewrite variants compared in one run (--variants): what each fusion and the layout pass are worth.
# no_skip: the residual Add [+ bias Add] stays ONNX in front of a jitops LayerNorm / RmsNorm (the
# rewrite before skip_patterns.py); no_norm: jitops takes no norm at all, ORT forms its own
# SkipLayerNormalization (what the residual forms compete with).
VARIANTS = {"default": {}, "nchw": {"layout": "nchw"}, "no_residual": {"residual": False},
            "no_skip": {"skip": False}, "no_norm": {"norms": False}}


def rewritten(data: bytes, ops: list[str] | None, variant: str, transformer: bool = False):
    """The model rewritten for one variant; fails loudly when a variant's knob did not do what it
    says (a transformer's default rewrite with no residual norm, a no_skip rewrite with one)."""
    import onnx

    import jitops.onnx as jo
    from jitops.onnx import matchers, skip_patterns
    args = dict(VARIANTS[variant])
    keep, keep_skip = matchers._residual_add, skip_patterns._skip_forms
    # experiment knobs, not an API: Conv+Add left to ORT; the residual forms of the norms off
    if args.pop("residual", True) is False:
        matchers._residual_add = lambda view, cand: None
    if args.pop("skip", True) is False:
        skip_patterns._skip_forms = lambda *a: iter(())
    if args.pop("norms", True) is False:
        ops = sorted({t.op for t in jo.OP_TYPES.values()} - {"layer_norm", "rms_norm"} if ops is None
                     else set(ops) - {"layer_norm", "rms_norm"})
    try:
        model = jo.rewrite(onnx.load_from_string(data), ops=ops, **args)
    finally:
        matchers._residual_add, skip_patterns._skip_forms = keep, keep_skip
    types = [n.op_type for n in model.graph.node if n.domain == "jitops"]
    skip_types = [t for t in types if t.startswith("Skip")]
    if variant == "default" and transformer and (ops is None or "layer_norm" in ops) and not skip_types:
        raise RuntimeError(f"default rewrite of a transformer took no residual norm: {types}")
    if variant in ("no_skip", "no_norm") and skip_types:
        raise RuntimeError(f"variant {variant} still has {skip_types}: the knob did not apply")
    return model


def placement(ort, make, out_dir: str, tag: str) -> tuple[object, dict]:
    """A session built by make(options) with its optimized graph written out, and what ORT did to
    it: Memcpy nodes inserted (data crossing between providers) and the node types that read a
    MemcpyToHost output (what runs on the CPU provider inside a CUDA session)."""
    import onnx
    path = os.path.join(out_dir, f"optimized_{tag}.onnx")
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = path
    sess = make(opts)
    m = onnx.load(path, load_external_data=False)
    os.remove(path)
    to_host = {o for n in m.graph.node if n.op_type == "MemcpyToHost" for o in n.output}
    on_cpu: dict[str, int] = {}
    for n in m.graph.node:
        if to_host & set(n.input):
            on_cpu[n.op_type] = on_cpu.get(n.op_type, 0) + 1
    return sess, {"memcpy": sum(n.op_type.startswith("Memcpy") for n in m.graph.node), "reads_host_copy": on_cpu,
                  "fused_types": sorted({n.op_type for n in m.graph.node if n.domain not in ("", "ai.onnx")})}


def node_profile(ort, make, feeds: dict[str, np.ndarray], device: str, runs: int) -> dict:
    """ORT's own profile of `runs` runs of a session built by make(options): per op type, the
    nodes per run and the host microseconds per run ORT spent in them (for the CUDA EP a node's
    time is its launch work on the host, kernels run asynchronously), and the run's total."""
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    sess = make(opts)
    bound = Bound(ort, sess, feeds, device)
    for _ in range(3 + runs):
        bound.run()
    path = sess.end_profiling()
    events = json.load(open(path))
    os.remove(path)
    per_type: dict[str, list[float]] = {}
    total = 0.0
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            t = e.get("args", {}).get("op_name", "?")
            per_type.setdefault(t, []).append(float(e.get("dur", 0)))
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            total += float(e.get("dur", 0))
    n = 3 + runs
    return {"run_us": round(total / n, 1),
            "nodes_us": round(sum(sum(v) for v in per_type.values()) / n, 1),
            "by_type": {k: {"nodes": len(v) // n, "us": round(sum(v) / n, 1)}
                        for k, v in sorted(per_type.items(), key=lambda kv: -sum(kv[1]))}}


def export_model(name: str, dtype: str) -> bytes:
    if name.startswith("corpus_"):      # tiny corpus models (dry runs on the CPU)
        from jitops.onnx import corpus
        return corpus.export(name[7:], 17, dtype=dtype)
    from onnx_models import export
    return export(name, 17)[0] if dtype == "float32" else export(name, 17, dtype=dtype, device="cuda")[0]


def run_case(ort, name: str, batch: int, dtype: str, reps: int, ops: list[str] | None = None,
             variants: tuple[str, ...] = ("default",), out_dir: str = ".", provider: str = "cuda",
             profile: int = 0) -> dict:
    import jitops.onnx as jo
    from jitops.onnx.testing import max_rel_error
    data32 = export_model(name, "float32")
    data = data32 if dtype == "float32" else export_model(name, dtype)
    feeds = feeds_for(name, batch, dtype)
    ref = ort.InferenceSession(data32, providers=["CPUExecutionProvider"]).run(
        None, {k: v.astype(np.float32) for k, v in feeds.items()})[0]
    cuda = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"] if provider == "cuda" \
        else ["CPUExecutionProvider"]
    device = "cuda" if provider == "cuda" else "cpu"
    extra = {} if provider == "cuda" else {"backend": "cpu"}
    tag = f"{name}_{batch}_{dtype}"
    native, graphs = placement(ort, lambda o: ort.InferenceSession(data, sess_options=o, providers=cuda), out_dir, tag)
    bound = {"ort": Bound(ort, native, feeds, device)}
    places = {"ort": graphs}
    nodes, mine = {}, {}
    from jitops.onnx import kernels
    for v in variants:
        model = rewritten(data, ops, v, transformer=any(k in name for k in ("bert", "vit")))
        nodes[v] = sum(n.domain == "jitops" for n in model.graph.node)
        before = set(kernels._kernels)
        sess, places[v] = placement(ort, lambda o: jo.session(model, providers=cuda, rewrite=False, options=o,
                                                              **extra), out_dir, f"{tag}_{v}")
        mine[v] = [k for kid, k in kernels._kernels.items() if kid not in before]
        bound[v] = Bound(ort, sess, feeds, device)
    calls_before = {v: sum(k.calls for k in ks) for v, ks in mine.items()}
    ms = take_turns(bound, reps)
    # node calls that entered Python per timed run (the rest ran from the library's replays)
    python_calls = {v: (sum(k.calls for k in ks) - calls_before[v]) / (reps + 3) for v, ks in mine.items()}
    makers = {"ort": lambda o: ort.InferenceSession(data, sess_options=o, providers=cuda)}
    makers.update({v: (lambda o, m=rewritten(data, ops, v, transformer=any(k in name for k in ("bert", "vit"))):
                       jo.session(m, providers=cuda, rewrite=False, options=o, **extra)) for v in variants})
    profiles = {k: node_profile(ort, make, feeds, device, profile) for k, make in makers.items()} if profile else {}
    y_ort = bound["ort"].output().astype(np.float32)
    r = {"model": name, "batch": batch, "dtype": dtype, "ops": ops or "all", "ort_cuda_ms": round(ms["ort"], 3),
         "err_ort_vs_fp32": max_rel_error(y_ort, ref), "graphs": places, **({"profile": profiles} if profiles else {})}
    for v in variants:
        y = bound[v].output().astype(np.float32)
        tag = "" if v == "default" else f"_{v}"
        r.update({f"jitops{tag}_nodes": nodes[v], f"jitops{tag}_ms": round(ms[v], 3),
                  f"speedup{tag}": round(ms["ort"] / ms[v], 3), f"err_jitops{tag}_vs_fp32": max_rel_error(y, ref),
                  f"python_calls{tag}_per_run": round(python_calls[v], 2),
                  f"err_jitops{tag}_vs_ort": max_rel_error(y, y_ort), f"first_run{tag}_s": round(bound[v].first_s, 2)})
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cases", default="resnet50:1,resnet50:8,vit_b_16:1,vit_b_16:8,bert_base:1,bert_base:8",
                    help="model:batch,... (torchvision models, bert_base; corpus_bert / corpus_vit: tiny ones)")
    ap.add_argument("--provider", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run on the CPU EP with jitops on the emulator (tiny corpus models)")
    ap.add_argument("--strict", action="store_true", help="exit 1 at the first failed case (dry runs)")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--json", default="device_ort_cuda.json", help="file name under --out")
    ap.add_argument("--variants", default="default", help=f"rewrites to compare, of {','.join(VARIANTS)}")
    ap.add_argument("--profile", type=int, default=0,
                    help="also profile this many runs of each session with ORT's profiler (host time per op type)")
    ap.add_argument("--ops", action="append", help="take only these jitops ops (repeatable; default: all); "
                    "'--ops all --ops attention --ops layer_norm' runs a case once per entry, to attribute time")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import onnxruntime as ort
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()      # the CUDA EP's cuDNN / cuBLAS from the nvidia-* wheels beside torch
    print("onnxruntime", ort.__version__, ort.get_available_providers(), flush=True)
    for v in args.variants.split(","):
        if v not in VARIANTS:
            print(f"unknown variant {v!r} (of {', '.join(VARIANTS)})", flush=True)
            return 1
    if args.provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        print("no CUDA execution provider", flush=True)
        return 1
    start = time.perf_counter()
    results = []
    for case in args.cases.split(","):
        name, batch = case.split(":")[0], int(case.split(":")[1])
        for dtype, ops in [(d, o) for d in args.dtypes.split(",") for o in ([None if o == "all" else [o] for o in args.ops] if args.ops else [None])]:
            if time.perf_counter() - start > args.budget_s:
                r = {"model": name, "batch": batch, "dtype": dtype, "skipped": "time budget"}
            else:
                try:
                    r = run_case(ort, name, batch, dtype, args.reps, ops, tuple(args.variants.split(",")), args.out,
                                 args.provider, args.profile)
                except Exception as exc:  # reported; the other cases still run
                    if args.strict:
                        raise
                    r = {"model": name, "batch": batch, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:1500]}
            results.append(r)
            print(json.dumps(r), flush=True)
            with open(os.path.join(args.out, args.json), "w") as f:
                json.dump({"ort": ort.__version__, "results": results}, f, indent=1)
    print("\nmodel       batch dtype    ORT CUDA ms  variant       jitops ms  speedup  err jitops/ORT  jitops ops")
    for r in results:
        for v in args.variants.split(","):
            tag = "" if v == "default" else f"_{v}"
            if f"speedup{tag}" in r:
                print(f"{r['model']:<11} {r['batch']:>5} {r['dtype']:<8} {r['ort_cuda_ms']:>11}  {v:<12} "
                      f"{r[f'jitops{tag}_ms']:>9} {r[f'speedup{tag}']:>8} {r[f'err_jitops{tag}_vs_ort']:>10.2e}  {r['ops']}")
    for r in results:
        for k, prof in r.get("profile", {}).items():
            top = ", ".join(f"{t} {v['nodes']}x {v['us']}" for t, v in list(prof["by_type"].items())[:8])
            print(f"profile {r['model']} b{r['batch']} {r['dtype']} {k}: run {prof['run_us']} us, nodes {prof['nodes_us']} us: {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
