#!/usr/bin/env python3
"""Summarises benchmarks/async_scaling.sh's CSV (and benchmarks/async_peer_tf.sh's rows in it):
a markdown table (median test accuracy over the seeds with its spread, median wall time and
samples/s, mean and largest staleness), a PNG plot of median accuracy against workers, one line
per scheme over 2 ps (or none), and a second PNG (PNG with "_ps" before its suffix) of the
median accuracy over 1, 2 and 4 ps at each worker count measured with more than one ps count.

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
    by_ps = defaultdict(dict)  # (scheme, workers) -> {ps: median accuracy}
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
            by_ps[(scheme, w)][p] = med
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.get_cmap("tab20")
    # The main plot: 2 ps (the study's default) and the schemes without ps; the ps counts are
    # compared in the second plot.
    shown = {key: pts for key, pts in series.items() if key[1] in (0, 2)}
    for k, ((scheme, p), pts) in enumerate(sorted(shown.items())):
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

    cells = sorted((key, ps) for key, ps in by_ps.items() if len(ps) > 1)
    if not cells:
        return
    fig, ax = plt.subplots(figsize=(11, 5))
    counts = sorted({p for _, ps in cells for p in ps})
    width = 0.8 / len(counts)
    for j, p in enumerate(counts):
        xs = [i + (j - (len(counts) - 1) / 2) * width for i in range(len(cells))]
        ax.bar(xs, [ps.get(p, 0) for _, ps in cells], width, label="%d ps" % p)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels(["%s\n%d w" % key for key, _ in cells], rotation=90, fontsize=7)
    if base is not None:
        ax.axhline(base, color="black", linestyle="--", linewidth=1, label="one process")
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy (median over seeds)")
    ax.set_title("Fashion-MNIST MLP, fixed epochs: accuracy over 1, 2 and 4 ps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    root, dot, suffix = png_path.rpartition(".")
    fig.savefig(root + "_ps." + suffix if dot else png_path + "_ps", dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
