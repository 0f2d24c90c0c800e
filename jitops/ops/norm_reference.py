"""float64 references and accepted errors of the row normalizations (layer, rms and group norm)."""
from __future__ import annotations

import numpy as np

def layer_reference(x: np.ndarray, rows: int, length: int, eps: float, rms: bool) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) per row (two-pass, float64), or x / sqrt(mean(x^2) + eps)."""
    xd = np.asarray(x, dtype=np.float64).reshape(rows, length)
    if rms:
        return xd / np.sqrt((xd * xd).mean(axis=1, keepdims=True) + eps)
    mean = xd.mean(axis=1, keepdims=True)
    dev = xd - mean
    return dev / np.sqrt((dev * dev).mean(axis=1, keepdims=True) + eps)


def row_tolerance(dtype: str, algorithm: str, stats: str | None) -> tuple[float, float]:
    """(rtol, atol) against the float64 reference, relative to the largest |y|.

    fp32: a few roundings per element plus the statistics' own error (well under 1e-6 of the
    spread for every stable method): 4e-6. fp16: the output rounding alone is 2^-11 (4.9e-4),
    the input rounding does not count (the reference sees the same fp16 values): 2e-3.
    bf16: 8 significant bits, the output rounding alone is up to 2^-8 (3.9e-3) of |y|: 5e-3.
    The naive group-norm kernel uses the seed's one-pass sum/sum of squares, exact enough only
    on centred data; the tests give it centred data."""
    if dtype == "bfloat16":
        return 5e-3, 0.0
    if dtype == "float16":
        return 2e-3, 0.0
    return (2e-5 if algorithm == "naive" else 4e-6), 0.0


def norm_random_inputs(x_shape: tuple[int, ...], param_shape: tuple[int, ...] | int, dtype: str, ptype: str,
                       has_gamma: bool, has_beta: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x off-centre (mean 0.5, std 2: a missing mean subtraction shows), gamma around 1, beta N(0, 1)."""
    out = {"x": (rng.standard_normal(x_shape) * 2.0 + 0.5).astype(dtype)}
    if has_gamma:
        out["gamma"] = (1.0 + 0.5 * rng.standard_normal(param_shape)).astype(ptype)
    if has_beta:
        out["beta"] = rng.standard_normal(param_shape).astype(ptype)
    return out
