/* SPDX-License-Identifier: MIT */
/* The ops after the transformer's: comparisons, casts, one_hot, cumsum, topk, scatter_add,
 * index_add, expand, bmm, grouped linear (hand-derived values and errors as values), and conv1d,
 * conv2d, max_pool2d, avg_pool2d against torch (fixtures from tests/make_conv_fixtures.py: outputs
 * and the gradients of input, weight and bias). Gradients against finite differences are in the op
 * table (cgrad gradcheck, test_ops). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "torch_fixtures.h"

static cg_tensor *real_in(cg_graph *g, int nd, const int64_t *shape, const double *v) {
    cg_tensor *t = cg_input(g, "x", CG_REAL, nd, shape);
    for (int64_t i = 0; t && i < cg_numel(t); i++) cg_data(t)[i] = (cg_real)v[i];
    return t;
}
static cg_tensor *int_in(cg_graph *g, int nd, const int64_t *shape, const int32_t *v) {
    cg_tensor *t = cg_input(g, "ids", CG_INT32, nd, shape);
    for (int64_t i = 0; t && i < cg_numel(t); i++) cg_idata(t)[i] = v[i];
    return t;
}
static bool ints_are(cg_tensor *t, const int32_t *want, int64_t n) {
    if (!t || cg_numel(t) != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (cg_idata(t)[i] != want[i]) {
            fprintf(stderr, "  element %lld: %d, want %d\n", (long long)i, cg_idata(t)[i], want[i]);
            return false;
        }
    return true;
}
static bool reals_are(cg_tensor *t, const double *want, int64_t n, double tol) {
    if (!t || cg_numel(t) != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)cg_data(t)[i] - want[i]) <= tol)) {
            fprintf(stderr, "  element %lld: %.9g, want %.9g\n", (long long)i, (double)cg_data(t)[i], want[i]);
            return false;
        }
    return true;
}
static bool error_has(const char *a, const char *b) {
    const char *e = cg_last_error();
    bool ok = e && strstr(e, a) && (!b || strstr(e, b));
    if (!ok) fprintf(stderr, "  error: %s\n", e ? e : "(none)");
    return ok;
}

static void test_compare(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double av[6] = {1, 2, NAN, -1, 0, 3}, bv[3] = {1, 0, 3};
    cg_tensor *a = cg_requires_grad(real_in(g, 2, (int64_t[]){2, 3}, av)), *b = real_in(g, 1, (int64_t[]){3}, bv);
    cg_tensor *eq = cg_retain(cg_eq(g, a, b)), *ne = cg_retain(cg_ne(g, a, b)), *lt = cg_retain(cg_lt(g, a, b));
    cg_tensor *le = cg_retain(cg_le(g, a, b)), *gt = cg_retain(cg_gt(g, a, b)), *ge = cg_retain(cg_ge(g, a, b));
    /* an in-graph mask drives where and masked_fill */
    cg_tensor *w = cg_retain(cg_where(g, gt, a, cg_scale(g, a, 10)));
    cg_tensor *m = cg_retain(cg_masked_fill(g, a, le, -7));
    CHECK(eq && cg_tensor_dtype(eq) == CG_INT32, "eq is int32");
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(ints_are(eq, (int32_t[]){1, 0, 0, 0, 1, 1}, 6), "eq");
    CHECK(ints_are(ne, (int32_t[]){0, 1, 1, 1, 0, 0}, 6), "ne (NaN is unequal)");
    CHECK(ints_are(lt, (int32_t[]){0, 0, 0, 1, 0, 0}, 6), "lt");
    CHECK(ints_are(le, (int32_t[]){1, 0, 0, 1, 1, 1}, 6), "le");
    CHECK(ints_are(gt, (int32_t[]){0, 1, 0, 0, 0, 0}, 6), "gt");
    CHECK(ints_are(ge, (int32_t[]){1, 1, 0, 0, 1, 1}, 6), "ge");
    CHECK(w && cg_data(w)[0] == 10 && cg_data(w)[1] == 2 && isnan(cg_data(w)[2]) && cg_data(w)[3] == -10 && cg_data(w)[5] == 30, "where");
    CHECK(cg_data(m)[0] == -7 && cg_data(m)[1] == 2 && isnan(cg_data(m)[2]) && cg_data(m)[3] == -7, "masked_fill");
    /* int32 comparisons, and mixed dtypes refused */
    cg_tensor *i = int_in(g, 1, (int64_t[]){3}, (int32_t[]){4, 5, 6});
    CHECK(cg_lt(g, a, i) == NULL && error_has("[lt]", "int32"), "real vs int32 refused");
    CHECK(cg_ge(g, a, cg_input(g, "c", CG_REAL, 1, (int64_t[]){4})) == NULL && error_has("[ge]", "[4]"),
          "shapes that do not broadcast");
    cg_graph_free(g);
}

