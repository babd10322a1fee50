#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mutation check: does the suite catch small, plausible kernel bugs? Copies the tree to a scratch
# directory, builds it once, then for each mutation below edits one line (a sed expression), rebuilds,
# runs ctest and records which tests failed; the original line is restored before the next one.
# A mutation is CAUGHT when at least two tests fail, one of them not test_models (the PyTorch parity
# test, whose bounds are the loosest); WEAK when fewer do; SURVIVED when none does. A sed that matches
# nothing is reported NOT APPLIED (the kernel moved: update the expression). Not part of ctest: it
# rebuilds and runs the whole suite once per mutation (about 5 minutes each on 2 busy cores).
#
#   tests/mutate.sh                      # every mutation, the whole suite
#   tests/mutate.sh norm_rstd adamw_wd   # only these mutations
#   MUTATE_TESTS='test_ops|test_refs' tests/mutate.sh   # only the tests ctest -R selects
#   MUTATE_EXCLUDE='mpi_|hf_roundtrip' tests/mutate.sh   # all but the tests ctest -E selects
#   MUTATE_DIR=/tmp/m tests/mutate.sh    # scratch directory (default: a fresh one under /tmp)
#   MUTATE_BASELINE=0 tests/mutate.sh    # no unmutated run first (when the suite is known to pass)
# The table goes to stdout and to $MUTATE_DIR/result.md, each mutation's ctest output to
# ctest-NAME.log beside it; exit status 1 if any mutation is not CAUGHT.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${MUTATE_DIR:-$(mktemp -d /tmp/cgrad-mutate.XXXXXX)}
jobs=${MUTATE_JOBS:-2}

# name | file | sed expression (no '|' in it: use another delimiter) | what it breaks
mutations=(
  'norm_rstd|ops/norm.c|s/const cg_real h = (xr\[j + l\] - m) \* q, dh/const cg_real h = (xr[j + l] - m), dh/|norm_bwd: rstd dropped from h in the 16-lane loop'
  'adamw_wd|optim/optim.c|s/\.keep = (cg_real)(1 - lr \* c->weight_decay)/.keep = (cg_real)(1 - 0.5 * lr * c->weight_decay)/|AdamW: weight decay halved'
  'ln_eps_sqrt|ops/norm.c|s#1\.0 / sqrt(cgi_row_sqdev(x, d, m) / (double)d + eps)#1.0 / (sqrt(cgi_row_sqdev(x, d, m) / (double)d) + eps)#|layer norm: eps added outside the square root'
  'msm_causal|ops/softmax.c|s/causal ? (r % tq) + shift + 1 : n/causal ? (r % tq) + shift + 2 : n/|masked_softmax: causal mask off by one (sees the next key)'
  'rope_llama3|ops/rope.c|s#fi = (1 - s) \* fi / c->llama3_factor + s \* fi;#fi = s * fi / c->llama3_factor + (1 - s) * fi;#|rope: LLaMA 3 smoothing terms swapped'
  'sdpa_causal|ops/attention.c|s/const int64_t vis = h->causal ? i + h->shift + 1 - j0/const int64_t vis = h->causal ? i + h->shift + 2 - j0/|sdpa: causal mask off by one in the blocked kernel'
  'row_dot_tail|ops/attention.c|s/    for (; e < n; e++) s += x\[e\] \* y\[e\];/    for (; e + 1 < n; e++) s += x[e] * y[e];/|attention backward: last element of row_dot scalar tail dropped'
)

