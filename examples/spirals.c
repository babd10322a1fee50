/* SPDX-License-Identifier: MIT */
/* spirals: two interleaved spirals classified by a 2 -> 64 -> 64 -> 2 MLP built from ops alone.
 *
 * The point of this example is the training-loop pattern: the graph is built ONCE with input
 * leaves as placeholders, and every step only writes new data into them (cg_write,
 * cg_write_ids) and re-runs forward and backward, so the loop allocates nothing. The
 * optimizer is SGD with momentum written inline over the parameters.
 *
 * Exits 0 only when training accuracy reaches 100% and a fresh held-out sample scores >= 95%.
 * Define SPIRALS_NO_MAIN to include this file and call spirals_train yourself (the test does). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cgrad/cgrad.h>

enum { PER_CLASS = 200, N = 2 * PER_CLASS, HIDDEN = 64, BATCH = 80, MAX_STEPS = 20000, EVAL_EVERY = 50 };

typedef struct {
    int steps;                  /* SGD steps taken (MAX_STEPS if 100% was never reached) */
    double loss;                /* loss of the last mini-batch */
    double train_acc, test_acc; /* fractions in [0, 1] */
} spirals_result;

/* per_class points per class into x[2 * per_class][2] and y: each arm makes 2 turns while its
 * radius grows from 0.1 to 1; class 1 is class 0 turned by half a turn. The centre is left out
 * so the two classes never touch, which makes 100% training accuracy a fair demand. */
static void spirals_data(cg_rng *r, int per_class, cg_real *x, int32_t *y) {
    const double pi = 3.14159265358979323846, noise = 0.02;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < per_class; i++) {
            double u = cg_rng_uniform(r), radius = 0.1 + 0.9 * u, angle = 2 * 2 * pi * u + c * pi;
            int k = c * per_class + i;
            x[2 * k] = (cg_real)(radius * cos(angle) + noise * cg_rng_normal(r));
            x[2 * k + 1] = (cg_real)(radius * sin(angle) + noise * cg_rng_normal(r));
            y[k] = c;
        }
}

/* Adds the MLP to g on top of x[B, 2]; returns logits[B, 2] (NULL if any op failed). */
static cg_tensor *mlp(cg_graph *g, cg_params *ps, cg_tensor *x) {
    cg_tensor *h = cg_tanh(g, cg_linear(g, x, cg_params_find(ps, "fc1.w"), cg_params_find(ps, "fc1.b")));
    h = cg_tanh(g, cg_linear(g, h, cg_params_find(ps, "fc2.w"), cg_params_find(ps, "fc2.b")));
    return cg_linear(g, h, cg_params_find(ps, "fc3.w"), cg_params_find(ps, "fc3.b"));
}

/* Fraction of the n points whose argmax logit matches y, re-running the eval graph on new data. */
static double accuracy(cg_graph *g, cg_tensor *x_in, cg_tensor *logits, const cg_real *x, const int32_t *y,
                       int n, cg_real *scratch) {
    if (cg_write(x_in, x) || cg_graph_forward(g) || cg_read(logits, scratch)) return -1;
    int hits = 0;
    for (int i = 0; i < n; i++) hits += (scratch[2 * i + 1] > scratch[2 * i]) == (y[i] == 1);
    return (double)hits / n;
}

/* Trains from seed until 100% training accuracy or MAX_STEPS; prints progress if verbose.
 * Returns CG_OK and fills *res, or a failure status with cg_last_error() set. */
