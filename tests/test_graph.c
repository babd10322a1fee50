/* SPDX-License-Identifier: MIT */
/* The engine against hand-derived numbers and its own promises: forward values of small graphs,
 * gradients that accumulate only where they should, pruning, detach, re-running a built graph
 * without allocating, reset, eval mode, bit-for-bit determinism, and views sharing storage. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

#ifdef CGRAD_DOUBLE
#define TOL 1e-12
#else
#define TOL 2e-6
#endif

#define S(...) ((const int64_t[]){__VA_ARGS__})
/* Reads that must work: a failure says which tensor and why. */
#define READ(t, buf) CHECK(cg_read(t, buf) == CG_OK, "cg_read(%s): %s", #t, cg_last_error())
#define READ_GRAD(t, buf) CHECK(cg_read_grad(t, buf) == CG_OK, "cg_read_grad(%s): %s", #t, cg_last_error())
#define ND(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* An input of the given shape, filled from a literal list of values. */
#define IN(g, name, shape_list, ...) in_real(g, name, ND shape_list, S shape_list, (const cg_real[]){__VA_ARGS__})

static cg_tensor *in_real(cg_graph *g, const char *name, int nd, const int64_t *shape, const cg_real *v) {
    cg_tensor *t = cg_input(g, name, CG_REAL, nd, shape);
    if (t && v) cg_write(t, v);
    return t;
}

static cg_tensor *in_ids(cg_graph *g, const char *name, int nd, const int64_t *shape, const int32_t *v) {
    cg_tensor *t = cg_input(g, name, CG_INT32, nd, shape);
    if (t && v) cg_write_ids(t, v);
    return t;
}

/* Compares t's values (or gradient) in row-major order with expect[n], printing each miss. */
static void expect_values(const char *what, cg_tensor *t, bool grad, const double *expect, int64_t n, double tol) {
    CHECK(t != NULL, "%s: tensor is NULL (%s)", what, cg_last_error());
    if (!t) return;
    CHECK(cg_numel(t) == n, "%s: %lld elements, expected %lld", what, (long long)cg_numel(t), (long long)n);
    if (cg_numel(t) != n) return;
    cg_real *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
    cg_status s = grad ? cg_read_grad(t, buf) : cg_read(t, buf);
    CHECK(s == CG_OK, "%s: read failed: %s", what, cg_last_error());
    int bad = 0;
    for (int64_t i = 0; s == CG_OK && i < n; i++) {
        double scale = fabs(expect[i]) > 1 ? fabs(expect[i]) : 1;
        if (!(fabs((double)buf[i] - expect[i]) <= tol * scale)) {
            if (bad++ < 6)
                fprintf(stderr, "  %s[%lld] = %.9g, expected %.9g\n", what, (long long)i, (double)buf[i], expect[i]);
        }
    }
    CHECK(bad == 0, "%s: %d of %lld elements differ", what, bad, (long long)n);
    free(buf);
}
#define EXPECT(what, t, ...) \
    expect_values(what, t, false, (const double[]){__VA_ARGS__}, (int64_t)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double)), TOL)
#define EXPECT_GRAD(what, t, ...) \
    expect_values(what, t, true, (const double[]){__VA_ARGS__}, (int64_t)(sizeof((const double[]){__VA_ARGS__}) / sizeof(double)), TOL)

static bool all_zero(const cg_real *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (v[i] != 0) return false;
    return true;
}

/* ---- forward values against hand-computed numbers ---- */

