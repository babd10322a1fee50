#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cgrad bench's sgemm reference: a warm 2048^3 product runs after each timed step, and each step's
# "sgemm_fraction" is the model's GFLOP/s over that reference's median (and over the best of 3 run
# before the config, "sgemm_fraction_best_before"). This prints the JSON line of a short gpt-tiny
# bench and checks the fractions against the GFLOP/s printed beside them, to the printed digits
# (1%). A benchmark, not a test: it takes tens of seconds of full-machine sgemm.
# Usage: bench/sgemm_reference.sh [CGRAD]      (default build/cgrad)
set -euo pipefail
bin=${1:-build/cgrad}
out=$("$bin" bench --config gpt-tiny --steps 2 --warmup 1 --batch 1 --context 16 --threads 1)
echo "$out"
line=$(printf '%s\n' "$out" | grep -m1 '^{"config":"gpt-tiny"')
printf '%s\n' "$out" | grep -q 'sgemm between the timed steps: median.* of 2 (' ||
  { echo "FAIL: bench does not say how many products ran between the steps"; exit 1; }
/usr/bin/python3 - "$line" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
ok = True
for frac, ref in (("sgemm_fraction", "sgemm_gflops"), ("sgemm_fraction_best_before", "sgemm_gflops_best_before")):
    want = j["gflops"] / j[ref]
    good = j[ref] > 0 and abs(j[frac] - want) <= 0.01 * want
    print("%s %s: %.4f, gflops / %s = %.4f" % ("ok" if good else "FAIL", frac, j[frac], ref, want))
    ok &= good
sys.exit(0 if ok else 1)
PY
