"""What the row-normalization kernels know about a problem (RowSpec), and the small rules the
scheduler and the planner share: algorithms, statistics, vector widths (norm_common: the
strategies, and which module holds what)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from .base import ITEMSIZE, Buf

ROW_ALGORITHMS = ("warp", "block", "stream", "split", "naive")
LAYER_STATS = ("two_pass", "welford", "sumsq")
REG_ROW_BYTES = 32 << 10        # rows up to this size stay in registers, longer ones in shared memory


def vector_width(length: int, itemsize: int) -> int:
    """The widest power-of-two vector (at most 16 bytes) that tiles a row exactly."""
    vec = 16 // itemsize
    while vec > 1 and length % vec:
        vec //= 2
    return vec


def ptr_or_none(name: str, present: bool) -> list[Buf]:
    return [Buf(name)] if present else []


@dataclass(frozen=True)
class RowSpec:
    """What the row kernels need to know about a layer/rms/group-norm problem."""

    op: str
    kind: str                 # "layer": mean and variance; "rms": mean of squares
    rows: int
    length: int
    dtype: str
    ptype: str
    has_gamma: bool
    has_beta: bool
    eps: float
    groups: int = 0           # group norm: parameters per channel, channel = (row % groups) * cpg + i // plane
    cpg: int = 0
    plane: int = 0
    nhwc: bool = False        # group norm on channels_last storage (the naive kernel's addressing)
    # layer / rms norm of s = x + residual [+ bias] (SkipLayerNormalization), s written to `sum`
    has_skip: bool = False
    has_bias: bool = False
    btype: str = ""           # the bias dtype (x's or float32)
    has_sum: bool = False

    @property
    def skip_args(self) -> list[Buf]:
        """The residual and bias buffers, in the row kernels' argument order (after x)."""
        return [*ptr_or_none("residual", self.has_skip), *ptr_or_none("bias", self.has_bias)]

    @property
    def params(self) -> str:
        return "channel" if self.groups else "element"

    @property
    def numel(self) -> int:
        return self.rows * self.length

    @property
    def row_bytes(self) -> int:
        return self.length * ITEMSIZE[self.dtype]


def stats_for(spec: RowSpec, algorithm: str, stats: str | None) -> str:
    if spec.kind == "rms":
        if stats not in (None, "rms"):
            raise ScheduleError(f"{spec.op} has one statistic, the mean of squares (got stats={stats})")
        return "rms"
    if stats is None:
        return "two_pass" if algorithm in ("warp", "block") else "welford"
    if stats not in LAYER_STATS:
        raise ScheduleError(f"{spec.op}: stats must be one of {', '.join(LAYER_STATS)} (got {stats})")
    if stats == "two_pass" and algorithm not in ("warp", "block"):
        raise ScheduleError(f"{spec.op}: two_pass needs the row on chip (warp or block), not {algorithm}")
    return stats



def pow2_ceil(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
