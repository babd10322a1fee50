#!/usr/bin/env bash
# cgrad against PyTorch on the same cores: builds cgrad if needed, runs `cgrad bench` and
# bench/torch_bench.py on every config (and generation), prints a Markdown table side by side.
#
#   bench/compare.sh [--steps N] [--warmup N] [--threads N] [--torch-threads T,B] [--configs A,B] [--no-gen] [--scaling]
#
# cgrad runs with --threads (default 2); PyTorch with (torch, BLAS) threads T,B, or the fastest
# setting bench/torch_bench.py finds when --torch-threads is absent. The two alternate config by
# config, so both see about the same machine load. --scaling adds gpt-small at 1 thread on both
# sides. BUILD_DIR (default build-bench) picks the Release build; OUT_DIR (default a new folder
# under /tmp) keeps the raw outputs; NICE (e.g. -10, needs root) runs both benchmarks at that
# niceness, so that other work on a shared machine disturbs the timings less.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
out=${OUT_DIR:-$(mktemp -d /tmp/cgrad-compare.XXXXXX)}
steps=5 warmup=1 threads=2 torch_threads="" scaling=0 gen=1
configs=gpt-tiny,gpt-small,bert-small,encdec-base,gpt-tiny-4k
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --torch-threads) torch_threads=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --no-gen) gen=0; shift ;;
    --scaling) scaling=1; shift ;;
    *) echo "usage: bench/compare.sh [--steps N] [--warmup N] [--threads N] [--torch-threads T,B] [--configs A,B]" \
            "[--no-gen] [--scaling]" >&2
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
torch_base=("${pre[@]}" /usr/bin/python3 "$root/bench/torch_bench.py" --steps "$steps" --warmup "$warmup")
torch=("${torch_base[@]}")
torch_gen=("${torch_base[@]}")
[ -z "$torch_threads" ] || torch_gen+=(--threads "${torch_threads%,*}" --blas-threads "${torch_threads#*,}")
if [ -z "$torch_threads" ] && [ -n "$configs" ]; then
  # The sweep's last line names the fastest (torch, BLAS) setting.
  "${torch[@]}" --sweep-only | tee "$out/torch-sweep.txt"
  torch_threads=$(sed -n 's/^# torch sweep: fastest is torch threads \([0-9]*\), BLAS threads \([0-9]*\)$/\1,\2/p' \
    "$out/torch-sweep.txt")
  [ -n "$torch_threads" ] || { echo "compare.sh: the torch thread sweep failed" >&2; torch_threads=1,1; }
fi
[ -z "$torch_threads" ] || torch+=(--threads "${torch_threads%,*}" --blas-threads "${torch_threads#*,}")

for cfg in ${configs//,/ }; do
  "${cgrad[@]}" --config "$cfg" --threads "$threads" --steps "$steps" --warmup "$warmup" |
    tee -a "$out/cgrad.txt" || echo "# cgrad bench failed on $cfg"
  "${torch[@]}" --config "$cfg" | tee -a "$out/torch.txt" || echo "# torch_bench.py failed on $cfg"
done
if [ "$gen" = 1 ]; then
  "${cgrad[@]}" --gen --threads "$threads" | tee -a "$out/cgrad.txt" || echo "# cgrad bench --gen failed"
  # unless --torch-threads fixed them, generation picks its own fastest torch threads
  "${torch_gen[@]}" --gen | tee -a "$out/torch.txt" || echo "# torch_bench.py --gen failed"
fi
if [ "$scaling" = 1 ]; then
  "${cgrad[@]}" --config gpt-small --threads 1 --steps "$steps" --warmup "$warmup" | tee "$out/cgrad-1t.txt" || true
  "${torch_base[@]}" --config gpt-small --threads 1 --blas-threads 1 | tee "$out/torch-1t.txt" || true
fi
echo "# load average after: $(load)"

/usr/bin/python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]