static void test_forward_values(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *a = IN(g, "a", (2, 3), 1, 2, 3, 4, 5, 6);
    cg_tensor *b = IN(g, "b", (3, 2), 7, 8, 9, 10, 11, 12);
    cg_tensor *mm = cg_matmul(g, a, b);
    cg_tensor *mmt = cg_matmul(g, cg_transpose(g, b, 0, 1), cg_transpose(g, a, 0, 1)); /* (ab)^T = b^T a^T */
    cg_tensor *bias = IN(g, "bias", (3), 10, 20, 30);
    cg_tensor *row = cg_add(g, a, bias);
    cg_tensor *col = IN(g, "col", (2, 1), 1, 2);
    cg_tensor *outer = cg_add(g, col, cg_reshape(g, bias, 2, S(1, 3)));
    cg_tensor *quot = cg_div(g, a, col);
    cg_tensor *sm = cg_softmax(g, IN(g, "s", (3, 3), 1, 2, 3, 1000, 1000, 1000, -1000, 0, 1000));
    cg_tensor *lsm = cg_log_softmax(g, IN(g, "ls", (1, 3), 1, 2, 3));
    cg_tensor *ln = cg_layernorm(g, IN(g, "ln", (2, 4), 1, 2, 3, 4, 2, 2, 2, 2), IN(g, "gain", (4), 1, 2, 1, 2),
                                 IN(g, "lnb", (4), 0, 0, 1, 1), 1e-5);
    cg_tensor *rs = cg_sum(g, a, 1, false), *cm = cg_mean(g, a, 0, true), *tot = cg_sum_all(g, a);
    CHECK(g && mm && mmt && row && outer && quot && sm && lsm && ln && rs && cm && tot, "build failed: %s", cg_last_error());
    CHECK(cg_graph_forward(g) == CG_OK, "forward: %s", cg_last_error());

    EXPECT("matmul 2x3 @ 3x2", mm, 58, 64, 139, 154);
    EXPECT("matmul of transposed views", mmt, 58, 139, 64, 154);
    EXPECT("add [2,3] + [3]", row, 11, 22, 33, 14, 25, 36);
    EXPECT("add [2,1] + [1,3]", outer, 11, 21, 31, 12, 22, 32);
    EXPECT("div [2,3] / [2,1]", quot, 1, 2, 3, 2, 2.5, 3);
    const double z = 1 + exp(-1.0) + exp(-2.0);
    EXPECT("softmax rows", sm, exp(-2.0) / z, exp(-1.0) / z, 1 / z, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0, 1);
    EXPECT("log_softmax row", lsm, -2 - log(z), -1 - log(z), -log(z));
    /* row 1: mean 2.5, biased variance 1.25; row 2 is constant, so it comes out as the bias */
    const double q = 1 / sqrt(1.25 + 1e-5);
    EXPECT("layernorm rows", ln, -1.5 * q, -0.5 * q * 2, 0.5 * q + 1, 1.5 * q * 2 + 1, 0, 0, 1, 1);
    EXPECT("sum axis 1", rs, 6, 15);
    EXPECT("mean axis 0 keepdim", cm, 2.5, 3.5, 4.5);
    CHECK(cg_ndim(cm) == 2 && cg_dim(cm, 0) == 1 && cg_dim(cm, 1) == 3, "mean keepdim shape");
    CHECK_NEAR(cg_item(tot), 21, 0);
    cg_graph_free(g);

    /* Outputs that are views (a reshape or transpose at the end of a model) stay readable, also
     * when their root feeds other nodes and later buffers could reuse its memory. */
    g = cg_graph_new(CG_TRAIN);
    a = IN(g, "a", (2, 3), 1, 2, 3, 4, 5, 6);
    cg_tensor *r = cg_add_scalar(g, a, 1);
    cg_tensor *flat = cg_reshape(g, r, 1, S(6));
    cg_tensor *tr = cg_transpose(g, cg_scale(g, a, 2), 0, 1);
    cg_tensor *later = cg_sum_all(g, cg_exp(g, cg_scale(g, cg_neg(g, r), 0.5)));
    CHECK(flat && tr && later && cg_graph_forward(g) == CG_OK, "view outputs: %s", cg_last_error());
    EXPECT("reshape output", flat, 2, 3, 4, 5, 6, 7);
    EXPECT("transpose output", tr, 2, 8, 4, 10, 6, 12);
    EXPECT("sum of exp", later, exp(-1.0) + exp(-1.5) + exp(-2.0) + exp(-2.5) + exp(-3.0) + exp(-3.5));
    cg_graph_free(g);
}

