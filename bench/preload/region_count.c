/* SPDX-License-Identifier: MIT */
/* Counts the OpenMP parallel regions that start more than one thread, per call site (an LD_PRELOAD
 * helper). Under OMP_WAIT_POLICY=passive each such region wakes a sleeping thread (140-180 us in a
 * KVM guest, graph/threads.c), so their number per training step is worth counting (README "Fewer
 * parallel regions per step (issue 11)").
 * Built as build/region_count.so (CMake target region_count). Use:
 *   OMP_WAIT_POLICY=passive LD_PRELOAD=build/region_count.so build/cgrad bench --config X --threads 2 --steps N
 * Each process prints to stderr at exit, or at _exit (which `cgrad bench`'s forked children use),
 * its total and one line per call site: the object and the offset of the return address
 * (`addr2line -f -i -e build/cgrad OFFSET-1` names the function). Regions per step: the difference
 * between --steps 3 and --steps 1, halved. REGION_COUNT_DEPTH=k counts by the k-th caller up instead
 * (backtrace; inlining hides some frames). Regions whose team is one thread (a failed `if` clause,
 * num_threads(1)) or nested ones are counted apart: they wake nobody. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

enum { SITES = 512 };
static void *site[SITES];
static long hits[SITES], total, single;

static void count(void *ra) {
    __atomic_add_fetch(&total, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < SITES; i++) {
        void *s = __atomic_load_n(&site[i], __ATOMIC_ACQUIRE);
        if (s == ra) { __atomic_add_fetch(&hits[i], 1, __ATOMIC_RELAXED); return; }
        if (!s) {
            void *expect = NULL;
            if (__atomic_compare_exchange_n(&site[i], &expect, ra, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) || expect == ra) {
                __atomic_add_fetch(&hits[i], 1, __ATOMIC_RELAXED);
                return;
            }
        }
    }
}

/* GCC lowers `#pragma omp parallel` to GOMP_parallel(fn, data, num_threads, flags); num_threads 0
 * means the default team, 1 means the `if` clause failed. */
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) real = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(RTLD_NEXT, "GOMP_parallel");
    const unsigned n = num_threads ? num_threads : (unsigned)omp_get_max_threads();
    static int depth = -1; /* REGION_COUNT_DEPTH=k: count by the k-th caller up instead (k = 1: the kernel's caller) */
    if (depth < 0) depth = getenv("REGION_COUNT_DEPTH") ? atoi(getenv("REGION_COUNT_DEPTH")) : 0;
    void *ra = __builtin_return_address(0);
    if (depth > 0) {
        void *bt[16];
        const int got = backtrace(bt, 16);
        if (got > depth + 1) ra = bt[depth + 1];
    }
    if (n != 1 && !omp_in_parallel()) count(ra);
    else __atomic_add_fetch(&single, 1, __ATOMIC_RELAXED);
    real(fn, data, num_threads, flags);
}

static int base_cb(struct dl_phdr_info *info, size_t size, void *d) {
    (void)size;
    if (!info->dlpi_name[0]) *(unsigned long *)d = info->dlpi_addr; /* the main program */
    return 1;
}

static void report(void) {
    unsigned long base = 0;
    dl_iterate_phdr(base_cb, &base);
    fprintf(stderr, "region_count: %ld multi-thread regions, %ld single-thread; program base 0x%lx\n", total, single, base);
    for (int i = 0; i < SITES && site[i]; i++) {
        Dl_info info;
        const char *obj = dladdr(site[i], &info) && info.dli_fname ? info.dli_fname : "?";
        const unsigned long off = dladdr(site[i], &info) ? (unsigned long)site[i] - (unsigned long)info.dli_fbase : 0;
        fprintf(stderr, "region_count: %8ld  %s+0x%lx\n", hits[i], obj, off);
    }
}

__attribute__((destructor)) static void at_exit(void) { report(); }

/* `cgrad bench` runs each config in a forked child that leaves through _exit, which runs no
 * destructor: report there too. */
void _exit(int status) {
    static void (*real)(int);
    if (!real) real = (void (*)(int))dlsym(RTLD_NEXT, "_exit");
    report();
    real(status);
    __builtin_unreachable();
}
