#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The image models through the cgrad command on Fashion-MNIST (Debian's dataset-fashion-mnist):
# `train --arch cnn|vit` names the model's own shape (stages and channels; layers, heads, width and
# patches) and counts images, with no context or tokenizer; `eval` reads the checkpoint back and
# reports the accuracy over the 10,000 test images, the same as the run's own last evaluation.
# Exits 77 (skipped) without the dataset.
# Usage: vision_cli.sh CGRAD
set -uo pipefail
bin=$1
[ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] || {
  echo "skipped: no /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist)"; exit 77; }
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
fail=0
check() { if eval "$1"; then echo "ok: $2"; else echo "FAIL: $2"; fail=1; fi; }
for arch in cnn vit; do
  "$bin" train --arch "$arch" --data fashion-mnist --steps 4 --warmup 1 --eval-every 4 --threads 1 \
    --out "$dir/$arch" > "$dir/$arch.txt" 2>&1 || { echo "FAIL: $arch: train"; cat "$dir/$arch.txt"; exit 1; }
  head1=$(head -1 "$dir/$arch.txt")
  if [ "$arch" = cnn ]; then
    check '[[ "$head1" == "cgrad train: cnn, 2 conv + pool stages from 32 channels, hidden 128, 28x28 images: "* ]]' \
          "cnn: the header names its stages and channels ($head1)"
  else
    check '[[ "$head1" == "cgrad train: vit, 4 layers, 4 heads, d 64, 28x28 images in 7x7 patches: "* ]]' \
          "vit: the header names its layers, heads, width and patches ($head1)"
  fi
  check 'grep -q "^  data fashion-mnist: 60000 training / 10000 held-out images$" "$dir/$arch.txt"' \
        "$arch: the data line counts images, with no tokenizer"
  check '! grep -q "context\|tokenizer" "$dir/$arch.txt"' "$arch: no context or tokenizer in what train prints"
  "$bin" eval --checkpoint "$dir/$arch/model.ckpt" --data fashion-mnist --threads 1 > "$dir/$arch.eval" 2>&1
  acc=$(sed -n 's/^accuracy \([0-9.]*\) over 10000 images$/\1/p' "$dir/$arch.eval")
  run_acc=$(grep -o 'accuracy [0-9.]* (10000 held-out)' "$dir/$arch.txt" | tail -1 | cut -d' ' -f2)
  check '[ -n "$acc" ] && [ "$acc" = "$run_acc" ]' "$arch: eval of the checkpoint gives the run's last accuracy ($acc, $run_acc)"
done
exit $fail