static cg_status spirals_train(uint64_t seed, bool verbose, spirals_result *res) {
    cg_real train_x[N * 2], test_x[N * 2], batch_x[BATCH * 2], scratch[N * 2];
    int32_t train_y[N], test_y[N], batch_y[BATCH], order[N];
    cg_rng rng;
    cg_rng_seed(&rng, seed);
    spirals_data(&rng, PER_CLASS, train_x, train_y);
    spirals_data(&rng, PER_CLASS, test_x, test_y); /* fresh points never seen in training */

    /* Parameters live in cg_params, outside any graph, so both graphs below share them. */
    cg_params *ps = cg_params_new();
    const int dims[4] = {2, HIDDEN, HIDDEN, 2};
    for (int l = 0; l < 3; l++) {
        char wname[16], bname[16];
        snprintf(wname, sizeof wname, "fc%d.w", l + 1);
        snprintf(bname, sizeof bname, "fc%d.b", l + 1);
        /* PyTorch's nn.Linear default, except the first layer's weights are 8x larger: with inputs
         * in [-1, 1] the default makes nearly linear tanh features, and plain SGD then needs about
         * ten times more steps to grow the sharp ones the spiral arms need. */
        double bound = (l == 0 ? 8.0 : 1.0) / sqrt(dims[l]);
        cg_fill_uniform(cg_params_add(ps, wname, 2, (int64_t[]){dims[l + 1], dims[l]}), &rng, -bound, bound);
        cg_fill_uniform(cg_params_add(ps, bname, 1, (int64_t[]){dims[l + 1]}), &rng, -bound, bound);
    }

    /* Build each graph once. Ops return NULL on error and pass NULL along, so one check suffices. */
    cg_graph *train = cg_graph_new(CG_TRAIN), *eval = cg_graph_new(CG_EVAL);
    cg_tensor *xb = cg_input(train, "x", CG_REAL, 2, (int64_t[]){BATCH, 2});
    cg_tensor *yb = cg_input(train, "y", CG_INT32, 1, (int64_t[]){BATCH});
    cg_tensor *loss = cg_cross_entropy(train, mlp(train, ps, xb), yb, -1);
    cg_tensor *xe = cg_input(eval, "x", CG_REAL, 2, (int64_t[]){N, 2});
    cg_tensor *logits = mlp(eval, ps, xe);
    /* Momentum is per element of every parameter; index it by a running offset, not by the
     * position in cg_params_values, whose block pads each tensor to an aligned start. */
    cg_real *velocity = calloc((size_t)cg_params_numel(ps), sizeof *velocity);
    cg_status st = !loss || !logits ? CG_ERR_SHAPE : !velocity ? CG_ERR_NOMEM : CG_OK;

    const double lr = 0.1, momentum = 0.9;
    *res = (spirals_result){0};
    for (int i = 0; i < N; i++) order[i] = i;
    for (int step = 1; st == CG_OK && step <= MAX_STEPS; step++) {
        int at = (step - 1) * BATCH % N;
        if (at == 0) /* new epoch: Fisher-Yates shuffle so batches differ from epoch to epoch */
            for (int i = N - 1; i > 0; i--) {
                int j = (int)(cg_rng_next(&rng) % (uint64_t)(i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        for (int i = 0; i < BATCH; i++) {
            int k = order[at + i];
            batch_x[2 * i] = train_x[2 * k];
            batch_x[2 * i + 1] = train_x[2 * k + 1];
            batch_y[i] = train_y[k];
        }
        /* The same graph, new data: write the inputs, re-run forward and backward. */
        if ((st = cg_write(xb, batch_x)) || (st = cg_write_ids(yb, batch_y))) break;
        if ((st = cg_graph_forward(train))) break;
        cg_params_zero_grad(ps); /* backward accumulates into parameter gradients */
        if ((st = cg_graph_backward(train, loss))) break;
        int64_t off = 0;
        for (int p = 0; p < cg_params_count(ps); p++) {
            cg_tensor *t = cg_params_at(ps, p);
            cg_real *w = cg_data(t), *gr = cg_grad(t), *v = velocity + off;
            for (int64_t i = 0; i < cg_numel(t); i++) {
                v[i] = (cg_real)(momentum * v[i] + gr[i]);
                w[i] -= (cg_real)(lr * v[i]);
            }
            off += cg_numel(t);
        }
        res->steps = step;
        res->loss = cg_item(loss);
        if (step % EVAL_EVERY) continue;
        res->train_acc = accuracy(eval, xe, logits, train_x, train_y, N, scratch);
        if (verbose) printf("step %5d  loss %.4f  train accuracy %5.1f%%\n", step, res->loss, 100 * res->train_acc);
        if (res->train_acc == 1) break;
    }
    if (st == CG_OK) {
        res->train_acc = accuracy(eval, xe, logits, train_x, train_y, N, scratch);
        res->test_acc = accuracy(eval, xe, logits, test_x, test_y, N, scratch);
        if (res->train_acc < 0 || res->test_acc < 0) st = CG_ERR_STATE;
    }
    free(velocity);
    cg_graph_free(train);
    cg_graph_free(eval);
    cg_params_free(ps);
    return st;
}

#ifndef SPIRALS_NO_MAIN
int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    spirals_result r;
    cg_status st = spirals_train(seed, true, &r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st) {
        fprintf(stderr, "spirals: %s: %s\n", cg_status_name(st), cg_last_error());
        return 1;
    }
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("done: %d steps, loss %.4f, train accuracy %.1f%%, held-out accuracy %.1f%%, %.2f s on %d threads\n",
           r.steps, r.loss, 100 * r.train_acc, 100 * r.test_acc, secs, cg_threads());
    if (r.train_acc < 1 || r.test_acc < 0.95) {
        fprintf(stderr, "spirals: FAILED: need 100%% train and >= 95%% held-out accuracy\n");
        return 1;
    }
    return 0;
}
#endif