static void test_casts(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double v[6] = {2.7, -2.7, 0.5, -0.5, 2147483520.0, -2147483648.0}; /* exact in float32 too */
    cg_tensor *x = real_in(g, 1, (int64_t[]){6}, v), *n = cg_retain(cg_to_int(g, x));
    cg_tensor *back = cg_retain(cg_to_real(g, n));
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(ints_are(n, (int32_t[]){2, -2, 0, 0, 2147483520, INT32_MIN}, 6), "truncation toward zero");
    CHECK(back && cg_data(back)[0] == 2 && cg_data(back)[1] == -2, "to_real");
    const double bad[4] = {NAN, INFINITY, 2147483648.0, -2147483904.0};
    for (int k = 0; k < 4; k++) {
        cg_data(x)[1] = (cg_real)bad[k];
        cg_status s = cg_graph_forward(g);
        CHECK(s == CG_ERR_RANGE && error_has("[to_int]", "element 1"), "value %g refused", bad[k]);
    }
    CHECK(cg_to_int(g, n) == NULL && error_has("[to_int]", "real"), "to_int of int32");
    cg_graph_free(g);

    g = cg_graph_new(CG_TRAIN);
    cg_tensor *ids = int_in(g, 2, (int64_t[]){2, 2}, (int32_t[]){0, 2, 3, 2});
    cg_tensor *r = cg_retain(cg_one_hot(g, ids, 4, CG_REAL)), *in = cg_retain(cg_one_hot(g, cg_transpose(g, ids, 0, 1), 4, CG_INT32));
    CHECK(r && cg_ndim(r) == 3 && cg_shape(r)[2] == 4, "one_hot shape");
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(reals_are(r, (double[]){1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 0}, 16, 0), "one_hot real");
    CHECK(ints_are(in, (int32_t[]){1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0}, 16), "one_hot int32 of a view");
    cg_idata(ids)[3] = 4;
    CHECK(cg_graph_forward(g) == CG_ERR_RANGE && error_has("[one_hot]", "id 4"), "id out of range");
    CHECK(cg_one_hot(g, ids, 0, CG_REAL) == NULL && error_has("[one_hot]", "num_classes 0"), "num_classes 0");
    cg_graph_free(g);
}

