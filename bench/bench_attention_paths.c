/* SPDX-License-Identifier: MIT */
/* bench_attention_paths: the fused attention's own forward and backward (cgi_fwd_attention,
 * cgi_bwd_attention; nothing else of the graph) on its two product paths for heads that keep their
 * probabilities (Tk <= 256): the direct AVX-512 tiles (ops/attention_kernels.c) and BLIS's micro-
 * kernel on packed operands (the environment's CGRAD_ATTN_UKR picks it for whole runs). One
 * repetition runs each path 5 times, the paths alternating; thread CPU ms medians [min, max] per
 * pass, and model GFLOP/s (2 T^2 D per product, 6 products per head, causal counted whole as the
 * step's model FLOPs count it).
 * With views 1, q, k and v are head views of one [B, T, 3 H D] tensor (a fused q/k/v projection,
 * as GPT-2 and encdec's self-attention), so their rows lie 3 H D apart.
 * With direct_only 1 the micro-kernel path is not run (for a profile of the direct one).
 * Usage: bench_attention_paths [reps] [B] [H] [T] [D] [causal 0/1] [views 0/1] [direct_only 0/1]; one thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cgrad/cgrad.h>
#include "bench_timing.h"
#include "graph/internal.h"
#include "ops/attention_internal.h"


int main(int argc, char **argv) {
    enum { MAXREPS = 101, PASSES = 5 };
    int reps = argc > 1 ? atoi(argv[1]) : 11;
    reps = reps < 1 ? 1 : reps > MAXREPS ? MAXREPS : reps;
    const int64_t B = argc > 2 ? atoll(argv[2]) : 16, H = argc > 3 ? atoll(argv[3]) : 8, T = argc > 4 ? atoll(argv[4]) : 64,
                  D = argc > 5 ? atoll(argv[5]) : 64;
    const bool causal = argc > 6 ? atoi(argv[6]) != 0 : false, views = argc > 7 && atoi(argv[7]) != 0,
               direct_only = argc > 8 && atoi(argv[8]) != 0;
    cg_set_threads(1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng r;
    cg_rng_seed(&r, 1);
    const int64_t s[4] = {B, H, T, D};
    cg_tensor *x[3];
    if (views) {
        cg_tensor *qkv = cg_requires_grad(cg_input(g, "qkv", CG_REAL, 3, (int64_t[]){B, T, 3 * H * D})), *p[3];
        cg_fill_uniform(qkv, &r, -2, 2);
        cg_split(g, qkv, -1, 3, NULL, p);
        for (int i = 0; i < 3; i++) x[i] = cg_split_heads(g, p[i], (int)H);
    } else
        for (int i = 0; i < 3; i++) {
            x[i] = cg_requires_grad(cg_input(g, "x", CG_REAL, 4, s));
            cg_fill_uniform(x[i], &r, -2, 2);
        }
    cg_tensor *up = cg_input(g, "R", CG_REAL, 4, s);
    cg_fill_uniform(up, &r, -1, 1);
    cg_tensor *o = cg_sdpa(g, x[0], x[1], x[2], 1 / sqrt((double)D), causal, NULL);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, o, up));
    if (!loss || cg_graph_forward(g) != CG_OK || cg_graph_backward(g, loss) != CG_OK) {
        fprintf(stderr, "bench_attention_paths: %s\n", cg_last_error());
        return 1;
    }
    const bool direct = cgi_attn_direct();
    static double fwd[2][MAXREPS], bwd[2][MAXREPS];
    for (int k = 0; k < reps; k++)
        for (int path = direct_only; path < 2; path++) { /* 0: micro-kernel, 1: direct */
            cgi_attn_direct_force(path == 1);
            const double t0 = bench_thread_ms();
            for (int i = 0; i < PASSES; i++) cgi_fwd_attention(o);
            const double t1 = bench_thread_ms();
            for (int i = 0; i < PASSES; i++) cgi_bwd_attention(o); /* adds into the gradients again: same work */
            const double t2 = bench_thread_ms();
            fwd[path][k] = (t1 - t0) / PASSES, bwd[path][k] = (t2 - t1) / PASSES;
        }
    const double flops = 6 * 2.0 * (double)(B * H * T * T * D);
    printf("# bench_attention_paths: q, k, v [%lld, %lld, %lld, %lld], %s, 1 thread, %d repetitions%s (direct path %s)\n",
           (long long)B, (long long)H, (long long)T, (long long)D, causal ? "causal" : "full", reps,
           views ? ", head views of one q/k/v tensor" : "",
           direct ? "available" : "not on this CPU: both rows are the micro-kernel");
    double tot[2];
    for (int path = direct_only; path < 2; path++) {
        double sum[MAXREPS];
        for (int k = 0; k < reps; k++) sum[k] = fwd[path][k] + bwd[path][k];
        qsort(fwd[path], (size_t)reps, sizeof(double), bench_cmp);
        qsort(bwd[path], (size_t)reps, sizeof(double), bench_cmp);
        qsort(sum, (size_t)reps, sizeof(double), bench_cmp);
        tot[path] = sum[reps / 2];
        printf("%-13s fwd %7.3f [%7.3f, %7.3f]  bwd %7.3f [%7.3f, %7.3f]  fwd+bwd %7.3f ms  %6.1f GFLOP/s\n",
               path ? "direct" : "micro-kernel", fwd[path][reps / 2], fwd[path][0], fwd[path][reps - 1], bwd[path][reps / 2],
               bwd[path][0], bwd[path][reps - 1], tot[path], flops / 1e6 / tot[path]);
    }
    if (!direct_only) printf("speedup (micro-kernel / direct, fwd+bwd medians) x%.2f\n", tot[0] / tot[1]);
    cg_graph_free(g);
    return 0;
}
