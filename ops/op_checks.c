/* SPDX-License-Identifier: MIT */
/* The gradient check of every op: one line per case, several shapes per op, covering
 * broadcasting, masks, ignored targets and strided views. cg_gradcheck_ops walks this table
 * and also fails any op of ops.def that has no case here. */
#include <math.h>
#include <stdlib.h>

#include "graph/gradcheck.h"
#include "graph/internal.h"
#include "ops/custom.h"
#include "ops/ops.h"

#define MAX_IN 4

typedef struct {
    cg_graph *g;
    cg_rng rng;
    cg_tensor *in[MAX_IN]; /* the leaves to check */
    int n;
    /* aliased mode: every real input is a view of pool, the k-th starting at k * shift */
    cg_tensor *pool;
    int64_t shift, views, need;
} ctx;

/* A requires-grad input of the given shape, uniform in [lo, hi), away from 0 when avoid0. */
static cg_tensor *leaf(ctx *c, double lo, double hi, bool avoid0, int nd, int64_t d0, int64_t d1, int64_t d2,
                       int64_t d3) {
    int64_t s[4] = {d0, d1, d2, d3};
    if (c->pool) {
        const int64_t off = c->shift * c->views++, m = cgi_numel(nd, s);
        if (off + m > c->need) c->need = off + m;
        if (off + m > cg_dim(c->pool, 0)) return NULL;
        return cg_reshape(c->g, cg_slice(c->g, c->pool, 0, off, off + m), nd, s);
    }
    cg_tensor *t = cg_requires_grad(cg_input(c->g, "x", CG_REAL, nd, s));
    if (!t) return NULL;
    cg_real *v = cg_data(t);
    for (int64_t i = 0; i < cg_numel(t); i++) {
        double u = lo + (hi - lo) * cg_rng_uniform(&c->rng);
        if (avoid0 && fabs(u) < 0.1) u = u < 0 ? -0.1 - fabs(u) : 0.1 + u;
        v[i] = (cg_real)u;
    }
    if (c->n < MAX_IN) c->in[c->n++] = t;
    return t;
}
#define X(...) leaf(c, -1, 1, false, __VA_ARGS__)
#define X4(a, b, cc, d) leaf(c, -1, 1, false, 4, a, b, cc, d)
#define X3(a, b, cc) leaf(c, -1, 1, false, 3, a, b, cc, 0)
#define X2(a, b) leaf(c, -1, 1, false, 2, a, b, 0, 0)
#define X1(a) leaf(c, -1, 1, false, 1, a, 0, 0, 0)
#define POS2(a, b) leaf(c, 0.5, 2, false, 2, a, b, 0, 0)
#define AWAY2(a, b) leaf(c, -1, 1, true, 2, a, b, 0, 0)
#define T(x) cg_transpose(c->g, x, 0, 1) /* a strided view */

/* An int32 input with values in [lo, hi). */
static cg_tensor *ids(ctx *c, int lo, int hi, int nd, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    cg_tensor *t = cg_input(c->g, "ids", CG_INT32, nd, s);
    if (!t) return NULL;
    for (int64_t i = 0; i < cg_numel(t); i++) cg_idata(t)[i] = lo + (int)(cg_rng_next(&c->rng) % (uint64_t)(hi - lo));
    return t;
}

/* A requires-grad input of the given shape holding -1.55, -1.35, ... in steps of 0.2: no value
 * within 0.05 of 0 or of +-0.5, so the kinks of abs, clamp and friends are never straddled. (The
 * aliased pool's values are 0.5 + k / 16 for these 16-element cases: clamp's upper bound 0.73
 * stays clear of both.) */
static cg_tensor *grid(ctx *c, int nd, int64_t d0, int64_t d1, int64_t d2) {
    if (c->pool) return leaf(c, -1, 1, false, nd, d0, d1, d2, 0); /* aliased mode: a view of the pool */
    int64_t s[3] = {d0, d1, d2};
    cg_tensor *t = cg_requires_grad(cg_input(c->g, "x", CG_REAL, nd, s));
    if (!t) return NULL;
    for (int64_t i = 0; i < cg_numel(t); i++) cg_data(t)[i] = (cg_real)(-1.55 + 0.2 * (double)((i * 7) % 16));
    if (c->n < MAX_IN) c->in[c->n++] = t;
    return t;
}

typedef cg_tensor *(*build_fn)(ctx *c);
typedef struct {
    const char *op, *shapes;
    build_fn build;
} check_case;

