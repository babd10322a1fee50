#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# LoRA fine-tuning of a small character-level GPT: pretrain on Moby Dick, then adapt it to Yelp
# reviews three ways for the same number of steps, and compare held-out loss on the reviews and
# the size of what each run saves:
#   base     the pretrained model, not fine-tuned (eval only)
#   full     every weight trained (--init-from)
#   lora     rank-8 adapters on attention and MLP, everything else frozen (--lora-rank 8)
# Environment: CGRAD (binary, default build/cgrad), OUT (folder, runs/lora), BASE_STEPS (600),
# TUNE_STEPS (300). Data: data/moby-dick.txt and data/sentiment/yelp.tsv (./setup.sh fetches both).
set -euo pipefail
CGRAD=${CGRAD:-build/cgrad}
OUT=${OUT:-runs/lora}
BASE_STEPS=${BASE_STEPS:-600}
TUNE_STEPS=${TUNE_STEPS:-300}
mkdir -p "$OUT"
cut -f2 data/sentiment/yelp.tsv > "$OUT/yelp.txt"
common=(--layers 4 --heads 4 --dim 128 --context 64 --batch 16 --samples 0)
"$CGRAD" train "${common[@]}" --data data/moby-dick.txt --steps "$BASE_STEPS" --checkpoint "$OUT/base.ckpt" \
  --eval-every "$BASE_STEPS" | tail -1
"$CGRAD" train --init-from "$OUT/base.ckpt" --data "$OUT/yelp.txt" --steps "$TUNE_STEPS" --lr 1e-3 --samples 0 \
  --eval-every "$TUNE_STEPS" --checkpoint "$OUT/full.ckpt" > "$OUT/full.txt"
"$CGRAD" train --init-from "$OUT/base.ckpt" --data "$OUT/yelp.txt" --steps "$TUNE_STEPS" --lr 3e-3 --samples 0 \
  --lora-rank 8 --eval-every "$TUNE_STEPS" --checkpoint "$OUT/lora.ckpt" > "$OUT/lora.txt"
# step 0's held-out loss is the base model's on the same held-out reviews
echo "base (Moby Dick only): $(grep -m1 'eval step 0:' "$OUT/full.txt")"
echo "full fine-tune: $(tail -1 "$OUT/full.txt"), checkpoint $(stat -c %s "$OUT/full.ckpt") bytes"
echo "LoRA rank 8:    $(tail -1 "$OUT/lora.txt"), checkpoint $(stat -c %s "$OUT/lora.ckpt") bytes"
grep -h 'LoRA:' "$OUT/lora.txt"
echo "sample (LoRA):"
"$CGRAD" sample --checkpoint "$OUT/lora.ckpt" --prompt "The food" --length 200 --seed 1
