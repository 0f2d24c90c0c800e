"""Issue 17 on a GPU in one command: layer_norm / rms_norm with a residual (SkipLayerNormalization),
y = norm(x + residual [+ bias]) with and without the sum output, against float64 and against torch's
two-kernel form F.layer_norm(x + r [+ bias]) on the same tensors; also the path it replaces (torch's
add, then jitops' plain layer_norm). fp16 / bf16 / fp32 at the ViT / BERT / Llama widths 768 / 1024 / 4096.

    python3 scripts/device_layer_norm_skip.py --out DIR          # checks + CUDA-graph timings -> DIR/layer_norm_skip.json
    python3 scripts/device_layer_norm_skip.py --sanitize --dtypes float16   # one small case per rows strategy
    compute-sanitizer --tool memcheck python3 scripts/device_layer_norm_skip.py --sanitize --dtypes float16
    python3 scripts/device_layer_norm_skip.py --dry --out DIR    # the same logic on the CPU emulator, tiny shapes

Every timed case is first checked (outputs poisoned with NaN): the sum bit-exact against the sum formed
as the kernels form it (fp32 adds in the order x + residual + bias, rounded to the dtype, as torch's
x + r is for two operands), y against the float64 norm of that sum. Times: CUDA-graph replays of back-to-
back calls (median of trials), and eager per-call times; GB/s counts the bytes each side must move.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import jitops
from jitops.bench.timing import Timer

F = torch.nn.functional
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOL = {"float32": 4e-6, "float16": 2e-3, "bfloat16": 5e-3}
# (label, rows, width): ViT-B/16 b8 (8 x 197 tokens), BERT-base b8 s128, BERT-large b8 s512, Llama-7B 2K tokens
CASES = [("vit_b16_b8", 1576, 768), ("bert_b8_s128", 1024, 768), ("bert_l_b8_s512", 4096, 1024),
         ("llama_2k", 2048, 4096)]
DRY_CASES = [("dry", 6, 96), ("dry_long", 3, 640), ("dry_4096", 2, 4096)]


def kinds(width: int) -> tuple[str, ...]:
    """Llama's width (4096) also takes rms_norm (its residual + RMSNorm); the others layer_norm only."""
    return ("layer", "rms") if width == 4096 else ("layer",)


def sum_ref(x, r, bias):
    """The sum as the kernels form it: fp32 (x + r) + bias, rounded to x's dtype."""
    s = x.float() + r.float()
    if bias is not None:
        s = s + bias.float()
    return s.to(x.dtype)


def norm_ref(s, gamma, beta, eps, rms):
    sd = s.double()
    if rms:
        y = sd / (sd.square().mean(-1, keepdim=True) + eps).sqrt()
    else:
        d = sd - sd.mean(-1, keepdim=True)
        y = d / (d.square().mean(-1, keepdim=True) + eps).sqrt()
    y = y * gamma.double()
    return y + beta.double() if beta is not None else y


