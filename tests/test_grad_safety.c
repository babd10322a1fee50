/* SPDX-License-Identifier: MIT */
/* Gradients that must be right whatever the caller does: inputs whose gradients share storage
 * (2 threads bit for bit as 1), inputs the loss does not reach (exactly zero), and misuse that
 * must be an error with a message rather than a silent zero or NaN. */
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"

/* ---- aliasing: two gradient writes into one storage ---- */

typedef cg_tensor *(*alias_build)(cg_graph *g, cg_tensor *z);

static cg_tensor *gram(cg_graph *g, cg_tensor *z) { return cg_linear(g, z, z, NULL); } /* z z^T */
static cg_tensor *gram_lce(cg_graph *g, cg_tensor *z) {
    const int64_t n = cg_dim(z, 0), s[1] = {n};
    cg_tensor *t = cg_input(g, "t", CG_INT32, 1, s);
    for (int64_t i = 0; i < n; i++) cg_idata(t)[i] = (int32_t)((i * 7) % n);
    return cg_linear_cross_entropy(g, z, z, NULL, t, -100);
}
/* q, k and v one tensor, as in self-attention written plainly */
static cg_tensor *self_attn(cg_graph *g, cg_tensor *z) {
    int64_t s[4] = {2, 4, cg_dim(z, 0) / 8, cg_dim(z, 1)};
    cg_tensor *x = cg_reshape(g, z, 4, s);
    return cg_sdpa(g, x, x, x, 0.3, true, NULL);
}
/* keys are the queries shifted by one head: head h of k is head h+1 of q, so two threads working
 * on different heads write one gradient region */
static cg_tensor *shifted_heads(cg_graph *g, cg_tensor *z) {
    int64_t s[4] = {1, 8, cg_dim(z, 0) / 8, cg_dim(z, 1)};
    cg_tensor *x = cg_reshape(g, z, 4, s);
    return cg_sdpa(g, cg_slice(g, x, 1, 0, 7), cg_slice(g, x, 1, 1, 8), cg_slice(g, x, 1, 0, 7), 0.3, false, NULL);
}

/* d(sum(f(z) * R))/dz with the given thread count, into dz. */
static void alias_grad(alias_build f, int64_t rows, int64_t cols, int threads, cg_real *dz) {
    cg_set_threads(threads);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    int64_t s[2] = {rows, cols};
    cg_tensor *z = cg_requires_grad(cg_input(g, "z", CG_REAL, 2, s));
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_fill_uniform(z, &r, -1, 1);
    cg_tensor *y = f(g, z);
    cg_tensor *loss = y;
    if (cg_numel(y) != 1) {
        cg_tensor *w = cg_input(g, "R", CG_REAL, cg_ndim(y), cg_shape(y));
        cg_fill_uniform(w, &r, -1, 1);
        loss = cg_sum_all(g, cg_mul(g, y, w));
    }
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read_grad(z, dz);
    cg_graph_free(g);
}

static void test_alias_bits(const char *name, alias_build f, int64_t rows, int64_t cols, int runs) {
    const int64_t n = rows * cols;
    cg_real *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    alias_grad(f, rows, cols, 1, ref);
    int differ = 0;
    double worst = 0;
    for (int run = 0; run < runs; run++) {
        alias_grad(f, rows, cols, 2, got);
        if (memcmp(ref, got, (size_t)n * sizeof *ref)) differ++;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)got[i] - ref[i]) / (fabs((double)ref[i]) + 1e-6);
            if (e > worst) worst = e;
        }
    }
    CHECK(differ == 0, "%s: 2-thread dz differs from 1-thread in %d of %d runs (worst rel %.3g)", name, differ, runs,
          worst);
    free(ref);
    free(got);
    cg_set_threads(0);
}


/* ---- inputs the loss does not reach read exactly zero ---- */

static bool all_zero(cg_tensor *t) {
    const int64_t n = cg_numel(t);
    cg_real *v = malloc((size_t)n * sizeof *v);
    bool z = v && cg_read_grad(t, v) == CG_OK;
    for (int64_t i = 0; z && i < n; i++) z = v[i] == 0 && !signbit(v[i]);
    free(v);
    return z;
}

