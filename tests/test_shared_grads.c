/* SPDX-License-Identifier: MIT */
/* A pre-LN block's residual add y = r + x, x a linear's output that nothing else reads: the plan
 * gives x's gradient y's buffer, as it gives r's (graph/plan.c), so the add copies nothing. The
 * block r = tanh(a); x = linear(gelu(linear(rmsnorm(r), w1)), w2); y = r + x; loss = sum(y * R):
 * its gradients must be, bit for bit, those of the same block with x scaled by 1 before the add (a
 * scale is no linear, so nothing is shared there, and times 1 changes no bit either way), and x's and
 * r's gradients must be one buffer. With r also read between x's linear and the add, the add's rule
 * would come before the linear has read x's gradient while that reader's adds into r's, so they
 * must not share, and the gradients must still be the reference's. Both summand orders. */
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { ROWS = 96, D = 64, LEAVES = 4 };

typedef struct {
    cg_real *v[LEAVES];
    int64_t n[LEAVES];
    bool shared, ok;
} grads;

static grads block(bool reference, bool late, bool swap) {
    grads res = {0};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 17);
    const int64_t sh[2] = {ROWS, D}, wsh[2] = {D, D}, d = D;
    cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 2, sh));
    cg_tensor *w1 = cg_requires_grad(cg_input(g, "w1", CG_REAL, 2, wsh));
    cg_tensor *w2 = cg_requires_grad(cg_input(g, "w2", CG_REAL, 2, wsh));
    cg_tensor *gain = cg_requires_grad(cg_input(g, "gain", CG_REAL, 1, &d));
    cg_tensor *R = cg_input(g, "R", CG_REAL, 2, sh);
    cg_tensor *leaves[LEAVES] = {a, w1, w2, gain};
    for (int i = 0; i < LEAVES; i++) cg_fill_uniform(leaves[i], &rng, -1, 1);
    cg_fill_uniform(R, &rng, -1, 1);
    cg_tensor *r = cg_tanh(g, a);
    cg_tensor *x = cg_linear(g, cg_gelu(g, cg_linear(g, cg_rmsnorm(g, r, gain, 1e-6), w1, NULL)), w2, NULL);
    cg_tensor *r1 = late ? cg_add_scalar(g, r, 1) : NULL; /* r read between x's linear and the add */
    cg_tensor *xs = reference ? cg_scale(g, x, 1.0) : x;
    cg_tensor *y = swap ? cg_add(g, xs, r) : cg_add(g, r, xs);
    if (late) y = cg_mul(g, y, r1);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, R));
    res.ok = loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK;
    CHECK(res.ok, "block (reference %d, late %d, swap %d): %s", reference, late, swap, cg_last_error());
    res.shared = res.ok && x->grad == r->grad;
    for (int i = 0; res.ok && i < LEAVES; i++) {
        res.n[i] = cg_numel(leaves[i]);
        res.v[i] = malloc((size_t)res.n[i] * sizeof(cg_real));
        CHECK(cg_read_grad(leaves[i], res.v[i]) == CG_OK, "%s", cg_last_error());
    }
    cg_graph_free(g);
    return res;
}

int main(void) {
    static const char *names[LEAVES] = {"a", "w1", "w2", "gain"};
    for (int late = 0; late < 2; late++)
        for (int swap = 0; swap < 2; swap++) {
            grads got = block(false, late, swap), want = block(true, late, swap);
            CHECK(got.shared == !late, "late %d swap %d: x's and r's gradients %s one buffer", late, swap,
                  got.shared ? "are" : "are not");
            for (int i = 0; got.ok && want.ok && i < LEAVES; i++) {
                int64_t bad = -1;
                for (int64_t j = 0; j < got.n[i] && bad < 0; j++)
                    if (memcmp(&got.v[i][j], &want.v[i][j], sizeof(cg_real))) bad = j;
                CHECK(bad < 0, "late %d swap %d: %s's gradient [%lld] = %.9g, the reference's %.9g", late, swap, names[i],
                      (long long)bad, bad < 0 ? 0.0 : (double)got.v[i][bad], bad < 0 ? 0.0 : (double)want.v[i][bad]);
            }
            for (int i = 0; i < LEAVES; i++) free(got.v[i]), free(want.v[i]);
        }
    TEST_END();
}