static void test_cumsum_topk(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double v[6] = {1, 2, 3, 4, 5, 6};
    cg_tensor *x = real_in(g, 2, (int64_t[]){2, 3}, v);
    cg_tensor *c1 = cg_retain(cg_cumsum(g, x, 1, false)), *c0r = cg_retain(cg_cumsum(g, x, 0, true));
    cg_tensor *ct = cg_retain(cg_cumsum(g, cg_transpose(g, x, 0, 1), -1, false));
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(reals_are(c1, (double[]){1, 3, 6, 4, 9, 15}, 6, 0), "cumsum axis 1");
    CHECK(reals_are(c0r, (double[]){5, 7, 9, 4, 5, 6}, 6, 0), "reverse cumsum axis 0");
    CHECK(reals_are(ct, (double[]){1, 5, 2, 7, 3, 9}, 6, 0), "cumsum of a transposed view");
    CHECK(cg_cumsum(g, x, 2, false) == NULL && error_has("[cumsum]", "axis 2"), "bad axis");
    cg_graph_free(g);

    g = cg_graph_new(CG_TRAIN);
    const double t[12] = {3, 1, 3, NAN, 2, 2, /* row 2: */ 0, -1, 5, 5, -1, 4};
    x = cg_requires_grad(real_in(g, 2, (int64_t[]){2, 6}, t));
    cg_tensor *val, *idx, *sval, *sidx;
    CHECK(!cg_topk(g, x, 3, -1, true, &val, &idx), "%s", cg_last_error());
    CHECK(!cg_topk(g, x, 2, 1, false, &sval, &sidx), "%s", cg_last_error());
    cg_retain(val), cg_retain(idx), cg_retain(sval), cg_retain(sidx);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, val, real_in(g, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6})));
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    /* NaN ranks first, ties go to the lower index */
    CHECK(ints_are(idx, (int32_t[]){3, 0, 2, 2, 3, 5}, 6), "topk largest indices");
    CHECK(isnan(cg_data(val)[0]) && cg_data(val)[1] == 3 && cg_data(val)[3] == 5 && cg_data(val)[5] == 4, "values");
    CHECK(ints_are(sidx, (int32_t[]){1, 4, 1, 4}, 4), "topk smallest indices");
    CHECK(!cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_real gx[12];
    CHECK(!cg_read_grad(x, gx), "%s", cg_last_error());
    const double want[12] = {2, 0, 3, 1, 0, 0, 0, 0, 4, 5, 0, 6};
    bool same = true;
    for (int k = 0; k < 12; k++) same &= gx[k] == want[k];
    CHECK(same, "gradient reaches the chosen positions: %g %g %g %g", gx[0], gx[2], gx[3], gx[8]);
    CHECK(cg_topk(g, x, 7, 1, true, &val, NULL) == CG_ERR_SHAPE && error_has("[topk]", "k = 7"), "k too large");
    cg_graph_free(g);
}

