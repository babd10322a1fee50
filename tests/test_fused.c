/* SPDX-License-Identifier: MIT */
/* Every fused op against its composite twin built from simpler ops, forward and backward with
 * respect to every real input: cross_entropy, layernorm, rmsnorm, swiglu, silu, masked_softmax,
 * linear, linear_gelu, linear_relu, add_layernorm, linear_add. Both versions
 * get the same inputs (same seed) and the same upstream gradient R (loss = sum(out * R)). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

#ifdef CGRAD_DOUBLE
#define TOL 1e-10
#else
#define TOL 1e-5
#endif
#define MAX_LEAVES 6
#define S(...) ((const int64_t[]){__VA_ARGS__})
/* Reads that must work: a failure says which tensor and why. */
#define READ(t, buf) CHECK(cg_read(t, buf) == CG_OK, "cg_read(%s): %s", #t, cg_last_error())
#define READ_GRAD(t, buf) CHECK(cg_read_grad(t, buf) == CG_OK, "cg_read_grad(%s): %s", #t, cg_last_error())

typedef struct {
    cg_graph *g;
    cg_params *ps;
    cg_rng rng;
    cg_tensor *leaf[MAX_LEAVES]; /* the real inputs whose gradients are compared */
    int n;
    const void *arg;
} bctx;

/* A requires-grad input (or, when param, a parameter of c->ps) uniform in [lo, hi). */
static cg_tensor *leaf(bctx *c, const char *name, int nd, const int64_t *shape, double lo, double hi, bool param) {
    cg_tensor *t = param ? cg_params_add(c->ps, name, nd, shape)
                         : cg_requires_grad(cg_input(c->g, name, CG_REAL, nd, shape));
    if (!t) return NULL;
    cg_fill_uniform(t, &c->rng, lo, hi);
    if (c->n < MAX_LEAVES) c->leaf[c->n++] = t;
    return t;
}

static cg_tensor *ints(cg_graph *g, int nd, const int64_t *shape, const int32_t *v) {
    cg_tensor *t = cg_input(g, "ints", CG_INT32, nd, shape);
    if (t) cg_write_ids(t, v);
    return t;
}

static cg_tensor *reals(cg_graph *g, int nd, const int64_t *shape, const cg_real *v) {
    cg_tensor *t = cg_input(g, "reals", CG_REAL, nd, shape);
    if (t) cg_write(t, v);
    return t;
}

typedef cg_tensor *(*build_fn)(bctx *c, bool fused);

typedef struct {
    cg_real *v[MAX_LEAVES + 1]; /* output, then each leaf's gradient */
    int64_t n[MAX_LEAVES + 1];
    char name[MAX_LEAVES + 1][32]; /* copied: parameter names die with their set */
    int count;
    bool ok;
} result;

static result run(build_fn f, const void *arg, bool fused) {
    result r = {0};
    bctx c = {.g = cg_graph_new(CG_TRAIN), .ps = cg_params_new(), .arg = arg};
    cg_rng_seed(&c.rng, 2024);
    cg_tensor *out = cg_retain(f(&c, fused)); /* read after the run */
    cg_tensor *R = out ? cg_input(c.g, "R", CG_REAL, cg_ndim(out), cg_shape(out)) : NULL;
    cg_rng_seed(&c.rng, 77);
    cg_fill_uniform(R, &c.rng, -1, 1);
    cg_tensor *loss = cg_sum_all(c.g, cg_mul(c.g, out, R));
    if (!loss || cg_graph_forward(c.g) || cg_graph_backward(c.g, loss)) {
        CHECK(0, "%s version failed: %s", fused ? "fused" : "composite", cg_last_error());
    } else {
        r.ok = true;
        for (int i = 0; i <= c.n; i++) {
            cg_tensor *t = i ? c.leaf[i - 1] : out;
            r.n[i] = cg_numel(t);
            r.v[i] = malloc((size_t)r.n[i] * sizeof(cg_real));
            snprintf(r.name[i], sizeof r.name[i], "%s", i ? cg_name(t) : "output");
            if ((i ? cg_read_grad(t, r.v[i]) : cg_read(t, r.v[i])) != CG_OK) r.ok = false;
        }
        r.count = c.n + 1;
    }
    cg_graph_free(c.g);
    cg_params_free(c.ps);
    return r;
}

/* Max |fused - composite| over each array, relative to the largest composite magnitude. */
/* Set while comparing a fused op that promises its composite's bits: then the tolerance is 0. */
static bool exact;