def rows(name):
    path = os.path.join(out, name)
    res = {}
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                res[r["config"]] = r
    return res

def f(r, k, fmt):
    v = r.get(k) if r else None
    return fmt.format(v) if isinstance(v, (int, float)) else (r.get("error", "—") if r else "—")

def ratio(a, b, ka, kb):
    try:
        return f"{a[ka] / b[kb]:.2f}x"
    except (KeyError, TypeError, ZeroDivisionError):
        return "—"

c, t = rows("cgrad.txt"), rows("torch.txt")
tr = next(iter(t.values()), {})
print()
print(f"cgrad: {next(iter(c.values()), {}).get('threads', '?')} threads; PyTorch: torch threads "
      f"{tr.get('threads', '?')}, BLAS threads {tr.get('blas_threads', '?')}")
print()
print("| config | cgrad ms/step | torch ms/step | speed-up (torch/cgrad) | cgrad tok/s | cgrad GFLOP/s "
      "| sgemm fraction | cgrad peak MB | torch peak MB | memory ratio (torch/cgrad) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in ["gpt-tiny", "gpt-small", "bert-small", "encdec-base", "gpt-tiny-4k"]:
    a, b = c.get(name), t.get(name)
    if not a and not b:
        continue
    print(f"| {name} | {f(a, 'ms_per_step', '{:.1f}')} | {f(b, 'ms_per_step', '{:.1f}')} | "
          f"{ratio(b, a, 'ms_per_step', 'ms_per_step')} | {f(a, 'tokens_per_s', '{:.0f}')} | "
          f"{f(a, 'gflops', '{:.1f}')} | {f(a, 'sgemm_fraction', '{:.2f}')} | {f(a, 'peak_rss_mb', '{:.0f}')} | "
          f"{f(b, 'peak_rss_mb', '{:.0f}')} | {ratio(b, a, 'peak_rss_mb', 'peak_rss_mb')} |")
a, b = c.get("gpt-tiny-gen"), t.get("gpt-tiny-gen")
print()
print("| generation (gpt-tiny, 16 + 200 tokens, greedy) | cgrad tok/s | torch tok/s | ratio (cgrad/torch) |")
print("|---|---:|---:|---:|")
print(f"| with KV cache | {f(a, 'tokens_per_s', '{:.1f}')} | {f(b, 'tokens_per_s', '{:.1f}')} | "
      f"{ratio(a, b, 'tokens_per_s', 'tokens_per_s')} |")
print(f"| without cache | {f(a, 'tokens_per_s_nocache', '{:.1f}')} | {f(b, 'tokens_per_s_nocache', '{:.1f}')} | "
      f"{ratio(a, b, 'tokens_per_s_nocache', 'tokens_per_s_nocache')} |")
if b and "threads" in b:
    print(f"\nPyTorch generation ran at (torch, BLAS) threads ({b.get('threads')}, {b.get('blas_threads')}) with cache, "
          f"({b.get('threads_nocache', b.get('threads'))}, {b.get('blas_threads_nocache', b.get('blas_threads'))}) without.")
c1, t1 = rows("cgrad-1t.txt").get("gpt-small"), rows("torch-1t.txt").get("gpt-small")
if c1 or t1:
    a, b = c.get("gpt-small"), t.get("gpt-small")
    print()
    print("| gpt-small scaling | 1 thread ms/step | default threads ms/step | speed-up |")
    print("|---|---:|---:|---:|")
    print(f"| cgrad | {f(c1, 'ms_per_step', '{:.1f}')} | {f(a, 'ms_per_step', '{:.1f}')} | "
          f"{ratio(c1, a, 'ms_per_step', 'ms_per_step')} |")
    print(f"| torch | {f(t1, 'ms_per_step', '{:.1f}')} | {f(b, 'ms_per_step', '{:.1f}')} | "
          f"{ratio(t1, b, 'ms_per_step', 'ms_per_step')} |")
EOF
