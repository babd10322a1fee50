#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Hugging Face round trip through the cgrad command:
#  - train a GPT-2 (byte-level BPE), a BERT (WordPiece) and a LLaMA a few steps, `cgrad export` them; the
#    directories hold model.safetensors, config.json and the tokenizer under the hub's names;
#  - `info` reads the directory (and its .safetensors file) with the very parameters of the
#    checkpoint (crc32 digest), and `sample` and `eval` give the checkpoint's output;
#  - `train --init-from DIR` continues exactly as `--init-from CKPT` (parameters and AdamW moments
#    bit for bit), so the weights and the tokenizer came back unchanged;
#  - the hub's tokenizer names (vocab.json + merges.txt) tokenize as GPT-2's (encoder.json + vocab.bpe);
#  - LoRA on a Hugging Face base, and export merging it; its PEFT adapters read back (eval, merged
#    export) as the checkpoint; errors name the file and the tensor;
#  - with the argument torch (ctest hf_roundtrip_torch): also names, shapes and logits against the
#    torch reference models (tests/check_hf_export.py); exits 77 (skipped) when PYTHON has no torch.
# Usage: hf_roundtrip.sh CGRAD [PYTHON [torch]]
set -uo pipefail
bin=$1 py=${2:-/usr/bin/python3} mode=${3:-}
if [ "$mode" = torch ] && ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "skipped: no torch in $py, so the exports are not checked against the torch reference models"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_check.sh"
for i in $(seq 1 300); do echo "line $i: the whale $((i * 7 % 13)) swims past ship $((i * 3 % 11)) at dawn."; done > text.txt
{ printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n.\n:\n'; seq 0 300; printf 'line\nthe\nwhale\nswims\npast\nship\nat\ndawn\n'; } > vocab.txt
small=(--layers 2 --dim 32 --heads 2 --batch 4 --eval-every 3 --eval-batches 2 --samples 0 --threads 1 --decay-steps 8 --warmup 1)
digest() { "$bin" info "$1" 2>&1 | grep '^digest' | cut -d, -f1; }
moments() { "$bin" info "$1" 2>&1 | grep '^digest'; }

run "$bin" train "${small[@]}" --data text.txt --tokenizer bpe --vocab-size 300 --context 16 --steps 3 --checkpoint g.ckpt
run "$bin" export g.ckpt gdir
check '[ -f gdir/model.safetensors ] && [ -f gdir/config.json ] && [ -f gdir/vocab.json ] && [ -f gdir/merges.txt ] &&
       [ -f gdir/tokenizer_config.json ]' "gpt2 export: model.safetensors, config.json, vocab.json + merges.txt, tokenizer_config.json"
check 'grep -q "\"GPT2LMHeadModel\"" gdir/config.json && grep -q "\"model_type\":[[:space:]]*\"gpt2\"" gdir/config.json' \
      "config.json names GPT2LMHeadModel and model_type gpt2"
check '[ -n "$(digest g.ckpt)" ] && [ "$(digest g.ckpt)" = "$(digest gdir)" ] && [ "$(digest gdir/model.safetensors)" = "$(digest g.ckpt)" ]' \
      "info DIR and DIR/model.safetensors: the checkpoint's parameters ($(digest gdir))"
"$bin" sample --checkpoint g.ckpt --length 24 --temperature 0 --threads 1 > s1.txt 2>&1
"$bin" sample --checkpoint gdir --length 24 --temperature 0 --threads 1 > s2.txt 2>&1
check '[ -s s1.txt ] && cmp -s s1.txt s2.txt' "sample from the directory = sample from the checkpoint"
"$bin" eval --checkpoint g.ckpt --data text.txt --threads 1 > e1.txt 2>&1
"$bin" eval --checkpoint gdir --data text.txt --threads 1 > e2.txt 2>&1
check 'grep -q loss e1.txt && cmp -s e1.txt e2.txt' "eval of the directory = eval of the checkpoint ($(head -c 60 e2.txt))"

tune=(--data text.txt --steps 3 --lr 3e-4 --samples 0 --threads 1 --eval-every 3 --eval-batches 1 --decay-steps 8 --warmup 1)
run "$bin" train "${tune[@]}" --init-from g.ckpt --checkpoint from_ckpt.ckpt
run "$bin" train "${tune[@]}" --init-from gdir --checkpoint from_dir.ckpt
check '[ -n "$(moments from_dir.ckpt)" ] && [ "$(moments from_ckpt.ckpt)" = "$(moments from_dir.ckpt)" ]' \
      "--init-from DIR trains exactly as --init-from CKPT ($(moments from_dir.ckpt))"
run "$bin" train "${tune[@]}" --init-from gdir/model.safetensors --checkpoint from_file.ckpt
check '[ "$(moments from_file.ckpt)" = "$(moments from_dir.ckpt)" ]' "--init-from DIR/model.safetensors as well"

# the hub's tokenizer names against GPT-2's
mkdir gpt2names && cp gdir/vocab.json gpt2names/encoder.json && cp gdir/merges.txt gpt2names/vocab.bpe
for t in gdir gdir/vocab.json gdir/merges.txt gpt2names; do
  run "$bin" train "${small[@]}" --data text.txt --tokenizer-path "$t" --context 16 --steps 2 --checkpoint "tok_$(echo "$t" | tr / _).ckpt"
done
check '[ "$(moments tok_gdir.ckpt)" = "$(moments tok_gpt2names.ckpt)" ] && [ "$(moments tok_gdir.ckpt)" = "$(moments tok_gdir_vocab.json.ckpt)" ] &&
       [ "$(moments tok_gdir.ckpt)" = "$(moments tok_gdir_merges.txt.ckpt)" ]' \
      "vocab.json + merges.txt (a directory or either file) tokenize as encoder.json + vocab.bpe"

# BERT: WordPiece, tied decoder
run "$bin" train "${small[@]}" --arch bert --data text.txt --tokenizer-path vocab.txt --context 16 --steps 3 --checkpoint b.ckpt
run "$bin" export b.ckpt bdir
check '[ -f bdir/vocab.txt ] && cmp -s bdir/vocab.txt vocab.txt && grep -q "\"BertForPreTraining\"" bdir/config.json' \
      "bert export: vocab.txt as trained with, BertForPreTraining"
check '[ -n "$(digest b.ckpt)" ] && [ "$(digest b.ckpt)" = "$(digest bdir)" ]' "bert: info DIR has the checkpoint's parameters"
run "$bin" train "${tune[@]}" --init-from b.ckpt --checkpoint b_ckpt.ckpt
run "$bin" train "${tune[@]}" --init-from bdir --checkpoint b_dir.ckpt
check '[ -n "$(moments b_dir.ckpt)" ] && [ "$(moments b_ckpt.ckpt)" = "$(moments b_dir.ckpt)" ]' "bert: --init-from DIR = --init-from CKPT"

# LLaMA: transformers' names already (LlamaForCausalLM)
run "$bin" train "${small[@]}" --arch llama --data text.txt --context 16 --steps 3 --checkpoint l.ckpt
run "$bin" export l.ckpt ldir
run "$bin" train "${tune[@]}" --init-from l.ckpt --checkpoint l_ckpt.ckpt
run "$bin" train "${tune[@]}" --init-from ldir --checkpoint l_dir.ckpt
check 'grep -q "\"LlamaForCausalLM\"" ldir/config.json && [ "$(digest l.ckpt)" = "$(digest ldir)" ] &&
       [ -n "$(moments l_dir.ckpt)" ] && [ "$(moments l_ckpt.ckpt)" = "$(moments l_dir.ckpt)" ]' \
      "llama: LlamaForCausalLM, info DIR has the checkpoint's parameters, --init-from DIR = --init-from CKPT"

# BERT classification from the BertForPreTraining directory: the encoder loads, a new head starts
for i in $(seq 1 60); do echo -e "pos\tline $i: the whale swims at dawn."; echo -e "neg\tthe ship $i: past line."; done > cls.tsv
run "$bin" train "${tune[@]}" --init-from bdir --head classify --data cls.tsv --checkpoint bc.ckpt
check 'grep -q "initialised: classifier.weight, classifier.bias" run.out && grep -q "not used (the pretraining heads): cls.predictions.bias" run.out' \
      "--head classify: the head is initialised, the pretraining heads are listed as not used"
run "$bin" export bc.ckpt bcdir
check 'grep -q "\"BertForSequenceClassification\"" bcdir/config.json && grep -q "\"neg\"" bcdir/config.json &&
       [ "$(digest bc.ckpt)" = "$(digest bcdir)" ]' "a BERT classifier exports as BertForSequenceClassification with its labels"
"$bin" classify --checkpoint bc.ckpt "the whale" "the ship" > c1.txt 2>&1
"$bin" classify --checkpoint bcdir "the whale" "the ship" > c2.txt 2>&1
check '[ "$(wc -l < c1.txt)" = 2 ] && cmp -s c1.txt c2.txt' "classify reads the directory as the checkpoint ($(head -1 c2.txt))"
run "$bin" train "${tune[@]}" --init-from bdir --head classify --data cls.tsv --steps 1 --checkpoint bc_half.ckpt
run "$bin" train --resume bc_half.ckpt --steps 3
check '[ "$(moments bc_half.ckpt)" = "$(moments bc.ckpt)" ]' "a --head classify run resumes exactly"

# LoRA on a Hugging Face base: its checkpoint reads the base from the directory; export merges it
run "$bin" train "${tune[@]}" --init-from gdir --lora-rank 2 --checkpoint lora.ckpt
run "$bin" sample --checkpoint lora.ckpt --length 8 --temperature 0 --threads 1
run "$bin" export lora.ckpt loradir
check 'grep -q "LoRA merged" run.out && [ "$(digest loradir)" != "$(digest gdir)" ] && [ -n "$(digest loradir)" ]' \
      "a LoRA fine-tune of a directory samples, and exports with its adapters merged"
# its adapters in PEFT's layout, read back on their base: the same model (eval), the same merged export
run "$bin" export lora.ckpt peftdir --peft
"$bin" eval --checkpoint lora.ckpt --data text.txt --threads 1 > e1.txt 2>&1
"$bin" eval --checkpoint peftdir --data text.txt --threads 1 > e2.txt 2>&1
run "$bin" export peftdir peftmerged
check 'grep -q "^loss" e1.txt && diff <(grep "^loss" e1.txt) <(grep "^loss" e2.txt) > /dev/null &&
       [ "$(digest peftmerged)" = "$(digest loradir)" ]' \
      "PEFT adapters (adapter_model.safetensors + adapter_config.json) evaluate and merge as their checkpoint ($(grep '^loss' e2.txt))"
"$bin" train "${tune[@]}" --init-from peftdir --lora-rank 2 --checkpoint x.ckpt > err.txt 2>&1
check 'grep -q "holds PEFT adapters" err.txt' "new adapters on PEFT ones are refused: $(tail -1 err.txt)"

# the LLaMA directory keeps its grouped-query heads and samples as its checkpoint does
check 'grep -q "\"num_key_value_heads\":[[:space:]]*1" ldir/config.json' "llama export: its key/value heads in config.json"
"$bin" sample --checkpoint l.ckpt --length 24 --temperature 0 --threads 1 > s1.txt 2>&1
"$bin" sample --checkpoint ldir --length 24 --temperature 0 --threads 1 > s2.txt 2>&1
check '[ -s s1.txt ] && cmp -s s1.txt s2.txt' "llama: sample from the directory = sample from the checkpoint"

# errors name the file and the tensor
mv gdir gdir.away
"$bin" sample --checkpoint lora.ckpt --length 8 > err.txt 2>&1
mv gdir.away gdir
check 'grep -q "cannot open its base $dir/gdir: \[checkpoint\] $dir/gdir: cannot open: No such file" err.txt' \
      "a LoRA checkpoint whose base is gone names the base and why ($(tail -1 err.txt))"
mkdir bare && cp gdir/model.safetensors bare/w.safetensors
"$bin" info bare/w.safetensors > err.txt 2>&1
check 'grep -q "bare/w.safetensors" err.txt && grep -q "config.json" err.txt' "no config.json: says where it goes ($(tail -1 err.txt))"
mkdir wrong && cp gdir/* wrong/ && sed -i 's/"n_embd":[[:space:]]*32/"n_embd": 48/' wrong/config.json
"$bin" train "${tune[@]}" --init-from wrong > err.txt 2>&1
check 'grep -q "wrong/model.safetensors" err.txt && grep -q "tensor '"'"'transformer.h.0.attn.c_attn.bias'"'"' has shape \[96\], but parameter '"'"'h.0.attn.c_attn.bias'"'"' is \[144\]" err.txt' \
      "a shape mismatch names the file, the tensor and both shapes ($(tail -1 err.txt))"
"$bin" sample --checkpoint "$dir" > err.txt 2>&1
check 'grep -q "no model.safetensors" err.txt' "a directory without model.safetensors says so ($(tail -1 err.txt))"

if [ "$mode" = torch ]; then
  "$py" "$here/check_hf_export.py" "$bin" gdir bdir bcdir ldir || fail=1
fi
exit $fail
