"""Small models written the way real ones are, exported by torch as users export them.

Each `torch.nn.Module` here reproduces the graph patterns of a model family at a tiny width:
ResNet (Conv+BN+Relu, residual), MobileNet-V3 (depthwise, Hardswish, squeeze-excitation),
ConvNeXt (depthwise 7x7, channels-last LayerNorm, MLP), ViT (patch conv, nn.MultiheadAttention as
torchvision uses it), BERT (hand-written attention with an additive padding mask), GPT/Llama (a
causal mask through masked_fill, RMSNorm written out; Llama with rotary embeddings, grouped-query
repeat_kv and SDPA's causal mask), and GroupNorm + LeakyRelu. `export` writes
them with a symbolic batch (and sequence) dimension, as `torch.onnx.export(..., dynamic_axes=...)`
does for nearly every exported model. Used by tests/test_onnx_models.py and
scripts/onnx_models.py; needs torch.
"""
from __future__ import annotations

import io
import math
from typing import Any, Callable

import numpy as np


def _nn() -> Any:
    import torch
    return torch, torch.nn, torch.nn.functional


def resnet_like(width: int = 8) -> Any:
    torch, nn, F = _nn()

    class Block(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))

    return nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), Block(width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, 10))


def mobilenet_like(width: int = 8) -> Any:
    torch, nn, F = _nn()

    class SE(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c // 2, c, 1)

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))

    return nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.Hardswish(),
                         nn.Conv2d(width, width, 3, 1, 1, groups=width, bias=False), nn.BatchNorm2d(width),
                         nn.LeakyReLU(0.1), SE(width), nn.Conv2d(width, 2 * width, 1, bias=False),
                         nn.BatchNorm2d(2 * width), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def convnext_like(width: int = 8) -> Any:
    torch, nn, F = _nn()

    class Block(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = nn.LayerNorm(c, eps=1e-6)
            self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.fc2(F.gelu(self.fc1(self.norm(y))))
            return x + y.permute(0, 3, 1, 2)

    return nn.Sequential(nn.Conv2d(3, width, 4, 4), Block(width), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def vit_like(width: int = 16, heads: int = 2, patch: int = 4, image: int = 16) -> Any:
    """torchvision's ViT encoder block: nn.MultiheadAttention(need_weights=False), pre-norm."""
    torch, nn, F = _nn()

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Conv2d(3, width, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.1)
            self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.1)
            self.ln1, self.ln2, self.ln = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

        def forward(self, x):
            x = self.proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            y = self.ln1(x)
            x = x + self.attn(y, y, y, need_weights=False)[0]
            x = x + self.mlp(self.ln2(x))
            return self.ln(x)[:, 0]

    return ViT()


def _split_heads(x: Any, heads: int) -> Any:
    b, s, c = x.shape
    return x.view(b, s, heads, c // heads).permute(0, 2, 1, 3)


def bert_like(width: int = 16, heads: int = 2) -> Any:
    """A BERT-style encoder layer: scores / sqrt(d) + (1 - mask) * -10000, post-norm LayerNorm."""
    torch, nn, F = _nn()

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(width, eps=1e-12), nn.LayerNorm(width, eps=1e-12)
            self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

        def forward(self, x, mask):
            b, s, c = x.shape
            q, k, v = (_split_heads(f(x), heads) for f in (self.q, self.k, self.v))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(c // heads)
            scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
            ctx = torch.matmul(F.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(b, s, c)
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.ff(x))

    return Bert()


def _rms_norm(c: int, eps: float = 1e-6) -> Any:
    """Llama's RMSNorm as HF writes it (LlamaRMSNorm: the input cast to float32, rsqrt, cast back,
    weight after)."""
    torch, nn, F = _nn()

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.rand(c) + 0.5), eps

        def forward(self, x):
            dtype, h = x.dtype, x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(dtype)

    return RMSNorm()


def gpt_like(width: int = 16, heads: int = 2, max_len: int = 32) -> Any:
    """A GPT-style causal block: tril buffer + masked_fill(-inf), Llama's RMSNorm written out."""
    torch, nn, F = _nn()

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.qkv, self.o = _rms_norm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm(x)).split(width, dim=2)
            q, k, v = (_split_heads(z, heads) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, c)
            return x + self.o(y)

    return GPT()


def llama_like(width: int = 16, heads: int = 4, kv_heads: int = 2, max_len: int = 32, layers: int = 1) -> Any:
    """Llama decoder layers as HF writes them: RMSNorm, rotary embeddings on [B, H, S, D] Q and K,
    grouped-query K / V through repeat_kv (Unsqueeze -> Expand -> Reshape), torch's SDPA with
    is_causal=True (exported as a Trilu mask), SwiGLU MLP, residual adds."""
    torch, nn, F = _nn()
    d = width // heads

    def rotate_half(x):
        return torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)

    def repeat_kv(x, n):
        b, hk, t, dd = x.shape
        return x[:, :, None, :, :].expand(b, hk, n, t, dd).reshape(b, hk * n, t, dd)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = _rms_norm(width), _rms_norm(width)
            self.q, self.k = nn.Linear(width, width, bias=False), nn.Linear(width, kv_heads * d, bias=False)
            self.v, self.o = nn.Linear(width, kv_heads * d, bias=False), nn.Linear(width, width, bias=False)
            self.gate, self.up = nn.Linear(width, 2 * width, bias=False), nn.Linear(width, 2 * width, bias=False)
            self.down = nn.Linear(2 * width, width, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.norm1(x)
            q = self.q(h).view(b, t, heads, d).transpose(1, 2)
            k = self.k(h).view(b, t, kv_heads, d).transpose(1, 2)
            v = self.v(h).view(b, t, kv_heads, d).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            n = heads // kv_heads
            y = F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(b, t, width))
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
            angles = torch.outer(torch.arange(max_len).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos())
            self.register_buffer("sin", angles.sin())

        def forward(self, x):
            t = x.shape[1]
            cos, sin = self.cos[:t], self.sin[:t]
            for layer in self.layers:
                x = layer(x, cos, sin)
            return x

    return Llama()


