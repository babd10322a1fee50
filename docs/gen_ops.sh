#!/bin/sh
# SPDX-License-Identifier: MIT
# Prints the op table of docs/ops.md from ops/ops.def, one row per op: its kind, the file it lives
# in, which values its backward reads, and how its backward writes the first input's gradient.
# Usage: docs/gen_ops.sh [ops/ops.def]. The docs_generated test fails when docs/ops.md's table
# differs from this output; regenerate with tests/docs_check.sh regen.
def=${1:-$(dirname "$0")/../ops/ops.def}
awk '
BEGIN {
    print "| op | kind | lives in | backward reads | backward writes the input gradient |"
    print "|---|---|---|---|---|"
}
/^CG_LEAF\(/ || /^CG_VIEW\(/ || /^CG_OP\(/ {
    kind = substr($0, 4, index($0, "(") - 4)
    args = substr($0, index($0, "(") + 1); sub(/\).*/, "", args); gsub(/ /, "", args)
    n = split(args, a, ",")
    if (kind == "LEAF") { printf "| `%s` | leaf: holds data | `graph/graph.c` | - | - |\n", a[2]; next }
    if (kind == "VIEW") { printf "| `%s` | view: shares its source'"'"'s storage | `ops/movement.c` | - | - (a view'"'"'s gradient is a view of its root'"'"'s) |\n", a[2]; next }
    reads = ""
    for (bit = 0; bit < 6; bit++)
        if (int(a[4] / 2 ^ bit) % 2) reads = reads (reads == "" ? "" : ", ") "input " bit
    if (a[5] == "1") reads = reads (reads == "" ? "" : ", ") "output"
    if (reads == "") reads = "nothing"
    how = "adds"
    if (a[6] == "CGI_GRAD_OVER_VALUE") how = "over the first input'"'"'s value"
    else if (a[6] == "CGI_GRAD_CLAIMS_SRC0") how = "assigns the first input'"'"'s (first writer)"
    else if (a[6] == "CGI_GRAD_CLAIMS_ALL") how = "assigns every input'"'"'s (first writer)"
    else if (a[6] == "CGI_OUT_IN_SRC0") how = "no gradient: writes into its input (inference only)"
    printf "| `%s` | op | `ops/%s.c` | %s | %s |\n", a[2], a[3], reads, how
}' "$def"
