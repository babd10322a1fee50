#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `cgrad tokenize` end to end: ids as the reference's fixtures have them (a tokenizer.json given
# as a file and as its directory, GPT-2's vocab pair, a checkpoint and its export), --no-special,
# --lines, --decode back to the text, and an unsupported component refused by name. Needs ./setup.sh's data/ (else SKIP, 77).
#   tests/tokenize_cli.sh CGRAD
set -uo pipefail
cgrad=${1:?usage: tokenize_cli.sh CGRAD}
here=$(cd "$(dirname "$0")" && pwd)
data=$here/../data
fix=$here/fixtures/tokenizer
[ -f "$data/llama2/tokenizer.json" ] && [ -f "$data/gpt2/vocab.bpe" ] || { echo "SKIP: run ./setup.sh for data/"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check WHAT GOT WANT
  if [ "$2" == "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: got '${2:0:200}', want '${3:0:200}'"; fail=1; fi
}
line1=$(head -1 "$fix/hf_corpus.txt")
want=$(sed -n 2p "$fix/hf_llama2.ids" | cut -f2)
check "llama2 directory" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$data/llama2")" "$want"
check "llama2 tokenizer.json" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$data/llama2/tokenizer.json")" "$want"
check "--no-special drops <s>" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$data/llama2" --no-special)" \
  "[${want#\[1,}"
want3=$(sed -n 2,4p "$fix/hf_llama3.ids" | cut -f2)
check "llama3 --lines" "$(head -3 "$fix/hf_corpus.txt" | "$cgrad" tokenize --tokenizer "$data/llama3" --lines)" "$want3"
for name in llama2 llama3 qwen3; do
  printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$data/$name" --no-special > "$tmp/ids"
  check "$name --decode" "$("$cgrad" tokenize --tokenizer "$data/$name" --decode < "$tmp/ids")" "$line1"
done
gpt2=$(grep -v '^#' "$fix/gpt2_sample.ids" | tr '\n' ' ' | sed 's/ *$//; s/ /,/g')
check "gpt2 pair" "$("$cgrad" tokenize --tokenizer "$data/gpt2" < "$fix/sample.txt")" "[$gpt2]"
# a checkpoint holds its tokenizer: a one-step run with LLaMA-2's tokenizer.json
head -c 4000 "$data/../data/moby-dick.txt" > "$tmp/text.txt"
if "$cgrad" train --arch llama --tokenizer-path "$data/llama2" --data "$tmp/text.txt" --layers 1 --dim 16 --ffn 32 \
     --context 8 --batch 1 --steps 1 --warmup 0 --eval-every 1 --eval-batches 1 --save-every 0 --samples 0 \
     --checkpoint "$tmp/run.ckpt" > "$tmp/train.log" 2>&1; then
  check "checkpoint" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$tmp/run.ckpt")" "$want"
  # exported as a Hugging Face directory: the directory and its .safetensors file
  "$cgrad" export "$tmp/run.ckpt" "$tmp/hf" > /dev/null 2>&1
  check "exported directory" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$tmp/hf")" "$want"
  check "exported .safetensors" "$(printf '%s' "$line1" | "$cgrad" tokenize --tokenizer "$tmp/hf/model.safetensors")" "$want"
else
  echo "FAIL: cgrad train for the checkpoint case: $(tail -2 "$tmp/train.log")"; fail=1
fi
printf '{"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}' > "$tmp/tokenizer.json"
echo a | "$cgrad" tokenize --tokenizer "$tmp" > /dev/null 2> "$tmp/err"
rc=$?
check "unsupported normalizer refused (exit 1)" "$rc" 1
check "the message names it" "$(grep -c '"Precompiled" is not supported' "$tmp/err")" 1
exit $fail
