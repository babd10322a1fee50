#!/bin/sh
# SPDX-License-Identifier: MIT
# The shared libraries export cg_* names only (nm -D --defined-only), and libcgrad.so does not pull
# in MPI (ldd): MPI belongs to libcgrad_dist alone. With MPI in the build, libcgrad_dist.so must
# show it, which also proves the ldd check can see MPI at all.
# Every cg_ function the public headers declare is exported: a definition in a file that does not
# include its declaring header would be hidden. Usage: exports.sh LIBCGRAD_SO LIBCGRAD_DIST_SO MPI(ON|OFF) INCLUDE_DIR
set -u
lib=$1 dist=$2 mpi=$3 inc=$4
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for so in "$lib" "$dist"; do
    if ! names=$(nm -D --defined-only "$so" | awk 'NF == 3 { print $3 }'); then
        echo "FAIL $so: nm failed"; fail=1; continue
    fi
    bad=$(printf '%s\n' "$names" | grep -v '^cg_' | grep -v '^$' || true)
    if [ -n "$bad" ]; then
        echo "FAIL $(basename "$so") exports $(printf '%s\n' "$bad" | wc -l) names outside cg_*:"
        printf '%s\n' "$bad" | head -20
        fail=1
    else
        echo "ok   $(basename "$so"): $(printf '%s\n' "$names" | grep -c '^cg_') names, all cg_*"
    fi
done
# names called like functions in the headers' code (comments dropped), less the type names
find "$inc/cgrad" -name '*.h' -exec cat {} + | grep -vE '^[[:space:]]*(/?\*|\*)' | sed 's|/\*.*||' >"$tmp/code"
grep -oE '\bcg_[a-z0-9_]+[[:space:]]*\(' "$tmp/code" | sed 's/[[:space:]]*($//' | sort -u >"$tmp/called"
{ grep -oE '}[[:space:]]*cg_[a-z0-9_]+[[:space:]]*;' "$tmp/code"; grep -E '^typedef' "$tmp/code" | grep -oE 'cg_[a-z0-9_]+[[:space:]]*;'; } |
    grep -oE 'cg_[a-z0-9_]+' | sort -u >"$tmp/types"
comm -23 "$tmp/called" "$tmp/types" >"$tmp/declared"
{ nm -D --defined-only "$lib"; nm -D --defined-only "$dist"; } | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/exported"
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$missing" ]; then
    echo "FAIL declared in a public header but not exported (define it in a file that includes its header):"
    echo "$missing"; fail=1
else
    echo "ok   all $(wc -l <"$tmp/declared") functions the public headers declare are exported"
fi
if ldd "$lib" | grep -i 'mpi'; then
    echo "FAIL $(basename "$lib") needs MPI (above): only libcgrad_dist may link it"; fail=1
else
    echo "ok   $(basename "$lib"): no MPI among $(ldd "$lib" | wc -l) libraries"
fi
if [ "$mpi" = ON ]; then
    if ldd "$dist" | grep -qi 'libmpi'; then echo "ok   $(basename "$dist"): links libmpi"
    else echo "FAIL $(basename "$dist"): built with MPI but ldd shows no libmpi"; fail=1; fi
fi
exit $fail