/* scatter_add and index_add: hand values, and 1 vs 2 threads bit for bit on a larger case */
static void test_scatter(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = real_in(g, 2, (int64_t[]){2, 3}, (double[]){1, 1, 1, 1, 1, 1});
    cg_tensor *src = real_in(g, 2, (int64_t[]){2, 2}, (double[]){10, 20, 30, 40});
    cg_tensor *ix = int_in(g, 2, (int64_t[]){2, 2}, (int32_t[]){2, 2, 0, 1});
    cg_tensor *s = cg_retain(cg_scatter_add(g, x, 1, ix, src));
    cg_tensor *rows = int_in(g, 1, (int64_t[]){3}, (int32_t[]){1, 0, 1});
    cg_tensor *src3 = real_in(g, 2, (int64_t[]){3, 3}, (double[]){1, 2, 3, 4, 5, 6, 7, 8, 9});
    cg_tensor *a = cg_retain(cg_index_add(g, x, 0, rows, src3));
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(reals_are(s, (double[]){1, 1, 31, 31, 41, 1}, 6, 0), "scatter_add");
    CHECK(reals_are(a, (double[]){5, 6, 7, 9, 11, 13}, 6, 0), "index_add");
    cg_idata(rows)[2] = 2;
    CHECK(cg_graph_forward(g) == CG_ERR_RANGE && error_has("[index_add]", "index 2"), "index out of range");
    CHECK(cg_scatter_add(g, x, 1, rows, src) == NULL && error_has("[scatter_add]", "index[3]"), "index not shaped as src");
    CHECK(cg_index_add(g, x, 0, rows, src) == NULL && error_has("[index_add]", "src[2,2]"), "src of the wrong size");
    cg_graph_free(g);

    /* many repeated destinations: the sums do not depend on the thread count */
    enum { N = 50, K = 4000, D = 3 };
    cg_real out[2][N * D], grad[2][K * D];
    for (int run = 0; run < 2; run++) {
        cg_set_threads(run + 1);
        g = cg_graph_new(CG_TRAIN);
        cg_rng rng;
        cg_rng_seed(&rng, 7);
        cg_tensor *base = cg_input(g, "x", CG_REAL, 2, (int64_t[]){N, D});
        cg_tensor *many = cg_requires_grad(cg_input(g, "src", CG_REAL, 2, (int64_t[]){K, D}));
        cg_fill_uniform(base, &rng, -1, 1);
        cg_fill_uniform(many, &rng, -1, 1);
        cg_tensor *where = cg_input(g, "ix", CG_INT32, 1, (int64_t[]){K});
        for (int k = 0; k < K; k++) cg_idata(where)[k] = (int32_t)(cg_rng_next(&rng) % N);
        cg_tensor *y = cg_retain(cg_index_add(g, base, 0, where, many));
        /* scatter_add of the same rows, element by element: a transposed index of many repeats */
        cg_tensor *eix = cg_input(g, "eix", CG_INT32, 2, (int64_t[]){D, K});
        for (int k = 0; k < K * D; k++) cg_idata(eix)[k] = (int32_t)(cg_rng_next(&rng) % N);
        y = cg_retain(cg_add(g, y, cg_transpose(g, cg_scatter_add(g, cg_transpose(g, base, 0, 1), 1, eix,
                                                                    cg_transpose(g, many, 0, 1)), 0, 1)));
        cg_tensor *r = cg_input(g, "r", CG_REAL, 2, (int64_t[]){N, D});
        cg_fill_uniform(r, &rng, -1, 1);
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, r));
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
        CHECK(!cg_read(y, out[run]) && !cg_read_grad(many, grad[run]), "%s", cg_last_error());
        cg_graph_free(g);
    }
    cg_set_threads(0);
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "index_add + scatter_add: 2 threads differ from 1");
    CHECK(memcmp(grad[0], grad[1], sizeof grad[0]) == 0, "their gradient: 2 threads differ from 1");
}

static void test_expand_bmm(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(real_in(g, 2, (int64_t[]){2, 1}, (double[]){1, 2}));
    cg_tensor *e = cg_retain(cg_expand(g, x, 3, (int64_t[]){2, -1, 3}));
    cg_tensor *m = cg_retain(cg_expand(g, int_in(g, 1, (int64_t[]){1}, (int32_t[]){5}), 2, (int64_t[]){2, 2}));
    CHECK(e && cg_ndim(e) == 3 && cg_shape(e)[1] == 2, "expand shape");
    cg_tensor *loss = cg_sum_all(g, e);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_real ev[12]; /* a view: read through its strides */
    CHECK(!cg_read(e, ev), "%s", cg_last_error());
    for (int i = 0; i < 12; i++) CHECK(ev[i] == (i % 6 < 3 ? 1 : 2), "expand value %d: %g", i, ev[i]);
    CHECK(m && cg_strides(m)[0] == 0 && cg_strides(m)[1] == 0 && cg_idata(m)[0] == 5, "expand of an int32 mask");
    cg_real gx[2];
    CHECK(!cg_read_grad(x, gx) && gx[0] == 6 && gx[1] == 6, "expand's gradient sums the repeats: %g %g", gx[0], gx[1]);
    CHECK(cg_expand(g, x, 2, (int64_t[]){3, 3}) == NULL && error_has("[expand]", "size 2"), "a size-2 axis cannot grow");
    CHECK(cg_expand(g, x, 1, (int64_t[]){2}) == NULL && error_has("[expand]", "1 dims"), "fewer dims");

    cg_tensor *a = real_in(g, 3, (int64_t[]){2, 1, 2}, (double[]){1, 2, 3, 4});
    cg_tensor *b = real_in(g, 3, (int64_t[]){2, 2, 1}, (double[]){5, 6, 7, 8});
    cg_tensor *p = cg_retain(cg_bmm(g, a, b));
    cg_tensor *w = real_in(g, 3, (int64_t[]){2, 1, 2}, (double[]){1, 1, 2, -1});
    cg_tensor *gl = cg_retain(cg_grouped_linear(g, a, w, real_in(g, 2, (int64_t[]){2, 1}, (double[]){10, 20})));
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    CHECK(reals_are(p, (double[]){17, 53}, 2, 0), "bmm");
    CHECK(reals_are(gl, (double[]){13, 22}, 2, 0), "grouped linear: 1+2+10, 6-4+20");
    CHECK(cg_bmm(g, a, a) == NULL && error_has("[bmm]", "[2,1,2]"), "bmm inner dims");
    CHECK(cg_grouped_linear(g, a, b, NULL) == NULL && error_has("[grouped_linear]", "w[2,2,1]"), "grouped linear shapes");
    cg_graph_free(g);
}

