"""Random calls of the public API checked against torch in float64 (GPU, or the CPU emulator).

Why: the scheduler chooses among dozens of kernels and variants per op (wgmma, TMA, split-K, in-place
layouts, packed views, bounded softmax steps...), and the tests pin the classes their authors thought of.
This draws calls the way users make them (odd sizes, both memory formats, groups, padding on one side,
GQA, masks, causal diagonals, packed q/k/v views, bias / residual / activation, every dtype and fp32
precision), runs the scheduler's pick into a NaN-filled output where the call takes `out`, and compares
with an independent float64 torch reference. A refusal (a clear ValueError / ScheduleError naming the
argument) counts as refused, not failed; a wrong or unwritten element, a crash or an unclear exception
fails. Each call is made twice on new data (the second takes the cached plan, and the native repeat
path where the op has one); --candidates N also checks N random other schedules of each problem (what
the tuner may time and keep). Each case is written to OUT/fuzz.jsonl as it finishes (a driver error that
kills the process leaves the cases before it) and can be re-run alone with --case.

    python3 scripts/fuzz_ops.py [--ops conv2d,attention,norms] [--cases 200] [--seed 0] [--max-gflop 2]
                                [--candidates N] [--emulator 32|64 [--matrix-cores]] [--out DIR] [--case JSON]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (dtype, fp32 precision) -> (atol, rtol), both in units of the reference's RMS
TOLERANCE = {("float16", None): (4e-3, 4e-3), ("bfloat16", None): (2.5e-2, 1.6e-2),
             ("float32", "highest"): (1e-4, 1e-4), ("float32", "3xtf32"): (1e-4, 1e-4),
             # TF32 rounds the fp32 inputs themselves (fp16 / bf16 inputs are exact in the reference)
             ("float32", "tf32"): (1e-2, 1e-2)}
REFUSALS = ("ArgumentError", "ValueError", "TypeError", "ScheduleError", "UnsupportedError", "NotImplementedError")


def pick(rng: random.Random, weighted: dict):
    """A key of {value: weight}."""
    return rng.choices(list(weighted), weights=list(weighted.values()))[0]


def draw_dtype(rng: random.Random, gpu: bool) -> tuple[str, str | None]:
    dtype = pick(rng, {"float16": 4, "bfloat16": 2, "float32": 2} if gpu else {"float16": 1, "float32": 2})
    return dtype, (pick(rng, {"highest": 1, "tf32": 2, "3xtf32": 1}) if dtype == "float32" else None)


def draw_conv2d(rng: random.Random, gpu: bool, max_gflop: float) -> dict:
    """A conv2d call: sizes, groups, window, padding (sometimes one-sided), layout, epilogue."""
    limit = max_gflop * (5 if rng.random() < 0.25 else 1)      # a quarter reach the large-layer kernels
    while True:
        dtype, precision = draw_dtype(rng, gpu)
        kind = pick(rng, {"plain": 6, "pointwise": 4, "depthwise": 2, "grouped": 1, "stem": 1, "patch": 1})
        n = pick(rng, {1: 4, 2: 2, 3: 1, 8: 2, 32: 1})
        chans = [1, 3, 4, 5, 8, 16, 17, 24, 32, 40, 48, 64, 96, 112, 128, 160, 192, 256, 320, 384, 512, 640,
                 1024, 1280, 2048]
        cin, cout = rng.choice(chans), rng.choice(chans)
        kh = kw = pick(rng, {1: 2, 3: 5, 5: 1, 7: 1})
        stride, dilation, groups = pick(rng, {1: 4, 2: 2}), pick(rng, {1: 6, 2: 1}), 1
        if kind == "pointwise":
            kh = kw = 1
            dilation = 1
        elif kind == "depthwise":
            cout = cin = max(cin, 8)
            groups = cin
        elif kind == "grouped":
            groups = rng.choice([2, 4, 8, 32])
            cin, cout = groups * rng.choice([1, 2, 4, 8, 16]), groups * rng.choice([1, 2, 4, 8, 16])
        elif kind == "stem":
            cin, kh, kw, stride = rng.choice([1, 3, 4]), rng.choice([3, 7]), None, 2
            kw = kh
        elif kind == "patch":
            cin, kh, stride, dilation = 3, rng.choice([4, 8, 14, 16]), None, 1
            kw = stride = kh
        if rng.random() < 0.1 and kind in ("plain", "grouped"):
            kh, kw = rng.choice([(1, 7), (7, 1), (1, 3), (3, 1)])
        h = pick(rng, {1: 1, 2: 1, 7: 3, 14: 3, 16: 1, 28: 2, 31: 1, 56: 2, 64: 1, 112: 1, 224: 1})
        w = h if rng.random() < 0.8 else rng.choice([5, 9, 13, 33, 60])
        if rng.random() < 0.7:
            pad = [dilation * (kh - 1) // 2, dilation * (kw - 1) // 2]
            pad = pad + pad
        else:
            pad = [rng.randint(0, kh - 1), rng.randint(0, kw - 1), rng.randint(0, kh - 1), rng.randint(0, kw - 1)]
        if kind == "patch":
            pad = [0, 0, 0, 0]
        ho = (h + pad[0] + pad[2] - dilation * (kh - 1) - 1) // stride + 1
        wo = (w + pad[1] + pad[3] - dilation * (kw - 1) - 1) // stride + 1
        if ho < 1 or wo < 1:
            continue
        gflop = 2 * n * ho * wo * cout * (cin // groups) * kh * kw / 1e9
        if gflop > limit or n * cin * h * w > 2 ** 25:
            continue
        return {"op": "conv2d", "dtype": dtype, "precision": precision, "n": n, "cin": cin, "cout": cout,
                "h": h, "w": w, "kh": kh, "kw": kw, "stride": stride, "dilation": dilation, "groups": groups,
                "padding": pad, "channels_last": rng.random() < 0.55, "weights_channels_last": rng.random() < 0.1,
                "bias": rng.random() < 0.5, "residual": rng.random() < 0.25,
                "activation": pick(rng, {None: 3, "relu": 2, "leaky_relu": 1}), "out": rng.random() < 0.5,
                "gflop": round(gflop, 4)}


def draw_attention(rng: random.Random, gpu: bool, max_gflop: float) -> dict:
    """An attention call: GQA, odd lengths, causal diagonals, masks, storage layouts, packed views."""
    limit = max_gflop * (5 if rng.random() < 0.25 else 1)
    while True:
        dtype, precision = draw_dtype(rng, gpu)
        b = pick(rng, {1: 4, 2: 3, 3: 1, 4: 2, 8: 2, 32: 1})
        h = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 20, 32])
        hk = rng.choice([d for d in range(1, h + 1) if h % d == 0]) if rng.random() < 0.3 else h
        d = pick(rng, {8: 1, 16: 1, 24: 1, 32: 1, 40: 2, 48: 1, 64: 6, 72: 2, 80: 2, 96: 2, 112: 1, 128: 5, 160: 1, 256: 2})
        sq = pick(rng, {1: 2, 7: 1, 16: 1, 64: 1, 77: 1, 128: 2, 197: 2, 256: 2, 257: 1, 384: 2, 500: 1,
                        1024: 2, 1500: 1, 2048: 1})
        sk = sq if rng.random() < 0.6 else pick(rng, {1: 1, 77: 2, 120: 1, 128: 1, 300: 1, 1000: 1, 1500: 1,
                                                      2048: 1, 4096: 1})
        causal = pick(rng, {False: 5, True: 3, "bottom_right": 2})
        mask = pick(rng, {None: 6, "padding": 2, "full": 1, "heads": 1})
        layout = pick(rng, {"bhsd": 5, "bshd": 3, "packed": 2, "rank3": 1})
        if layout == "packed" and (sq != sk or hk != h):
            layout = "bshd"
        if layout == "rank3":
            h = hk = 1
        gflop = 4 * b * h * sq * sk * d / 1e9
        if gflop > limit:
            continue
        return {"op": "attention", "dtype": dtype, "precision": precision, "b": b, "h": h, "hk": hk, "sq": sq,
                "sk": sk, "d": d, "causal": causal, "mask": mask,
                "mask_dtype": pick(rng, {"float32": 1, "same": 1}), "layout": layout,
                "scale": None if rng.random() < 0.8 else round(rng.uniform(0.02, 0.3), 4),
                "out": layout == "bhsd" and rng.random() < 0.6, "gflop": round(gflop, 4)}


def draw_norm(rng: random.Random, gpu: bool, max_gflop: float) -> dict:
    """A normalization or leaky_relu call: shapes of real models, both memory formats, fused residuals."""
    dtype = pick(rng, {"float16": 3, "bfloat16": 2, "float32": 2} if gpu else {"float16": 1, "float32": 2})
    op = pick(rng, {"layer_norm": 3, "rms_norm": 2, "group_norm": 2, "batch_norm": 2, "leaky_relu": 1})
    if op in ("layer_norm", "rms_norm"):
        rows = pick(rng, {1: 1, 7: 1, 197: 2, 1024: 2, 4096: 1, 9999: 1})
        cols = pick(rng, {64: 1, 100: 1, 320: 1, 768: 3, 1024: 2, 1280: 1, 4096: 2, 5120: 1, 8192: 1, 12288: 1})
        residual, bias = rng.random() < 0.3, rng.random() < 0.2
        return {"op": op, "dtype": dtype, "rows": rows, "cols": cols, "affine": rng.random() < 0.8,
                "residual": residual, "bias": bias, "param_fp32": rng.random() < 0.3,
                "return_sum": rng.random() < (0.5 if residual or bias else 0.03)}
    n = pick(rng, {1: 3, 2: 2, 8: 1})
    c = rng.choice([3, 16, 32, 64, 96, 128, 256, 320, 512, 640, 1280])
    hw = rng.choice([1, 7, 8, 14, 16, 32, 56, 64])
    groups = rng.choice([g for g in (1, 2, 4, 8, 16, 32) if c % g == 0])
    return {"op": op, "dtype": dtype, "n": n, "c": c, "h": hw, "w": hw if rng.random() < 0.8 else hw + 3,
            "groups": groups, "channels_last": rng.random() < 0.5, "param_fp32": rng.random() < 0.3,
            "activation": pick(rng, {None: 2, "relu": 1}), "alpha": round(rng.uniform(0.01, 0.3), 3)}


def tensor(torch, shape, dtype, scale=1.0, gen=None):
    return (torch.randn(shape, device=DEVICE, dtype=torch.float64, generator=gen) * scale).to(getattr(torch, dtype))


def run_conv2d(torch, jitops, c: dict, gen) -> tuple:
    """(jitops output, float64 reference)."""
    F = torch.nn.functional
    x = tensor(torch, (c["n"], c["cin"], c["h"], c["w"]), c["dtype"], gen=gen)
    fan = (c["cin"] // c["groups"]) * c["kh"] * c["kw"]
    w = tensor(torch, (c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]), c["dtype"], fan ** -0.5, gen)
    bias = tensor(torch, (c["cout"],), c["dtype"], gen=gen) if c["bias"] else None
    fmt = torch.channels_last if c["channels_last"] else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    if c["weights_channels_last"]:
        w = w.contiguous(memory_format=torch.channels_last)
    t, left, btm, right = c["padding"]
    ref = F.conv2d(F.pad(x.double(), (left, right, t, btm)), w.double(), None if bias is None else bias.double(),
                   stride=c["stride"], dilation=c["dilation"], groups=c["groups"])
    # y keeps x's memory format as torch reads it (a channels_last tensor of one channel is also NCHW)
    y_fmt = torch.contiguous_format if x.is_contiguous() else torch.channels_last
    residual = None
    if c["residual"]:
        residual = tensor(torch, ref.shape, c["dtype"], gen=gen).contiguous(memory_format=y_fmt)
        ref = ref + residual.double()
    if c["activation"] == "relu":
        ref = torch.relu(ref)
    elif c["activation"] == "leaky_relu":
        ref = torch.where(ref >= 0, ref, 0.01 * ref)
    out = torch.full(ref.shape, float("nan"), device=DEVICE, dtype=x.dtype).contiguous(memory_format=y_fmt) \
        if c["out"] else None
    y = jitops.conv2d(x, w, bias, stride=c["stride"], padding=tuple(c["padding"]), dilation=c["dilation"],
                      groups=c["groups"], activation=c["activation"], residual=residual, out=out,
                      precision=c["precision"], schedule=schedule_of(c))
    if out is not None and y is not out:
        raise AssertionError("conv2d(out=...) returned another array")
    return y, ref


def attention_reference(torch, q, k, v, mask, causal, scale):
    """softmax(scale q k^T + mask) v in float64, the causal rule, zeros where a query sees no key."""
    b, h, sq, d = q.shape
    group = h // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = scale * torch.einsum("bhid,bhjd->bhij", q.double(), k)
    if mask is not None:
        s = s + mask.double()
    if causal:
        sk = k.shape[2]
        offset = sk - sq if causal == "bottom_right" else 0
        i = torch.arange(sq, device=DEVICE)[:, None]
        j = torch.arange(sk, device=DEVICE)[None, :]
        s = s.masked_fill(j > i + offset, float("-inf"))
    mx = s.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    e = torch.exp(s - mx)
    total = e.sum(-1, keepdim=True)
    out = torch.einsum("bhij,bhjd->bhid", e, v) / torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, out, torch.zeros_like(out))


def run_attention(torch, jitops, c: dict, gen) -> tuple:
    b, h, hk, sq, sk, d = (c[key] for key in ("b", "h", "hk", "sq", "sk", "d"))
    dt = c["dtype"]
    if c["layout"] == "packed":                         # timm / GPT-2 style: one projection, unbound
        qkv = tensor(torch, (b, sq, 3, h, d), dt, gen=gen)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    elif c["layout"] == "bshd":                         # heads-inner storage, read through a transpose
        q = tensor(torch, (b, sq, h, d), dt, gen=gen).transpose(1, 2)
        k, v = (tensor(torch, (b, sk, hk, d), dt, gen=gen).transpose(1, 2) for _ in range(2))
    else:
        q = tensor(torch, (b, h, sq, d), dt, gen=gen)
        k, v = (tensor(torch, (b, hk, sk, d), dt, gen=gen) for _ in range(2))
    mask = None
    mdt = dt if c["mask_dtype"] == "same" else "float32"
    if c["mask"] == "padding":                          # [B, 1, 1, Sk]: 0 or a large negative per key
        keep = torch.rand((b, 1, 1, sk), device=DEVICE, generator=gen) < 0.8
        mask = torch.where(keep, 0.0, -1e4 if mdt != "float32" else float("-inf")).to(getattr(torch, mdt))
    elif c["mask"] == "full":
        mask = tensor(torch, (b, h, sq, sk), mdt, gen=gen)
    elif c["mask"] == "heads":
        mask = tensor(torch, (1, h, sq, sk), mdt, gen=gen)
    scale = c["scale"] if c["scale"] is not None else d ** -0.5
    ref = attention_reference(torch, q, k, v, mask, c["causal"], scale)
    if c["layout"] == "rank3":
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
        mask = None if mask is None else mask[:, 0]
        ref = ref[:, 0]
    out = torch.full(ref.shape, float("nan"), device=DEVICE, dtype=q.dtype) if c["out"] else None
    y = jitops.attention(q, k, v, mask=mask, causal=c["causal"], scale=c["scale"], out=out, precision=c["precision"],
                         schedule=schedule_of(c))
    if out is not None and y is not out:
        raise AssertionError("attention(out=...) returned another array")
    return y, ref


def run_norm(torch, jitops, c: dict, gen) -> tuple:
    F = torch.nn.functional
    dt, op = c["dtype"], c["op"]
    pdt = "float32" if c.get("param_fp32") else dt
    if op in ("layer_norm", "rms_norm"):
        x = tensor(torch, (c["rows"], c["cols"]), dt, gen=gen)
        gamma = tensor(torch, (c["cols"],), pdt, gen=gen) if c["affine"] else None
        beta = tensor(torch, (c["cols"],), pdt, gen=gen) if c["affine"] and op == "layer_norm" else None
        res = tensor(torch, x.shape, dt, gen=gen) if c["residual"] else None
        bias = tensor(torch, (c["cols"],), pdt, gen=gen) if c["bias"] else None
        s = x.double() + (0 if res is None else res.double()) + (0 if bias is None else bias.double())
        s = s.to(x.dtype).double()                      # the documented rounding of the sum to x's dtype
        if op == "layer_norm":
            ref = F.layer_norm(s, (c["cols"],), None if gamma is None else gamma.double(),
                               None if beta is None else beta.double(), 1e-5)
            y = jitops.layer_norm(x, c["cols"], gamma, beta, residual=res, bias=bias, return_sum=c["return_sum"],
                                  schedule=schedule_of(c))
        else:
            ref = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)
            ref = ref if gamma is None else ref * gamma.double()
            y = jitops.rms_norm(x, c["cols"], gamma, residual=res, bias=bias, return_sum=c["return_sum"],
                                schedule=schedule_of(c))
        if c["return_sum"]:
            y, y_sum = y
            ulp = {"float16": 2 ** -10, "bfloat16": 2 ** -7}.get(dt, 2 ** -23)
            size = x.double().abs() + (0 if res is None else res.double().abs()) + \
                (0 if bias is None else bias.double().abs())
            if ((y_sum.double() - s).abs() > 2 * ulp * size + 1e-30).any():   # two roundings in fp32
                raise AssertionError("return_sum: the sum is more than an ulp from x + residual + bias in x's dtype")
        return y, ref
    fmt = torch.channels_last if c["channels_last"] else torch.contiguous_format
    x = tensor(torch, (c["n"], c["c"], c["h"], c["w"]), dt, gen=gen).contiguous(memory_format=fmt)
    gamma, beta = (tensor(torch, (c["c"],), pdt, gen=gen) for _ in range(2))
    if op == "group_norm":
        ref = F.group_norm(x.double(), c["groups"], gamma.double(), beta.double(), 1e-5)
        return jitops.group_norm(x, c["groups"], gamma, beta, schedule=schedule_of(c)), ref
    if op == "batch_norm":
        mean = tensor(torch, (c["c"],), pdt, gen=gen)
        var = (torch.rand((c["c"],), device=DEVICE, generator=gen, dtype=torch.float64) + 0.5).to(gamma.dtype)
        ref = F.batch_norm(x.double(), mean.double(), var.double(), gamma.double(), beta.double(), False, 0.0, 1e-5)
        ref = torch.relu(ref) if c["activation"] == "relu" else ref
        return jitops.batch_norm(x, mean, var, gamma, beta, activation=c["activation"],
                                 schedule=schedule_of(c)), ref
    ref = torch.where(x.double() >= 0, x.double(), c["alpha"] * x.double())
    return jitops.leaky_relu(x, c["alpha"], schedule=schedule_of(c)), ref


def check(torch, y, ref, c: dict) -> tuple[bool, str]:
    """Within (atol + rtol |ref|) x the reference's RMS everywhere, no NaN, the reference's shape and format."""
    if tuple(y.shape) != tuple(ref.shape):
        return False, f"shape {tuple(y.shape)} expected {tuple(ref.shape)}"
    # only where x was unambiguously channels_last (one channel or one pixel is NCHW too)
    unambiguous = c.get("h", 1) * c.get("w", 1) > 1 and c.get("cin", c.get("c", 1)) > 1
    if c.get("channels_last") and unambiguous and y.dim() == 4 and y.shape[1] > 1 and y.shape[2] * y.shape[3] > 1 \
            and not y.is_contiguous(memory_format=torch.channels_last):
        return False, "a channels_last input gave a result in another memory format"
    atol, rtol = TOLERANCE.get((c["dtype"], c.get("precision")), TOLERANCE[(c["dtype"], None)]
                               if c["dtype"] != "float32" else (1e-4, 1e-4))
    yd = y.double()
    rms = max(ref.pow(2).mean().sqrt().item(), 1e-6)
    err = (yd - ref).abs()
    bound = atol * rms + rtol * ref.abs()
    nan = int(torch.isnan(yd).sum().item())
    bad = int((err > bound).sum().item())
    worst = float(torch.nan_to_num(err / rms, nan=float("inf")).max().item()) if ref.numel() else 0.0
    ok = nan == 0 and bad == 0
    return ok, f"max error {worst:.2e} x RMS, {bad} elements out of bound, {nan} NaN"


def schedule_of(c: dict):
    """The case's explicit schedule ({algorithm, params}), or None for the scheduler's pick."""
    if not c.get("schedule"):
        return None
    from jitops.ops.base import Schedule
    return Schedule.make(c["schedule"]["algorithm"], **c["schedule"]["params"])


def run_one(torch, jitops, c: dict, seed: int) -> tuple[dict, list]:
    """One call checked: ({status, detail or error}, [the problems it prepared])."""
    from jitops import engine
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    runner = {"conv2d": run_conv2d, "attention": run_attention}.get(c["op"], run_norm)
    before = set(engine._cache.by_call)
    try:
        y, ref = runner(torch, jitops, c, gen)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # a refusal is fine when it says what is wrong; anything else fails
        name = type(exc).__name__
        text = str(exc)
        status = "refused" if name in REFUSALS and len(text) > 20 else "failed"
        return {"status": status, "error": f"{name}: {text[:600]}",
                "trace": traceback.format_exc()[-1500:] if status == "failed" else ""}, []
    prepared = [engine._cache.by_call[key] for key in list(engine._cache.by_call) if key not in before]
    ok, detail = check(torch, y, ref, c)
    return {"status": "passed" if ok else "failed", "detail": detail,
            "picks": [str(p.schedule) for p in prepared]}, prepared


def run_case(torch, jitops, c: dict, seed: int, candidates: int = 0) -> dict:
    """The scheduler's pick, then `candidates` random other schedules of the same problem (what the tuner
    may time and keep), each checked; the case fails if any of them does."""
    from jitops.ops import get_op
    t0 = time.time()
    result, prepared = run_one(torch, jitops, c, seed)
    if result["status"] == "passed":
        # the same call on new data: the cached plan and the native repeat path (stale pointers or maps)
        again, _ = run_one(torch, jitops, c, seed + 7919)
        if again["status"] != "passed":
            result = again | {"detail": f"the repeated call: {again.get('detail') or again.get('error')}"}
    mine = [p for p in prepared if p.op == c["op"]]
    if candidates and result["status"] == "passed" and mine:
        problem = mine[0].problem
        pool = [s for s in get_op(c["op"]).candidates(problem, jitops.get_backend().device)
                if str(s) != str(mine[0].schedule)]
        tried = []
        for sched in random.Random(seed).sample(pool, min(candidates, len(pool))):
            res, _ = run_one(torch, jitops, c | {"schedule": sched.as_dict()}, seed)
            tried.append({"schedule": str(sched), "status": res["status"], "why": res.get("detail") or res.get("error")})
            if res["status"] == "failed":
                result["status"] = "failed"
                result["detail"] = f"candidate {sched}: {res.get('detail') or res.get('error')}"
        result["candidates"] = tried
    result["s"] = round(time.time() - t0, 2)
    return result


DEVICE = "cuda"
DRAW = {"conv2d": draw_conv2d, "attention": draw_attention, "norms": draw_norm}


def main() -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="conv2d,attention,norms")
    ap.add_argument("--cases", type=int, default=200, help="cases per op family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gflop", type=float, default=2.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--candidates", type=int, default=0, help="random other schedules checked per case")
    ap.add_argument("--case", help="one case as JSON (a line of fuzz.jsonl), re-run alone")
    ap.add_argument("--emulator", type=int, choices=(32, 64),
                    help="run on the CPU emulator (checked mode) at this warp size, GPU or not")
    ap.add_argument("--matrix-cores", action="store_true",
                    help="with --emulator: matrix-core fragments in software, so the schedulers pick the mma / MFMA "
                         "kernels (warp 64: AMD's wave64 layouts, never run on hardware here)")
    args = ap.parse_args()
    import torch

    import jitops
    DEVICE = "cuda" if torch.cuda.is_available() and not args.emulator else "cpu"
    gpu = DEVICE == "cuda"
    if not gpu:
        import dataclasses

        from jitops.runtime.cpu_backend import CpuBackend
        backend = CpuBackend(warp_size=args.emulator or 32, checked=True)
        if args.matrix_cores:
            backend.device = dataclasses.replace(backend.device, matrix_cores=True)
        scope = jitops.use_backend(backend)           # held for the whole run (a dropped one restores the default)
        scope.__enter__()
        assert jitops.get_backend() is backend
    cases = []
    if args.case:
        one = json.loads(args.case)
        cases = [(one.get("case", one), one.get("seed", args.seed))]
    else:
        for family in args.ops.split(","):
            rng = random.Random(f"{args.seed}-{family}")
            cases += [(DRAW[family](rng, gpu or args.matrix_cores, args.max_gflop), args.seed * 100003 + i)
                      for i in range(args.cases)]
    os.makedirs(args.out, exist_ok=True)
    counts: dict = {}
    algorithms: dict = {}
    failed = []
    with open(os.path.join(args.out, "fuzz.jsonl"), "a") as log:
        for i, (case, seed) in enumerate(cases):
            result = run_case(torch, jitops, case, seed, args.candidates)
            line = {"case": case, "seed": seed} | result
            log.write(json.dumps(line) + "\n")
            log.flush()
            for text in result.get("picks", []):
                name = text.split("(")[0]
                algorithms[name] = algorithms.get(name, 0) + 1
            key = (case["op"], result["status"])
            counts[key] = counts.get(key, 0) + 1
            if result["status"] != "passed":
                print(f"[{i}] {result['status']}: {json.dumps(case)} -> {result.get('detail') or result['error']}",
                      flush=True)
                if result["status"] == "failed":
                    failed.append(line)
            if "illegal" in str(result.get("error", "")).lower():
                print("a driver error: the context is lost, stopping", flush=True)
                break
    for (op, status), n in sorted(counts.items()):
        print(f"{op:12} {status:8} {n}")
    print("kernels picked (algorithm: calls):", ", ".join(f"{a}: {n}" for a, n in sorted(algorithms.items())))
    print(f"{len(failed)} failed of {sum(counts.values())} ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
          f"{torch.cuda.get_device_name() if gpu else f'CPU emulator, warp {args.emulator or 32}'}"
          f"{', matrix cores' if args.matrix_cores else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