static void compare(const char *what, build_fn f, const void *arg) {
    result a = run(f, arg, true), b = run(f, arg, false);
    CHECK(a.ok && b.ok && a.count == b.count, "%s: runs failed or differ in leaves", what);
    for (int i = 0; a.ok && b.ok && i < a.count && i < b.count; i++) {
        CHECK(a.n[i] == b.n[i], "%s %s: %lld vs %lld elements", what, a.name[i], (long long)a.n[i], (long long)b.n[i]);
        if (a.n[i] != b.n[i]) continue;
        double worst = 0, big = 0;
        int64_t at = 0;
        bool finite = true;
        for (int64_t k = 0; k < a.n[i]; k++) {
            double d = fabs((double)a.v[i][k] - (double)b.v[i][k]);
            finite &= isfinite(a.v[i][k]) && isfinite(b.v[i][k]);
            if (d > worst) worst = d, at = k;
            if (fabs((double)b.v[i][k]) > big) big = fabs((double)b.v[i][k]);
        }
        double rel = worst / (big > 1e-30 ? big : 1e-30);
        CHECK(finite && rel <= (exact ? 0 : TOL) && big > 0,
              "%s %s: fused %.9g vs composite %.9g at %lld (rel %.3g, max |composite| %.3g)", what, a.name[i],
              (double)a.v[i][at], (double)b.v[i][at], (long long)at, rel, big);
    }
    for (int i = 0; i < MAX_LEAVES + 1; i++) free(a.v[i]), free(b.v[i]);
}

/* ---- cross_entropy ---- */

typedef struct {
    int nd;
    int64_t shape[4]; /* logits; the last is C */
    int ignore;
    const int32_t *targets;
} ce_arg;

static cg_tensor *ce_build(bctx *c, bool fused) {
    const ce_arg *a = c->arg;
    cg_tensor *logits = leaf(c, "logits", a->nd, a->shape, -3, 3, false);
    cg_tensor *tg = ints(c->g, a->nd - 1, a->shape, a->targets);
    if (fused) return cg_cross_entropy(c->g, logits, tg, a->ignore);
    /* -sum(log_softmax(logits) * onehot) / count, the one-hot rows of ignored targets all zero */
    int64_t rows = cg_numel(tg), C = a->shape[a->nd - 1], count = 0;
    cg_real *hot = calloc((size_t)(rows * C), sizeof *hot);
    for (int64_t r = 0; r < rows; r++)
        if (a->targets[r] != a->ignore) hot[r * C + a->targets[r]] = 1, count++;
    cg_tensor *onehot = reals(c->g, a->nd, a->shape, hot);
    free(hot);
    return cg_scale(c->g, cg_sum_all(c->g, cg_mul(c->g, cg_log_softmax(c->g, logits), onehot)), -1.0 / (double)count);
}

static void test_cross_entropy(void) {
    int32_t t[2 * 3 * 5];
    cg_rng rng;
    cg_rng_seed(&rng, 5);
    for (int i = 0; i < 30; i++) t[i] = i % 4 == 1 ? -100 : (int32_t)(cg_rng_next(&rng) % 7);
    ce_arg a = {4, {2, 3, 5, 7}, -100, t};
    compare("cross_entropy [2,3,5,7] ignore -100", ce_build, &a);
    /* ignore_index that is also a valid class (a padding id 0) */
    int32_t t0[2 * 3 * 5];
    for (int i = 0; i < 30; i++) t0[i] = (int32_t)(cg_rng_next(&rng) % 7);
    t0[0] = 1; /* at least one counted */
    ce_arg b = {4, {2, 3, 5, 7}, 0, t0};
    compare("cross_entropy [2,3,5,7] ignore 0", ce_build, &b);
    ce_arg d = {2, {6, 11}, -1, (const int32_t[]){3, 10, 0, 7, -1, 5}};
    compare("cross_entropy [6,11]", ce_build, &d);
}

/* ---- layernorm ---- */

typedef struct {
    int nd;
    int64_t shape[4];
    bool gain, bias, transposed;
    double eps;
} ln_arg;

static cg_tensor *ln_build(bctx *c, bool fused) {
    const ln_arg *a = c->arg;
    int64_t s[4];
    memcpy(s, a->shape, sizeof s);
    if (a->transposed) s[a->nd - 1] = a->shape[a->nd - 2], s[a->nd - 2] = a->shape[a->nd - 1];
    cg_tensor *x = leaf(c, "x", a->nd, s, -2, 3, false); /* mean and scale away from 0 and 1 */
    if (a->transposed) x = cg_transpose(c->g, x, -1, -2);
    const int64_t d = a->shape[a->nd - 1];
    cg_tensor *gain = a->gain ? leaf(c, "gain", 1, &d, 0.5, 1.5, true) : NULL;
    cg_tensor *bias = a->bias ? leaf(c, "bias", 1, &d, -1, 1, true) : NULL;
    cg_graph *g = c->g;
    if (fused) return cg_layernorm(g, x, gain, bias, a->eps);
    cg_tensor *xc = cg_sub(g, x, cg_mean(g, x, -1, true));
    cg_tensor *var = cg_mean(g, cg_square(g, xc), -1, true);
    cg_tensor *y = cg_div(g, xc, cg_sqrt(g, cg_add_scalar(g, var, a->eps)));
    if (gain) y = cg_mul(g, y, gain);
    if (bias) y = cg_add(g, y, bias);
    return y;
}

