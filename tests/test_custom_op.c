/* SPDX-License-Identifier: MIT */
/* Custom ops defined outside the library (ops/custom.h): gradients against finite differences, the
 * composite's gradient against the kernel's, errors as values naming the op, checkpointed
 * recomputation, resets, threads, dot files and bf16 graphs. The op under test, "rowscale", is
 * y[i, j] = x[i, j] * s[i] / (1 + sum_j x[i, j]^2) per row: it saves a per-row factor for backward,
 * asks forward scratch and backward scratch, and runs its rows on cg_parallel_for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cgrad.h"
#include "check.h"

typedef struct {
    int fwd_calls, bwd_calls;
    bool fail_fwd, fail_bwd;
} counters;

typedef struct {
    double gain; /* a parameter, copied into the graph */
} rowscale_params;

static cg_status rowscale_shape(const cg_custom_tensor *in, int n, const void *params, void *user, cg_custom_shape *out) {
    if (in[0].ndim != 2 || in[1].ndim != 1 || in[1].shape[0] != in[0].shape[0])
        return cg_set_error(CG_ERR_SHAPE, "x%s must be [rows, cols] and s%s [rows]", cg_dims_str(in[0].ndim, in[0].shape),
                            cg_dims_str(in[1].ndim, in[1].shape));
    if (!params || ((const rowscale_params *)params)->gain == 0) return cg_set_error(CG_ERR_ARG, "gain must be non-zero");
    out->ndim = 2;
    out->shape[0] = in[0].shape[0], out->shape[1] = in[0].shape[1];
    out->saved_bytes = (size_t)in[0].shape[0] * sizeof(double);     /* 1 / (1 + sum x^2) per row */
    out->scratch_bytes = (size_t)in[0].shape[0] * sizeof(double);   /* sum x^2 per row */
    out->bwd_scratch_bytes = (size_t)in[0].shape[0] * sizeof(double); /* sum_j dy x per row */
    return CG_OK;
}

#define AT(t, i, j) ((cg_real *)(t).data)[(i) * (t).stride[0] + (j) * (t).stride[1]]
#define AT1(t, i) ((cg_real *)(t).data)[(i) * (t).stride[0]]

typedef struct {
    cg_custom_ctx *c;
} rows_ctx;

static void fwd_rows(int64_t lo, int64_t hi, void *p) {
    cg_custom_ctx *c = ((rows_ctx *)p)->c;
    const cg_custom_tensor x = cg_custom_input(c, 0), s = cg_custom_input(c, 1), y = cg_custom_output(c);
    double *inv = cg_custom_saved(c), *sq = cg_custom_scratch(c);
    const double gain = ((const rowscale_params *)cg_custom_params(c))->gain;
    for (int64_t i = lo; i < hi; i++) {
        sq[i] = 0;
        for (int64_t j = 0; j < x.shape[1]; j++) sq[i] += (double)AT(x, i, j) * AT(x, i, j);
        inv[i] = 1 / (1 + sq[i]);
        for (int64_t j = 0; j < x.shape[1]; j++) AT(y, i, j) = (cg_real)(gain * AT(x, i, j) * AT1(s, i) * inv[i]);
    }
}

static cg_status rowscale_fwd(cg_custom_ctx *c) {
    counters *k = cg_custom_user(c);
    if (k) k->fwd_calls++;
    if (k && k->fail_fwd) return cg_set_error(CG_ERR_RANGE, "refusing on purpose");
    rows_ctx r = {c};
    cg_parallel_for(cg_custom_output(c).shape[0], 1, fwd_rows, &r);
    return CG_OK;
}

