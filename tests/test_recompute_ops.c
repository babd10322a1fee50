/* SPDX-License-Identifier: MIT */
/* Activation checkpointing gives the gradients of the run without it, bit for bit, for every op of
 * the gradient-check table inside a segment, with the loss after the segment and with the loss
 * inside it (the loss is then the first node backward reaches, and the segment's recompute runs
 * before its rule); and for a small network whose cross-entropy ends the segment. */
#include <math.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { ROWS = 64, DIM = 8, VOCAB = 20, NGRAD = DIM * DIM + VOCAB * DIM };

/* tanh(x a^T) w^T into a loss, all of it in one segment (inside 0: the segment ends before the loss;
 * 2: backward starts from a view of the loss built after the segment); the loss and the gradients of
 * a and w to out. */
static cg_status tanh_net(int loss_op, bool ckpt, int inside, cg_real *out) {
    cg_params *ps = cg_params_new();
    cg_tensor *a = cg_params_add(ps, "a", 2, (int64_t[]){DIM, DIM}), *w = cg_params_add(ps, "w", 2, (int64_t[]){VOCAB, DIM});
    cg_rng r;
    cg_rng_seed(&r, 3);
    cg_fill_uniform(a, &r, -0.5, 0.5);
    cg_fill_uniform(w, &r, -0.5, 0.5);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){ROWS, DIM});
    cg_tensor *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){ROWS});
    cg_tensor *soft = cg_input(g, "p", CG_REAL, 2, (int64_t[]){ROWS, VOCAB});
    cg_fill_uniform(x, &r, -1, 1);
    cg_fill_uniform(soft, &r, 0, 0.1);
    for (int i = 0; i < ROWS; i++) cg_idata(tg)[i] = i % 5 == 0 ? -100 : (int32_t)(cg_rng_next(&r) % VOCAB);
    cg_checkpoint_begin(g);
    cg_tensor *h = cg_tanh(g, cg_linear(g, x, a, NULL));
    cg_tensor *lg = loss_op == 3 ? NULL : cg_linear(g, h, w, NULL), *loss = NULL;
    if (!inside) cg_checkpoint_end(g);
    switch (loss_op) {
    case 0: loss = cg_cross_entropy(g, lg, tg, -100); break;
    case 1: loss = cg_cross_entropy_soft(g, lg, soft); break;
    case 2: loss = cg_mse_loss(g, lg, soft); break;
    default: loss = cg_linear_cross_entropy(g, h, w, NULL, tg, -100); break;
    }
    if (inside) cg_checkpoint_end(g);
    if (inside == 2) loss = cg_reshape(g, loss, 1, (int64_t[]){1});
    cg_graph_set_checkpointing(g, ckpt);
    cg_params_zero_grad(ps);
    cg_status s = cg_graph_forward(g);
    if (!s) s = cg_graph_backward(g, loss);
    if (!s) s = cg_read_grad(a, out + 1);
    if (!s) s = cg_read_grad(w, out + 1 + DIM * DIM);
    if (!s) out[0] = cg_item(loss);
    cg_graph_free(g);
    cg_params_free(ps);
    return s;
}

static void losses_in_a_segment(void) {
    static const char *names[] = {"cross_entropy", "cross_entropy_soft", "mse_loss", "linear_cross_entropy"};
    for (int op = 0; op < 4; op++)
        for (int inside = 0; inside < 3; inside++) {
            cg_real ref[1 + NGRAD], got[1 + NGRAD];
            cg_status s0 = tanh_net(op, false, inside, ref), s1 = tanh_net(op, true, inside, got);
            CHECK(!s0 && !s1, "%s: %s", names[op], cg_last_error());
            double worst = 0, big = 0;
            for (int i = 0; i < 1 + NGRAD; i++) worst = fmax(worst, fabs(ref[i] - got[i])), big = fmax(big, fabs(ref[i]));
            CHECK(big > 1e-3 && memcmp(ref, got, sizeof ref) == 0,
                  "%s %s the segment: loss %.9g vs %.9g, gradients differ by %g (largest %g)", names[op],
                  inside == 2 ? "viewed after" : inside ? "inside" : "after", ref[0], got[0], worst, big);
        }
}

int main(void) {
    losses_in_a_segment();
    const int threads = cg_threads();
    for (int t = 1; t <= 2; t++) {
        cg_set_threads(t);
        int failed = cg_gradcheck_ops_checkpointed(t == 1 ? stdout : NULL, NULL);
        CHECK(failed == 0, "%d op cases differ with checkpointing on %d thread(s)", failed, t);
    }
    cg_set_threads(threads);
    TEST_END();
}
