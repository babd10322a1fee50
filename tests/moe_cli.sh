#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A Mixtral through the cgrad command:
#  - a checkpoint written before the experts' storage changed (fixtures/models/mixtral_ckpt/per_expert.ckpt,
#    per-expert parameter names, AdamW moments) loads with its parameters and moments intact, exports
#    MixtralForCausalLM's per-expert names, and resumes;
#  - --moe-capacity reaches the model: the header says it, the checkpoint's config keeps it, export
#    writes it as config.json's capacity_factor (only when not 0) and a directory with it loads with it;
#    a capacity that drops tokens trains to another loss than dropless;
#  - LoRA adapters on every expert train and export merged into the per-expert names;
#  - a negative, NaN, infinite or non-number --moe-capacity is refused naming the flag, as is a
#    capacity for a model without experts.
# Usage: moe_cli.sh CGRAD
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_check.sh"
flat() { tr -d ' \t\n' < "$1"; }
digest() { "$bin" info "$1" 2>&1 | grep '^digest'; }
# the names in a safetensors file's header
names() { /usr/bin/env python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; print("\n".join(sorted(json.loads(f.read(n)))))' "$1" 2>/dev/null ||
          head -c 4096 "$1" | tr -c 'A-Za-z0-9_.' '\n' | grep '\.weight$' | sort -u; }

# the text the fixture checkpoint trained on (resuming checks its crc32), in the tokenizer's code points
for i in $(seq 1 100); do echo "LINE $i: THE WHALE $((i * 7 % 13)) SWIMS PAST SHIP $((i * 3 % 11)) AT DAWN; a fed cab."; done > text.txt
tune=(--data text.txt --batch 2 --samples 0 --threads 1 --eval-batches 1 --decay-steps 4 --warmup 1)

# 1. the checkpoint of per-expert parameters, as cgrad wrote them before
old="$here/fixtures/models/mixtral_ckpt/per_expert.ckpt"
check '[ "$(digest "$old")" = "digest      parameters crc32 06540c2b, optimizer moments crc32 5107789c" ]' \
      "the old checkpoint loads: $(digest "$old")"
run "$bin" export "$old" ex_old
names ex_old/model.safetensors > names.txt
check 'grep -qx "model.layers.0.block_sparse_moe.experts.2.w3.weight" names.txt &&
       grep -qx "model.layers.0.block_sparse_moe.experts.0.w1.weight" names.txt &&
       grep -qx "model.layers.0.block_sparse_moe.gate.weight" names.txt && [ "$(grep -c experts names.txt)" = 9 ]' \
      "export writes MixtralForCausalLM's per-expert names ($(grep -c experts names.txt) expert tensors)"
check 'grep -q MixtralForCausalLM ex_old/config.json && ! grep -q capacity_factor ex_old/config.json &&
       [ "$(digest ex_old | cut -d, -f1)" = "digest      parameters crc32 06540c2b" ]' \
      "the export is the same parameters, config.json without capacity_factor (dropless)"
cp "$old" resumed.ckpt
run "$bin" train --resume resumed.ckpt "${tune[@]}" --steps 5 --eval-every 5
check 'grep -q "capacity_factor 0 (dropless)" run.out && grep -q "^final step=5 train_loss=[0-9]" run.out' \
      "the old checkpoint resumes to step 5: $(grep '^final' run.out)"

# 2. --moe-capacity on the committed Mixtral fixture (4 experts, top-2, width 32)
mkdir mixtral
cp "$here/fixtures/models/mixtral/config.json" mixtral/config.json
cp "$here/fixtures/models/mixtral/weights.safetensors" mixtral/model.safetensors
printf '{"kind": "char", "codepoints": [%s]}\n' "$(seq -s, 32 102)" > mixtral/cg_tokenizer.json
run "$bin" train "${tune[@]}" --init-from mixtral --context 8 --steps 2 --eval-every 2 --checkpoint dropless.ckpt
check 'grep -q "experts: 4 a layer, top-2, capacity_factor 0 (dropless)" run.out' "without the flag: dropless"
loss0=$(grep '^final' run.out | grep -o 'train_loss=[0-9.]*')
run "$bin" train "${tune[@]}" --init-from mixtral --context 8 --steps 2 --eval-every 2 --checkpoint cap.ckpt --moe-capacity 0.5
check 'grep -q "experts: 4 a layer, top-2, capacity_factor 0.5," run.out' "--moe-capacity 0.5 reaches the model"
loss1=$(grep '^final' run.out | grep -o 'train_loss=[0-9.]*')
check '[ -n "$loss0" ] && [ -n "$loss1" ] && [ "$loss0" != "$loss1" ]' \
      "capacity 0.5 drops tokens: another loss than dropless ($loss1 against $loss0)"
