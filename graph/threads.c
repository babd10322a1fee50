/* SPDX-License-Identifier: MIT */
/* One thread setting for the OpenMP kernels and BLIS. BLIS here is the OpenMP build, so both
 * draw on libgomp's pool; cgrad runs every BLIS call single-threaded inside its own parallel
 * loops (ops/gemm.c), so teams never nest. The global BLIS count serves callers of BLIS itself. */
#include <blis.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

static int n_threads; /* 0: not yet decided */

void cg_set_threads(int n) {
    cgi_blis_init();
    if (n <= 0) {
        const char *env = getenv("CGRAD_THREADS");
        n = env ? atoi(env) : 0;
        if (n <= 0) n = omp_get_num_procs();
    }
    n_threads = n;
    omp_set_num_threads(n);
    bli_thread_set_num_threads(n);
}

int cg_threads(void) {
    if (n_threads == 0) cg_set_threads(0);
    return n_threads;
}

/* The thread count of the graph run in progress on this thread (0: none), see cgi_run_threads. */
static _Thread_local int run_threads;

int cgi_nthreads(void) { return run_threads > 0 ? run_threads : cgi_cores_holding_one() ? 1 : cg_threads(); }

/* Under OMP_WAIT_POLICY=passive (the CLI's choice, cli/main.c) a waiting thread sleeps at once and
 * each parallel region pays for waking it. In this KVM guest that costs far more than the 3.6 us of
 * an empty region on a warm core: two adds of 32k elements took 9 us on one thread and 140-180 us
 * on two (6 us with spinning threads), since the idle vCPU has to be woken by the host; a 128k
 * add still lost 3x. So kernels stay on one thread below CGI_PAR_MIN elements, products below 2^23
 * multiply-adds a piece (ops/gemm.c), and a whole run below CGI_RUN_PAR_MIN keeps every op on one
 * thread: a cached gpt-tiny token step (3.3M multiply-adds in 21 regions) ran 10-40% slower on two
 * threads than on one, and an uncached step (16-216 tokens, 53M-700M) 20% slower. Spinning would
 * pay on an idle machine (uncached 127 -> 184 tokens/s on two threads) but collapsed with one other
 * busy process (67 tokens/s), which the passive policy exists to avoid. */
static double run_par_min = -1; /* CGRAD_RUN_PAR_MIN, read once; the tests set 0 to keep every run parallel */

double cgi_run_par_min(void) {
    if (run_par_min < 0) {
        const char *env = getenv("CGRAD_RUN_PAR_MIN");
        run_par_min = env && atof(env) >= 0 ? atof(env) : CGI_RUN_PAR_MIN;
    }
    return run_par_min;
}

int cgi_run_threads(double work) { return work < cgi_run_par_min() || cgi_cores_holding_one() ? 1 : cg_threads(); }

/* A run below CGI_RUN_PAR_MIN keeps its ops on one thread, so a small model's training step (nanoGPT's
 * CPU recipe: 4 layers of width 128, 12 x 64 tokens, ~0.6G multiply-adds a forward) left the second
 * core idle: 101% CPU on two threads. Such a run is one team span instead (graph/team.c): one parallel
 * region whose helpers, awake for the whole run, take pieces of its products while thread 0 runs the
 * other ops; the team's guard rests them when they do not pay. Pieces are cut as at one thread, so the
 * bits are the same. Below CGI_RUN_TEAM_MIN a run is too short to pay for waking a helper. */
static double run_team_min = -1; /* CGRAD_RUN_TEAM_MIN, read once */

/* A large run (from cgi_run_par_min) opened one parallel region per op: 105-184 a training step
 * (bench/regions_per_step.py), each waking the sleeping second thread and joining it again. Now it
 * is one team span as well (graph/team.c, cgi_run_graph): the helpers stay awake for the whole
 * forward or backward and take pieces of its products, attention and the shared ops.
 * CGRAD_TEAM_LARGE=0 restores the regions per op, for comparisons. */
static int team_large = -1; /* CGRAD_TEAM_LARGE, read once; cgi_set_team_large for tests */

void cgi_set_team_large(int on) { team_large = on; }

