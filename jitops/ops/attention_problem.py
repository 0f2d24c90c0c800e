"""attention: the problem (validated shapes and attributes), the float64 reference, test data.

Layouts: q [B, Sq, D] (seed 000) or [B, H, Sq, D]; k and v [B, Sk, D] or [B, Hk, Sk, D] with Hk
dividing H (grouped-query attention: query head h reads kv head h // (H // Hk)); output like q.
Rank-4 q (and out), and k with v, may each be stored [B, S, H, D] (layout "bshd": FlashAttention's
layout, a model's projections before the head transpose) or [S, B, H, D] ("sbhd": torch
nn.MultiheadAttention's sequence-first projections); shapes stay logical [B, H, S, D]; the kernels
read them in place.
Packed projections: a bshd q, and k with v, may have rows P > H * D elements apart (q_pitch,
kv_pitch; 0: dense), the column slices of one [B, S, (H + 2 Hk) D] projection that timm's ViT, GPT-2
and fused-qkv GQA models hand to attention. k and v share one pitch. The pitch is a compile-time
constant of the kernels and part of the problem key (a schedule or binary for one pitch is never
used for another). The output is always dense, [B, Sq, H, D] for a bshd q: its addressing
(out_strides, the templates' jt_o_*) is separate from q's. A pitch whose rows are not 16 bytes apart
(P * itemsize % 16) is read on the kernels' plain-load paths (no 16-byte copies, no TMA).
The mask is additive (float32 or q's dtype; -inf hides a key) and broadcasts, numpy style, to
[B, H, Sq, Sk] ([B, Sq, Sk] for 3-D q).

causal: False, True / "top_left" (key j visible to query i when j <= i, as torch's
scaled_dot_product_attention(is_causal=True) does, also when Sq != Sk), or "bottom_right" (j <= i +
Sk - Sq: the last query sees every key, the convention of KV-cache decoding). A query that sees
no key at all (fully masked, or above the diagonal) gets an output row of zeros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..arrays import LAYOUTS, inverse_permutation, span_elements
from ..errors import ArgumentError
from .base import HALF_DTYPES, ITEMSIZE, TensorSpec, parse_shape, problem_key, require_dtype, require_same_dtype, resolve_precision

NAME = "attention"
INPUTS = ("q", "k", "v", "mask")
MAX_HEAD_DIM = 256
CAUSAL_MODES = ("none", "top_left", "bottom_right")
# fused_tf32 (precision "tf32"): Q, K, V and P rounded to 11 significant bits (2^-11 relative each); a
# score's error about 2^-10 of its size, then averaged over the keys in P V (tolerance()).
TF32_TOLERANCE = 4e-3
DTYPES = ("float32", *HALF_DTYPES)


@dataclass(frozen=True)
class AttentionProblem:
    batch: int
    heads: int
    kv_heads: int
    sq: int
    sk: int
    d: int
    dtype: str
    rank: int                      # 3: [B, S, D] (H = 1), 4: [B, H, S, D]
    causal: str                    # one of CAUSAL_MODES
    scale: float
    mask_shape: tuple[int, ...] | None = None
    mask_dtype: str | None = None
    q_layout: str = ""             # "" ([B, H, Sq, D] in memory), "bshd" or "sbhd"; out follows q
    kv_layout: str = ""            # the same for k and v
    precision: str = "highest"     # fp32: "tf32" allows TF32 products (fused_tf32); else exact fp32 math
    q_pitch: int = 0               # bshd q: elements between its rows when not H * D (packed projections); 0: dense
    kv_pitch: int = 0              # the same for k and v (one pitch for both)

    @property
    def has_mask(self) -> bool:
        return self.mask_shape is not None

    @property
    def key_mask(self) -> bool:
        """A padding mask: one additive value per key, broadcast over the query rows ([B, 1, 1, Sk] or
        [B, H, 1, Sk], as ONNX exports of BERT / T5 pass it): row stride 0, key stride 1. The softmax loads
        each column's value once for both of a thread's rows (template parameter key_mask): H100, 2026-11-27,
        BERT-base b32 S=128 with a padding mask 25.9 -> 21.4 us on the same tile."""
        if self.mask_shape is None:
            return False
        _, _, row_stride, key_stride = self.mask_strides()
        return row_stride == 0 and key_stride == 1

    @property
    def row_mask(self) -> bool:
        """A mask with its own row per query row and the keys contiguous (key stride 1): causal plus padding
        masks of decoder exports ([B, 1, Sq, Sk]), T5's position bias ([1, H, Sq, Sk])."""
        if self.mask_shape is None:
            return False
        _, _, row_stride, key_stride = self.mask_strides()
        return row_stride != 0 and key_stride == 1

    @property
    def row_mask_pairs(self) -> bool:
        """A row mask whose batch, head and row strides are even (Sk even): two adjacent keys' values in one
        load wherever the mask's base is aligned to two elements (template attention/mask_pairs.h.j2;
        H200 2026-11-29: 1.16-1.40x on the fused_wgmma picks)."""
        return self.row_mask and not any(st % 2 for st in self.mask_strides()[:3])

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        """Key j is visible to query i when j <= i + causal_offset."""
        return self.sk - self.sq if self.causal == "bottom_right" else 0

    def q_shape(self) -> tuple[int, ...]:
        return (self.batch, self.sq, self.d) if self.rank == 3 else (self.batch, self.heads, self.sq, self.d)

    def kv_shape(self) -> tuple[int, ...]:
        return (self.batch, self.sk, self.d) if self.rank == 3 else (self.batch, self.kv_heads, self.sk, self.d)

    def inputs(self) -> dict[str, TensorSpec]:
        specs = {"q": TensorSpec(self.q_shape(), self.dtype, self.q_layout, self.q_pitch),
                 "k": TensorSpec(self.kv_shape(), self.dtype, self.kv_layout, self.kv_pitch),
                 "v": TensorSpec(self.kv_shape(), self.dtype, self.kv_layout, self.kv_pitch)}
        if self.mask_shape is not None:
            specs["mask"] = TensorSpec(self.mask_shape, self.mask_dtype or self.dtype)
        return specs

    def outputs(self) -> dict[str, TensorSpec]:
        return {"out": TensorSpec(self.q_shape(), self.dtype, self.q_layout)}

    def key(self) -> str:
        attrs: dict[str, Any] = {"causal": self.causal, "scale": self.scale}
        if self.precision != "highest":
            attrs["precision"] = self.precision
        return problem_key(NAME, self.inputs(), attrs)

    def q_strides(self) -> tuple[int, int, int]:
        """Element strides of q along (b, h, s)."""
        return _strides(self.batch, self.heads, self.sq, self.d, self.q_layout, self.q_pitch)

    def out_strides(self) -> tuple[int, int, int]:
        """Element strides of out along (b, h, s): q's layout, dense."""
        return _strides(self.batch, self.heads, self.sq, self.d, self.q_layout)

    def kv_strides(self) -> tuple[int, int, int]:
        """Element strides of k and v along (b, kv head, s)."""
        return _strides(self.batch, self.kv_heads, self.sk, self.d, self.kv_layout, self.kv_pitch)

    def q_span(self) -> int:
        """Elements from q's first to its last, plus one (index width: a pitched q spans more than its size)."""
        return span_elements((self.batch, self.heads, self.sq, self.d), (*self.q_strides(), 1))

    def kv_span(self) -> int:
        """The same for k (and v)."""
        return span_elements((self.batch, self.kv_heads, self.sk, self.d), (*self.kv_strides(), 1))

    def rows_16_bytes_apart(self) -> bool:
        """Every row of q, k and v starts a multiple of 16 bytes after the previous one, as the kernels' 16-byte
        copies and TMA need: always for dense storage of those paths' head dims; a packed projection's pitch
        may not be (the kernels then read on their plain-load paths)."""
        itemsize = ITEMSIZE[self.dtype]
        return all(pitch * itemsize % 16 == 0 for pitch in (self.q_pitch, self.kv_pitch))

    def mask_strides(self) -> tuple[int, int, int, int]:
        """Element strides of the mask along (b, h, i, j); 0 where it broadcasts."""
        if self.mask_shape is None:
            return (0, 0, 0, 0)
        full = (self.batch, self.heads, self.sq, self.sk) if self.rank == 4 else (self.batch, self.sq, self.sk)
        shape = (1,) * (len(full) - len(self.mask_shape)) + tuple(self.mask_shape)
        strides, acc = [0] * len(shape), 1
        for ax in range(len(shape) - 1, -1, -1):
            strides[ax] = acc if shape[ax] != 1 else 0
            acc *= shape[ax]
        if self.rank == 3:
            strides.insert(1, 0)
        return tuple(strides)  # type: ignore[return-value]

    def visible_pairs(self) -> int:
        """(query, key) pairs that take part, per (b, h): Sq * Sk unless causal."""
        if self.causal == "none":
            return self.sq * self.sk
        off = self.causal_offset
        return int(sum(min(self.sk, max(0, i + off + 1)) for i in range(self.sq)))

    def flops(self) -> int:
        """2 * D multiply-adds for Q K^T and as many for P V, per visible pair."""
        return 4 * self.batch * self.heads * self.visible_pairs() * self.d

    def bytes_moved(self) -> int:
        n = sum(s.nbytes for s in self.inputs().values()) + self.outputs()["out"].nbytes
        return int(n)


