/* bench_ops: fused ops against their composed twins, forward + backward, side by side.
 * Each variant is a graph built once over x[rows, d] (and gain [d]); one repetition runs every
 * variant once in turn (interleaved, so machine load hits all alike); the median over the
 * repetitions is reported with the min and max. Usage: bench_ops [reps] [rows] [d] [threads]. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cgrad.h"

typedef cg_tensor *(*build_fn)(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *gain);

static cg_tensor *none(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_add(g, x, x2); }
static cg_tensor *rms_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_rmsnorm(g, x, w, 1e-6); }
static cg_tensor *rms_composed(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) {
    cg_tensor *ms = cg_mean(g, cg_square(g, x), -1, true);
    return cg_mul(g, cg_div(g, x, cg_sqrt(g, cg_add_scalar(g, ms, 1e-6))), w);
}
static cg_tensor *ln_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_layernorm(g, x, w, NULL, 1e-5); }
static cg_tensor *silu_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_silu(g, x); }
static cg_tensor *silu_composed(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_mul(g, x, cg_sigmoid(g, x)); }
static cg_tensor *gelu_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_gelu_tanh(g, x); }
static cg_tensor *softmax_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_softmax(g, x); }
static cg_tensor *swiglu_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_swiglu(g, x, x2); }
static cg_tensor *swiglu_composed(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) {
    return cg_mul(g, cg_mul(g, x, cg_sigmoid(g, x)), x2);
}

typedef struct {
    const char *name;
    build_fn build;
    cg_graph *g;
    cg_tensor *loss;
    double *ms, *cpu_ms;
} variant;

/* CPU time of the whole process (every thread): unlike wall time, it barely moves when other jobs
 * share the machine, so A/B comparisons on a loaded machine read it. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 4096, d = argc > 3 ? atoll(argv[3]) : 1024;
    cg_set_threads(argc > 4 ? atoi(argv[4]) : 0);
    variant vs[] = {
        {"baseline: x + x2", none, NULL, NULL, NULL, NULL},
        {"rmsnorm fused", rms_fused, NULL, NULL, NULL, NULL},
        {"rmsnorm composed", rms_composed, NULL, NULL, NULL, NULL},
        {"layernorm fused", ln_fused, NULL, NULL, NULL, NULL},
        {"silu fused", silu_fused, NULL, NULL, NULL, NULL},
        {"silu composed", silu_composed, NULL, NULL, NULL, NULL},
        {"gelu_tanh fused", gelu_fused, NULL, NULL, NULL, NULL},
        {"softmax fused", softmax_fused, NULL, NULL, NULL, NULL},
        {"swiglu fused", swiglu_fused, NULL, NULL, NULL, NULL},
        {"swiglu composed", swiglu_composed, NULL, NULL, NULL, NULL},
    };
    const int nv = sizeof vs / sizeof vs[0];
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    for (int i = 0; i < nv; i++) {
        variant *v = &vs[i];
        v->g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_requires_grad(cg_input(v->g, "x", CG_REAL, 2, (int64_t[]){rows, d}));
        cg_tensor *x2 = cg_requires_grad(cg_input(v->g, "x2", CG_REAL, 2, (int64_t[]){rows, d}));
        cg_tensor *w = cg_requires_grad(cg_input(v->g, "w", CG_REAL, 1, (int64_t[]){d}));
        cg_fill_uniform(x, &rng, -2, 2), cg_fill_uniform(x2, &rng, -2, 2), cg_fill_uniform(w, &rng, 0.5, 1.5);
        /* loss = sum(y * R): backward then starts from a dense upstream gradient */
        cg_tensor *r = cg_input(v->g, "R", CG_REAL, 2, (int64_t[]){rows, d});
        cg_fill_uniform(r, &rng, -1, 1);
        v->loss = cg_sum_all(v->g, cg_mul(v->g, v->build(v->g, x, x2, w), r));
        if (!v->loss || cg_graph_forward(v->g) || cg_graph_backward(v->g, v->loss)) {
            fprintf(stderr, "bench_ops: %s: %s\n", v->name, cg_last_error());
            return 1;
        }
        v->ms = malloc((size_t)reps * sizeof *v->ms);
        v->cpu_ms = malloc((size_t)reps * sizeof *v->cpu_ms);
    }
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < nv; i++) {
            double t0 = omp_get_wtime(), c0 = cpu_now();
            cg_graph_forward(vs[i].g);
            cg_graph_backward(vs[i].g, vs[i].loss);
            vs[i].ms[k] = (omp_get_wtime() - t0) * 1e3;
            vs[i].cpu_ms[k] = (cpu_now() - c0) * 1e3;
        }
    /* sum(y * R) is part of every variant; the baseline row is that cost alone (with a cheap op) */
    printf("# bench_ops: x[%lld, %lld], %d thread(s), %d interleaved repetitions; forward + backward of\n"
           "# sum(op(x) * R), ms: median [min, max] of wall time, then the median CPU time of all threads\n",
           (long long)rows, (long long)d, cg_threads(), reps);
    for (int i = 0; i < nv; i++) {
        qsort(vs[i].ms, (size_t)reps, sizeof(double), cmp);
        qsort(vs[i].cpu_ms, (size_t)reps, sizeof(double), cmp);
        printf("%-18s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f ms\n", vs[i].name, vs[i].ms[reps / 2], vs[i].ms[0],
               vs[i].ms[reps - 1], vs[i].cpu_ms[reps / 2]);
        cg_graph_free(vs[i].g);
        free(vs[i].ms);
        free(vs[i].cpu_ms);
    }
    return 0;
}
