#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A TinyLlama-1.1B-shaped model on this machine, cgrad beside PyTorch: LoRA rank 16 on every
# projection (q, k, v, o, gate, up, down), context 256, batch 1, 2 threads, AdamW; then greedy
# generation with the KV cache. Writes the model directory first when it is missing
# (bench/make_llama_dir.py: bf16 weights in two shards, random from seed 0, LLaMA-2's 32k
# tokenizer.json from data/llama2 when ./setup.sh has fetched it).
#
#   bench/bigload_bench.sh [DIR]        (default runs/tinyllama)
#
# Environment: CGRAD (build/cgrad), LAYERS (22), STEPS (4 timed steps after 1 warm-up, each framework), ROUNDS (1:
# the frameworks alternate round by round), GEN (32 generated tokens), TORCH (fp32,bf16: PyTorch
# variants), TEXT (data/tinyshakespeare.txt when present, else data/moby-dick.txt), TOKENIZER
# (data/llama2/tokenizer.json).
# Prints each run's tokens/s, load seconds and peak RSS (/usr/bin/time -v), the time to read the
# weight files (direct I/O, then from the page cache) and the load average.
set -euo pipefail
DIR=${1:-runs/tinyllama}
CGRAD=${CGRAD:-build/cgrad}
LAYERS=${LAYERS:-22}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-1}
GEN=${GEN:-32}
TORCH=${TORCH:-fp32,bf16}
if [ -z "${TEXT:-}" ]; then # tinyshakespeare when present; the step's speed does not depend on the text
  TEXT=data/tinyshakespeare.txt
  [ -f "$TEXT" ] || TEXT=data/moby-dick.txt
fi
TOKENIZER=${TOKENIZER:-data/llama2/tokenizer.json}
PY=/usr/bin/python3
TARGETS=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
[ -f "$TEXT" ] || { echo "no $TEXT: run ./setup.sh, or copy tinyshakespeare.txt into data/ (or set TEXT)" >&2; exit 2; }
echo "training text: $TEXT"
if [ ! -f "$DIR/config.json" ]; then
  # context 256 is what the runs use; the layout is transformers' (config.json, shards, index)
  "$PY" bench/make_llama_dir.py "$DIR" --layers "$LAYERS" --shards 2 --dtype bf16 --max-positions 256 --text "$TEXT" \
    --tokenizer-json "$TOKENIZER"
elif [ -f "$TOKENIZER" ] && [ ! -f "$DIR/tokenizer.json" ]; then # a directory written before: the real tokenizer now
  "$PY" bench/make_llama_dir.py "$DIR" --tokenizer-only --tokenizer-json "$TOKENIZER" --text "$TEXT"
fi
shards=("$DIR"/model*.safetensors)
bytes=$(cat "${shards[@]}" | wc -c)

# the time to read the weights: from the disk (O_DIRECT, past the page cache), then from the cache
t0=$(date +%s.%N)
for f in "${shards[@]}"; do dd if="$f" of=/dev/null bs=16M iflag=direct status=none; done
t1=$(date +%s.%N)
cat "${shards[@]}" > /dev/null
t2=$(date +%s.%N)
cat "${shards[@]}" > /dev/null
t3=$(date +%s.%N)
read_disk=$(echo "$t1 - $t0" | bc -l)
read_cache=$(echo "$t3 - $t2" | bc -l)
printf 'weights: %s bytes in %d files; read from disk %.2f s, from the page cache %.2f s\n' "$bytes" "${#shards[@]}" \
  "$read_disk" "$read_cache"

rss() { awk -F': ' '/Maximum resident set size/ {printf "%.2f", $2 / 1048576}' "$1"; }

cgrad_train() {
  /usr/bin/time -v "$CGRAD" train --init-from "$DIR" --data "$TEXT" --lora-rank 16 --lora-alpha 32 --lora-targets "$TARGETS" \
    --context 256 --batch 1 --steps $((STEPS + 2)) --warmup 0 --eval-every 0 --eval-batches 1 --threads 2 --samples 0 \
    --precision bf16 --checkpoint "$OUT/lora.ckpt" --save-every 0 --log-every 1 > "$OUT/cgrad.txt" 2> "$OUT/cgrad.time"
  # tokens/s of the timed steps, as PyTorch's are timed (bench/bigload_torch.py): 256 over the median
  # of steps 2..STEPS+1's own seconds, the differences of the metrics file's elapsed_s. Not the
  # progress line's tok/s: that averages the last 20 steps, so over a few steps it still holds the
  # warm-up step (first reads of the mapped weights, oneDNN's primitives made); the last step's row
  # comes after the final evaluation.
  local tps load
  tps=$(awk -F, -v last=$((STEPS + 1)) 'NR > 1 && $1 >= 2 && $1 <= last {print $6 - prev} NR > 1 {prev = $6}' \
    "$OUT/lora_metrics.csv" | sort -n | awk '{a[NR] = $1} END {printf "%.1f", 512 / (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1])}')
  load=$(sed -n 's/.*loaded .* in \([0-9.]*\) s/\1/p' "$OUT/cgrad.txt")
  row "cgrad LoRA train, bf16 base read in place" "$tps" "$load" "$(rss "$OUT/cgrad.time")"
}

