# SPDX-License-Identifier: MIT
# The start the CLI test scripts share (sourced after `here` is set): a scratch directory, removed on
# exit, as $dir and the working directory; check COND WHAT prints "ok: WHAT" or "FAIL: WHAT" (and
# sets fail=1); run CMD... runs a command that must succeed, else prints its output and exits 1.
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
fail=0
check() { if eval "$1"; then echo "ok: $2"; else echo "FAIL: $2"; fail=1; fi; }
run() { "$@" > run.out 2>&1 || { echo "FAIL: $*"; cat run.out; exit 1; }; }