def rel_err(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def make(rows, width, dtype, dev, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = lambda *shape: torch.randn(*shape, generator=g)   # noqa: E731
    x = (t(rows, width) * 2 + 0.5).to(dev, DT[dtype])
    r = (t(rows, width) * 1.5 - 0.3).to(dev, DT[dtype])
    pdt = torch.float32 if dtype != "float32" else DT[dtype]      # fp32 parameters with half activations
    gamma, beta = (1 + 0.3 * t(width)).to(dev, pdt), (0.2 * t(width)).to(dev, pdt)
    bias = (0.5 * t(width)).to(dev, DT[dtype])                     # a Linear's bias: the activations' dtype
    return x, r, gamma, beta, bias


def jitops_call(kind, x, r, gamma, beta, bias, eps, with_sum, out, schedule=None):
    kw = dict(residual=r, bias=bias, return_sum=with_sum, out=out, schedule=schedule)
    if kind == "rms":
        return jitops.rms_norm(x, x.shape[-1], gamma, eps, **kw)
    return jitops.layer_norm(x, x.shape[-1], gamma, beta, eps, **kw)


def check_case(kind, x, r, gamma, beta, bias, eps, with_sum, schedule=None) -> dict:
    """One call into NaN-poisoned outputs: sum exact, y against float64."""
    y = torch.full_like(x, float("nan"))
    s = torch.full_like(x, float("nan"))
    got = jitops_call(kind, x, r, gamma, beta, bias, eps, with_sum, (y, s) if with_sum else y, schedule)
    assert (got[0] is y and got[1] is s) if with_sum else got is y
    sref = sum_ref(x, r, bias)
    ref = norm_ref(sref, gamma, beta if kind == "layer" else None, eps, kind == "rms")
    err = rel_err(y, ref) if not torch.isnan(y).any() else float("nan")
    sum_ok = bool(torch.equal(s, sref)) if with_sum else None
    ok = err <= TOL[str(x.dtype).split(".")[1]] and sum_ok is not False
    return {"err": err, "sum_exact": sum_ok, "ok": ok}


def bytes_moved(x, with_sum, bias) -> int:
    n = x.numel() * x.element_size()
    return n * (3 + with_sum)        # x, residual read; y (and sum) written; parameters are noise


def time_case(timer, kind, x, r, gamma, beta, bias, eps, with_sum, n=50) -> dict:
    y, s = torch.empty_like(x), torch.empty_like(x)
    out = (y, s) if with_sum else y
    width = x.shape[-1]
    fused = lambda: jitops_call(kind, x, r, gamma, beta, bias, eps, with_sum, out)   # noqa: E731
    gamma_t = gamma.to(x.dtype)
    beta_t = beta.to(x.dtype) if beta is not None else None

    def torch_two():
        torch.add(x, r, out=s)
        s.add_(bias)
        if kind == "rms":
            return F.rms_norm(s, (width,), gamma_t, eps)
        return F.layer_norm(s, (width,), gamma_t, beta_t, eps)

    def unfused_jitops():       # the rewrite before the residual forms: torch's adds, jitops' norm
        torch.add(x, r, out=s)
        s.add_(bias)
        if kind == "rms":
            return jitops.rms_norm(s, width, gamma, eps, out=y)
        return jitops.layer_norm(s, width, gamma, beta, eps, out=y)

    fns = {"jitops_skip": fused, "torch_add_norm": torch_two, "torch_add_jitops_norm": unfused_jitops}
    res = {}
    nbytes = bytes_moved(x, with_sum, bias)
    for name, fn in fns.items():
        g = timer.graph_us(fn, n=n)
        e = timer.per_call_us(fn, n=n)
        res[name] = {"graph_us": g, "eager_us": e,
                     "gbs": round(nbytes / (g or e) / 1e3, 1) if (g or e) else None}
    base = res["torch_add_norm"]["graph_us"] or res["torch_add_norm"]["eager_us"]
    mine = res["jitops_skip"]["graph_us"] or res["jitops_skip"]["eager_us"]
    res["speedup_vs_torch"] = round(base / mine, 3) if base and mine else None
    old = res["torch_add_jitops_norm"]["graph_us"] or res["torch_add_jitops_norm"]["eager_us"]
    res["speedup_vs_unfused"] = round(old / mine, 3) if old and mine else None
    return res


def schedule_text(kind, x, r, gamma, beta, bias, eps, with_sum) -> str:
    from jitops.engine import select_schedule
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    op = get_op("rms_norm" if kind == "rms" else "layer_norm")
    spec = lambda t: TensorSpec(tuple(t.shape), str(t.dtype).split(".")[1]) if t is not None else None  # noqa: E731
    ins = {"x": spec(x), "gamma": spec(gamma), "residual": spec(r), "bias": spec(bias)}
    if kind == "layer":
        ins["beta"] = spec(beta)
    prob = op.make_problem(ins, {"normalized_shape": x.shape[-1], "eps": eps, "return_sum": with_sum})
    sched, origin = select_schedule(op, prob, jitops.get_backend().device, None)
    return f"{sched} [{origin}]"


def sanitize(dev, dtypes) -> int:
    """One small case per rows strategy (warp, block regs / smem, persistent prefetch, stream, split,
    naive) with the sum output, per dtype: for compute-sanitizer memcheck / racecheck (run it once
    without the sanitizer first: the kernels are then loaded from the disk cache, not compiled)."""
    bad = 0
    for dtype in dtypes:
        x, r, gamma, beta, bias = make(9, 256, dtype, dev)
        for sched in (None, "warp", "block", "stream", "split", "naive"):
            c = check_case("layer", x, r, gamma, beta, bias, 1e-5, True, sched)
            print("sanitize", dtype, sched, c, flush=True)
            bad += not c["ok"]
        from jitops.ops import get_op
        from jitops.ops.base import TensorSpec
        from jitops.ops.norm_common import row_heuristic
        spec = lambda t: TensorSpec(tuple(t.shape), str(t.dtype).split(".")[1])  # noqa: E731
        prob = get_op("layer_norm").make_problem({"x": spec(x), "gamma": spec(gamma), "beta": spec(beta),
                                                   "residual": spec(r), "bias": spec(bias)},
                                                  {"normalized_shape": 256, "return_sum": True})
        dev_info = jitops.get_backend().device
        for sched in (row_heuristic(prob.row_spec(), dev_info, "warp", tpr=8, per_sm=1, prefetch=True),
                      row_heuristic(prob.row_spec(), dev_info, "block", store="smem", tpr=64)):
            c = check_case("layer", x, r, gamma, beta, bias, 1e-5, True, sched)
            print("sanitize", dtype, sched, c, flush=True)
            bad += not c["ok"]
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--budget-s", type=float, default=100.0)
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--dry", action="store_true", help="CPU emulator, tiny shapes (the script's logic only)")
    args = ap.parse_args()
    if args.dry:
        with jitops.use_backend("cpu"):
            return run(args)
    return run(args)


def run(args) -> int:
    dev = "cpu" if args.dry else "cuda"
    if args.sanitize:
        return sanitize(dev, args.dtypes.split(","))
    os.makedirs(args.out, exist_ok=True)
    timer = Timer(torch)
    start = time.time()
    cases = DRY_CASES if args.dry else CASES
    # Compile every kernel the timed cases launch first, in parallel (scripts/device_memops.py).
    if not args.dry:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from device_memops import precompile
        specs = []
        for dtype in args.dtypes.split(","):
            for label, rows, width in cases:
                x, r, gamma, beta, bias = make(rows, width, dtype, dev)
                for with_sum, kind in ((w, k) for w in (True, False) for k in kinds(width)):
                    t = {"x": x, "gamma": gamma, "residual": r, "bias": bias, **({"beta": beta} if kind == "layer" else {})}
                    specs.append({"label": label, "spec": (f"{kind}_norm", t, {"normalized_shape": width, "eps": 1e-5,
                                                                                "return_sum": with_sum}, None)})
                    specs.append({"label": label, "spec": (f"{kind}_norm", {k: v for k, v in t.items()
                                                                           if k not in ("residual", "bias")},
                                                           {"normalized_shape": width, "eps": 1e-5}, None)})
        print(json.dumps(precompile(specs)), flush=True)
    rows_out, failed = [], 0
    for dtype in args.dtypes.split(","):
        for label, rows, width in cases:
            for kind in kinds(width):
                if time.time() - start > args.budget_s:
                    print("budget spent", flush=True)
                    break
                x, r, gamma, beta, bias = make(rows, width, dtype, dev)
                for with_sum in (True, False):
                    c = check_case(kind, x, r, gamma, beta, bias, 1e-5, with_sum)
                    row = {"case": label, "kind": kind, "rows": rows, "width": width, "dtype": dtype,
                           "with_sum": with_sum, **c,
                           "schedule": schedule_text(kind, x, r, gamma, beta, bias, 1e-5, with_sum)}
                    if c["ok"]:
                        row.update(time_case(timer, kind, x, r, gamma, beta, bias, 1e-5, with_sum,
                                             n=3 if args.dry else 50))
                    else:
                        failed += 1
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "layer_norm_skip.json"), "w") as f:
            json.dump({"device": jitops.get_backend().device.name, "date": time.strftime("%Y-%m-%d"),
                       "rows": rows_out}, f, indent=1)
    print(f"\n{'case':<15} {'kind':<5} {'dtype':<8} {'sum':<5} {'err':>8}  {'jitops us':>9} {'torch us':>9} "
          f"{'add+jitops':>10} {'vs torch':>8} {'vs unfused':>10} {'GB/s':>6}")
    for r in rows_out:
        if "jitops_skip" not in r:
            print(f"{r['case']:<15} {r['kind']:<5} {r['dtype']:<8} {str(r['with_sum']):<5} FAILED err={r['err']:.3g} "
                  f"sum_exact={r['sum_exact']}")
            continue
        pick = lambda d: d["graph_us"] or d["eager_us"]   # noqa: E731
        print(f"{r['case']:<15} {r['kind']:<5} {r['dtype']:<8} {str(r['with_sum']):<5} {r['err']:>8.2e}  "
              f"{pick(r['jitops_skip']):>9.2f} {pick(r['torch_add_norm']):>9.2f} "
              f"{pick(r['torch_add_jitops_norm']):>10.2f} {r['speedup_vs_torch']:>8} {r['speedup_vs_unfused']:>10} "
              f"{r['jitops_skip']['gbs']:>6}")
    print(f"\n{failed} failed checks", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
