#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two simulated hosts against one process, one command (root, network namespaces; from the
# repository root, after building):   bench/dist_hosts_bench.sh [REPEATS]
# For each model, interleaved REPEATS times (default 3):
#   1 process x 1 thread, --grad-accum 2 x ACCUM (the same global batch, the same bits as 2 ranks)
#   2 hosts x 1 thread over TCP on a veth pair (dist/netns_hosts.sh)
#   2 hosts x 1 thread through a user-space link of 5 ms one way and 1 Gbit/s (netns_link)
# Prints a Markdown table: tokens/s (median and spread), speed-up over 1 process, the all-reduce
# time per step left after backward, and the cost model for the link: the whole all-reduce,
# bytes x 2(N-1)/N / bandwidth + latency x log2 N, and its last bucket (what overlap cannot hide),
# with the link's latency and bandwidth measured first by bench/dist_allreduce.c.
# Environment: MODELS ("tiny small" default), STEPS (24: fewer leave start-up in the tokens/s), CGRAD_BIN (build/cgrad),
# ACCUM (1: micro-batches each rank sums before an all-reduce; 1 process runs 2 x ACCUM, the same bits).
set -euo pipefail
reps=${1:-3}
root=$(pwd)
bin=$(readlink -f "${CGRAD_BIN:-build/cgrad}")
probe=$(readlink -f "${DIST_ALLREDUCE:-build/dist_allreduce}")
hosts="$root/dist/netns_hosts.sh"
steps=${STEPS:-24}
accum=${ACCUM:-1}
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)"; exit 1; }
[ -f data/moby-dick.txt ] || { echo "needs data/moby-dick.txt (./setup.sh)"; exit 1; }
prefix="cgb$$"
dir=$(mktemp -d)
cleanup() {
    for ns in "${prefix}1" "${prefix}2"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done
    (cd "$dir" && "$hosts" down "$prefix" 2 >/dev/null 2>&1) || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$hosts" up "$prefix" 2
cd "$dir"
declare -A model_args=(
    [tiny]="--layers 4 --dim 256 --heads 4 --context 256 --batch 4"
    [small]="--layers 2 --dim 128 --heads 4 --context 64 --batch 4"
)
declare -A model_name=([tiny]="gpt-tiny shape (4 layers, d256, context 256)" [small]="2 layers, d128, context 64")
common=(--data "$root/data/moby-dick.txt" --threads 1 --steps "$steps" --eval-every 0 --save-every 0 --samples 0
        --log-every "$steps" --warmup 2 --bucket-kb 1024)
tok() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' "$1"; }
ar() { sed -n 's/.*per step \([0-9.]*\) ms from first start to last end, \([0-9.]*\) ms of it after backward.*/\2/p' "$1" | tail -1; }
mb() { sed -n 's/.*all-reduce: \([0-9]*\) buckets, \([0-9.]*\) MB a step.*/\1 \2/p' "$1" | tail -1; }
set_link() { # veth | slow
    if [ "$1" = slow ]; then "$hosts" slow "$prefix" 2 5 1000 0; else "$hosts" fast "$prefix" 2; fi
}
two() { "$hosts" mpirun "$prefix" 2 -- "$bin" train "$@"; }
declare -A alpha beta
for link in veth slow; do # the links themselves
    set_link "$link"
    read -r alpha[$link] beta[$link] < <("$hosts" mpirun "$prefix" 2 -- "$probe" link | tail -1)
done
models=(${MODELS:-tiny small})
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$reps"); do
    for m in "${models[@]}"; do
        read -ra a <<< "${model_args[$m]}"
        "$bin" train "${common[@]}" "${a[@]}" --grad-accum $((2 * accum)) --checkpoint "$dir/$m.one.ckpt" > "$m.one.$r" 2>&1
        for link in veth slow; do
            set_link "$link"
            two "${common[@]}" "${a[@]}" --grad-accum "$accum" --checkpoint "$dir/$m.$link.ckpt" > "$m.$link.$r" 2>&1 || true
        done
        echo "rep $r $m: 1 process $(tok "$m.one.$r") | veth $(tok "$m.veth.$r") | 5 ms 1 Gbit $(tok "$m.slow.$r") tok/s (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    done
done
set_link veth
stats() { sort -g | awk '{a[NR]=$1} END {if (NR) printf "%s %s %s\n", a[int((NR+1)/2)], a[1], a[NR]; else print "- - -"}'; }
echo
echo "| model | setup | tokens/s, median (min-max) | speed-up | all-reduce after backward, ms | model: whole all-reduce / last bucket, ms |"
echo "|---|---|---:|---:|---:|---:|"
for m in "${models[@]}"; do
    read -r one _ _ < <(for r in $(seq 1 "$reps"); do tok "$m.one.$r"; done | stats)
    echo "| ${model_name[$m]} | 1 process × 1 thread | $one | 1.00 | — | — |"
    for link in veth slow; do
        read -r med lo hi < <(for r in $(seq 1 "$reps"); do tok "$m.$link.$r"; done | stats)
        read -r left _ _ < <(for r in $(seq 1 "$reps"); do ar "$m.$link.$r"; done | stats)
        read -r nb mbytes < <(mb "$m.$link.1")
        label=$([ "$link" = veth ] && echo "2 hosts × 1 thread, TCP over veth" || echo "2 hosts × 1 thread, 5 ms + 1 Gbit/s")
        model=$(awk -v mb="$mbytes" -v nb="$nb" -v a="${alpha[$link]}" -v b="${beta[$link]}" 'BEGIN {
            bw = b * 1e9 / 8; whole = mb * 1e6 / bw + a * 1e-6; last = mb * 1e6 / nb / bw + a * 1e-6
            printf "%.1f / %.1f\n", whole * 1e3, last * 1e3 }')
        echo "| ${model_name[$m]} | $label | $med ($lo-$hi) | $(awk -v a="$med" -v b="$one" 'BEGIN {printf "%.2f", a / b}') | $left | $model |"
    done
done
echo
echo "Links measured by bench/dist_allreduce.c: veth ${alpha[veth]} us, ${beta[veth]} Gbit/s; user-space link ${alpha[slow]} us, ${beta[slow]} Gbit/s."
echo "All-reduce: $(mb "${models[0]}.veth.1" | awk '{print $2 " MB in " $1 " buckets"}') (${models[0]}), ranks summing $accum micro-batch(es) before each. $reps interleaved repeats, $steps steps each; load average $load0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