def groupnorm_like(width: int = 8, groups: int = 4) -> Any:
    torch, nn, F = _nn()
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(groups, width), nn.LeakyReLU(0.2),
                         nn.Conv2d(width, width, 3, padding=1))


# name -> (builder, example input shapes, dynamic axes per input)
MODELS: dict[str, tuple[Callable[[], Any], dict[str, tuple[int, ...]], dict[str, dict[int, str]]]] = {
    "resnet": (resnet_like, {"x": (2, 3, 16, 16)}, {"x": {0: "batch"}}),
    "mobilenet": (mobilenet_like, {"x": (2, 3, 16, 16)}, {"x": {0: "batch"}}),
    "convnext": (convnext_like, {"x": (2, 3, 16, 16)}, {"x": {0: "batch"}}),
    "vit": (vit_like, {"x": (2, 3, 16, 16)}, {"x": {0: "batch"}}),
    "bert": (bert_like, {"x": (2, 8, 16), "mask": (2, 8)},
             {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}),
    "gpt": (gpt_like, {"x": (2, 8, 16)}, {"x": {0: "batch", 1: "seq"}}),
    "llama": (llama_like, {"x": (2, 8, 16)}, {"x": {0: "batch", 1: "seq"}}),
    "groupnorm": (groupnorm_like, {"x": (2, 3, 8, 8)}, {"x": {0: "batch"}}),
}


def example_inputs(name: str, seed: int = 0, **sizes: int) -> dict[str, np.ndarray]:
    """Random inputs for MODELS[name] (float32; a BERT mask of ones with padding at the end)."""
    rng = np.random.default_rng(seed)
    shapes = {k: tuple(sizes.get(f"{k}_{i}", d) for i, d in enumerate(v)) for k, v in MODELS[name][1].items()}
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    if "mask" in feeds:
        m = np.ones(shapes["mask"], np.float32)
        m[:, -max(1, shapes["mask"][1] // 4):] = 0.0
        feeds["mask"] = m
    return feeds


def export(name: str, opset: int = 17, seed: int = 0, dtype: str = "float32", dynamo: bool = False) -> bytes:
    """The serialized ONNX model of MODELS[name], batch (and sequence) dims symbolic.

    dynamo=False: the TorchScript exporter with dynamic_axes (what most exported models in use
    were made with); True: torch.export's exporter (torch's default since 2.9; needs onnxscript),
    at its own opset (`opset` then ignored)."""
    import torch
    build, shapes, axes = MODELS[name]
    torch.manual_seed(seed)
    m = build().eval()
    example = {k: torch.from_numpy(v) for k, v in example_inputs(name, seed).items()}
    if dtype == "float16":
        m = m.half()
        example = {k: v.half() for k, v in example.items()}
    args = tuple(example[k] for k in shapes)
    if dynamo:
        dims = {n: torch.export.Dim(n, min=1 if n == "batch" else 2, max=64) for a in axes.values() for n in a.values()}
        program = torch.onnx.export(m, args, dynamo=True, input_names=list(shapes),
                                    dynamic_shapes=tuple({i: dims[n] for i, n in axes[k].items()} for k in shapes))
        return program.model_proto.SerializeToString()
    buf = io.BytesIO()
    # Not under no_grad: nn.MultiheadAttention would take its fused fast path, which has no ONNX export.
    torch.onnx.export(m, args, buf, input_names=list(shapes), output_names=["y"],
                      dynamic_axes={**axes, "y": {0: "batch"}}, opset_version=opset, dynamo=False)
    return buf.getvalue()