static void test_layernorm(void) {
    ln_arg a = {4, {2, 3, 5, 7}, true, true, false, 1e-5};
    compare("layernorm [2,3,5,7] gain+bias", ln_build, &a);
    ln_arg b = {3, {3, 5, 7}, false, false, false, 1e-5};
    compare("layernorm [3,5,7] plain", ln_build, &b);
    ln_arg d = {3, {2, 5, 6}, true, false, true, 0.1};
    compare("layernorm transposed view, gain only, eps 0.1", ln_build, &d);
    ln_arg e = {2, {4, 9}, false, true, false, 1e-5};
    compare("layernorm [4,9] bias only", ln_build, &e);
    /* rows past one vector's lanes: the gain's and bias's sums taken in the lanes' loop and its tail */
    ln_arg f = {3, {3, 4, 37}, true, true, false, 1e-5};
    compare("layernorm [3,4,37] gain+bias", ln_build, &f);
}

/* ---- add_layernorm: against layernorm(add(x, r)), post-LN's composite, bit for bit ---- */

typedef struct {
    ln_arg ln;
    int residual; /* 0: its own leaf; 1: x itself (x + x); 2: a leaf seen through a transpose */
} aln_arg;

static cg_tensor *aln_build(bctx *c, bool fused) {
    const aln_arg *a = c->arg;
    const ln_arg *l = &a->ln;
    int64_t s[4];
    memcpy(s, l->shape, sizeof s);
    if (l->transposed) s[l->nd - 1] = l->shape[l->nd - 2], s[l->nd - 2] = l->shape[l->nd - 1];
    cg_tensor *x = leaf(c, "x", l->nd, s, -2, 3, false);
    if (l->transposed) x = cg_transpose(c->g, x, -1, -2);
    cg_tensor *r = x;
    if (a->residual == 0) r = leaf(c, "r", l->nd, l->shape, -1, 1, false);
    if (a->residual == 2) {
        int64_t st[4];
        memcpy(st, l->shape, sizeof st);
        st[l->nd - 1] = l->shape[l->nd - 2], st[l->nd - 2] = l->shape[l->nd - 1];
        r = cg_transpose(c->g, leaf(c, "r", l->nd, st, -1, 1, false), -1, -2);
    }
    const int64_t d = l->shape[l->nd - 1];
    cg_tensor *gain = l->gain ? leaf(c, "gain", 1, &d, 0.5, 1.5, true) : NULL;
    cg_tensor *bias = l->bias ? leaf(c, "bias", 1, &d, -1, 1, true) : NULL;
    if (fused) return cg_add_layernorm(c->g, x, r, gain, bias, l->eps);
    return cg_layernorm(c->g, cg_add(c->g, x, r), gain, bias, l->eps);
}

/* The sum, the statistics and both summands' gradients are the composite's arithmetic in its order */
static void test_add_layernorm(void) {
    exact = true;
    aln_arg a = {{4, {2, 3, 5, 7}, true, true, false, 1e-5}, 0};
    compare("add_layernorm [2,3,5,7] gain+bias", aln_build, &a);
    aln_arg b = {{3, {3, 5, 7}, false, false, false, 1e-5}, 0};
    compare("add_layernorm [3,5,7] plain", aln_build, &b);
    aln_arg d = {{3, {2, 5, 6}, true, false, true, 0.1}, 2};
    compare("add_layernorm transposed views, gain only, eps 0.1", aln_build, &d);
    aln_arg e = {{2, {4, 9}, false, true, false, 1e-5}, 1};
    compare("add_layernorm x + x, bias only", aln_build, &e);
    /* rows of 512 (encdec-base's d) over every block and both threads */
    aln_arg f = {{3, {4, 64, 512}, true, true, false, 1e-5}, 0};
    compare("add_layernorm [4,64,512] gain+bias", aln_build, &f);
    exact = false;
    /* a residual that does not match x is an error that names the op and both shapes */
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(4, 6)), *r = cg_input(g, "r", CG_REAL, 2, S(1, 6));
    CHECK(!cg_add_layernorm(g, x, r, NULL, NULL, 1e-5) && strstr(cg_last_error(), "[add_layernorm] x[4,6] + r[1,6]"),
          "broadcast residual: %s", cg_last_error());
    cg_graph_free(g);
}

/* ---- rmsnorm ---- */

