#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `cgrad export` against transformers' reference models without torch: the committed fixtures of
# tests/make_export_fixtures.py hold, for a GPT-2, a BERT, a BERT classifier and a LLaMA checkpoint,
# the reference model's tensors under the file's names (torch's names and shapes) and its logits on a
# batch. For each, the export of the checkpoint must have exactly those tensors, shape for shape and
# value for value, name its transformers class, and `cgrad step` on the exported files must give the
# reference's logits (largest difference relative to the largest logit under 1e-4).
# Usage: hf_export_fixtures.sh CGRAD CKPT_MAX_DIFF
set -uo pipefail
bin=$1 diff=$2
fix=$(cd "$(dirname "$0")" && pwd)/fixtures/export
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
fail=0
check() { if eval "$1"; then echo "ok: $2"; else echo "FAIL: $2"; fail=1; fi; }
rel() { sed -n 's/^max relative difference \([^ ]*\) in .*/\1/p' "$1"; }
for m in gpt2:GPT2LMHeadModel:gpt2 bert:BertForPreTraining:bert bertcls:BertForSequenceClassification:bert \
         llama:LlamaForCausalLM:llama; do
  name=${m%%:*} rest=${m#*:} class=${rest%%:*} arch=${rest#*:}
  out=$dir/$name
  if ! "$bin" export "$fix/$name.ckpt" "$out" > "$dir/export.txt" 2>&1; then
    echo "FAIL: $name: cgrad export: $(cat "$dir/export.txt")"; fail=1; continue
  fi
  check 'grep -q "\"$class\"" "$out/config.json"' "$name: config.json names $class"
  "$diff" "$fix/$name.names.safetensors" "$out/model.safetensors" > "$dir/a.txt" 2>&1
  a=$?
  "$diff" "$out/model.safetensors" "$fix/$name.names.safetensors" > "$dir/b.txt" 2>&1
  b=$?
  check '[ $a = 0 ] && [ $b = 0 ]' "$name: the file's tensors are the reference model's, name for name and shape for shape ($(cat "$dir/a.txt" "$dir/b.txt" | tr '\n' ' '))"
  check '[ "$(rel "$dir/a.txt")" = 0 ]' "$name: and value for value ($(cat "$dir/a.txt"))"
  if "$bin" step --arch "$arch" --config "$out/config.json" --weights "$out/model.safetensors" \
       --batch "$fix/$name.batch.safetensors" --out "$dir/out.safetensors" --threads 1 > "$dir/step.txt" 2>&1; then
    "$diff" "$fix/$name.out.safetensors" "$dir/out.safetensors" > "$dir/c.txt" 2>&1
    c=$?
    check '[ $c = 0 ] && awk -v r="$(rel "$dir/c.txt")" "BEGIN { exit !(r != \"\" && r < 1e-4) }"' \
          "$name: cgrad step on the export gives the reference model's logits ($(cat "$dir/c.txt"))"
  else
    echo "FAIL: $name: cgrad step on the export: $(cat "$dir/step.txt")"; fail=1
  fi
done
exit $fail
