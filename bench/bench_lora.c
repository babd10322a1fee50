/* SPDX-License-Identifier: MIT */
/* bench_lora: one LoRA linear of a TinyLlama-1.1B step (rank 16, 256 tokens, the frozen weight bf16
 * read in place, a bf16 graph), forward + backward, fused into one node (lora_linear) beside the
 * composition linear + linear(scale(linear)) + add (CGRAD_LORA_UNFUSED=1); then the fused node with
 * its rank-16 products split over the threads against on one (CGRAD_LORA_SERIAL), and with its
 * backward (CGRAD_LORA_OVERLAP) and its forward (CGRAD_LORA_FWD_OVERLAP) as sequential products
 * against one parallel region. Interleaved
 * repetitions; medians and min-max of wall and process CPU time, ms.
 * Usage: bench_lora [reps] [threads] [fp32] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"

enum { M = 256, R = 16 };

typedef struct {
    const char *name;
    int64_t in, out;
} shape;

/* a graph y = linear(x, w) with w's adapter, loss sum(y * U); x needs its gradient, as in a model */
static bench_timed build(const shape *s, bool fused, cg_precision prec, cg_params **ps_out, uint16_t *wb) {
    bench_timed t = {0};
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, (int64_t[]){s->out, s->in});
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_lora_add(ps, w, R, 2.0 * R, &r);
    cg_fill_normal(cg_params_find(ps, "w.lora_B"), &r, 0, 0.02);
    if (cg_param_map(w, wb, CG_MAP_BF16) || cg_params_compact(ps)) fprintf(stderr, "bench_lora: %s\n", cg_last_error());
    if (fused) unsetenv("CGRAD_LORA_UNFUSED");
    else setenv("CGRAD_LORA_UNFUSED", "1", 1);
    t.g = cg_graph_new(CG_TRAIN);
    cg_graph_set_precision(t.g, prec);
    cg_tensor *x = bench_input(t.g, "x", 2, (int64_t[]){M, s->in}, &r, -1, 1);
    cg_tensor *y = cg_linear(t.g, x, w, NULL);
    t.loss = bench_loss(t.g, y, bench_upstream(t.g, 2, (int64_t[]){M, s->out}, &r));
    unsetenv("CGRAD_LORA_UNFUSED");
    *ps_out = ps;
    return t;
}

/* The graph's step with environment variable `var` at `off` and at `on`, interleaved: the two
 * medians with min-max and CPU time, and the CPU and wall ratios on/off. */
static void compare_env(const bench_timed *g, int reps, const char *var, const char *off, const char *on, const char *label) {
    double ms[2][64], cpu[2][64];
    for (int k = 0; k < reps && k < 64; k++)
        for (int v = 0; v < 2; v++) {
            setenv(var, v ? on : off, 1);
            const double t0 = omp_get_wtime(), c0 = bench_cpu_now();
            cg_graph_forward(g->g);
            cg_graph_backward(g->g, g->loss);
            ms[v][k] = (omp_get_wtime() - t0) * 1e3;
            cpu[v][k] = (bench_cpu_now() - c0) * 1e3;
        }
    unsetenv(var);
    const int n = reps < 64 ? reps : 64;
    for (int v = 0; v < 2; v++) {
        qsort(ms[v], (size_t)n, sizeof(double), bench_cmp);
        qsort(cpu[v], (size_t)n, sizeof(double), bench_cmp);
    }
    printf("  %-20s", label);
    for (int v = 0; v < 2; v++) printf(" %7.3f [%6.3f-%6.3f] %7.3f", ms[v][n / 2], ms[v][0], ms[v][n - 1], cpu[v][n / 2]);
    printf("   %.2f (wall %.2f)\n", cpu[1][n / 2] / cpu[0][n / 2], ms[1][n / 2] / ms[0][n / 2]);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    cg_set_threads(argc > 2 ? atoi(argv[2]) : 1);
    const bool fp32 = argc > 3 && !strcmp(argv[3], "fp32");
    const cg_precision prec = fp32 ? CG_FP32 : CG_BF16;
    if (reps < 1) return 2;
    if (!fp32 && cg_bf16_unavailable()) {
        printf("bench_lora: bf16 unavailable: %s\n", cg_bf16_unavailable());
        return 0;
    }
    const shape shapes[] = {{"q,o 2048->2048", 2048, 2048}, {"k,v 2048->256", 2048, 256},
                            {"gate,up 2048->5632", 2048, 5632}, {"down 5632->2048", 5632, 2048}};
    printf("# one LoRA linear, %d tokens, rank %d, %s, %d thread(s), %d reps: forward + backward, ms\n", M, R,
           fp32 ? "fp32" : "bf16 (weight bf16 in place)", cg_threads(), reps);
    printf("# %-20s %-28s %-28s %s\n", "shape", "composed wall [min-max] cpu", "fused wall [min-max] cpu", "cpu ratio");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        uint16_t *wb = malloc((size_t)(s->in * s->out) * sizeof *wb);
        if (!wb) return 1;
        for (int64_t j = 0; j < s->in * s->out; j++) wb[j] = (uint16_t)(0x3c00 + (j * 7919) % 512); /* ~[0.008, 0.03] */
        cg_params *ps[2];
        bench_timed t[2] = {build(s, false, prec, &ps[0], wb), build(s, true, prec, &ps[1], wb)};
        if (!bench_ready(&t[0], "bench_lora", "composed", reps) || !bench_ready(&t[1], "bench_lora", "fused", reps)) return 1;
        bench_interleaved(2, t, reps);
        printf("  %-20s", s->name);
        for (int v = 0; v < 2; v++)
            printf(" %7.3f [%6.3f-%6.3f] %7.3f", t[v].ms[reps / 2], t[v].ms[0], t[v].ms[reps - 1], t[v].cpu[reps / 2]);
        printf("   %.2f\n", t[1].cpu[reps / 2] / t[0].cpu[reps / 2]);
        /* the fused node with an environment switch off against on: its rank-16 products split over the
         * threads (CGRAD_LORA_SERIAL=0) against on one; backward, then forward, in one region or not */
        compare_env(&t[1], reps, "CGRAD_LORA_SERIAL", "0", "1", "  fused: split/serial");
        compare_env(&t[1], reps, "CGRAD_LORA_OVERLAP", "0", "1", "  fused: one-region/sequential bwd");
        compare_env(&t[1], reps, "CGRAD_LORA_FWD_OVERLAP", "0", "1", "  fused: one-region/sequential fwd");
        for (int v = 0; v < 2; v++) bench_free(&t[v]), cg_params_free(ps[v]);
        free(wb);
    }
    return 0;
}