static void bwd_rows(int64_t lo, int64_t hi, void *p) {
    cg_custom_ctx *c = ((rows_ctx *)p)->c;
    const cg_custom_tensor x = cg_custom_input(c, 0), s = cg_custom_input(c, 1), dx = cg_custom_input_grad(c, 0),
                           ds = cg_custom_input_grad(c, 1), dy = cg_custom_output_grad(c);
    const double *inv = cg_custom_saved(c), gain = ((const rowscale_params *)cg_custom_params(c))->gain;
    double *dot = cg_custom_scratch(c);
    for (int64_t i = lo; i < hi; i++) {
        dot[i] = 0; /* sum_j dy x: y = g s x inv, d inv / d x_j = -2 x_j inv^2 */
        for (int64_t j = 0; j < x.shape[1]; j++) dot[i] += (double)AT(dy, i, j) * AT(x, i, j);
        if (ds.data) AT1(ds, i) += (cg_real)(gain * dot[i] * inv[i]);
        if (dx.data)
            for (int64_t j = 0; j < x.shape[1]; j++)
                AT(dx, i, j) += (cg_real)(gain * AT1(s, i) * (AT(dy, i, j) * inv[i] - 2 * AT(x, i, j) * inv[i] * inv[i] * dot[i]));
    }
}

static cg_status rowscale_bwd(cg_custom_ctx *c) {
    counters *k = cg_custom_user(c);
    if (k) k->bwd_calls++;
    if (k && k->fail_bwd) return cg_set_error(CG_ERR_RANGE, "backward refusing on purpose");
    rows_ctx r = {c};
    cg_parallel_for(cg_custom_output_grad(c).shape[0], 1, bwd_rows, &r);
    return CG_OK;
}

/* The same function from built-in ops: gain * x * s[:, None] / (1 + sum(x^2, axis 1)). */
static cg_tensor *rowscale_composite(cg_graph *g, cg_tensor *const *in, const void *params, void *user) {
    const double gain = ((const rowscale_params *)params)->gain;
    cg_tensor *den = cg_add_scalar(g, cg_sum(g, cg_square(g, in[0]), 1, true), 1);
    cg_tensor *s = cg_reshape(g, in[1], 2, (int64_t[]){cg_dim(in[1], 0), 1});
    return cg_scale(g, cg_div(g, cg_mul(g, in[0], s), den), gain);
}

static counters calls;
static const cg_custom_op rowscale = {"rowscale", 2, rowscale_shape, rowscale_fwd, rowscale_bwd, 3, false, NULL, &calls};
static const cg_custom_op rowscale_fwd_only = {"rowscale_fwd_only", 2, rowscale_shape, rowscale_fwd, NULL, 0, false, NULL, &calls};
static const cg_custom_op rowscale_comp = {"rowscale_comp", 2, rowscale_shape, rowscale_fwd, NULL, 0, false,
                                           rowscale_composite, &calls};

static void fill(cg_tensor *t, uint64_t seed) {
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int64_t i = 0; i < cg_numel(t); i++) cg_data(t)[i] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
}

/* loss = sum(op(x, s) * w) + sum(op(...)^2) / 2 over a [5, 7] x (a transposed view) and s [5]. */
typedef struct {
    cg_graph *g;
    cg_tensor *x, *s, *y, *loss;
} model;

static model build(const cg_custom_op *op, cg_mode mode, bool ckpt) {
    model m = {cg_graph_new(mode), NULL, NULL, NULL, NULL};
    cg_tensor *xt = cg_input(m.g, "xt", CG_REAL, 2, (int64_t[]){7, 5});
    m.s = cg_input(m.g, "s", CG_REAL, 1, (int64_t[]){5});
    fill(xt, 1), fill(m.s, 2);
    if (mode == CG_TRAIN) cg_requires_grad(xt), cg_requires_grad(m.s);
    m.x = cg_transpose(m.g, xt, 0, 1);
    const rowscale_params p = {1.5};
    if (ckpt) cg_checkpoint_begin(m.g);
    cg_tensor *h = cg_tanh(m.g, cg_custom(m.g, op, (cg_tensor *[]){m.x, m.s}, &p, sizeof p));
    m.y = cg_custom(m.g, op, (cg_tensor *[]){h, m.s}, &p, sizeof p);
    if (ckpt) cg_checkpoint_end(m.g), cg_graph_set_checkpointing(m.g, true);
    m.loss = cg_sum_all(m.g, cg_mul(m.g, m.y, m.y));
    m.x = xt;
    return m;
}

