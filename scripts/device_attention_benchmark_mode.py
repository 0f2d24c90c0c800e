"""attention benchmark mode (jitops.set_benchmark) on the device: for each model shape of
device_attention_ab.SHAPES, the first call's wall time with and without benchmark mode, what benchmark
mode chose, each output checked against float64 (the first heads) in a NaN-filled tensor, and the pick
and the choice timed in turn (graph replay, two passes after an untimed warm-up, the faster pass of
each) beside SDPA.

    python3 scripts/device_attention_benchmark_mode.py OUT_DIR [--dtypes float16] [--shapes NAME,...]


Run it with a fresh JITOPS_CACHE_DIR: benchmark mode's choices are user records, and a second run
reads them instead of timing (its first calls then measure loading, not benchmarking).
Raw results: OUT_DIR/attention_benchmark_mode.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from device_attention_ab import SHAPES, checked_error, first_heads_reference, graph_us  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=".")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--shapes", default="")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import jitops
    from jitops import engine
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    os.makedirs(args.out, exist_ok=True)
    op = get_op("attention")
    dev = jitops.get_backend().device
    wanted = set(args.shapes.split(",")) if args.shapes else None
    print(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    rows = []
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for name, qs, kvs, causal in SHAPES:
            if wanted and name not in wanted:
                continue
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(s, device="cuda", dtype=tdt, generator=g) for s in (qs, kvs, kvs))
            ref = first_heads_reference(q, k, v, causal, dtype)
            p = op.make_problem({"q": TensorSpec(qs, dtype), "k": TensorSpec(kvs, dtype), "v": TensorSpec(kvs, dtype),
                                 "mask": None}, {"causal": causal})
            pick = op.heuristic(p, dev)
            row = {"shape": name, "dtype": dtype, "pick": str(pick)}
            try:
                for mode in (False, True):
                    jitops.set_benchmark(mode)
                    engine.clear_prepared()
                    t = time.time()
                    err, ok = checked_error(q, k, v, causal, dtype, None, ref)
                    row[f"{'benchmark' if mode else 'heuristic'}_first_s"] = time.time() - t
                    if not ok:
                        raise AssertionError(f"{'benchmark mode' if mode else 'heuristic'}: error {err:.3e}")
                chosen, origin = engine.select_schedule(op, p, dev)
                row["chosen"], row["origin"] = str(chosen), origin
                kk, vv = k, v
                if kvs[1] != qs[1]:                      # SDPA on the kv heads repeated (GQA), as device_attention_ab
                    kk, vv = (t.repeat_interleave(qs[1] // kvs[1], 1) for t in (k, v))
                calls = {"pick": lambda: jitops.attention(q, k, v, causal=causal, schedule=pick),
                         "chosen": lambda: jitops.attention(q, k, v, causal=causal, schedule=chosen),
                         "sdpa": lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)}
                for fn in calls.values():
                    fn()
                graph_us(calls["pick"])                  # untimed: the first timing of a process reads fast
                times = {lab: [] for lab in calls}
                for _ in range(2):
                    for lab, fn in calls.items():
                        times[lab].append(graph_us(fn))
                row.update({f"{lab}_us": min(v) for lab, v in times.items()})
            except Exception as exc:  # noqa: BLE001 - a failure is a result too
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            rows.append(row)
            if "error" in row:
                print(f"{dtype:8} {name:36} ERROR {row['error']}", flush=True)
            else:
                same = ", same" if row["chosen"] == row["pick"] else ""
                print(f"{dtype:8} {name:36} SDPA {row['sdpa_us']:8.1f}  pick {row['pick_us']:8.1f} "
                      f"({row['sdpa_us'] / row['pick_us']:.3f})  benchmark {row['chosen_us']:8.1f} "
                      f"({row['sdpa_us'] / row['chosen_us']:.3f})  first call {row['benchmark_first_s']:.1f} s "
                      f"[{row['origin']}{same}] {row['chosen'][:90]}", flush=True)
            json.dump(rows, open(os.path.join(args.out, "attention_benchmark_mode.json"), "w"), indent=1)
    done = [r for r in rows if "error" not in r]
    if done:
        geo = lambda a: math.exp(sum(map(math.log, a)) / len(a))  # noqa: E731
        print(f"{len(done)} shapes: vs SDPA pick {geo([r['sdpa_us'] / r['pick_us'] for r in done]):.3f}x, benchmark "
              f"mode {geo([r['sdpa_us'] / r['chosen_us'] for r in done]):.3f}x; benchmark / pick "
              f"{geo([r['pick_us'] / r['chosen_us'] for r in done]):.3f}x (lowest "
              f"{min(r['pick_us'] / r['chosen_us'] for r in done):.3f})", flush=True)


if __name__ == "__main__":
    main()
