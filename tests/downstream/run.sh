#!/bin/sh
# SPDX-License-Identifier: MIT
# Every way of consuming cgrad, each a step that says what failed: the install (public headers only,
# each one as in the build tree), find_package in C and C++, pkg-config shared and --static (f32,
# f64, libcgrad_dist, C++), add_subdirectory and FetchContent from the local source tree. Every
# program checks a gradient by value. The embedded builds compile the library once each, at -O0
# (Debug: compile time, not speed, is what matters here), with the same compiler launcher as the
# build under test. Usage: run.sh BUILD_DIR SOURCE_DIR [LAUNCHER]
set -eu
build=$1 src=$2 launcher=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
p=$tmp/prefix
step() { # name, hint, command...
    name=$1 hint=$2
    shift 2
    echo "== $name"
    if ! "$@" >"$tmp/log" 2>&1; then
        tail -30 "$tmp/log"
        echo "downstream: FAILED at '$name': $hint"
        exit 1
    fi
    grep -E '^(ok|downstream)' "$tmp/log" || true
}

install_tree() {
    cmake --install "$build" --prefix "$p"
    test -x "$p/bin/cgrad" && test -x "$p/bin/cgrad-f64"
    for l in libcgrad.a libcgrad.so libcgrad_dist.a libcgrad_dist.so libcgrad_f64.a libcgrad_f64.so; do
        test -e "$p/lib/$l" || { echo "missing lib/$l"; return 1; }
    done
    (cd "$p/include" && find cgrad -type f | sort) >"$tmp/installed"
    (cd "$build/include" && find cgrad -name '*.h' | sort) >"$tmp/staged"
    diff "$tmp/staged" "$tmp/installed" || { echo "installed headers differ from build/include (left)"; return 1; }
    if grep -E 'internal|exp16|config_json' "$tmp/installed"; then echo "an internal header is installed"; return 1; fi
    echo "ok   $(wc -l <"$tmp/installed") public headers installed, the same as in-tree"
}
step "install" "cmake --install or the installed file set" install_tree

package_c() {
    cmake -S "$here" -B "$tmp/c" -DMODE=package -DLANG=C -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release
    cmake --build "$tmp/c" -j2
    for e in down_static down_shared down_f64 down_dist down_dist_static; do "$tmp/c/$e"; done
}
step "find_package, C" "cgradConfig.cmake or the exported targets (cgrad::cgrad, _shared, _f64, _dist)" package_c

package_cxx() {
    cmake -S "$here" -B "$tmp/cxx" -DMODE=package -DLANG=CXX -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release
    cmake --build "$tmp/cxx" -j2
    "$tmp/cxx/down_cxx"
}
step "find_package, C++ (a project without C)" "the package in a C++-only project" package_cxx

export PKG_CONFIG_PATH="$p/lib/pkgconfig"
pc_requires() { # cgrad.pc must not need MPI's (or anything's) dev files beyond a static link's
    for pc in cgrad cgrad_f64; do
        if pkg-config --print-requires --print-requires-private $pc | grep -i mpi; then
            echo "$pc.pc requires MPI: only cgrad_dist.pc may"; return 1
        fi
    done
    pkg-config --cflags cgrad >/dev/null
    echo "ok   cgrad.pc and cgrad_f64.pc need no MPI"
}
step "pkg-config, requirements" "Requires/Requires.private of cgrad.pc" pc_requires

pc_shared() {
    for pc in cgrad cgrad_f64; do
        bytes=4; [ $pc = cgrad_f64 ] && bytes=8
        # shellcheck disable=SC2046
        cc -std=c11 -DEXPECT_REAL_BYTES=$bytes "$here/main.c" -o "$tmp/pc_$pc" $(pkg-config --cflags --libs $pc) \
           -Wl,-rpath,"$p/lib"
        "$tmp/pc_$pc"
    done
    # shellcheck disable=SC2046
    cc -std=c11 -DEXPECT_REAL_BYTES=4 -DWITH_DIST "$here/main.c" -o "$tmp/pc_dist" \
       $(pkg-config --cflags --libs cgrad_dist) -Wl,-rpath,"$p/lib"
    "$tmp/pc_dist"
}
step "pkg-config, shared" "the flags of pkg-config --cflags --libs" pc_shared

pc_static() { # the recipe of docs/building.md
    for pc in cgrad cgrad_f64; do
        bytes=4; [ $pc = cgrad_f64 ] && bytes=8
        # shellcheck disable=SC2046
        cc -std=c11 -DEXPECT_REAL_BYTES=$bytes "$here/main.c" -o "$tmp/pcs_$pc" $(pkg-config --cflags $pc) \
           "$p/lib/lib$pc.a" $(pkg-config --static --libs-only-other --libs-only-l $pc | sed "s/-l$pc //")
        "$tmp/pcs_$pc"
        if readelf -d "$tmp/pcs_$pc" | grep -q "lib$pc\.so"; then echo "pcs_$pc needs lib$pc.so"; return 1; fi
    done
    # shellcheck disable=SC2046
    cc -std=c11 -DEXPECT_REAL_BYTES=4 -DWITH_DIST "$here/main.c" -o "$tmp/pcs_dist" $(pkg-config --cflags cgrad_dist) \
       "$p/lib/libcgrad_dist.a" "$p/lib/libcgrad.a" \
       $(pkg-config --static --libs-only-other --libs-only-l cgrad_dist | sed "s/-lcgrad_dist -lcgrad //")
    "$tmp/pcs_dist"
}
step "pkg-config --static" "Libs.private / Requires.private: a static link's dependencies" pc_static

pc_cxx() {
    # shellcheck disable=SC2046
    c++ -std=c++11 -Wall -Wextra -pedantic "$here/main.cpp" -o "$tmp/pc_cxx" $(pkg-config --cflags --libs cgrad) \
        -Wl,-rpath,"$p/lib"
    "$tmp/pc_cxx"
    test "$("$p/bin/cgrad" help | head -1 | cut -c1-12)" = "usage: cgrad"
}
step "pkg-config, C++" "the headers' extern \"C\" blocks or the C++ link" pc_cxx

embedded() { # mode, lang, programs...
    mode=$1 lang=$2
    shift 2
    cmake -S "$here" -B "$tmp/$mode" -DMODE="$mode" -DLANG="$lang" -DCGRAD_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Debug \
          ${launcher:+-DCMAKE_C_COMPILER_LAUNCHER="$launcher"}
    cmake --build "$tmp/$mode" -j2 --target "$@"
    for e in "$@"; do "$tmp/$mode/$e"; done
}
step "add_subdirectory, C" "cgrad's CMakeLists.txt as a subproject (paths, options, cgrad:: aliases)" \
     embedded subdir C down_static down_shared down_dist
step "FetchContent from a local path, C++" "cgrad through FetchContent_MakeAvailable" embedded fetch CXX down_cxx
echo "downstream: all ok"