static cg_tensor *rms_build(bctx *c, bool fused) {
    const ln_arg *a = c->arg;
    int64_t s[4];
    memcpy(s, a->shape, sizeof s);
    if (a->transposed) s[a->nd - 1] = a->shape[a->nd - 2], s[a->nd - 2] = a->shape[a->nd - 1];
    cg_tensor *x = leaf(c, "x", a->nd, s, -2, 3, false);
    if (a->transposed) x = cg_transpose(c->g, x, -1, -2);
    const int64_t d = a->shape[a->nd - 1];
    cg_tensor *gain = a->gain ? leaf(c, "gain", 1, &d, 0.5, 1.5, true) : NULL;
    cg_graph *g = c->g;
    if (fused) return cg_rmsnorm(g, x, gain, a->eps);
    cg_tensor *ms = cg_mean(g, cg_square(g, x), -1, true);
    cg_tensor *y = cg_div(g, x, cg_sqrt(g, cg_add_scalar(g, ms, a->eps)));
    return gain ? cg_mul(g, y, gain) : y;
}

static void test_rmsnorm(void) {
    ln_arg a = {4, {2, 3, 5, 7}, true, false, false, 1e-5};
    compare("rmsnorm [2,3,5,7] gain", rms_build, &a);
    ln_arg b = {3, {3, 5, 40}, false, false, false, 1e-6};
    compare("rmsnorm [3,5,40] plain", rms_build, &b);
    ln_arg d = {3, {2, 5, 6}, true, false, true, 0.1};
    compare("rmsnorm transposed view, gain, eps 0.1", rms_build, &d);
    ln_arg f = {3, {3, 4, 37}, true, false, false, 1e-5};
    compare("rmsnorm [3,4,37] gain", rms_build, &f);
}

/* ---- swiglu and silu against their definitions ---- */

static cg_tensor *swiglu_build(bctx *c, bool fused) {
    const bool packed = *(const bool *)c->arg;
    cg_graph *g = c->g;
    cg_tensor *gate, *up;
    if (packed) { /* halves of one [.., 2F] projection, read through strides */
        cg_tensor *h[2];
        cg_split(g, leaf(c, "gu", 3, S(2, 5, 34), -4, 4, false), -1, 2, NULL, h);
        gate = h[0], up = h[1];
    } else {
        gate = leaf(c, "gate", 3, S(2, 5, 17), -4, 4, false);
        up = leaf(c, "up", 3, S(2, 5, 17), -2, 2, false);
    }
    if (fused) return cg_swiglu(g, gate, up);
    return cg_mul(g, cg_mul(g, gate, cg_sigmoid(g, gate)), up);
}

static cg_tensor *silu_build(bctx *c, bool fused) {
    cg_tensor *x = leaf(c, "x", 2, S(7, 19), -6, 6, false);
    return fused ? cg_silu(c->g, x) : cg_mul(c->g, x, cg_sigmoid(c->g, x));
}

static void test_swiglu(void) {
    bool no = false, yes = true;
    compare("swiglu [2,5,17]", swiglu_build, &no);
    compare("swiglu halves of a packed [2,5,34]", swiglu_build, &yes);
    compare("silu [7,19]", silu_build, NULL);
}

/* ---- losses against their definitions composed from ops ---- */

static cg_tensor *smooth_build(bctx *c, bool fused) {
    const int32_t tv[6] = {3, 0, -100, 6, 2, 6};
    cg_tensor *logits = leaf(c, "logits", 2, S(6, 7), -3, 3, false);
    cg_tensor *tg = ints(c->g, 1, S(6), tv);
    const double e = 0.2;
    if (fused) return cg_cross_entropy_smooth(c->g, logits, tg, -100, e);
    /* (1 - e) NLL + e mean_c(-log_softmax), over the 5 counted rows */
    cg_real w[6 * 7] = {0};
    for (int r = 0; r < 6; r++)
        for (int j = 0; j < 7 && tv[r] != -100; j++) w[r * 7 + j] = (cg_real)(e / 7 + (j == tv[r] ? 1 - e : 0));
    cg_tensor *wt = reals(c->g, 2, S(6, 7), w);
    return cg_scale(c->g, cg_sum_all(c->g, cg_mul(c->g, cg_log_softmax(c->g, logits), wt)), -1.0 / 5);
}

static cg_tensor *soft_build(bctx *c, bool fused) {
    cg_tensor *logits = leaf(c, "logits", 3, S(2, 3, 6), -3, 3, false);
    cg_tensor *p = leaf(c, "probs", 3, S(2, 3, 6), 0, 1, false);
    if (fused) return cg_cross_entropy_soft(c->g, logits, p);
    return cg_scale(c->g, cg_sum_all(c->g, cg_mul(c->g, cg_log_softmax(c->g, logits), p)), -1.0 / 6);
}

static cg_tensor *mse_build(bctx *c, bool fused) {
    cg_tensor *a = leaf(c, "pred", 2, S(5, 9), -2, 2, false), *b = leaf(c, "target", 2, S(5, 9), -2, 2, false);
    return fused ? cg_mse_loss(c->g, a, b) : cg_mean_all(c->g, cg_square(c->g, cg_sub(c->g, a, b)));
}