/* ---- against torch ---- */

static cg_tensor *from_fixture(cg_graph *g, const char *c, const char *part) {
    return cg_requires_grad(fx_input(g, fx_find(c, part), CG_REAL));
}

typedef cg_tensor *(*fixture_op)(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b);
static cg_tensor *conv2d_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_conv2d(g, x, w, b, &(cg_conv_opts){.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2});
}
static cg_tensor *patch_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_conv2d(g, x, w, b, &(cg_conv_opts){.stride = {4, 4}});
}
static cg_tensor *conv1d_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_conv1d(g, x, w, b, &(cg_conv_opts){.padding = {2}, .dilation = {2}});
}
static cg_tensor *causal_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_conv1d(g, x, w, b, &(cg_conv_opts){.dilation = {2}, .causal = true});
}
static cg_tensor *depthwise_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_conv1d(g, x, w, b, &(cg_conv_opts){.stride = {2}, .padding = {1}, .groups = 4});
}
static cg_tensor *max_pool_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    (void)w, (void)b;
    return cg_max_pool2d(g, x, (int64_t[]){3, 2}, (int64_t[]){2, 2}, (int64_t[]){1, 1});
}
static cg_tensor *avg_pool_(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    (void)w, (void)b;
    return cg_avg_pool2d(g, x, (int64_t[]){3, 2}, (int64_t[]){2, 1}, (int64_t[]){1, 1});
}

static void test_against_torch(void) {
    if (!fx_load(CGRAD_TEST_DIR "/fixtures/conv/conv.txt")) {
        CHECK(false, "cannot read %s", CGRAD_TEST_DIR "/fixtures/conv/conv.txt");
        return;
    }
    const struct {
        const char *name;
        fixture_op op;
    } cases[] = {{"conv2d", conv2d_},          {"conv2d_patch", patch_},     {"conv1d", conv1d_},
                 {"conv1d_causal", causal_},   {"conv1d_depthwise", depthwise_}, {"max_pool2d", max_pool_},
                 {"avg_pool2d", avg_pool_}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *c = cases[k].name;
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = from_fixture(g, c, "x"), *w = from_fixture(g, c, "w"), *b = from_fixture(g, c, "b");
        cg_tensor *y = cg_retain(cases[k].op(g, x, w, b));
        CHECK(y != NULL, "%s: %s", c, cg_last_error());
        if (!y) {
            cg_graph_free(g);
            continue;
        }
        cg_tensor *r = from_fixture(g, c, "r");
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, r));
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s: %s", c, cg_last_error());
        fx_compare(c, "y", y, false);
        fx_compare(c, "dx", x, true);
        if (w) fx_compare(c, "dw", w, true);
        if (b) fx_compare(c, "db", b, true);
        cg_graph_free(g);
    }
    fx_free();
}