static void test_unreached_zero(void) {
    int64_t s[2] = {3, 4};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    for (int round = 0; round < 2; round++) { /* the second after a reset, over recycled memory */
        cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 2, s));
        cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 2, s));
        cg_fill(a, 0.5);
        cg_fill(b, 2.0);
        cg_tensor *l1 = cg_sum_all(g, cg_mul(g, a, b)), *l2 = cg_sum_all(g, cg_square(g, a));
        cg_tensor *y = cg_retain(cg_exp(g, b)); /* a retained node off l2's path */
        cg_tensor *l3 = cg_sum_all(g, cg_mul(g, y, a));
        CHECK(l3 && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, l1) == CG_OK, "%s", cg_last_error());
        CHECK(round == 1 || !all_zero(b), "round %d: b holds dl1/db", round);
        CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, l2) == CG_OK, "%s", cg_last_error());
        CHECK(all_zero(b), "round %d: b's gradient after backward(l2), which ignores b, is not zero", round);
        CHECK(all_zero(y), "round %d: retained exp(b)'s gradient after backward(l2) is not zero", round);
        CHECK(!all_zero(a), "round %d: a's gradient is zero", round);
        cg_graph_reset(g);
    }
    /* after a reset the new leaves land on the old gradients: unreached from the start */
    for (int round = 0; round < 2; round++) {
        cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 2, s));
        cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 2, s));
        cg_fill(a, 1.5);
        cg_tensor *l = round ? cg_sum_all(g, cg_square(g, a)) : cg_sum_all(g, cg_mul(g, a, b));
        CHECK(l && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, l) == CG_OK, "%s", cg_last_error());
        if (round) CHECK(all_zero(b), "after reset: unreached b reads recycled memory");
        cg_graph_reset(g);
    }
    /* gradcheck with respect to an input the output ignores: analytic 0 = numeric 0 */
    cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 2, s));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 2, s));
    cg_fill(a, 0.7);
    cg_fill(b, 1.0);
    cg_tensor *warm = cg_sum_all(g, cg_mul(g, a, b)); /* leaves dl/db = a in b's gradient */
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, warm) == CG_OK, "%s", cg_last_error());
    cg_gradcheck_result res[2];
    CHECK(cg_gradcheck(g, cg_tanh(g, a), 2, (cg_tensor *[]){a, b}, 0, res) == CG_OK, "%s", cg_last_error());
    CHECK(res[1].max_abs_err == 0, "gradcheck on an ignored input: abs err %g (stale gradient)", res[1].max_abs_err);
    cg_graph_free(g);
}

/* ---- misuse is an error with a message ---- */

static bool error_says(const char *part) { return strstr(cg_last_error(), part) != NULL; }

static void test_misuse(void) {
    int64_t s[2] = {2, 3};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, s);
    cg_tensor *y = cg_sum_all(g, cg_square(g, x));
    cg_clear_error();
    CHECK(cg_requires_grad(x) == NULL && error_says("[requires_grad]") && error_says("already used"),
          "requires_grad after use: %s", cg_last_error());
    cg_tensor *fresh = cg_input(g, "fresh", CG_REAL, 2, s);
    CHECK(cg_requires_grad(fresh) == fresh, "requires_grad before use: %s", cg_last_error());

    /* cg_item: an intermediate value not retained, and a tensor of several elements */
    cg_tensor *mid = cg_exp(g, x);
    cg_tensor *z = cg_sum_all(g, mid);
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_clear_error();
    CHECK(isnan(cg_item(cg_sum_all(g, mid))) && error_says("[item]"), "item before the run: %s", cg_last_error());
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_clear_error();
    CHECK(isnan(cg_item(mid)) && error_says("[item]"), "item of a %lld-element node: '%s'", (long long)cg_numel(mid),
          cg_last_error());
    cg_tensor *one = cg_sum_all(g, cg_square(g, z)); /* z is read by it: an intermediate */
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_clear_error();
    CHECK(isnan(cg_item(z)) && error_says("cg_retain"), "item of an intermediate: '%s'", cg_last_error());
    CHECK(cg_item(one) > 0 && cg_item(y) >= 0, "outputs stay readable");

    /* scalar arguments that make every value garbage */
    cg_clear_error();
    CHECK(cg_pow(g, x, NAN) == NULL && error_says("[pow]"), "pow(x, NaN): %s", cg_last_error());
    CHECK(cg_pow(g, x, INFINITY) == NULL && error_says("finite"), "pow(x, inf): %s", cg_last_error());
    CHECK(cg_scale(g, x, NAN) == NULL && error_says("[scale]"), "scale(x, NaN): %s", cg_last_error());
    CHECK(cg_add_scalar(g, x, -INFINITY) == NULL, "add_scalar(x, -inf) accepted");
    CHECK(cg_clamp(g, x, -INFINITY, 1) != NULL, "clamp keeps +-inf as no bound: %s", cg_last_error());
    cg_graph_free(g);

    /* a parameter made trainable after a graph was built on it */
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, s);
    cg_fill(w, 0.5);
    cg_param_set_trainable(w, false);
    g = cg_graph_new(CG_TRAIN);
    cg_tensor *in = cg_requires_grad(cg_input(g, "in", CG_REAL, 2, s));
    cg_fill(in, 2.0);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, in, w)); /* mul needs a gradient anyway: dw arrives */
    cg_param_set_trainable(w, true);
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK && cg_grad(w)[0] == 2.0,
          "unfrozen, through a node that needs a gradient anyway: %s", cg_last_error());
    cg_graph_free(g);
    cg_param_set_trainable(w, false);
    g = cg_graph_new(CG_TRAIN);
    in = cg_requires_grad(cg_input(g, "in", CG_REAL, 2, s));
    loss = cg_add(g, cg_sum_all(g, in), cg_sum_all(g, cg_square(g, w))); /* square(w) was built gradient-free */
    cg_param_set_trainable(w, true);
    cg_clear_error();
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_ERR_STATE && error_says("'w'") &&
              error_says("trainable"), "unfrozen after build: '%s'", cg_last_error());
    cg_graph_free(g);
    g = cg_graph_new(CG_TRAIN); /* rebuilt: the gradient arrives */
    in = cg_requires_grad(cg_input(g, "in", CG_REAL, 2, s));
    cg_fill(in, 2.0);
    loss = cg_sum_all(g, cg_mul(g, in, w));
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    CHECK(cg_grad(w)[0] == 2.0, "dw = %g after rebuilding", (double)cg_grad(w)[0]);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* ---- gradcheck: elementwise atol + rtol, the worst element, non-leaf nodes ---- */

