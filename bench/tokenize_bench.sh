#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Encoding speed of `cgrad tokenize` against the reference (@lenml/tokenizers, transformers.js's
# port, under node) on the same text with LLaMA-2's, LLaMA-3's and Qwen3's tokenizer.json
# (./setup.sh's data/). Each side reports its own load and encode times (cgrad tokenize --time;
# bench/tokenize_reference.js), so process start-up is left out. cgrad and the reference
# alternate run by run; medians and [min, max] are printed, with the load average. The two
# outputs are compared once per tokenizer (the ids must be identical).
#   bench/tokenize_bench.sh [RUNS (5)] [TEXT (Moby Dick's first 300 kB + the parity corpus)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
runs=${1:-5}
cgrad=${BUILD_DIR:-$repo/build}/cgrad
[ -x "$cgrad" ] || { echo "tokenize_bench: $cgrad missing (cmake --build build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 2 ]; then cp "$2" "$tmp/text"; else
  head -c 300000 "$repo/data/moby-dick.txt" > "$tmp/text"
  cat "$repo/tests/fixtures/tokenizer/hf_corpus.txt" >> "$tmp/text"
fi
# the reference, pinned as tests/make_hf_tokenizer_fixtures.js pins it
spec=@lenml/tokenizers@3.7.2 sum=4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438
(cd "$tmp" && npm pack "$spec" --loglevel=error >/dev/null)
got=$(sha256sum "$tmp"/*.tgz | cut -d' ' -f1)
[ "$got" = "$sum" ] || { echo "tokenize_bench: $spec has sha256 $got, expected $sum" >&2; exit 1; }
tar xzf "$tmp"/*.tgz -C "$tmp"
ref=$tmp/package

# field NAME < "load_s=.. encode_s=..": the value
field() { sed -n "s/.*$1=\([0-9.e-]*\).*/\1/p" | tail -1; }
stats() { sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%.3f [%.3f, %.3f]", m, v[1], v[NR]}'; }
median() { sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

bytes=$(wc -c < "$tmp/text")
echo "text: $bytes bytes; $runs runs each, cgrad and the reference alternating; seconds: median [min, max]"
printf '%-7s %7s | %-22s %-22s | %-22s %-22s | %s\n' tokenizer ids "cgrad load" "cgrad encode" "reference load" \
  "reference encode" "encode: reference/cgrad"
for name in llama2 llama3 qwen3; do
  dir=$repo/data/$name
  : > "$tmp/cl"; : > "$tmp/ce"; : > "$tmp/rl"; : > "$tmp/re"
  for ((r = 0; r < runs; r++)); do
    "$cgrad" tokenize --time --tokenizer "$dir" < "$tmp/text" > "$tmp/cg.json" 2> "$tmp/cg.err"
    field load_s < "$tmp/cg.err" >> "$tmp/cl"; field encode_s < "$tmp/cg.err" >> "$tmp/ce"
    node "$here/tokenize_reference.js" "$ref" "$dir" < "$tmp/text" > "$tmp/ref.json" 2> "$tmp/ref.err"
    field load_s < "$tmp/ref.err" >> "$tmp/rl"; field encode_s < "$tmp/ref.err" >> "$tmp/re"
    if [ "$r" = 0 ] && ! cmp -s "$tmp/cg.json" "$tmp/ref.json"; then
      echo "tokenize_bench: $name: cgrad's ids differ from the reference's" >&2; exit 1
    fi
  done
  ids=$(tr ',' '\n' < "$tmp/cg.json" | wc -l)
  ratio=$(awk -v a="$(median < "$tmp/re")" -v b="$(median < "$tmp/ce")" 'BEGIN {printf "%.1fx", a / b}')
  printf '%-7s %7s | %-22s %-22s | %-22s %-22s | %s\n' "$name" "$ids" "$(stats < "$tmp/cl")" "$(stats < "$tmp/ce")" \
    "$(stats < "$tmp/rl")" "$(stats < "$tmp/re")" "$ratio"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