def _strides(batch: int, heads: int, rows: int, d: int, layout: str, pitch: int = 0) -> tuple[int, int, int]:
    if layout == "bshd":
        row = pitch or heads * d
        return (rows * row, d, row)
    if layout == "sbhd":
        return (heads * d, d, batch * heads * d)
    return (heads * rows * d, rows * d, d)


def _causal_mode(value: Any) -> str:
    if value is None or value is False:
        return "none"
    if value is True:
        return "top_left"
    if isinstance(value, (bool, np.bool_)):
        return "top_left" if bool(value) else "none"
    if isinstance(value, str) and value in CAUSAL_MODES:
        return value
    raise ArgumentError("causal", "False, True, 'top_left' or 'bottom_right'", repr(value), op=NAME)


def _scale(value: Any, d: int) -> float:
    if value is None:
        return 1.0 / math.sqrt(d)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ArgumentError("scale", "a real number or None (1/sqrt(D))", repr(value), op=NAME)
    if not math.isfinite(float(value)):
        raise ArgumentError("scale", "a finite number", value, op=NAME)
    return float(value)


def make_problem(inputs: Mapping[str, TensorSpec | None], attrs: Mapping[str, Any]) -> AttentionProblem:
    q, k, v, mask = (inputs.get(n) for n in INPUTS)
    for name, spec in (("q", q), ("k", k), ("v", v)):
        if spec is None:
            raise ArgumentError(name, "a tensor", None, op=NAME)
    assert q is not None and k is not None and v is not None
    require_dtype(NAME, "q", q, DTYPES)
    require_same_dtype(NAME, "k", k, q, "q")
    require_same_dtype(NAME, "v", v, q, "q")
    if len(q.shape) not in (3, 4):
        raise ArgumentError("q", "shape [B, Sq, D] or [B, H, Sq, D]", f"shape {q.shape}", op=NAME)
    rank = len(q.shape)
    layout = "[B, Sk, D]" if rank == 3 else "[B, Hk, Sk, D]"
    if len(k.shape) != rank:
        raise ArgumentError("k", f"shape {layout} (rank {rank}, like q)", f"shape {k.shape}", op=NAME)
    if rank == 3:
        (b, sq, d), (kb, sk, kd), hq, hk = q.shape, k.shape, 1, 1
    else:
        (b, hq, sq, d), (kb, hk, sk, kd) = q.shape, k.shape
    if kb != b or kd != d:
        raise ArgumentError("k", f"shape {layout} with B = {b} and D = {d} (from q)", f"shape {k.shape}", op=NAME)
    if rank == 4 and (hk < 1 or hq % hk):
        raise ArgumentError("k", f"a number of heads dividing q's {hq} (grouped-query attention)",
                            f"{hk} heads (shape {k.shape})", op=NAME)
    if tuple(v.shape) != tuple(k.shape):
        raise ArgumentError("v", f"the shape of k {tuple(k.shape)} (value head dim = D)", f"shape {v.shape}", op=NAME)
    if v.layout != k.layout:
        raise ArgumentError("v", f"k's memory layout ({_layout_name(k.layout)})", _layout_name(v.layout), op=NAME)
    if v.pitch != k.pitch:
        raise ArgumentError("v", f"k's row pitch ({_pitch_name(k.pitch)}: k and v are read with one pitch)",
                            _pitch_name(v.pitch), op=NAME)
    for name, spec in (("q", q), ("k", k)):
        if spec.pitch and (spec.layout != "bshd" or spec.pitch < spec.shape[1] * spec.shape[3]):
            raise ArgumentError(name, "a row pitch only for [B, S, H, D] storage, of at least H * D elements",
                                f"pitch {spec.pitch} with layout {_layout_name(spec.layout)}, shape {spec.shape}", op=NAME)
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ArgumentError("q", f"a head dim D in 1..{MAX_HEAD_DIM} (fused kernels: any D on matrix cores, "
                            "32/64/96/128 on the SIMT cores; other D run three_stage)", f"D = {d}", op=NAME)
    mask_shape = mask_dtype = None
    if mask is not None:
        require_dtype(NAME, "mask", mask, ("float32", q.dtype))
        full = (b, hq, sq, sk) if rank == 4 else (b, sq, sk)
        target = "[B, H, Sq, Sk]" if rank == 4 else "[B, Sq, Sk]"
        shape = tuple(mask.shape)
        ok = len(shape) <= len(full) and all(m in (1, f) for m, f in zip(reversed(shape), reversed(full)))
        if not ok:
            raise ArgumentError("mask", f"a shape that broadcasts to {target} = {full}", f"shape {shape}", op=NAME)
        mask_shape, mask_dtype = shape, mask.dtype
    precision = resolve_precision(NAME, attrs.get("precision"), q.dtype)
    if precision == "3xtf32":
        precision = "highest"      # near-fp32 accuracy asked: the exact fp32 kernels give it
    return AttentionProblem(int(b), int(hq), int(hk), int(sq), int(sk), int(d), q.dtype, rank,
                            _causal_mode(attrs.get("causal", False)), _scale(attrs.get("scale"), int(d)),
                            mask_shape, mask_dtype, q.layout, k.layout, precision,
                            _dense_as_zero(q), _dense_as_zero(k))


