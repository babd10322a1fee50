/* SPDX-License-Identifier: MIT */
/* bench_linear: an encdec-base layer's linears, forward + backward, against the same run's 2048^3
 * product (issue 11: the model's FLOPs against a large sgemm). The chain x[1024, 512] -> linear
 * 512 -> 512 (attention's output) -> linear_relu 512 -> 2048 -> linear 2048 -> 512 (the FFN) ->
 * linear 512 -> 1536 (q/k/v as one product), every input and weight needing a gradient, loss
 * sum(y * R); the reference is y = A @ B, [2048, 2048] each, forward only. One repetition runs
 * both once in turn (interleaved); medians with min and max of the CPU time, and GFLOP/s.
 * Usage: bench_linear [reps] [rows] [threads] [only: 1 the linears, 2 the reference; for perf]. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

static double gflops(double flop, double ms) { return flop / (ms * 1e6); }

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const int64_t m = argc > 2 ? atoll(argv[2]) : 1024, d = 512, ff = 2048, r = 2048;
    cg_set_threads(argc > 3 ? atoi(argv[3]) : 1);
    const int only = argc > 4 ? atoi(argv[4]) : 0;
    if (reps < 1 || m < 1) {
        fprintf(stderr, "usage: bench_linear [reps >= 1] [rows >= 1] [threads]\n");
        return 1;
    }
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    /* the linears */
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t sx[2] = {m, d}, so[2] = {d, d}, su[2] = {ff, d}, sd[2] = {d, ff}, sq[2] = {3 * d, d},
                  sy[2] = {m, 3 * d};
    cg_tensor *x = bench_input(g, "x", 2, sx, &rng, -1, 1);
    cg_tensor *wo = bench_input(g, "wo", 2, so, &rng, -0.05, 0.05), *bo = bench_input(g, "bo", 1, &d, &rng, -0.1, 0.1);
    cg_tensor *wu = bench_input(g, "wu", 2, su, &rng, -0.05, 0.05), *bu = bench_input(g, "bu", 1, &ff, &rng, -0.1, 0.1);
    cg_tensor *wd = bench_input(g, "wd", 2, sd, &rng, -0.03, 0.03), *bd = bench_input(g, "bd", 1, &d, &rng, -0.1, 0.1);
    const int64_t d3 = 3 * d;
    cg_tensor *wq = bench_input(g, "wq", 2, sq, &rng, -0.05, 0.05), *bq = bench_input(g, "bq", 1, &d3, &rng, -0.1, 0.1);
    cg_tensor *h = cg_linear(g, x, wo, bo);
    h = cg_linear(g, cg_linear_relu(g, h, wu, bu), wd, bd);
    cg_tensor *y = cg_linear(g, h, wq, bq);
    bench_timed lin = {g, bench_loss(g, y, bench_upstream(g, 2, sy, &rng)), NULL, NULL};
    if (!bench_ready(&lin, "bench_linear", "linears", reps)) return 1;
    const double lin_flop = 6.0 * (double)m * (double)(d * d + 2 * d * ff + d * 3 * d);
    /* the reference */
    cg_graph *gr = cg_graph_new(CG_EVAL);
    const int64_t sr[2] = {r, r};
    cg_tensor *a = cg_input(gr, "a", CG_REAL, 2, sr), *b = cg_input(gr, "b", CG_REAL, 2, sr);
    cg_fill_uniform(a, &rng, -1, 1), cg_fill_uniform(b, &rng, -1, 1);
    cg_tensor *c = cg_matmul(gr, a, b);
    if (!c || cg_graph_forward(gr)) {
        fprintf(stderr, "bench_linear: reference: %s\n", cg_last_error());
        return 1;
    }
    const double ref_flop = 2.0 * (double)r * (double)r * (double)r;
    double *ref = malloc((size_t)reps * sizeof *ref);
    for (int k = 0; k < reps; k++) {
        double c0 = bench_cpu_now();
        if (only != 1) cg_graph_forward(gr);
        ref[k] = (bench_cpu_now() - c0) * 1e3;
        c0 = bench_cpu_now();
        if (only != 2) cg_graph_forward(g), cg_graph_backward(g, lin.loss);
        lin.cpu[k] = (bench_cpu_now() - c0) * 1e3;
    }
    qsort(ref, (size_t)reps, sizeof *ref, bench_cmp);
    qsort(lin.cpu, (size_t)reps, sizeof *lin.cpu, bench_cmp);
    const int h2 = reps / 2;
    printf("# bench_linear: %d thread(s), %d interleaved repetitions, CPU ms: median [min, max]\n", cg_threads(), reps);
    printf("linears fwd+bwd  %8.2f [%7.2f, %7.2f] ms  %6.1f GFLOP/s (%.2f GFLOP, loss included)\n", lin.cpu[h2],
           lin.cpu[0], lin.cpu[reps - 1], gflops(lin_flop, lin.cpu[h2]), lin_flop * 1e-9);
    printf("2048^3 reference %8.2f [%7.2f, %7.2f] ms  %6.1f GFLOP/s\n", ref[h2], ref[0], ref[reps - 1],
           gflops(ref_flop, ref[h2]));
    printf("ratio            %8.3f (of the minima %.3f)\n", gflops(lin_flop, lin.cpu[h2]) / gflops(ref_flop, ref[h2]),
           gflops(lin_flop, lin.cpu[0]) / gflops(ref_flop, ref[0]));
    free(ref);
    bench_free(&lin);
    cg_graph_free(gr);
    return 0;
}