#define G c->g
/* elementwise */
static cg_tensor *add_same(ctx *c) { return cg_add(G, X2(3, 4), X2(3, 4)); }
static cg_tensor *add_bias(ctx *c) { return cg_add(G, X3(2, 3, 4), X1(4)); }
static cg_tensor *add_outer(ctx *c) { return cg_add(G, X2(3, 1), X2(1, 4)); }
static cg_tensor *add_view(ctx *c) { return cg_add(G, T(X2(4, 3)), X2(3, 4)); }
static cg_tensor *sub_bcast(ctx *c) { return cg_sub(G, X2(3, 1), X3(2, 3, 4)); }
static cg_tensor *sub_view(ctx *c) { return cg_sub(G, T(X2(4, 3)), X1(4)); }
static cg_tensor *mul_same(ctx *c) { return cg_mul(G, X2(3, 4), X2(3, 4)); }
static cg_tensor *mul_bcast(ctx *c) { return cg_mul(G, X3(2, 3, 4), X2(3, 1)); }
static cg_tensor *mul_self(ctx *c) { cg_tensor *x = X2(3, 4); return cg_mul(G, x, T(T(x))); }
static cg_tensor *div_same(ctx *c) { return cg_div(G, X2(3, 4), POS2(3, 4)); }
static cg_tensor *div_bcast(ctx *c) { return cg_div(G, X3(2, 3, 4), POS2(1, 4)); }
static cg_tensor *div_view(ctx *c) { return cg_div(G, X2(3, 1), T(POS2(4, 3))); }
static cg_tensor *min_bcast(ctx *c) { return cg_minimum(G, X3(2, 3, 4), X2(3, 1)); }
static cg_tensor *min_view(ctx *c) { return cg_minimum(G, T(X2(4, 3)), X2(3, 4)); }
static cg_tensor *max_same(ctx *c) { return cg_maximum(G, X2(3, 4), X2(3, 4)); }
static cg_tensor *max_bcast(ctx *c) { return cg_maximum(G, X1(4), T(X2(4, 2))); }
static cg_tensor *where_(ctx *c) { return cg_where(G, ids(c, 0, 2, 2, 3, 4), X2(3, 4), X2(3, 4)); }
static cg_tensor *where_bcast(ctx *c) { return cg_where(G, ids(c, 0, 2, 1, 4, 0), X3(2, 3, 4), T(X2(1, 3))); }
static cg_tensor *silu_(ctx *c) { return cg_silu(G, leaf(c, -4, 4, false, 2, 4, 5, 0, 0)); }
static cg_tensor *silu_view(ctx *c) { return cg_silu(G, T(X2(5, 4))); }
static cg_tensor *swiglu_(ctx *c) { return cg_swiglu(G, leaf(c, -3, 3, false, 2, 4, 5, 0, 0), X2(4, 5)); }
static cg_tensor *swiglu_packed(ctx *c) {
    cg_tensor *h[2];
    cg_split(G, leaf(c, -3, 3, false, 3, 2, 3, 8, 0), -1, 2, NULL, h);
    return cg_swiglu(G, h[0], h[1]);
}
static cg_tensor *softplus_(ctx *c) { return cg_softplus(G, leaf(c, -3, 3, false, 2, 4, 5, 0, 0), 1.0); }
static cg_tensor *softplus_beta(ctx *c) { return cg_softplus(G, T(leaf(c, -30, 30, false, 2, 5, 4, 0, 0)), 2.0); }
static cg_tensor *elu_(ctx *c) { return cg_elu(G, grid(c, 2, 4, 4, 0), 1.0); }
static cg_tensor *elu_view(ctx *c) { return cg_elu(G, T(grid(c, 2, 4, 4, 0)), 0.5); }
static cg_tensor *leaky_relu_(ctx *c) { return cg_leaky_relu(G, T(grid(c, 2, 4, 4, 0)), 0.1); }
static cg_tensor *abs_(ctx *c) { return cg_abs(G, grid(c, 3, 2, 2, 4)); }
static cg_tensor *clamp_(ctx *c) { return cg_clamp(G, grid(c, 2, 4, 4, 0), -0.5, 0.73); }
static cg_tensor *clamp_low(ctx *c) { return cg_clamp(G, T(grid(c, 2, 4, 4, 0)), -0.5, INFINITY); }
static cg_tensor *scale_(ctx *c) { return cg_scale(G, T(X2(4, 3)), -1.7); }
static cg_tensor *add_scalar_(ctx *c) { return cg_add_scalar(G, X3(2, 3, 4), 0.3); }
static cg_tensor *neg_(ctx *c) { return cg_neg(G, T(X2(4, 3))); }
static cg_tensor *exp_(ctx *c) { return cg_exp(G, X2(3, 5)); }
static cg_tensor *exp_view(ctx *c) { return cg_exp(G, T(X2(5, 3))); }
static cg_tensor *log_(ctx *c) { return cg_log(G, POS2(3, 5)); }
static cg_tensor *sqrt_(ctx *c) { return cg_sqrt(G, T(POS2(5, 3))); }
static cg_tensor *pow_(ctx *c) { return cg_pow(G, POS2(3, 5), 2.5); }
static cg_tensor *pow_neg(ctx *c) { return cg_pow(G, T(POS2(5, 3)), -1.5); }
static cg_tensor *square_(ctx *c) { return cg_square(G, X2(3, 5)); }
static cg_tensor *tanh_(ctx *c) { return cg_tanh(G, T(X2(5, 3))); }
static cg_tensor *sigmoid_(ctx *c) { return cg_sigmoid(G, X3(2, 3, 4)); }
static cg_tensor *relu_(ctx *c) { return cg_relu(G, AWAY2(4, 5)); }
static cg_tensor *relu_view(ctx *c) { return cg_relu(G, T(AWAY2(5, 4))); }
static cg_tensor *gelu_(ctx *c) { return cg_gelu(G, leaf(c, -3, 3, false, 2, 4, 5, 0, 0)); }
static cg_tensor *gelu_view(ctx *c) { return cg_gelu(G, T(X2(5, 4))); }
static cg_tensor *gelu_tanh_(ctx *c) { return cg_gelu_tanh(G, leaf(c, -3, 3, false, 2, 4, 5, 0, 0)); }
static cg_tensor *gelu_tanh_view(ctx *c) { return cg_gelu_tanh(G, T(X2(5, 4))); }
static cg_tensor *masked_fill_(ctx *c) { return cg_masked_fill(G, X3(2, 3, 4), ids(c, 0, 2, 2, 3, 4), -2.5); }
static cg_tensor *masked_fill_view(ctx *c) { return cg_masked_fill(G, T(X2(4, 3)), ids(c, 0, 2, 1, 4, 0), 0); }
static cg_tensor *dropout_(ctx *c) { return cg_dropout(G, X2(6, 8), 0.3); }
static cg_tensor *dropout_view(ctx *c) { return cg_dropout(G, T(X2(8, 6)), 0.5); }
static cg_tensor *cast_(ctx *c) { return cg_mul(G, X2(3, 4), cg_cast(G, ids(c, 0, 3, 2, 3, 4))); }
/* reductions */
static cg_tensor *sum0(ctx *c) { return cg_sum(G, X3(2, 3, 4), 0, false); }
static cg_tensor *sum_last_keep(ctx *c) { return cg_sum(G, X3(2, 3, 4), -1, true); }
static cg_tensor *sum_view(ctx *c) { return cg_sum(G, T(X2(4, 3)), 1, false); }
static cg_tensor *sum_all(ctx *c) { return cg_sum_all(G, T(X2(4, 3))); }
static cg_tensor *mean1(ctx *c) { return cg_mean(G, X3(2, 3, 4), 1, false); }
static cg_tensor *mean_all(ctx *c) { return cg_mean_all(G, X3(2, 3, 4)); }
static cg_tensor *max_axis(ctx *c) { return cg_max(G, X3(2, 3, 4), 1, false); }
static cg_tensor *max_view(ctx *c) { return cg_max(G, T(X2(4, 3)), -1, true); }
static cg_tensor *min_axis(ctx *c) { return cg_min(G, X3(2, 3, 4), -1, true); }
static cg_tensor *argmax_(ctx *c) { /* gather(x, argmax(x)) is max(x): the indices steer the gradient */
    cg_tensor *x = X3(2, 5, 3);
    return cg_gather(G, x, 1, cg_argmax(G, x, 1, true));
}
static cg_tensor *lse_axis(ctx *c) { return cg_logsumexp(G, leaf(c, -3, 3, false, 3, 2, 3, 4, 0), 1, false); }
static cg_tensor *lse_view(ctx *c) { return cg_logsumexp(G, T(X2(5, 3)), -1, true); }
static cg_tensor *var_axis(ctx *c) { return cg_var(G, X3(2, 3, 4), 1, false, 1); }
static cg_tensor *var_pop(ctx *c) { return cg_var(G, T(X2(5, 3)), -1, true, 0); }
static cg_tensor *norm_axis(ctx *c) { return cg_norm(G, X3(2, 3, 4), 0, true); }
static cg_tensor *norm_view(ctx *c) { return cg_norm(G, T(X2(5, 3)), 1, false); }
/* movement */
static cg_tensor *reshape_(ctx *c) { int64_t s[2] = {4, -1}; return cg_reshape(G, X3(2, 3, 4), 2, s); }
static cg_tensor *reshape_copy(ctx *c) { int64_t s[1] = {12}; return cg_reshape(G, T(X2(4, 3)), 1, s); }
static cg_tensor *transpose_(ctx *c) { return cg_exp(G, cg_transpose(G, X3(2, 3, 4), 0, 2)); }
static cg_tensor *permute_(ctx *c) { int p[3] = {2, 0, 1}; return cg_tanh(G, cg_permute(G, X3(2, 3, 4), p)); }
static cg_tensor *slice_(ctx *c) { return cg_square(G, cg_slice(G, X3(2, 5, 4), 1, 1, -1)); }
static cg_tensor *split_(ctx *c) {
    cg_tensor *p[3];
    int64_t sz[3] = {1, 2, 3};
    cg_split(G, X2(6, 2), 0, 3, sz, p);
    return cg_add(G, cg_mul(G, p[1], p[1]), cg_sum(G, p[2], 0, true));
}
static cg_tensor *heads_(ctx *c) { return cg_merge_heads(G, cg_tanh(G, cg_split_heads(G, X3(2, 3, 4), 2))); }
static cg_tensor *contiguous_(ctx *c) { return cg_contiguous(G, cg_transpose(G, X3(2, 3, 4), 1, 2)); }
static cg_tensor *concat_(ctx *c) {
    cg_tensor *xs[3] = {X3(2, 1, 4), X3(2, 3, 4), cg_transpose(G, X3(2, 4, 2), 1, 2)};
    return cg_concat(G, 3, xs, 1);
}
static cg_tensor *concat0(ctx *c) { cg_tensor *xs[2] = {X2(2, 3), X2(1, 3)}; return cg_concat(G, 2, xs, 0); }
static cg_tensor *unsqueeze_(ctx *c) { return cg_mul(G, cg_unsqueeze(G, X2(3, 4), 1), X3(3, 2, 4)); }
static cg_tensor *squeeze_(ctx *c) { return cg_tanh(G, cg_squeeze(G, cg_transpose(G, X3(4, 1, 3), 0, 2), 1)); }
static cg_tensor *stack_(ctx *c) { cg_tensor *xs[3] = {X2(2, 3), T(X2(3, 2)), X2(2, 3)}; return cg_stack(G, 3, xs, 1); }
static cg_tensor *stack_last(ctx *c) { cg_tensor *xs[2] = {X2(2, 3), X2(2, 3)}; return cg_stack(G, 2, xs, -1); }
static cg_tensor *pad_(ctx *c) { return cg_pad(G, X3(2, 3, 4), (int64_t[]){0, 1, 2}, (int64_t[]){1, 0, 3}, -0.5); }
static cg_tensor *pad_view(ctx *c) { return cg_pad(G, T(X2(4, 3)), NULL, (int64_t[]){2, 1}, 0); }
static cg_tensor *index_select0(ctx *c) {
    cg_tensor *ix = ids(c, 0, 4, 1, 6, 0);
    cg_idata(ix)[5] = cg_idata(ix)[0]; /* a repeated index adds up */
    return cg_index_select(G, X2(4, 3), 0, ix);
}
static cg_tensor *index_select_mid(ctx *c) { return cg_index_select(G, cg_transpose(G, X3(2, 4, 5), 1, 2), 1, ids(c, 0, 5, 1, 7, 0)); }
static cg_tensor *gather1(ctx *c) { return cg_gather(G, X2(3, 5), 1, ids(c, 0, 5, 2, 3, 7)); }
static cg_tensor *gather0(ctx *c) { return cg_gather(G, T(X2(3, 4)), 0, ids(c, 0, 4, 2, 6, 3)); }
/* matrix products */
static cg_tensor *mm_2d(ctx *c) { return cg_matmul(G, X2(3, 4), X2(4, 5)); }
static cg_tensor *mm_batched(ctx *c) { return cg_matmul(G, X3(2, 3, 4), X3(2, 4, 5)); }
static cg_tensor *mm_fold(ctx *c) { return cg_matmul(G, X3(2, 3, 4), X2(4, 5)); }
static cg_tensor *mm_bcast_a(ctx *c) { return cg_matmul(G, X2(3, 4), X3(2, 4, 5)); }
static cg_tensor *mm_trans(ctx *c) { return cg_matmul(G, T(X2(4, 3)), T(X2(5, 4))); }
static cg_tensor *mm_4d(ctx *c) { return cg_matmul(G, X4(2, 2, 3, 4), cg_transpose(G, X4(2, 1, 3, 4), 2, 3)); }
static cg_tensor *mm_vec(ctx *c) { return cg_matmul(G, X2(1, 4), X2(4, 1)); }
static cg_tensor *linear_bias(ctx *c) { return cg_linear(G, X3(2, 3, 4), X2(5, 4), X1(5)); }
static cg_tensor *linear_nobias(ctx *c) { return cg_linear(G, X2(3, 4), X2(5, 4), NULL); }
static cg_tensor *linear_view(ctx *c) { return cg_linear(G, T(X2(4, 3)), T(X2(4, 5)), X1(5)); }
static cg_tensor *linear_gelu_bias(ctx *c) { return cg_linear_gelu(G, X3(2, 3, 4), X2(5, 4), X1(5), true); }
static cg_tensor *linear_gelu_erf(ctx *c) { return cg_linear_gelu(G, X2(3, 4), X2(5, 4), NULL, false); }
static cg_tensor *linear_gelu_view(ctx *c) { return cg_linear_gelu(G, T(X2(4, 3)), T(X2(4, 5)), X1(5), true); }
/* 20 outputs: 16 through the vector pass, 4 through the scalar tail */
static cg_tensor *linear_gelu_wide(ctx *c) { return cg_linear_gelu(G, X2(3, 4), X2(20, 4), X1(20), true); }
static cg_tensor *linear_gelu_wide_erf(ctx *c) { return cg_linear_gelu(G, X2(3, 4), X2(20, 4), X1(20), false); }
/* ReLU: backward reads the output's sign. Finite differences across the kink are wrong (float32's step
 * is 1e-2), so x is drawn in [0.5, 2), w's rows (as the op reads them) have alternating signs and
 * magnitudes in [0.5, 1), and the bias is in [-0.5, 0.5): every pre-activation has magnitude >= 0.5,
 * half of them clamped. by_col: w is stored [k, n] and read through a transpose. */