def _dense_as_zero(spec: TensorSpec) -> int:
    """A spec's pitch, 0 when it is the dense one (H * D): one key for one memory layout."""
    return 0 if not spec.pitch or spec.pitch == spec.shape[1] * spec.shape[3] else spec.pitch


def _layout_name(layout: str) -> str:
    return {"bshd": "[B, S, H, D] (bshd)", "sbhd": "[S, B, H, D] (sbhd)"}.get(layout, "[B, H, S, D]")


def _pitch_name(pitch: int) -> str:
    return f"rows {pitch} elements apart" if pitch else "dense rows"


def parse_problem(spec: Mapping[str, str]) -> AttentionProblem:
    """`jitops compile attention q=8x16x2048x64 [k=...] [mask=2048x2048] dtype=float16 causal=true
    [layout=bshd [pitch=P] [kv_pitch=P]] [precision=tf32]` (shapes logical [B, H, S, D]; bshd: q, k, v stored
    [B, S, H, D]; pitch / kv_pitch: their rows P elements apart, slices of a packed projection; kv_pitch
    defaults to pitch)."""
    allowed = {"q", "k", "v", "mask", "dtype", "mask_dtype", "causal", "scale", "layout", "precision", "pitch",
               "kv_pitch"}
    extra = set(spec) - allowed
    if extra:
        raise ArgumentError(sorted(extra)[0], f"one of {', '.join(sorted(allowed))}", op=NAME)
    dtype = spec.get("dtype", "float32")
    q = parse_shape(spec.get("q", "256x128x64"))
    k = parse_shape(spec.get("k", "x".join(map(str, q))))
    v = parse_shape(spec.get("v", "x".join(map(str, k))))
    layout = spec.get("layout", "")
    if layout not in ("", "bhsd", "bshd", "sbhd") or (layout in ("bshd", "sbhd") and len(q) != 4):
        raise ArgumentError("layout", "bhsd, bshd or sbhd (4-d q only)", layout, op=NAME)
    layout = "" if layout == "bhsd" else layout
    q_pitch = int(spec.get("pitch", 0))
    kv_pitch = int(spec.get("kv_pitch", q_pitch))
    inputs = {"q": TensorSpec(q, dtype, layout, q_pitch), "k": TensorSpec(k, dtype, layout, kv_pitch),
              "v": TensorSpec(v, dtype, layout, kv_pitch), "mask": None}
    if "mask" in spec:
        inputs["mask"] = TensorSpec(parse_shape(spec["mask"]), spec.get("mask_dtype", dtype))
    causal: Any = spec.get("causal", "false")
    causal = {"true": True, "false": False}.get(str(causal).lower(), causal)
    scale = float(spec["scale"]) if "scale" in spec else None
    return make_problem(inputs, {"causal": causal, "scale": scale, "precision": spec.get("precision")})


