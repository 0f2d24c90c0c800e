"""Build a small UNet with a self-attention bottleneck as ONNX, for `jitops tune`.

    python examples/make_model.py tiny_unet.onnx
    jitops tune tiny_unet.onnx --input-shape image=8x3x128x128

The batch dimension is dynamic ("N"), so tuning needs --input-shape. At 8x3x128x128 the model
has 19 unique conv/norm problems (plain, strided, depthwise and 1x1 convolutions, some with
BatchNorm and an activation fused; GroupNorm, LayerNorm, BatchNorm), three LeakyRelu sizes and
one MatMul/Softmax/MatMul attention: 23 problems jitops tunes. Weights are random (He-scaled),
so activations stay in range; the model is a tuning workload, not a trained network.
"""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

OPSET = 21    # GroupNormalization with per-channel scale and bias


class _Builder:
    def __init__(self, dtype: str, seed: int):
        from onnx import TensorProto
        self.np_dtype = np.dtype(dtype)
        self.elem = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.n = 0

    def name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def const(self, kind: str, value: np.ndarray, keep_dtype: bool = False) -> str:
        from onnx import numpy_helper
        name = self.name(kind)
        arr = value if keep_dtype else value.astype(self.np_dtype)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper
        out = self.name(op.lower() + "_")
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    # ---- layers
    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, bias: bool = True) -> str:
        fan_in = cin // groups * k * k
        w = self.const("w", self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in))
        ins = [x, w] + ([self.const("b", self.rng.standard_normal(cout) * 0.1)] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=groups)

    def bn(self, x: str, c: int) -> str:
        params = [self.rng.uniform(0.5, 1.5, c), self.rng.standard_normal(c) * 0.1,
                  self.rng.standard_normal(c) * 0.1, self.rng.uniform(0.5, 1.5, c)]
        return self.node("BatchNormalization", [x, *(self.const("bn", p) for p in params)], epsilon=1e-5)

    def gn(self, x: str, c: int, groups: int) -> str:
        scale = self.const("gn_s", self.rng.uniform(0.5, 1.5, c))
        bias = self.const("gn_b", self.rng.standard_normal(c) * 0.1)
        return self.node("GroupNormalization", [x, scale, bias], num_groups=groups, epsilon=1e-5)

    def leaky(self, x: str) -> str:
        return self.node("LeakyRelu", [x], alpha=0.1)

    def up(self, x: str) -> str:
        scales = self.const("scales", np.array([1, 1, 2, 2], dtype=np.float32), keep_dtype=True)
        return self.node("Resize", [x, "", scales], mode="nearest")

    def shape_const(self, dims: list[int]) -> str:
        return self.const("shape", np.array(dims, dtype=np.int64), keep_dtype=True)

    def attention(self, x: str, c: int, hw: int, heads: int) -> str:
        """Pre-norm self-attention over the hw*hw positions, written as MatMul/Softmax/MatMul."""
        d = c // heads
        t = self.node("Transpose", [self.node("Reshape", [x, self.shape_const([0, c, hw * hw])])], perm=[0, 2, 1])
        ln = self.node("LayerNormalization", [t, self.const("ln_s", self.rng.uniform(0.5, 1.5, c)),
                                              self.const("ln_b", self.rng.standard_normal(c) * 0.1)],
                       axis=-1, epsilon=1e-5)

        def proj() -> str:
            return self.const("wp", self.rng.standard_normal((c, c)) / np.sqrt(c))

        def heads_of() -> str:
            r = self.node("Reshape", [self.node("MatMul", [ln, proj()]), self.shape_const([0, hw * hw, heads, d])])
            return self.node("Transpose", [r], perm=[0, 2, 1, 3])

        q, k, v = heads_of(), heads_of(), heads_of()
        kt = self.node("Transpose", [k], perm=[0, 1, 3, 2])
        s = self.node("Mul", [self.node("MatMul", [q, kt]), self.const("scale", np.array(1.0 / np.sqrt(d)))])
        o = self.node("MatMul", [self.node("Softmax", [s], axis=-1), v])
        o = self.node("Reshape", [self.node("Transpose", [o], perm=[0, 2, 1, 3]), self.shape_const([0, hw * hw, c])])
        res = self.node("Add", [self.node("MatMul", [o, proj()]), t])
        return self.node("Reshape", [self.node("Transpose", [res], perm=[0, 2, 1]), self.shape_const([0, c, hw, hw])])


def build_model(size: int = 128, dtype: str = "float32", batch: int | str = "N", seed: int = 0) -> Any:
    """The model as an onnx.ModelProto (input 'image' [batch, 3, size, size], output 'out')."""
    from onnx import checker, helper
    if size % 8:
        raise ValueError("size must be a multiple of 8 (three 2x downsamplings)")
    b = _Builder(dtype, seed)
    x = "image"
    a = b.leaky(b.bn(b.conv(x, 3, 32, 3, bias=False), 32))                       # stem: conv+BN+LeakyRelu
    skip1 = b.leaky(b.gn(b.conv(a, 32, 32, 3), 32, 8))                           # enc1 @ size
    c = b.node("Relu", [b.bn(b.conv(skip1, 32, 64, 3, stride=2, bias=False), 64)])  # down1
    c = b.leaky(b.bn(b.conv(c, 64, 64, 3, groups=64), 64))                       # depthwise
    skip2 = b.leaky(b.gn(b.conv(c, 64, 64, 1), 64, 16))                          # enc2 @ size/2
    e = b.leaky(b.bn(b.conv(skip2, 64, 128, 3, stride=2, bias=False), 128))      # down2
    skip3 = b.leaky(b.gn(b.conv(e, 128, 128, 3), 128, 32))                       # enc3 @ size/4
    g = b.conv(skip3, 128, 128, 3, stride=2)                                     # down3 @ size/8
    h = b.leaky(b.bn(b.attention(g, 128, size // 8, heads=4), 128))              # attention, BN+LeakyRelu
    j = b.node("Concat", [b.up(h), skip3], axis=1)                               # up3 @ size/4
    j = b.leaky(b.bn(b.conv(j, 256, 128, 3, bias=False), 128))
    k = b.node("Concat", [b.conv(b.up(j), 128, 64, 1, bias=False), skip2], axis=1)  # up2 @ size/2
    k = b.leaky(b.gn(b.conv(k, 128, 64, 3), 64, 16))
    m = b.node("Concat", [b.conv(b.up(k), 64, 32, 1, bias=False), skip1], axis=1)   # up1 @ size
    m = b.leaky(b.bn(b.conv(m, 64, 32, 3, bias=False), 32))
    b.conv(m, 32, 3, 1)                                                          # head
    b.nodes[-1].output[0] = "out"
    graph = helper.make_graph(
        b.nodes, "tiny_unet",
        [helper.make_tensor_value_info("image", b.elem, [batch, 3, size, size])],
        [helper.make_tensor_value_info("out", b.elem, [batch, 3, size, size])], initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="jitops-examples")
    model.ir_version = 10
    checker.check_model(model)
    return model


def main() -> None:
    import onnx
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?", default="tiny_unet.onnx")
    p.add_argument("--size", type=int, default=128, help="image height and width (multiple of 8)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    args = p.parse_args()
    onnx.save(build_model(args.size, args.dtype), args.path)
    print(f"wrote {args.path} (input image [N, 3, {args.size}, {args.size}], {args.dtype})")


if __name__ == "__main__":
    main()
