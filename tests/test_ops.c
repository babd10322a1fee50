/* SPDX-License-Identifier: MIT */
/* Every op's gradient against central differences (the table in ops/op_checks.c), and the GELU
 * derivatives at the edges of their range against the closed forms in double precision. */
#include <math.h>
#include <string.h>

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

/* GELU's erf form over a dense grid of [-10, 10] against erf in double: the unfused op (a scalar
 * loop) and the fused linear_gelu, whose rows of 1024 run 16 lanes at a time (its pre-activations
 * are W's values, through x = I). erf's approximation is within 6e-7, so GELU within 3e-7 |x| plus
 * the rounding of its last products. */
static void gelu_grid(void) {
    enum { R = 32, V = 1024 };
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){R, R}), *w = cg_input(g, "w", CG_REAL, 2, (int64_t[]){V, R});
    for (int i = 0; i < R; i++) cg_data(x)[i * R + i] = 1;
    for (int i = 0; i < V * R; i++) cg_data(w)[i] = (cg_real)(-10 + 20.0 * i / (V * R - 1));
    cg_tensor *fused = cg_linear_gelu(g, x, w, NULL, false), *plain = cg_gelu(g, cg_linear(g, x, w, NULL));
    cg_retain(fused), cg_retain(plain);
    CHECK(fused && plain && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    double worst[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const cg_real *y = cg_data(k ? plain : fused);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < V; j++) {
                const double v = cg_data(w)[j * R + i], want = 0.5 * v * (1 + erf(v / sqrt(2)));
                const double err = fabs(y[i * V + j] - want) / (3e-7 * fabs(v) + 2e-7 * fabs(want) + 1e-38);
                worst[k] = err > worst[k] ? err : worst[k];
            }
    }
    CHECK(worst[0] <= 1 && worst[1] <= 1, "gelu over [-10, 10]: %.3g (fused) and %.3g (unfused) of the bound", worst[0],
          worst[1]);
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

/* ---- reductions, indexing and shape ops against values worked out by hand ---- */

#define S(...) ((const int64_t[]){__VA_ARGS__})

static cg_tensor *filled(cg_graph *g, int nd, const int64_t *shape, const cg_real *v) {
    cg_tensor *t = cg_input(g, "x", CG_REAL, nd, shape);
    cg_write(t, v);
    return t;
}

/* Runs g forward and compares out (n values) to want. */
static void expect(cg_graph *g, cg_tensor *out, int n, const double *want, const char *what) {
    cg_real got[64];
    CHECK(out && cg_numel(out) == n && cg_graph_forward(g) == CG_OK && cg_read(out, got) == CG_OK, "%s: %s", what,
          cg_last_error());
    if (!out || cg_numel(out) != n) return;
    for (int i = 0; i < n; i++)
        CHECK(fabs(got[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])), "%s[%d] = %.9g, want %.9g", what, i, (double)got[i],
              want[i]);
}

static void reduction_values(void) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    /* x[2,3] = [[1, 5, -2], [4, 4, 0]] */
    cg_tensor *x = filled(g, 2, S(2, 3), (const cg_real[]){1, 5, -2, 4, 4, 0});
    cg_tensor *o[8] = {cg_retain(cg_max(g, x, 1, false)), cg_retain(cg_min(g, x, 0, true)),
                       cg_retain(cg_logsumexp(g, x, 1, false)), cg_retain(cg_var(g, x, 1, false, 1)),
                       cg_retain(cg_var(g, x, 0, true, 0)), cg_retain(cg_norm(g, x, 1, true)),
                       cg_retain(cg_softmax_axis(g, x, 0)), cg_retain(cg_log_softmax_axis(g, x, 0))};
    cg_tensor *am = cg_retain(cg_argmax(g, x, 1, false)), *am0 = cg_retain(cg_argmax(g, x, 0, true));
    CHECK(cg_ndim(o[1]) == 2 && cg_dim(o[1], 0) == 1 && cg_ndim(o[0]) == 1, "keepdim shapes");
    const double l0 = log(exp(1.0) + exp(5.0) + exp(-2.0)), l1 = log(2 * exp(4.0) + 1);
    expect(g, o[0], 2, (const double[]){5, 4}, "max axis 1");
    expect(g, o[1], 3, (const double[]){1, 4, -2}, "min axis 0");
    expect(g, o[2], 2, (const double[]){l0, l1}, "logsumexp axis 1");
    expect(g, o[3], 2, (const double[]){(1.0 + 121 + 100) / 9 / 2, (16.0 / 9 * 2 + 64.0 / 9) / 2}, "var unbiased");
    expect(g, o[4], 3, (const double[]){2.25, 0.25, 1}, "var population axis 0");
    expect(g, o[5], 2, (const double[]){sqrt(30.0), sqrt(32.0)}, "norm axis 1");
    const double s0 = 1 / (1 + exp(3.0)), s1 = 1 / (1 + exp(-1.0)), s2 = 1 / (1 + exp(2.0));
    expect(g, o[6], 6, (const double[]){s0, s1, s2, 1 - s0, 1 - s1, 1 - s2}, "softmax axis 0");
    expect(g, o[7], 6, (const double[]){log(s0), log(s1), log(s2), log(1 - s0), log(1 - s1), log(1 - s2)},
           "log_softmax axis 0");
    CHECK(cg_idata(am)[0] == 1 && cg_idata(am)[1] == 0, "argmax axis 1: %d %d (a tie takes the first)", cg_idata(am)[0],
          cg_idata(am)[1]);
    CHECK(cg_idata(am0)[0] == 1 && cg_idata(am0)[1] == 0 && cg_idata(am0)[2] == 1, "argmax axis 0");
    CHECK(cg_var(g, x, 0, false, 2) == NULL && strstr(cg_last_error(), "[var]"), "var with no degrees of freedom: %s",
          cg_last_error());
    cg_graph_free(g);
}

