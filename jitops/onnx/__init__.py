"""ONNX models on jitops: which nodes it runs, the rewrite to domain `jitops`, ONNX Runtime sessions.

    import jitops.onnx as jo
    model = jo.rewrite("model.onnx", input_shapes={"x": (1, 3, 224, 224)})   # Conv+BN+Relu -> jitops::Conv2dRelu ...
    sess = jo.session(model)                                                   # ORT with the jitops custom ops
    y = sess.run(None, {"x": x})

Needs the `onnx` package; sessions need `onnxruntime` (>= 1.17; CI runs 1.22 and the newest).
"""
from __future__ import annotations

from typing import Any

from .nodes import NodeProblem, map_nodes, supported_nodes
from .optypes import DOMAIN, OP_TYPES

__all__ = ["NodeProblem", "map_nodes", "supported_nodes", "rewrite", "session", "library_path", "DOMAIN",
           "OP_TYPES"]


def __getattr__(name: str) -> Any:
    # rewrite/session pull in onnx helpers and onnxruntime only when used.
    if name == "rewrite":
        from .rewrite import rewrite
        return rewrite
    if name == "session":
        from .session import session
        return session
    if name == "library_path":
        from .native import library_path
        return library_path
    raise AttributeError(f"module 'jitops.onnx' has no attribute '{name}'")
