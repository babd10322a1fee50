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

/* ---- activations against their closed forms in double precision, value and derivative ---- */

typedef cg_tensor *(*act_fn)(cg_graph *g, cg_tensor *x);
static cg_tensor *act_silu(cg_graph *g, cg_tensor *x) { return cg_silu(g, x); }
static cg_tensor *act_softplus(cg_graph *g, cg_tensor *x) { return cg_softplus(g, x, 2.0); }
static cg_tensor *act_elu(cg_graph *g, cg_tensor *x) { return cg_elu(g, x, 0.7); }
static cg_tensor *act_leaky(cg_graph *g, cg_tensor *x) { return cg_leaky_relu(g, x, 0.01); }
static cg_tensor *act_abs(cg_graph *g, cg_tensor *x) { return cg_abs(g, x); }
static cg_tensor *act_clamp(cg_graph *g, cg_tensor *x) { return cg_clamp(g, x, -1, 2); }

static double sig(double v) { return 1 / (1 + exp(-v)); }

/* want[0] = f(v), want[1] = f'(v) */
static void act_want(int k, double v, double *w) {
    switch (k) {
    case 0: w[0] = v * sig(v), w[1] = sig(v) * (1 + v * (1 - sig(v))); break;
    case 1: w[0] = 2 * v > 20 ? v : log1p(exp(2 * v)) / 2, w[1] = 2 * v > 20 ? 1 : sig(2 * v); break;
    case 2: w[0] = v > 0 ? v : 0.7 * expm1(v), w[1] = v > 0 ? 1 : 0.7 * exp(v); break;
    case 3: w[0] = v > 0 ? v : 0.01 * v, w[1] = v > 0 ? 1 : 0.01; break;
    case 4: w[0] = fabs(v), w[1] = v > 0 ? 1 : v < 0 ? -1 : 0; break;
    default: w[0] = v < -1 ? -1 : v > 2 ? 2 : v, w[1] = v < -1 || v > 2 ? 0 : 1; break;
    }
}

static void activation_values(void) {
    static const double xs[] = {0, -0, 1e-8, -1e-8, 0.5, -0.5, -1, 2, 3, -3, 9.99, 10.5, -20, 30, -90, 1e-30};
    enum { N = sizeof xs / sizeof xs[0] };
    const act_fn fs[] = {act_silu, act_softplus, act_elu, act_leaky, act_abs, act_clamp};
    const char *names[] = {"silu", "softplus(beta 2)", "elu(0.7)", "leaky_relu(0.01)", "abs", "clamp(-1, 2)"};
    for (int k = 0; k < 6; k++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 1, (int64_t[]){N}));
        for (int i = 0; i < N; i++) cg_data(x)[i] = (cg_real)xs[i];
        cg_tensor *y = cg_retain(fs[k](g, x));
        cg_tensor *loss = cg_sum_all(g, y);
        CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
        cg_real got_y[N], got_d[N];
        cg_read(y, got_y);
        cg_read_grad(x, got_d);
        for (int i = 0; i < N; i++) {
            double w[2];
            act_want(k, (double)(cg_real)xs[i], w);
            CHECK(fabs(got_y[i] - w[0]) <= 2e-6 * (1 + fabs(w[0])), "%s(%g) = %.9g, want %.9g", names[k], xs[i],
                  (double)got_y[i], w[0]);
            CHECK(fabs(got_d[i] - w[1]) <= 2e-6, "%s'(%g) = %.9g, want %.9g", names[k], xs[i], (double)got_d[i], w[1]);
        }
        cg_graph_free(g);
    }
}

/* minimum and maximum pick values, split the gradient on ties, and where picks by its condition. */
static void selection_values(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 1, (int64_t[]){4}));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 1, (int64_t[]){4}));
    cg_tensor *c = cg_input(g, "c", CG_INT32, 1, (int64_t[]){4});
    const cg_real av[4] = {1, 2, 3, -1}, bv[4] = {2, 2, -5, -1};
    const int32_t cv[4] = {1, 0, 0, 7};
    cg_write(a, av), cg_write(b, bv), cg_write_ids(c, cv);
    cg_tensor *mn = cg_retain(cg_minimum(g, a, b)), *mx = cg_retain(cg_maximum(g, a, b));
    cg_tensor *wh = cg_retain(cg_where(g, c, a, b));
    /* loss = sum(min) + 10 sum(max) + 100 sum(where): each gradient part stands apart */
    cg_tensor *loss = cg_add(g, cg_add(g, cg_sum_all(g, mn), cg_scale(g, cg_sum_all(g, mx), 10)),
                             cg_scale(g, cg_sum_all(g, wh), 100));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_real v[3][4], ga[4], gb[4];
    cg_read(mn, v[0]), cg_read(mx, v[1]), cg_read(wh, v[2]);
    cg_read_grad(a, ga), cg_read_grad(b, gb);
    const cg_real want[3][4] = {{1, 2, -5, -1}, {2, 2, 3, -1}, {1, 2, -5, -1}};
    const cg_real want_ga[4] = {1 + 100, 5.5, 10, 5.5 + 100}, want_gb[4] = {10, 5.5 + 100, 1 + 100, 5.5};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 3; k++) CHECK(v[k][i] == want[k][i], "op %d at %d: %g, want %g", k, i, (double)v[k][i], (double)want[k][i]);
        CHECK(ga[i] == want_ga[i], "d/da at %d: %g, want %g", i, (double)ga[i], (double)want_ga[i]);
        CHECK(gb[i] == want_gb[i], "d/db at %d: %g, want %g", i, (double)gb[i], (double)want_gb[i]);
    }
    cg_graph_free(g);
}

int main(void) {
    int failed = cg_gradcheck_ops(stdout, 0, NULL);
    CHECK(failed == 0, "%d gradient checks failed", failed);
    gelu_edges(false);
    gelu_edges(true);
    activation_values();
    selection_values();
    TEST_END();
}