static cg_tensor *bce_build(bctx *c, bool fused) {
    cg_tensor *x = leaf(c, "logits", 2, S(5, 9), -6, 6, false), *t = leaf(c, "target", 2, S(5, 9), 0, 1, false);
    if (fused) return cg_bce_with_logits(c->g, x, t);
    /* -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))) */
    cg_graph *g = c->g;
    cg_tensor *s = cg_sigmoid(g, x);
    cg_tensor *l = cg_add(g, cg_mul(g, t, cg_log(g, s)),
                          cg_mul(g, cg_add_scalar(g, cg_neg(g, t), 1), cg_log(g, cg_add_scalar(g, cg_neg(g, s), 1))));
    return cg_neg(g, cg_mean_all(g, l));
}

static void test_losses(void) {
    compare("cross_entropy label smoothing 0.2, ignore", smooth_build, NULL);
    compare("cross_entropy_soft [2,3,6]", soft_build, NULL);
    compare("mse_loss [5,9]", mse_build, NULL);
    compare("bce_with_logits [5,9]", bce_build, NULL);
}

/* ---- masked_softmax ---- */

typedef struct {
    int64_t b, h, tq, tk;
    double scale;
    int mask_nd; /* 0: no additive mask; 2: [Tq, Tk]; 4: [B, 1, Tq, Tk] */
    bool causal;
    const int32_t *key_padding; /* [B, Tk] or NULL */
} ms_arg;

static cg_tensor *ms_build(bctx *c, bool fused) {
    const ms_arg *a = c->arg;
    cg_graph *g = c->g;
    cg_tensor *x = leaf(c, "x", 4, S(a->b, a->h, a->tq, a->tk), -2, 2, false);
    cg_tensor *mask = a->mask_nd == 2   ? leaf(c, "mask", 2, S(a->tq, a->tk), -1, 1, false)
                      : a->mask_nd == 4 ? leaf(c, "mask", 4, S(a->b, 1, a->tq, a->tk), -1, 1, false)
                                        : NULL;
    cg_tensor *kp = a->key_padding ? ints(g, 2, S(a->b, a->tk), a->key_padding) : NULL;
    if (fused) return cg_masked_softmax(g, x, a->scale, mask, a->causal, kp);
    /* hidden[b, i, j] built by hand: key j is hidden from query i when causal and j > i + Tk - Tq,
     * or when the key is padding */
    int64_t n = a->b * a->tq * a->tk;
    int32_t *hidden = calloc((size_t)n, sizeof *hidden);
    for (int64_t b = 0; b < a->b; b++)
        for (int64_t i = 0; i < a->tq; i++)
            for (int64_t j = 0; j < a->tk; j++)
                hidden[(b * a->tq + i) * a->tk + j] =
                    (a->causal && j > i + a->tk - a->tq) || (kp && a->key_padding[b * a->tk + j] == 0);
    cg_tensor *hid = ints(g, 4, S(a->b, 1, a->tq, a->tk), hidden);
    free(hidden);
    cg_tensor *s = cg_scale(g, x, a->scale);
    if (mask) s = cg_add(g, s, mask);
    return cg_softmax(g, cg_masked_fill(g, s, hid, -INFINITY));
}

static void test_masked_softmax(void) {
    /* key 0 stays visible to every query, so no row is fully hidden (the composite would be NaN) */
    const int32_t kp7[2 * 7] = {1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0};
    const int32_t kp6[2 * 6] = {1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0};
    ms_arg cases[] = {
        {2, 3, 5, 7, 0.5, 0, false, NULL}, {2, 3, 6, 6, 0.7, 0, true, NULL},  {2, 3, 5, 7, 1.0, 0, true, NULL},
        {2, 3, 5, 7, 0.3, 0, false, kp7},  {2, 3, 5, 7, 1.2, 2, false, NULL}, {2, 3, 5, 7, 0.9, 4, false, NULL},
        {2, 3, 6, 6, 0.6, 2, true, kp6},   {2, 3, 5, 7, 0.8, 4, true, kp7},   {2, 3, 5, 7, 1.1, 0, true, kp7},
    };
    const char *names[] = {
        "masked_softmax [2,3,5,7] scale only",       "masked_softmax causal Tq == Tk",
        "masked_softmax causal Tq < Tk",             "masked_softmax key padding",
        "masked_softmax additive mask [Tq,Tk]",      "masked_softmax additive mask [B,1,Tq,Tk]",
        "masked_softmax causal+padding+mask Tq==Tk", "masked_softmax causal+padding+mask Tq<Tk",
        "masked_softmax causal+padding Tq<Tk",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) compare(names[i], ms_build, &cases[i]);

    /* The fused op's own promise where the composite has no answer: a row with every key hidden
     * (causal with Tq > Tk hides all keys from the first Tq - Tk queries) is zeros, and so is its
     * gradient; the other rows still sum to 1. */
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 3);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 4, S(1, 2, 5, 3)));
    cg_fill_uniform(x, &rng, -2, 2);
    cg_tensor *kp = ints(g, 2, S(1, 3), (const int32_t[]){1, 1, 0});
    cg_tensor *y = cg_retain(cg_masked_softmax(g, x, 1.0, NULL, true, kp));
    cg_tensor *R = cg_input(g, "R", CG_REAL, 4, S(1, 2, 5, 3));
    cg_fill_uniform(R, &rng, -1, 1);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, R));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "fully hidden rows: %s",
          cg_last_error());
    cg_real yv[30], gv[30];
    READ(y, yv);
    READ_GRAD(x, gv);
    int bad = 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 5; i++) {
            const cg_real *row = yv + (h * 5 + i) * 3, *grow = gv + (h * 5 + i) * 3;
            int visible = i - 2 + 1; /* keys j <= i + Tk - Tq, and key 2 is padding */
            if (visible > 2) visible = 2;
            double sum = 0;
            for (int j = 0; j < 3; j++) {
                sum += row[j];
                if (j >= (visible > 0 ? visible : 0)) bad += row[j] != 0 || grow[j] != 0;
            }
            bad += visible <= 0 ? sum != 0 : fabs(sum - 1) > 1e-6;
            if (visible == 1) bad += fabs(row[0] - 1) > 1e-6;
        }
    CHECK(bad == 0, "%d violations in rows with hidden keys", bad);
    cg_graph_free(g);
}

