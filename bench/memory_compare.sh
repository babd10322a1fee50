#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Peak resident memory of a training step, cgrad (fp32 and bf16) against PyTorch fp32, per config:
# prints a Markdown table of the peaks (MiB, ru_maxrss) and their ratios. Memory does not depend on
# the machine's load, so a busy machine gives the same numbers; each step still takes its time.
#
#   bench/memory_compare.sh [--configs A,B] [--threads N] [--precisions fp32,bf16] [--no-torch]
#
# cgrad: `cgrad bench --steps 1 --warmup 1` (the peak of the warm-up and the timed step; the bench's
# sgemm reference is left out of it); its memory plan (plan_mb) is printed beside it. PyTorch:
# bench/torch_bench.py's child for one config on the default BLAS (the peak after one warm-up and
# one timed step), as compare.sh runs each variant. BUILD_DIR (default build-bench) picks the build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
configs=gpt-tiny,gpt-small,bert-small,encdec-base,gpt-tiny-4k,llama-tiny threads=2 precisions=fp32,bf16 torch=1
while [ $# -gt 0 ]; do
  case $1 in
    --configs) configs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --no-torch) torch=0; shift ;;
    *) echo "usage: bench/memory_compare.sh [--configs A,B] [--threads N] [--precisions fp32,bf16] [--no-torch]" >&2
       exit 2 ;;
  esac
done
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j2 --target cgrad_cli >/dev/null
out=$(mktemp -d /tmp/cgrad-memory.XXXXXX)
for cfg in ${configs//,/ }; do
  for prec in ${precisions//,/ }; do
    "$build/cgrad" bench --config "$cfg" --threads "$threads" --steps 1 --warmup 1 --precision "$prec" 2>/dev/null |
      grep '^{' >>"$out/cgrad.jsonl" || echo "# cgrad bench failed on $cfg ($prec)"
  done
  if [ "$torch" = 1 ]; then
    OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1 /usr/bin/python3 "$root/bench/torch_bench.py" --child --config "$cfg" \
      --threads "$threads" --blas-threads 1 --steps 1 --warmup 1 --no-sgemm 2>/dev/null |
      grep '^{' >>"$out/torch.jsonl" || echo "# torch_bench.py failed on $cfg"
  fi
done
/usr/bin/python3 - "$out" "$precisions" <<'EOF'
import json, os, sys
out, precs = sys.argv[1], sys.argv[2].split(",")
def load(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
c, t = load("cgrad.jsonl"), load("torch.jsonl")
peak = {(r["config"], r.get("precision", "fp32")): r for r in c}
tp = {r["config"]: r["peak_rss_mb"] for r in t}
cols = " | ".join(f"cgrad {p} (plan)" for p in precs)
print(f"| config | {cols} | PyTorch fp32 | " + " | ".join(f"{p} / PyTorch" for p in precs) + " |")
print("|---|" + "---:|" * (2 * len(precs) + 1))
for cfg in dict.fromkeys(r["config"] for r in c):
    cells, ratios = [], []
    for p in precs:
        r = peak.get((cfg, p))
        cells.append(f"{r['peak_rss_mb']:.0f} ({r['plan_mb']:.0f})" if r else "—")
        ratios.append(f"{r['peak_rss_mb'] / tp[cfg]:.2f}" if r and cfg in tp else "—")
    torch = f"{tp[cfg]:.0f}" if cfg in tp else "—"
    print(f"| {cfg} | " + " | ".join(cells) + f" | {torch} | " + " | ".join(ratios) + " |")
EOF
echo "# raw JSON lines in $out"
