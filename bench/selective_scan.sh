#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mamba's selective scan as one custom op (examples/selective_scan.c) against the same model unrolled
# into built-in ops: forward + backward time (median of interleaved rounds) and planned memory.
#   bench/selective_scan.sh [BUILD_DIR] [T ...]      (defaults: build, T = 1024)
set -euo pipefail
build=${1:-build}
shift || true
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(1024)
echo "# $(uptime | sed 's/.*load/load/'); $(nproc) cores; CGRAD_THREADS=${CGRAD_THREADS:-all}"
for T in "${lengths[@]}"; do "$build/selective_scan" --bench "$T"; done