static void test_cross_entropy_values(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *lg = cg_requires_grad(IN(g, "logits", (3, 3), 1, 2, 3, 0, 0, 0, 5, 1, 1));
    cg_tensor *tg = in_ids(g, "targets", 1, S(3), (const int32_t[]){2, -100, 0});
    cg_tensor *loss = cg_cross_entropy(g, lg, tg, -100);
    CHECK(loss && cg_graph_forward(g) == CG_OK, "cross_entropy: %s", cg_last_error());
    /* mean over the two targets that are not ignored */
    const double z0 = exp(1.0) + exp(2.0) + exp(3.0), z2 = exp(5.0) + 2 * exp(1.0);
    const double l0 = log(z0) - 3, l2 = log(z2) - 5;
    CHECK_NEAR(cg_item(loss), (l0 + l2) / 2, 1e-6);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    /* d/dlogits = (softmax - onehot) / count, zero on the ignored row */
    EXPECT_GRAD("cross_entropy grad", lg, (exp(1.0) / z0) / 2, (exp(2.0) / z0) / 2, (exp(3.0) / z0 - 1) / 2, 0, 0, 0,
                (exp(5.0) / z2 - 1) / 2, (exp(1.0) / z2) / 2, (exp(1.0) / z2) / 2);

    /* every target ignored: the loss and its gradient are 0, not NaN */
    cg_write_ids(tg, (const int32_t[]){-100, -100, -100});
    CHECK(cg_graph_forward(g) == CG_OK && cg_item(loss) == 0, "all ignored: loss %g", cg_item(loss));
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    EXPECT_GRAD("all-ignored grad", lg, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    cg_graph_free(g);
}

/* ---- backward: accumulation, zeroing, who receives gradients ---- */

static void test_backward_accumulates(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(3, 2));
    cg_tensor *bias = cg_params_add(ps, "b", 1, S(2));
    cg_tensor *frozen = cg_params_add(ps, "frozen", 1, S(2));
    cg_write(w, (const cg_real[]){1, -1, 2, 0.5, -1, 3});
    cg_write(bias, (const cg_real[]){0.5, -0.5});
    cg_write(frozen, (const cg_real[]){2, 3});
    cg_param_set_trainable(frozen, false);
    CHECK(cg_param_trainable(w) && !cg_param_trainable(frozen), "trainable flags");

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = IN(g, "x", (2, 3), 1, 2, 3, 4, 5, 6);          /* plain input: no gradient */
    cg_tensor *u = cg_requires_grad(IN(g, "u", (2, 2), 1, 1, 2, 2)); /* requires-grad input */
    /* loss = sum((x @ w + b) * frozen * u) */
    cg_tensor *h = cg_add(g, cg_matmul(g, x, w), bias);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_mul(g, h, frozen), u));
    CHECK(loss && cg_graph_forward(g) == CG_OK, "build/forward: %s", cg_last_error());
    /* h = [[2.5, 8.5], [8.5, 16]], scaled by [2, 3] per column and u per row */
    CHECK_NEAR(cg_item(loss), 2.5 * 2 + 8.5 * 3 + 2 * (8.5 * 2 + 16 * 3), 1e-4);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    /* dh = frozen * u = [[2, 3], [4, 6]]; dw = x^T dh; db = column sums */
    EXPECT_GRAD("dw", w, 1 * 2 + 4 * 4, 1 * 3 + 4 * 6, 2 * 2 + 5 * 4, 2 * 3 + 5 * 6, 3 * 2 + 6 * 4, 3 * 3 + 6 * 6);
    EXPECT_GRAD("db", bias, 6, 9);
    EXPECT_GRAD("du = h * frozen", u, 5, 25.5, 17, 48);
    EXPECT_GRAD("frozen gets nothing", frozen, 0, 0);
    CHECK(cg_grad(x) == NULL, "a plain input has no gradient buffer");

    int64_t n = cg_params_numel(ps);
    cg_real *first = malloc(sizeof(cg_real) * 8), *again = malloc(sizeof(cg_real) * 8);
    READ_GRAD(w, first);
    READ_GRAD(bias, first + 6);
    /* a second step without zeroing adds the same gradient once more: exactly twice. (A forward
     * comes first: the memory plan may reuse values once backward has read them.) */
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "second step: %s", cg_last_error());
    READ_GRAD(w, again);
    READ_GRAD(bias, again + 6);
    int exact = 0;
    for (int i = 0; i < 8; i++) exact += again[i] == 2 * first[i];
    CHECK(exact == 8, "only %d of 8 parameter gradients doubled exactly", exact);
    /* the requires-grad input is a graph node: its gradient is recomputed, not accumulated */
    EXPECT_GRAD("du after second backward", u, 5, 25.5, 17, 48);
    EXPECT_GRAD("frozen still nothing", frozen, 0, 0);

    cg_params_zero_grad(ps);
    CHECK(all_zero(cg_params_grads(ps), n), "zero_grad left a gradient");
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "third step: %s", cg_last_error());
    READ_GRAD(w, again);
    READ_GRAD(bias, again + 6);
    CHECK(memcmp(first, again, 8 * sizeof(cg_real)) == 0, "after zero_grad, backward gives the first gradient");
    /* backward again with no forward in between: refused, or the same right answer, never a
     * gradient read from values that the first backward's buffers have since overwritten */
    cg_params_zero_grad(ps);
    cg_clear_error();
    cg_status again_status = cg_graph_backward(g, loss);
    if (again_status == CG_OK) {
        READ_GRAD(w, again);
        READ_GRAD(bias, again + 6);
        CHECK(memcmp(first, again, 8 * sizeof(cg_real)) == 0, "a repeated backward gives other gradients");
        EXPECT_GRAD("du from a repeated backward", u, 5, 25.5, 17, 48);
    } else {
        CHECK(strstr(cg_last_error(), "[backward]") != NULL, "repeated backward refused without a message: %s",
              cg_last_error());
    }
    free(first);
    free(again);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The first rule to write a gradient may assign it instead of adding into zeros (unary maps and
 * linear do). With a value read by several ops, whichever runs first must assign and every later
 * one add, in either order: h feeds gelu, tanh and h * h, built in two orders. */
static void test_fanout_first_writer(void) {
    const double u0[3] = {-1.5, 0.25, 2};
    for (int order = 0; order < 2; order++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *u = cg_requires_grad(IN(g, "u", (3), (cg_real)u0[0], (cg_real)u0[1], (cg_real)u0[2]));
        cg_tensor *h = cg_scale(g, u, 1); /* a computed node, so a first writer can claim its gradient */
        cg_tensor *sq = order ? cg_mul(g, h, h) : NULL, *ge = cg_gelu(g, h), *th = cg_tanh(g, h);
        if (!order) sq = cg_mul(g, h, h);
        cg_tensor *loss = cg_sum_all(g, cg_add(g, cg_add(g, ge, th), sq));
        CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "order %d: %s", order,
              cg_last_error());
        double want[3];
        for (int i = 0; i < 3; i++) {
            const double x = u0[i], t = tanh(x);
            want[i] = 0.5 * (1 + erf(x / sqrt(2))) + x * exp(-0.5 * x * x) / sqrt(2 * 3.14159265358979323846) +
                      (1 - t * t) + 2 * x;
        }
        expect_values(order ? "fan-out, mul built first" : "fan-out, mul built last", u, true, want, 3, 1e-5);
        cg_graph_free(g);
    }
}

