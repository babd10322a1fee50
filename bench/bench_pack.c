/* SPDX-License-Identifier: MIT */
/* bench_pack: what the product engine's packs cost against the products they feed, per product
 * shape of a gpt-tiny training step (d 256, 4096 rows; the forward's x W, backward's dY W^T and
 * X^T dY, with the operands laid out as the step has them). For each shape, one thread: the
 * product through cgi_gemm_many, then A's and B's packs alone as the blocked driver does them
 * (whole operand, one depth pass of at most 512, B in blocks of at most 480 columns), each timed
 * over interleaved repetitions; CPU microseconds, medians with min and max, and the packs' share
 * of the product. Last, the product again with an A stored by rows packed as a whole block ahead
 * instead of a panel at a time (cgi_gemm_set_panels), in the same repetitions, and the median of
 * the per-repetition ratio panels / block (1 where A is not stored by rows or B does not fit one
 * block). Usage: bench_pack [reps]. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include "graph/internal.h"

typedef struct {
    const char *what;
    int64_t m, n, k;
    bool a_cols, b_cols; /* A stored [k, m] (read transposed), B stored [n, k] (a weight read transposed) */
} shape;

static void fill(cg_real *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = (cg_real)((i * 37) % 101) * 0.01f - 0.5f;
}

static double med(double *v, int n, double *lo, double *hi) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp);
    *lo = v[0], *hi = v[n - 1];
    return v[n / 2];
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_pack [reps >= 1]\n");
        return 1;
    }
    static const shape shapes[] = {
        {"qkv   x W", 4096, 768, 256, false, false},      {"proj  x W", 4096, 256, 256, false, false},
        {"fc    x W", 4096, 1024, 256, false, false},     {"fc2   x W", 4096, 256, 1024, false, false},
        {"dX qkv dY W^T", 4096, 256, 768, false, true},   {"dX fc dY W^T", 4096, 256, 1024, false, true},
        {"dX fc2 dY W^T", 4096, 1024, 256, false, true},  {"dW qkv X^T dY", 256, 768, 4096, true, false},
        {"dW fc2 X^T dY", 1024, 256, 4096, true, false},  {"x W^T (torch)", 4096, 768, 256, false, true},
    };
    cgi_ukr u;
    cgi_ukr_init(&u);
    printf("# bench_pack: 1 thread, %d interleaved repetitions, CPU us: median [min, max]; packs as the blocked driver\n",
           reps);
    printf("%-16s %18s %24s %24s %7s %21s\n", "shape", "product", "pack A", "pack B", "share", "panels / block");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        const int64_t m = sh->m, n = sh->n, k = sh->k;
        /* on huge pages, as the step's arena */
        cg_real *a = cgi_alloc_large(sizeof(cg_real) * (size_t)(m * k)), *b = cgi_alloc_large(sizeof(cg_real) * (size_t)(k * n)),
                *c = cgi_alloc_large(sizeof(cg_real) * (size_t)(m * n));
        const int64_t kc = k > 512 ? (k + (k + 511) / 512 - 1) / ((k + 511) / 512) : k;
        const int64_t nblk = (n + 479) / 480, nc = ((n + nblk - 1) / nblk + u.nr - 1) / u.nr * u.nr;
        cg_real *ap = cgi_alloc_large(sizeof(cg_real) * cgi_ukr_packed_a(&u, m, kc)),
                *bp = cgi_alloc_large(sizeof(cg_real) * cgi_ukr_packed_b(&u, kc, nc));
        fill(a, m * k), fill(b, k * n);
        const int64_t rsa = sh->a_cols ? 1 : k, csa = sh->a_cols ? m : 1, rsb = sh->b_cols ? 1 : n, csb = sh->b_cols ? k : 1;
        const cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = a, .rsa = rsa, .csa = csa, .b = b, .rsb = rsb,
                                .csb = csb, .alpha = 1, .beta = 0, .c = c, .rsc = n, .csc = 1};
        double *tp = malloc(4 * sizeof(double) * (size_t)reps), *ta = tp + reps, *tb = ta + reps, *tr = tb + reps;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_cpu_now();
            cgi_gemm_many(&j, 1, 1);
            tp[r] = (bench_cpu_now() - t0) * 1e6;
            cgi_gemm_set_panels(false);
            t0 = bench_cpu_now();
            cgi_gemm_many(&j, 1, 1);
            tr[r] = tp[r] / ((bench_cpu_now() - t0) * 1e6);
            cgi_gemm_set_panels(true);
            t0 = bench_cpu_now();
            for (int64_t pc = 0; pc < k; pc += kc)
                cgi_ukr_pack_a(&u, m, k - pc < kc ? k - pc : kc, a + pc * csa, rsa, csa, ap);
            ta[r] = (bench_cpu_now() - t0) * 1e6;
            t0 = bench_cpu_now();
            for (int64_t pc = 0; pc < k; pc += kc)
                for (int64_t ic = 0; ic < n; ic += nc)
                    cgi_ukr_pack_b(&u, k - pc < kc ? k - pc : kc, n - ic < nc ? n - ic : nc, b + pc * rsb + ic * csb, rsb,
                                   csb, bp);
            tb[r] = (bench_cpu_now() - t0) * 1e6;
        }
        double pl, ph, al, ah, bl, bh, rl, rh;
        const double pm = med(tp, reps, &pl, &ph), am = med(ta, reps, &al, &ah), bm = med(tb, reps, &bl, &bh),
                     rm = med(tr, reps, &rl, &rh);
        printf("%-16s %7.0f [%4.0f,%5.0f] %7.0f [%5.0f,%5.0f] %4.2fns %7.0f [%5.0f,%5.0f] %4.2fns %6.1f%% %6.3f [%.3f,%.3f]\n",
               sh->what, pm, pl, ph, am, al, ah, 1e3 * am / (double)(m * k), bm, bl, bh, 1e3 * bm / (double)(k * n),
               100 * (am + bm) / pm, rm, rl, rh);
        free(a), free(b), free(c), free(ap), free(bp), free(tp);
    }
    return 0;
}
