/* SPDX-License-Identifier: MIT */
/* bench_head: a language model's loss head, fused (cg_linear_cross_entropy) against the composite
 * (cg_linear, then cg_cross_entropy on the full [rows, vocab] logits), forward + backward, 1 chunk
 * or many, interleaved repetitions. Usage: bench_head [reps] [rows] [d] [vocab] [threads] [bias 0/1].
 * encdec-base: 1024 512 8000 1 1; gpt-small: 1024 768 50257 1 0; gpt-tiny: see its config. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 1024, d = argc > 3 ? atoll(argv[3]) : 512,
                  v = argc > 4 ? atoll(argv[4]) : 8000;
    cg_set_threads(argc > 5 ? atoi(argv[5]) : 0);
    const bool with_bias = argc > 6 ? atoi(argv[6]) != 0 : true;
    const char *names[2] = {"linear + cross_entropy", "linear_cross_entropy"};
    bench_timed ts[2];
    for (int i = 0; i < 2; i++) {
        cg_rng rng;
        cg_rng_seed(&rng, 1);
        bench_timed *t = &ts[i];
        t->g = cg_graph_new(CG_TRAIN);
        const int64_t xs[2] = {rows, d}, ws[2] = {v, d};
        cg_tensor *x = bench_input(t->g, "x", 2, xs, &rng, -1, 1), *w = bench_input(t->g, "w", 2, ws, &rng, -0.1, 0.1);
        cg_tensor *b = with_bias ? bench_input(t->g, "b", 1, &v, &rng, -0.1, 0.1) : NULL;
        cg_tensor *tg = cg_input(t->g, "targets", CG_INT32, 1, &rows);
        int32_t *T = cg_idata(tg);
        for (int64_t r = 0; r < rows; r++) T[r] = (int32_t)(cg_rng_next(&rng) % (uint64_t)v);
        t->loss = i ? cg_linear_cross_entropy(t->g, x, w, b, tg, -100)
                    : cg_cross_entropy(t->g, cg_linear(t->g, x, w, b), tg, -100);
        t->ms = t->cpu = NULL;
        if (!bench_ready(t, "bench_head", names[i], reps)) return 1;
    }
    bench_interleaved(2, ts, reps);
    printf("# bench_head: x[%lld, %lld] w[%lld, %lld]%s, %d thread(s), %d interleaved repetitions; forward +\n"
           "# backward, ms: median [min, max] of wall time, then the median CPU time of all threads\n",
           (long long)rows, (long long)d, (long long)v, (long long)d, with_bias ? " + bias" : "", cg_threads(), reps);
    for (int i = 0; i < 2; i++) {
        printf("%-24s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f ms\n", names[i], ts[i].ms[reps / 2], ts[i].ms[0],
               ts[i].ms[reps - 1], ts[i].cpu[reps / 2]);
        bench_free(&ts[i]);
    }
    return 0;
}
