"""Sums an Nsight Compute CSV (``ncu --csv --metrics gpu__time_duration.sum ...``) per kernel.

python benchmarks/ncu_summary.py ncu.csv [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

_TO_US = {
    "ns": 1e-3,
    "nsecond": 1e-3,
    "us": 1.0,
    "usecond": 1.0,
    "ms": 1e3,
    "msecond": 1e3,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    lines = [line for line in args.csv.read_text().splitlines() if line.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        raise SystemExit(f"{args.csv}: no ncu CSV rows")
    header = rows[0]
    columns = ("Kernel Name", "Metric Value", "Metric Unit")
    name_i, value_i, unit_i = (header.index(k) for k in columns)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for row in rows[1:]:
        try:
            us = float(row[value_i].replace(",", "")) * _TO_US[row[unit_i]]
        except (ValueError, KeyError):
            continue
        entry = totals[row[name_i].split("(")[0][:80]]
        entry[0] += 1
        entry[1] += us
    total = sum(t for _, t in totals.values())
    print(f"{sum(int(c) for c, _ in totals.values())} kernels, {total:.1f} us")
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{us:10.1f} us {int(calls):5d} calls {us / calls:9.1f} us/call  {name}")


if __name__ == "__main__":
    main()
