"""Row normalizations (layer_norm, rms_norm, group_norm in NCHW): where each part lives, and the
names the ops import.

A row is what one statistic covers: a layer/rms-norm row (the trailing dims) or a group-norm
group (channels/groups channels of one sample, contiguous in NCHW). Row kernels
(templates/rows/) come in four strategies the scheduler picks from:

  warp   - a warp, or a power-of-two part of one, per row; the row in registers (short rows)
  block  - a block per row, the row in registers or shared memory: the input is read once
  stream - a block per row for rows too long to keep: statistics, then a second read
  split  - few long rows: each row over several blocks, a grid reduction (atomic ticket, the last
           block merges and resets the counter) then a separate normalize kernel
  naive  - block per row, scalar, tree reduction in shared memory (the seeds' baseline)

Statistics: two_pass (on chip only: exact deviations, corrected mean), welford (Chan merges of
per-vector states, shifted by the row's first element) or sumsq (one pass over x - K, K the
row's first element: fast, and well conditioned unless that element is an outlier, so never the
default for layer/group norm). rms_norm's mean of squares has nothing to cancel.

  norm_args       argument checks (tensors, dtypes, eps, normalized_shape, parameter dtype)
  norm_rows       RowSpec, algorithms, statistics, vector widths
  norm_schedule   row_heuristic (the scheduler) and row_candidates (the tuning space)
  norm_plan       row_plan: the launches of a schedule
  norm_affine     the per-channel affine apply (batch norm, group norm's split and NHWC paths)
  norm_reference  float64 references and tolerances
  norm_trailing   layer_norm and rms_norm: one implementation, two public ops
"""
from __future__ import annotations

from .norm_plan import row_plan
from .norm_reference import layer_reference, row_tolerance
from .norm_rows import LAYER_STATS, REG_ROW_BYTES, ROW_ALGORITHMS, RowSpec, ptr_or_none, vector_width
from .norm_schedule import row_candidates, row_heuristic

__all__ = ["LAYER_STATS", "REG_ROW_BYTES", "ROW_ALGORITHMS", "RowSpec", "layer_reference", "ptr_or_none",
           "row_candidates", "row_heuristic", "row_plan", "row_tolerance", "vector_width"]
