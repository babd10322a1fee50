/* SPDX-License-Identifier: MIT */
/* bench_bf16_gemm: the bf16 product kernels (oneDNN's vdpbf16ps matmul and the fp32 units with
 * the operands widened as they are packed) beside cgrad's fp32 product (BLIS's micro-kernel, the
 * same driver) on 2048^3 and the zoo's linear shapes, laid out as linear lays them (forward
 * x W^T, dX = dY W, dW = dY^T X). Interleaved repetitions, medians of process CPU time, GFLOP/s.
 * Usage: bench_bf16_gemm [reps] [threads] [llama [cpu]]
 * llama: instead, a TinyLlama-1.1B LoRA step's products at 256 tokens (bench/bigload_bench.sh's),
 * each kernel in wall time (cpu: process CPU time; median, min-max, GFLOP/s), interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include "graph/internal.h"
#include "ops/bf16_internal.h"

typedef struct {
    const char *name;
    int64_t m, n, k, rsa, csa, rsb, csb;
    bool c16; /* C in bf16 with a bias (q/k/v, the FC pre-activation): one pass over k */
} shape;

/* A TinyLlama step's products at M tokens: hidden 2048, kv 256, intermediate 5632, LoRA rank 16;
 * dY converted to bf16 in place has row stride 2N. Each shape's count per step is its weight. */
enum { LM = 256, LH = 2048, LKV = 256, LI = 5632, LR = 16 };
typedef struct {
    shape s;
    int per_step;
} llama_shape;
static const llama_shape llama_shapes[] = {
    {{"fwd q,o [256,2048]x[2048,2048]^T", LM, LH, LH, LH, 1, 1, LH, false}, 44},
    {{"fwd k,v [256,2048]x[256,2048]^T", LM, LKV, LH, LH, 1, 1, LH, false}, 44},
    {{"fwd gate,up [256,2048]x[5632,2048]^T", LM, LI, LH, LH, 1, 1, LH, false}, 44},
    {{"fwd down [256,5632]x[2048,5632]^T", LM, LH, LI, LI, 1, 1, LI, false}, 22},
    {{"dX q,o [256,2048]x[2048,2048]", LM, LH, LH, 2 * LH, 1, LH, 1, false}, 44},
    {{"dX k,v [256,256]x[256,2048]", LM, LH, LKV, 2 * LKV, 1, LH, 1, false}, 44},
    {{"dX gate,up [256,5632]x[5632,2048]", LM, LH, LI, 2 * LI, 1, LH, 1, false}, 44},
    {{"dX down [256,2048]x[2048,5632]", LM, LI, LH, 2 * LH, 1, LI, 1, false}, 22},
    {{"dX q,o dense dY", LM, LH, LH, LH, 1, LH, 1, false}, 0},
    {{"dX k,v dense dY", LM, LH, LKV, LKV, 1, LH, 1, false}, 0},
    {{"dX gate,up dense dY", LM, LH, LI, LI, 1, LH, 1, false}, 0},
    {{"dX down dense dY", LM, LI, LH, LH, 1, LI, 1, false}, 0},
    {{"lora x A^T [256,2048]x[16,2048]^T", LM, LR, LH, LH, 1, 1, LH, false}, 132},
    {{"lora low B^T [256,16]x[5632,16]^T", LM, LI, LR, LR, 1, 1, LR, false}, 44},
    {{"lora dlow [256,5632]x[5632,16]", LM, LR, LI, 2 * LI, 1, LR, 1, false}, 44},
    {{"lora dB [5632,256]x[256,16]", LI, LR, LM, 1, 2 * LI, LR, 1, false}, 44},
    {{"lora dA [16,256]x[256,2048]", LR, LH, LM, 1, LR, LH, 1, false}, 132},
};

static double flops(const shape *p) { return 2.0 * (double)p->m * (double)p->n * (double)p->k; }