static void test_detach_and_pruning(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, S(2, 2));
    cg_tensor *w2 = cg_params_add(ps, "w2", 2, S(2, 2));
    cg_tensor *side = cg_params_add(ps, "side", 2, S(2, 2));
    cg_write(w1, (const cg_real[]){1, 2, 3, 4});
    cg_write(w2, (const cg_real[]){1, 0, 0, 2});
    cg_write(side, (const cg_real[]){5, 6, 7, 8});

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = IN(g, "x", (1, 2), 1, 1);
    cg_tensor *h = cg_matmul(g, x, w1); /* [4, 6] */
    /* a side branch built before the loss, reading h: it must not run in backward, or it would
     * add into h's gradient and give side a gradient */
    cg_tensor *branch = cg_sum_all(g, cg_mul(g, h, side));
    /* loss = sum(detach(h) @ w2) + sum(h): w1 sees only the second term */
    cg_tensor *loss = cg_add(g, cg_sum_all(g, cg_matmul(g, cg_detach(g, h), w2)), cg_sum_all(g, h));
    CHECK(branch && loss && cg_graph_forward(g) == CG_OK, "build/forward: %s", cg_last_error());
    CHECK_NEAR(cg_item(loss), 4 + 12 + 10, 1e-5);
    CHECK_NEAR(cg_item(branch), 4 * 5 + 4 * 7 + 6 * 6 + 6 * 8, 1e-4);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    EXPECT_GRAD("w1 (only the undetached term)", w1, 1, 1, 1, 1);
    EXPECT_GRAD("w2 (through detached values)", w2, 4, 4, 6, 6);
    EXPECT_GRAD("side branch gets nothing", side, 0, 0, 0, 0);
    /* the branch can still be differentiated on its own */
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, branch) == CG_OK, "backward(branch): %s",
          cg_last_error());
    EXPECT_GRAD("side from its own loss", side, 4, 6, 4, 6);
    /* h[1,2] broadcasts against side[2,2]: dh = column sums of side */
    EXPECT_GRAD("w1 from the branch", w1, 5 + 7, 6 + 8, 5 + 7, 6 + 8);
    EXPECT_GRAD("w2 not on the branch", w2, 0, 0, 0, 0);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* ---- re-running a built graph, and resetting it ---- */

/* y = tanh(x @ w + b), loss = mean(y^2); returns the loss node */
static cg_tensor *build_small(cg_graph *g, cg_params *ps, cg_tensor **x_out, cg_tensor **y_out) {
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(5, 4));
    cg_tensor *y = cg_tanh(g, cg_linear(g, x, cg_params_find(ps, "w"), cg_params_find(ps, "b")));
    *x_out = x;
    *y_out = cg_retain(y); /* read by the test, so kept out of the memory plan's reuse */
    return cg_mean_all(g, cg_square(g, y));
}

static void reference_small(const cg_real *x, const cg_real *w, const cg_real *b, double *y) {
    for (int i = 0; i < 5; i++)
        for (int o = 0; o < 3; o++) {
            double s = b[o];
            for (int k = 0; k < 4; k++) s += (double)x[i * 4 + k] * w[o * 4 + k];
            y[i * 3 + o] = tanh(s);
        }
}

static void test_rerun_and_reset(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(3, 4)), *b = cg_params_add(ps, "b", 1, S(3));
    cg_rng rng;
    cg_rng_seed(&rng, 7);
    cg_fill_normal(w, &rng, 0, 0.5);
    cg_fill_normal(b, &rng, 0, 0.5);
    cg_real wv[12], bv[3], xv[20];
    READ(w, wv);
    READ(b, bv);

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x, *y, *loss = build_small(g, ps, &x, &y);
    CHECK(loss != NULL, "build: %s", cg_last_error());
    size_t bytes_step2 = 0;
    int wrong = 0;
    for (int step = 1; step <= 10; step++) {
        for (int i = 0; i < 20; i++) xv[i] = (cg_real)(cg_rng_normal(&rng) * step);
        cg_write(x, xv);
        cg_params_zero_grad(ps);
        if (cg_graph_forward(g) || cg_graph_backward(g, loss)) {
            CHECK(0, "step %d: %s", step, cg_last_error());
            break;
        }
        double ref[15], sq = 0;
        reference_small(xv, wv, bv, ref);
        cg_real got[15];
        READ(y, got);
        for (int i = 0; i < 15; i++) {
            wrong += fabs(got[i] - ref[i]) > 1e-5;
            sq += ref[i] * ref[i];
        }
        wrong += fabs(cg_item(loss) - sq / 15) > 1e-5;
        if (step == 2) bytes_step2 = cg_graph_bytes(g);
    }
    CHECK(wrong == 0, "%d values of the re-run graph disagree with the reference", wrong);
    CHECK(cg_graph_bytes(g) == bytes_step2, "graph grew from %zu to %zu bytes between steps 2 and 10", bytes_step2,
          cg_graph_bytes(g));

    /* reset and rebuild the same graph: the kept memory is enough */
    size_t before = cg_graph_bytes(g);
    int nodes = cg_graph_size(g);
    for (int round = 0; round < 3; round++) {
        cg_graph_reset(g);
        CHECK(cg_graph_size(g) == 0, "reset leaves %d nodes", cg_graph_size(g));
        loss = build_small(g, ps, &x, &y);
        cg_write(x, xv);
        CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "rebuild: %s",
              cg_last_error());
        CHECK(cg_graph_size(g) == nodes, "rebuilt graph has %d nodes, not %d", cg_graph_size(g), nodes);
        CHECK(cg_graph_bytes(g) <= before, "rebuild %d grew the graph from %zu to %zu bytes", round, before,
              cg_graph_bytes(g));
        double ref[15], sq = 0;
        reference_small(xv, wv, bv, ref);
        for (int i = 0; i < 15; i++) sq += ref[i] * ref[i];
        CHECK_NEAR(cg_item(loss), sq / 15, 1e-5);
    }
    cg_graph_free(g);
    cg_params_free(ps);
}

/* ---- eval mode and dropout ---- */

