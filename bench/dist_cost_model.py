#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cost model for data-parallel training on N nodes (README "Training on several machines").

Each node is assumed to be this 2-core machine running the per-node batch of the benchmark config
in compute_s seconds per step (forward + backward + AdamW, `cgrad bench`, 2 threads). Per step,
a ring all-reduce sends and receives 2 (N - 1) / N x params x 4 bytes on each node's link, in
`buckets` messages that each pay 2 (N - 1) hops of latency alpha. Backward is taken as 2/3 of the
step. Without overlap the step is compute + comm; with overlap only the part of comm that does not
fit behind backward shows, and at least the last bucket's share (it can start only when backward
ends). Efficiency = compute / step (weak scaling: the per-node batch stays fixed).

Usage: bench/dist_cost_model.py [--alpha-us 25] [--bucket-mb 25] [--check SPAN_MS BYTES BWD_MS]
--check prints what the model predicts for a measured 2-rank run: given the all-reduce time of
one step without overlap (SPAN_MS, for BYTES bytes) and the backward time, the part left after
backward with overlap.
"""
import argparse

CONFIGS = {  # params, compute seconds per step on 2 threads (README Performance, run C)
    "gpt-small": (124_475_904, 5.261),
    "encdec-base": (34_367_296, 1.289),
}


def step_times(params, compute_s, n, gbps, alpha, bucket_bytes):
    nbytes = params * 4
    buckets = max(1, -(-nbytes // bucket_bytes))
    comm = 2 * (n - 1) / n * nbytes * 8 / (gbps * 1e9) + 2 * (n - 1) * buckets * alpha
    bwd = compute_s * 2 / 3
    exposed = max(comm - bwd, comm / buckets)
    return comm, compute_s + comm, compute_s + exposed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha-us", type=float, default=25.0)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--check", nargs=3, type=float, metavar=("SPAN_MS", "BYTES", "BWD_MS"))
    a = ap.parse_args()
    alpha, bucket = a.alpha_us * 1e-6, int(a.bucket_mb * 1e6)
    print(f"alpha {a.alpha_us:g} us per hop, buckets of {a.bucket_mb:g} MB, backward = 2/3 of the step\n")
    links = (10, 25, 100)
    for name, (params, compute) in CONFIGS.items():
        print(f"{name}: {params / 1e6:.1f}M parameters ({params * 4 / 1e6:.0f} MB of float32 gradients), "
              f"{compute:.2f} s of compute per step; each cell: all-reduce time, efficiency without / with overlap\n")
        print("| N | sent per node per step | " + " | ".join(f"{g} Gb/s" for g in links) + " |")
        print("|---:|---:|" + "---:|" * len(links))
        for n in (2, 4, 8, 16, 32, 64):
            cells = []
            for gbps in links:
                comm, t_plain, t_ovl = step_times(params, compute, n, gbps, alpha, bucket)
                cells.append(f"{comm * 1e3:.0f} ms: {compute / t_plain:.2f} / {compute / t_ovl:.2f}")
            print(f"| {n} | {2 * (n - 1) / n * params * 4 / 1e6:.0f} MB | " + " | ".join(cells) + " |")
        print()
    if a.check:
        span_ms, nbytes, bwd_ms = a.check
        bw = 2 * (2 - 1) / 2 * nbytes / (span_ms / 1e3)
        print(f"\ncheck, 2 ranks: {nbytes / 1e6:.2f} MB all-reduced in {span_ms:.1f} ms without overlap = "
              f"{bw * 8 / 1e9:.2f} Gb/s effective; with backward {bwd_ms:.0f} ms the model leaves "
              f"{max(span_ms - bwd_ms, 0):.1f} ms after backward")


if __name__ == "__main__":
    main()