static cg_tensor *relu_w(ctx *c, int64_t n, int64_t k, bool by_col) {
    if (c->pool) return by_col ? X2(k, n) : X2(n, k); /* aliased mode: a view of the pool */
    cg_tensor *w = by_col ? leaf(c, 0.5, 1, false, 2, k, n, 0, 0) : leaf(c, 0.5, 1, false, 2, n, k, 0, 0);
    for (int64_t i = 0; w && i < n * k; i++)
        if ((by_col ? i % n : i / k) % 2) cg_data(w)[i] = -cg_data(w)[i];
    return w;
}
#define RX(...) leaf(c, 0.5, 2, false, __VA_ARGS__)
#define RB(n) leaf(c, -0.5, 0.5, false, 1, n, 0, 0, 0)
static cg_tensor *linear_relu_bias(ctx *c) { return cg_linear_relu(G, RX(3, 2, 3, 4, 0), relu_w(c, 5, 4, false), RB(5)); }
static cg_tensor *linear_relu_view(ctx *c) { return cg_linear_relu(G, T(RX(2, 4, 3, 0, 0)), T(relu_w(c, 5, 4, true)), RB(5)); }
static cg_tensor *linear_relu_wide(ctx *c) { return cg_linear_relu(G, RX(2, 3, 4, 0, 0), relu_w(c, 20, 4, false), NULL); }
/* x [3,2,4] seen as [2,3,4] (leading dims not dense: copied), a bias read with stride 2 */
static cg_tensor *linear_relu_strided(ctx *c) {
    cg_tensor *b = cg_slice(G, leaf(c, -0.5, 0.5, false, 2, 5, 2, 0, 0), 1, 1, 2);
    return cg_linear_relu(G, cg_transpose(G, RX(3, 3, 2, 4, 0), 0, 1), relu_w(c, 5, 4, false),
                          cg_reshape(G, b, 1, (int64_t[]){5}));
}
#undef RX
#undef RB
/* softmax family */
static cg_tensor *softmax_(ctx *c) { return cg_softmax(G, leaf(c, -2, 2, false, 2, 3, 6, 0, 0)); }
static cg_tensor *softmax_view(ctx *c) { return cg_softmax(G, cg_transpose(G, X3(2, 5, 3), 1, 2)); }
static cg_tensor *softmax_axis0(ctx *c) { return cg_softmax_axis(G, leaf(c, -2, 2, false, 3, 4, 2, 3, 0), 0); }
static cg_tensor *softmax_axis1(ctx *c) { return cg_softmax_axis(G, cg_transpose(G, X3(2, 5, 3), 0, 2), 1); }
static cg_tensor *log_softmax_axis(ctx *c) { return cg_log_softmax_axis(G, leaf(c, -2, 2, false, 3, 2, 5, 3, 0), -2); }
static cg_tensor *log_softmax_(ctx *c) { return cg_log_softmax(G, leaf(c, -2, 2, false, 2, 3, 6, 0, 0)); }
static cg_tensor *log_softmax_view(ctx *c) { return cg_log_softmax(G, cg_transpose(G, X3(2, 5, 3), 1, 2)); }
static cg_tensor *msm_causal(ctx *c) { return cg_masked_softmax(G, X4(2, 2, 4, 4), 0.5, NULL, true, NULL); }
static cg_tensor *msm_additive(ctx *c) { return cg_masked_softmax(G, X4(2, 2, 3, 4), 0.7, X2(3, 4), false, NULL); }
static cg_tensor *msm_padding(ctx *c) {
    cg_tensor *kp = ids(c, 0, 2, 2, 2, 5);
    for (int b = 0; b < 2; b++) cg_idata(kp)[b * 5] = 1; /* never a fully hidden row */
    return cg_masked_softmax(G, X4(2, 3, 4, 5), 1.0, NULL, false, kp);
}
static cg_tensor *msm_all(ctx *c) {
    cg_tensor *kp = ids(c, 0, 2, 2, 2, 5);
    for (int b = 0; b < 2; b++) cg_idata(kp)[b * 5] = 1;
    return cg_masked_softmax(G, cg_transpose(G, X4(2, 2, 5, 3), 2, 3), 0.4, X1(5), true, kp);
}
static cg_tensor *sdpa_causal(ctx *c) { return cg_sdpa(G, X4(2, 2, 5, 3), X4(2, 2, 5, 3), X4(2, 2, 5, 3), 0.6, true, NULL); }
static cg_tensor *sdpa_cross(ctx *c) {
    cg_tensor *kp = ids(c, 0, 2, 2, 2, 7);
    for (int b = 0; b < 2; b++) cg_idata(kp)[b * 7 + 6] = 1;
    return cg_sdpa(G, X4(2, 3, 4, 5), X4(2, 3, 7, 5), X4(2, 3, 7, 5), 0.5, false, kp);
}
static cg_tensor *sdpa_views(ctx *c) {
    cg_tensor *qkv[3];
    cg_split(G, X3(2, 6, 12), -1, 3, NULL, qkv);
    return cg_sdpa(G, cg_split_heads(G, qkv[0], 2), cg_split_heads(G, qkv[1], 2), cg_split_heads(G, qkv[2], 2), 0.4,
                   true, NULL);
}
static cg_tensor *rope_neox(ctx *c) { return cg_rope(G, X4(2, 2, 5, 6), 0, NULL); }
static cg_tensor *rope_inter(ctx *c) {
    cg_rope_config r = {.dims = 4, .theta = 100, .linear_factor = 2, .interleaved = true};
    return cg_rope(G, X4(1, 2, 4, 6), 7, &r);
}
static cg_tensor *rope_packed(ctx *c) { /* the k heads of a packed [B, T, 3 * H * D] projection */
    cg_tensor *qkv[3];
    cg_split(G, X3(2, 4, 24), -1, 3, NULL, qkv);
    cg_rope_config r = {.theta = 500000, .llama3_factor = 8, .llama3_low_freq_factor = 1, .llama3_high_freq_factor = 4,
                        .llama3_original_context = 16};
    return cg_rope(G, cg_split_heads(G, qkv[1], 2), 3, &r);
}
static cg_tensor *sdpa_gqa(ctx *c) {
    const cg_sdpa_opts o = {.scale = 0.5, .causal = true, .window = 3};
    return cg_sdpa_ex(G, X4(2, 4, 6, 3), X4(2, 2, 6, 3), X4(2, 2, 6, 3), &o);
}
static cg_tensor *sdpa_mqa(ctx *c) {
    const cg_sdpa_opts o = {.scale = 0.7, .window = 2};
    return cg_sdpa_ex(G, X4(1, 3, 4, 5), X4(1, 1, 6, 5), X4(1, 1, 6, 5), &o);
}
static cg_tensor *sdpa_alibi(ctx *c) { /* 3 heads: BLOOM's slopes for a count that is not a power of two */
    cg_tensor *kp = ids(c, 0, 2, 2, 2, 7);
    for (int b = 0; b < 2; b++) cg_idata(kp)[b * 7 + 6] = 1;
    const cg_sdpa_opts o = {.scale = 0.6, .causal = true, .alibi = true, .key_padding = kp};
    return cg_sdpa_ex(G, X4(2, 3, 5, 3), X4(2, 3, 7, 3), X4(2, 3, 7, 3), &o);
}
static cg_tensor *sdpa_t5(ctx *c) { /* bidirectional buckets, distances past the exact ones */
    const cg_sdpa_opts o = {.scale = 0.5, .rel_bias = X2(8, 2), .rel_max_distance = 6};
    return cg_sdpa_ex(G, X4(2, 2, 5, 3), X4(2, 2, 7, 3), X4(2, 2, 7, 3), &o);
}
static cg_tensor *sdpa_t5_causal(ctx *c) {
    const cg_sdpa_opts o = {.scale = 0.5, .causal = true, .rel_bias = T(X2(4, 6)), .rel_max_distance = 5};
    return cg_sdpa_ex(G, X4(1, 4, 7, 3), X4(1, 2, 7, 3), X4(1, 2, 7, 3), &o);
}
static cg_tensor *sdpa_bias_b(ctx *c) { /* a bias shared by the batch */
    const cg_sdpa_opts o = {.scale = 0.5, .causal = true, .bias = X4(1, 2, 4, 6)};
    return cg_sdpa_ex(G, X4(2, 2, 4, 3), X4(2, 2, 6, 3), X4(2, 2, 6, 3), &o);
}
static cg_tensor *sdpa_bias_keys(ctx *c) { /* [B, 1, 1, Tk], shared by heads and queries, with ALiBi */
    const cg_sdpa_opts o = {.scale = 0.5, .alibi = true, .window = 3, .bias = X4(2, 1, 1, 6)};
    return cg_sdpa_ex(G, X4(2, 4, 5, 3), X4(2, 2, 6, 3), X4(2, 2, 6, 3), &o);
}
static cg_tensor *sdpa_dropout(ctx *c) {
    const cg_sdpa_opts o = {.scale = 0.6, .causal = true, .alibi = true, .rel_bias = X2(6, 2), .dropout = 0.3};
    return cg_sdpa_ex(G, X4(2, 2, 6, 3), X4(2, 2, 6, 3), X4(2, 2, 6, 3), &o);
}
/* normalisation */
static cg_tensor *ln_affine(ctx *c) { return cg_layernorm(G, X2(4, 6), leaf(c, 0.5, 1.5, false, 1, 6, 0, 0, 0), X1(6), 1e-5); }
static cg_tensor *ln_plain(ctx *c) { return cg_layernorm(G, X3(2, 3, 5), NULL, NULL, 1e-5); }
static cg_tensor *aln_affine(ctx *c) {
    return cg_add_layernorm(G, X2(4, 6), X2(4, 6), leaf(c, 0.5, 1.5, false, 1, 6, 0, 0, 0), X1(6), 1e-5);
}
static cg_tensor *aln_view(ctx *c) {
    return cg_add_layernorm(G, cg_transpose(G, X3(2, 5, 3), 1, 2), X3(2, 3, 5), X1(5), NULL, 0.1);
}
static cg_tensor *aln_self(ctx *c) {
    cg_tensor *x = X2(3, 5);
    return cg_add_layernorm(G, x, T(T(x)), NULL, X1(5), 1e-5);
}
static cg_tensor *rms_gain(ctx *c) { return cg_rmsnorm(G, X2(4, 6), leaf(c, 0.5, 1.5, false, 1, 6, 0, 0, 0), 1e-5); }
static cg_tensor *rms_plain(ctx *c) { return cg_rmsnorm(G, X3(2, 3, 5), NULL, 1e-6); }
static cg_tensor *rms_view(ctx *c) { return cg_rmsnorm(G, cg_transpose(G, X3(2, 5, 3), 1, 2), X1(5), 0.1); }
static cg_tensor *ln_view(ctx *c) { return cg_layernorm(G, cg_transpose(G, X3(2, 5, 3), 1, 2), X1(5), NULL, 0.1); }
/* lookup and loss */
static cg_tensor *embedding_(ctx *c) { return cg_embedding(G, X2(7, 3), ids(c, 0, 7, 2, 2, 4)); }
static cg_tensor *embedding_view(ctx *c) { return cg_embedding(G, T(X2(3, 7)), cg_slice(G, ids(c, 0, 7, 2, 3, 4), 1, 1, 3)); }
static cg_tensor *ce_basic(ctx *c) { return cg_cross_entropy(G, leaf(c, -2, 2, false, 2, 6, 5, 0, 0), ids(c, 0, 5, 1, 6, 0), -100); }
static cg_tensor *ce_ignore(ctx *c) {
    cg_tensor *t = ids(c, 0, 4, 2, 2, 3);
    cg_idata(t)[1] = cg_idata(t)[4] = -100;
    return cg_cross_entropy(G, X3(2, 3, 4), t, -100);
}
static cg_tensor *ce_view(ctx *c) { return cg_cross_entropy(G, T(X2(5, 4)), ids(c, 0, 5, 1, 4, 0), 0); }
static cg_tensor *lce_basic(ctx *c) {
    cg_tensor *t = ids(c, 0, 6, 2, 2, 3);
    cg_idata(t)[2] = -100;
    return cg_linear_cross_entropy(G, X3(2, 3, 4), X2(6, 4), X1(6), t, -100);
}
static cg_tensor *lce_view(ctx *c) { return cg_linear_cross_entropy(G, T(X2(4, 5)), T(X2(4, 7)), NULL, ids(c, 0, 7, 1, 5, 0), -100); }
static cg_tensor *ce_smooth(ctx *c) {
    cg_tensor *t = ids(c, 0, 5, 1, 6, 0);
    cg_idata(t)[3] = -100;
    return cg_cross_entropy_smooth(G, leaf(c, -2, 2, false, 2, 6, 5, 0, 0), t, -100, 0.1);
}
static cg_tensor *ce_soft(ctx *c) { return cg_cross_entropy_soft(G, leaf(c, -2, 2, false, 3, 2, 3, 5, 0), leaf(c, 0, 1, false, 3, 2, 3, 5, 0)); }
static cg_tensor *ce_soft_view(ctx *c) { return cg_cross_entropy_soft(G, T(X2(5, 4)), T(leaf(c, 0, 1, false, 2, 5, 4, 0, 0))); }
static cg_tensor *mse_(ctx *c) { return cg_mse_loss(G, X3(2, 3, 4), X3(2, 3, 4)); }
static cg_tensor *mse_view(ctx *c) { return cg_mse_loss(G, T(X2(4, 3)), X2(3, 4)); }
static cg_tensor *bce_(ctx *c) { return cg_bce_with_logits(G, leaf(c, -4, 4, false, 2, 3, 5, 0, 0), leaf(c, 0, 1, false, 2, 3, 5, 0, 0)); }
static cg_tensor *bce_view(ctx *c) { return cg_bce_with_logits(G, T(leaf(c, -30, 30, false, 2, 5, 3, 0, 0)), leaf(c, 0, 1, false, 2, 3, 5, 0, 0)); }
/* Sizes that reach both the 16-lane main loops and the scalar tails (graph/internal.h's row
 * reductions, norm_bwd, attention's row_dot and one-query-row kernels): rows of 21, 45, 50 ... */