check '"$bin" info cap.ckpt | grep "^config" | grep -q "\"capacity_factor\": 0.5" &&
       ! "$bin" info dropless.ckpt | grep "^config" | grep -q capacity_factor' \
      "the checkpoint's config keeps capacity_factor 0.5 (and a dropless one has none)"
run "$bin" export cap.ckpt ex_cap
check 'flat ex_cap/config.json | grep -q "\"capacity_factor\":0.5" && grep -q MixtralForCausalLM ex_cap/config.json' \
      "export writes capacity_factor 0.5 in config.json"
cp mixtral/cg_tokenizer.json ex_cap/ 2>/dev/null
run "$bin" train "${tune[@]}" --init-from ex_cap --context 8 --steps 1 --eval-every 1 --checkpoint again.ckpt
check 'grep -q "capacity_factor 0.5," run.out' "a directory whose config.json has capacity_factor 0.5 trains with it"
cp cap.ckpt cap2.ckpt
run "$bin" train --resume cap2.ckpt "${tune[@]}" --steps 3 --eval-every 3
check 'grep -q "capacity_factor 0.5," run.out' "a resumed run keeps the checkpoint's capacity"
run "$bin" train --resume cap2.ckpt "${tune[@]}" --steps 4 --eval-every 4 --moe-capacity 0
check 'grep -q "capacity_factor 0 (dropless)" run.out && ! "$bin" info cap2.ckpt | grep "^config" | grep -q capacity_factor' \
      "--moe-capacity 0 on --resume makes it dropless"

# LoRA adapters on every expert (the dropless layer runs them by segments) train, and export merges them
# into MixtralForCausalLM's per-expert names
run "$bin" train "${tune[@]}" --init-from mixtral --context 8 --steps 2 --eval-every 2 --checkpoint lora.ckpt \
    --lora-rank 2 --lora-targets experts
check 'grep -q "LoRA: 24 adapters of rank 2" run.out && grep -q "^final step=2 train_loss=[0-9]" run.out' \
      "LoRA on the experts: $(grep -o 'LoRA: [0-9]* adapters[^:]*' run.out)"
run "$bin" export lora.ckpt ex_lora
names ex_lora/model.safetensors > names.txt
check 'grep -q "LoRA merged" run.out && [ "$(grep -c "block_sparse_moe.experts.[0-3].w[123].weight" names.txt)" = 24 ] &&
       ! grep -q lora names.txt' "export merges the experts' adapters into the 24 per-expert tensors"

# 3. bad values, named
for v in -1 nan inf abc ""; do
  "$bin" train "${tune[@]}" --init-from mixtral --context 8 --steps 1 --checkpoint bad.ckpt --moe-capacity "$v" > bad.out 2>&1
  rc=$?
  check '[ $rc = 2 ] && grep -q -- "--moe-capacity" bad.out && [ ! -f bad.ckpt ]' "--moe-capacity '$v' is refused: $(head -c 110 bad.out)"
done
"$bin" train "${tune[@]}" --arch llama --layers 1 --dim 16 --heads 2 --steps 1 --checkpoint bad.ckpt --moe-capacity 1 > bad.out 2>&1
rc=$?
check '[ $rc = 2 ] && grep -q -- "--moe-capacity 1: the model has no mixture-of-experts layers" bad.out && [ ! -f bad.ckpt ]' \
      "--moe-capacity on a dense LLaMA is refused: $(head -c 110 bad.out)"
exit $fail
