"""fused_wgmma offline (no GPU): each schedule compiled for sm_90a with NVRTC, its ptxas report (registers,
spills, stack, warnings such as C7508 for an ignored setmaxnreg or C7519 for serialized wgmma) and the
SASS counts that matter (HGMMA, local-memory LDL / STL; needs nvdisasm: `pip install nvidia-cuda-nvdisasm`,
pass --nvdisasm PATH); or (--sources DIR) the rendered source and cubin hash of every scheduler pick and
tuner candidate of the model shapes, to check that a template change leaves them byte-identical.

    python3 scripts/attention_wgmma_offline.py --shape 8x16x2048x128 \
        --schedule fused_wgmma:groups=2,block_k=64,tma=1
    python3 scripts/attention_wgmma_offline.py --sources /tmp/before   (then /tmp/after; diff -r)
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import re
import subprocess
import tempfile

from jitops import codegen
from jitops.errors import ScheduleError
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec, parse_value
from jitops.runtime import get_backend

LINE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")
OP = get_op("attention")


def problem(q, kv, dtype="float16", causal=False):
    specs = {"q": TensorSpec(q, dtype), "k": TensorSpec(kv, dtype), "v": TensorSpec(kv, dtype), "mask": None}
    return OP.make_problem(specs, {"causal": causal})


def compile_report(backend, p, schedule, nvdisasm=None):
    """(ptxas log, cubin bytes, SASS opcode counts or None) of one schedule's kernel."""
    launch = OP.plan(p, schedule, backend.device).launches[0]
    return source_report(backend, codegen.full_source(backend.device, launch.template, dict(launch.params)), nvdisasm)


def source_report(backend, source, nvdisasm=None):
    """(ptxas log, cubin bytes, SASS opcode counts or None) of one rendered source, compiled with the
    backend's options (NVRTC; the log is kept on success too, unlike the backend's compile)."""
    from jitops.runtime.cuda_backend import _nvrtc
    nv = _nvrtc()
    _, prog = nv.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    opts = [o.encode() for o in backend._source_options(source, "k")]
    (res,) = nv.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nv.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nv.nvrtcGetProgramLog(prog, buf)
    text = buf.rstrip(b"\0 ").decode(errors="replace")
    if int(res) != 0:
        raise RuntimeError(text)
    _, size = nv.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nv.nvrtcGetCUBIN(prog, cubin)
    nv.nvrtcDestroyProgram(prog)
    counts = None
    if nvdisasm:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        counts = collections.Counter(m.group(2).split(".")[0] for m in map(LINE.match, sass.splitlines()) if m)
    return text, bytes(cubin), counts


def summary(text, counts):
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    warns = sorted(set(re.findall(r"(C\d{4})", text)))
    out = f"regs {regs.group(1) if regs else '?'}, stack {spill.group(1)}, spill st/ld {spill.group(2)}/{spill.group(3)}"
    out += f", warnings {warns or 'none'}"
    if counts is not None:
        out += (f", HGMMA {counts['HGMMA']}, LDL {counts['LDL']}, STL {counts['STL']}, "
                f"SETMAXNREG {counts['USETMAXREG'] + counts['SETMAXNREG']}")
    return out


MODEL_SHAPES = [((8, 16, 2048, 64), (8, 16, 2048, 64), False), ((8, 16, 2048, 64), (8, 16, 2048, 64), True),
                ((8, 16, 2048, 128), (8, 16, 2048, 128), False), ((8, 16, 2048, 128), (8, 16, 2048, 128), True),
                ((256, 128, 64), (256, 128, 64), False)]


def sources(out_dir, backend, compile_picks=True):
    """Every pick and tuner candidate of fused_wgmma on the model shapes: rendered source (and, for the
    picks, the cubin's sha256) under out_dir, one file per schedule."""
    from jitops.bench.attention import MODELS
    os.makedirs(out_dir, exist_ok=True)
    shapes = MODEL_SHAPES + [(q, kv, c) for _, q, kv, c in MODELS]
    hashes = []
    for dtype in ("float16", "bfloat16"):
        for q, kv, causal in shapes:
            p = problem(q, kv, dtype, causal)
            pick = OP.heuristic(p, backend.device)
            scheds = [pick] + [c for c in OP.candidates(p, backend.device) if c.algorithm == "fused_wgmma"]
            for i, s in enumerate(scheds):
                try:
                    launch = OP.plan(p, s, backend.device).launches[0]
                except ScheduleError:
                    continue
                src = codegen.full_source(backend.device, launch.template, dict(launch.params))
                name = f"{dtype}_{'x'.join(map(str, q))}_{'x'.join(map(str, kv))}_{causal}_{i}_{s}".replace(" ", "")
                name = re.sub(r"[^A-Za-z0-9_.=,-]", "_", name)[:200]
                with open(os.path.join(out_dir, name + ".cu"), "w") as f:
                    f.write(f"// {s}\n// {dict(launch.params)}\n" + src)
                if i == 0 and compile_picks and s.algorithm == "fused_wgmma":
                    _, cubin, _ = compile_report(backend, p, s)
                    hashes.append(f"{name} {hashlib.sha256(cubin).hexdigest()}")
    with open(os.path.join(out_dir, "picks.sha256"), "w") as f:
        f.write("\n".join(sorted(set(hashes))) + "\n")
    print(f"{len(os.listdir(out_dir)) - 1} sources, {len(set(hashes))} pick cubins hashed under {out_dir}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8x16x2048x128", help="B x H x S x D")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--schedule", action="append", default=[], help="ALGORITHM:name=value,... (repeatable)")
    ap.add_argument("--nvdisasm", default=None)
    ap.add_argument("--sources", help="write every pick's / candidate's source and the picks' cubin hashes here")
    args = ap.parse_args()
    backend = get_backend(target="sm_90")
    if args.sources:
        sources(args.sources, backend)
        return
    shape = tuple(int(n) for n in args.shape.split("x"))
    p = problem(shape, shape, args.dtype, args.causal)
    for spec in args.schedule:
        algorithm, _, params = spec.partition(":")
        s = Schedule.make(algorithm, **{k: parse_value(v) for k, v in (q.split("=") for q in params.split(",") if q)})
        text, _, counts = compile_report(backend, p, s, args.nvdisasm)
        print(f"{args.dtype} {args.shape}{' causal' if args.causal else ''} {s}: {summary(text, counts)}", flush=True)


if __name__ == "__main__":
    main()
