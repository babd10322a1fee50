/* SPDX-License-Identifier: MIT */
/* cg_expand as a view: zero strides on the repeated axes and its source's storage (no copy, no memory
 * in the plan), read in place by the binary elementwise ops and where, and handed to every other op
 * as a contiguous copy by the graph; its gradient summed over the repeats into the source, the same
 * on one thread and two; writes into it refused. Gradients against finite differences (float64 in
 * the _f64 build) for consumers of every kind: elementwise, matmul and linear, reductions, softmax,
 * a custom op, a reshape, an expand of a transposed view. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"

static cg_tensor *rand_in(cg_graph *g, const char *name, int nd, const int64_t *shape, cg_rng *r, bool grad) {
    cg_tensor *t = cg_input(g, name, CG_REAL, nd, shape);
    cg_fill_uniform(t, r, -1, 1);
    return grad ? cg_requires_grad(t) : t;
}

/* y = x^3 with dx += 3 x^2 dy, read and written through the strides the kernel is given */
static cg_status cube_shape(const cg_custom_tensor *in, int n, const void *params, void *user, cg_custom_shape *out) {
    (void)n, (void)params, (void)user;
    out->ndim = in[0].ndim;
    memcpy(out->shape, in[0].shape, sizeof out->shape);
    return CG_OK;
}
static int64_t at(const cg_custom_tensor *t, int64_t i) { /* row-major element i through the strides */
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) off += (i % t->shape[d]) * t->stride[d], i /= t->shape[d];
    return off;
}
static int64_t numel(const cg_custom_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}
static cg_status cube_fwd(cg_custom_ctx *c) {
    const cg_custom_tensor x = cg_custom_input(c, 0), y = cg_custom_output(c);
    const cg_real *xv = x.data;
    cg_real *yv = y.data;
    for (int64_t i = 0; i < numel(&x); i++) yv[at(&y, i)] = xv[at(&x, i)] * xv[at(&x, i)] * xv[at(&x, i)];
    return CG_OK;
}
static cg_status cube_bwd(cg_custom_ctx *c) {
    const cg_custom_tensor x = cg_custom_input(c, 0), dx = cg_custom_input_grad(c, 0), dy = cg_custom_output_grad(c);
    const cg_real *xv = x.data, *g = dy.data;
    cg_real *d = dx.data;
    for (int64_t i = 0; d && i < numel(&x); i++) d[at(&dx, i)] += 3 * xv[at(&x, i)] * xv[at(&x, i)] * g[at(&dy, i)];
    return CG_OK;
}
static const cg_custom_op cube_op = {.name = "cube", .n_inputs = 1, .shape = cube_shape, .forward = cube_fwd,
                                     .backward = cube_bwd, .backward_reads = 1};

enum { B = 2, T = 4, D = 3 };

/* One consumer of e = expand(x[1, D] -> [B, T, D]) (and of w, y where it takes them). */
typedef cg_tensor *(*consumer)(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y);
static cg_tensor *c_mul(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) { (void)w; return cg_mul(g, e, y); }
static cg_tensor *c_add_self(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w, (void)y;
    return cg_mul(g, cg_add(g, e, e), e); /* the same view read twice by each op */
}
static cg_tensor *c_tanh(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) { (void)w, (void)y; return cg_tanh(g, e); }
static cg_tensor *c_matmul(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)y;
    return cg_matmul(g, e, cg_transpose(g, w, 0, 1));
}
static cg_tensor *c_linear(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) { (void)y; return cg_linear(g, e, w, NULL); }
static cg_tensor *c_matmul_b(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w; /* the expanded operand on the right: y[B, T, D] @ e^T[B, D, T] */
    return cg_matmul(g, y, cg_transpose(g, e, 1, 2));
}
static cg_tensor *c_sum(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w; /* weighted so that the sum's gradient is not the same for every element */
    return cg_sum(g, cg_mul(g, e, y), 1, false);
}
static cg_tensor *c_reduce(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w, (void)y;
    return cg_add(g, cg_add(g, cg_mean(g, e, 0, false), cg_logsumexp(g, e, -1, true)), cg_max(g, e, -1, true));
}
static cg_tensor *c_softmax(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) { (void)w, (void)y; return cg_softmax(g, e); }
static cg_tensor *c_custom(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w, (void)y;
    return cg_custom(g, &cube_op, &e, NULL, 0);
}
static cg_tensor *c_reshape(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w, (void)y;
    return cg_sigmoid(g, cg_reshape(g, e, 2, (int64_t[]){B * T, D}));
}
static cg_tensor *c_permuted(cg_graph *g, cg_tensor *e, cg_tensor *w, cg_tensor *y) {
    (void)w; /* a permute of the view stays a view: zero strides moved along */
    return cg_mul(g, cg_permute(g, e, (int[]){2, 0, 1}), cg_permute(g, y, (int[]){2, 0, 1}));
}