static void test_gradients(void) {
    const cg_custom_op *ops[] = {&rowscale, &rowscale_comp};
    for (int k = 0; k < 2; k++) {
        model m = build(ops[k], CG_TRAIN, false);
        CHECK(m.loss, "%s: build: %s", ops[k]->name, cg_last_error());
        cg_gradcheck_result res[2];
        cg_status st = m.loss ? cg_gradcheck(m.g, m.loss, 2, (cg_tensor *[]){m.x, m.s}, 0, res) : CG_ERR_ARG;
        CHECK(!st && res[0].pass && res[1].pass, "%s: gradcheck %s: x rel %.3g, s rel %.3g", ops[k]->name, cg_last_error(),
              st ? 0 : res[0].max_rel_err, st ? 0 : res[1].max_rel_err);
        cg_graph_free(m.g);
    }
    /* the composite's gradient is the kernel's, to round-off */
    model a = build(&rowscale, CG_TRAIN, false), b = build(&rowscale_comp, CG_TRAIN, false);
    cg_retain(a.x), cg_retain(b.x), cg_retain(a.s), cg_retain(b.s);
    CHECK(!cg_graph_forward(a.g) && !cg_graph_backward(a.g, a.loss) && !cg_graph_forward(b.g) &&
              !cg_graph_backward(b.g, b.loss), "runs: %s", cg_last_error());
    double worst = 0;
    for (int64_t i = 0; i < 35; i++) worst = fmax(worst, fabs(cg_grad(a.x)[i] - cg_grad(b.x)[i]));
    for (int64_t i = 0; i < 5; i++) worst = fmax(worst, fabs(cg_grad(a.s)[i] - cg_grad(b.s)[i]));
    CHECK(worst < (sizeof(cg_real) == 8 ? 1e-12 : 1e-5), "composite's gradient differs from the kernel's by %.3g", worst);
    cg_graph_free(a.g), cg_graph_free(b.g);
}

/* the same values and gradients, bit for bit, on 1 and 2 threads, and with checkpointing (where
 * backward recomputes the segment: forward runs again) */
static void test_threads_and_recompute(void) {
    cg_real ref[40], got[40];
    for (int variant = 0; variant < 3; variant++) {
        cg_set_threads(variant == 1 ? 1 : 2);
        model m = build(&rowscale, CG_TRAIN, variant == 2);
        calls = (counters){0};
        CHECK(!cg_graph_forward(m.g) && !cg_graph_backward(m.g, m.loss), "variant %d: %s", variant, cg_last_error());
        memcpy(got, cg_grad(m.x), 35 * sizeof(cg_real));
        memcpy(got + 35, cg_grad(m.s), 5 * sizeof(cg_real));
        if (!variant) memcpy(ref, got, sizeof ref);
        else CHECK(!memcmp(ref, got, sizeof ref), "variant %d: gradients differ from 2 threads without checkpointing", variant);
        CHECK(calls.fwd_calls == (variant == 2 ? 4 : 2) && calls.bwd_calls == 2, "variant %d: %d forwards, %d backwards",
              variant, calls.fwd_calls, calls.bwd_calls);
        cg_graph_free(m.g);
    }
    cg_set_threads(2);
}