/* the llama shapes, kernels 1 (oneDNN) and 2 (fp32 units), wall time (cpu: process CPU time) */
static void run_llama(int reps, bool cpu) {
    enum { NV = 2 };
    const char *names[NV] = {"oneDNN", "fp32-units"};
    const int which[NV] = {1, 2};
    const int ns = (int)(sizeof llama_shapes / sizeof *llama_shapes);
    double step_ms[NV] = {0};
    printf("# %-40s %5s  %-24s %-24s\n", "shape (GFLOP/s: median [min-max])", "/step", names[0], names[1]);
    for (int s = 0; s < ns; s++) {
        const shape *p = &llama_shapes[s].s;
        const int64_t na = (p->m - 1) * p->rsa + (p->k - 1) * p->csa + 1, nb = (p->k - 1) * p->rsb + (p->n - 1) * p->csb + 1;
        float *c = malloc((size_t)(p->m * p->n) * sizeof *c);
        cgi_bf16 *ah = malloc((size_t)na * sizeof *ah), *bh = malloc((size_t)nb * sizeof *bh);
        if (!c || !ah || !bh) exit(1);
        for (int64_t i = 0; i < na; i++) ah[i] = cgi_to_bf16((float)((i * 7919) % 201) / 100.0f - 1.0f);
        for (int64_t i = 0; i < nb; i++) bh[i] = cgi_to_bf16((float)((i * 104729) % 199) / 100.0f - 1.0f);
        double t[NV][64];
        bool ok[NV];
        for (int v = 0; v < NV; v++) ok[v] = true;
        for (int r = -2; r < reps && r < 64; r++)
            for (int v = 0; v < NV; v++) {
                const double t0 = cpu ? bench_cpu_now() : omp_get_wtime();
                ok[v] = ok[v] && cgi_lp_product(which[v], p->m, p->n, p->k, ah, p->rsa, p->csa, bh, p->rsb, p->csb, 1, 0, c,
                                                p->n, 1, NULL, false);
                if (r >= 0) t[v][r] = (cpu ? bench_cpu_now() : omp_get_wtime()) - t0;
            }
        printf("  %-40s %5d ", p->name, llama_shapes[s].per_step);
        for (int v = 0; v < NV; v++) {
            qsort(t[v], (size_t)reps, sizeof(double), bench_cmp);
            const double med = t[v][reps / 2];
            if (!ok[v]) {
                printf(" %-24s", "n/a");
                continue;
            }
            step_ms[v] += 1e3 * med * llama_shapes[s].per_step;
            printf(" %6.1f [%6.1f-%6.1f]    ", flops(p) / med / 1e9, flops(p) / t[v][reps - 1] / 1e9, flops(p) / t[v][0] / 1e9);
        }
        printf("\n");
        free(c), free(ah), free(bh);
    }
    printf("# a step's products (22 layers, without the LM head), ms:");
    for (int v = 0; v < NV; v++) printf(" %s %.0f", names[v], step_ms[v]);
    printf("\n");
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    cg_set_threads(argc > 2 ? atoi(argv[2]) : 1);
    const bool llama = argc > 3 && !strcmp(argv[3], "llama");
    const int threads = cg_threads();
    if (cg_bf16_unavailable()) {
        printf("bench_bf16_gemm: bf16 unavailable: %s\n", cg_bf16_unavailable());
        return 0;
    }
    if (reps < 1 || reps > 64) {
        fprintf(stderr, "bench_bf16_gemm: reps must be in [1, 64]\n");
        return 2;
    }
    printf("# bf16 kernel in use: %s (%s; vdpbf16ps / fp32 FMA rate %.2f, AMX tdpbf16ps / fp32 FMA %.2f), %d thread(s), "
           "%d reps\n",
           cg_bf16_kernel(), cg_bf16_kernel_why(), cg_bf16_dot_ratio(), cg_bf16_amx_ratio(), threads, reps);
    if (llama) {
        run_llama(reps, argc > 4 && !strcmp(argv[4], "cpu"));
        return 0;
    }
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
        for (int r = -1; r < reps; r++)
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
            g[v] = ok[v] ? flops(p) / t[v][reps / 2] / 1e9 : 0;
        }
        printf("  %-36s %9.1f %9.1f %9.1f %7.2f %7.2f\n", p->name, g[0], g[1], g[2], g[1] / g[0], g[2] > 0 ? g[1] / g[2] : 0);
        free(af), free(bf), free(c), free(bias), free(ah), free(bh);
    }
    return 0;
}
