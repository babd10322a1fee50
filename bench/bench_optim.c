/* SPDX-License-Identifier: MIT */
/* bench_optim: the AdamW step with gradient clipping, unfused (cg_clip_grad_norm: a norm pass,
 * then a pass that rescales every gradient, then the update) against fused (cg_grad_norm, then
 * cg_optim_step_scaled, which applies the factor as it reads each gradient), and the step alone.
 * Each repetition runs every variant once in turn on its own parameter set (interleaved); medians
 * with min and max of wall and CPU ms. Usage: bench_optim [reps] [millions of parameters] [threads]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

enum { UNFUSED, FUSED, STEP_ONLY, NV };

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const double millions = argc > 2 ? atof(argv[2]) : 34;
    cg_set_threads(argc > 3 ? atoi(argv[3]) : 0);
    if (reps < 1 || !(millions > 0)) {
        fprintf(stderr, "usage: bench_optim [reps >= 1] [millions of parameters > 0] [threads]\n");
        return 1;
    }
    const char *names[NV] = {"clip, then step", "norm + fused step", "step alone"};
    /* a GPT-like mix of matrices and vectors: 12 blocks of 4 matrices and 4 vectors */
    const int64_t per = (int64_t)(millions * 1e6 / 48);
    cg_params *ps[NV];
    cg_optim *o[NV];
    double *ms[NV], *cpu[NV];
    cg_optim_config c = cg_optim_defaults(CG_OPT_ADAMW);
    c.weight_decay = 0.1;
    for (int v = 0; v < NV; v++) {
        ps[v] = cg_params_new();
        cg_rng r;
        cg_rng_seed(&r, 1);
        for (int b = 0; b < 48 && ps[v]; b++) {
            char name[32];
            snprintf(name, sizeof name, "h.%d.w", b);
            cg_tensor *w = cg_params_add(ps[v], name, 2, (int64_t[]){per / 768 > 0 ? per / 768 : 1, 768});
            snprintf(name, sizeof name, "h.%d.b", b);
            cg_tensor *bias = cg_params_add(ps[v], name, 1, (int64_t[]){768});
            if (!w || !bias) break;
            cg_fill_normal(w, &r, 0, 0.02);
            cg_real *g = cg_grad(w);
            for (int64_t j = 0; j < cg_numel(w); j++) g[j] = (cg_real)(0.01 * ((j * 2654435761u) % 1000) / 1000.0);
        }
        o[v] = cg_optim_new(ps[v], &c);
        ms[v] = malloc((size_t)reps * sizeof(double));
        cpu[v] = malloc((size_t)reps * sizeof(double));
        if (!o[v] || !ms[v] || !cpu[v]) {
            fprintf(stderr, "bench_optim: %s\n", cg_last_error());
            return 1;
        }
        cg_optim_decay_matrices_only(o[v], false);
    }
    const double max_norm = 1e-3; /* below the gradients' norm: every step clips */
    const int64_t span = cg_params_span(ps[0]);
    for (int k = 0; k < reps + 1; k++) /* the first round pages everything in */
        for (int v = 0; v < NV; v++) {
            /* clipping rewrote the gradients: every variant starts from backward's (untimed) */
            memcpy(cg_params_grads(ps[v]), cg_params_grads(ps[STEP_ONLY]), (size_t)span * sizeof(cg_real));
            const double t0 = omp_get_wtime(), c0 = bench_cpu_now();
            if (v == UNFUSED) {
                cg_clip_grad_norm(ps[v], max_norm);
                cg_optim_step(o[v], 1e-4);
            }
            else if (v == FUSED) cg_optim_step_scaled(o[v], 1e-4, cg_clip_scale(cg_grad_norm(ps[v]), max_norm));
            else cg_optim_step(o[v], 1e-4);
            if (k > 0) ms[v][k - 1] = (omp_get_wtime() - t0) * 1e3, cpu[v][k - 1] = (bench_cpu_now() - c0) * 1e3;
        }
    printf("# bench_optim: %.1fM parameters, AdamW, %d thread(s), %d interleaved repetitions; ms: median [min, max]\n"
           "# of wall time, then the median CPU time of all threads\n",
           (double)cg_params_numel(ps[0]) / 1e6, cg_threads(), reps);
    for (int v = 0; v < NV; v++) {
        qsort(ms[v], (size_t)reps, sizeof(double), bench_cmp);
        qsort(cpu[v], (size_t)reps, sizeof(double), bench_cmp);
        printf("%-20s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f ms\n", names[v], ms[v][reps / 2], ms[v][0], ms[v][reps - 1],
               cpu[v][reps / 2]);
        cg_optim_free(o[v]);
        cg_params_free(ps[v]);
        free(ms[v]);
        free(cpu[v]);
    }
    return 0;
}