static cg_tensor *ln_wide(ctx *c) { return cg_layernorm(G, X2(3, 45), leaf(c, 0.5, 1.5, false, 1, 45, 0, 0, 0), X1(45), 1e-5); }
static cg_tensor *ln_wide_plain(ctx *c) { return cg_layernorm(G, X2(2, 50), NULL, NULL, 1e-5); }
static cg_tensor *rms_wide(ctx *c) { return cg_rmsnorm(G, X2(3, 41), leaf(c, 0.5, 1.5, false, 1, 41, 0, 0, 0), 1e-5); }
static cg_tensor *rms_wide_plain(ctx *c) { return cg_rmsnorm(G, X2(2, 46), NULL, 1e-6); }
static cg_tensor *aln_wide(ctx *c) {
    return cg_add_layernorm(G, X2(3, 43), X2(3, 43), leaf(c, 0.5, 1.5, false, 1, 43, 0, 0, 0), X1(43), 1e-5);
}
static cg_tensor *softmax_wide(ctx *c) { return cg_softmax(G, leaf(c, -2, 2, false, 2, 3, 21, 0, 0)); }
static cg_tensor *log_softmax_wide(ctx *c) { return cg_log_softmax(G, leaf(c, -2, 2, false, 2, 3, 37, 0, 0)); }
static cg_tensor *msm_wide(ctx *c) { return cg_masked_softmax(G, X4(1, 2, 3, 21), 0.8, NULL, true, NULL); }
static cg_tensor *ce_wide(ctx *c) { return cg_cross_entropy(G, leaf(c, -2, 2, false, 2, 4, 21, 0, 0), ids(c, 0, 21, 1, 4, 0), -100); }
static cg_tensor *ce_smooth_wide(ctx *c) {
    return cg_cross_entropy_smooth(G, leaf(c, -2, 2, false, 2, 3, 37, 0, 0), ids(c, 0, 37, 1, 3, 0), -100, 0.1);
}
static cg_tensor *ce_soft_wide(ctx *c) { return cg_cross_entropy_soft(G, leaf(c, -2, 2, false, 2, 3, 21, 0, 0), leaf(c, 0, 0.1, false, 2, 3, 21, 0, 0)); }
static cg_tensor *lce_wide(ctx *c) { return cg_linear_cross_entropy(G, X2(3, 4), X2(21, 4), X1(21), ids(c, 0, 21, 1, 3, 0), -100); }
/* head dim 20 (row_dot: 16 lanes + 4), 21 keys */
static cg_tensor *sdpa_wide(ctx *c) { return cg_sdpa(G, X4(1, 2, 5, 20), X4(1, 2, 21, 20), X4(1, 2, 21, 20), 0.3, true, NULL); }
/* one query row, head dim 70: the row kernels' 16-lane scores (4 x 16 + 6) and 64-wide products + 6 */
static cg_tensor *sdpa_row(ctx *c) { return cg_sdpa(G, X4(1, 1, 1, 70), X4(1, 1, 3, 70), X4(1, 1, 3, 70), 0.2, false, NULL); }
#undef G

/* slice's case wraps the view in an op so the check covers a strided read */
/* custom ops: a gate y = a * sigmoid(b) over 2-D operands of any strides, once with its own
 * backward kernel and once forward-only with a composite of built-in ops defining its gradient */
static cg_status gate_shape(const cg_custom_tensor *in, int n, const void *params, void *user, cg_custom_shape *out) {
    if (in[0].ndim != 2 || in[1].ndim != 2 || in[0].shape[0] != in[1].shape[0] || in[0].shape[1] != in[1].shape[1])
        return cg_set_error(CG_ERR_SHAPE, "a%s and b%s must be the same 2-D shape", cg_dims_str(in[0].ndim, in[0].shape),
                            cg_dims_str(in[1].ndim, in[1].shape));
    out->ndim = 2, out->shape[0] = in[0].shape[0], out->shape[1] = in[0].shape[1];
    out->saved_bytes = (size_t)(out->shape[0] * out->shape[1]) * sizeof(cg_real); /* sigmoid(b) */
    return CG_OK;
}
#define AT(t, i, j) ((cg_real *)(t).data)[(i) * (t).stride[0] + (j) * (t).stride[1]]
static cg_status gate_fwd(cg_custom_ctx *c) {
    const cg_custom_tensor a = cg_custom_input(c, 0), b = cg_custom_input(c, 1), y = cg_custom_output(c);
    cg_real *sig = cg_custom_saved(c);
    for (int64_t i = 0; i < y.shape[0]; i++)
        for (int64_t j = 0; j < y.shape[1]; j++) {
            const cg_real s = (cg_real)(1 / (1 + exp(-(double)AT(b, i, j))));
            sig[i * y.shape[1] + j] = s;
            AT(y, i, j) = AT(a, i, j) * s;
        }
    return CG_OK;
}
static cg_status gate_bwd(cg_custom_ctx *c) {
    const cg_custom_tensor a = cg_custom_input(c, 0), da = cg_custom_input_grad(c, 0), db = cg_custom_input_grad(c, 1),
                           dy = cg_custom_output_grad(c);
    const cg_real *sig = cg_custom_saved(c);
    for (int64_t i = 0; i < dy.shape[0]; i++)
        for (int64_t j = 0; j < dy.shape[1]; j++) {
            const cg_real s = sig[i * dy.shape[1] + j], g = AT(dy, i, j);
            if (da.data) AT(da, i, j) += g * s;
            if (db.data) AT(db, i, j) += g * AT(a, i, j) * s * (1 - s);
        }
    return CG_OK;
}
#undef AT
static cg_tensor *gate_composite(cg_graph *g, cg_tensor *const *in, const void *params, void *user) {
    return cg_mul(g, in[0], cg_sigmoid(g, in[1]));
}
static const cg_custom_op gate_kernel_op = {"gate", 2, gate_shape, gate_fwd, gate_bwd, 1, false, NULL, NULL};
static const cg_custom_op gate_composite_op = {"gate_composite", 2, gate_shape, gate_fwd, NULL, 0, false, gate_composite, NULL};
static cg_tensor *custom_kernel(ctx *c) {
    cg_tensor *in[2] = {X2(3, 5), T(X2(5, 3))};
    return cg_custom(c->g, &gate_kernel_op, in, NULL, 0);
}
static cg_tensor *custom_composite(ctx *c) {
    cg_tensor *in[2] = {T(X2(4, 3)), X2(3, 4)};
    return cg_custom(c->g, &gate_composite_op, in, NULL, 0);
}