static void index_values(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    /* x[3,2] = [[0, 1], [10, 11], [20, 21]] */
    cg_tensor *x = cg_requires_grad(filled(g, 2, S(3, 2), (const cg_real[]){0, 1, 10, 11, 20, 21}));
    cg_tensor *ix = cg_input(g, "ix", CG_INT32, 1, S(4));
    cg_write_ids(ix, (const int32_t[]){2, 0, 2, 2});
    cg_tensor *gi = cg_input(g, "gi", CG_INT32, 2, S(2, 2));
    cg_write_ids(gi, (const int32_t[]){1, 0, 2, 2});
    cg_tensor *sel = cg_retain(cg_index_select(g, x, 0, ix));
    cg_tensor *gat = cg_retain(cg_gather(g, x, 0, gi));
    cg_tensor *pad = cg_retain(cg_pad(g, x, S(1, 0), S(0, 1), 7));
    cg_tensor *st = cg_retain(cg_stack(g, 2, (cg_tensor *[]){x, x}, 1));
    cg_tensor *loss = cg_add(g, cg_sum_all(g, sel), cg_scale(g, cg_sum_all(g, gat), 100));
    expect(g, sel, 8, (const double[]){20, 21, 0, 1, 20, 21, 20, 21}, "index_select");
    expect(g, gat, 4, (const double[]){10, 1, 20, 21}, "gather");
    expect(g, pad, 12, (const double[]){7, 7, 7, 0, 1, 7, 10, 11, 7, 20, 21, 7}, "pad");
    expect(g, st, 12, (const double[]){0, 1, 0, 1, 10, 11, 10, 11, 20, 21, 20, 21}, "stack axis 1");
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_real dx[6];
    cg_read_grad(x, dx);
    const double want[6] = {1, 1 + 100, 100, 0, 3 + 100, 3 + 100}; /* row 2 picked three times */
    for (int i = 0; i < 6; i++) CHECK(dx[i] == want[i], "d x[%d] = %g, want %g", i, (double)dx[i], want[i]);
    cg_write_ids(ix, (const int32_t[]){2, 0, 3, 2});
    CHECK(cg_graph_forward(g) == CG_ERR_RANGE && strstr(cg_last_error(), "[index_select] index 3 at position 2"),
          "out-of-range index: %s", cg_last_error());
    cg_tensor *sq = cg_squeeze(g, cg_unsqueeze(g, cg_transpose(g, x, 0, 1), -1), 2);
    CHECK(sq && cg_dim(sq, 0) == 2 && cg_dim(sq, 1) == 3 && cg_strides(sq)[0] == 1 && cg_strides(sq)[1] == 2,
          "squeeze(unsqueeze(x^T)) keeps x^T's strides");
    CHECK(cg_squeeze(g, x, 0) == NULL && strstr(cg_last_error(), "[squeeze]"), "squeeze of a size-3 axis: %s",
          cg_last_error());
    cg_graph_free(g);
}

/* Softmax over rows holding NaN, infinities and large values: a NaN row is NaN throughout (the
 * polynomial exp once turned NaN into an out-of-range exponent shift, undefined behaviour), -inf
 * gives exactly 0, other rows match libm's exp. Rows of 40 reach the vectorised lanes and the tail. */
