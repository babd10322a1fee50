/* SPDX-License-Identifier: MIT */
/* bench_gelu: the fused linear + GELU's elementwise passes of one training step (ops/elementwise.c),
 * per form, over c[rows, cols] with a bias: forward's value (the plan remakes it later), the remake
 * with backward's derivative beside it, backward's dpre = dy * gelu' with the bias gradient's column
 * sums, and for comparison forward's pass when the plan keeps the value (value and derivative) and
 * backward from the product alone (erf stores no derivative: its "value + derivative" passes make
 * the value only and both its backward rows read the gate back from the output). One repetition runs every pass once in turn (interleaved, so
 * machine load hits all alike); each pass's input is restored before it, untimed. Reports the median
 * thread-CPU ms per pass with the min and max. Usage: bench_gelu [reps] [rows] [cols] [threads]
 * (default 31 repetitions over gpt-tiny's [4096, 1024] on 1 thread). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include "graph/internal.h"

enum { FWD, FWD_DERIV, REMAKE, BWD, BWD_FROM_PRODUCT, NPASS };
static const char *pass_name[NPASS] = {"forward (value)", "forward (value + derivative)", "remake (value + derivative)",
                                       "backward (dy * stored derivative)", "backward (from the product)"};

typedef struct {
    cg_real *c0, *c, *b, *y, *dy, *db, *scratch, *d0; /* d0: the derivative, as the remake leaves c */
    int64_t m, n;
} bufs;

static void run_pass(const bufs *k, int pass, bool tanh_form) {
    const cgi_act act = tanh_form ? CGI_ACT_GELU_TANH : CGI_ACT_GELU;
    switch (pass) {
    case FWD: cgi_bias_gelu_fwd(k->c, k->b, k->y, k->m, k->n, tanh_form, false); break;
    case FWD_DERIV:
    case REMAKE: cgi_bias_gelu_fwd(k->c, k->b, k->y, k->m, k->n, tanh_form, true); break;
    case BWD: cgi_bias_act_bwd(k->c, k->b, k->y, k->dy, k->m, k->n, act, true, k->db, k->scratch); break;
    default: cgi_bias_act_bwd(k->c, k->b, k->y, k->dy, k->m, k->n, act, false, k->db, k->scratch); break;
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 31;
    const int64_t m = argc > 2 ? atoll(argv[2]) : 4096, n = argc > 3 ? atoll(argv[3]) : 1024;
    cg_set_threads(argc > 4 ? atoi(argv[4]) : 1);
    if (reps < 1 || m < 1 || n < 1) {
        fprintf(stderr, "usage: bench_gelu [reps >= 1] [rows >= 1] [cols >= 1] [threads]\n");
        return 2;
    }
    const size_t mn = (size_t)(m * n);
    bufs k = {malloc(mn * sizeof(cg_real)), malloc(mn * sizeof(cg_real)), malloc((size_t)n * sizeof(cg_real)),
              malloc(mn * sizeof(cg_real)), malloc(mn * sizeof(cg_real)), malloc((size_t)n * sizeof(cg_real)),
              malloc(cgi_colsum_scratch(m, n) * sizeof(cg_real)), malloc(mn * sizeof(cg_real)), m, n};
    double *ms = malloc((size_t)(2 * NPASS * reps) * sizeof *ms);
    if (!k.c0 || !k.c || !k.b || !k.y || !k.dy || !k.db || !k.scratch || !k.d0 || !ms) return 1;
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    for (size_t i = 0; i < mn; i++) k.c0[i] = (cg_real)(cg_rng_normal(&rng) * 1.5), k.dy[i] = (cg_real)(cg_rng_uniform(&rng) - 0.5);
    for (int64_t j = 0; j < n; j++) k.b[j] = (cg_real)(cg_rng_uniform(&rng) * 0.2 - 0.1);
    for (int r = 0; r < reps; r++)
        for (int f = 0; f < 2; f++) {
            memcpy(k.d0, k.c0, mn * sizeof(cg_real));
            cgi_bias_gelu_fwd(k.d0, k.b, k.y, m, n, f, true);
            for (int p = 0; p < NPASS; p++) {
                memcpy(k.c, p == BWD ? k.d0 : k.c0, mn * sizeof(cg_real));
                memset(k.db, 0, (size_t)n * sizeof(cg_real));
                const double t0 = omp_get_wtime(), c0 = bench_cpu_now();
                run_pass(&k, p, f);
                const double wall = (omp_get_wtime() - t0) * 1e3, cpu = (bench_cpu_now() - c0) * 1e3;
                ms[(f * NPASS + p) * reps + r] = cg_threads() == 1 ? cpu : wall;
            }
        }
    double load = -1; /* the 1-minute load average, from Linux's /proc/loadavg */
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf && fscanf(lf, "%lf", &load) != 1) load = -1;
    if (lf) fclose(lf);
    printf("# bench_gelu: c[%lld, %lld] + bias, %d thread(s), %d interleaved repetitions, load %.2f; ms per pass:\n"
           "# median [min, max] of %s\n",
           (long long)m, (long long)n, cg_threads(), reps, load, cg_threads() == 1 ? "the process CPU time" : "wall time");
    for (int f = 0; f < 2; f++)
        for (int p = 0; p < NPASS; p++) {
            double *v = ms + (f * NPASS + p) * reps;
            qsort(v, (size_t)reps, sizeof *v, bench_cmp);
            printf("%-10s %-36s %7.3f [%7.3f, %7.3f]\n", f ? "gelu_tanh" : "gelu", pass_name[p], v[reps / 2], v[0],
                   v[reps - 1]);
        }
    return 0;
}
