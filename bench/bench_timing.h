/* SPDX-License-Identifier: MIT */
/* Timing shared by the op benchmarks: every variant's graph runs forward + backward once per
 * repetition, in turn (interleaved, so machine load hits all alike), and the per-repetition wall
 * and CPU times are sorted for medians. Also how a variant's graph is set up: inputs that need a
 * gradient, and the loss sum(y * R) against a dense random upstream gradient R. */
#ifndef CGRAD_BENCH_TIMING_H
#define CGRAD_BENCH_TIMING_H

#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cgrad/cgrad.h>

/* CPU time of the whole process (every thread): unlike wall time, it barely moves when other jobs
 * share the machine, so A/B comparisons on a loaded machine read it. */
static inline double bench_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread in ms: a one-thread kernel's own time, whatever else runs. */
static inline double bench_thread_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline int bench_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A variant's graph, its loss, and its wall and CPU ms per repetition (reps each). */
typedef struct {
    cg_graph *g;
    cg_tensor *loss;
    double *ms, *cpu;
} bench_timed;

/* An input of the graph that needs a gradient, filled uniformly in [lo, hi] from rng. */
static inline cg_tensor *bench_input(cg_graph *g, const char *name, int ndim, const int64_t *shape, cg_rng *rng,
                                     double lo, double hi) {
    cg_tensor *x = cg_requires_grad(cg_input(g, name, CG_REAL, ndim, shape));
    cg_fill_uniform(x, rng, lo, hi);
    return x;
}

/* R, uniform in [-1, 1] and of the output's shape: the loss sum(y * R) (bench_loss) starts backward
 * from a dense upstream gradient, not from ones. */
static inline cg_tensor *bench_upstream(cg_graph *g, int ndim, const int64_t *shape, cg_rng *rng) {
    cg_tensor *r = cg_input(g, "R", CG_REAL, ndim, shape);
    cg_fill_uniform(r, rng, -1, 1);
    return r;
}

/* The variant's loss: sum(y * r), r from bench_upstream. */
static inline cg_tensor *bench_loss(cg_graph *g, cg_tensor *y, cg_tensor *r) { return cg_sum_all(g, cg_mul(g, y, r)); }

/* Runs n variants reps times, interleaved; their ms and cpu come back sorted ([reps / 2] is the median). */
static inline void bench_interleaved(int n, bench_timed *t, int reps) {
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < n; i++) {
            const double t0 = omp_get_wtime(), c0 = bench_cpu_now();
            cg_graph_forward(t[i].g);
            cg_graph_backward(t[i].g, t[i].loss);
            t[i].ms[k] = (omp_get_wtime() - t0) * 1e3;
            t[i].cpu[k] = (bench_cpu_now() - c0) * 1e3;
        }
    for (int i = 0; i < n; i++) {
        qsort(t[i].ms, (size_t)reps, sizeof(double), bench_cmp);
        qsort(t[i].cpu, (size_t)reps, sizeof(double), bench_cmp);
    }
}

/* Runs the graph once to check it, then allocates its timings; false (with a message) on failure. */
static inline bool bench_ready(bench_timed *t, const char *bench, const char *name, int reps) {
    if (!t->loss || cg_graph_forward(t->g) || cg_graph_backward(t->g, t->loss)) {
        fprintf(stderr, "%s: %s: %s\n", bench, name, cg_last_error());
        return false;
    }
    t->ms = malloc((size_t)reps * sizeof *t->ms);
    t->cpu = malloc((size_t)reps * sizeof *t->cpu);
    return true;
}

/* Frees the graph and timings. */
static inline void bench_free(bench_timed *t) {
    cg_graph_free(t->g);
    free(t->ms);
    free(t->cpu);
}

#endif
