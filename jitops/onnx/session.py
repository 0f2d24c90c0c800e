"""ONNX Runtime sessions with the jitops custom ops registered."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..runtime import get_backend
from ..runtime.base import Backend
from . import kernels, native
from .graph import load_model
from .optypes import DOMAIN

log = logging.getLogger("jitops.onnx")

GPU_PROVIDERS = ("CUDAExecutionProvider", "ROCMExecutionProvider")


MARK = "jitops.custom_ops_registered"


def register(options: Any) -> Any:
    """Register the jitops custom ops on an onnxruntime.SessionOptions (returns it); idempotent."""
    native.connect()
    try:
        if options.get_session_config_entry(MARK) == "1":
            return options      # ORT refuses a second registration of the same domain on one options
    except Exception:
        pass
    options.register_custom_ops_library(str(native.library_path()))
    options.add_session_config_entry(MARK, "1")
    return options


def has_jitops_nodes(model: Any) -> bool:
    return any(n.domain == DOMAIN for n in model.graph.node)


def default_providers() -> list[str]:
    """ORT's available providers among CUDA / ROCm / CPU, GPU first (TensorRT and the like left out)."""
    import onnxruntime as ort
    available = ort.get_available_providers()
    return [p for p in (*GPU_PROVIDERS, "CPUExecutionProvider") if p in available]


def session(model: Any, providers: Sequence[Any] | None = None, *, rewrite: bool | str = "auto",
            input_shapes: Mapping[str, Sequence[int]] | None = None, backend: Backend | str | None = None,
            options: Any = None, **rewrite_args: Any) -> Any:
    """An onnxruntime.InferenceSession that runs the model's jitops nodes on jitops kernels.

    model: path, ModelProto or bytes. rewrite: "auto" rewrites a model with no jitops nodes
    (jitops.onnx.rewrite with input_shapes / rewrite_args), True always, False never.
    providers: as for ORT (default: CUDA or ROCm when available, then CPU). On the CPU provider the
    jitops nodes run on `backend` (default: the active jitops backend: a GPU with staged copies,
    or the CPU emulator); on CUDA / ROCm they launch on ORT's stream with ORT's device buffers.
    """
    import onnxruntime as ort
    proto = None
    source: Any = model
    if rewrite is True or rewrite == "auto":
        proto = load_model(model)
        if rewrite is True or not has_jitops_nodes(proto):
            from .rewrite import rewrite as do_rewrite
            proto = do_rewrite(proto, input_shapes=input_shapes, **rewrite_args)
        source = proto.SerializeToString()
    elif not isinstance(model, (str, Path, bytes, bytearray)):
        source = model.SerializeToString()
    else:
        source = str(model) if isinstance(model, Path) else model
    opts = options if options is not None else ort.SessionOptions()
    register(opts)
    providers = list(providers) if providers is not None else default_providers()
    _avoid_cpu_float16_crash(opts, providers, proto if proto is not None else model)
    be = get_backend(backend) if isinstance(backend, str) else backend
    staged_before = kernels.staged_kernel_count()
    with kernels.session_backend(be):
        sess = ort.InferenceSession(source, sess_options=opts, providers=providers)
    staged = kernels.staged_kernel_count() - staged_before
    if staged:
        warn_staged(staged, sess.get_providers())
    log.info("session with providers %s; %d jitops kernels alive", sess.get_providers(), kernels.kernel_count())
    return sess


def _avoid_cpu_float16_crash(opts: Any, providers: Sequence[Any], model: Any) -> None:
    """ORT's CPU provider at ORT_ENABLE_ALL (the default level) crashed (SIGSEGV, onnxruntime 1.32, no error
    raised) creating a session for a float16 model with two nn.MultiheadAttention layers once any custom op
    library was registered, jitops nodes or none (found by scripts/fuzz_onnx.py --dtype float16, 2026-11-29);
    ORT_ENABLE_EXTENDED runs it. Where the CPU provider comes first and the model holds float16 tensors, the
    level is lowered to that, with a log line: the level-ALL passes are CPU layout rewrites of float32 convs.
    `model`: a ModelProto, path or bytes, read only where the provider and level call for the check."""
    import onnxruntime as ort
    first = providers[0] if providers else None
    first = first[0] if isinstance(first, (tuple, list)) else first
    if first != "CPUExecutionProvider" or opts.graph_optimization_level != ort.GraphOptimizationLevel.ORT_ENABLE_ALL:
        return
    g = load_model(model).graph
    half = 10                                               # TensorProto.FLOAT16
    if any(t.data_type == half for t in g.initializer) or any(
            v.type.tensor_type.elem_type == half for v in [*g.input, *g.output]):
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        log.info("float16 model on ORT's CPU provider: graph optimization level ORT_ENABLE_EXTENDED instead of "
                 "ORT_ENABLE_ALL (ORT crashed at ALL with a custom op library registered)")


_warned = [False]


def warn_staged(count: int, providers: Sequence[str]) -> None:
    """Once per process: jitops GPU kernels behind ORT's CPU provider copy every tensor to and from the GPU."""
    if _warned[0]:
        return
    _warned[0] = True
    import onnxruntime as ort
    msg = (f"jitops: {count} jitops node(s) run through ONNX Runtime's CPU execution provider on the GPU, "
           f"so every input and output of each is copied through host memory (session providers: "
           f"{', '.join(providers)}; this onnxruntime {ort.__version__} offers "
           f"{', '.join(ort.get_available_providers())}). That is usually much slower than ORT's own CPU "
           f"kernels (docs/onnx.md). Install the GPU provider: `pip uninstall onnxruntime && pip install "
           f"onnxruntime-gpu` (CUDA; for ROCm onnxruntime-rocm 1.22 or MIGraphX), or use the model without "
           f"jitops: jitops.onnx.session(model, rewrite=False).")
    log.warning("%s", msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
