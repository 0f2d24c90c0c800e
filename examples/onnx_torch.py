"""Run an ONNX graph with torch ops: the demo's torch baseline, and jitops nodes on torch tensors.

Walks the graph node by node with eager torch (cuDNN convolutions, torch's norms and matmuls).
Nodes of domain `jitops` (a rewritten model) run on jitops kernels on the same torch tensors and
stream, with no copies: that is jitops on the GPU without ONNX Runtime's CPU provider in between.
Only the ops the example models use are implemented.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class TorchGraph:
    """graph(feeds) -> outputs, feeds and outputs torch tensors on `device`."""

    def __init__(self, model: Any, device: str = "cuda"):
        import torch
        from onnx import numpy_helper
        self.torch = torch
        self.model = model
        self.device = device
        # Shapes and resize scales stay on the host: reading them must not synchronise the GPU.
        host = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
        host |= {i for n in model.graph.node if n.op_type == "Resize" for i in n.input[1:]}
        self.consts = {}
        for t in model.graph.initializer:
            value = torch.from_numpy(np.array(numpy_helper.to_array(t), copy=True, order="C"))
            self.consts[t.name] = value if t.name in host else value.to(device)
        self.outputs = [o.name for o in model.graph.output]
        self.steps = [(n, self._op(n)) for n in model.graph.node]

    def __call__(self, feeds: dict[str, Any]) -> list[Any]:
        env = dict(self.consts)
        env.update(feeds)
        for node, fn in self.steps:
            result = fn([env[i] if i else None for i in node.input])
            env[node.output[0]] = result
        return [env[o] for o in self.outputs]

    # ---- one function per node, attributes read once
    def _op(self, node: Any) -> Callable[[list], Any]:
        if node.domain == "jitops":
            return self._jitops(node)
        a = _attrs(node)
        t, F = self.torch, self.torch.nn.functional
        op = node.op_type
        if op == "Conv":
            pads = a.get("pads", [0, 0, 0, 0])
            if pads[:2] != pads[2:]:
                raise NotImplementedError("asymmetric Conv pads")
            return lambda i: F.conv2d(i[0], i[1], i[2] if len(i) > 2 else None, a.get("strides", [1, 1]),
                                      pads[:2], a.get("dilations", [1, 1]), a.get("group", 1))
        if op == "BatchNormalization":
            eps = a.get("epsilon", 1e-5)
            return lambda i: F.batch_norm(i[0], i[3], i[4], i[1], i[2], False, 0.0, eps)
        if op == "GroupNormalization":
            return lambda i: F.group_norm(i[0], a["num_groups"], i[1], i[2], a.get("epsilon", 1e-5))
        if op == "LayerNormalization":
            axis = a.get("axis", -1)
            return lambda i: F.layer_norm(i[0], i[0].shape[axis:], i[1], i[2] if len(i) > 2 else None,
                                          a.get("epsilon", 1e-5))
        if op == "Relu":
            return lambda i: F.relu(i[0])
        if op == "LeakyRelu":
            return lambda i: F.leaky_relu(i[0], a.get("alpha", 0.01))
        if op == "Softmax":
            return lambda i: t.softmax(i[0], dim=a.get("axis", -1))
        if op in ("MatMul", "Mul", "Add", "Sub", "Div"):
            f = {"MatMul": t.matmul, "Mul": t.mul, "Add": t.add, "Sub": t.sub, "Div": t.div}[op]
            return lambda i: f(i[0], i[1])
        if op == "Transpose":
            return lambda i: i[0].permute(*a["perm"]).contiguous()
        if op == "Reshape":
            def reshape(i: list) -> Any:
                shape = [int(s) for s in i[1].tolist()]
                shape = [i[0].shape[k] if s == 0 else s for k, s in enumerate(shape)]
                return i[0].reshape(shape)
            return reshape
        if op == "Concat":
            return lambda i: t.cat(i, dim=a["axis"])
        if op == "Resize":
            return lambda i: F.interpolate(i[0], scale_factor=tuple(float(s) for s in i[2][2:].tolist()),
                                           mode="nearest")
        raise NotImplementedError(f"TorchGraph: ONNX op {op}")

    def _jitops(self, node: Any) -> Callable[[list], Any]:
        from jitops import engine
        from jitops.arrays import LAYOUTS, logical_shape
        from jitops.ops import get_op
        from jitops.onnx.optypes import head_output_shape, head_storage_shape, op_type
        t = op_type(node.op_type)
        node_attrs = _attrs(node)
        names = t.inputs

        memo: dict[tuple, dict[str, Any]] = {}

        layout = t.fixed.get("layout")      # Conv2dNhwc*: x / residual / y stored N, H, W, C; *Bshd: B, S, H, D
        stored = getattr(get_op(t.op), "LAYOUT_INPUTS", ()) if layout else ()

        heads = int(node_attrs.get("num_heads", 0))    # *Bshd / *Sbhd reading the 3-D tensors around head Reshapes

        def run(i: list) -> Any:
            tensors = {n: (i[k] if k < len(i) else None) for k, n in enumerate(names)}
            if heads:
                tensors = {n: (v.reshape(head_storage_shape(layout, tuple(v.shape), heads)) if n in stored
                               and v is not None else v) for n, v in tensors.items()}
            shapes = {n: tuple(v.shape) for n, v in tensors.items() if v is not None}
            key = tuple(shapes.items())
            attrs = memo.get(key)
            if attrs is None:
                logical = {n: logical_shape(s, layout if n in stored else "") for n, s in shapes.items()}
                attrs = memo[key] = {**t.op_attrs(node_attrs, logical), **({"layout": layout} if layout else {})}
            y = engine.run(t.op, tensors, attrs)
            # a layout node's y is a view of logical shape (N, C, H, W; B, H, S, D) over storage in
            # the layout's order; the graph's value is that storage, as ORT holds it (a view, no copy)
            y = y.permute(*LAYOUTS[layout][0]) if layout else y
            return y.reshape(head_output_shape(layout, tuple(y.shape), heads)) if heads else y
        return run
