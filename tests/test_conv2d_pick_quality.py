"""The conv2d heuristic scored on recorded device sweeps (docs/data): what its picks take against the fastest
schedule timed there. A cost-model or rule change that slows the picks down on real layers fails here, on
the CPU, before anyone times it on a GPU. The bounds sit just above the figures of 2026-11-29 (H200: 1.025x
the fastest over 307 layers with the ranking-aware rates, 1.044x before them; H100 TMA choices: 1.030x)."""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import jitops

ROOT = Path(__file__).resolve().parents[1]
H200_SWEEPS = [ROOT / "docs/data/conv2d_h200_sweep_2026-11-29" / f"pool_sweep{i}.json.gz" for i in (1, 2, 3)]
# The few-channel 1x1 stream's schedules, timed on those layers after the sweeps (pointwise_mma, 2026-11-29).
H200_POINTWISE = [ROOT / "docs/data/conv2d_pointwise_h200_2026-11-29" / name
                  for name in ("layers_12-33.json.gz", "layers_small_batch_12-40.json.gz")]
# The few-pixel 1x1 kernel's schedules on the squeeze-and-excitation layers (gemv_1x1, 2026-11-29 15:48).
H200_GEMV = [ROOT / "docs/data/conv2d_gemv_h200_2026-11-29/gemv_layers_sweep2.json.gz"]
H100_SWEEPS = [ROOT / "docs/data/conv2d_tma_h100_2026-11-26" / f"run{i}_sweep.json.gz" for i in (2, 3, 5)]


def _scripts():
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))


def test_h200_picks_on_real_layers():
    """Every recorded layer (pool sweeps of ResNet-50 b1-b32, DenseNet-121, EfficientNet-B0 / B3, Inception-v3,
    MobileNet-v3, VGG-16 and the 19 large layers): the picks, weighted by how often each network runs a
    layer, within 3% of the fastest schedule timed, nearly all of them timed, ResNet-50 b32's convolutions
    5% ahead of cuDNN's (3% before the ranking-aware rates), MobileNet-v3's and EfficientNet-B0's ahead of
    cuDNN's with the few-pixel 1x1 kernel on their squeeze-and-excitation layers (0.86x / 1.02x before it).
    The sweeps timed the TMA kernel's 1x1 layers through the im2col map: a pick reading A by the tiled map
    (same tile, 1.018x faster) is scored at its im2col twin's time."""
    _scripts()
    import conv2d_pick_regret as regret
    device = dataclasses.replace(jitops.get_backend(target="sm_90").device, name="NVIDIA H200")
    rows = regret.distinct([r for path in H200_SWEEPS for r in regret.load(str(path))])
    for path in H200_POINTWISE + H200_GEMV:
        rows = regret.merge_times(rows, regret.load(str(path)))
    assert len(rows) == 319
    nets, untimed = regret.score(rows, device)
    assert len(rows) - len(untimed) >= 300, \
        f"only {len(rows) - len(untimed)} of {len(rows)} picks were timed: the sweeps no longer cover them"
    mine, best = sum(s["pick"] for s in nets.values()), sum(s["best"] for s in nets.values())
    assert mine / best <= 1.03, f"the picks take {mine / best:.3f}x the fastest schedules timed"
    for net, floor in (("resnet50 b32", 1.05), ("mobilenet_v3_large b32", 1.03), ("efficientnet_b0 b32", 1.18),
                       ("efficientnet_b3 b32", 1.3)):
        ratio = nets[net]["cudnn"] / nets[net]["pick"]       # MobileNet / EfficientNet-B0: 0.73x / 0.97x before the stream
        assert ratio >= floor, f"{net}'s convolutions at {ratio:.3f}x cuDNN"


def test_h100_tma_choices():
    """The H100 sweeps the TMA constants were fitted on (2026-11-26): the heuristic's choice between the TMA
    kernel and the rest within 3.5% of the faster of the two measured, on geometric mean."""
    _scripts()
    import conv2d_tma_fit as fit
    from jitops.ops import conv2d_wgmma as wg
    rows = [r for path in H100_SWEEPS for r in fit.load(str(path)) if isinstance(r.get("times"), dict)]
    assert len(rows) > 200
    geo, worst = fit.evaluate(rows, wg.TMA_RATE, wg.TMA_OVERHEAD, wg.TMA_PERSISTENT_OVERHEAD,
                              l2=wg.TMA_L2_BYTES_PER_S, margin=None, quiet=True)
    assert geo <= 1.035 and math.isfinite(worst), (geo, worst)
