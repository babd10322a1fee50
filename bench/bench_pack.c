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
 * block). Beside each repetition, the micro-kernel alone on operands in cache (one 12-row panel
 * against 384 columns, depth 256: the product engine's ceiling on this CPU), and each product's
 * rate as a share of it (the median of the per-repetition ratios); the last shape is the 2048^3
 * product that `cgrad bench` takes its sgemm fraction against. Usage: bench_pack [reps]. */
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

/* The micro-kernel alone over packed operands that stay in L1 and L2 (an A panel of u->mr rows
 * against KN columns of B, depth KK): CPU seconds for KREPS calls, and their multiply-adds. */
enum { KK = 256, KN = 384, KREPS = 200 };
typedef struct {
    cg_real *a, *b, *c;
} ceiling;
static double ceiling_run(const cgi_ukr *u, const ceiling *z) {
    const double t0 = bench_cpu_now();
    for (int r = 0; r < KREPS; r++)
        cgi_ukr_gemm(u, u->mr, KN, KK, 1, z->a, KK, z->b, KK, 0, z->c, KN, 1, CGI_UKR_FULL, CGI_UKR_FULL);
    return bench_cpu_now() - t0;
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
        {"2048^3 (sgemm)", 2048, 2048, 2048, false, false}, /* cgrad bench's reference product */
    };
    cgi_ukr u;
    cgi_ukr_init(&u);
    const size_t ka = cgi_ukr_packed_a(&u, u.mr, KK), kb = cgi_ukr_packed_b(&u, KK, KN);
    ceiling z = {cgi_alloc_large(sizeof(cg_real) * ka), cgi_alloc_large(sizeof(cg_real) * kb),
                 cgi_alloc_large(sizeof(cg_real) * (size_t)(u.mr * KN))};
    fill(z.a, (int64_t)ka), fill(z.b, (int64_t)kb);
    const double kernel_flops = 2.0 * (double)u.mr * KN * KK * KREPS;
    printf("# bench_pack: 1 thread, %d interleaved repetitions, CPU us: median [min, max]; packs as the blocked driver\n",
           reps);
    printf("%-16s %18s %24s %24s %7s %21s %8s %9s\n", "shape", "product", "pack A", "pack B", "share", "panels / block",
           "GFLOP/s", "of kernel");
    double *kall = malloc(sizeof(double) * (size_t)reps * (sizeof shapes / sizeof shapes[0]));
    int nk = 0;
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
        double *tp = malloc(5 * sizeof(double) * (size_t)reps), *ta = tp + reps, *tb = ta + reps, *tr = tb + reps,
               *tk = tr + reps;
        for (int r = 0; r < reps; r++) {
            double t0 = bench_cpu_now();
            cgi_gemm_many(&j, 1, 1);
            tp[r] = (bench_cpu_now() - t0) * 1e6;
            const double kernel_rate = kernel_flops / ceiling_run(&u, &z);
            kall[nk++] = kernel_rate / 1e9;
            tk[r] = 2.0 * (double)(m * n * k) / (tp[r] * 1e-6) / kernel_rate;
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
        double pl, ph, al, ah, bl, bh, rl, rh, kl, kh;
        const double pm = med(tp, reps, &pl, &ph), am = med(ta, reps, &al, &ah), bm = med(tb, reps, &bl, &bh),
                     rm = med(tr, reps, &rl, &rh), km = med(tk, reps, &kl, &kh);
        printf("%-16s %7.0f [%4.0f,%5.0f] %7.0f [%5.0f,%5.0f] %4.2fns %7.0f [%5.0f,%5.0f] %4.2fns %6.1f%% %6.3f [%.3f,%.3f] "
               "%8.1f %9.3f\n",
               sh->what, pm, pl, ph, am, al, ah, 1e3 * am / (double)(m * k), bm, bl, bh, 1e3 * bm / (double)(k * n),
               100 * (am + bm) / pm, rm, rl, rh, 2e-3 * (double)(m * n * k) / pm, km);
        free(a), free(b), free(c), free(ap), free(bp), free(tp);
    }
    double kl, kh;
    const double km = med(kall, nk, &kl, &kh);
    printf("micro-kernel in cache (%lld x %d tiles of depth %d, beside each product): %.1f GFLOP/s [%.1f, %.1f]\n",
           (long long)u.mr, KN, KK, km, kl, kh);
    free(kall), free(z.a), free(z.b), free(z.c);
    return 0;
}
