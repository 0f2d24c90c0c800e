"""ONNX models on jitops: which nodes it runs, the rewrite to domain `jitops`, ONNX Runtime sessions.

    import jitops.onnx as jo
    model = jo.rewrite("model.onnx")      # Conv+BN+Relu -> jitops::Conv2dRelu ...; symbolic batch dims are fine
    sess = jo.session(model)                                                   # ORT with the jitops custom ops
    y = sess.run(None, {"x": x})

Needs the `onnx` package; sessions need `onnxruntime` (>= 1.17; CI runs 1.22 and the newest).
"""
from __future__ import annotations

from .native import library_path
from .nodes import NodeProblem, map_nodes, supported_nodes
from .optypes import DOMAIN, OP_TYPES
from .rewrite import rewrite
from .session import register, session

__all__ = ["NodeProblem", "map_nodes", "supported_nodes", "rewrite", "session", "register", "library_path",
           "DOMAIN", "OP_TYPES"]