bool cgi_run_in_team(double work) {
    if (run_team_min < 0) {
        const char *env = getenv("CGRAD_RUN_TEAM_MIN");
        run_team_min = env && atof(env) >= 0 ? atof(env) : CGI_RUN_TEAM_MIN;
    }
    if (team_large < 0) {
        const char *env = getenv("CGRAD_TEAM_LARGE");
        team_large = env ? atoi(env) > 0 : CGI_TEAM_LARGE_DEFAULT;
    }
    return work >= run_team_min && (work < cgi_run_par_min() || team_large) && !cgi_team_on() && cg_threads() > 1 &&
           !cgi_cores_holding_one() && !omp_in_parallel();
}

int cgi_run_begin(int threads) {
    const int was = run_threads;
    run_threads = threads;
    return was;
}

void cgi_run_end(int was) { run_threads = was; }

#ifndef CGRAD_VERSION
#define CGRAD_VERSION "unknown"
#endif
const char *cg_version(void) { return CGRAD_VERSION; }

const char *cg_build_info(void) {
    static char line[384];
    snprintf(line, sizeof line, "build: %s, %s, %s, OpenMP %d, BLIS %s, bf16 products %s",
             sizeof(cg_real) == 8 ? "float64" : "float32",
#ifdef CGRAD_PORTABLE
             "portable x86-64-v2 (AVX2/AVX-512 clones picked at load)",
#else
             "native (-march=native)",
#endif
#if defined(__clang__)
             "clang " __clang_version__,
#elif defined(__GNUC__)
             "gcc " __VERSION__,
#else
             "an unknown compiler",
#endif
             _OPENMP, bli_info_get_version_str(),
#if defined(CGRAD_DNNL) && !defined(CGRAD_DOUBLE)
             "through oneDNN"
#else
             "not built (no oneDNN)"
#endif
    );
    return line;
}

const char *cg_runtime_info(void) {
    static _Thread_local char line[512];
    const char *wp = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    snprintf(line, sizeof line, "cgrad %s, BLIS %s (%s threading), kernels %s (%s), %d thread(s), OMP_WAIT_POLICY=%s%s%s, "
             "cores guard %s",
             cg_version(), bli_info_get_version_str(), bli_info_get_enable_openmp() ? "OpenMP" : bli_info_get_enable_pthreads() ? "pthreads" : "no",
             cg_blas_kernels(), cg_blas_kernels_reason(), cg_threads(), wp ? wp : "unset (libgomp spins, then sleeps)",
             spin ? ", GOMP_SPINCOUNT=" : "", spin ? spin : "",
             cgi_cores_describe());
    return line;
}

void cg_rng_seed(cg_rng *r, uint64_t seed) { r->state = seed; }

uint64_t cg_rng_next(cg_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double cg_rng_uniform(cg_rng *r) { return (double)(cg_rng_next(r) >> 11) * 0x1.0p-53; }

double cg_rng_normal(cg_rng *r) {
    double u1 = cg_rng_uniform(r), u2 = cg_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static atomic_llong zeroed; /* bytes cgi_zero has cleared, for tests */
long long cgi_zeroed_bytes(void) { return atomic_load(&zeroed); }

enum { ZERO_PART = 1 << 18 }; /* bytes */

typedef struct {
    char *p;
    size_t bytes;
} zero_args;

static void zero_parts(int64_t q0, int64_t q1, void *ctx) {
    const zero_args *z = ctx;
    for (int64_t i = q0; i < q1; i++) {
        const size_t lo = (size_t)i * ZERO_PART, n = z->bytes - lo < ZERO_PART ? z->bytes - lo : ZERO_PART;
        memset(z->p + lo, 0, n);
    }
}

void cgi_zero(void *p, size_t bytes) {
    atomic_fetch_add_explicit(&zeroed, (long long)bytes, memory_order_relaxed);
    const int64_t parts = (int64_t)((bytes + ZERO_PART - 1) / ZERO_PART);
    if (parts < 4 || (cgi_nthreads() < 2 && !cgi_team_sharing())) {
        memset(p, 0, bytes);
        return;
    }
    zero_args z = {p, bytes};
    /* 4 parts or more (1 MB) always share: the work passed is above both thresholds */
    cgi_par_ranges(parts, (int64_t)CGI_PAR_MIN + 1, zero_parts, &z);
}
