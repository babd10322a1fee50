/* SPDX-License-Identifier: MIT */
/* bench_attention: the fused attention's options against plain cg_sdpa, forward + backward, side by
 * side: ALiBi, T5's relative bias table, a given [1, H, T, T] bias tensor, dropout, and the composite
 * (matmul -> masked softmax -> dropout -> matmul) that attention dropout used before. Each variant is
 * a graph built once; one repetition runs every variant once in turn (interleaved, so machine load
 * hits all alike); the median over the repetitions is reported with the min and max, as a ratio to
 * plain sdpa, and the graph's planned bytes beside plain's (the options add O(T) per head, the
 * composite O(T^2)). Every variant keeps its probabilities for backward (CGRAD_ATTN_PROBS=keep) but
 * "probabilities remade", whose backward remakes them (what the plan picks where they would be
 * live at its peak). Usage: bench_attention [reps] [B] [H] [T] [D] [causal 0/1] [threads]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

typedef enum { PLAIN, ALIBI, T5, BIAS, DROPOUT, ALIBI_DROPOUT, COMPOSITE_DROPOUT, REMADE } kind;

typedef struct {
    const char *name;
    kind k;
    bench_timed t;
} variant;

static cg_tensor *build(cg_graph *g, kind k, cg_tensor *q, cg_tensor *kk, cg_tensor *v, bool causal, cg_rng *r) {
    const int64_t *s = cg_shape(q);
    cg_sdpa_opts o = {.scale = 1.0 / sqrt((double)s[3]), .causal = causal};
    if (k == ALIBI || k == ALIBI_DROPOUT) o.alibi = true;
    if (k == DROPOUT || k == ALIBI_DROPOUT) o.dropout = 0.1;
    if (k == T5) {
        o.rel_bias = cg_requires_grad(cg_input(g, "t5", CG_REAL, 2, (int64_t[]){32, s[1]}));
        cg_fill_uniform(o.rel_bias, r, -1, 1);
    }
    if (k == BIAS) {
        o.bias = cg_requires_grad(cg_input(g, "bias", CG_REAL, 4, (int64_t[]){1, s[1], s[2], s[2]}));
        cg_fill_uniform(o.bias, r, -1, 1);
    }
    if (k != COMPOSITE_DROPOUT) return cg_sdpa_ex(g, q, kk, v, &o);
    cg_tensor *w = cg_masked_softmax(g, cg_matmul(g, q, cg_transpose(g, kk, -1, -2)), o.scale, NULL, causal, NULL);
    return cg_matmul(g, cg_dropout(g, w, 0.1), v);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 11;
    const int64_t B = argc > 2 ? atoll(argv[2]) : 2, H = argc > 3 ? atoll(argv[3]) : 4, T = argc > 4 ? atoll(argv[4]) : 1024,
                  D = argc > 5 ? atoll(argv[5]) : 64;
    const bool causal = argc > 6 ? atoi(argv[6]) != 0 : true;
    cg_set_threads(argc > 7 ? atoi(argv[7]) : 0);
    variant vs[] = {
        {"sdpa", PLAIN, {0}},
        {"+ ALiBi", ALIBI, {0}},
        {"+ T5 table [32,H]", T5, {0}},
        {"+ bias [1,H,T,T]", BIAS, {0}},
        {"+ dropout 0.1", DROPOUT, {0}},
        {"+ ALiBi + dropout", ALIBI_DROPOUT, {0}},
        {"composite + dropout", COMPOSITE_DROPOUT, {0}},
        {"probabilities remade", REMADE, {0}},
    };
    const int nv = sizeof vs / sizeof vs[0];
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    for (int i = 0; i < nv; i++) {
        variant *v = &vs[i];
        v->t.g = cg_graph_new(CG_TRAIN);
        const int64_t s[4] = {B, H, T, D};
        cg_tensor *x[3];
        for (int j = 0; j < 3; j++) x[j] = bench_input(v->t.g, "x", 4, s, &rng, -2, 2);
        cg_tensor *r = bench_upstream(v->t.g, 4, s, &rng);
        v->t.loss = bench_loss(v->t.g, build(v->t.g, v->k, x[0], x[1], x[2], causal, &rng), r);
        setenv("CGRAD_ATTN_PROBS", v->k == REMADE ? "remake" : "keep", 1); /* read when the graph is planned */
        if (!bench_ready(&v->t, "bench_attention", v->name, reps)) return 1;
        unsetenv("CGRAD_ATTN_PROBS");
    }
    bench_timed ts[sizeof vs / sizeof vs[0]];
    for (int i = 0; i < nv; i++) ts[i] = vs[i].t;
    bench_interleaved(nv, ts, reps);
    printf("# bench_attention: q, k, v [%lld, %lld, %lld, %lld], %s, %d thread(s), %d interleaved repetitions;\n"
           "# forward + backward of sum(attention * R): wall ms median [min, max]; CPU ms (all threads) median\n"
           "# [min] and the ratio of CPU medians to sdpa's; graph bytes (planned) and their excess over sdpa's\n",
           (long long)B, (long long)H, (long long)T, (long long)D, causal ? "causal" : "full", cg_threads(), reps);
    const double base = ts[0].cpu[reps / 2];
    const double base_mb = (double)cg_graph_bytes(ts[0].g) / 1048576;
    for (int i = 0; i < nv; i++) {
        const double mb = (double)cg_graph_bytes(ts[i].g) / 1048576;
        printf("%-20s %8.2f [%7.2f, %7.2f] ms  cpu %8.2f [%7.2f] ms  x%.3f  %8.2f MB  %+8.3f MB\n", vs[i].name,
               ts[i].ms[reps / 2], ts[i].ms[0], ts[i].ms[reps - 1], ts[i].cpu[reps / 2], ts[i].cpu[0],
               ts[i].cpu[reps / 2] / base, mb, mb - base_mb);
        bench_free(&ts[i]);
    }
    return 0;
}
