#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Whole-step speed against the machine: each training config's model FLOPs per second as a fraction
# of the same run's sgemm on the kernel set in use (`cgrad bench`'s sgemm_fraction), on 1 and 2
# threads, and nanoGPT's CPU recipe for tiny-shakespeare (examples/shakespeare_char.sh, 2 threads,
# 2000 steps) with its training tokens/s as a fraction of sgemm and its held-out loss.
#
#   bench/speed_targets.sh [--data tinyshakespeare.txt] [--rounds N] [--steps N] [--threads 1,2]
#                          [--configs A,B] [--no-recipe] [--account]
#
# --account adds, per config, one more 2-thread run under CGRAD_PROFILE=1 on the CPU clock: thread 0's
# op time split into time shared with the helper, time alone (the helper idle) and time waiting for
# the helper's last piece of a product, the account of what the 2-thread fraction leaves.
#
# The recipe's fraction takes the model FLOPs per token of the nanogpt-char bench config (the
# recipe's model and batch) and the sgemm of two short 2-thread runs of that config just before and
# just after the recipe (their mean): the machine's speed drifts within minutes, so the reference is
# taken next to the recipe rather than from the rounds. Rounds
# alternate configs and thread counts, so every config sees about the same load; the table gives
# medians (min-max). BUILD_DIR (default build-bench) picks the Release build; OUT_DIR keeps the raw
# outputs. About 8 minutes with the defaults on 2 idle cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
out=${OUT_DIR:-$(mktemp -d /tmp/cgrad-speed.XXXXXX)}
data="" rounds=3 steps=5 threads=1,2 recipe=1 account=0
configs=gpt-tiny,bert-small,encdec-base,gpt-small,llama-tiny,nanogpt-char
usage="usage: bench/speed_targets.sh [--data tinyshakespeare.txt] [--rounds N] [--steps N] [--threads 1,2] [--configs A,B] [--no-recipe] [--account]"
while [ $# -gt 0 ]; do
  case $1 in
    --data) data=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --no-recipe) recipe=0; shift ;;
    --account) account=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ "$recipe" = 1 ] && [ ! -f "$data" ]; then
  echo "$usage" >&2
  echo "(the recipe needs --data: tiny-shakespeare's input.txt; --no-recipe skips it)" >&2
  exit 2
fi
mkdir -p "$out"
rm -f "$out"/bench.txt "$out"/recipe.log
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j2 --target cgrad_cli >/dev/null

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# load average before: $(load) ($(nproc) cores); raw outputs in $out"
"$build/cgrad" info --system | tee "$out/version.txt"
start=$(date +%s)
for round in $(seq "$rounds"); do
  for th in ${threads//,/ }; do
    for cfg in ${configs//,/ }; do
      "$build/cgrad" bench --config "$cfg" --threads "$th" --steps "$steps" --warmup 1 2>>"$out/bench.log" |
        tee -a "$out/bench.txt" || echo "# cgrad bench failed on $cfg ($th threads)"
    done
  done
done
if [ "$account" = 1 ]; then
  echo "# 2 threads, thread 0's op time on its CPU clock (the warm-up step included)"
  for cfg in ${configs//,/ }; do
    CGRAD_PROFILE=1 CGRAD_PROFILE_CLOCK=cpu "$build/cgrad" bench --config "$cfg" --threads 2 --steps "$steps" \
      --warmup 1 2>"$out/account-$cfg.txt" >/dev/null || echo "# cgrad bench failed on $cfg (account)"
    grep "^team: of" "$out/account-$cfg.txt" | sed "s/^team:/$cfg:/" || echo "$cfg: no team account (one thread?)"
  done
fi
if [ "$recipe" = 1 ]; then
  recipe_ref() { # the recipe's sgemm reference, next to it
    "$build/cgrad" bench --config nanogpt-char --threads 2 --steps 3 --warmup 1 2>/dev/null | grep '^{' \
      >>"$out/recipe_ref.txt" || echo "# cgrad bench failed on nanogpt-char (the recipe's reference)"
  }
  rm -f "$out/recipe_ref.txt"
  recipe_ref
  CGRAD="$build/cgrad" OUT="$out/recipe" "$root/examples/shakespeare_char.sh" --data "$data" >"$out/recipe.log" 2>&1 ||
    echo "# the recipe failed: see $out/recipe.log"
  recipe_ref
  grep -E "^final step|^wall time" "$out/recipe.log" || true
fi
echo "# load average after: $(load); $(( $(date +%s) - start )) s"

/usr/bin/python3 - "$out" <<'EOF'
import json, os, re, statistics, sys
out = sys.argv[1]
runs = {}
for line in open(os.path.join(out, "bench.txt")):
    if line.startswith("{"):
        r = json.loads(line)
        runs.setdefault((r["config"], r["threads"]), []).append(r)

def med(rs, key):
    v = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
    return (statistics.median(v), min(v), max(v)) if v else None

def show(m, fmt):
    if not m:
        return "—"
    return fmt.format(m[0]) + (f" ({fmt.format(m[1])}–{fmt.format(m[2])})" if m[1] != m[2] else "")

print()
print("whole training step (zero grads, forward, loss, backward, AdamW), medians over rounds (min–max)")
print()
print("| config | threads | ms per step | model GFLOP/s | sgemm GFLOP/s | fraction of sgemm | CPU ms per step |")
print("|---|---:|---:|---:|---:|---:|---:|")
for (cfg, th), rs in sorted(runs.items(), key=lambda k: (k[0][1], k[0][0])):
    print(f"| {cfg} | {th} | {show(med(rs, 'ms_per_step'), '{:.1f}')} | {show(med(rs, 'gflops'), '{:.1f}')} | "
          f"{show(med(rs, 'sgemm_gflops'), '{:.1f}')} | **{show(med(rs, 'sgemm_fraction'), '{:.2f}')}** | "
          f"{show(med(rs, 'cpu_ms_per_step'), '{:.1f}')} |")
log = os.path.join(out, "recipe.log")
if os.path.exists(log):
    text = open(log).read()
    m = re.search(r"final step=(\d+) train_loss=(\S+) val_loss=(\S+) tokens_per_s=(\S+)", text)
    w = re.search(r"wall time: (\d+) s", text)
    ref_path = os.path.join(out, "recipe_ref.txt")
    refs = [json.loads(l) for l in open(ref_path) if l.startswith("{")] if os.path.exists(ref_path) else []
    nano = refs or runs.get(("nanogpt-char", 2), [])
    print()
    if m and nano:
        tok_s = float(m.group(4))
        flop_per_token = statistics.median(r["gflops"] / r["tokens_per_s"] for r in nano)  # GFLOP per token
        sgemm = statistics.mean(r["sgemm_gflops"] for r in refs) if refs else statistics.median(r["sgemm_gflops"] for r in nano)
        where = ("the mean of " + " and ".join(f"{r['sgemm_gflops']:.1f}" for r in refs) + " just before and after it"
                 if refs else "the nanogpt-char runs' median")
        print(f"nanoGPT CPU recipe (2 threads, {m.group(1)} steps): held-out loss {m.group(3)}, "
              f"{tok_s:.0f} training tokens/s = {tok_s * flop_per_token:.1f} GFLOP/s = "
              f"**{tok_s * flop_per_token / sgemm:.2f} of sgemm** ({sgemm:.1f} GFLOP/s, {where}); "
              f"wall time {w.group(1) if w else '?'} s with its evaluations")
    else:
        print("nanoGPT CPU recipe: no final line (see recipe.log) or no 2-thread nanogpt-char bench run")
EOF
