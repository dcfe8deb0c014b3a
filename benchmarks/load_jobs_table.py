#!/usr/bin/env python3
"""The tables of docs/benchmarks/load.md from benchmarks/load_jobs.sh's CSV (standard library only).

    benchmarks/load_jobs_table.py OUT_DIR/load_jobs.csv

Per job (scheme, workers, ps): the rounds that completed (exit 0, every worker's done line, the
chief's RESULT line, no error line) and the wall times; per ps of each job: the median over the
rounds of its requests, CPU, CPU per request and context switches per request, the range of
CPU per request, and the most connections and threads. From a CSV with the columns of the
stage / commit / forward protocol (stages, applies, decisions, holds: frame kinds 33–36, and
global_step): those kinds too, and the ps's serving CPU per global step (ms).
"""
import csv
import statistics
import sys
from collections import OrderedDict


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(path):
    rows = list(csv.DictReader(open(path)))
    jobs = OrderedDict()
    for r in rows:
        key = (r["scheme"], int(r["workers"]), int(r["ps"]))
        jobs.setdefault(key, []).append(r)

    print("| job | N | rounds ok | exit | done reports (min) | error lines | wall s, median (range) | chief's wall s | ps done reports (min) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (scheme, w, p), rs in jobs.items():
        by_round = OrderedDict()
        for r in rs:
            by_round.setdefault(r["round"], r)
        runs = list(by_round.values())
        ok = sum(r["status"] == "ok" for r in runs)
        exits = sorted({r["exit"] for r in runs})
        walls = [float(r["wall_s"]) for r in runs]
        chief = [float(r["chief_wall_s"]) for r in runs if r["chief_wall_s"]]
        done = min(int(r["done_lines"]) for r in runs)
        errs = sum(int(r["error_lines"]) for r in runs)
        ps_done = min(int(r["ps_done_reports"] or 0) for r in rs)
        n = rs[0]["replicas"] if rs[0]["replicas"] != "0" else "—"
        print(f"| {scheme} {w} w / {p} ps | {n} | {ok} of {len(runs)} | {', '.join(exits)} | {done}/{w} | {errs} | "
              f"{med(walls):.1f} ({min(walls):.1f}–{max(walls):.1f}) | {med(chief):.1f} | {ps_done}/{w} |")
    print()
    new = "stages" in rows[0]
    kinds = ("pulls", "pushes", "sync_pushes", "positions", "done_tasks")
    names = "pull / push / sync push / positions / done tasks"
    if new:
        kinds = ("pulls", "pushes", "sync_pushes", "stages", "applies", "decisions", "holds", "positions", "done_tasks")
        names = "pull / push / commit (sync push) / stage / apply / decision / hold / positions / done tasks"
    step_h, step_a = (" global steps | CPU ms per global step |", "---:|---:|") if new else ("", "")
    print(f"| job | ps | bytes held | requests | {names} | CPU s (serving) | µs per request, median (range) |{step_h} peak ESTAB | threads | context switches per request |")
    print(f"|---|---|---:|---:|---|---:|---|{step_a}---:|---:|---:|")
    for (scheme, w, p), rs in jobs.items():
        for i in range(p):
            prs = [r for r in rs if int(r["ps_index"]) == i]
            if not prs:
                continue

            def m(col):
                vals = [float(r[col]) for r in prs if r[col]]
                return med(vals)

            upr = [float(r["us_per_request"]) for r in prs if r["us_per_request"]]
            parts = " / ".join(f"{m(c):.0f}" if any(r.get(c) for r in prs) else "0" for c in kinds)
            steps = ""
            if new:
                gs = m("global_step")
                per = med([float(r["serve_cpu_s"]) / float(r["global_step"]) * 1e3 for r in prs
                           if r["serve_cpu_s"] and r["global_step"] and float(r["global_step"]) > 0])
                steps = f" {gs:.0f} | {per:.2f} |"
            print(f"| {scheme} {w} w / {p} ps | {i} | {prs[0]['ps_bytes']} | {m('requests'):.0f} | {parts} | "
                  f"{m('serve_cpu_s'):.2f} | {med(upr):.0f} ({min(upr):.0f}–{max(upr):.0f}) |{steps} {max(int(r['peak_estab']) for r in prs)} | "
                  f"{max(int(r.get('threads') or 0) for r in prs)} | {m('csw_per_request'):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
