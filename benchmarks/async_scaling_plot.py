#!/usr/bin/env python3
"""Summarises benchmarks/async_scaling.sh's CSV: a markdown table (median test accuracy over
the seeds with its spread, median wall time and samples/s, mean and largest staleness) and a
PNG plot of median accuracy against workers, one line per scheme and ps count.

    async_scaling_plot.py CSV PNG MD
"""
import csv
import statistics
import sys
from collections import defaultdict


def main(csv_path, png_path, md_path):
    groups = defaultdict(list)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            groups[(row["scheme"], int(row["workers"]), int(row["ps"]))].append(row)

    def floats(rows, key):
        return [float(r[key]) for r in rows if r["status"] == "ok" and r[key] not in ("", None)]

    baseline = floats([r for k, rs in groups.items() if k[0] == "non_distributed" for r in rs], "accuracy")
    base = statistics.median(baseline) if baseline else None
    lines = [
        "| scheme | workers | ps | runs | accuracy (median) | spread | vs 1 process | wall s | samples/s | staleness mean | staleness max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    series = defaultdict(list)
    for (scheme, w, p), rows in sorted(groups.items(), key=lambda kv: (kv[0][0] != "non_distributed", kv[0])):
        acc, wall, sps = floats(rows, "accuracy"), floats(rows, "wall_s"), floats(rows, "samples_per_s")
        sm, sx = floats(rows, "staleness_mean"), floats(rows, "staleness_max")
        failed = sum(r["status"] != "ok" for r in rows)
        med = statistics.median(acc) if acc else None
        cell = lambda v, fmt: (fmt % v) if v is not None else "—"
        lines.append("| %s | %d | %s | %d%s | %s | %s | %s | %s | %s | %s | %s |" % (
            scheme, w, p if p else "—", len(rows), " (%d failed)" % failed if failed else "",
            cell(med, "%.4f"),
            "%.4f–%.4f" % (min(acc), max(acc)) if len(acc) > 1 else "—",
            cell(None if med is None or base is None else 100.0 * (med - base), "%+.1f pt"),
            cell(statistics.median(wall) if wall else None, "%.1f"),
            cell(statistics.median(sps) if sps else None, "%.0f"),
            cell(statistics.mean(sm) if sm else None, "%.2f"),
            cell(max(sx) if sx else None, "%.0f")))
        if med is not None and scheme != "non_distributed":
            series[(scheme, p)].append((w, med))
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.get_cmap("tab20")
    for k, ((scheme, p), pts) in enumerate(sorted(series.items())):
        pts.sort()
        label = scheme + (" (%d ps)" % p if p else "")
        style = "--" if scheme.endswith(":plain") else (":" if scheme.startswith(("sync", "ring")) else "-")
        ax.plot([w for w, _ in pts], [a for _, a in pts], marker="o", linestyle=style, color=colours(k % 20),
                label=label)
    if base is not None:
        ax.axhline(base, color="black", linestyle="--", linewidth=1, label="one process")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("test accuracy (median over seeds)")
    ax.set_title("Fashion-MNIST MLP, fixed epochs: accuracy against workers")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
