/* SPDX-License-Identifier: MIT */
/* The forward of a low-rank adapter (LoRA, Hu et al. 2021). A parameter P[R, C] with an adapter
 * acts as P + s B A, B[R, r], A[r, C], s = alpha / r. Every cg_linear whose weight reads P takes
 * the adapter's path too, so the model zoo gets LoRA without a line of change, however its weights
 * are laid out: as P itself or a block of its rows (nn.Linear, a fused QKV slice), or as such a
 * block transposed (GPT-2's Conv1D). The adapter path is x A^T B^T, or x B A transposed: never an
 * [R, C] matrix.
 * A weight read as P or a block of its rows, without a bias, is one node, lora_linear: the
 * adapter's product x A^T (scaled, [.., r]) is kept for backward and its B^T product is added
 * straight into the output (beta 1), so no [.., R] delta, no add pass and no second conversion of
 * dY to bf16; backward runs dY B, dB, dA and dX side by side. Other layouts are composed from
 * linear, matmul, scale and add, which need no backward of their own. */
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/ops.h"

/* The composed adapter path beside y = linear(x, w): y + s (x A^T) B[rows]^T, or for a weight read
 * transposed, y + s (x B[rows]) A. */
cg_tensor *cgi_lora_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *y) {
    cg_tensor *p = w->root, *a = p->lora_a, *b = p->lora_b;
    if (!y || !x) return NULL;
    const int64_t C = p->shape[1];
    /* which rows [r0, r0 + n) of P the weight reads, and whether transposed */
    const bool plain = w->stride[1] == 1 && w->stride[0] == C && w->shape[1] == C;
    const bool transposed = w->stride[0] == 1 && w->stride[1] == C && w->shape[0] == C;
    if (p->ndim != 2 || (!plain && !transposed) || w->offset % C) {
        cgi_fail(CG_ERR_SHAPE, "[lora] %s%s is read as w%s strides%s: an adapter covers P, a block of its rows, or "
                 "their transpose", cg_name(p), cgi_shp(p), cgi_shp(w), cgi_dims(w->ndim, w->stride));
        return NULL;
    }
    const int64_t r0 = w->offset / C, n = plain ? w->shape[0] : w->shape[1];
    cg_tensor *b_rows = r0 == 0 && n == p->shape[0] ? b : cg_slice(g, b, 0, r0, r0 + n);
    cg_tensor *low, *delta;
    if (plain) { /* y += s (x A^T) B[rows]^T */
        low = cg_linear(g, x, a, NULL);
        delta = cg_linear(g, cg_scale(g, low, p->lora_scale), b_rows, NULL);
    } else { /* w = P[rows]^T: y += s (x B[rows]) A */
        low = cg_matmul(g, x, b_rows);
        delta = cg_matmul(g, cg_scale(g, low, p->lora_scale), a);
    }
    return cg_add(g, y, delta);
}

/* The fused node for linear(x, w) when w (P or a block of its rows, not transposed) carries an
 * adapter and there is no bias; NULL with no error set when the layout is not that one (the
 * caller composes). CGRAD_LORA_UNFUSED=1 always composes, for comparisons. */
cg_tensor *cgi_lora_linear_plain(cg_graph *g, cg_tensor *x, cg_tensor *w) {
    const char *env = getenv("CGRAD_LORA_UNFUSED"); /* read per graph build: benches switch it */
    const bool unfused = env && atoi(env);
    cg_tensor *p = w->root;
    if (unfused || p->ndim != 2 || w->ndim != 2) return NULL;
    const int64_t C = p->shape[1];
    if (w->stride[1] != 1 || w->stride[0] != C || w->shape[1] != C || w->offset % C) return NULL;
    const int64_t r0 = w->offset / C, n = w->shape[0];
    cg_tensor *b_rows = r0 == 0 && n == p->shape[0] ? p->lora_b : cg_slice(g, p->lora_b, 0, r0, r0 + n);
    return b_rows ? cgi_lora_linear_fused(g, x, w, p->lora_a, b_rows, p->lora_scale) : NULL;
}

static int64_t rows_of(const cg_tensor *x) { return cgi_numel(x->ndim - 1, x->shape); }
static int64_t row_stride(const cg_tensor *x) { return x->ndim >= 2 ? x->stride[x->ndim - 2] : 1; }

