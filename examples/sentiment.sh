#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sentence sentiment (IMDb, Amazon and Yelp sentences, 0 = negative, 1 = positive) with the
# classification transformer and WordPiece tokens. Every 10th line of data/sentiment/all.tsv is
# held out, so all three sources are in both splits (the file is sorted by source: its last 10%
# would be Yelp only). Measured: held-out accuracy against the majority class of the held-out set.
#
#   examples/sentiment.sh [more cgrad train flags]
# Environment: CGRAD (default build/cgrad), OUT (default runs/sentiment).
set -euo pipefail
CGRAD=${CGRAD:-build/cgrad}
OUT=${OUT:-runs/sentiment}
mkdir -p "$OUT"
awk 'NR % 10 != 0' data/sentiment/all.tsv > "$OUT/train.tsv"
awk 'NR % 10 == 0' data/sentiment/all.tsv > "$OUT/heldout.tsv"
"$CGRAD" train --arch classifier --data "$OUT/train.tsv" --val-data "$OUT/heldout.tsv" --tokenizer wordpiece \
  --layers 2 --heads 4 --dim 64 --context 64 --batch 32 --steps 400 --lr 5e-4 --warmup 50 --dropout 0.1 \
  --eval-every 50 --threads 2 --checkpoint "$OUT/model.ckpt" "$@" | tee "$OUT/train.log"
"$CGRAD" eval --checkpoint "$OUT/model.ckpt" --data "$OUT/heldout.tsv"
"$CGRAD" classify --checkpoint "$OUT/model.ckpt" "the best meal I have had in years" "a dull, lifeless film"
