#!/usr/bin/env python3
"""Draws bench/results/throughput.png from bench/results/latest.csv: requests/s and p99 latency per target.

    pip install matplotlib && python3 bench/chart.py [CSV] [PNG]
"""

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import FuncFormatter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def colour(target: str) -> str:
    if target.startswith("upstream"):
        return "#9e9e9e"
    if target.startswith("nginx"):
        return "#2e7d32"
    return "#1565c0"


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "latest.csv"
    output = Path(sys.argv[2]) if len(sys.argv) > 2 else RESULTS / "throughput.png"
    with source.open(newline="") as f:
        rows = list(csv.DictReader(f))
    labels = [f"{r['id']}. {r['target']}" for r in rows]
    rps = [float(r["rps"]) for r in rows]
    p99 = [float(r["p99_ms"]) for r in rows]
    colours = [colour(r["target"]) for r in rows]
    y = range(len(rows))

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.55 * len(rows) + 1.6), sharey=True)
    left.barh(y, rps, color=colours)
    left.set_xlabel("requests/s (higher is better)")
    for i, value in enumerate(rps):
        left.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    left.set_xlim(0, max(rps) * 1.25)
    left.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1000:.0f}k"))
    right.barh(y, p99, color=colours)
    right.set_xlabel("p99 latency, ms (lower is better)")
    for i, value in enumerate(p99):
        right.text(value, i, f" {value:.2f}", va="center", fontsize=8)
    right.set_xlim(0, max(p99) * 1.25)
    left.set_yticks(list(y), labels, fontsize=8)
    left.invert_yaxis()
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    fig.suptitle("tollgate vs nginx on loopback: wrk, the same connections and duration for every target")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
