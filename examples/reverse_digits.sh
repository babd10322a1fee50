#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An encoder-decoder learns to reverse digit strings. Training pairs and held-out pairs come from
# two awk streams with different seeds (held-out sources that also occur in training are dropped),
# 4 to 12 digits each. Measured: greedy exact match over all held-out pairs, once by the training
# run (--eval-exact) and once by `cgrad eval` on the held-out file. Target: >= 95%.
#
#   examples/reverse_digits.sh [more cgrad train flags]
# Environment: CGRAD (default build/cgrad), OUT (default runs/reverse_digits).
set -euo pipefail
CGRAD=${CGRAD:-build/cgrad}
OUT=${OUT:-runs/reverse_digits}
mkdir -p "$OUT"
gen() { # gen SEED COUNT: "digits<TAB>reversed" lines
  awk -v seed="$1" -v n="$2" 'BEGIN { srand(seed)
    for (i = 0; i < n; i++) {
      len = 4 + int(rand() * 9); s = ""; r = ""
      for (j = 0; j < len; j++) s = s int(rand() * 10)
      for (j = len; j > 0; j--) r = r substr(s, j, 1)
      print s "\t" r
    } }'
}
gen 1 20000 > "$OUT/train.tsv"
gen 2 1100 | awk -F'\t' 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' "$OUT/train.tsv" - | head -n 1000 > "$OUT/heldout.tsv"
echo "$(wc -l < "$OUT/train.tsv") training pairs, $(wc -l < "$OUT/heldout.tsv") held-out pairs"
"$CGRAD" train --arch encdec --data "$OUT/train.tsv" --val-data "$OUT/heldout.tsv" --tokenizer char \
  --layers 2 --heads 4 --dim 128 --context 16 --batch 64 --steps 600 \
  --lr 1e-3 --min-lr 1e-4 --warmup 100 --eval-every 100 --eval-exact 1000 --threads 2 \
  --checkpoint "$OUT/model.ckpt" "$@" | tee "$OUT/train.log"
"$CGRAD" eval --checkpoint "$OUT/model.ckpt" --data "$OUT/heldout.tsv"
echo 31415926 | "$CGRAD" translate --checkpoint "$OUT/model.ckpt"