static void test_gradients(void) {
    static const struct {
        const char *name;
        consumer build;
    } cases[] = {{"mul", c_mul},       {"add+mul of itself", c_add_self}, {"tanh", c_tanh},
                 {"matmul", c_matmul}, {"linear", c_linear},              {"matmul, expanded b", c_matmul_b},
                 {"sum", c_sum},       {"mean, logsumexp, max", c_reduce},     {"softmax", c_softmax},
                 {"custom op", c_custom}, {"reshape", c_reshape},         {"permute", c_permuted}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int transposed = 0; transposed < 2; transposed++) {
            cg_rng r;
            cg_rng_seed(&r, 7 + i);
            cg_graph *g = cg_graph_new(CG_TRAIN);
            /* x[1, D], or x[D, 1] read through its transpose: an expand of a view */
            cg_tensor *x = rand_in(g, "x", 2, transposed ? (int64_t[]){D, 1} : (int64_t[]){1, D}, &r, true);
            cg_tensor *w = rand_in(g, "w", 2, (int64_t[]){5, D}, &r, true);
            cg_tensor *y = rand_in(g, "y", 3, (int64_t[]){B, T, D}, &r, true);
            cg_tensor *src = transposed ? cg_transpose(g, x, 0, 1) : x;
            cg_tensor *e = cg_expand(g, src, 3, (int64_t[]){B, T, -1});
            CHECK(e && cg_strides(e)[0] == 0 && cg_strides(e)[1] == 0, "%s: expand has zero strides", cases[i].name);
            cg_tensor *out = e ? cases[i].build(g, e, w, y) : NULL;
            cg_gradcheck_result res[3];
            cg_tensor *in[3] = {x, w, y};
            cg_status s = out ? cg_gradcheck(g, out, 3, in, 0, res) : CG_ERR_ARG;
            CHECK(!s, "%s: %s", cases[i].name, cg_last_error());
            for (int k = 0; !s && k < 3; k++)
                CHECK(res[k].pass, "%s%s: gradient of %s off by %.3g (analytic %.9g, numeric %.9g)", cases[i].name,
                      transposed ? " (transposed source)" : "", res[k].name, res[k].max_abs_err, res[k].analytic,
                      res[k].numeric);
            cg_graph_free(g);
        }
    }
}

/* The gradient of x through expand equals the hand-derived sum over the repeats: d sum(e * y) / dx = sum_{b,t} y. */
static void test_values(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){2, 1}));
    cg_tensor *y = cg_input(g, "y", CG_REAL, 3, (int64_t[]){2, 2, 3});
    CHECK(!cg_write(x, (cg_real[]){1, 2}), "%s", cg_last_error());
    cg_real yv[12];
    for (int i = 0; i < 12; i++) yv[i] = (cg_real)(i + 1);
    CHECK(!cg_write(y, yv), "%s", cg_last_error());
    cg_tensor *e = cg_retain(cg_expand(g, x, 3, (int64_t[]){2, -1, 3}));
    CHECK(e && cg_data(e) == cg_data(x), "an expand of a leaf reads the leaf's storage");
    CHECK(e && !cg_is_contiguous(e), "and is not contiguous");
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, e, y));
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_real ev[12], gx[2];
    CHECK(!cg_read(e, ev), "%s", cg_last_error());
    const cg_real want[12] = {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2};
    CHECK(memcmp(ev, want, sizeof ev) == 0, "expand values %g %g %g %g", ev[0], ev[3], ev[6], ev[9]);
    /* x[0] meets y[0..2] and y[6..8]; x[1] meets y[3..5] and y[9..11] */
    CHECK(!cg_read_grad(x, gx) && gx[0] == 1 + 2 + 3 + 7 + 8 + 9 && gx[1] == 4 + 5 + 6 + 10 + 11 + 12,
          "expand's gradient sums the repeats: %g %g", gx[0], gx[1]);
    CHECK_NEAR(cg_item(loss), 1 * 30 + 2 * 48, 0);

    /* an int32 mask expanded into where, and into one_hot-free ops that copy it */
    cg_tensor *m = cg_input(g, "m", CG_INT32, 2, (int64_t[]){1, 3});
    cg_idata(m)[0] = 1, cg_idata(m)[1] = 0, cg_idata(m)[2] = 1;
    cg_tensor *me = cg_expand(g, m, 2, (int64_t[]){2, 3});
    cg_tensor *a = cg_input(g, "a", CG_REAL, 2, (int64_t[]){2, 3}), *b = cg_input(g, "b", CG_REAL, 2, (int64_t[]){2, 3});
    cg_fill(a, 1), cg_fill(b, -1);
    cg_tensor *wh = cg_retain(cg_where(g, me, a, b));
    cg_tensor *mf = cg_retain(cg_masked_fill(g, a, me, 5)); /* not in the in-place list: a dense copy of the mask */
    CHECK(!cg_graph_forward(g), "%s", cg_last_error());
    cg_real whv[6], mfv[6];
    CHECK(!cg_read(wh, whv) && !cg_read(mf, mfv), "%s", cg_last_error());
    const cg_real wwant[6] = {1, -1, 1, 1, -1, 1}, mwant[6] = {5, 1, 5, 5, 1, 5};
    CHECK(memcmp(whv, wwant, sizeof whv) == 0, "where through an expanded mask: %g %g %g %g", whv[0], whv[1], whv[3], whv[4]);
    CHECK(memcmp(mfv, mwant, sizeof mfv) == 0, "masked_fill through an expanded mask: %g %g %g", mfv[0], mfv[1], mfv[4]);
    cg_graph_free(g);
}

