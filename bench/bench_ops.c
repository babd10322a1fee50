/* SPDX-License-Identifier: MIT */
/* bench_ops: fused ops against their composed twins, forward + backward, side by side.
 * Each variant is a graph built once over x[rows, d] (and gain [d]); one repetition runs every
 * variant once in turn (interleaved, so machine load hits all alike); the median over the
 * repetitions is reported with the min and max. Usage: bench_ops [reps] [rows] [d] [threads]. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

typedef cg_tensor *(*build_fn)(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *gain);

static cg_tensor *none(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_add(g, x, x2); }
static cg_tensor *rms_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_rmsnorm(g, x, w, 1e-6); }
static cg_tensor *rms_composed(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) {
    cg_tensor *ms = cg_mean(g, cg_square(g, x), -1, true);
    return cg_mul(g, cg_div(g, x, cg_sqrt(g, cg_add_scalar(g, ms, 1e-6))), w);
}
static cg_tensor *ln_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) { return cg_layernorm(g, x, w, NULL, 1e-5); }
static cg_tensor *add_ln_fused(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) {
    return cg_add_layernorm(g, x, x2, w, NULL, 1e-5);
}
static cg_tensor *add_ln_composed(cg_graph *g, cg_tensor *x, cg_tensor *x2, cg_tensor *w) {
    return cg_layernorm(g, cg_add(g, x, x2), w, NULL, 1e-5);
}
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
    bench_timed t;
} variant;

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 4096, d = argc > 3 ? atoll(argv[3]) : 1024;
    cg_set_threads(argc > 4 ? atoi(argv[4]) : 0);
    variant vs[] = {
        {"baseline: x + x2", none, {0}},
        {"rmsnorm fused", rms_fused, {0}},
        {"rmsnorm composed", rms_composed, {0}},
        {"layernorm fused", ln_fused, {0}},
        {"add_layernorm", add_ln_fused, {0}},
        {"add + layernorm", add_ln_composed, {0}},
        {"silu fused", silu_fused, {0}},
        {"silu composed", silu_composed, {0}},
        {"gelu_tanh fused", gelu_fused, {0}},
        {"softmax fused", softmax_fused, {0}},
        {"swiglu fused", swiglu_fused, {0}},
        {"swiglu composed", swiglu_composed, {0}},
    };
    const int nv = sizeof vs / sizeof vs[0];
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    for (int i = 0; i < nv; i++) {
        variant *v = &vs[i];
        v->t.g = cg_graph_new(CG_TRAIN);
        const int64_t s[2] = {rows, d};
        cg_tensor *x = bench_input(v->t.g, "x", 2, s, &rng, -2, 2), *x2 = bench_input(v->t.g, "x2", 2, s, &rng, -2, 2);
        cg_tensor *w = bench_input(v->t.g, "w", 1, &d, &rng, 0.5, 1.5);
        cg_tensor *r = bench_upstream(v->t.g, 2, s, &rng);
        v->t.loss = bench_loss(v->t.g, v->build(v->t.g, x, x2, w), r);
        if (!bench_ready(&v->t, "bench_ops", v->name, reps)) return 1;
    }
    bench_timed ts[sizeof vs / sizeof vs[0]];
    for (int i = 0; i < nv; i++) ts[i] = vs[i].t;
    bench_interleaved(nv, ts, reps);
    /* sum(y * R) is part of every variant; the baseline row is that cost alone (with a cheap op) */
    printf("# bench_ops: x[%lld, %lld], %d thread(s), %d interleaved repetitions; forward + backward of\n"
           "# sum(op(x) * R), ms: median [min, max] of wall time, then the median CPU time of all threads\n",
           (long long)rows, (long long)d, cg_threads(), reps);
    for (int i = 0; i < nv; i++) {
        printf("%-18s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f ms\n", vs[i].name, ts[i].ms[reps / 2], ts[i].ms[0],
               ts[i].ms[reps - 1], ts[i].cpu[reps / 2]);
        bench_free(&ts[i]);
    }
    return 0;
}