/* comparisons, casts, scans, scatters, expand, convolution and pooling */
#define G c->g
/* A real input that needs no gradient, from the values -0.5, 0, 0.5, 1 (ties on purpose): compared
 * values must not be checked inputs, since a finite difference flips a tie. Draws no random numbers. */
static cg_tensor *fixed(ctx *c, int nd, int64_t d0, int64_t d1, int phase) {
    int64_t s[2] = {d0, d1};
    cg_tensor *t = cg_input(c->g, "fixed", CG_REAL, nd, s);
    for (int64_t i = 0; t && i < cg_numel(t); i++) cg_data(t)[i] = (cg_real)(0.5 * (double)((i * phase) % 4) - 0.5);
    return t;
}
static cg_tensor *eq_(ctx *c) { return cg_where(G, cg_eq(G, fixed(c, 2, 3, 4, 1), fixed(c, 1, 4, 0, 3)), X2(3, 4), X2(3, 4)); }
static cg_tensor *eq_int(ctx *c) { return cg_masked_fill(G, X2(3, 4), cg_eq(G, ids(c, 0, 3, 2, 3, 4), ids(c, 0, 3, 2, 3, 1)), 2); }
static cg_tensor *ne_(ctx *c) { return cg_masked_fill(G, T(X2(4, 3)), cg_ne(G, fixed(c, 2, 3, 4, 1), fixed(c, 2, 3, 1, 3)), 0.5); }
static cg_tensor *lt_(ctx *c) { return cg_where(G, cg_lt(G, fixed(c, 2, 3, 4, 1), fixed(c, 1, 4, 0, 3)), X2(3, 4), X1(4)); }
static cg_tensor *le_(ctx *c) { return cg_mul(G, X2(3, 4), cg_cast(G, cg_le(G, fixed(c, 2, 3, 4, 1), fixed(c, 1, 4, 0, 3)))); }
static cg_tensor *gt_(ctx *c) { return cg_where(G, cg_gt(G, fixed(c, 2, 3, 4, 1), fixed(c, 2, 3, 1, 3)), X2(3, 4), T(X2(4, 3))); }
static cg_tensor *ge_(ctx *c) { return cg_masked_fill(G, X2(3, 4), cg_ge(G, fixed(c, 2, 3, 4, 1), fixed(c, 1, 4, 0, 3)), -1); }
static cg_tensor *to_int_(ctx *c) { /* -0.5 -> 0, 0.5 -> 0, 1 -> 1 */
    return cg_mul(G, X2(3, 4), cg_to_real(G, cg_to_int(G, fixed(c, 2, 3, 4, 1))));
}
static cg_tensor *one_hot_real(ctx *c) { return cg_matmul(G, cg_one_hot(G, ids(c, 0, 5, 2, 2, 3), 5, CG_REAL), X2(5, 4)); }
static cg_tensor *one_hot_int(ctx *c) { return cg_mul(G, X3(2, 3, 4), cg_cast(G, cg_one_hot(G, ids(c, 0, 4, 2, 2, 3), 4, CG_INT32))); }
static cg_tensor *cumsum_(ctx *c) { return cg_cumsum(G, X3(2, 3, 4), 1, false); }
static cg_tensor *cumsum_rev(ctx *c) { return cg_cumsum(G, T(X2(4, 3)), -1, true); }
static cg_tensor *topk_(ctx *c) {
    cg_tensor *v = NULL;
    cg_topk(G, grid(c, 2, 2, 8, 0), 3, 1, true, &v, NULL);
    return v;
}
static cg_tensor *topk_small(ctx *c) {
    cg_tensor *v = NULL;
    cg_topk(G, T(grid(c, 2, 8, 2, 0)), 8, -1, false, &v, NULL);
    return v;
}
static cg_tensor *scatter_add_(ctx *c) { return cg_scatter_add(G, X2(3, 5), 1, ids(c, 0, 5, 2, 3, 4), X2(3, 4)); }
static cg_tensor *scatter_add_view(ctx *c) { return cg_scatter_add(G, T(X2(3, 4)), 0, ids(c, 0, 4, 2, 6, 3), X2(6, 3)); }
static cg_tensor *index_add_(ctx *c) { return cg_index_add(G, X2(5, 3), 0, ids(c, 0, 5, 1, 7, 0), X2(7, 3)); }
static cg_tensor *index_add_mid(ctx *c) { return cg_index_add(G, X3(2, 4, 3), 1, ids(c, 0, 4, 1, 5, 0), T(X3(5, 2, 3))); }
static cg_tensor *expand_(ctx *c) { return cg_expand(G, X2(3, 1), 3, (int64_t[]){2, -1, 4}); }
static cg_tensor *expand_view(ctx *c) { return cg_expand(G, T(X2(1, 3)), 2, (int64_t[]){3, 5}); }
static cg_tensor *bmm_(ctx *c) { return cg_bmm(G, X3(2, 3, 4), T(X3(4, 2, 5))); }
static cg_tensor *grouped_linear_(ctx *c) { return cg_grouped_linear(G, X3(2, 3, 4), X3(2, 5, 4), X2(2, 5)); }
static cg_tensor *conv2d_(ctx *c) {
    cg_conv_opts o = {.stride = {2, 1}, .padding = {1, 1}, .groups = 2};
    return cg_conv2d(G, X4(2, 4, 5, 5), X4(6, 2, 3, 3), X1(6), &o);
}
static cg_tensor *conv2d_dil(ctx *c) {
    cg_conv_opts o = {.dilation = {2, 1}, .padding = {0, 2}};
    return cg_conv2d(G, cg_transpose(G, X4(1, 2, 6, 5), 2, 3), X4(3, 2, 2, 3), NULL, &o);
}
static cg_tensor *conv1d_causal(ctx *c) {
    cg_conv_opts o = {.dilation = {2}, .causal = true};
    return cg_conv1d(G, X3(2, 3, 7), X3(4, 3, 3), X1(4), &o);
}
static cg_tensor *conv1d_depthwise(ctx *c) {
    cg_conv_opts o = {.stride = {2}, .padding = {1}, .groups = 4};
    return cg_conv1d(G, cg_transpose(G, X3(2, 8, 4), 1, 2), X3(4, 1, 3), X1(4), &o);
}
static cg_tensor *unfold_(ctx *c) { return cg_unfold(G, X4(1, 2, 4, 5), 2, 3, &(cg_conv_opts){.stride = {1, 2}, .padding = {1, 0}}); }
static cg_tensor *max_pool_(ctx *c) {
    return cg_max_pool2d(G, cg_reshape(G, grid(c, 3, 1, 4, 4), 4, (int64_t[]){1, 1, 4, 4}), (int64_t[]){2, 2}, NULL,
                         (int64_t[]){1, 1});
}
static cg_tensor *avg_pool_(ctx *c) { return cg_avg_pool2d(G, X4(2, 2, 4, 5), (int64_t[]){3, 2}, (int64_t[]){1, 2}, (int64_t[]){1, 1}); }
/* windows that overlap (stride below the kernel) on a transposed (strided) x; distinct values, so
 * every window's maximum is unique and the finite differences see the same one */
static cg_tensor *max_pool_overlap(ctx *c) {
    cg_tensor *x = X4(2, 3, 4, 5);
    if (x && !c->pool) /* 120 values 0.05 apart, shuffled: float32's step 0.01 never reorders a window */
        for (int64_t i = 0; i < 120; i++) cg_data(x)[i] = (cg_real)(-3.0 + 0.05 * (double)((i * 37) % 120));
    return cg_max_pool2d(G, cg_transpose(G, x, 2, 3), (int64_t[]){3, 2}, (int64_t[]){1, 1}, (int64_t[]){1, 0});
}
/* x stored [N, H, W, C] and seen as [N, C, H, W] (a convolution's output): the channels-last path */
static cg_tensor *max_pool_last(ctx *c) {
    cg_tensor *x = X4(2, 4, 5, 3);
    if (x && !c->pool) /* 120 values 0.05 apart, shuffled (see max_pool_overlap) */
        for (int64_t i = 0; i < 120; i++) cg_data(x)[i] = (cg_real)(-3.0 + 0.05 * (double)((i * 53) % 120));
    return cg_max_pool2d(G, cg_permute(G, x, (const int[]){0, 3, 1, 2}), (int64_t[]){2, 2}, (int64_t[]){1, 2},
                         (int64_t[]){1, 1});
}
static cg_tensor *avg_pool_overlap(ctx *c) {
    return cg_avg_pool2d(G, cg_transpose(G, X4(2, 3, 4, 5), 2, 3), (int64_t[]){2, 3}, (int64_t[]){1, 2}, (int64_t[]){1, 1});
}
#undef G

/* rows [0, 2) through w[0], none through w[1], [2, 4) through w[2], row 4 past the last end (0) */
static cg_tensor *segment_linear_(ctx *c) {
    cg_tensor *ends = cg_input(c->g, "ends", CG_INT32, 1, (int64_t[]){3});
    if (ends) cg_idata(ends)[0] = 2, cg_idata(ends)[1] = 2, cg_idata(ends)[2] = 4;
    return cg_segment_linear(c->g, X2(5, 4), X3(3, 3, 4), ends);
}

/* LoRA's fused linear: x w^T + s (x a^T) b^T; then every operand a strided view */
static cg_tensor *lora_linear_(ctx *c) { return cgi_lora_linear_fused(c->g, X3(2, 3, 5), X2(4, 5), X2(2, 5), X2(4, 2), 1.5); }
static cg_tensor *lora_linear_view(ctx *c) {
    return cgi_lora_linear_fused(c->g, X2(3, 5), T(X2(5, 4)), T(X2(5, 2)), T(X2(2, 4)), -0.75);
}

/* linear_add: r + x w^T + bias; r as a view (copied to rows), r the product's own input, and 33 x 35
 * outputs over depth 34 (the blocked driver's strips, where it runs) */
