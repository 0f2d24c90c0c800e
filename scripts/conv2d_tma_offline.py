"""The TMA conv2d kernel offline (no GPU): each tile compiled for sm_90a with NVRTC, its ptxas report
(registers, spills, stack, warnings: C7508 an ignored setmaxnreg, C7512 / C7518 / C7519 serialized
wgmma) and, with --nvdisasm PATH, the SASS counts that matter (HGMMA, LDL / STL, UTMALDG).

    PYTHONPATH=$PWD python3 scripts/conv2d_tma_offline.py [--dtype float16|bfloat16|tf32] [--nvdisasm PATH]
"""
from __future__ import annotations

import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/scripts")
from attention_wgmma_offline import source_report, summary  # noqa: E402

from jitops import codegen  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops import get_op  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402
from jitops.runtime import get_backend  # noqa: E402

OP = get_op("conv2d")


def report(backend, p, s, nvdisasm=None):
    """(ptxas log, SASS opcode counts or None) of the TMA kernel of schedule s."""
    launch = [la for la in OP.plan(p, s, backend.device).launches if la.kernel == "conv2d_wgmma_tma"][0]
    text, _, counts = source_report(backend, codegen.full_source(backend.device, launch.template, dict(launch.params)),
                                    nvdisasm)
    return text, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--nvdisasm", default=None)
    ap.add_argument("--tiles", default="", help="bm,bn,stages,wgs,regs;... (default: TMA_TILES)")
    ap.add_argument("--bias", action="store_true", help="bias + residual + relu")
    args = ap.parse_args()
    backend = get_backend(target="sm_90")
    tf32 = args.dtype == "tf32"
    dt = "float32" if tf32 else args.dtype
    extra = {"bias": TensorSpec((128,), dt), "residual": TensorSpec((4, 128, 64, 64), dt, "nhwc")} if args.bias else {}
    p = OP.make_problem({"x": TensorSpec((4, 64, 64, 64), dt, "nhwc"), "w": TensorSpec((128, 64, 3, 3), dt), **extra},
                        {"padding": 1, **({"precision": "tf32"} if tf32 else {}),
                         **({"activation": "relu"} if args.bias else {})})
    tiles = [tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";") if t] or wg.TMA_TILES
    for tile in tiles:
        s = wg.tma_schedule(tile, wg.bk_of(p))
        text, counts = report(backend, p, s, args.nvdisasm)
        extra_counts = f", UTMALDG {counts['UTMALDG']}" if counts else ""
        print(f"{args.dtype} {tile}: {summary(text, counts)}{extra_counts}", flush=True)
        if "error" in text.lower() or "warning" in text.lower():
            print("   ", "\n    ".join(line for line in text.splitlines() if "arning" in line or "rror" in line)[:1500])


if __name__ == "__main__":
    main()
