#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every libFuzzer harness (or those named) for a bounded time, starting from its committed
# seed corpus (tests/fuzz/corpus/<target>), and fails on any finding: a crash, a sanitizer report,
# a leak, a broken oracle, an input slower than -timeout or memory past -rss_limit_mb.
#   tests/fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET [TARGET...]
# New inputs go to a scratch corpus (set FUZZ_CORPUS_OUT=DIR to keep them, one folder a target);
# a finding's input is kept in $FUZZ_ARTIFACTS (default: a temp dir) and its path printed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
secs=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in "$here"/corpus/*/; do targets+=("$(basename "$d")"); done
fi
art=${FUZZ_ARTIFACTS:-$(mktemp -d /tmp/cgrad-fuzz-artifacts.XXXXXX)}
mkdir -p "$art"
scratch=$(mktemp -d /tmp/cgrad-fuzz-corpus.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export CGRAD_THREADS=1
# One harness per core at a time (FUZZ_JOBS to change it): each runs on one thread, so two cores
# fuzz two loaders in the time of one. The reports come in the targets' order.
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
fuzz_one() { # target: runs it, leaves its report line in $art/$t/report and exit status in $art/$t/rc
  local t=$1 bin=$build/tests/fuzz/fuzz_$1 out log rc execs cov
  mkdir -p "$art/$t"
  [ -x "$bin" ] || { echo "fuzz: $bin missing (cmake -DCGRAD_FUZZ=ON ... --target fuzz)" >"$art/$t/report"
                     echo 1 >"$art/$t/rc"; return; }
  out=${FUZZ_CORPUS_OUT:+$FUZZ_CORPUS_OUT/$t}
  out=${out:-$scratch/$t}
  mkdir -p "$out"
  log=$art/$t/log.txt
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$art/$t/" "$out" "$here/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    { echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} executions; log $log"
      grep -E 'ERROR|FUZZ_CHECK|runtime error|Test unit written' "$log" | head -8 | sed 's/^/  /'; } >"$art/$t/report"
  else
    echo "fuzz: $t ok: ${execs:-?} executions in ${secs}s, ${cov:-cov: ?}" >"$art/$t/report"
  fi
  echo $rc >"$art/$t/rc"
}
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
failed=()
for t in "${targets[@]}"; do
  cat "$art/$t/report"
  [ "$(cat "$art/$t/rc" 2>/dev/null)" = 0 ] || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]} (inputs and logs under $art)" >&2
  exit 1
fi
[ -n "${FUZZ_ARTIFACTS:-}" ] || rm -rf "$art"