static cg_tensor *linear_add_(ctx *c) { return cg_linear_add(c->g, X3(2, 3, 4), X2(5, 4), X1(5), X3(2, 3, 5)); }
static cg_tensor *linear_add_view(ctx *c) { return cg_linear_add(c->g, T(X2(4, 3)), T(X2(4, 5)), NULL, T(X2(5, 3))); }
static cg_tensor *linear_add_self(ctx *c) {
    cg_tensor *x = X2(3, 4);
    return cg_linear_add(c->g, x, X2(4, 4), X1(4), x);
}
static cg_tensor *linear_add_wide(ctx *c) { return cg_linear_add(c->g, X2(33, 34), X2(35, 34), X1(35), X2(33, 35)); }

static const check_case cases[] = {
    {"add", "[3,4] + [3,4]", add_same},
    {"add", "[2,3,4] + [4]", add_bias},
    {"add", "[3,1] + [1,4]", add_outer},
    {"add", "[4,3]^T + [3,4]", add_view},
    {"sub", "[3,1] - [2,3,4]", sub_bcast},
    {"sub", "[4,3]^T - [4]", sub_view},
    {"mul", "[3,4] * [3,4]", mul_same},
    {"mul", "[2,3,4] * [3,1]", mul_bcast},
    {"mul", "x * x (shared input)", mul_self},
    {"div", "[3,4] / [3,4]", div_same},
    {"div", "[2,3,4] / [1,4]", div_bcast},
    {"div", "[3,1] / [4,3]^T", div_view},
    {"minimum", "[2,3,4] min [3,1]", min_bcast},
    {"minimum", "[4,3]^T min [3,4]", min_view},
    {"maximum", "[3,4] max [3,4]", max_same},
    {"maximum", "[4] max [4,2]^T", max_bcast},
    {"where", "int[3,4] ? [3,4] : [3,4]", where_},
    {"where", "int[4] ? [2,3,4] : [1,3]^T", where_bcast},
    {"silu", "[4,5] in [-4,4]", silu_},
    {"silu", "[5,4]^T", silu_view},
    {"swiglu", "[4,5] [4,5]", swiglu_},
    {"swiglu", "halves of a [2,3,8] view", swiglu_packed},
    {"softplus", "[4,5] beta 1", softplus_},
    {"softplus", "[5,4]^T beta 2, past threshold", softplus_beta},
    {"elu", "[4,4] alpha 1", elu_},
    {"elu", "[4,4]^T alpha 0.5", elu_view},
    {"leaky_relu", "[4,4]^T slope 0.1", leaky_relu_},
    {"abs", "[2,2,4]", abs_},
    {"clamp", "[4,4] to [-0.5, 0.73]", clamp_},
    {"clamp", "[4,4]^T to [-0.5, inf]", clamp_low},
    {"scale", "-1.7 * [4,3]^T", scale_},
    {"add_scalar", "[2,3,4] + 0.3", add_scalar_},
    {"neg", "-[4,3]^T", neg_},
    {"exp", "[3,5]", exp_},
    {"exp", "[5,3]^T", exp_view},
    {"log", "[3,5]", log_},
    {"sqrt", "[5,3]^T", sqrt_},
    {"pow", "[3,5] ^ 2.5", pow_},
    {"pow", "[5,3]^T ^ -1.5", pow_neg},
    {"square", "[3,5]", square_},
    {"tanh", "[5,3]^T", tanh_},
    {"sigmoid", "[2,3,4]", sigmoid_},
    {"relu", "[4,5]", relu_},
    {"relu", "[5,4]^T", relu_view},
    {"gelu", "[4,5]", gelu_},
    {"gelu", "[5,4]^T", gelu_view},
    {"gelu_tanh", "[4,5]", gelu_tanh_},
    {"gelu_tanh", "[5,4]^T", gelu_tanh_view},
    {"masked_fill", "[2,3,4] mask [3,4]", masked_fill_},
    {"masked_fill", "[4,3]^T mask [4]", masked_fill_view},
    {"dropout", "[6,8] p=0.3", dropout_},
    {"dropout", "[8,6]^T p=0.5", dropout_view},
    {"cast", "[3,4] * cast(int [3,4])", cast_},
    {"sum", "[2,3,4] axis 0", sum0},
    {"sum", "[2,3,4] axis -1 keepdim", sum_last_keep},
    {"sum", "[4,3]^T axis 1", sum_view},
    {"sum", "[4,3]^T all", sum_all},
    {"mean", "[2,3,4] axis 1", mean1},
    {"mean", "[2,3,4] all", mean_all},
    {"max", "[2,3,4] axis 1", max_axis},
    {"max", "[4,3]^T axis -1 keepdim", max_view},
    {"min", "[2,3,4] axis -1 keepdim", min_axis},
    {"argmax", "gather([2,5,3], 1, argmax)", argmax_},
    {"logsumexp", "[2,3,4] axis 1", lse_axis},
    {"logsumexp", "[5,3]^T axis -1 keepdim", lse_view},
    {"var", "[2,3,4] axis 1 unbiased", var_axis},
    {"var", "[5,3]^T axis -1 keepdim population", var_pop},
    {"norm", "[2,3,4] axis 0 keepdim", norm_axis},
    {"norm", "[5,3]^T axis 1", norm_view},
    {"reshape", "[2,3,4] -> [4,-1]", reshape_},
    {"reshape", "unsqueeze [3,4] at 1", unsqueeze_},
    {"reshape", "squeeze [3,1,4]^T axis 1", squeeze_},
    {"concat", "stack [2,3] [3,2]^T [2,3] axis 1", stack_},
    {"concat", "stack [2,3] [2,3] axis -1", stack_last},
    {"pad", "[2,3,4] (0,1)(1,0)(2,3) value -0.5", pad_},
    {"pad", "[4,3]^T after (2,1)", pad_view},
    {"index_select", "[4,3] axis 0 index[6] repeats", index_select0},
    {"index_select", "[2,5,4] 1<->2 axis 1 index[7]", index_select_mid},
    {"gather", "[3,5] axis 1 index[3,7]", gather1},
    {"gather", "[4,3]^T axis 0 index[6,3]", gather0},
    {"reshape", "[4,3]^T -> [12] (copies)", reshape_copy},
    {"permute", "transpose [2,3,4] 0<->2", transpose_},
    {"permute", "[2,3,4] -> (2,0,1)", permute_},
    {"slice", "[2,5,4] axis 1 [1:-1]", slice_},
    {"slice", "split [6,2] into 1,2,3", split_},
    {"permute", "split/merge heads [2,3,4] h=2", heads_},
    {"copy", "contiguous([2,3,4] 1<->2)", contiguous_},
    {"concat", "[2,1,4] [2,3,4] [2,4,2]^T axis 1", concat_},
    {"concat", "[2,3] [1,3] axis 0", concat0},
    {"matmul", "[3,4] @ [4,5]", mm_2d},
    {"matmul", "[2,3,4] @ [2,4,5]", mm_batched},
    {"matmul", "[2,3,4] @ [4,5] (folded)", mm_fold},
    {"matmul", "[3,4] @ [2,4,5] (a broadcast)", mm_bcast_a},
    {"matmul", "[4,3]^T @ [5,4]^T", mm_trans},
    {"matmul", "[2,2,3,4] @ [2,1,3,4]^T", mm_4d},
    {"matmul", "[1,4] @ [4,1]", mm_vec},
    {"linear", "[2,3,4] w[5,4] b[5]", linear_bias},
    {"linear", "[3,4] w[5,4] no bias", linear_nobias},
    {"linear", "[4,3]^T w[4,5]^T b[5]", linear_view},
    {"softmax", "[3,6]", softmax_},
    {"softmax", "[2,5,3] 1<->2", softmax_view},
    {"softmax", "[4,2,3] axis 0", softmax_axis0},
    {"softmax", "[3,5,2]^(0<->2) axis 1", softmax_axis1},
    {"log_softmax", "[2,5,3] axis -2", log_softmax_axis},
    {"log_softmax", "[3,6]", log_softmax_},
    {"log_softmax", "[2,5,3] 1<->2", log_softmax_view},
    {"masked_softmax", "[2,2,4,4] causal", msm_causal},
    {"masked_softmax", "[2,2,3,4] + mask[3,4]", msm_additive},
    {"masked_softmax", "[2,3,4,5] key padding", msm_padding},
    {"masked_softmax", "[2,2,3,5]^T causal+pad+mask", msm_all},
    {"attention", "[2,2,5,3] causal", sdpa_causal},
    {"attention", "q[2,3,4,5] kv[2,3,7,5] key padding", sdpa_cross},
    {"attention", "heads of a [2,6,12] qkv view, causal", sdpa_views},
    {"attention", "4 q heads on 2 kv, causal window 3", sdpa_gqa},
    {"attention", "multi-query 3 on 1, window 2 both sides", sdpa_mqa},
    {"attention", "ALiBi 3 heads, causal 5x7, padding", sdpa_alibi},
    {"attention", "T5 table [8,2] bidirectional, 5x7", sdpa_t5},
    {"attention", "T5 table [6,4]^T causal, grouped", sdpa_t5_causal},
    {"attention", "bias [1,2,4,6], causal 4x6", sdpa_bias_b},
    {"attention", "bias [2,1,1,6] + ALiBi, window 3", sdpa_bias_keys},
    {"attention", "dropout 0.3, ALiBi + T5, causal", sdpa_dropout},
    {"rope", "[2,2,5,6] half-split", rope_neox},
    {"rope", "[1,2,4,6] interleaved 4 dims off 7 /2", rope_inter},
    {"rope", "k heads of packed qkv, LLaMA 3", rope_packed},
    {"layernorm", "[4,6] gain bias", ln_affine},
    {"layernorm", "[2,3,5] plain", ln_plain},
    {"layernorm", "[2,3,5] 1<->2 gain", ln_view},
    {"rmsnorm", "[4,6] gain", rms_gain},
    {"rmsnorm", "[2,3,5] plain", rms_plain},
    {"rmsnorm", "[2,3,5] 1<->2 gain", rms_view},
    {"embedding", "w[7,3] ids[2,4]", embedding_},
    {"embedding", "w[3,7]^T ids[3,4][:,1:3]", embedding_view},
    {"cross_entropy", "[6,5]", ce_basic},
    {"cross_entropy", "[2,3,4] ignore -100", ce_ignore},
    {"cross_entropy", "[5,4]^T ignore 0", ce_view},
    {"cross_entropy", "[6,5] smoothing 0.1, ignore", ce_smooth},
    {"cross_entropy_soft", "[2,3,5] probs [2,3,5]", ce_soft},
    {"cross_entropy_soft", "[5,4]^T probs [5,4]^T", ce_soft_view},
    {"mse_loss", "[2,3,4] [2,3,4]", mse_},
    {"mse_loss", "[4,3]^T [3,4]", mse_view},
    {"bce_with_logits", "[3,5] targets [3,5]", bce_},
    {"bce_with_logits", "[5,3]^T in [-30,30]", bce_view},
    {"linear_cross_entropy", "x[2,3,4] w[6,4] b[6] ignore", lce_basic},
    {"linear_cross_entropy", "x[4,5]^T w[4,7]^T", lce_view},
    /* last, so the cases above keep their random inputs */
    {"linear_act", "gelu tanh [2,3,4] w[5,4] b[5]", linear_gelu_bias},
    {"linear_act", "gelu erf [3,4] w[5,4] no bias", linear_gelu_erf},
    {"linear_act", "gelu tanh [4,3]^T w[4,5]^T b[5]", linear_gelu_view},
    {"linear_act", "gelu tanh [3,4] w[20,4] b[20]", linear_gelu_wide},
    {"linear_act", "gelu erf [3,4] w[20,4] b[20]", linear_gelu_wide_erf},
    {"linear_act", "relu [2,3,4] w[5,4] b[5]", linear_relu_bias},
    {"linear_act", "relu [4,3]^T w[4,5]^T b[5]", linear_relu_view},
    {"linear_act", "relu [3,4] w[20,4] no bias", linear_relu_wide},
    {"linear_act", "relu [3,2,4] 0<->1 w[5,4] b[5,2][:,1]", linear_relu_strided},
    {"add_layernorm", "[4,6] + [4,6] gain bias", aln_affine},
    {"add_layernorm", "[2,5,3] 1<->2 + [2,3,5] gain", aln_view},
    {"add_layernorm", "x[3,5] + x^T^T bias", aln_self},
    /* vector main loops and their scalar tails */
    {"layernorm", "[3,45] gain bias", ln_wide},
    {"layernorm", "[2,50] plain", ln_wide_plain},
    {"rmsnorm", "[3,41] gain", rms_wide},
    {"rmsnorm", "[2,46] plain", rms_wide_plain},
    {"add_layernorm", "[3,43] + [3,43] gain bias", aln_wide},
    {"softmax", "[3,21]", softmax_wide},
    {"log_softmax", "[3,37]", log_softmax_wide},
    {"masked_softmax", "[1,2,3,21] causal", msm_wide},
    {"cross_entropy", "[4,21]", ce_wide},
    {"cross_entropy", "[3,37] smoothing 0.1", ce_smooth_wide},
    {"cross_entropy_soft", "[3,21] probs [3,21] in [0,0.1)", ce_soft_wide},
    {"linear_cross_entropy", "x[3,4] w[21,4] b[21]", lce_wide},
    {"attention", "[1,2,5,20] kv 21, causal", sdpa_wide},
    {"attention", "one query row, head dim 70", sdpa_row},
    {"custom", "[3,5]*sig([5,3]^T) own bwd", custom_kernel},
    {"custom", "[4,3]^T*sig([3,4]) composite", custom_composite},
    {"eq", "where(eq(r[3,4], r[4])) [3,4] [3,4]", eq_},
    {"eq", "masked_fill by eq(int[3,4], int[3,1])", eq_int},
    {"ne", "masked_fill [4,3]^T by ne [3,4] [3,1]", ne_},
    {"lt", "where(lt(r[3,4], r[4])) [3,4] [4]", lt_},
    {"le", "[3,4] * cast(le(r[3,4], r[4]))", le_},
    {"gt", "where(gt(r[3,4], r[3,1])) [3,4] [4,3]^T", gt_},
    {"ge", "masked_fill [3,4] by ge [3,4] [4]", ge_},
    {"to_int", "[3,4] * to_real(to_int(r[3,4]))", to_int_},
    {"one_hot", "one_hot(int[2,3], 5) @ [5,4]", one_hot_real},
    {"one_hot", "[2,3,4] * int one_hot(int[2,3], 4)", one_hot_int},
    {"cumsum", "[2,3,4] axis 1", cumsum_},
    {"cumsum", "[4,3]^T axis -1 reverse", cumsum_rev},
    {"topk", "values of [2,8] k 3 largest", topk_},
    {"topk", "values of [8,2]^T axis -1 all smallest", topk_small},
    {"scatter_add", "[3,5] axis 1 += [3,4] at int[3,4]", scatter_add_},
    {"scatter_add", "[3,4]^T axis 0 += [6,3] at int[6,3]", scatter_add_view},
    {"index_add", "[5,3] axis 0 += [7,3] at int[7]", index_add_},
    {"index_add", "[2,4,3] axis 1 += [5,2,3]^T at int[5]", index_add_mid},
    {"expand", "[3,1] -> [2,3,4]", expand_},
    {"expand", "[1,3]^T -> [3,5]", expand_view},
    {"matmul", "bmm [2,3,4] @ [4,2,5]^T", bmm_},
    {"matmul", "grouped linear [2,3,4] w[2,5,4] b[2,5]", grouped_linear_},
    {"unfold", "conv2d [2,4,5,5] w[6,2,3,3] s2,1 p1 g2", conv2d_},
    {"unfold", "conv2d [1,2,5,6]^T w[3,2,2,3] d2,1 p0,2", conv2d_dil},
    {"unfold", "conv1d [2,3,7] w[4,3,3] d2 causal", conv1d_causal},
    {"unfold", "conv1d [2,8,4]^T w[4,1,3] s2 p1 g4", conv1d_depthwise},
    {"unfold", "unfold [1,2,4,5] 2x3 s1,2 p1,0", unfold_},
    {"max_pool2d", "[1,1,4,4] 2x2 p1", max_pool_},
    {"avg_pool2d", "[2,2,4,5] 3x2 s1,2 p1", avg_pool_},
    {"segment_linear", "x[5,4] w[3,3,4] ends {2,2,4}", segment_linear_},
    {"lora_linear", "x[2,3,5] w[4,5] a[2,5] b[4,2] s 1.5", lora_linear_},
    {"lora_linear", "x[3,5] w,a,b transposed views s -0.75", lora_linear_view},
    {"max_pool2d", "[2,3,5,4]^T 3x2 s1 p1,0 overlapping", max_pool_overlap},
    {"avg_pool2d", "[2,3,5,4]^T 2x3 s1,2 p1", avg_pool_overlap},
    {"max_pool2d", "[2,3,4,5] NHWC 2x2 s1,2 p1", max_pool_last},
    {"linear_add", "[2,3,5] + x[2,3,4] w[5,4] b[5]", linear_add_},
    {"linear_add", "[5,3]^T + [4,3]^T w[4,5]^T", linear_add_view},
    {"linear_add", "x[3,4] + x w[4,4] b[4]", linear_add_self},
    {"linear_add", "[33,35] + x[33,34] w[35,34] b[35]", linear_add_wide},
};

