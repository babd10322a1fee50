/* The fused linear + cross-entropy against its composite twin cross_entropy(linear(x, w, b)),
 * forward and backward, over several row chunks, with ignored rows and strided weights. */
#include <math.h>
#include <stdlib.h>

#include "../cgrad.h"
#include "check.h"

static void run(bool fused, int64_t rows, int64_t d, int64_t v, bool bias, bool wt, double *loss, cg_real **grads) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){rows, d}));
    cg_tensor *wl = cg_requires_grad(cg_input(g, "w", CG_REAL, 2, wt ? (int64_t[]){d, v} : (int64_t[]){v, d}));
    cg_tensor *b = bias ? cg_requires_grad(cg_input(g, "b", CG_REAL, 1, (int64_t[]){v})) : NULL;
    cg_fill_uniform(x, &r, -1, 1);
    cg_fill_uniform(wl, &r, -0.5, 0.5);
    if (b) cg_fill_uniform(b, &r, -1, 1);
    cg_tensor *w = wt ? cg_transpose(g, wl, 0, 1) : wl;
    cg_tensor *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){rows});
    for (int64_t i = 0; i < rows; i++) cg_idata(tg)[i] = (cg_rng_next(&r) % 10) < 3 ? -100 : (int32_t)(cg_rng_next(&r) % (uint64_t)v);
    cg_tensor *l = fused ? cg_linear_cross_entropy(g, x, w, b, tg, -100) : cg_cross_entropy(g, cg_linear(g, x, w, b), tg, -100);
    CHECK(l && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, l) == CG_OK, "%s", cg_last_error());
    *loss = cg_item(l);
    cg_tensor *leaves[3] = {x, wl, b};
    for (int i = 0; i < 3; i++) {
        grads[i] = NULL;
        if (!leaves[i]) continue;
        grads[i] = malloc((size_t)cg_numel(leaves[i]) * sizeof(cg_real));
        cg_read_grad(leaves[i], grads[i]);
    }
    cg_graph_free(g);
}

static void compare(const char *what, int64_t rows, int64_t d, int64_t v, bool bias, bool wt) {
    double la, lb;
    cg_real *ga[3], *gb[3];
    run(true, rows, d, v, bias, wt, &la, ga);
    run(false, rows, d, v, bias, wt, &lb, gb);
    CHECK(fabs(la - lb) <= 1e-5 * fabs(lb), "%s: loss %.8g vs %.8g", what, la, lb);
    const int64_t n[3] = {rows * d, v * d, v};
    for (int i = 0; i < 3; i++) {
        if (!ga[i]) continue;
        double worst = 0, big = 1e-30;
        for (int64_t k = 0; k < n[i]; k++) {
            worst = fmax(worst, fabs((double)ga[i][k] - (double)gb[i][k]));
            big = fmax(big, fabs((double)gb[i][k]));
        }
        CHECK(worst / big <= 2e-5, "%s: gradient %d differs by %g relative", what, i, worst / big);
        free(ga[i]);
        free(gb[i]);
    }
}

int main(void) {
    compare("1600 rows (about 1120 counted: 3 balanced chunks), bias", 1600, 32, 300, true, false);
    compare("600 rows (one chunk, backward reuses forward's logits), bias", 600, 32, 300, true, false);
    compare("257 rows, no bias, transposed weight view", 257, 16, 129, false, true);
    compare("40 rows, one chunk", 40, 8, 50, true, false);
    TEST_END();
}