static void test_gradcheck(void) {
    int64_t s[2] = {3, 4};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 2, s));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 2, s));
    cg_rng r;
    cg_rng_seed(&r, 3);
    cg_fill_uniform(a, &r, -1, 1);
    cg_fill_uniform(b, &r, 1, 2);
    /* a's gradient (1e-5 a) is tiny beside the loss (about 30): its finite differences are all
     * round-off, far off relatively but within the absolute tolerance */
    cg_tensor *loss = cg_add(g, cg_sum_all(g, cg_square(g, b)), cg_scale(g, cg_sum_all(g, cg_square(g, a)), 5e-6));
    cg_gradcheck_result res[3];
    CHECK(cg_gradcheck(g, loss, 2, (cg_tensor *[]){a, b}, 0, res) == CG_OK, "%s", cg_last_error());
    CHECK(res[0].pass && res[1].pass, "tiny gradients: pass %d %d (a: element %lld analytic %g numeric %g)", res[0].pass,
          res[1].pass, (long long)res[0].worst, res[0].analytic, res[0].numeric);
    CHECK(res[0].max_rel_err > CG_GRADCHECK_TOL, "a's error relative to its own scale (%g) should show the round-off "
          "that failed this check before the absolute tolerance", res[0].max_rel_err);
    cg_real ga[12];
    cg_read_grad(a, ga);
    CHECK(res[0].worst >= 0 && res[0].worst < 12 && res[0].analytic == ga[res[0].worst], "worst element %lld: %g vs %g",
          (long long)res[0].worst, res[0].analytic, res[0].worst >= 0 && res[0].worst < 12 ? (double)ga[res[0].worst] : 0.0);
    CHECK(fabs(res[1].analytic - res[1].numeric) <= CG_GRADCHECK_ATOL + CG_GRADCHECK_RTOL * fabs(res[1].numeric),
          "b's worst element %lld: %g vs %g", (long long)res[1].worst, res[1].analytic, res[1].numeric);
    /* a failing check names the element: a tolerance nothing meets */
    CHECK(cg_gradcheck_tol(g, loss, 1, &b, 0, 0, 1e-30, res) == CG_OK && !res[0].pass && res[0].numeric != 0,
          "rtol 1e-30 passed");
    cg_graph_free(g);

    /* with respect to computed nodes: h = tanh(x w^T), loss = sum(h^2 * c); dl/dh = 2 h c exactly */
    g = cg_graph_new(CG_TRAIN);
    int64_t sw[2] = {5, 4};
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, s));
    cg_tensor *w = cg_requires_grad(cg_input(g, "w", CG_REAL, 2, sw));
    cg_fill_uniform(x, &r, -1, 1);
    cg_fill_uniform(w, &r, -1, 1);
    cg_tensor *h = cg_tanh(g, cg_linear(g, x, w, NULL));
    cg_tensor *sq = cg_square(g, h);
    CHECK(cg_gradcheck(g, cg_sum_all(g, sq), 3, (cg_tensor *[]){h, sq, x}, 0, res) == CG_OK, "non-leaf: %s",
          cg_last_error());
    for (int i = 0; i < 3; i++)
        CHECK(res[i].pass, "non-leaf input %d: element %lld analytic %g numeric %g", i, (long long)res[i].worst,
              res[i].analytic, res[i].numeric);
    cg_real hv[15], gh[15];
    CHECK(cg_read(h, hv) == CG_OK && cg_read_grad(h, gh) == CG_OK, "%s", cg_last_error());
    double worst = 0;
    for (int i = 0; i < 15; i++) worst = fmax(worst, fabs(gh[i] - 2 * hv[i]));
    CHECK(worst < 1e-5, "dl/dh = 2h: off by %g", worst);
    cg_clear_error();
    CHECK(cg_gradcheck(g, sq, 1, (cg_tensor *[]){cg_transpose(g, h, 0, 1)}, 0, res) == CG_ERR_ARG &&
              strstr(cg_last_error(), "view"), "a view is refused with a message: %s", cg_last_error());
    cg_graph_free(g);
}

