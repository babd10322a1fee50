/* Every op's gradient against central differences (the table in ops/op_checks.c), and the GELU
 * derivatives at the edges of their range against the closed forms in double precision. */
#include <math.h>

#include "../cgrad.h"
#include "check.h"

/* Backward reads GELU's gate back as y / x: exact zeros, values too small for that division,
 * saturated gates on both sides. */
static void gelu_edges(bool tanh_form) {
    static const double xs[] = {0, 1e-30, -1e-30, 1e-21, -3e-6, 1e-3, 0.5, -0.5, 3, -3, 8, -8, -12, 20};
    enum { N = sizeof xs / sizeof xs[0] };
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 1, (int64_t[]){N}));
    for (int i = 0; i < N; i++) cg_data(x)[i] = (cg_real)xs[i];
    cg_tensor *y = tanh_form ? cg_gelu_tanh(g, x) : cg_gelu(g, x);
    cg_retain(y);
    cg_tensor *loss = cg_sum_all(g, y);
    cg_real got_y[N], got_dy[N];
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read(y, got_y);
    cg_read_grad(x, got_dy);
    for (int i = 0; i < N; i++) {
        const double v = (cg_real)xs[i], k = sqrt(2 / 3.14159265358979323846), u = k * (v + 0.044715 * v * v * v);
        const double want_y = tanh_form ? 0.5 * v * (1 + tanh(u)) : 0.5 * v * (1 + erf(v / sqrt(2)));
        const double want_dy = tanh_form ? 0.5 * (1 + tanh(u)) + 0.5 * v * (1 - tanh(u) * tanh(u)) * k *
                                                                   (1 + 3 * 0.044715 * v * v)
                                         : 0.5 * (1 + erf(v / sqrt(2))) + v * exp(-0.5 * v * v) / sqrt(2 * 3.14159265358979323846);
        CHECK(fabs(got_y[i] - want_y) <= 1e-6 * (1 + fabs(want_y)), "gelu%s(%g) = %.9g, want %.9g",
              tanh_form ? "_tanh" : "", xs[i], (double)got_y[i], want_y);
        CHECK(fabs(got_dy[i] - want_dy) <= 2e-6, "gelu%s'(%g) = %.9g, want %.9g", tanh_form ? "_tanh" : "", xs[i],
              (double)got_dy[i], want_dy);
    }
    cg_graph_free(g);
}

int main(void) {
    int failed = cg_gradcheck_ops(stdout, 0, NULL);
    CHECK(failed == 0, "%d gradient checks failed", failed);
    gelu_edges(false);
    gelu_edges(true);
    TEST_END();
}