torch_run() { # mode precision
  local env=()
  if [ "$2" = fp32 ] && [ -d /usr/lib/x86_64-linux-gnu/blis-openmp ]; then
    # PyTorch's fastest fp32 here: BLIS on the kernel set cgrad picks (bench/torch_bench.py)
    local id kern
    kern=$("$CGRAD" --version | sed -n 's/.*kernels \([a-z0-9]*\).*/\1/p' | head -1)
    id=$("$PY" -c "import sys; sys.path.insert(0, 'bench'); import torch_bench; print(torch_bench.blis_arch_id('${kern:-skx}') or '')")
    # BLIS threads its products by its own count (as bench/torch_bench.py sets it), not torch's
    env=(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/blis-openmp OMP_WAIT_POLICY=passive BLIS_NUM_THREADS=2)
    [ -n "$id" ] && env+=(BLIS_ARCH_TYPE="$id")
  fi
  env "${env[@]}" /usr/bin/time -v "$PY" bench/bigload_torch.py "$DIR" --mode "$1" --precision "$2" --steps "$STEPS" \
    --tokens "$GEN" --threads 2 > "$OUT/torch.txt" 2> "$OUT/torch.time"
  local name
  name="PyTorch LoRA $1, $([ "$2" = fp32 ] && echo fp32 || echo bf16 autocast)"
  [ "$1" = generate ] && name="PyTorch generate, KV cache, $([ "$2" = fp32 ] && echo fp32 || echo bf16 autocast)"
  row "$name" $("$PY" -c "import json; j = json.load(open('$OUT/torch.txt')); print('%.2f %.2f' % (j['tokens_per_s'], j['load_s']))") \
    "$(rss "$OUT/torch.time")"
}

cgrad_gen() {
  # one process, three greedy samples of GEN tokens with the KV cache, stdout line-buffered: the
  # "--- sample N ---" lines' arrival times give the load (to the first) and each sample's duration;
  # tokens/s is GEN over the median of samples 2 and 3 (the model warm)
  local times
  times=$(/usr/bin/time -v stdbuf -oL "$CGRAD" sample --checkpoint "$DIR" --precision bf16 --length "$GEN" --count 3 \
    --temperature 0 --threads 2 2> "$OUT/gen.time" | "$PY" -c '
import sys, time
t0, marks = time.time(), []
for line in sys.stdin:
    if line.startswith("--- sample "):
        marks.append(time.time())
marks.append(time.time())
d = sorted(marks[k + 1] - marks[k] for k in (1, 2))
print("%.2f %.2f" % (int(sys.argv[1]) / d[0], marks[0] - t0))' "$GEN")
  row "cgrad generate, KV cache, bf16 in place" ${times% *} ${times#* } "$(rss "$OUT/gen.time")"
}

# a table row, kept for the summary: name tokens/s load-s peak-GiB
row() {
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4"
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$OUT/rows.tsv"
}

echo "| run | tokens/s | load s | peak RSS GiB |"
echo "|---|---|---|---|"
for ((r = 0; r < ROUNDS; r++)); do
  cgrad_train
  for p in ${TORCH//,/ }; do torch_run train "$p"; done
  cgrad_gen
  for p in ${TORCH//,/ }; do torch_run generate "$p"; done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
# the targets, from the medians over rounds: step tokens/s against PyTorch's best, peak against
# PyTorch fp32's, load against the time to read the files
"$PY" - "$OUT/rows.tsv" "$read_cache" "$read_disk" <<'PYEOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, tps, load, rss = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((float(tps), float(load), float(rss)))
med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
c = med.get("cgrad LoRA train, bf16 base read in place")
torch = {k: v for k, v in med.items() if k.startswith("PyTorch LoRA train")}
if c and torch:
    best = max(torch.items(), key=lambda kv: kv[1][0])
    print("cgrad LoRA step: %.2fx PyTorch's best (%s, %.2f tokens/s); target >= 1.5x" % (c[0] / best[1][0], best[0], best[1][0]))
    fp32 = med.get("PyTorch LoRA train, fp32")
    if fp32:
        print("cgrad peak: %.2fx PyTorch fp32's (%.2f vs %.2f GiB); target <= 0.5x" % (c[2] / fp32[2], c[2], fp32[2]))
    print("cgrad load: %.2f s, %.2fx the time to read the files from the page cache, %.2fx from the disk; target <= 2x"
          % (c[1], c[1] / float(sys.argv[2]), c[1] / float(sys.argv[3])))
g = med.get("cgrad generate, KV cache, bf16 in place")
tg = {k: v for k, v in med.items() if k.startswith("PyTorch generate")}
if g and tg:
    best = max(tg.items(), key=lambda kv: kv[1][0])
    print("cgrad generation: %.2fx PyTorch's best (%s, %.2f tokens/s)" % (g[0] / best[1][0], best[0], best[1][0]))
PYEOF