static void test_errors(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){3, 4}));
    cg_tensor *s = cg_input(g, "s", CG_REAL, 1, (int64_t[]){3}), *bad = cg_input(g, "b", CG_REAL, 1, (int64_t[]){4});
    const rowscale_params p = {2}, zero = {0};
    CHECK(!cg_custom(g, NULL, (cg_tensor *[]){x, s}, &p, sizeof p) && strstr(cg_last_error(), "NULL"), "NULL op: %s",
          cg_last_error());
    cg_custom_op no_fwd = rowscale;
    no_fwd.forward = NULL;
    CHECK(!cg_custom(g, &no_fwd, (cg_tensor *[]){x, s}, &p, sizeof p) && strstr(cg_last_error(), "[rowscale] the forward kernel is NULL"),
          "NULL forward: %s", cg_last_error());
    cg_custom_op none = rowscale;
    none.n_inputs = 0;
    CHECK(!cg_custom(g, &none, (cg_tensor *[]){x, s}, &p, sizeof p) && strstr(cg_last_error(), "[rowscale] 0 inputs"),
          "no inputs: %s", cg_last_error());
    CHECK(!cg_custom(g, &rowscale, (cg_tensor *[]){x, bad}, &p, sizeof p) &&
              strstr(cg_last_error(), "[rowscale] shape rule: x[3,4] must be [rows, cols] and s[4] [rows]"),
          "shape rule: %s", cg_last_error());
    CHECK(!cg_custom(g, &rowscale, (cg_tensor *[]){x, s}, &zero, sizeof zero) && strstr(cg_last_error(), "gain must be"),
          "params reach the shape rule: %s", cg_last_error());
    CHECK(!cg_custom(g, &rowscale, (cg_tensor *[]){x, NULL}, &p, sizeof p), "a NULL input is refused");
    /* a kernel's failure is the run's error, with the op's name */
    cg_tensor *y = cg_custom(g, &rowscale, (cg_tensor *[]){x, s}, &p, sizeof p);
    cg_tensor *loss = cg_sum_all(g, y);
    calls = (counters){.fail_fwd = true};
    cg_status st = cg_graph_forward(g);
    CHECK(st == CG_ERR_RANGE && strstr(cg_last_error(), "[rowscale] forward failed: refusing on purpose"), "forward: %d %s",
          st, cg_last_error());
    calls = (counters){.fail_bwd = true};
    st = cg_graph_forward(g);
    if (!st) st = cg_graph_backward(g, loss);
    CHECK(st == CG_ERR_RANGE && strstr(cg_last_error(), "[rowscale] backward failed: backward refusing on purpose"),
          "backward: %d %s", st, cg_last_error());
    calls = (counters){0};
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "the graph runs again after the failures: %s", cg_last_error());
    cg_graph_free(g);

    /* forward-only, no composite: refused at backward, naming the op; fine where no gradient flows */
    g = cg_graph_new(CG_TRAIN);
    x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){3, 4}));
    s = cg_input(g, "s", CG_REAL, 1, (int64_t[]){3});
    loss = cg_sum_all(g, cg_custom(g, &rowscale_fwd_only, (cg_tensor *[]){x, s}, &p, sizeof p));
    CHECK(loss && !cg_graph_forward(g), "forward-only op runs forward: %s", cg_last_error());
    st = cg_graph_backward(g, loss);
    CHECK(st == CG_ERR_STATE && strstr(cg_last_error(), "custom op 'rowscale_fwd_only'[3,4] has no backward and no composite"),
          "forward-only backward: %d %s", st, cg_last_error());
    cg_graph_free(g);
    g = cg_graph_new(CG_EVAL);
    x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){3, 4});
    s = cg_input(g, "s", CG_REAL, 1, (int64_t[]){3});
    fill(x, 3), fill(s, 4);
    y = cg_retain(cg_custom(g, &rowscale_fwd_only, (cg_tensor *[]){x, s}, &p, sizeof p));
    CHECK(y && !cg_graph_forward(g), "eval forward: %s", cg_last_error());
    const cg_real *xv = cg_data(x), *sv = cg_data(s);
    double sq = 0;
    for (int j = 0; j < 4; j++) sq += (double)xv[j] * xv[j];
    CHECK_NEAR(cg_data(y)[1], 2 * xv[1] * sv[0] / (1 + sq), 1e-6);
    cg_graph_free(g);
}

