#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cgrad against PyTorch on the same cores: builds cgrad if needed, runs `cgrad bench` and
# bench/torch_bench.py on every config (and generation), prints a Markdown table side by side.
#
#   bench/compare.sh [--steps N] [--warmup N] [--budgets 1,2] [--configs A,B] [--no-gen] [--rounds N]
#                    [--precisions fp32,bf16]
#
# For each thread budget (cores), cgrad runs with that many threads and PyTorch at its best within
# it: fp32 on OpenBLAS and on BLIS with cgrad's kernel set, bf16 autocast, thread splits and wait
# policy from a sweep (bench/torch_bench.py). With bf16 in --precisions (and a CPU with avx512_bf16),
# cgrad also runs each config under --precision bf16, beside PyTorch's bf16 autocast. The two alternate config by config, so both see about
# the same machine load; --rounds repeats the whole alternation for medians and spread. BUILD_DIR
# (default build-bench) picks the Release build; OUT_DIR (default a new folder under /tmp) keeps
# the raw outputs; NICE (e.g. -10, needs root) runs both at that niceness.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
out=${OUT_DIR:-$(mktemp -d /tmp/cgrad-compare.XXXXXX)}
steps=5 warmup=1 budgets=2 rounds=1 gen=1 precisions=fp32
configs=gpt-tiny,gpt-small,bert-small,encdec-base,gpt-tiny-4k,llama-tiny
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-gen) gen=0; shift ;;
    --precisions) precisions=$2; shift 2 ;;
    *) echo "usage: bench/compare.sh [--steps N] [--warmup N] [--budgets 1,2] [--configs A,B] [--no-gen] [--rounds N] [--precisions fp32,bf16]" >&2
       exit 2 ;;
  esac
done
mkdir -p "$out"
rm -f "$out"/cgrad*.txt "$out"/torch*.txt

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j2 --target cgrad_cli >/dev/null

# Timings on a shared machine mean little while other work runs: say how busy it was.
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# load average before: $(load) ($(nproc) cores); raw outputs in $out${NICE:+; niceness $NICE}"

pre=()
[ -z "${NICE:-}" ] || pre=(nice -n "$NICE")
cgrad=("${pre[@]}" "$build/cgrad" bench)
{ "$build/cgrad" --version; "$build/cgrad" info --system; } | tee "$out/cgrad-version.txt"
kernels=$(sed -n 's/.*kernels \([a-z0-9]*\) .*/\1/p' "$out/cgrad-version.txt")
torch=("${pre[@]}" /usr/bin/python3 "$root/bench/torch_bench.py" --steps "$steps" --warmup "$warmup"
       --blis-kernels "$kernels" --settings "$out/torch-settings.json")

for round in $(seq "$rounds"); do
  for b in ${budgets//,/ }; do
    for cfg in ${configs//,/ }; do
      for prec in ${precisions//,/ }; do
        "${cgrad[@]}" --config "$cfg" --threads "$b" --steps "$steps" --warmup "$warmup" --precision "$prec" |
          tee -a "$out/cgrad.txt" || echo "# cgrad bench failed on $cfg ($prec)"
      done
      "${torch[@]}" --config "$cfg" --budgets "$b" | tee -a "$out/torch.txt" || echo "# torch_bench.py failed on $cfg"
    done
    if [ "$gen" = 1 ]; then
      for prec in ${precisions//,/ }; do
        "${cgrad[@]}" --gen --threads "$b" --precision "$prec" | tee -a "$out/cgrad.txt" ||
          echo "# cgrad bench --gen failed ($prec)"
      done
      "${torch[@]}" --gen --budgets "$b" | tee -a "$out/torch.txt" || echo "# torch_bench.py --gen failed"
    fi
  done
done
echo "# load average after: $(load)"

/usr/bin/python3 - "$out" <<'EOF'
import json, os, statistics, sys
out = sys.argv[1]

def runs(name, precision="fp32"):
    """Every JSON line of a file at one precision, grouped by (config, threads or budget)."""
    res = {}
    path = os.path.join(out, name)
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("precision", "fp32") == precision:
                    res.setdefault((r["config"], r.get("budget", r.get("threads"))), []).append(r)
    return res

def med(rs, key):
    v = [r[key] for r in rs or [] if isinstance(r.get(key), (int, float))]
    return (statistics.median(v), min(v), max(v)) if v else None

def show(m, fmt="{:.0f}"):
    if not m:
        return "—"
    return fmt.format(m[0]) + (f" ({fmt.format(m[1])}–{fmt.format(m[2])})" if m[1] != m[2] else "")

def ratio(a, b):
    return f"{a[0] / b[0]:.2f}×" if a and b else "—"

c, t, cb = runs("cgrad.txt"), runs("torch.txt"), runs("cgrad.txt", "bf16")
print(open(os.path.join(out, "cgrad-version.txt")).read().strip())
print()
print("ms per step, medians over rounds (range); speed-up = PyTorch / cgrad; memory = cgrad peak / PyTorch fp32 peak")
print()
print("| config | threads | cgrad | PyTorch fp32 best | speed-up | PyTorch's winner | PyTorch bf16 | vs bf16 "
      "| cgrad bf16 | cgrad bf16 vs PyTorch bf16 | cgrad sgemm fraction (against the best of 3 before) "
      "| against BLIS's own sgemm "
      "| peak MB cgrad / PyTorch | cgrad bf16 peak MB |")
print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for (name, b) in sorted(c, key=lambda k: (k[1], k[0])):
    if name.endswith("-gen"):  # generation rows have their own table
        continue
    a, p = c.get((name, b)), t.get((name, b))
    ca, pf, pb = med(a, "ms_per_step"), med(p, "ms_per_step"), med(p, "bf16_ms_per_step")
    win = p[-1].get("fp32_variant") or "—" if p else "—"
    bf = show(pb) if pb else ("n/a" if p else "—")
    mem = f"{show(med(a, 'peak_rss_mb'))} / {show(med(p, 'peak_rss_mb'))}"
    cbf = med(cb.get((name, b)), "ms_per_step")
    print(f"| {name} | {b} | {show(ca)} | {show(pf)} | {ratio(pf, ca)} | {win} | {bf} | {ratio(pb, ca)} | "
          f"{show(cbf)} | {ratio(pb, cbf)} | {show(med(a, 'sgemm_fraction'), '{:.2f}')} "
          f"({show(med(a, 'sgemm_fraction_best_before'), '{:.2f}')}) | {show(med(a, 'blis_sgemm_fraction'), '{:.2f}')} | {mem} | "
          f"{show(med(cb.get((name, b)), 'peak_rss_mb'))} |")
print()
print("| generation (gpt-tiny, 16 + 200 tokens, greedy), tokens/s | threads | cgrad | PyTorch fp32 best | ratio | PyTorch bf16 | cgrad bf16 |")
print("|---|---:|---:|---:|---:|---:|---:|")
for (name, b) in sorted(c):
    if name != "gpt-tiny-gen":
        continue
    a, p = c.get((name, b)), t.get((name, b))
    for key, lab in (("tokens_per_s", "with KV cache"), ("tokens_per_s_nocache", "without cache")):
        ca, pf, pb = med(a, key), med(p, key), med(p, "bf16_" + key)
        cbf = med(cb.get((name, b)), key)
        print(f"| {lab} | {b} | {show(ca)} | {show(pf)} | {ratio(ca, pf)} | {show(pb)} | {show(cbf)} |")
EOF