static void softmax_nonfinite(void) {
    enum { R = 3, C = 40 };
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){R, C});
    cg_tensor *y = cg_retain(cg_softmax(g, x));
    double v[R][C];
    for (int j = 0; j < C; j++) v[0][j] = 0.1 * j - 2, v[1][j] = 3.0 * j - 60, v[2][j] = 0.05 * j;
    v[0][5] = NAN, v[1][3] = -INFINITY, v[1][39] = 80, v[2][37] = NAN;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) cg_data(x)[i * C + j] = (cg_real)v[i][j];
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    for (int j = 0; j < C; j++) {
        CHECK(isnan(cg_data(y)[j]) && isnan(cg_data(y)[2 * C + j]), "softmax of a row with NaN: [%d] = %g, %g", j,
              (double)cg_data(y)[j], (double)cg_data(y)[2 * C + j]);
        double mx = -INFINITY, sum = 0;
        for (int k = 0; k < C; k++) mx = fmax(mx, v[1][k]);
        for (int k = 0; k < C; k++) sum += exp(v[1][k] - mx);
        const double want = exp(v[1][j] - mx) / sum;
        CHECK(fabs(cg_data(y)[C + j] - want) <= 1e-6 * want + 1e-30 && (j != 3 || cg_data(y)[C + j] == 0),
              "softmax row 1 [%d] = %.9g, want %.9g", j, (double)cg_data(y)[C + j], want);
    }
    cg_graph_free(g);
}

/* ---- rope: rotations worked out by hand, and the two properties the KV cache relies on ---- */

static void rope_values(void) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    /* x[1,1,2,4], both rows [1, 2, 3, 4]; theta 100 over 4 dims: frequencies 1 and 0.1; offset 3 */
    cg_tensor *x = filled(g, 4, S(1, 1, 2, 4), (const cg_real[]){1, 2, 3, 4, 1, 2, 3, 4});
    cg_rope_config half = {.theta = 100}, inter = {.theta = 100, .interleaved = true};
    cg_rope_config lin = {.theta = 100, .linear_factor = 4}, part = {.dims = 2, .theta = 100};
    cg_tensor *yh = cg_retain(cg_rope(g, x, 3, &half)), *yi = cg_retain(cg_rope(g, x, 3, &inter));
    cg_tensor *yl = cg_retain(cg_rope(g, x, 12, &lin)), *yp = cg_retain(cg_rope(g, x, 3, &part));
    double wh[8], wi[8], wp[8], wl[8];
    for (int r = 0; r < 2; r++) { /* linear factor 4 at offset 12: positions 12/4 = 3 and 13/4 */
        const double p = (12 + r) / 4.0, c0 = cos(p), s0 = sin(p), c1 = cos(0.1 * p), s1 = sin(0.1 * p);
        wl[4 * r + 0] = 1 * c0 - 3 * s0, wl[4 * r + 2] = 1 * s0 + 3 * c0;
        wl[4 * r + 1] = 2 * c1 - 4 * s1, wl[4 * r + 3] = 2 * s1 + 4 * c1;
    }
    for (int r = 0; r < 2; r++) {
        const double p = 3 + r, c0 = cos(p), s0 = sin(p), c1 = cos(0.1 * p), s1 = sin(0.1 * p);
        /* half-split pairs (0, 2) at frequency 1 and (1, 3) at 0.1 */
        wh[4 * r + 0] = 1 * c0 - 3 * s0, wh[4 * r + 2] = 1 * s0 + 3 * c0;
        wh[4 * r + 1] = 2 * c1 - 4 * s1, wh[4 * r + 3] = 2 * s1 + 4 * c1;
        /* interleaved pairs (0, 1) at frequency 1 and (2, 3) at 0.1 */
        wi[4 * r + 0] = 1 * c0 - 2 * s0, wi[4 * r + 1] = 1 * s0 + 2 * c0;
        wi[4 * r + 2] = 3 * c1 - 4 * s1, wi[4 * r + 3] = 3 * s1 + 4 * c1;
        /* 2 rotated dims: the pair (0, 1) at frequency 1, features 2 and 3 untouched */
        wp[4 * r + 0] = 1 * c0 - 2 * s0, wp[4 * r + 1] = 1 * s0 + 2 * c0, wp[4 * r + 2] = 3, wp[4 * r + 3] = 4;
    }
    expect(g, yh, 8, wh, "rope half-split");
    expect(g, yi, 8, wi, "rope interleaved");
    expect(g, yl, 8, wl, "rope linear factor 4 at offset 12");
    expect(g, yp, 8, wp, "rope over 2 of 4 dims");
    cg_graph_free(g);

    /* the KV cache: rotating positions [4, 9) with offset 4 gives the tail of rotating [0, 9); and
     * scores depend on relative position only: q.k at (m, n) equals q.k at (m + 5, n + 5) */
    g = cg_graph_new(CG_EVAL);
    cg_rng rng;
    cg_rng_seed(&rng, 9);
    cg_tensor *full = cg_input(g, "full", CG_REAL, 4, S(1, 2, 9, 8));
    cg_fill_uniform(full, &rng, -1, 1);
    cg_rope_config llama = {.theta = 10000};
    cg_tensor *all = cg_retain(cg_rope(g, full, 0, &llama));
    cg_tensor *tail = cg_retain(cg_rope(g, cg_slice(g, full, 2, 4, 9), 4, &llama));
    cg_tensor *shifted = cg_retain(cg_rope(g, full, 5, &llama));
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_real a[144], t[80], sh[144];
    cg_read(all, a), cg_read(tail, t), cg_read(shifted, sh);
    double worst = 0, worst_dot = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 5 * 8; i++) worst = fmax(worst, fabs(t[h * 40 + i] - a[h * 72 + 32 + i]));
    for (int m = 0; m < 9; m++)
        for (int n = 0; n < 9; n++) {
            double d0 = 0, d1 = 0;
            for (int e = 0; e < 8; e++) d0 += a[m * 8 + e] * a[n * 8 + e], d1 += sh[m * 8 + e] * sh[n * 8 + e];
            worst_dot = fmax(worst_dot, fabs(d0 - d1));
        }
    CHECK(worst <= 1e-6, "rope with offset 4 differs from the tail of offset 0 by %g", worst);
    CHECK(worst_dot <= 1e-5, "rotated dot products depend on absolute position: %g", worst_dot);
    CHECK(cg_rope(g, full, 0, &(cg_rope_config){.dims = 3, .theta = 10000}) == NULL && strstr(cg_last_error(), "[rope]"),
          "odd rotated dims: %s", cg_last_error());
    cg_graph_free(g);
}