static void test_conv_errors(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 4, (int64_t[]){1, 4, 5, 5});
    cg_tensor *w = cg_input(g, "w", CG_REAL, 4, (int64_t[]){6, 3, 3, 3});
    CHECK(cg_conv2d(g, x, w, NULL, NULL) == NULL && error_has("[conv2d]", "w[6,3,3,3]"), "channels mismatch");
    CHECK(cg_conv2d(g, x, w, NULL, &(cg_conv_opts){.groups = 4}) == NULL && error_has("[conv2d]", "groups 4"), "groups");
    cg_tensor *big = cg_input(g, "w", CG_REAL, 4, (int64_t[]){2, 4, 7, 1});
    CHECK(cg_conv2d(g, x, big, NULL, NULL) == NULL && error_has("[conv2d]", "height window 7"), "kernel taller than x");
    CHECK(cg_conv1d(g, x, w, NULL, NULL) == NULL && error_has("[conv1d]", "3 dims"), "conv1d of 4-d x");
    cg_tensor *x1 = cg_input(g, "x", CG_REAL, 3, (int64_t[]){1, 4, 9}), *w1 = cg_input(g, "w", CG_REAL, 3, (int64_t[]){6, 3, 3});
    CHECK(cg_conv1d(g, x1, w1, NULL, NULL) == NULL && error_has("[conv1d] x[1,4,9], w[6,3,3]", NULL),
          "conv1d's message shows the caller's shapes");
    CHECK(cg_max_pool2d(g, x, (int64_t[]){2, 2}, NULL, (int64_t[]){2, 0}) == NULL && error_has("[max_pool2d]", "padding 2"),
          "pool padding over half the kernel");
    cg_graph_free(g);
}

/* torch's max_pool2d picks a window's first maximum, and a NaN over any number (the last NaN when
 * there are several); all -inf gives -inf at the window's first element. Values and gradients
 * from torch 1.13 (F.max_pool2d(x, 2, return_indices=True), backward of dy = 10, 20, 30, 40). */
static void test_pool_ties(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double nan = NAN, inf = INFINITY;
    cg_tensor *x = cg_requires_grad(real_in(g, 4, (int64_t[]){1, 1, 2, 8},
                                            (double[]){1, 1, 2, 5, nan, 0, -inf, -inf, 1, 1, 2, 5, 3, nan, -inf, -inf}));
    cg_tensor *y = cg_retain(cg_max_pool2d(g, x, (int64_t[]){2, 2}, NULL, NULL));
    cg_tensor *dy = real_in(g, 4, (int64_t[]){1, 1, 1, 4}, (double[]){10, 20, 30, 40});
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, dy));
    CHECK(y && !cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    CHECK(y && cg_data(y)[0] == 1 && cg_data(y)[1] == 5 && isnan(cg_data(y)[2]) && cg_data(y)[3] == -inf, "max_pool2d values");
    cg_real dx[16];
    CHECK(!cg_read_grad(x, dx), "%s", cg_last_error());
    const double want[16] = {10, 0, 0, 20, 0, 0, 40, 0, 0, 0, 0, 0, 0, 30, 0, 0};
    for (int i = 0; i < 16; i++) CHECK(dx[i] == want[i], "max_pool2d dx[%d] = %g, want %g", i, (double)dx[i], want[i]);
    cg_graph_free(g);
}

/* conv2d's fused ReLU (opts.relu) against relu(conv2d) on the same graph: values and every gradient
 * bit for bit would be too strict (the fused op adds the bias inside the product), so within 1e-6. */
