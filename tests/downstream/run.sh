#!/bin/sh
# SPDX-License-Identifier: MIT
# Installs the build in BUILD_DIR to a temporary prefix and builds a downstream project against it
# three ways: CMake find_package (C and C++), pkg-config (cgrad and cgrad_f64), and a C++ program.
# Each program checks a gradient by value. Usage: run.sh BUILD_DIR
set -eu
build=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
p=$tmp/prefix
test -f "$p/include/cgrad/cgrad.h" && test -x "$p/bin/cgrad" && test -x "$p/bin/cgrad-f64"
if ls "$p"/include/cgrad/*/*internal.h >/dev/null 2>&1; then echo "internal header installed"; exit 1; fi

echo "== find_package, C"
cmake -S "$here" -B "$tmp/c" -DLANG=C -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/c" -j2 >/dev/null
"$tmp/c/down_static" && "$tmp/c/down_shared" && "$tmp/c/down_f64"
echo "== find_package, C++ (a project without C)"
cmake -S "$here" -B "$tmp/cxx" -DLANG=CXX -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/cxx" -j2 >/dev/null
"$tmp/cxx/down_cxx"

echo "== pkg-config"
export PKG_CONFIG_PATH="$p/lib/pkgconfig"
for pc in cgrad cgrad_f64; do
  bytes=4; [ $pc = cgrad_f64 ] && bytes=8
  # shellcheck disable=SC2046
  cc -std=c11 -DEXPECT_REAL_BYTES=$bytes "$here/main.c" -o "$tmp/pc_$pc" $(pkg-config --cflags --libs $pc) \
     -Wl,-rpath,"$p/lib"
  "$tmp/pc_$pc"
  # a static link needs pkg-config --static for the private dependencies
  cc -std=c11 -DEXPECT_REAL_BYTES=$bytes "$here/main.c" -o "$tmp/pcs_$pc" $(pkg-config --cflags $pc) \
     "$p/lib/lib$pc.a" $(pkg-config --static --libs-only-other --libs-only-l $pc | sed "s/-l$pc //")
  "$tmp/pcs_$pc"
done
echo "== pkg-config, C++"
c++ -std=c++11 -Wall -Wextra -pedantic "$here/main.cpp" -o "$tmp/pc_cxx" $(pkg-config --cflags --libs cgrad) \
    -Wl,-rpath,"$p/lib"
"$tmp/pc_cxx"
test "$("$p/bin/cgrad" help | head -1 | cut -c1-12)" = "usage: cgrad"
echo "downstream: all ok"
