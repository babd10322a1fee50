#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# BERT pre-training (masked LM + next-sentence prediction) on Moby Dick with bert-base-uncased's
# WordPiece vocabulary: a small model, a few hundred steps. The held-out masked-LM loss starts at
# about ln(30522) = 10.3 and should fall well below it; the run ends with fill-mask examples on
# held-out sentences.
#
#   examples/bert_mlm.sh [--data FILE] [more cgrad train flags]     (default data from ./setup.sh)
# Environment: CGRAD (default build/cgrad), OUT (default runs/bert_mlm).
set -euo pipefail
CGRAD=${CGRAD:-build/cgrad}
OUT=${OUT:-runs/bert_mlm}
mkdir -p "$OUT"
"$CGRAD" train --arch bert --data data/moby-dick.txt --tokenizer wordpiece --tokenizer-path data/bert/vocab.txt \
  --layers 2 --heads 4 --dim 128 --context 64 --batch 16 --steps 300 \
  --lr 1e-3 --min-lr 1e-4 --warmup 40 --weight-decay 0.01 --eval-every 50 --eval-batches 20 --threads 2 \
  --checkpoint "$OUT/model.ckpt" "$@" | tee "$OUT/train.log"
"$CGRAD" fill-mask --checkpoint "$OUT/model.ckpt" "call me [MASK] ."
