/* SPDX-License-Identifier: MIT */
/* bench_attention_mm: attention's small products (cgi_attn_mm, ops/attention_kernels.c) one by one,
 * as a head of T queries x T keys x D features runs them with its probabilities kept: forward's
 * S = Q K^T and O = P V, backward's dP = dO V^T, dV = P^T dO, dQ = dS K and dK = dS^T Q, each on
 * operands laid out as the op lays them out (q, k, v and dO rows rs apart, K^T and V^T dense, P and
 * dS rows T apart), and the softmax of a T x T block, against the product engine's sgemm (cgi_gemm,
 * one thread) on 1024^3. Thread CPU time, medians [min, max] over the repetitions, GFLOP/s and
 * the fraction of sgemm's. K^T and V^T lie in panels of 64 keys (cgi_attn_transpose_panels), as
 * the op keeps them; "dP, V^T by rows" is dP on a plain [D, T] V^T, Tk apart, for comparison.
 * Causal products count only the tiles the kernel runs (half the product, rounded to its strips),
 * as their time does. The sgemm runs last in each repetition, so the first product starts cold.
 * Usage: bench_attention_mm [reps] [T] [D] [causal 0/1] [row stride rs, 0: D]; one thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cgrad/cgrad.h>
#include "bench_timing.h"
#include "graph/internal.h"
#include "ops/attention_internal.h"


static float *filled(size_t n, cg_rng *r) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = cg_rng_uniform(r) - 0.5f;
    return x;
}

enum { MAXREPS = 101, NK = 9 };

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 11;
    reps = reps < 1 ? 1 : reps > MAXREPS ? MAXREPS : reps;
    const int64_t T = argc > 2 ? atoll(argv[2]) : 128, D = argc > 3 ? atoll(argv[3]) : 64;
    const bool causal = argc > 4 && atoi(argv[4]) != 0;
    const int64_t rs = argc > 5 && atoll(argv[5]) > 0 ? atoll(argv[5]) : D;
    cg_set_threads(1);
    if (!cgi_attn_direct()) {
        printf("# bench_attention_mm: the direct kernel is not on this CPU\n");
        return 77;
    }
    cg_rng r;
    cg_rng_seed(&r, 1);
    float *q = filled((size_t)(T * rs), &r), *k = filled((size_t)(T * rs), &r), *dO = filled((size_t)(T * rs), &r),
          *kt = filled((size_t)cgi_attn_panels_reals(T, D), &r), *v = filled((size_t)(T * D), &r),
          *s = filled((size_t)(T * T), &r),
          *o = filled((size_t)(T * rs), &r), *g = filled((size_t)(T * D), &r), *lse = filled((size_t)T, &r);
    float *sc = malloc((size_t)(T * T) * sizeof *sc); /* scores for the softmax, copied in before each */
    for (int64_t x = 0; x < T * T; x++) sc[x] = 4 * (float)cg_rng_uniform(&r);
    const int64_t F = CGI_UKR_FULL, diag = causal ? 0 : F, first = causal ? 0 : F;
    const int64_t N = 1024;
    float *ga = filled((size_t)(N * N), &r), *gb = filled((size_t)(N * N), &r), *gc = filled((size_t)(N * N), &r);
    static double ms[NK][MAXREPS];
    const char *names[NK] = {"S = Q K^T", "O = P V", "dP = dO V^T", "dV = P^T dO", "dQ = dS K", "dK = dS^T Q",
                             "copy + softmax", "dP, V^T by rows", "sgemm 1024^3"};
    const int inner = (int)(2e7 / (2.0 * T * T * D)) + 1;
    for (int rep = 0; rep < reps; rep++)
        for (int kind = 0; kind < NK; kind++) {
            const double t0 = bench_thread_ms();
            for (int i = 0; i < (kind == NK - 1 ? 1 : inner); i++) switch (kind) {
                case 0: cgi_attn_mm_panels(T, T, D, 0.125f, q, rs, 1, kt, 0, s, T, diag, F, F); break;
                case 1: cgi_attn_mm(T, D, T, 1, s, T, 1, v, D, 0, o, rs, F, diag, F); break;
                case 2: cgi_attn_mm_panels(T, T, D, 1, dO, rs, 1, kt, 0, s, T, diag, F, F); break;
                case 3: cgi_attn_mm(T, D, T, 1, s, 1, T, dO, rs, 1, g, D, F, F, first); break;
                case 4: cgi_attn_mm(T, D, T, 0.125f, s, T, 1, k, rs, 1, g, D, F, diag, F); break;
                case 5: cgi_attn_mm(T, D, T, 0.125f, s, 1, T, q, rs, 1, g, D, F, F, first); break;
                case 6:
                    memcpy(s, sc, (size_t)(T * T) * sizeof *s);
                    cgi_attn_softmax(s, T, T, T, causal, 1, NULL, 0, lse);
                    break;
                case 7: cgi_attn_mm(T, T, D, 1, dO, rs, 1, kt, T, 0, s, T, diag, F, F); break;
                default: cgi_gemm(N, N, N, ga, N, 1, gb, N, 1, 1, 0, gc, N, 1, 1);
                }
            ms[kind][rep] = (bench_thread_ms() - t0) / (kind == NK - 1 ? 1 : inner);
        }
    const double full = 2.0 * T * T * D, part = causal ? full * (T + 6) / (2.0 * T) : full;
    printf("# bench_attention_mm: T %lld, D %lld, %s, rows %lld apart, 1 thread, %d repetitions x %d calls\n",
           (long long)T, (long long)D, causal ? "causal" : "full", (long long)rs, reps, inner);
    double peak = 0;
    for (int kind = NK - 1; kind >= 0; kind--) {
        qsort(ms[kind], (size_t)reps, sizeof(double), bench_cmp);
        const double med = ms[kind][reps / 2];
        const double fl = kind == NK - 1 ? 2.0 * N * N * N : kind == 6 ? 0 : part;
        const double gf = fl / 1e6 / med;
        if (kind == NK - 1) peak = gf;
        if (kind == 6)
            printf("%-14s %8.4f ms [%8.4f, %8.4f]\n", names[kind], med, ms[kind][0], ms[kind][reps - 1]);
        else
            printf("%-14s %8.4f ms [%8.4f, %8.4f]  %6.1f GFLOP/s  %.2f of sgemm\n", names[kind], med, ms[kind][0],
                   ms[kind][reps - 1], gf, gf / peak);
    }
    free(q), free(k), free(dO), free(kt), free(v), free(s), free(o), free(g), free(lse);
    free(ga), free(gb), free(gc), free(sc);
    return 0;
}