/* ---- linear ---- */

typedef struct {
    int nd;
    int64_t shape[4]; /* x; the last is in */
    int64_t out;
    bool bias, transposed, params;
    bool conv1d; /* w stored [in, out] and seen through a transpose: a column-major weight, as GPT-2's */
} lin_arg;

/* A linear's weight [out, in] (or [in, out] seen through a transpose) and bias (NULL without),
 * made first: no parameter may be added after nodes use the set. */
static cg_tensor *lin_weights(bctx *c, const lin_arg *a, cg_tensor **bias) {
    const int64_t in = a->shape[a->nd - 1];
    cg_tensor *w = a->conv1d ? leaf(c, "w", 2, S(in, a->out), -1, 1, a->params) : leaf(c, "w", 2, S(a->out, in), -1, 1, a->params);
    *bias = a->bias ? leaf(c, "b", 1, &a->out, -1, 1, a->params) : NULL;
    return a->conv1d ? cg_transpose(c->g, w, 0, 1) : w;
}

static cg_tensor *lin_build(bctx *c, bool fused) {
    const lin_arg *a = c->arg;
    const int64_t in = a->shape[a->nd - 1];
    cg_tensor *b, *w = lin_weights(c, a, &b);
    int64_t s[4];
    memcpy(s, a->shape, sizeof s);
    if (a->transposed) s[a->nd - 1] = a->shape[a->nd - 2], s[a->nd - 2] = in;
    cg_tensor *x = leaf(c, "x", a->nd, s, -1, 1, false);
    if (a->transposed) x = cg_transpose(c->g, x, -1, -2);
    if (fused) return cg_linear(c->g, x, w, b);
    cg_tensor *y = cg_matmul(c->g, x, cg_transpose(c->g, w, 0, 1));
    return b ? cg_add(c->g, y, b) : y;
}

static void test_linear(void) {
    lin_arg a = {4, {2, 3, 5, 7}, 4, true, false, false, false};
    compare("linear [2,3,5,7] -> 4 with bias", lin_build, &a);
    lin_arg b = {4, {2, 3, 5, 7}, 6, true, false, true, false};
    compare("linear [2,3,5,7] -> 6, parameters", lin_build, &b);
    lin_arg d = {2, {9, 5}, 3, false, false, false, false};
    compare("linear [9,5] -> 3 no bias", lin_build, &d);
    lin_arg e = {3, {2, 5, 4}, 3, true, true, true, false};
    compare("linear of a transposed view", lin_build, &e);
    /* each way the backward orients dW: in place or through scratch, as dW or as dW^T */
    lin_arg f = {2, {6, 9}, 5, true, false, true, true};
    compare("linear, column-major weight (dW through scratch)", lin_build, &f);
    lin_arg h = {2, {6, 1024}, 5, true, false, true, false};
    compare("linear, x rows of 1024 (dW^T through scratch)", lin_build, &h);
    lin_arg i = {2, {6, 1024}, 5, false, false, true, true};
    compare("linear, x rows of 1024, column-major weight (dW^T in place)", lin_build, &i);
}

/* ---- linear_act: against gelu(linear(...)) and relu(linear(...)), the model zoo's composites ---- */

typedef struct {
    lin_arg lin;
    bool tanh_form;
    bool relu; /* cg_linear_relu against relu(linear(...)) */
} lg_arg;

static cg_tensor *lg_build(bctx *c, bool fused) {
    const lg_arg *a = c->arg;
    cg_tensor *b, *w = lin_weights(c, &a->lin, &b);
    cg_tensor *x = leaf(c, "x", a->lin.nd, a->lin.shape, -1, 1, false);
    if (fused) return a->relu ? cg_linear_relu(c->g, x, w, b) : cg_linear_gelu(c->g, x, w, b, a->tanh_form);
    cg_tensor *y = cg_linear(c->g, x, w, b);
    return a->relu ? cg_relu(c->g, y) : a->tanh_form ? cg_gelu_tanh(c->g, y) : cg_gelu(c->g, y);
}