static void test_eval_and_dropout(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 1, S(64));
    cg_fill(w, 1.5);
    cg_real xv[64];
    for (int i = 0; i < 64; i++) xv[i] = (cg_real)(i + 1);

    cg_graph *e = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_requires_grad(in_real(e, "x", 1, S(64), xv));
    cg_tensor *d = cg_dropout(e, x, 0.5);
    cg_tensor *y = cg_mul(e, d, w);
    cg_tensor *loss = cg_sum_all(e, y);
    CHECK(d == x, "eval dropout is the identity (the same tensor)");
    CHECK(loss && cg_graph_forward(e) == CG_OK, "eval forward: %s", cg_last_error());
    CHECK_NEAR(cg_item(loss), 1.5 * 64 * 65 / 2, 1e-3);
    cg_clear_error();
    CHECK(cg_graph_backward(e, loss) == CG_ERR_STATE, "eval backward must fail");
    CHECK(strstr(cg_last_error(), "[backward]") && strstr(cg_last_error(), "eval"), "message: %s", cg_last_error());
    CHECK(cg_grad(x) == NULL && cg_grad(y) == NULL && cg_grad(loss) == NULL, "eval nodes have no gradient buffers");
    cg_graph_free(e);

    /* train mode: inverted dropout keeps each element as 2x or drops it; backward uses the same mask */
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_graph_set_rng(g, 42, 0);
    x = cg_requires_grad(in_real(g, "x", 1, S(64), xv));
    d = cg_retain(cg_dropout(g, x, 0.5));
    loss = cg_sum_all(g, d);
    CHECK(d != x && loss && cg_graph_forward(g) == CG_OK, "train forward: %s", cg_last_error());
    CHECK(cg_graph_rng_step(g) == 1, "forward advances the dropout step to %llu", (unsigned long long)cg_graph_rng_step(g));
    cg_real dv[64], gx[64], first[64];
    READ(d, dv);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    READ_GRAD(x, gx);
    int kept = 0, bad = 0;
    for (int i = 0; i < 64; i++) {
        bool k = dv[i] != 0;
        kept += k;
        bad += k ? (dv[i] != 2 * xv[i] || gx[i] != 2) : gx[i] != 0;
    }
    CHECK(bad == 0, "%d elements break the dropout mask rule", bad);
    CHECK(kept > 16 && kept < 48, "kept %d of 64 at p = 0.5", kept);
    memcpy(first, dv, sizeof dv);
    CHECK(cg_graph_forward(g) == CG_OK, "second forward");
    READ(d, dv);
    CHECK(memcmp(first, dv, sizeof dv) != 0, "the next step draws a new mask");
    cg_graph_set_rng(g, 42, 0);
    CHECK(cg_graph_forward(g) == CG_OK, "replayed forward");
    READ(d, dv);
    CHECK(memcmp(first, dv, sizeof dv) == 0, "the same seed and step replay the same mask");
    CHECK(cg_dropout(g, x, 0) == x, "p = 0 is the identity");
    cg_graph_free(g);
    cg_params_free(ps);
}

/* ---- determinism ---- */

enum { DB = 8, DT = 64, DD = 64, DH = 128, DV = 256 };

typedef struct {
    cg_real *out;  /* logits or other output */
    int64_t nout;
    cg_real *grads;
    int64_t ngrads;
    double loss;
} snapshot;

static void snapshot_free(snapshot *s) {
    free(s->out);
    free(s->grads);
}

static cg_params *det_params(void) {
    cg_params *ps = cg_params_new();
    cg_rng rng;
    cg_rng_seed(&rng, 1234);
    struct { const char *name; int nd; int64_t s0, s1; double std; } spec[] = {
        {"wte", 2, DV, DD, 0.5}, {"ln1.g", 1, DD, 0, 0.2}, {"ln1.b", 1, DD, 0, 0.2}, {"w1", 2, DH, DD, 0.1},
        {"b1", 1, DH, 0, 0.1},   {"w2", 2, DH, DD, 0.1},   {"ln2.g", 1, DD, 0, 0.2}, {"ln2.b", 1, DD, 0, 0.2},
        {"scale", 1, DD, 0, 0.3}, {"head", 2, DV, DD, 0.1},
    };
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        cg_tensor *p = cg_params_add(ps, spec[i].name, spec[i].nd, S(spec[i].s0, spec[i].s1));
        cg_fill_normal(p, &rng, strstr(spec[i].name, ".g") ? 1 : 0, spec[i].std);
    }
    return ps;
}

static void det_data(cg_tensor *ids, cg_tensor *tg, int vocab) {
    cg_rng rng;
    cg_rng_seed(&rng, 99);
    for (int i = 0; i < DB * DT; i++) {
        cg_idata(ids)[i] = (int32_t)(cg_rng_next(&rng) % DV);
        cg_idata(tg)[i] = i % 7 == 3 ? -1 : (int32_t)(cg_rng_next(&rng) % (uint64_t)vocab);
    }
}

/* An MLP-ish block with attention-like mixing; every big op is above CGI_PAR_MIN elements.
 * with_matmul = false keeps only kernels that are deterministic by design (no BLIS). */
static snapshot det_run(cg_params *ps, int threads, uint64_t seed, bool with_matmul) {
    snapshot s = {0};
    cg_set_threads(threads);
    cg_params_zero_grad(ps);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_graph_set_rng(g, seed, 0);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, S(DB, DT));
    cg_tensor *tg = cg_input(g, "targets", CG_INT32, 2, S(DB, DT));
    det_data(ids, tg, with_matmul ? DV : DD);
