#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Through the Hugging Face layout and back: pretrain a small BERT (masked LM + next sentence) on
# Amazon and IMDb review texts, export it as a transformers model directory, start a sentiment
# classifier from that directory (--init-from DIR --head classify: the encoder loads, a new head
# starts), fine-tune it on the same reviews' labels, and evaluate on Yelp reviews, a domain neither
# run saw. The same classifier trained from scratch for the same steps is the baseline.
#   pretrain   cgrad train --arch bert                     -> $OUT/bert.ckpt
#   export     cgrad export $OUT/bert.ckpt $OUT/bert-hf     (model.safetensors, config.json, vocab.txt)
#   fine-tune  cgrad train --init-from $OUT/bert-hf --head classify
#   eval       cgrad eval on data/sentiment/yelp.tsv; the fine-tune exported too (BertForSequenceClassification)
# Environment: CGRAD (binary, default build/cgrad), OUT (folder, runs/hf), PRE_STEPS (400),
# TUNE_STEPS (200). Data: data/sentiment/*.tsv and data/bert/vocab.txt (./setup.sh fetches them).
set -euo pipefail
CGRAD=${CGRAD:-build/cgrad}
OUT=${OUT:-runs/hf}
PRE_STEPS=${PRE_STEPS:-400}
TUNE_STEPS=${TUNE_STEPS:-200}
mkdir -p "$OUT"
cat data/sentiment/amazon.tsv data/sentiment/imdb.tsv > "$OUT/train.tsv"
cut -f2 "$OUT/train.tsv" > "$OUT/train.txt"
shape=(--layers 2 --heads 4 --dim 128 --context 64 --tokenizer-path data/bert/vocab.txt)
"$CGRAD" train --arch bert "${shape[@]}" --data "$OUT/train.txt" --steps "$PRE_STEPS" --eval-every "$PRE_STEPS" \
  --samples 0 --checkpoint "$OUT/bert.ckpt" | tail -1
"$CGRAD" export "$OUT/bert.ckpt" "$OUT/bert-hf"
tune=(--data "$OUT/train.tsv" --head classify --steps "$TUNE_STEPS" --eval-every "$TUNE_STEPS" --batch 32 --lr 3e-4
      --samples 0)
"$CGRAD" train --init-from "$OUT/bert-hf" "${tune[@]}" --checkpoint "$OUT/tuned.ckpt" > "$OUT/tuned.txt"
"$CGRAD" train --arch bert "${shape[@]}" "${tune[@]}" --checkpoint "$OUT/scratch.ckpt" > "$OUT/scratch.txt"
grep -E '^  (--head|not used)' "$OUT/tuned.txt"
"$CGRAD" export "$OUT/tuned.ckpt" "$OUT/tuned-hf" > /dev/null
for run in tuned scratch; do
  echo "$run: $(tail -1 "$OUT/$run.txt")"
  echo "  on Yelp (unseen): $("$CGRAD" eval --checkpoint "$OUT/$run.ckpt" --data data/sentiment/yelp.tsv | grep accuracy)"
done
echo "the exported fine-tune (transformers' BertForSequenceClassification) classifies as the checkpoint:"
"$CGRAD" classify --checkpoint "$OUT/tuned-hf" "The food was wonderful and the staff were kind." \
  "Cold fries, rude waiter, never again."
