#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Gradient checkpointing on and off, side by side and interleaved: for each config, REPEATS rounds
# of `cgrad bench` without and then with --checkpoint-activations, each under /usr/bin/time -v.
# Per run: median ms per training step (bench's own timing after its warm-up) in wall time and in
# CPU time of all threads (which a loaded machine moves much less), the memory plan's
# block size (values, gradients and scratch of the graph), and the process's maximum resident set
# (parameters, gradients and AdamW moments included, which checkpointing does not touch).
# Usage: bench/checkpoint_bench.sh [REPEATS] [CONFIG:BATCH:CONTEXT ...]   (from the repository root)
# Default configs: gpt-small:1:1024 gpt-tiny:16:256. STEPS (2) and WARMUP (1) set
# each run's steps; THREADS (2) its threads. Times move with the machine's load: compare on and off
# only within one run of this script.
set -euo pipefail
reps=${1:-2}
shift || true
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(gpt-small:1:1024 gpt-tiny:16:256)
bin=${CGRAD_BIN:-./build/cgrad}
steps=${STEPS:-2}
warmup=${WARMUP:-1}
threads=${THREADS:-2}
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
field() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1" | tail -1; }
rss() { sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$1" | awk '{printf "%.0f\n", $1 / 1024}'; }
med() { sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%s-%s", lo, hi}'; }
echo "# $("$bin" --version 2>/dev/null | head -1); $threads threads, $warmup warm-up + $steps timed steps per run, $reps rounds"
for c in "${configs[@]}"; do
    IFS=: read -r name batch ctx <<< "$c"
    for r in $(seq 1 "$reps"); do
        for mode in off on; do
            flag=()
            [ $mode = on ] && flag=(--checkpoint-activations)
            out="$dir/$name-$batch-$ctx-$mode-$r"
            /usr/bin/time -v "$bin" bench --config "$name" --batch "$batch" --context "$ctx" --steps "$steps" \
                --warmup "$warmup" --threads "$threads" "${flag[@]}" > "$out" 2>&1 || { cat "$out"; exit 1; }
            echo "$name ${batch}x$ctx checkpointing $mode, round $r: $(field "$out" ms_per_step) ms/step" \
                 "(CPU $(field "$out" cpu_ms_per_step) ms), plan $(field "$out" plan_mb) MB," \
                 "max RSS $(rss "$out") MB (load $(cut -d' ' -f1 /proc/loadavg))"
        done
    done
    for mode in off on; do
        files=("$dir/$name-$batch-$ctx-$mode-"*)
        printf '%s %sx%s checkpointing %-3s: median %s ms/step (%s), CPU %s ms/step (%s), plan %s MB, max RSS median %s MB (%s)\n' \
            "$name" "$batch" "$ctx" "$mode" \
            "$(for f in "${files[@]}"; do field "$f" ms_per_step; done | med)" \
            "$(for f in "${files[@]}"; do field "$f" ms_per_step; done | spread)" \
            "$(for f in "${files[@]}"; do field "$f" cpu_ms_per_step; done | med)" \
            "$(for f in "${files[@]}"; do field "$f" cpu_ms_per_step; done | spread)" \
            "$(field "${files[0]}" plan_mb)" \
            "$(for f in "${files[@]}"; do rss "$f"; done | med)" \
            "$(for f in "${files[@]}"; do rss "$f"; done | spread)"
    done
done