int cg_gradcheck_ops(FILE *out, double tol, const char *filter) {
    if (tol <= 0) tol = CG_GRADCHECK_RTOL;
    int failed = 0, ncases = (int)(sizeof cases / sizeof cases[0]);
    if (out) {
        fprintf(out, "gradient check, %s, step %g, pass if |analytic - numeric| <= %g + %g |numeric| everywhere\n",
                sizeof(cg_real) == 8 ? "float64" : "float32", CG_GRADCHECK_EPS, CG_GRADCHECK_ATOL, tol);
        fprintf(out, "%-15s %-34s %12s %12s  %s\n", "op", "shapes", "max abs err", "max rel err", "result");
    }
    for (int i = 0; i < ncases; i++) {
        if (filter && !strstr(cases[i].op, filter)) continue;
        ctx c = {0};
        c.g = cg_graph_new(CG_TRAIN);
        cg_rng_seed(&c.rng, 1000 + (uint64_t)i);
        cg_tensor *y = c.g ? cases[i].build(&c) : NULL;
        cg_gradcheck_result res[MAX_IN];
        cg_status s = y ? cg_gradcheck_tol(c.g, y, c.n, c.in, 0, -1, tol, res) : CG_ERR_ARG;
        double abs_err = 0, rel_err = 0;
        bool within = true;
        for (int k = 0; !s && k < c.n; k++) {
            if (res[k].max_abs_err > abs_err) abs_err = res[k].max_abs_err;
            if (res[k].max_rel_err > rel_err) rel_err = res[k].max_rel_err;
            within &= res[k].pass;
        }
        bool pass = !s && within;
        failed += !pass;
        if (out) {
            if (s) fprintf(out, "%-15s %-34s %12s %12s  FAIL (%s)\n", cases[i].op, cases[i].shapes, "-", "-", cg_last_error());
            else fprintf(out, "%-15s %-34s %12.3e %12.3e  %s\n", cases[i].op, cases[i].shapes, abs_err, rel_err,
                         pass ? "PASS" : "FAIL");
            for (int k = 0; !s && k < c.n; k++)
                if (!res[k].pass)
                    fprintf(out, "    input %d, element %lld: analytic %.9g, numeric %.9g\n", k, (long long)res[k].worst,
                            res[k].analytic, res[k].numeric);
        }
        cg_graph_free(c.g);
    }
    for (int op = 0; op < CGI_OP_COUNT && !filter; op++) {
        if (cgi_ops[op].kind != CGI_KIND_COMPUTE && op != CGI_OP_RESHAPE && op != CGI_OP_PERMUTE && op != CGI_OP_SLICE)
            continue;
        if (cgi_ops[op].bwd_grad & CGI_OUT_IN_SRC0) continue; /* writes in place, inference only: no gradient */
        bool covered = false;
        for (int i = 0; i < ncases; i++) covered |= strcmp(cases[i].op, cgi_ops[op].name) == 0;
        if (!covered) {
            failed++;
            if (out) fprintf(out, "%-15s %-34s %12s %12s  FAIL (no gradient check)\n", cgi_ops[op].name, "-", "-", "-");
        }
    }
    return failed;
}