cg_tensor *cgi_lora_linear_fused(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *a, cg_tensor *b, double scale) {
    cg_tensor *in[4] = {x, w, a, b};
    if (!cgi_inputs_ok(g, "lora_linear", 4, in)) return NULL;
    if (!cgi_expect_real("lora_linear", x, "x") || !cgi_expect_real("lora_linear", w, "w") ||
        !cgi_expect_real("lora_linear", a, "a") || !cgi_expect_real("lora_linear", b, "b"))
        return NULL;
    if (x->ndim < 1 || w->ndim != 2 || a->ndim != 2 || b->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
        a->shape[1] != w->shape[1] || b->shape[0] != w->shape[0] || b->shape[1] != a->shape[0] || a->shape[0] < 1) {
        cgi_fail(CG_ERR_SHAPE, "[lora_linear] x%s w%s a%s b%s: need x [.., k], w [n, k], a [r, k], b [n, r]", cgi_shp(x),
                 cgi_shp(w), cgi_shp(a), cgi_shp(b));
        return NULL;
    }
    if (!isfinite(scale)) {
        cgi_fail(CG_ERR_ARG, "[lora_linear] scale %g must be finite", scale);
        return NULL;
    }
    if (x->ndim > 1 && !cgi_contiguous(x)) x = cg_contiguous(g, x); /* rows_of folds the leading dims */
    if (!x) return NULL;
    in[0] = x;
    int64_t s[CG_MAX_DIMS];
    memcpy(s, x->shape, sizeof s);
    s[x->ndim - 1] = w->shape[0];
    cg_tensor *t = cgi_node(g, CGI_OP_LORA_LINEAR, CG_REAL, x->ndim, s, 4, in);
    if (!t) return NULL;
    const int64_t m = rows_of(x), r = a->shape[0];
    t->farg[0] = scale;
    t->aux_bytes = (size_t)(m * r) * sizeof(cg_real);     /* s x a^T, for dB */
    t->bwd_aux_bytes = (size_t)(m * r) * sizeof(cg_real); /* s dY b, for dA and dX */
    return t;
}

/* The operands' layouts, [rows, cols] with row and column strides (a transpose swaps them) */
typedef struct {
    int64_t m, n, k, r;                 /* x [m, k], w [n, k], a [r, k], b [n, r] */
    int64_t rx, cx, rw, cw, ra, ca, rb, cb;
} lora_dims;

static lora_dims dims_of(const cg_tensor *t) {
    const cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2], *b = t->src[3];
    return (lora_dims){rows_of(x),    w->shape[0],  w->shape[1],  a->shape[0],  row_stride(x), x->stride[x->ndim - 1],
                       w->stride[0], w->stride[1], a->stride[0], a->stride[1], b->stride[0], b->stride[1]};
}

cg_status cgi_fwd_lora_linear(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1];
    if (cgi_lp_on(t)) {
        if (cgi_lp_lora_fwd(t)) return CG_OK;
        if (x->root->lp_value)
            return cgi_fail(CG_ERR_NOMEM, "[lora_linear] bf16: no memory for the bf16 form of weight %s (%s), and input "
                                          "%s is stored only in bf16",
                            cgi_shp(w), cg_name(w->root), cgi_shp(x));
    }
    int wel; /* a half-precision frozen weight is read in place, widened as it is packed */
    const cg_real *wv = cgi_operand_elems(w, &wel);
    const lora_dims d = dims_of(t);
    const cg_real s = (cg_real)t->farg[0];
    cg_real *low = t->aux;
    const cg_tensor *a = t->src[2], *b = t->src[3];
    /* low = s x a^T and y = x w^T side by side; then y += low b^T */
    const cgi_gemm_job jobs[2] = {
        {d.m, d.r, d.k, x->data, d.rx, d.cx, a->data, d.ca, d.ra, s, 0, low, d.r, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0},
        {d.m, d.n, d.k, x->data, d.rx, d.cx, wv, d.cw, d.rw, 1, 0, t->data, d.n, 1, NULL, 0, false, CGI_EL_F32, (uint8_t)wel, NULL, 0},
    };
    cgi_gemm_many(jobs, 2, cgi_nthreads());
    cgi_gemm(d.m, d.n, d.r, low, d.r, 1, b->data, d.cb, d.rb, 1, 1, t->data, d.n, 1, cgi_nthreads());
    return CG_OK;
}

