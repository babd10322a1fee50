#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every LLaMA-style family through the cgrad command, from a Hugging Face directory (config.json +
# model.safetensors of the committed fixtures, a char tokenizer of the fixtures' 71 ids):
#  - `info` loads it (strictly: every tensor a parameter of the family, every parameter stored);
#  - `export DIR OUT` writes it back in its family's layout: model_type, architectures and the
#    family's fields in config.json, the very same parameters (crc32 digest);
#  - `train --init-from DIR --context 8` fine-tunes at a context shorter than max_position_embeddings
#    (32), and a --context past it is refused naming the field;
#  - `sample` generates from the fine-tune through the KV cache, the same tokens as without it;
#  - the fine-tune exports in the family's layout again, and that directory loads.
#  - with torch at hand, each exported directory read by the torch reference gives cgrad's logits.
# Usage: families_cli.sh CGRAD [PYTHON]
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_check.sh"
digest() { "$bin" info "$1" 2>&1 | grep '^digest' | cut -d, -f1; }
flat() { tr -d ' \t\n' < "$1"; }  # a JSON file without white space

# text in the tokenizer's code points, ' ' (32) .. 'f' (102)
for i in $(seq 1 200); do echo "LINE $i: THE WHALE $((i * 7 % 13)) SWIMS PAST SHIP $((i * 3 % 11)) AT DAWN; a fed cab."; done > text.txt
printf '{"kind": "char", "codepoints": [%s]}\n' "$(seq -s, 32 102)" > tokenizer.json

tune=(--data text.txt --steps 2 --batch 2 --lr 1e-3 --samples 0 --threads 1 --eval-every 2 --eval-batches 1
      --decay-steps 4 --warmup 1)
for fam in mistral:MistralForCausalLM qwen2:Qwen2ForCausalLM qwen3:Qwen3ForCausalLM llama_ext:LlamaForCausalLM \
           mixtral:MixtralForCausalLM; do
  name=${fam%%:*} class=${fam##*:}
  mt=$(flat "$here/fixtures/models/$name/config.json" | grep -o '"model_type":"[a-z0-9]*"')
  mkdir "$name"
  cp "$here/fixtures/models/$name/config.json" "$name/config.json"
  cp "$here/fixtures/models/$name/weights.safetensors" "$name/model.safetensors"
  cp tokenizer.json "$name/cg_tokenizer.json"

  "$bin" info "$name" > info.out 2>&1
  check 'grep -q "^arch        llama" info.out && grep -q "$class" info.out' "$name: info loads the directory ($class)"
  run "$bin" export "$name" "out_$name"
  check 'grep -q "\"$class\"" "out_$name/config.json" && flat "out_$name/config.json" | grep -q "$mt" &&
         [ -n "$(digest "$name")" ] && [ "$(digest "$name")" = "$(digest "out_$name")" ]' \
        "$name: export DIR writes $mt, $class and the same parameters ($(digest "$name"))"
  for field in sliding_window use_sliding_window attention_bias mlp_bias head_dim tie_word_embeddings rope_scaling layer_types \
               num_local_experts num_experts_per_tok router_aux_loss_coef output_router_logits; do
    want=$(flat "$here/fixtures/models/$name/config.json" | grep -o "\"$field\":\(\[[^]]*\]\|[^,}]*\)" | head -1)
    got=$(flat "out_$name/config.json" | grep -o "\"$field\":\(\[[^]]*\]\|[^,}]*\)" | head -1)
    [ -z "$want" ] && continue
    check '[ "${want/.0/}" = "$got" ] || [ "$want" = "$got" ]' "$name: export keeps $want (wrote $got)"
  done

  run "$bin" train "${tune[@]}" --init-from "$name" --context 8 --checkpoint "$name.ckpt"
  check 'grep -q "cgrad train: $(echo "$mt" | cut -d\" -f4), .*context 8" run.out' \
        "$name: --init-from DIR --context 8 trains on rows of 8 ($(grep '^cgrad train:' run.out | cut -d: -f2))"
  "$bin" train "${tune[@]}" --init-from "$name" --context 64 --checkpoint "bad_$name.ckpt" > bad.out 2>&1
  rc=$?
  check '[ $rc -ne 0 ] && grep -q "max_position_embeddings" bad.out && [ ! -f "bad_$name.ckpt" ]' \
        "$name: --context 64 past max_position_embeddings 32 is refused: $(head -c 120 bad.out)"
  "$bin" sample --checkpoint "$name.ckpt" --prompt "THE WHALE" --length 30 --temperature 0 --threads 1 > s1.txt 2>&1
  "$bin" sample --checkpoint "$name.ckpt" --prompt "THE WHALE" --length 30 --temperature 0 --threads 1 --no-cache > s2.txt 2>&1
  check '[ -s s1.txt ] && cmp -s s1.txt s2.txt' "$name: sample with the KV cache = without it ($(head -c 50 s1.txt | tr '\n' ' '))"
  run "$bin" export "$name.ckpt" "ft_$name"
  "$bin" info "ft_$name" > info2.out 2>&1
  check 'grep -q "\"$class\"" "ft_$name/config.json" && grep -q "^arch        llama" info2.out &&
         [ "$(digest "$name.ckpt")" = "$(digest "ft_$name")" ]' "$name: the fine-tune exports as $class and loads back"
done

# LoRA on a family with biases (Qwen2): the adapters train on the projections, export merges them
run "$bin" train "${tune[@]}" --init-from qwen2 --context 8 --lora-rank 2 --checkpoint lora.ckpt
check 'grep -q "LoRA: 21 adapters" run.out' "qwen2 LoRA: $(grep -o 'LoRA: [0-9]* adapters[^:]*' run.out)"
run "$bin" export lora.ckpt lora_hf
"$bin" info lora_hf > info3.out 2>&1
check 'grep -q "Qwen2ForCausalLM" lora_hf/config.json && grep -q "^arch        llama" info3.out && grep -q "LoRA merged" run.out' \
      "qwen2 LoRA fine-tune exports merged as Qwen2ForCausalLM and loads back"

# with torch at hand: the exported directories read by the torch references (built from config.json
# alone, as from_pretrained would) have the files' tensors and give cgrad's logits
py=${2:-/usr/bin/python3}
if "$py" -c "import torch, numpy" 2>/dev/null; then
  "$py" "$here/check_hf_export.py" "$bin" out_mistral out_qwen2 out_qwen3 out_llama_ext out_mixtral ft_mixtral ft_qwen3 lora_hf || fail=1
else
  echo "skip: no torch in $py, the exported directories were not read by the torch references"
fi

# a mixture-of-experts directory of another family than Mixtral is refused by name
mkdir moe && cp mistral/model.safetensors mistral/cg_tokenizer.json moe/
sed 's/"model_type": "mistral"/"model_type": "qwen2_moe"/' mistral/config.json > moe/config.json
"$bin" info moe > moe.out 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "mixture-of-experts" moe.out' "qwen2_moe is refused: $(head -c 150 moe.out)"
exit $fail