want=("$@")
selected() {
  [ ${#want[@]} -eq 0 ] && return 0
  for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

echo "copying $src to $dir"
rm -rf "$dir/incoming" && mkdir -p "$dir/incoming" "$dir/tree"
(cd "$src" && tar --exclude='./build*' --exclude=./.git -cf - .) | (cd "$dir/incoming" && tar -xf -)
# Into the tree only the files whose bytes differ, each with a fresh time, so that make rebuilds them;
# the others keep the tree's time. (An extracted file keeps the source's older time, and a reused
# build directory would then keep objects compiled from a mutation of it.)
(cd "$dir/incoming" && find . -type f) | while read -r f; do
  cmp -s "$dir/incoming/$f" "$dir/tree/$f" || { mkdir -p "$(dirname "$dir/tree/$f")" && cp "$dir/incoming/$f" "$dir/tree/$f"; }
done
rm -rf "$dir/incoming"
export CCACHE_BASEDIR="$dir/tree"
cmake -S "$dir/tree" -B "$dir/build" -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  >"$dir/cmake.log" 2>&1 || { echo "cmake failed: $dir/cmake.log"; exit 2; }

# Builds and runs the suite; the names of failing tests go to $1, one a line.
run_suite() {
  if ! cmake --build "$dir/build" -j"$jobs" >"$dir/build.log" 2>&1; then
    echo "(build failed)" >"$1"
    return
  fi
  local sel=()
  [ -n "${MUTATE_TESTS:-}" ] && sel+=(-R "$MUTATE_TESTS")
  [ -n "${MUTATE_EXCLUDE:-}" ] && sel+=(-E "$MUTATE_EXCLUDE")
  (cd "$dir/build" && ctest -j"$jobs" --timeout 900 "${sel[@]}" >"$dir/ctest.log" 2>&1)
  sed -n '/The following tests FAILED:/,$p' "$dir/ctest.log" | sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (.*/\1/p' >"$1"
}

if [ "${MUTATE_BASELINE:-1}" = 0 ]; then
  : >"$dir/baseline.txt" # the caller vouches that the suite passes as it is
  cmake --build "$dir/build" -j"$jobs" >"$dir/build.log" 2>&1
else
  echo "baseline: the suite without mutations"
  run_suite "$dir/baseline.txt"
fi
if [ -s "$dir/baseline.txt" ]; then
  echo "tests failing without any mutation (left out of the counts below): $(tr '\n' ' ' <"$dir/baseline.txt")"
fi

table="$dir/result.md"
{
  echo "| mutation | what it breaks | tests that fail | verdict |"
  echo "|---|---|---|---|"
} >"$table"
status=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file expr what <<<"$m"
  selected "$name" || continue
  f="$dir/tree/$file"
  cp "$f" "$dir/orig"
  sed -i "$expr" "$f"
  if cmp -s "$f" "$dir/orig"; then
    echo "| $name | $what | - | NOT APPLIED |" >>"$table"
    status=1
    continue
  fi
  echo "mutation $name: $what"
  run_suite "$dir/failed.txt"
  cp "$dir/orig" "$f"
  cp "$dir/ctest.log" "$dir/ctest-$name.log" 2>/dev/null
  caught=$(grep -vxF -f "$dir/baseline.txt" "$dir/failed.txt" 2>/dev/null || cat "$dir/failed.txt")
  [ -s "$dir/baseline.txt" ] || caught=$(cat "$dir/failed.txt")
  n=$(printf '%s' "$caught" | grep -c . || true)
  others=$(printf '%s\n' "$caught" | grep -v -x -c -e test_models -e '' || true)
  if [ "$caught" = "(build failed)" ]; then verdict="BUILD FAILED"; status=1
  elif [ "$n" -ge 2 ] && [ "$others" -ge 1 ]; then verdict=CAUGHT
  elif [ "$n" -ge 1 ]; then verdict=WEAK; status=1
  else verdict=SURVIVED; status=1
  fi
  echo "| $name | $what | $(printf '%s' "$caught" | tr '\n' ' ') | $verdict |" >>"$table"
  echo "  $verdict: $(printf '%s' "$caught" | tr '\n' ' ')"
done
# leave the copy built as the tree is, for the next run
cmake --build "$dir/build" -j"$jobs" >"$dir/build.log" 2>&1
echo
cat "$table"
exit $status
