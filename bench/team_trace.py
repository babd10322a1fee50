#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sums up CGRAD_TEAM_TRACE=1 output: how long the threads of a team stood idle in its product calls.

    CGRAD_TEAM_TRACE=1 ./build/cgrad bench --config gpt-tiny --threads 2 --steps 2 2> guided.txt
    CGRAD_TEAM_TRACE=1 CGRAD_TEAM_SPLIT=taper ./build/cgrad bench --config gpt-tiny --threads 2 --steps 2 2> taper.txt
    python3 bench/team_trace.py --steps 2 guided.txt taper.txt

An argument a.txt,b.txt pools the runs a.txt and b.txt. Each file is one run: its first 1/(steps + 1) of the calls (the warm-up step) is left out. A call's
idle time is its wall time on every thread less the pieces' time. On a loaded machine a thread
switched out mid-piece inflates that, so the calls where no thread was are counted apart ("quiet":
every piece over 50 us ran at least 97% of its wall time on the CPU, and every thread that took a
piece started within 100 us). Also the pieces' CPU time per step: the work the cuts cost."""
import argparse
import statistics


def calls(path, steps):
    lines = [l.split() for l in open(path, errors="replace") if l.startswith("team_trace ")]
    lines = lines[len(lines) // (steps + 1):]
    out = []
    for f in lines:
        bar = f.index("|")
        wall, shapes, busy, first, cpu, quiet = float(f[1]), " ".join(f[2:bar]), {}, {}, 0.0, True
        for p in f[bar + 1:]:
            th, span, _, c = p.split(":")
            a, b = map(float, span.split("-"))
            busy[th] = busy.get(th, 0) + b - a
            first[th] = min(first.get(th, a), a)
            cpu += float(c)
            quiet &= b - a <= 50 or float(c) >= 0.97 * (b - a)
        quiet &= len(first) > 1 and max(first.values()) <= 100
        threads = max(len(busy), 2)
        out.append((shapes, wall, threads * wall - sum(busy.values()), threads, cpu, quiet))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps of each run (after 1 warm-up)")
    ap.add_argument("--shapes", action="store_true", help="also per list of products")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    for path in a.files:
        cs = [c for one in path.split(",") for c in calls(one, a.steps)]
        if not cs:
            print(f"{path}: no team_trace lines")
            continue
        q = [c for c in cs if c[5]]
        frac = lambda c: c[2] / (c[3] * c[1])
        allidle = sum(c[2] for c in cs) / sum(c[3] * c[1] for c in cs)
        qidle = sum(c[2] for c in q) / sum(c[3] * c[1] for c in q) if q else float("nan")
        print(f"{path}: {len(cs)} calls, idle {100 * allidle:.2f}% of their thread time; {len(q)} quiet calls, idle "
              f"{100 * qidle:.2f}% (median call {100 * statistics.median(map(frac, q)) if q else float('nan'):.2f}%); "
              f"pieces' CPU {sum(c[4] for c in cs) / 1e3 / a.steps / len(path.split(',')):.1f} ms a step")
        if a.shapes:
            for s in sorted({c[0] for c in cs}):
                g = [c for c in q if c[0] == s]
                print(f"    {s:40s} quiet {len(g):3d}  idle {100 * sum(c[2] for c in g) / sum(c[3] * c[1] for c in g) if g else float('nan'):.2f}%")


if __name__ == "__main__":
    main()