/* One aliased case on a fresh graph built with the given threads: forward and backward `runs`
 * times; the pool's gradient of the last run goes to dz (need elements). With check, also a
 * finite-difference check of the pool into res. */
static cg_status aliased_run(int i, int64_t shift, int64_t need, int threads, int runs, cg_real *dz, bool *same,
                             const cg_real *ref, double tol, cg_gradcheck_result *res) {
    cg_set_threads(threads);
    ctx c = {0};
    c.g = cg_graph_new(CG_TRAIN);
    c.shift = shift;
    cg_rng_seed(&c.rng, 1000 + (uint64_t)i);
    c.pool = cg_requires_grad(cg_input(c.g, "pool", CG_REAL, 1, &need));
    /* Values every case accepts: positive (log, sqrt, pow), and distinct elements at least 2.5 steps
     * apart, so that no finite difference crosses the kink where two of them tie (minimum, maximum:
     * overlapping inputs compare elements with their neighbours); shuffled. */
    cg_real *pv = cg_data(c.pool);
    const double gap = 2.5 * CG_GRADCHECK_EPS > 1.0 / (double)need ? 2.5 * CG_GRADCHECK_EPS : 1.0 / (double)need;
    for (int64_t k = 0; pv && k < need; k++) pv[k] = (cg_real)(0.5 + gap * (double)k);
    for (int64_t k = need - 1; pv && k > 0; k--) {
        const int64_t j = (int64_t)(cg_rng_next(&c.rng) % (uint64_t)(k + 1));
        const cg_real tmp = pv[k];
        pv[k] = pv[j], pv[j] = tmp;
    }
    cg_tensor *y = c.pool ? cases[i].build(&c) : NULL;
    cg_status s = y ? CG_OK : CG_ERR_ARG;
    if (!s && res) s = cg_gradcheck_tol(c.g, y, 1, &c.pool, 0, -1, tol, res);
    if (!s && !res) {
        cg_tensor *r = cg_input(c.g, "R", CG_REAL, cg_ndim(y), cg_shape(y));
        cg_fill_uniform(r, &c.rng, -1, 1);
        cg_tensor *loss = cg_sum_all(c.g, cg_mul(c.g, y, r));
        for (int k = 0; k < runs && !s; k++) {
            cg_graph_set_rng(c.g, 0x5eed, 0); /* the same dropout mask every run */
            s = cg_graph_forward(c.g);
            if (!s) s = cg_graph_backward(c.g, loss);
            if (!s) s = cg_read_grad(c.pool, dz);
            if (!s && ref) *same &= memcmp(dz, ref, (size_t)need * sizeof *dz) == 0;
        }
    }
    cg_graph_free(c.g);
    return s;
}

int cg_gradcheck_ops_aliased(FILE *out, double tol, int runs, const char *filter) {
    /* an element of shared storage sums several rules' contributions, whose float32 finite
     * differences lose a digit more (float64 keeps the plain tolerance) */
    if (tol <= 0) tol = CG_GRADCHECK_TOL * (sizeof(cg_real) == 4 ? 10 : 1);
    const int threads = cg_threads(), ncases = (int)(sizeof cases / sizeof cases[0]);
    int failed = 0;
    if (out)
        fprintf(out, "aliased inputs: every real input a view of one storage; finite differences, and %d backward "
                     "passes on 2 threads bit for bit as on 1\n%-15s %-34s %5s %12s  %s\n",
                runs, "op", "shapes", "shift", "max rel err", "result");
    for (int i = 0; i < ncases; i++) {
        if (filter && !strstr(cases[i].op, filter)) continue;
        for (int64_t shift = 0; shift <= 3; shift += 3) {
            ctx probe = {0}; /* how much storage the case's inputs span */
            probe.g = cg_graph_new(CG_TRAIN);
            probe.shift = shift;
            int64_t big = 1 << 14;
            probe.pool = cg_requires_grad(cg_input(probe.g, "pool", CG_REAL, 1, &big));
            cases[i].build(&probe);
            cg_graph_free(probe.g);
            const int64_t need = probe.need ? probe.need : 1;
            cg_real *ref = malloc((size_t)need * sizeof *ref), *got = malloc((size_t)need * sizeof *got);
            cg_gradcheck_result res = {0};
            bool same = true;
            cg_status s = ref && got ? CG_OK : CG_ERR_NOMEM;
            if (!s) s = aliased_run(i, shift, need, 1, 1, NULL, NULL, NULL, tol, &res);
            if (!s) s = aliased_run(i, shift, need, 1, 1, ref, NULL, NULL, tol, NULL);
            if (!s) s = aliased_run(i, shift, need, 2, runs, got, &same, ref, tol, NULL);
            const bool pass = !s && same && res.max_rel_err <= tol;
            failed += !pass;
            if (out) {
                if (s) fprintf(out, "%-15s %-34s %5lld %12s  FAIL (%s)\n", cases[i].op, cases[i].shapes, (long long)shift,
                               "-", cg_last_error());
                else fprintf(out, "%-15s %-34s %5lld %12.3e  %s\n", cases[i].op, cases[i].shapes, (long long)shift,
                             res.max_rel_err, pass ? "PASS" : same ? "FAIL" : "FAIL (2 threads differ)");
                if (!s && !pass)
                    fprintf(out, "    element %lld: analytic %.9g, numeric %.9g\n", (long long)res.worst, res.analytic,
                            res.numeric);
            }
            free(ref);
            free(got);
        }
    }
    cg_set_threads(threads);
    return failed;
}

/* One case on a fresh graph, its nodes and y * R (R fixed, random) in one checkpoint segment, the
 * loss sum(y * R) after it, or with loss_inside, in it too (a scalar y is then the loss itself),
 * checkpointing on or off: two forward and backward passes, the same dropout masks in each. Writes
 * the loss and the checked inputs' gradients of the second pass to vals (room for cap values; *len
 * says how many) and how many nodes backward recomputes to *recomputed. */
static cg_status checkpointed_run(int i, bool ckpt, bool loss_inside, cg_real *vals, int64_t cap, int64_t *len,
                                  int *recomputed) {
    ctx c = {0};
    c.g = cg_graph_new(CG_TRAIN);
    if (!c.g) return CG_ERR_NOMEM;
    cg_rng_seed(&c.rng, 1000 + (uint64_t)i);
    cg_status s = cg_checkpoint_begin(c.g);
    cg_tensor *y = s ? NULL : cases[i].build(&c), *loss = y;
    if (y && !(loss_inside && cg_numel(y) == 1)) {
        cg_tensor *r = cg_input(c.g, "R", CG_REAL, cg_ndim(y), cg_shape(y));
        cg_rng rr;
        cg_rng_seed(&rr, 0x9c0ffee);
        if (r) cg_fill_uniform(r, &rr, -1, 1);
        cg_tensor *yr = r ? cg_mul(c.g, y, r) : NULL;
        if (yr && !loss_inside) s = cg_checkpoint_end(c.g);
        loss = yr ? cg_sum_all(c.g, yr) : NULL;
    }
    if (loss && !s && loss_inside) s = cg_checkpoint_end(c.g);
    if (!loss && !s) s = cg_last_status() ? cg_last_status() : CG_ERR_ARG;
    cg_graph_set_checkpointing(c.g, ckpt);
    for (int run = 0; run < 2 && !s; run++) {
        cg_graph_set_rng(c.g, 0x5eed, 0);
        s = cg_graph_forward(c.g);
        if (!s) s = cg_graph_backward(c.g, loss);
    }
    *len = 0;
    if (!s) vals[(*len)++] = *(cg_real *)loss->data;
    for (int k = 0; k < c.n && !s; k++) {
        if (*len + cg_numel(c.in[k]) > cap) {
            s = cgi_fail(CG_ERR_RANGE, "[gradcheck] case inputs exceed %lld values", (long long)cap);
            break;
        }
        s = cg_read_grad(c.in[k], vals + *len);
        *len += cg_numel(c.in[k]);
    }
    *recomputed = 0;
    for (int j = 0; j < c.g->n; j++) *recomputed += c.g->nodes[j]->recompute;
    cg_graph_free(c.g);
    return s;
}

int cg_gradcheck_ops_checkpointed(FILE *out, const char *filter) {
    enum { CAP = 1 << 14 };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    cg_real *ref = malloc(CAP * sizeof *ref), *got = malloc(CAP * sizeof *got);
    if (!ref || !got) {
        free(ref);
        free(got);
        if (out) fprintf(out, "checkpointed: out of memory\n");
        return 1;
    }
    int failed = 0;
    if (out)
        fprintf(out, "checkpoint segments: the loss and every input's gradient with checkpointing on, bit for bit as "
                     "off\n%-19s %-34s %-13s %4s %12s  %s\n", "op", "shapes", "segment", "rec", "max abs diff", "result");
    for (int i = 0; i < ncases; i++) {
        if (filter && !strstr(cases[i].op, filter)) continue;
        for (int inside = 0; inside < 2; inside++) {
            int64_t nref = 0, ngot = 0;
            int rec_off = 0, rec = 0;
            cg_status s = checkpointed_run(i, false, inside, ref, CAP, &nref, &rec_off);
            if (!s) s = checkpointed_run(i, true, inside, got, CAP, &ngot, &rec);
            double worst = 0;
            bool same = !s && nref == ngot && memcmp(ref, got, (size_t)nref * sizeof *ref) == 0;
            for (int64_t k = 0; !s && k < nref && k < ngot; k++) {
                const double d = fabs((double)ref[k] - (double)got[k]);
                if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
            }
            failed += !same;
            if (!out) continue;
            const char *seg = inside ? "op, loss" : "op, loss after";
            if (s) fprintf(out, "%-19s %-34s %-13s %4s %12s  FAIL (%s)\n", cases[i].op, cases[i].shapes, seg, "-", "-",
                           cg_last_error());
            else fprintf(out, "%-19s %-34s %-13s %4d %12.3e  %s\n", cases[i].op, cases[i].shapes, seg, rec, worst,
                         same ? "PASS" : "FAIL");
        }
    }
    free(ref);
    free(got);
    return failed;
}