static void test_linear_gelu(void) {
    lg_arg a = {{4, {2, 3, 5, 7}, 4, true, false, false, false}, true, false};
    compare("linear_gelu tanh [2,3,5,7] -> 4 with bias", lg_build, &a);
    lg_arg b = {{3, {2, 5, 8}, 6, true, false, true, false}, false, false};
    compare("linear_gelu erf [2,5,8] -> 6, parameters", lg_build, &b);
    lg_arg d = {{2, {9, 5}, 3, false, false, false, false}, true, false};
    compare("linear_gelu [9,5] -> 3 no bias", lg_build, &d);
    lg_arg f = {{2, {6, 9}, 5, true, false, true, true}, true, false};
    compare("linear_gelu, column-major weight (GPT-2's Conv1D)", lg_build, &f);
    /* enough rows and columns for several bias-sum blocks and both threads */
    lg_arg h = {{3, {4, 64, 32}, 96, true, false, true, true}, true, false};
    compare("linear_gelu [4,64,32] -> 96, Conv1D weight", lg_build, &h);
    lg_arg e = {{3, {4, 64, 32}, 96, true, false, true, false}, false, false};
    compare("linear_gelu erf [4,64,32] -> 96", lg_build, &e);
    lg_arg i = {{2, {6, 1024}, 5, true, false, true, false}, false, false};
    compare("linear_gelu, x rows of 1024 (dW^T through scratch)", lg_build, &i);
}

/* lg_build with x scaled by 1/8: pre-activations of a few units over a depth of 600, as a trained
 * layer's (with x and w in [-1, 1] they reach 15, where the tanh form's derivative from y / x
 * cancels in 1 - s and differs from the composite's by 4e-5) */
static cg_tensor *lg_small_build(bctx *c, bool fused) {
    const lg_arg *a = c->arg;
    cg_tensor *b, *w = lin_weights(c, &a->lin, &b);
    cg_tensor *x = cg_scale(c->g, leaf(c, "x", a->lin.nd, a->lin.shape, -1, 1, false), 0.125);
    if (fused) return cg_linear_gelu(c->g, x, w, b, a->tanh_form);
    cg_tensor *y = cg_linear(c->g, x, w, b);
    return a->tanh_form ? cg_gelu_tanh(c->g, y) : cg_gelu(c->g, y);
}

/* The fused op over a product of two depth passes (600), its product cut into pieces and its bias
 * + GELU pass, remake and derivative pass run on two threads: within tolerance of the composite on
 * one and two threads, and two threads give one thread's bits. Rows (140) and outputs (100) are no
 * multiples of the product's 12-row strips or the passes' 16 lanes. */
static void test_linear_gelu_threads(void) {
    const int threads = cg_threads();
    for (int form = 0; form < 2; form++) {
        lg_arg a = {{3, {2, 70, 600}, 100, true, false, true, form == 1}, form == 1, false};
        const char *what = form ? "linear_gelu tanh [2,70,600] -> 100, Conv1D weight" : "linear_gelu erf [2,70,600] -> 100";
        result r[2];
        for (int nt = 1; nt <= 2; nt++) {
            cg_set_threads(nt);
            compare(what, lg_small_build, &a);
            r[nt - 1] = run(lg_small_build, &a, true);
        }
        CHECK(r[0].ok && r[1].ok && r[0].count == r[1].count, "%s: runs failed", what);
        for (int i = 0; r[0].ok && r[1].ok && i < r[0].count; i++)
            CHECK(r[0].n[i] == r[1].n[i] && !memcmp(r[0].v[i], r[1].v[i], (size_t)r[0].n[i] * sizeof(cg_real)),
                  "%s: %s differs on 2 threads from 1", what, r[0].name[i]);
        for (int i = 0; i < MAX_LEAVES + 1; i++) free(r[0].v[i]), free(r[1].v[i]);
    }
    cg_set_threads(threads);
}

/* ReLU's fused op runs the composite's arithmetic in the same order (bias, clamp, the bias sums'
 * blocks, the same products on the same pre-activation gradient): equal bit for bit */