static void test_conv_relu(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 7);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 4, (int64_t[]){2, 3, 6, 5}));
    cg_tensor *w = cg_requires_grad(cg_input(g, "w", CG_REAL, 4, (int64_t[]){4, 3, 3, 3}));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 1, (int64_t[]){4}));
    cg_fill_uniform(x, &rng, -1, 1), cg_fill_uniform(w, &rng, -0.5, 0.5), cg_fill_uniform(b, &rng, -0.2, 0.2);
    const cg_conv_opts plain = {.padding = {1, 1}, .stride = {1, 2}}, fused = {.padding = {1, 1}, .stride = {1, 2}, .relu = true};
    cg_tensor *ref = cg_retain(cg_relu(g, cg_conv2d(g, x, w, b, &plain))), *y = cg_retain(cg_conv2d(g, x, w, b, &fused));
    cg_tensor *r = cg_input(g, "r", CG_REAL, 4, cg_shape(y));
    cg_fill_uniform(r, &rng, -1, 1);
    cg_tensor *loss = cg_sub(g, cg_sum_all(g, cg_mul(g, y, r)), cg_sum_all(g, cg_mul(g, ref, cg_scale(g, r, 0.5))));
    CHECK(y && ref && loss && !cg_graph_forward(g), "%s", cg_last_error());
    cg_real yv[144], rv[144]; /* [2, 4, 6, 3] in logical order: y is a view of the product's NHWC result */
    bool same = y && ref && cg_numel(y) == 144 && !cg_read(y, yv) && !cg_read(ref, rv);
    for (int64_t i = 0; same && i < 144; i++) {
        const double a = (double)yv[i], e = (double)rv[i];
        if (!(fabs(a - e) <= 1e-6)) fprintf(stderr, "  y[%lld] %.9g, relu(conv2d) %.9g\n", (long long)i, a, e), same = false;
    }
    CHECK(same, "fused relu's values are relu(conv2d)'s");
    /* loss = sum(y r) - sum(ref r) / 2: equal branches leave every input's gradient that of sum(y r) / 2,
     * so comparing it with a graph of the plain branch alone checks the fused backward */
    CHECK(!cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_real dw[108], dw_ref[108];
    CHECK(!cg_read_grad(w, dw), "%s", cg_last_error());
    cg_graph *h = cg_graph_new(CG_TRAIN);
    cg_tensor *w2 = cg_requires_grad(cg_input(h, "w", CG_REAL, 4, (int64_t[]){4, 3, 3, 3}));
    cg_tensor *x2 = cg_input(h, "x", CG_REAL, 4, (int64_t[]){2, 3, 6, 5}), *b2 = cg_input(h, "b", CG_REAL, 1, (int64_t[]){4});
    cg_tensor *r2 = cg_input(h, "r", CG_REAL, 4, cg_shape(y));
    memcpy(cg_data(w2), cg_data(w), sizeof dw), memcpy(cg_data(x2), cg_data(x), (size_t)cg_numel(x) * sizeof(cg_real));
    memcpy(cg_data(b2), cg_data(b), 4 * sizeof(cg_real)), memcpy(cg_data(r2), cg_data(r), (size_t)cg_numel(y) * sizeof(cg_real));
    cg_tensor *l2 = cg_scale(h, cg_sum_all(h, cg_mul(h, cg_relu(h, cg_conv2d(h, x2, w2, b2, &plain)), r2)), 0.5);
    CHECK(l2 && !cg_graph_forward(h) && !cg_graph_backward(h, l2) && !cg_read_grad(w2, dw_ref), "%s", cg_last_error());
    for (int i = 0; i < 108; i++) CHECK(fabs((double)dw[i] - (double)dw_ref[i]) <= 1e-5, "dw[%d] %g vs %g", i, (double)dw[i], (double)dw_ref[i]);
    cg_graph_free(h);
    cg_graph_free(g);
}

int main(void) {
    test_compare();
    test_casts();
    test_cumsum_topk();
    test_scatter();
    test_expand_bmm();
    test_against_torch();
    test_conv_errors();
    test_pool_ties();
    test_conv_relu();
    TEST_END();
}