/* The expand takes no memory in the plan: the same bytes as the op broadcasting x itself. */
static size_t plan_bytes(bool expand, cg_mode mode) {
    cg_rng r;
    cg_rng_seed(&r, 3);
    cg_graph *g = cg_graph_new(mode);
    cg_tensor *x = rand_in(g, "x", 2, (int64_t[]){1, 256}, &r, mode == CG_TRAIN);
    cg_tensor *y = rand_in(g, "y", 2, (int64_t[]){64, 256}, &r, mode == CG_TRAIN);
    cg_tensor *xe = expand ? cg_expand(g, x, 2, (int64_t[]){64, 256}) : x;
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_sub(g, xe, y), xe));
    cg_status s = cg_graph_forward(g);
    if (!s && mode == CG_TRAIN) s = cg_graph_backward(g, loss);
    CHECK(!s, "%s", cg_last_error());
    size_t bytes = cg_graph_plan_bytes(g);
    cg_graph_free(g);
    return bytes;
}

static void test_plan(void) {
    for (int m = 0; m < 2; m++) {
        const cg_mode mode = m ? CG_EVAL : CG_TRAIN;
        const size_t with = plan_bytes(true, mode), without = plan_bytes(false, mode);
        CHECK(with == without && with > 0, "%s: plan with the expand %zu bytes, broadcasting %zu", m ? "eval" : "train",
              with, without);
    }
}

/* Several threads summing the repeats give the bits one thread gives (rows above the parallel threshold). */
static void test_threads(void) {
    enum { N = 512 };
    cg_real *grad[2];
    for (int run = 0; run < 2; run++) {
        cg_set_threads(run ? 2 : 1);
        cg_rng r;
        cg_rng_seed(&r, 11);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = rand_in(g, "x", 2, (int64_t[]){1, N}, &r, true);
        cg_tensor *y = rand_in(g, "y", 2, (int64_t[]){N, N}, &r, false);
        cg_tensor *e = cg_expand(g, x, 2, (int64_t[]){N, N});
        cg_tensor *loss = cg_sum_all(g, cg_add(g, cg_mul(g, e, y), cg_tanh(g, e)));
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
        grad[run] = malloc(N * sizeof(cg_real));
        CHECK(grad[run] && !cg_read_grad(x, grad[run]), "%s", cg_last_error());
        cg_graph_free(g);
    }
    cg_set_threads(0);
    CHECK(grad[0] && grad[1] && memcmp(grad[0], grad[1], N * sizeof(cg_real)) == 0,
          "the expand's gradient on 2 threads differs from 1");
    free(grad[0]);
    free(grad[1]);
}

/* Writes into an expanded view are refused, as torch refuses in-place writes to expanded tensors. */
static void test_writes_refused(void) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){1, 3});
    CHECK(!cg_write(x, (cg_real[]){1, 2, 3}), "%s", cg_last_error());
    cg_tensor *e = cg_expand(g, x, 2, (int64_t[]){2, 3});
    CHECK(cg_write(e, (cg_real[]){9, 9, 9, 9, 9, 9}) == CG_ERR_ARG && strstr(cg_last_error(), "expanded view"),
          "cg_write into an expand: %s", cg_last_error());
    cg_clear_error();
    cg_fill(e, 7);
    CHECK(strstr(cg_last_error(), "[fill]") && strstr(cg_last_error(), "expanded view"), "cg_fill: %s", cg_last_error());
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_clear_error();
    cg_fill_uniform(e, &r, 0, 1);
    CHECK(strstr(cg_last_error(), "expanded view"), "cg_fill_uniform: %s", cg_last_error());
    const cg_real *xv = cg_data(x);
    CHECK(xv && xv[0] == 1 && xv[1] == 2 && xv[2] == 3, "the source is unchanged: %g %g %g", xv[0], xv[1], xv[2]);
    cg_tensor *buf = cg_expand(g, cg_input(g, "cache", CG_REAL, 2, (int64_t[]){1, 4}), 2, (int64_t[]){3, 4});
    cg_tensor *fresh = cg_input(g, "fresh", CG_REAL, 2, (int64_t[]){3, 1});
    CHECK(cg_append_into(g, buf, 0, fresh, 1) == NULL && strstr(cg_last_error(), "[append_into]"),
          "append_into an expand (the in-place op): %s", cg_last_error());
    cg_graph_free(g);
}

int main(void) {
    test_gradients();
    test_values();
    test_plan();
    test_threads();
    test_writes_refused();
    TEST_END();
}