/* ---- first writers: add, sub and the norms assign a gradient nothing has written yet ---- */

/* Each rule below is the first, a later or the only writer of some gradient: a residual add
 * (both summands' first writer), a broadcast bias (its reduction assigns), a sub into an input
 * already written, add_layernorm's two summands, layernorm and rmsnorm on a fresh input, and an
 * input read twice by one add. An assignment where an addition was due drops a term, which the
 * finite differences see. */
static void test_first_writers(void) {
    const int64_t s[2] = {6, 8}, sb[1] = {8};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, s));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 1, sb));
    cg_tensor *gain = cg_requires_grad(cg_input(g, "gain", CG_REAL, 1, sb));
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_fill_uniform(x, &r, -1, 1);
    cg_fill_uniform(b, &r, -1, 1);
    cg_fill_uniform(gain, &r, 0.5, 1.5);
    cg_tensor *h = cg_tanh(g, x);                                 /* h: the residual add writes it first */
    cg_tensor *res = cg_add(g, h, cg_add(g, cg_scale(g, x, 0.5), b)); /* b broadcast over the rows */
    cg_tensor *d = cg_sub(g, res, x);                             /* x: its scale wrote it first */
    cg_tensor *n1 = cg_add_layernorm(g, d, cg_sigmoid(g, res), gain, b, 1e-5); /* the sigmoid's first writer */
    cg_tensor *s2 = cg_add(g, n1, n1);                            /* one input read twice */
    cg_tensor *n2 = cg_rmsnorm(g, s2, gain, 1e-6);
    cg_tensor *s3 = cg_add(g, n2, h);
    cg_tensor *n3 = cg_layernorm(g, s3, NULL, NULL, 1e-5);
    /* read again after the norms, whose rules then add into d, s2 and s3 */
    cg_tensor *late = cg_scale(g, cg_add(g, cg_add(g, d, s2), s3), 0.3);
    cg_tensor *w = cg_input(g, "R", CG_REAL, 2, s);
    cg_fill_uniform(w, &r, -1, 1);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_add(g, cg_add(g, n3, res), late), w));
    cg_gradcheck_result out[3];
    CHECK(cg_gradcheck(g, loss, 3, (cg_tensor *[]){x, b, gain}, 0, out) == CG_OK, "%s", cg_last_error());
    for (int i = 0; i < 3; i++)
        CHECK(out[i].pass, "first writers: input %d element %lld analytic %g numeric %g", i, (long long)out[i].worst,
              out[i].analytic, out[i].numeric);
    cg_graph_free(g);
}

int main(void) {
    test_first_writers();
    test_gradcheck();
    test_misuse();
    test_unreached_zero();
    test_alias_bits("linear(z, z)", gram, 192, 96, 40);
    test_alias_bits("linear_cross_entropy(z, z)", gram_lce, 192, 96, 40);
    test_alias_bits("sdpa(z, z, z)", self_attn, 256, 16, 10);
    test_alias_bits("sdpa(q, q shifted a head)", shifted_heads, 256, 16, 20);
    /* the class: every op of the table with its inputs sharing storage */
    int failed = cg_gradcheck_ops_aliased(stdout, 0, 3, NULL);
    CHECK(failed == 0, "%d aliased op cases failed", failed);
    TEST_END();
}