void cgi_bwd_lora_linear(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2], *b = t->src[3];
    const bool dx = x->requires_grad, dw = w->requires_grad, da = a->requires_grad, db = b->requires_grad;
    /* gradients sharing storage are written one product at a time, each adding */
    const bool alias = cgi_grads_alias(x, w) || cgi_grads_alias(x, a) || cgi_grads_alias(x, b) ||
                       cgi_grads_alias(w, a) || cgi_grads_alias(w, b) || cgi_grads_alias(a, b);
    const bool x_assign = dx && !alias && cgi_grad_begin_whole(x);
    const bool w_assign = dw && !alias && cgi_grad_begin(w), a_assign = da && !alias && cgi_grad_begin(a),
               b_assign = db && !alias && cgi_grad_begin(b);
    if (alias) {
        if (dx) cgi_grad_prepare(x);
        if (dw) cgi_grad_prepare(w);
        if (da) cgi_grad_prepare(a);
        if (db) cgi_grad_prepare(b);
    }
    if (cgi_lp_on(t) && cgi_lp_lora_bwd(t, x_assign, w_assign, a_assign, b_assign)) return;
    int wel; /* a half-precision frozen weight (no dW then) is read in place */
    const cg_real *wv = cgi_operand_elems(w, &wel);
    const lora_dims d = dims_of(t);
    const cg_real s = (cg_real)t->farg[0], *dy = t->grad, *low = t->aux;
    cg_real *dlow = t->bwd_aux;
    const int nt = cgi_nthreads();
    if (dx || da) /* dlow = s dY b [m, r] */
        cgi_gemm(d.m, d.r, d.n, dy, d.n, 1, b->data, d.rb, d.cb, s, 0, dlow, d.r, 1, nt);
    cgi_gemm_job jobs[4];
    int nj = 0;
    if (dx) /* dX [m, k] (+)= dY w */
        jobs[nj++] = (cgi_gemm_job){.m = d.m, .n = d.k, .k = d.n, .a = dy, .rsa = d.n, .csa = 1, .b = wv, .rsb = d.rw,
                                    .csb = d.cw, .alpha = 1, .beta = x_assign ? 0 : 1, .c = x->grad,
                                    .rsc = row_stride(x), .csc = x->stride[x->ndim - 1], .tb = (uint8_t)wel};
    if (dw) /* dW [n, k] (+)= dY^T x */
        jobs[nj++] = (cgi_gemm_job){.m = d.n, .n = d.k, .k = d.m, .a = dy, .rsa = 1, .csa = d.n, .b = x->data,
                                    .rsb = d.rx, .csb = d.cx, .alpha = 1, .beta = w_assign ? 0 : 1, .c = w->grad,
                                    .rsc = w->stride[0], .csc = w->stride[1]};
    if (da) /* dA [r, k] (+)= dlow^T x */
        jobs[nj++] = (cgi_gemm_job){.m = d.r, .n = d.k, .k = d.m, .a = dlow, .rsa = 1, .csa = d.r, .b = x->data,
                                    .rsb = d.rx, .csb = d.cx, .alpha = 1, .beta = a_assign ? 0 : 1, .c = a->grad,
                                    .rsc = a->stride[0], .csc = a->stride[1]};
    if (db) /* dB [n, r] (+)= dY^T low */
        jobs[nj++] = (cgi_gemm_job){.m = d.n, .n = d.r, .k = d.m, .a = dy, .rsa = 1, .csa = d.n, .b = low, .rsb = d.r,
                                    .csb = 1, .alpha = 1, .beta = b_assign ? 0 : 1, .c = b->grad, .rsc = b->stride[0],
                                    .csc = b->stride[1]};
    if (alias)
        for (int j = 0; j < nj; j++) cgi_gemm_many(&jobs[j], 1, nt);
    else cgi_gemm_many(jobs, nj, nt);
    if (dx) /* dX += dlow a, after dX's first product */
        cgi_gemm(d.m, d.k, d.r, dlow, d.r, 1, a->data, d.ra, d.ca, 1, 1, x->grad, row_stride(x), x->stride[x->ndim - 1], nt);
}
