/* SPDX-License-Identifier: MIT */
/* bench_conv: convolution and pooling, forward + backward of sum(op(x) * R), each variant's graph
 * built once and run in turn (interleaved); medians with min and max. bench/conv_torch.py times the
 * same shapes in PyTorch. Usage: bench_conv [reps] [threads] [name filter]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include <cgrad/cgrad.h>

typedef struct {
    const char *name;
    int64_t x[4], w[4]; /* w[0] == 0: a pool */
    int xnd;
    bool avg;           /* a pool: avg_pool2d, else max_pool2d (2 x 2, stride 2) */
    cg_conv_opts o;
    bench_timed t;
} variant;

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 11;
    cg_set_threads(argc > 2 ? atoi(argv[2]) : 0);
    variant vs[] = {
        {.name = "conv2d 3x3 [32,16,28,28] -> 32", .x = {32, 16, 28, 28}, .w = {32, 16, 3, 3}, .xnd = 4,
         .o = {.padding = {1, 1}}},
        {.name = "conv2d patch 4x4/4 [32,1,28,28] -> 64", .x = {32, 1, 28, 28}, .w = {64, 1, 4, 4}, .xnd = 4,
         .o = {.stride = {4, 4}}},
        {.name = "conv1d causal depthwise k4 [8,256,512]", .x = {8, 256, 512}, .w = {256, 1, 4}, .xnd = 3,
         .o = {.causal = true, .groups = 256}},
        {.name = "max_pool2d 2x2 [32,32,28,28]", .x = {32, 32, 28, 28}, .xnd = 4},
        {.name = "avg_pool2d 2x2 [32,32,28,28]", .x = {32, 32, 28, 28}, .xnd = 4, .avg = true},
        /* the default CNN's layers at its batch of 128 (cgrad train --arch cnn) */
        {.name = "cnn conv 3x3 p1 [128,1,28,28] -> 32", .x = {128, 1, 28, 28}, .w = {32, 1, 3, 3}, .xnd = 4,
         .o = {.padding = {1, 1}}},
        {.name = "cnn max_pool2d 2x2 [128,32,28,28]", .x = {128, 32, 28, 28}, .xnd = 4},
        {.name = "cnn conv 3x3 p1 [128,32,14,14] -> 64", .x = {128, 32, 14, 14}, .w = {64, 32, 3, 3}, .xnd = 4,
         .o = {.padding = {1, 1}}},
        {.name = "cnn max_pool2d 2x2 [128,64,14,14]", .x = {128, 64, 14, 14}, .xnd = 4},
    };
    const char *filter = argc > 3 ? argv[3] : NULL;
    int nv = 0; /* the variants whose name holds the filter, moved to the front */
    for (int i = 0; i < (int)(sizeof vs / sizeof vs[0]); i++)
        if (!filter || strstr(vs[i].name, filter)) vs[nv++] = vs[i];
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    bench_timed ts[sizeof vs / sizeof vs[0]];
    for (int i = 0; i < nv; i++) {
        variant *v = &vs[i];
        cg_graph *g = v->t.g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = bench_input(g, "x", v->xnd, v->x, &rng, -1, 1), *y;
        if (v->w[0]) {
            cg_tensor *w = bench_input(g, "w", v->xnd, v->w, &rng, -0.3, 0.3);
            cg_tensor *b = bench_input(g, "b", 1, v->w, &rng, -0.1, 0.1);
            y = v->xnd == 4 ? cg_conv2d(g, x, w, b, &v->o) : cg_conv1d(g, x, w, b, &v->o);
        } else
            y = (v->avg ? cg_avg_pool2d : cg_max_pool2d)(g, x, (int64_t[]){2, 2}, NULL, NULL);
        v->t.loss = y ? bench_loss(g, y, bench_upstream(g, cg_ndim(y), cg_shape(y), &rng)) : NULL;
        if (!bench_ready(&v->t, "bench_conv", v->name, reps)) return 1;
        ts[i] = v->t;
    }
    bench_interleaved(nv, ts, reps);
    printf("# bench_conv: %d thread(s), %d interleaved repetitions; forward + backward of sum(op(x) * R),\n"
           "# ms: median [min, max] of wall time, then the median CPU time of all threads\n", cg_threads(), reps);
    for (int i = 0; i < nv; i++) {
        printf("%-40s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f ms\n", vs[i].name, ts[i].ms[reps / 2], ts[i].ms[0],
               ts[i].ms[reps - 1], ts[i].cpu[reps / 2]);
        bench_free(&ts[i]);
    }
    return 0;
}
