#!/bin/sh
# SPDX-License-Identifier: MIT
# The float32 and float64 libraries cannot be mixed up at link time: a program compiled without
# -DCGRAD_DOUBLE must fail to link against libcgrad_f64 (and the reverse), naming the guard symbol;
# the matching pairs link and compute. Usage: abi_guard.sh CC SRC_DIR INCLUDE_DIR LIB_F32 LIB_F64 "LINK FLAGS"
set -u
cc=$1 src=$2 inc=$3 lib32=$4 lib64=$5 flags=$6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
try() { # name, defines, library, expect (link|nolink)
    # shellcheck disable=SC2086
    if $cc -std=c11 $2 -I"$inc" "$src/tests/abi_probe.c" "$3" $flags -o "$tmp/$1" 2>"$tmp/$1.err"; then
        if [ "$4" = nolink ]; then echo "FAIL $1: linked"; fail=1; return; fi
        if "$tmp/$1" >"$tmp/$1.out"; then echo "ok   $1: links and reads $(cat "$tmp/$1.out")"
        else echo "FAIL $1: read $(cat "$tmp/$1.out")"; fail=1; fi
    else
        if [ "$4" = link ]; then echo "FAIL $1: did not link"; cat "$tmp/$1.err"; fail=1; return; fi
        if grep -q "cg_abi_f" "$tmp/$1.err"; then echo "ok   $1: refused: $(grep -o 'undefined reference to .cg_abi_f[0-9]*.' "$tmp/$1.err" | head -1)"
        else echo "FAIL $1: failed without naming the guard"; cat "$tmp/$1.err"; fail=1; fi
    fi
}
try f32_on_f32 "" "$lib32" link
try f64_on_f64 "-DCGRAD_DOUBLE" "$lib64" link
try f32_on_f64 "" "$lib64" nolink
try f64_on_f32 "-DCGRAD_DOUBLE" "$lib32" nolink
exit $fail
