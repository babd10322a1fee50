#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cgrad bench's sgemm reference: a warm 2048^3 product runs after each timed step, and
# "sgemm_fraction" is the median over the steps of each step's GFLOP/s over the product right after
# it, with their spread in "sgemm_fraction_min" and "_max" ("sgemm_fraction_best_before": the
# median step's GFLOP/s over the best of 3 run before the config). This prints the JSON line of a
# short gpt-tiny bench and checks the fractions against the GFLOP/s printed beside them: the best
# before's to the printed digits (1%), the paired median within its spread and within that
# spread's width of the ratio of the two medians. A benchmark, not a test: it takes tens of
# seconds of full-machine sgemm.
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
want = j["gflops"] / j["sgemm_gflops_best_before"]
good = j["sgemm_gflops_best_before"] > 0 and abs(j["sgemm_fraction_best_before"] - want) <= 0.01 * want
print("%s sgemm_fraction_best_before: %.4f, gflops / sgemm_gflops_best_before = %.4f"
      % ("ok" if good else "FAIL", j["sgemm_fraction_best_before"], want))
ok &= good
lo, hi, frac, of_medians = j["sgemm_fraction_min"], j["sgemm_fraction_max"], j["sgemm_fraction"], j["gflops"] / j["sgemm_gflops"]
good = lo <= frac <= hi and abs(frac - of_medians) <= (hi - lo) + 0.01 * frac
print("%s sgemm_fraction: %.4f in [%.4f, %.4f]; gflops / sgemm_gflops = %.4f"
      % ("ok" if good else "FAIL", frac, lo, hi, of_medians))
ok &= good
sys.exit(0 if ok else 1)
PY
