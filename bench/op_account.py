#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where a training step's time goes, by op: runs `cgrad bench` under CGRAD_PROFILE=2 and prints, per
config and thread count, each op kind's forward and backward ms per step (the median over the timed
steps of each node, the warm-up step left out), the matrix products' share of the step, the other
ops' share, and what runs outside the ops (the optimizer's updates inside backward, gradient zeroing,
the executor), against the step's ms and the run's fraction of sgemm. The products' line gives the
rate of the model FLOPs (all of them are products) over the products' time alone, as a fraction of
the run's sgemm: what the step would reach if nothing else took time.

  bench/op_account.py [--build build-bench] [--configs bert-small,llama-tiny] [--threads 1,2]
                      [--steps 5] [--rounds 1] [--cpu-clock]

--cpu-clock times one-thread runs by the thread's CPU clock (CGRAD_PROFILE_CLOCK=cpu), compares the
ops with the step's CPU time, and takes the fraction of sgemm against bench_linear's 2048^3 product
by CPU time after each run (built in the same build directory), so the time other processes hold the
core drops out of the account (what they take of the shared caches does not).
Rounds alternate configs and thread counts; each figure is the median over the rounds."""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys

# Ops whose work is matrix products (the model FLOPs): everything else is counted as "other ops".
PRODUCTS = {"linear", "linear_act", "linear_add", "matmul", "attention", "linear_cross_entropy", "lora_linear", "segment_linear",
            "conv2d", "sdpa"}
PROFILE_LINE = re.compile(r"\[profile\] (fwd|bwd) node (\d+) (\w+)\S*: ([\d.]+) ms")


def run_once(build, config, threads, steps, cpu_clock):
    env = dict(os.environ, CGRAD_PROFILE="2")
    if cpu_clock and threads == 1:
        env["CGRAD_PROFILE_CLOCK"] = "cpu"
    p = subprocess.run([os.path.join(build, "cgrad"), "bench", "--config", config, "--threads", str(threads),
                        "--steps", str(steps), "--warmup", "1"], env=env, capture_output=True, text=True)
    result = next((json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")), None)
    if not result or "error" in result:
        sys.exit(f"cgrad bench --config {config} --threads {threads} failed: {result}\n{p.stderr[-2000:]}")
    times = collections.defaultdict(list)  # (pass, node) -> ms of each run
    kind = {}
    for line in p.stderr.splitlines():
        m = PROFILE_LINE.match(line)
        if m:
            times[(m[1], int(m[2]))].append(float(m[4]))
            kind[int(m[2])] = m[3]
    ops = collections.defaultdict(lambda: [0.0, 0.0])  # op -> [fwd, bwd] ms per step
    runs = steps + 1  # the timed steps and the warm-up
    for (pas, node), ts in times.items():
        # a node the plan remakes in backward (regen: GELU's output from its product, a layer norm's)
        # runs its forward twice a step: each step's entries are summed, not taken one by one
        per = len(ts) // runs if len(ts) % runs == 0 else 1
        ts = [sum(ts[i:i + per]) for i in range(0, len(ts) - per + 1, per)]
        ts = ts[1:]  # the warm-up step: first touches of the memory plan
        if ts:
            ops[kind[node]][pas == "bwd"] += statistics.median(ts)
    step = result["cpu_ms_per_step"] if cpu_clock and threads == 1 else result["ms_per_step"]
    model_gflop = result["gflops"] * result["ms_per_step"] / 1e3
    return dict(ops), step, result["sgemm_fraction"], model_gflop, result["sgemm_gflops"]


def reference_cpu_gflops(build):
    """GFLOP/s of bench_linear's 2048^3 product (the kernel set in use, one thread) by CPU time."""
    exe = os.path.join(build, "bench_linear")
    if not os.path.exists(exe):
        sys.exit(f"--cpu-clock needs {exe}: cmake --build {build} --target bench_linear")
    out = subprocess.run([exe, "5", "1024", "1", "2"], capture_output=True, text=True).stdout
    m = re.search(r"2048\^3 reference .*?([\d.]+) GFLOP/s", out)
    if not m:
        sys.exit(f"bench_linear printed no reference:\n{out}")
    return float(m[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-bench")
    ap.add_argument("--configs", default="gpt-tiny,bert-small,encdec-base,gpt-small,llama-tiny")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cpu-clock", action="store_true")
    a = ap.parse_args()
    configs, threads = a.configs.split(","), [int(t) for t in a.threads.split(",")]
    runs = collections.defaultdict(list)
    for _ in range(a.rounds):
        for th in threads:
            for cfg in configs:
                r = run_once(a.build, cfg, th, a.steps, a.cpu_clock)
                if a.cpu_clock and th == 1:  # the sgemm by CPU time right after the run, as the bench's is
                    r = r[:4] + (reference_cpu_gflops(a.build),)
                runs[(cfg, th)].append(r)
    summary = []  # (column, {op: share}, products, other, outside, products' sgemm fraction, step, fraction)
    for th in threads:
        for cfg in configs:
            rs = runs[(cfg, th)]
            names = sorted({op for r in rs for op in r[0]})
            med = {op: [statistics.median(r[0].get(op, [0, 0])[k] for r in rs) for k in (0, 1)] for op in names}
            step = statistics.median(r[1] for r in rs)
            frac = statistics.median(r[2] for r in rs)
            gflop, sgemm = statistics.median(r[3] for r in rs), statistics.median(r[4] for r in rs)
            clock = "CPU" if a.cpu_clock and th == 1 else "wall"
            if clock == "CPU":  # the step's CPU time against the reference's
                frac = statistics.median(r[3] / (r[1] / 1e3) / r[4] for r in rs)
            print(f"\n{cfg}, {th} thread(s): {step:.1f} ms a step ({clock} clock), {frac:.2f} of sgemm "
                  f"({gflop:.1f} model GFLOP a step, sgemm {sgemm:.0f} GFLOP/s)\n")
            print("| op | kind | fwd ms | bwd ms | share of the step |\n|---|---|---:|---:|---:|")
            prod = sum(sum(med[o]) for o in names if o in PRODUCTS)
            other = sum(sum(med[o]) for o in names if o not in PRODUCTS)
            for op in sorted(names, key=lambda o: -sum(med[o])):
                t = sum(med[op])
                if t >= 0.005 * step:
                    print(f"| {op} | {'product' if op in PRODUCTS else 'other'} | {med[op][0]:.1f} | "
                          f"{med[op][1]:.1f} | {100 * t / step:.1f}% |")
            small = sum(sum(med[o]) for o in names if sum(med[o]) < 0.005 * step)
            if small:
                print(f"| ops under 0.5% each | | | | {100 * small / step:.1f}% |")
            outside = step - prod - other
            print(f"| **products** (their model FLOPs at {gflop / prod * 1e3 / sgemm:.2f} of sgemm) | | | | "
                  f"**{100 * prod / step:.1f}%** |")
            print(f"| **other ops** | | | | **{100 * other / step:.1f}%** |")
            print(f"| **outside the ops** (optimizer, zeroing, executor) | | | | **{100 * outside / step:.1f}%** |")
            summary.append((f"{cfg}, {th}t", {o: 100 * sum(med[o]) / step for o in names}, 100 * prod / step,
                            100 * other / step, 100 * outside / step, gflop / prod * 1e3 / sgemm, step, frac))
    # every run side by side: each op's share of its step, the op kinds in rows
    ops = sorted({o for col in summary for o in col[1]}, key=lambda o: (o not in PRODUCTS, -max(c[1].get(o, 0) for c in summary)))
    print("\nShare of the step, %:\n")
    print("| op | " + " | ".join(c[0] for c in summary) + " |")
    print("|---|" + "---:|" * len(summary))
    for o in ops:
        if max(c[1].get(o, 0) for c in summary) >= 0.5:
            print(f"| {o} | " + " | ".join(f"{c[1][o]:.1f}" if o in c[1] else "—" for c in summary) + " |")
    rows = [("ops under 0.5% in every run", lambda c: sum(v for o, v in c[1].items()
                                                           if max(d[1].get(o, 0) for d in summary) < 0.5)),
            ("**products**", lambda c: c[2]), ("**other ops**", lambda c: c[3]), ("**outside the ops**", lambda c: c[4])]
    for name, f in rows:
        print(f"| {name} | " + " | ".join(f"{f(c):.1f}" for c in summary) + " |")
    print("| products' FLOPs over their time, of sgemm | " + " | ".join(f"{c[5]:.2f}" for c in summary) + " |")
    print("| ms a step | " + " | ".join(f"{c[6]:.0f}" for c in summary) + " |")
    print("| step's fraction of sgemm | " + " | ".join(f"{c[7]:.2f}" for c in summary) + " |")


if __name__ == "__main__":
    main()