# ---- float64 reference, data, tolerances ----

def reference(problem: AttentionProblem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """softmax(scale q k^T + mask) v in float64, with the causal rule and zeros for unseen rows;
    inputs and output in storage order (as random_inputs makes them)."""
    p = problem
    specs = p.inputs()
    q, k, v = (_logical(_unpacked(np.asarray(inputs[n], dtype=np.float64), specs[n]), specs[n].layout)
               for n in ("q", "k", "v"))
    if p.rank == 3:
        q, k, v = q[:, None], k[:, None], v[:, None]
    k = np.repeat(k, p.group, axis=1)
    v = np.repeat(v, p.group, axis=1)
    s = p.scale * np.einsum("bhid,bhjd->bhij", q, k)
    if p.has_mask:
        m = np.asarray(inputs["mask"], dtype=np.float64)
        if p.rank == 3:
            m = m.reshape((1,) * (3 - m.ndim) + m.shape)[:, None]
        s = s + m
    if p.causal != "none":
        i = np.arange(p.sq)[:, None]
        j = np.arange(p.sk)[None, :]
        s = np.where(j <= i + p.causal_offset, s, -np.inf)
    with np.errstate(invalid="ignore"):
        mx = s.max(axis=-1, keepdims=True, initial=-np.inf)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        e = np.exp(s - mx)
        total = e.sum(axis=-1, keepdims=True)
        out = np.einsum("bhij,bhjd->bhid", e, v) / np.where(total > 0, total, 1.0)
    out = np.where(total > 0, out, 0.0)
    return {"out": out[:, 0] if p.rank == 3 else _storage(out, p.q_layout)}


def _unpacked(x: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A pitched input given as its packed rows [B, S, P] (random_inputs): its [B, S, H, D] columns."""
    if not spec.pitch:
        return x
    b, h, s, d = spec.shape
    return x.reshape(b, s, -1)[..., :h * d].reshape(b, s, h, d)


def _logical(x: np.ndarray, layout: str) -> np.ndarray:
    """Storage-order data as [B, H, S, D] (its layout's inverse permutation); x itself for the default."""
    return np.ascontiguousarray(x.transpose(inverse_permutation(layout))) if layout else x


def _storage(x: np.ndarray, layout: str) -> np.ndarray:
    """[B, H, S, D] data in its layout's storage order."""
    return np.ascontiguousarray(x.transpose(LAYOUTS[layout][0])) if layout else x


def random_inputs(problem: AttentionProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Arrays in storage order (what a kernel reads: [B, S, H, D] for a bshd side, whole packed rows [B, S, P]
    for a pitched one, the columns past H * D random too)."""
    p = problem
    data = {n: rng.standard_normal(_packed_shape(s)).astype(s.dtype) for n, s in p.inputs().items() if n != "mask"}
    if p.has_mask:
        data["mask"] = rng.standard_normal(p.mask_shape).astype(p.mask_dtype)
    return data


def _packed_shape(spec: TensorSpec) -> tuple[int, ...]:
    if not spec.pitch:
        return spec.storage_shape
    b, _, s, _ = spec.shape
    return (b, s, spec.pitch)


def tolerance(problem: AttentionProblem, schedule: Any) -> tuple[float, float]:
    """Accepted error, relative to max |reference|, on inputs of order 1 (random_inputs).

    fp32: fp32 dot products of D terms, exp2 on the SFU (about 2 ulp) and sums over Sk keys:
    a few 1e-6. fp16: the output is rounded to fp16 (half an ulp: 2^-11 of the largest value),
    and on the matrix cores P is rounded to fp16 before P V (2^-11 relative per term, averaged).
    bf16: the same two roundings with an 8-bit significand (half an ulp: 2^-9, 8x fp16's), so 8x
    fp16's allowance: 1.6e-2.
    """
    if problem.dtype == "float32" and getattr(schedule, "algorithm", "") == "fused_tf32":
        return (TF32_TOLERANCE, TF32_TOLERANCE)
    if problem.dtype == "float32":
        return (2e-5, 2e-5)
    if problem.dtype == "bfloat16":
        return (1.6e-2, 1.6e-2)
    return (2e-3, 2e-3)
