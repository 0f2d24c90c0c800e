"""Which kernels cuDNN runs on small latency-bound 1x1 layers, and their time against jitops' pick (GPU).

For each layer (batch, Cin, H = W, Cout), NCHW and channels_last fp16: jitops' pick checked against an fp32
convolution, both timed by CUDA-graph replay (median of 7 trials of 50 calls, cudnn.benchmark on), and the
names of the kernels torch's convolution launched (torch.profiler).

    python3 scripts/device_conv2d_vendor_kernels.py [--layers 1x512x16x512,8x2048x7x512,...]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

LAYERS = "1x512x16x512,1x2048x7x512,1x512x7x2048,1x1024x14x256,1x256x14x1024,1x1024x14x2048,1x512x28x128," \
         "1x128x28x512,1x64x56x256,1x256x56x64,8x2048x7x512,8x512x7x2048"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=LAYERS, help="NxCinxHWxCout,...")
    args = ap.parse_args()
    import torch

    import jitops
    from jitops.bench.timing import Timer
    torch.backends.cudnn.benchmark = True
    timer, failures = Timer(torch), 0
    for text in args.layers.split(","):
        n, ci, hw, co = (int(v) for v in text.split("x"))
        for channels_last in (False, True):
            x = torch.randn(n, ci, hw, hw, device="cuda", dtype=torch.float16)
            w = torch.randn(co, ci, 1, 1, device="cuda", dtype=torch.float16) / ci ** 0.5
            if channels_last:
                x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
            ref = torch.nn.functional.conv2d(x.float(), w.float())
            err = (jitops.conv2d(x, w).float() - ref).abs().max().item()
            failures += not err < 1e-2
            ours = timer.graph_us(lambda: jitops.conv2d(x, w), n=50, trials=7)
            cudnn = timer.graph_us(lambda: torch.nn.functional.conv2d(x, w), n=50, trials=7)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    torch.nn.functional.conv2d(x, w)
                torch.cuda.synchronize()
            names = sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
            print(f"{text} {'NHWC' if channels_last else 'NCHW'} error {err:.1e} jitops {ours:6.2f} us cudnn "
                  f"{cudnn:6.2f} us ratio {cudnn / ours:.2f} | {names}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
