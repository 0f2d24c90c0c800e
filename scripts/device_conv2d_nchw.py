"""fp16 1x1 convolutions on NCHW inputs (torch's default memory format) on a GPU: the wgmma
kernel reading NCHW in place (`b_nchw`, the image as wgmma's transposed B) against what the
scheduler picks without it (mma.sync's `a_nchw` or the NHWC copy + wgmma) and cuDNN.

    python3 scripts/device_conv2d_nchw.py OUT_DIR [--nets resnet50,mobilenet_v3_large,...] [--batch 8]

Every distinct 1x1 / stride-1 / one-group conv of the torchvision networks at batch 8 whose H * W
is a multiple of 4 (random weights, NCHW fp16): cuDNN (benchmark mode, NCHW), the heuristic's pick,
the pick with the b_nchw schedules taken out (what the scheduler picked before them), and every
b_nchw candidate (H * W a multiple of 8). Each schedule is checked against float64 (output NaN-poisoned)
before it is timed; CUDA-graph replay. Writes OUT_DIR/conv2d_nchw.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv2d_devkit import dump, geo, graph_us, op, ref_f64, rel_err  # noqa: E402

import jitops  # noqa: E402
from jitops.ops import conv2d_mma as mma  # noqa: E402
from jitops.ops import conv2d_schedules  # noqa: E402
from jitops.ops import conv2d_wgmma as wg  # noqa: E402
from jitops.ops.base import TensorSpec  # noqa: E402

NETS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_1_6gf")


def layers(names, batch):
    import torchvision.models as tvm
    seen, out = set(), []
    for name in names:
        model = getattr(tvm, name)().eval().cuda().half()

        def hook(mod, inp, _o, name=name):
            x = inp[0]
            key = (tuple(x.shape), tuple(mod.weight.shape), mod.bias is not None)
            if (mod.kernel_size == (1, 1) and mod.stride == (1, 1) and mod.groups == 1 and mod.padding == (0, 0)
                    and (x.shape[2] * x.shape[3]) % 4 == 0 and key not in seen):
                seen.add(key)
                out.append((name, key))
        hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        with torch.no_grad():
            model(torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.half))
        for h in hs:
            h.remove()
    return out


def schedules_of(p, dev) -> dict:
    """The pick, the pick without the b_nchw schedules (what came before them) and every b_nchw one."""
    pick = op.heuristic(p, dev)
    pool = [s for s in conv2d_schedules.candidates(p, dev) if s.algorithm != "naive"
            and not (s.algorithm == mma.ALGORITHM and not int(s.get("a_nchw", 0)))]
    before, _ = conv2d_schedules._best(p, dev, [s for s in pool if not wg.is_nchw_1x1(s)])
    out = {"pick": pick, "before": before}
    out.update({f"b_nchw{i}": s for i, s in enumerate(wg.candidates(p, dev)) if wg.is_nchw_1x1(s)})
    return out


def problem_of(xs, ws, has_b):
    return op.make_problem({"x": TensorSpec(xs, "float16"), "w": TensorSpec(ws, "float16"),
                            "bias": TensorSpec((ws[0],), "float16") if has_b else None}, {})


def precompile_all(found, dev) -> None:
    """Every kernel the timings launch, compiled by parallel workers into the disk cache first."""
    from device_memops import precompile
    cases = []
    for _, (xs, ws, has_b) in found:
        t = {"x": torch.empty(xs, device="cuda", dtype=torch.half), "w": torch.empty(ws, device="cuda", dtype=torch.half),
             "bias": torch.empty(ws[0], device="cuda", dtype=torch.half) if has_b else None}
        for s in schedules_of(problem_of(xs, ws, has_b), dev).values():
            cases.append({"label": f"{xs} {ws}", "spec": ("conv2d", t, {}, s)})
    precompile(cases)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    dev = jitops.get_backend().device
    rows = []
    t0 = time.time()
    found = layers(args.nets.split(","), args.batch)
    precompile_all(found, dev)
    for net, (xs, ws, has_b) in found:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(xs, device="cuda", generator=gen).half()
        w = (torch.randn(ws, device="cuda", generator=gen) / ws[1] ** 0.5).half()
        b = torch.randn(ws[0], device="cuda", generator=gen).half() if has_b else None
        ref = ref_f64(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
        scheds = schedules_of(problem_of(xs, ws, has_b), dev)
        pick, before = scheds["pick"], scheds["before"]
        row = {"net": net, "x": xs, "w": ws, "bias": has_b, "pick": str(pick), "before": str(before), "times": {}}
        out = torch.empty(ref.shape, device="cuda", dtype=torch.half)
        for key, s in scheds.items():
            out.fill_(float("nan"))
            y = jitops.conv2d(x, w, b, out=out, schedule=s)
            err = rel_err(y, ref)
            ok = err <= 2e-3 and not bool(torch.isnan(y).any())
            row["times"][key] = {"schedule": str(s), "ok": ok, "error": err,
                                 "us": graph_us(lambda s=s: jitops.conv2d(x, w, b, out=out, schedule=s))}
        row["cudnn_us"] = graph_us(lambda: F.conv2d(x, w, b))
        an = {k: v["us"] for k, v in row["times"].items() if k.startswith("b_nchw") and v["ok"]}
        row["best_b_nchw"] = min(an, key=an.get) if an else None
        t = row["times"]
        row["ratio_pick"] = row["cudnn_us"] / t["pick"]["us"]
        row["ratio_before"] = row["cudnn_us"] / t["before"]["us"]
        print(f"{net:18} x={xs} w={ws}: cuDNN {row['cudnn_us']:6.1f}  pick {t['pick']['us']:6.1f} "
              f"({row['ratio_pick']:.2f}x)  before {t['before']['us']:6.1f} ({row['ratio_before']:.2f}x)  "
              f"best b_nchw {an.get(row['best_b_nchw'], 0):6.1f} {t[row['best_b_nchw']]['schedule'][20:60] if an else ''}"
              f"  pick={str(pick)[:60]}", flush=True)
        bad = [k for k, v in t.items() if not v["ok"]]
        if bad:
            print(f"   FAILED CHECK: {bad}", flush=True)
        rows.append(row)
    best = [r["cudnn_us"] / min(r["times"]["before"]["us"], r["times"][r["best_b_nchw"]]["us"])
            for r in rows if r["best_b_nchw"]]
    summary = {"pick": geo([r["ratio_pick"] for r in rows]), "before": geo([r["ratio_before"] for r in rows]),
               "best_of_before_and_b_nchw": geo(best),
               "failed": sum(1 for r in rows for v in r["times"].values() if not v["ok"])}
    print(f"{len(rows)} layers, {time.time() - t0:.0f} s: pick {summary['pick']}  before {summary['before']}  "
          f"failed checks {summary['failed']}", flush=True)
    dump(args.out, "conv2d_nchw", {"device": torch.cuda.get_device_name(),
                                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                   "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