static void test_linear_relu(void) {
    exact = true;
    lg_arg a = {{4, {2, 3, 5, 7}, 4, true, false, false, false}, false, true};
    compare("linear_relu [2,3,5,7] -> 4 with bias", lg_build, &a);
    lg_arg d = {{2, {9, 5}, 3, false, false, false, false}, false, true};
    compare("linear_relu [9,5] -> 3 no bias", lg_build, &d);
    lg_arg f = {{2, {6, 9}, 5, true, false, true, true}, false, true};
    compare("linear_relu, column-major weight", lg_build, &f);
    /* through the blocked driver (every dim >= 32; two depth passes), several bias-sum blocks */
    lg_arg h = {{3, {4, 64, 600}, 96, true, false, true, false}, false, true};
    compare("linear_relu [4,64,600] -> 96, parameters", lg_build, &h);
    lg_arg e = {{3, {4, 64, 32}, 96, true, false, true, true}, false, true};
    compare("linear_relu [4,64,32] -> 96, Conv1D weight", lg_build, &e);
    lg_arg i = {{2, {6, 1024}, 5, true, false, true, false}, false, true};
    compare("linear_relu, x rows of 1024 (dW^T through scratch)", lg_build, &i);
    exact = false;
}

/* ---- linear_add: against add(r, linear(...)), the residual add after a projection ---- */

typedef struct {
    lin_arg lin;
    bool chain; /* r a computed node and a second linear_add on the first's sum: a residual stream, whose
                 * gradient buffer the planner hands from sum to summand */
} la_arg;

static cg_tensor *la_build(bctx *c, bool fused) {
    const la_arg *a = c->arg;
    cg_tensor *b, *w = lin_weights(c, &a->lin, &b);
    cg_tensor *x = leaf(c, "x", a->lin.nd, a->lin.shape, -1, 1, false);
    int64_t s[4];
    memcpy(s, a->lin.shape, sizeof s);
    s[a->lin.nd - 1] = a->lin.out;
    cg_tensor *r = leaf(c, "r", a->lin.nd, s, -1, 1, false);
    if (a->chain) r = cg_scale(c->g, r, 0.5);
    cg_tensor *y = fused ? cg_linear_add(c->g, x, w, b, r) : cg_add(c->g, r, cg_linear(c->g, x, w, b));
    if (!a->chain) return y;
    return fused ? cg_linear_add(c->g, x, w, b, y) : cg_add(c->g, y, cg_linear(c->g, x, w, b));
}

/* The engine adds r after the product and its bias, as cg_add after cg_linear, and backward runs
 * the same products on the same gradient: equal bit for bit, at one thread and at two; and two
 * threads (the product cut into pieces) give one thread's bits. */
static void test_linear_add(void) {
    const int threads = cg_threads();
    exact = true;
    for (int nt = 1; nt <= 2; nt++) {
        cg_set_threads(nt);
        la_arg a = {{4, {2, 3, 5, 7}, 4, true, false, false, false}, false};
        compare("linear_add [2,3,5,7] -> 4 with bias", la_build, &a);
        la_arg d = {{2, {9, 5}, 3, false, false, true, false}, true};
        compare("linear_add [9,5] -> 3 no bias, chained", la_build, &d);
        la_arg f = {{2, {6, 9}, 5, true, false, true, true}, false};
        compare("linear_add, column-major weight", la_build, &f);
        /* the blocked driver's strips (every dim >= 32; two depth passes: r after the last) */
        la_arg h = {{3, {4, 64, 600}, 96, true, false, true, false}, true};
        compare("linear_add [4,64,600] -> 96, chained", la_build, &h);
        la_arg e = {{3, {2, 256, 256}, 256, true, false, true, true}, false};
        compare("linear_add [2,256,256] -> 256, Conv1D weight", la_build, &e);
    }
    la_arg big = {{3, {2, 256, 256}, 256, true, false, true, false}, true};
    cg_set_threads(1);
    result one = run(la_build, &big, true);
    cg_set_threads(2);
    result two = run(la_build, &big, true);
    CHECK(one.ok && two.ok && one.count == two.count, "linear_add threads: runs failed");
    for (int i = 0; one.ok && two.ok && i < one.count; i++)
        CHECK(one.n[i] == two.n[i] && !memcmp(one.v[i], two.v[i], (size_t)one.n[i] * sizeof(cg_real)),
              "linear_add [2,256,256] -> 256 chained: %s differs on 2 threads from 1", one.name[i]);
    for (int i = 0; i < MAX_LEAVES + 1; i++) free(one.v[i]), free(two.v[i]);
    cg_set_threads(threads);
    exact = false;
    /* a residual that does not match the product is an error that names the op and the shapes */
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(4, 6)), *w = cg_input(g, "w", CG_REAL, 2, S(5, 6)),
              *r = cg_input(g, "r", CG_REAL, 2, S(1, 5));
    CHECK(!cg_linear_add(g, x, w, NULL, r) && strstr(cg_last_error(), "[linear_add] r[1,5] + x[4,6] @ w[5,6]^T"),
          "broadcast residual: %s", cg_last_error());
    cg_graph_free(g);
}

int main(void) {
    test_cross_entropy();
    test_layernorm();
    test_add_layernorm();
    test_rmsnorm();
    test_swiglu();
    test_losses();
    test_masked_softmax();
    test_linear();
    test_linear_gelu();
    test_linear_gelu_threads();
    test_linear_relu();
    test_linear_add();
    TEST_END();
}