#define P(n) cg_params_find(ps, n)
    cg_tensor *h = cg_embedding(g, P("wte"), ids);                      /* [8,64,64] */
    h = cg_dropout(g, cg_layernorm(g, h, P("ln1.g"), P("ln1.b"), 1e-5), 0.1);
    cg_tensor *out, *aux;
    if (with_matmul) {
        cg_tensor *f = cg_gelu(g, cg_linear(g, h, P("w1"), P("b1")));  /* [8,64,128] */
        f = cg_dropout(g, cg_matmul(g, f, P("w2")), 0.1);               /* [8,64,64] */
        h = cg_layernorm(g, cg_add(g, h, f), P("ln2.g"), P("ln2.b"), 1e-5);
        cg_tensor *att = cg_softmax(g, cg_scale(g, cg_matmul(g, h, cg_transpose(g, h, 1, 2)), 0.125));
        h = cg_add(g, h, cg_matmul(g, att, h));
        out = cg_linear(g, h, P("head"), NULL);                         /* [8,64,256] */
        aux = cg_mean_all(g, cg_square(g, cg_sum(g, f, -1, false)));
    } else {
        h = cg_mul(g, cg_gelu(g, h), P("scale"));                       /* broadcast: reduced grad */
        h = cg_layernorm(g, h, P("ln2.g"), P("ln2.b"), 1e-5);
        cg_tensor *att = cg_masked_softmax(g, cg_reshape(g, h, 4, S(DB, 4, 16, DD)), 0.5, NULL, true, NULL);
        out = cg_add(g, h, cg_reshape(g, att, 3, S(DB, DT, DD)));
        aux = cg_mean_all(g, cg_square(g, cg_sum(g, cg_softmax(g, out), 1, false)));
    }
#undef P
    cg_retain(out);
    cg_tensor *loss = cg_add(g, cg_cross_entropy(g, out, tg, -1), cg_scale(g, aux, 0.01));
    if (!loss || cg_graph_forward(g) || cg_graph_backward(g, loss)) {
        CHECK(0, "determinism graph: %s", cg_last_error());
        cg_graph_free(g);
        return s;
    }
    s.loss = cg_item(loss);
    s.nout = cg_numel(out);
    s.out = malloc((size_t)s.nout * sizeof *s.out);
    READ(out, s.out);
    s.ngrads = cg_params_numel(ps);
    s.grads = malloc((size_t)s.ngrads * sizeof *s.grads);
    for (int i = 0, at = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        READ_GRAD(p, s.grads + at);
        at += (int)cg_numel(p);
    }
    cg_graph_free(g);
    return s;
}

static bool same_bits(const snapshot *a, const snapshot *b) {
    return a->out && b->out && a->nout == b->nout && a->ngrads == b->ngrads &&
           memcmp(a->out, b->out, (size_t)a->nout * sizeof *a->out) == 0 &&
           memcmp(a->grads, b->grads, (size_t)a->ngrads * sizeof *a->grads) == 0 && a->loss == b->loss;
}

static double max_rel_diff(const cg_real *a, const cg_real *b, int64_t n) {
    double m = 0, big = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m) m = d;
        if (fabs((double)b[i]) > big) big = fabs((double)b[i]);
    }
    return m / big;
}

static void test_determinism(void) {
    int saved = cg_threads();
    cg_params *ps = det_params();
    for (int mm = 0; mm < 2; mm++) {
        const char *kind = mm ? "with BLIS matmuls" : "without matmuls";
        /* same seed and same thread count: bit for bit, at 2 threads and at 1 */
        snapshot a = det_run(ps, 2, 5, mm), b = det_run(ps, 2, 5, mm);
        CHECK(same_bits(&a, &b), "%s: two runs with seed 5 on 2 threads differ", kind);
        CHECK(a.grads && !all_zero(a.grads, a.ngrads) && isfinite(a.loss), "%s: the run computed gradients", kind);
        snapshot c = det_run(ps, 1, 5, mm), d = det_run(ps, 1, 5, mm);
        CHECK(same_bits(&c, &d), "%s: two runs with seed 5 on 1 thread differ", kind);
        /* a different dropout seed must change the result, or the test above proves nothing */
        snapshot e = det_run(ps, 2, 6, mm);
        CHECK(e.out && a.out && memcmp(a.out, e.out, (size_t)a.nout * sizeof *a.out) != 0,
              "%s: seed 6 gives the same output as seed 5", kind);
        /* 1 thread vs 2: the hand-written kernels (layernorm gain/bias grads, embedding scatter,
         * reductions, column sums, dropout masks, row-wise softmax/cross-entropy) fix their
         * summation order independently of the thread count, so without matmuls the results are
         * bit-identical. BLIS is only required to be close: its threaded paths never split the k
         * loop in the versions we use, but a BLIS build may pick other blockings or kernels for
         * another thread count, which would reorder the sums. */
        if (!mm) CHECK(same_bits(&a, &c), "%s: 1 thread and 2 threads differ", kind);
        else if (a.out && c.out) {
            double dout = max_rel_diff(a.out, c.out, a.nout), dg = max_rel_diff(a.grads, c.grads, a.ngrads);
            CHECK(dout < 1e-5 && dg < 1e-4, "%s: 1 vs 2 threads: outputs %.3g, grads %.3g apart", kind, dout, dg);
            if (!same_bits(&a, &c)) printf("note: %s, 1 and 2 threads are close but not bit-identical\n", kind);
        }
        snapshot_free(&a);
        snapshot_free(&b);
        snapshot_free(&c);
        snapshot_free(&d);
        snapshot_free(&e);
    }
    cg_params_free(ps);
    cg_set_threads(saved);
}

