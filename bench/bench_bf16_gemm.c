/* SPDX-License-Identifier: MIT */
/* bench_bf16_gemm: the two bf16 product kernels (oneDNN's vdpbf16ps matmul and the fp32 units with
 * the operands widened as they are packed) beside cgrad's fp32 product (BLIS's micro-kernel, the
 * same driver) on 2048^3 and the zoo's linear shapes, laid out as linear lays them (forward
 * x W^T, dX = dY W, dW = dY^T X). Interleaved repetitions, medians of process CPU time, GFLOP/s.
 * Usage: bench_bf16_gemm [reps] [threads]. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include "graph/internal.h"
#include "ops/bf16_internal.h"

typedef struct {
    const char *name;
    int64_t m, n, k, rsa, csa, rsb, csb;
    bool c16; /* C in bf16 with a bias (q/k/v, the FC pre-activation): one pass over k */
} shape;

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    cg_set_threads(argc > 2 ? atoi(argv[2]) : 1);
    const int threads = cg_threads();
    if (cg_bf16_unavailable()) {
        printf("bench_bf16_gemm: bf16 unavailable: %s\n", cg_bf16_unavailable());
        return 0;
    }
    printf("# bf16 kernel in use: %s (%s; vdpbf16ps / fp32 FMA rate %.2f, AMX tdpbf16ps / fp32 FMA %.2f), %d thread(s), "
           "%d reps\n",
           cg_bf16_kernel(), cg_bf16_kernel_why(), cg_bf16_dot_ratio(), cg_bf16_amx_ratio(), threads, reps);
    for (int r = 0; r < 3; r++) { /* the peaks behind the choice, per core, again */
        double f, h, x;
        cgi_lp_peaks(&f, &h, &x);
        printf("# register-only peaks, one core: vfmadd231ps %.1f GFLOP/s, vdpbf16ps %.1f (ratio %.2f), AMX tdpbf16ps %.1f "
               "(ratio %.2f)\n",
               f / 1e9, h / 1e9, h / f, x / 1e9, x / f);
    }
    const shape shapes[] = {
        {"2048^3", 2048, 2048, 2048, 2048, 1, 2048, 1, false},
        {"fwd [1024,512]x[512,2048]^T", 1024, 2048, 512, 512, 1, 1, 512, false},
        {"fwd [4096,768]x[768,3072]^T", 4096, 3072, 768, 768, 1, 1, 768, false},
        {"fwd [4096,768]x[768,3072]^T bf16 C", 4096, 3072, 768, 768, 1, 1, 768, true},
        {"fwd [4096,3072]x[3072,768]^T", 4096, 768, 3072, 3072, 1, 1, 3072, false},
        {"fwd [4096,3072]x[3072,768]^T bf16 C", 4096, 768, 3072, 3072, 1, 1, 3072, true},
        {"dX [4096,3072]x[3072,768]", 4096, 768, 3072, 6144, 1, 768, 1, false},
        {"dW [768,4096]x[4096,3072]", 768, 3072, 4096, 1, 1536, 3072, 1, false},
        {"dW [2048,1024]x[1024,512]", 2048, 512, 1024, 1, 4096, 512, 1, false},
    };
    const int ns = (int)(sizeof shapes / sizeof *shapes);
    printf("# %-36s %9s %9s %9s %7s %7s\n", "shape (GFLOP/s, CPU time)", "sgemm", "fp32-units", "oneDNN", "u/sgemm",
           "u/dnnl");
    for (int s = 0; s < ns; s++) {
        const shape *p = &shapes[s];
        const int64_t na = (p->m - 1) * p->rsa + (p->k - 1) * p->csa + 1, nb = (p->k - 1) * p->rsb + (p->n - 1) * p->csb + 1;
        float *af = malloc((size_t)na * sizeof *af), *bf = malloc((size_t)nb * sizeof *bf);
        float *c = malloc((size_t)(p->m * p->n) * sizeof *c), *bias = calloc((size_t)p->n, sizeof *bias);
        cgi_bf16 *ah = malloc((size_t)na * sizeof *ah), *bh = malloc((size_t)nb * sizeof *bh);
        if (!af || !bf || !c || !ah || !bh) return 1;
        for (int64_t i = 0; i < na; i++) af[i] = (float)((i * 7919) % 201) / 100.0f - 1.0f, ah[i] = cgi_to_bf16(af[i]);
        for (int64_t i = 0; i < nb; i++) bf[i] = (float)((i * 104729) % 199) / 100.0f - 1.0f, bh[i] = cgi_to_bf16(bf[i]);
        double t[3][64];
        bool ok[3] = {true, true, true};
        for (int r = -1; r < reps && r < 64; r++)
            for (int v = 0; v < 3; v++) {
                const double t0 = bench_cpu_now();
                if (v == 0)
                    cgi_gemm(p->m, p->n, p->k, af, p->rsa, p->csa, bf, p->rsb, p->csb, 1, 0, c, p->n, 1, threads);
                else
                    ok[v] = ok[v] && cgi_lp_product(v == 1 ? 2 : 1, p->m, p->n, p->k, ah, p->rsa, p->csa, bh, p->rsb,
                                                    p->csb, 1, 0, c, p->n, 1, p->c16 ? bias : NULL, p->c16);
                if (r >= 0) t[v][r] = bench_cpu_now() - t0;
            }
        double g[3];
        for (int v = 0; v < 3; v++) {
            qsort(t[v], (size_t)reps, sizeof(double), bench_cmp);
            g[v] = ok[v] ? 2.0 * (double)p->m * (double)p->n * (double)p->k / t[v][reps / 2] / 1e9 : 0;
        }
        printf("  %-36s %9.1f %9.1f %9.1f %7.2f %7.2f\n", p->name, g[0], g[1], g[2], g[1] / g[0], g[2] > 0 ? g[1] / g[2] : 0);
        free(af), free(bf), free(c), free(bias), free(ah), free(bh);
    }
    return 0;
}
