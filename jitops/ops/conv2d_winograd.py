"""Winograd minimal filtering F(m x m, 3 x 3) (Lavin & Gray 2016): Y = A^T [(G g G^T) . (B^T d B)] A.

The matrices are exact rationals written as floats; templates unroll them with zero terms
dropped. `transform_reference` runs the same algorithm in float64 so that tests can separate
the method's own error (none in exact arithmetic) from fp32 rounding.
"""
from __future__ import annotations

import numpy as np

# F(2x2, 3x3): interpolation points 0, 1, -1 (and infinity); 16 products per 4 outputs.
F2 = {
    "BT": [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
    "G": [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
    "AT": [[1, 1, 1, 0], [0, 1, -1, -1]],
}

# F(4x4, 3x3): points 0, 1, -1, 2, -2 (and infinity); 36 products per 16 outputs. The larger
# entries (up to 8 in A^T, 5 in B^T) amplify rounding: about 10x the error of F(2x2) in fp32.
F4 = {
    "BT": [[4, 0, -5, 0, 1, 0],
           [0, -4, -4, 1, 1, 0],
           [0, 4, -4, -1, 1, 0],
           [0, -2, -1, 2, 1, 0],
           [0, 2, -1, -2, 1, 0],
           [0, 4, 0, -5, 0, 1]],
    "G": [[1 / 4, 0, 0],
          [-1 / 6, -1 / 6, -1 / 6],
          [-1 / 6, 1 / 6, -1 / 6],
          [1 / 24, 1 / 12, 1 / 6],
          [1 / 24, -1 / 12, 1 / 6],
          [0, 0, 1]],
    "AT": [[1, 1, 1, 1, 1, 0],
           [0, 1, -1, 2, -2, 0],
           [0, 1, 1, 4, 4, 0],
           [0, 1, -1, 8, -8, 1]],
}

MATRICES = {2: F2, 4: F4}


def alpha(m: int) -> int:
    """Side of the transformed tile: m + r - 1 for r = 3."""
    return m + 2


def matrices(m: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in MATRICES[m].items()}


def transform_reference(x: np.ndarray, w: np.ndarray, m: int, pad: tuple[int, int, int, int]) -> np.ndarray:
    """Stride-1 3x3 convolution of NCHW x with OIHW w by F(m x m, 3 x 3), in float64 (for tests)."""
    mats = matrices(m)
    bt, g, at = mats["BT"], mats["G"], mats["AT"]
    n, cin, h, wd = x.shape
    cout = w.shape[0]
    oh, ow = h + pad[0] + pad[2] - 2, wd + pad[1] + pad[3] - 2
    th, tw = -(-oh // m), -(-ow // m)
    a = alpha(m)
    xp = np.zeros((n, cin, th * m + 2, tw * m + 2))
    xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd] = x[:, :, :th * m + 2 - pad[0], :tw * m + 2 - pad[1]]
    u = np.einsum("ij,ocjk,lk->ocil", g, w.astype(np.float64), g)                    # G g G^T
    y = np.zeros((n, cout, th * m, tw * m))
    for i in range(th):
        for j in range(tw):
            d = xp[:, :, i * m:i * m + a, j * m:j * m + a]
            v = np.einsum("ij,ncjk,lk->ncil", bt, d, bt)                               # B^T d B
            mm = np.einsum("ocil,ncil->noil", u, v)
            y[:, :, i * m:(i + 1) * m, j * m:(j + 1) * m] = np.einsum("ij,nojk,lk->noil", at, mm, at)
    return y[:, :, :oh, :ow]
