"""Summarize ncu's per-SASS-instruction counters (`ncu --import R --page source --csv --print-source
sass > F.csv`, as scripts/profile_attention.py --ncu writes): executed warp instructions and stall
samples by opcode, the hottest lines, and the mbarrier waits (how often a warp polled a barrier).

    python3 scripts/ncu_sass_summary.py F.csv [--top 15]
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re


def load(path: str) -> tuple[list[str], list[list[str]]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[start], rows[start + 1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    hdr, data = load(args.csv)
    col_n, col_src = hdr.index("Instructions Executed"), hdr.index("Source")
    col_s = hdr.index("Warp Stall Sampling (All Samples)")
    rows = [(int(r[col_n]), int(r[col_s] or 0), r[col_src].strip()) for r in data if r[col_n].isdigit()]
    total, samples = sum(n for n, _, _ in rows), sum(s for _, s, _ in rows)
    by_op, by_op_s = collections.Counter(), collections.Counter()
    for n, s, src in rows:
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", src)
        op = m.group(2) if m else src
        by_op[op] += n
        by_op_s[op] += s
    print(f"{total / 1e6:.1f} M warp instructions executed (predicated-off included), {samples} stall samples")
    print(f"{'opcode':<14} {'executed':>10} {'share':>6} {'samples':>8}")
    for op, n in by_op.most_common(args.top):
        print(f"{op:<14} {n / 1e6:9.2f}M {100 * n / total:5.1f}% {by_op_s[op]:8d}")
    print("\nhottest lines (stall samples):")
    for n, s, src in sorted(rows, key=lambda r: -r[1])[:args.top]:
        print(f"{s:7d} {n:12d}  {src[:90]}")
    print("\nmbarrier polls (try_wait lines, executions):")
    for n, s, src in rows:
        if "TRYWAIT" in src:
            print(f"{n:12d} {s:7d}  {src[:90]}")


if __name__ == "__main__":
    main()
