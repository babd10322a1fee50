/* SPDX-License-Identifier: MIT */
/* Memory-plan time against node count: an unrolled recurrence h = tanh(h W^T + x_t), summed into a
 * loss, built for T steps (about 5 nodes a step). The first forward plans, the second reuses the
 * plan, so their difference is the planning time. Usage: bench_plan [max_nodes] (default 48000). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cgrad/cgrad.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const int max_nodes = argc > 1 ? atoi(argv[1]) : 48000;
    const int64_t d = 16, sw[2] = {16, 16}, sx[2] = {1, 16};
    cg_set_threads(1);
    printf("%8s %8s %12s %12s %10s\n", "nodes", "steps", "plan ms", "forward ms", "plan/fwd");
    for (int target = 1000; target <= max_nodes; target *= 2) {
        cg_params *ps = cg_params_new();
        cg_tensor *w = cg_params_add(ps, "w", 2, sw);
        cg_rng r;
        cg_rng_seed(&r, 1);
        cg_fill_normal(w, &r, 0, 0.3);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *h = cg_input(g, "h0", CG_REAL, 2, sx), *loss = NULL;
        int steps = 0;
        while (cg_graph_size(g) < target) {
            cg_tensor *x = cg_input(g, "x", CG_REAL, 2, sx);
            h = cg_tanh(g, cg_add(g, cg_linear(g, h, w, NULL), x));
            cg_tensor *s = cg_sum_all(g, h);
            loss = loss ? cg_add(g, loss, s) : s;
            steps++;
        }
        (void)d;
        double t0 = now();
        cg_status st = cg_graph_forward(g);
        double t1 = now();
        st = st ? st : cg_graph_forward(g);
        double t2 = now();
        if (st) {
            fprintf(stderr, "bench_plan: %s\n", cg_last_error());
            return 1;
        }
        const double plan = (t1 - t0) - (t2 - t1), fwd = t2 - t1;
        printf("%8d %8d %12.1f %12.1f %10.1f\n", cg_graph_size(g), steps, plan * 1e3, fwd * 1e3, plan / fwd);
        cg_graph_free(g);
        cg_params_free(ps);
        if (target * 2 > max_nodes && target < max_nodes) target = max_nodes / 2; /* end on max_nodes */
    }
    return 0;
}
