"""Offline SASS of one attention schedule for sm_90a, and the instructions of each wgmma block (from
WARPGROUP.ARRIVE to the DEPBAR that waits for it): how much integer and uniform work surrounds the
matrix instructions. Needs NVRTC (cuda-bindings) and nvdisasm (`pip download nvidia-cuda-nvdisasm`,
unpacked; pass its path with --nvdisasm).

    python3 scripts/wgmma_sass_blocks.py --shape 8x16x2048x64 --schedule fused_wgmma:groups=2,block_k=128,tma=1
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile

from jitops import codegen
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec, parse_value
from jitops.runtime import get_backend

LINE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8x16x2048x64", help="B x H x S x D")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--schedule", required=True, help="ALGORITHM:name=value,...")
    ap.add_argument("--nvdisasm", default="nvdisasm")
    args = ap.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    backend = get_backend(target="sm_90")
    op = get_op("attention")
    specs = {n: TensorSpec(shape, args.dtype) for n in ("q", "k", "v")}
    problem = op.make_problem({**specs, "mask": None}, {"causal": args.causal})
    algorithm, _, params = args.schedule.partition(":")
    schedule = Schedule.make(algorithm, **{k: parse_value(v) for k, v in (p.split("=") for p in params.split(",") if p)})
    launch = op.plan(problem, schedule, backend.device).launches[0]
    source = codegen.full_source(backend.device, launch.template, dict(launch.params))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(backend.compile(source, [launch.kernel], "k"))
        f.flush()
        sass = subprocess.run([args.nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = [m.group(2) for m in map(LINE.match, sass.splitlines()) if m]
    counts = collections.Counter(o.split(".")[0] for o in ops)
    print(f"{schedule}: {len(ops)} SASS instructions; most common: {counts.most_common(12)}")
    start = None
    for i, o in enumerate(ops):
        if o.startswith("WARPGROUP.ARRIVE"):
            start = i
        elif o.startswith("WARPGROUP.DEPBAR") and start is not None:
            block = ops[start:i + 1]
            print(f"  wgmma block: {len(block)} instructions, {sum(o.startswith('HGMMA') for o in block)} HGMMA, "
                  f"{sum(o.startswith(('R2UR', 'UMOV', 'UIADD3', 'IMAD', 'IADD3', 'VIADD', 'LEA', 'ULEA')) for o in block)}"
                  " integer / uniform")
            start = None


if __name__ == "__main__":
    main()
