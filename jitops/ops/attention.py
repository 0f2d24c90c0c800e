"""attention: out = softmax(scale * q k^T + mask) v, fp32, fp16 or bf16 (softmax and sums in fp32).

The op contract (docs/adding_an_op.md) is split over two modules to keep each small:
attention_problem (shapes, validation, float64 reference, data, tolerances) and
attention_schedule (the scheduler, the tuning space, plans). Algorithms, fastest first:
fused_wgmma (Hopper warpgroup MMA, sm_90a, long prefill; attention_wgmma), fused_mma (matrix
cores, fp16/bf16, any head dim; attention_mma), fused (SIMT), three_stage (GEMM + softmax +
GEMM), naive.
"""
from __future__ import annotations

from .attention_mma import MMA_DTYPES
from .attention_problem import (CAUSAL_MODES, INPUTS, MAX_HEAD_DIM, NAME, AttentionProblem, make_problem,
                                parse_problem, random_inputs, reference, tolerance)
from .attention_schedule import ALGORITHMS, SIMT_HEAD_DIMS, candidates, heuristic, plan, shortlist, variants

# q, k and v may be stored [B, S, H, D] or [S, B, H, D] (torch views of those, or arrays declared
# layout="bshd" / "sbhd"); "bhsd" names the default
LAYOUTS = ("bshd", "sbhd")
DEFAULT_LAYOUT = "bhsd"
LAYOUT_INPUTS = ("q", "k", "v")

# Schedule-space generation (jitops.records): 1 since fused_wgmma with TMA (2026-11-25); records
# tuned before it never saw that kernel and are skipped (a 2026-11-23 record pinned the seed shape to
# fused_mma at 0.99x torch where fused_wgmma runs 1.10x, H100).
SPACE = 1

__all__ = ["NAME", "SPACE", "INPUTS", "ALGORITHMS", "CAUSAL_MODES", "MAX_HEAD_DIM", "MMA_DTYPES", "SIMT_HEAD_DIMS",
           "AttentionProblem", "make_problem", "parse_problem", "heuristic", "candidates", "shortlist", "plan", "variants",
           "reference", "random_inputs", "tolerance", "bytes_moved", "flops", "timed_warm_l2"]


# ---- registration (base.Registration: bench, tuning problems, vendor op, ONNX types; see
# docs/adding_an_op.md). jitops.ops derives every list of ops from it.
from .base import Registration  # noqa: E402
REGISTRATION = Registration(tuning_problems="jitops.tuning.shipped:attention_problems",
                            vendor="jitops.tuning.vendor:torch_attention", onnx=("Attention", "Softmax"))


def bytes_moved(problem: AttentionProblem) -> int:
    return problem.bytes_moved()


def flops(problem: AttentionProblem) -> int:
    return problem.flops()


def timed_warm_l2(problem: AttentionProblem, device) -> bool:
    """q, k, v, mask and out fit in 80% of L2: the tuner then times the problem with them left there
    (measure.timed_warm), as in a network (the projections just wrote q, k and v) and in graph
    replays; conv2d follows the same rule."""
    return problem.bytes_moved() <= 0.8 * device.l2_bytes
