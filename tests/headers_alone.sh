#!/bin/sh
# SPDX-License-Identifier: MIT
# Every public header compiles on its own, as the first and only include of a file, in C11 and in
# C++17, float32 and float64, with warnings as errors: what a user gets with <cgrad/...>.
# Usage: headers_alone.sh CC CXX INCLUDE_DIR   (INCLUDE_DIR holds cgrad/; CXX may be empty)
set -u
cc=$1 cxx=$2 inc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 n=0
headers=$(cd "$inc" && find cgrad -name '*.h' | sort)
[ -n "$headers" ] || { echo "FAIL no headers under $inc/cgrad"; exit 1; }
for h in $headers; do
    n=$((n + 1))
    # declarations go between CG_BEGIN_DECLS and CG_END_DECLS (graph/export.h), which export them
    case $h in cgrad/cgrad.h | cgrad/graph/export.h) ;; *)
        if ! grep -q '^CG_BEGIN_DECLS' "$inc/$h" || ! grep -q '^CG_END_DECLS' "$inc/$h" || grep -q 'extern "C"' "$inc/$h"; then
            echo "FAIL $h: wrap its declarations in CG_BEGIN_DECLS ... CG_END_DECLS instead of extern \"C\""; fail=1
        fi ;;
    esac
    printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$tmp/t.c"
    cp "$tmp/t.c" "$tmp/t.cpp"
    for def in "" -DCGRAD_DOUBLE; do
        # shellcheck disable=SC2086
        if ! $cc -std=c11 -Wall -Wextra -Wpedantic -Werror $def -I"$inc" -c "$tmp/t.c" -o "$tmp/t.o" 2>"$tmp/err"; then
            echo "FAIL $h (C11 $def):"; head -20 "$tmp/err"; fail=1
        fi
        # shellcheck disable=SC2086
        if [ -n "$cxx" ] && ! $cxx -std=c++17 -Wall -Wextra -Wpedantic -Werror $def -I"$inc" -c "$tmp/t.cpp" -o "$tmp/t.o" 2>"$tmp/err"; then
            echo "FAIL $h (C++17 $def):"; head -20 "$tmp/err"; fail=1
        fi
    done
done
[ -n "$cxx" ] || echo "note: no C++ compiler, C11 only"
[ $fail = 0 ] && echo "ok   $n headers compile alone in C11${cxx:+ and C++17}, float32 and float64"
exit $fail