/* cg_rope_at reads its offset when the graph runs: one graph rewritten with offsets 0, 7 and 300 gives the
 * bits of cg_rope built for each (LLaMA 3 scaling, interleaved pairs), and a negative offset fails the run. */
static void rope_at_values(void) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_rng rng;
    cg_rng_seed(&rng, 4);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 4, S(1, 3, 2, 8));
    cg_fill_uniform(x, &rng, -1, 1);
    cg_tensor *off = cg_input(g, "off", CG_INT32, 2, S(1, 1));
    const cg_rope_config cfg = {.theta = 500, .interleaved = true, .llama3_factor = 4, .llama3_low_freq_factor = 1,
                                .llama3_high_freq_factor = 4, .llama3_original_context = 16};
    cg_tensor *y = cg_retain(cg_rope_at(g, x, off, &cfg));
    const int32_t offs[3] = {0, 7, 300};
    cg_tensor *wants[3];
    for (int i = 0; i < 3; i++) wants[i] = cg_retain(cg_rope(g, x, offs[i], &cfg));
    for (int i = 0; i < 3; i++) {
        cg_tensor *want = wants[i];
        cg_idata(off)[0] = offs[i];
        CHECK(y && want && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
        if (!y || !want) break;
        int differ = 0;
        for (int j = 0; j < 48; j++) differ += memcmp(&cg_data(y)[j], &cg_data(want)[j], sizeof(cg_real)) != 0;
        CHECK(differ == 0, "rope_at offset %d: %d of 48 values differ in bits from rope built at it", offs[i], differ);
        CHECK(offs[i] == 0 || memcmp(cg_data(y), cg_data(x), 8 * sizeof(cg_real)) != 0, "offset %d rotated nothing",
              offs[i]);
    }
    cg_idata(off)[0] = -1;
    CHECK(cg_graph_forward(g) == CG_ERR_RANGE && strstr(cg_last_error(), "[rope]"), "negative offset: %s",
          cg_last_error());
    cg_tensor *real_off = cg_input(g, "real_off", CG_REAL, 1, S(1));
    CHECK(cg_rope_at(g, x, real_off, &cfg) == NULL && strstr(cg_last_error(), "int32"), "a real offset: %s",
          cg_last_error());
    CHECK(cg_rope_at(g, x, NULL, &cfg) == NULL, "a NULL offset is refused");
    cg_graph_free(g);
}

int main(void) {
    softmax_nonfinite();
    int failed = cg_gradcheck_ops(stdout, 0, NULL);
    CHECK(failed == 0, "%d gradient checks failed", failed);
    gelu_edges(false);
    gelu_edges(true);
    gelu_grid();
    activation_values();
    selection_values();
    reduction_values();
    index_values();
    rope_values();
    rope_at_values();
    TEST_END();
}