/* ---- views ---- */

static void test_views(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(IN(g, "x", (3, 4), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
    cg_tensor *s = cg_slice(g, x, 1, 1, 3); /* columns 1..2 */
    cg_tensor *t = cg_transpose(g, x, 0, 1);
    cg_tensor *flat = cg_retain(cg_reshape(g, t, 1, S(12))); /* not contiguous: a copy */
    cg_tensor *same = cg_reshape(g, x, 2, S(2, 6)); /* contiguous: a view */
    cg_tensor *c = IN(g, "c", (12), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, flat, c));
    CHECK(s && t && flat && same && loss, "build: %s", cg_last_error());
    CHECK(!cg_is_contiguous(s) && cg_strides(s)[0] == 4 && cg_strides(s)[1] == 1, "slice strides");
    CHECK(!cg_is_contiguous(t) && cg_strides(t)[0] == 1 && cg_strides(t)[1] == 4, "transpose strides");
    CHECK(cg_graph_forward(g) == CG_OK, "forward: %s", cg_last_error());
    EXPECT("slice", s, 1, 2, 5, 6, 9, 10);
    EXPECT("reshape of a transpose", flat, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    CHECK(cg_data(same) == cg_data(x), "reshape of a contiguous tensor is a view");
    CHECK(cg_data(s) == cg_data(x) + 1, "the slice starts one element into x");

    /* writing through the slice writes x; the copy made by reshape keeps the old values until
     * the next forward recomputes it */
    cg_data(s)[1 * cg_strides(s)[0] + 1] = 100; /* s[1][1] is x[1][2] */
    cg_write(s, (const cg_real[]){-1, -2, -5, 100, -9, -10});
    EXPECT("x after writes through the slice", x, 0, -1, -2, 3, 4, -5, 100, 7, 8, -9, -10, 11);
    EXPECT("copy untouched", flat, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    CHECK(cg_graph_forward(g) == CG_OK, "forward");
    EXPECT("copy recomputed", flat, 0, 4, 8, -1, -5, -9, -2, 100, -10, 3, 7, 11);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    /* flat[i] = x[i % 3][i / 3], so dx[r][k] = c[3k + r] */
    EXPECT_GRAD("gradient through the copy", x, 1, 4, 7, 10, 2, 5, 8, 11, 3, 6, 9, 12);
    cg_graph_free(g);

    /* split_heads / merge_heads and split / concat round trips, values and gradients */
    g = cg_graph_new(CG_TRAIN);
    enum { B = 2, T = 5, H = 3, D = 4 };
    cg_real xv[B * T * H * D], cv[B * T * H * D];
    for (int i = 0; i < B * T * H * D; i++) xv[i] = (cg_real)i, cv[i] = (cg_real)(i % 7 - 3);
    x = cg_requires_grad(in_real(g, "x", 3, S(B, T, H * D), xv));
    cg_tensor *heads = cg_split_heads(g, x, H);
    cg_tensor *back = cg_retain(cg_merge_heads(g, cg_scale(g, heads, 2)));
    cg_tensor *parts[3];
    CHECK(cg_split(g, x, 2, 3, (const int64_t[]){5, 3, 4}, parts) == CG_OK, "split: %s", cg_last_error());
    cg_tensor *joined = cg_retain(cg_concat(g, 3, parts, 2));
    loss = cg_add(g, cg_sum_all(g, cg_mul(g, back, in_real(g, "c", 3, S(B, T, H * D), cv))), cg_sum_all(g, joined));
    CHECK(heads && back && joined && loss && cg_graph_forward(g) == CG_OK, "heads graph: %s", cg_last_error());
    CHECK(cg_ndim(heads) == 4 && cg_dim(heads, 1) == H && cg_dim(heads, 2) == T && cg_dim(heads, 3) == D, "heads shape");
    CHECK(cg_data(heads) == cg_data(x), "split_heads of a contiguous tensor is a view");
    int bad = 0;
    const int64_t *hs = cg_strides(heads);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t2 = 0; t2 < T; t2++)
                for (int d = 0; d < D; d++)
                    bad += cg_data(heads)[b * hs[0] + h * hs[1] + t2 * hs[2] + d * hs[3]] !=
                           xv[(b * T + t2) * H * D + h * D + d];
    CHECK(bad == 0, "%d split_heads elements misplaced", bad);
    CHECK(cg_graph_backward(g, loss) == CG_OK, "backward: %s", cg_last_error());
    cg_real got[B * T * H * D], gx[B * T * H * D], jv[B * T * H * D];
    READ(back, got);
    READ(joined, jv);
    READ_GRAD(x, gx);
    int bad_back = 0, bad_join = 0, bad_grad = 0;
    for (int i = 0; i < B * T * H * D; i++) {
        bad_back += got[i] != 2 * xv[i];
        bad_join += jv[i] != xv[i];
        bad_grad += gx[i] != 2 * cv[i] + 1;
    }
    CHECK(bad_back == 0, "%d merge(split(x)) elements differ from 2x", bad_back);
    CHECK(bad_join == 0, "%d concat(split(x)) elements differ from x", bad_join);
    CHECK(bad_grad == 0, "%d gradients through the round trips wrong", bad_grad);
    cg_graph_free(g);
}

/* append_into grows a caller's buffer in place, as a KV cache does from step to step: the
 * result views the buffer, the rows before `at` are kept, and a consumer reads the new rows. */
static void test_append_into(void) {
    cg_real store[2 * 4 * 3]; /* [2, cap 4, 3] */
    for (int i = 0; i < 24; i++) store[i] = -1;
    for (int step = 0; step < 2; step++) {
        cg_graph *g = cg_graph_new(CG_EVAL);
        cg_tensor *buf = cg_wrap(g, "cache", CG_REAL, 3, S(2, 4, 3), S(12, 3, 1), store);
        const int64_t at = step ? 2 : 0, n = step ? 1 : 2;
        cg_tensor *x = cg_input(g, "x", CG_REAL, 3, S(2, n, 3));
        cg_real xv[12];
        for (int i = 0; i < 2 * n * 3; i++) xv[i] = (cg_real)(10 * (step + 1) + i);
        cg_write(x, xv);
        cg_tensor *grown = cg_append_into(g, buf, at, x, 1);
        cg_tensor *sum = cg_retain(cg_sum(g, grown, 1, false)); /* [2, 3] over the rows so far */
        cg_tensor *head = cg_retain(cg_sum_all(g, cg_slice(g, grown, 0, 1, 2))); /* through a view of it */
        CHECK(grown && sum && head && cg_graph_forward(g) == CG_OK, "append_into step %d: %s", step, cg_last_error());
        CHECK_NEAR(cg_item(head), step ? 16 + 17 + 18 + 19 + 20 + 21 + 23 + 24 + 25 : 16 + 17 + 18 + 19 + 20 + 21, 1e-4);
        CHECK(cg_data(grown) == store && cg_dim(grown, 1) == at + n && cg_strides(grown)[0] == 12,
              "append_into step %d: a view of the buffer with its strides", step);
        if (step == 0) EXPECT("sums after appending 2 rows", sum, 10 + 13, 11 + 14, 12 + 15, 16 + 19, 17 + 20, 18 + 21);
        else EXPECT("sums after appending a third row", sum, 10 + 13 + 20, 11 + 14 + 21, 12 + 15 + 22, 16 + 19 + 23,
                    17 + 20 + 24, 18 + 21 + 25);
        cg_graph_free(g);
    }
    CHECK(store[3 * 3] == -1 && store[12 + 3 * 3 + 2] == -1, "rows past the appended ones untouched");

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *buf = cg_wrap(g, "cache", CG_REAL, 3, S(2, 4, 3), S(12, 3, 1), store);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 3, S(2, 2, 3));
    cg_clear_error();
    CHECK(cg_append_into(g, buf, 3, x, 1) == NULL && strstr(cg_last_error(), "[append_into]") &&
              strstr(cg_last_error(), "does not fit"), "overflowing the buffer is refused: %s", cg_last_error());
    CHECK(cg_append_into(g, cg_scale(g, x, 1), 0, x, 1) == NULL && strstr(cg_last_error(), "input leaf"),
          "a computed buf is refused: %s", cg_last_error());
    CHECK(cg_append_into(g, buf, 0, cg_requires_grad(cg_input(g, "y", CG_REAL, 3, S(2, 1, 3))), 1) == NULL &&
              strstr(cg_last_error(), "gradient"), "a gradient is refused: %s", cg_last_error());
    cg_graph_free(g);
}

/* Names are found through a hash index, across its regrowths: every one of the 2^18 parameters a
 * set may hold is found as itself, an absent name is not, a taken name is refused, and one more is
 * refused with the limit named. A scan per lookup made adding n parameters O(n^2): 300,000 took
 * about ten minutes (extrapolated from 32,000 in 8 s) where they now take well under a second. */
static void test_params_many_names(void) {
    enum { N = 1 << 18 };
    cg_params *ps = cg_params_new();
    char name[32];
    int added = 0, found = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%d.w", i);
        added += cg_params_add(ps, name, 0, NULL) != NULL;
    }
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%d.w", i);
        found += cg_params_find(ps, name) == cg_params_at(ps, i);
    }
    CHECK(added == N && found == N && cg_params_count(ps) == N, "added %d, found %d of %d", added, found, N);
    CHECK(!cg_params_find(ps, "layer.262144.w") && !cg_params_find(ps, "layer.1.") && !cg_params_find(ps, ""),
          "absent names are not found");
    CHECK(!cg_params_add(ps, "layer.123456.w", 0, NULL) && strstr(cg_last_error(), "already taken"),
          "a taken name is refused: %s", cg_last_error());
    CHECK(!cg_params_add(ps, "one.more", 0, NULL) && strstr(cg_last_error(), "at most 262144 tensors") &&
              strstr(cg_last_error(), "one.more") && cg_params_count(ps) == N,
          "the tensor past the limit is refused: %s", cg_last_error());
    cg_params_free(ps);
}

int main(void) {
    test_forward_values();
    test_cross_entropy_values();
    test_backward_accumulates();
    test_fanout_first_writer();
    test_detach_and_pruning();
    test_rerun_and_reset();
    test_eval_and_dropout();
    test_determinism();
    test_views();
    test_append_into();
    test_params_many_names();
    TEST_END();
}
