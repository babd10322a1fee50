#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Data-parallel training on one machine, side by side and interleaved:
#   A  1 process x 2 threads, batch 2B          (the same global batch as B and C)
#   B  mpirun -n 2, 1 thread each, batch B, buckets started during backward (--overlap 1)
#   C  the same with every bucket started after backward (--overlap 0)
# For each run: tokens/s (training steps only) and, for B and C, the all-reduce time per step
# from the first bucket's start to the last one's end and the part of it after backward.
# Usage: bench/dist_bench.sh [REPEATS] [model flags...]   (run from the repository root)
# Prints one line per run and the medians; timings move with the machine's load, so compare
# A, B and C only within one run of this script.
set -euo pipefail
reps=${1:-3}
shift || true
model=("$@")
[ ${#model[@]} -eq 0 ] && model=(--layers 4 --dim 256 --heads 4 --context 64)
bin=${CGRAD_BIN:-./build/cgrad}
B=${BATCH:-4}
steps=${STEPS:-20}
mpirun=(mpirun -n 2 --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
common=(--data data/moby-dick.txt "${model[@]}" --steps "$steps" --eval-every 0 --save-every 0 --samples 0
        --log-every "$steps" --warmup 2 --checkpoint "$dir/b.ckpt")
tok() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' "$1"; }
ar() { sed -n 's/.*per step \([0-9.]*\) ms from first start to last end, \([0-9.]*\) ms of it after backward.*/\1 \2/p' "$1" | tail -1; }
for r in $(seq 1 "$reps"); do
    "$bin" train "${common[@]}" --threads 2 --batch $((2 * B)) > "$dir/a$r" 2>&1
    "${mpirun[@]}" "$bin" train "${common[@]}" --threads 1 --batch "$B" --overlap 1 > "$dir/b$r" 2>&1
    "${mpirun[@]}" "$bin" train "${common[@]}" --threads 1 --batch "$B" --overlap 0 > "$dir/c$r" 2>&1
    echo "rep $r: A $(tok "$dir/a$r") tok/s | B $(tok "$dir/b$r") tok/s, all-reduce $(ar "$dir/b$r") ms | C $(tok "$dir/c$r") tok/s, all-reduce $(ar "$dir/c$r") ms (load $(cut -d' ' -f1 /proc/loadavg))"
done
med() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
params=$(sed -n 's/.*: \([0-9.]*\)M parameters.*/\1/p' "$dir/a1")
echo "model: ${model[*]}, ${params}M parameters, global batch $((2 * B)) x context, $steps steps"
for k in a b c; do
    printf '%s median tokens/s %s' "$k" "$(for r in $(seq 1 "$reps"); do tok "$dir/$k$r"; done | med)"
    [ "$k" != a ] && printf ', all-reduce span %s ms, after backward %s ms' \
        "$(for r in $(seq 1 "$reps"); do ar "$dir/$k$r" | cut -d' ' -f1; done | med)" \
        "$(for r in $(seq 1 "$reps"); do ar "$dir/$k$r" | cut -d' ' -f2; done | med)"
    echo
done