/* a composite with a wrong shape or a failed build is an error naming the op */
static cg_tensor *wrong_composite(cg_graph *g, cg_tensor *const *in, const void *params, void *user) {
    return cg_sum(g, in[0], 1, false);
}
static void test_bad_composite(void) {
    cg_custom_op bad = rowscale_comp;
    bad.composite = wrong_composite;
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){3, 4}));
    cg_tensor *s = cg_input(g, "s", CG_REAL, 1, (int64_t[]){3});
    const rowscale_params p = {1};
    CHECK(!cg_custom(g, &bad, (cg_tensor *[]){x, s}, &p, sizeof p) &&
              strstr(cg_last_error(), "[rowscale_comp] the composite gives [3], the op [3,4]"),
          "wrong composite: %s", cg_last_error());
    cg_graph_free(g);
}

/* rebuilt after a reset, and the plan stays put across steps: nothing allocated per step */
static void test_reset_and_steady_memory(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    for (int round = 0; round < 2; round++) {
        cg_graph_reset(g);
        cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){6, 3}));
        cg_tensor *s = cg_input(g, "s", CG_REAL, 1, (int64_t[]){6});
        fill(x, 5), fill(s, 6);
        const rowscale_params p = {0.5};
        cg_tensor *loss = cg_sum_all(g, cg_custom(g, &rowscale_comp, (cg_tensor *[]){x, s}, &p, sizeof p));
        size_t bytes = 0;
        for (int step = 0; step < 4; step++) {
            CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "round %d step %d: %s", round, step, cg_last_error());
            if (step == 1) bytes = cg_graph_bytes(g);
            if (step > 1) CHECK(cg_graph_bytes(g) == bytes, "round %d step %d: %zu bytes, then %zu", round, step, bytes,
                                cg_graph_bytes(g));
        }
    }
    cg_graph_free(g);
}

/* cg_graph_dot shows the op under its own name */
static void test_dot(void) {
    model m = build(&rowscale, CG_TRAIN, false);
    char path[] = "/tmp/cgrad_custom_dot.XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    CHECK(fd >= 0 && !cg_graph_forward(m.g) && !cg_graph_dot(m.g, path), "dot: %s", cg_last_error());
    char *dot = test_slurp(path, NULL);
    CHECK(dot && strstr(dot, "rowscale") && !strstr(dot, " custom"), "dot file: %.300s", dot ? dot : "(none)");
    free(dot);
    unlink(path);
    cg_graph_free(m.g);
}

/* in a bf16 graph the op reads and writes floats: the same values as in float32 */
static void test_bf16(void) {
    if (sizeof(cg_real) != 4 || cg_bf16_unavailable()) {
        printf("bf16 part: not run here (%s)\n", sizeof(cg_real) != 4 ? "float64 build" : cg_bf16_unavailable());
        return;
    }
    model a = build(&rowscale, CG_TRAIN, false), b = build(&rowscale, CG_TRAIN, false);
    CHECK(!cg_graph_set_precision(b.g, CG_BF16), "bf16: %s", cg_last_error());
    cg_retain(a.y), cg_retain(b.y);
    CHECK(!cg_graph_forward(a.g) && !cg_graph_forward(b.g), "runs: %s", cg_last_error());
    CHECK(!memcmp(cg_data(a.y), cg_data(b.y), 35 * sizeof(cg_real)), "bf16 graph changed the custom op's floats");
    cg_graph_free(a.g), cg_graph_free(b.g);
}

int main(void) {
    cg_set_threads(2);
    test_gradients();
    test_threads_and_recompute();
    test_errors();
    test_bad_composite();
    test_reset_and_steady_memory();
    test_dot();
    test_bf16();
    TEST_END();
}
