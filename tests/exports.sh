#!/bin/sh
# SPDX-License-Identifier: MIT
# The shared libraries export cg_* names only (nm -D --defined-only), and libcgrad.so does not pull
# in MPI (ldd): MPI belongs to libcgrad_dist alone. With MPI in the build, libcgrad_dist.so must
# show it, which also proves the ldd check can see MPI at all.
# Usage: exports.sh LIBCGRAD_SO LIBCGRAD_DIST_SO MPI(ON|OFF)
set -u
lib=$1 dist=$2 mpi=$3
fail=0
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
