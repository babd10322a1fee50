/* SPDX-License-Identifier: MIT */
/* segment_linear: one linear per contiguous segment of rows (torch._grouped_mm with offsets), the
 * product a mixture of experts needs when its rows are sorted by expert and each expert's count is
 * known only when the graph runs. Rows [ends[e-1], ends[e]) go through w[e]; rows from ends[E-1] on
 * give 0. The work is the rows' own: sum over e of (ends[e] - ends[e-1]) x out x in, whatever the
 * split. Two layouts of the weights, told apart by iarg[0]:
 *  - stacked (0): src[] = {x [M, in] contiguous, w [E, out, in], ends int32 [E]};
 *  - one tensor per segment (1): src[] = {x, ends, w_0 [out, in], ..., w_{E-1}}, each read in place
 *    where it lives, so experts stored as parameters of their own are never copied into a stack.
 *    Only parameters (or views of them) go this way: the op table's backward-read mask covers the
 *    first inputs alone, and parameters' storage is outside the memory plan; other weights are
 *    stacked by cg_concat. */
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/ops.h"

/* Segment e's weight: its first element, row and column strides, and its gradient (NULL if none). */
typedef struct {
    const cg_real *w;
    cg_real *grad;
    int64_t rs, cs;
} seg_weight;

static const cg_tensor *ends_of(const cg_tensor *t) { return t->src[t->iarg[0] ? 1 : 2]; }
static int64_t nsegs(const cg_tensor *t) { return ends_of(t)->shape[0]; }
static int64_t out_dim(const cg_tensor *t) { return t->shape[1]; }

static seg_weight weight_of(const cg_tensor *t, int64_t e) {
    if (t->iarg[0]) {
        const cg_tensor *w = t->src[2 + e];
        return (seg_weight){w->data, w->requires_grad ? w->grad : NULL, w->stride[0], w->stride[1]};
    }
    const cg_tensor *w = t->src[1];
    return (seg_weight){(const cg_real *)w->data + e * w->stride[0], w->requires_grad ? w->grad + e * w->stride[0] : NULL,
                        w->stride[1], w->stride[2]};
}

static bool ends_ok(cg_tensor *ends, int64_t e) {
    if (ends->dtype == CG_INT32 && ends->ndim == 1 && ends->shape[0] == e) return true;
    cgi_fail(CG_ERR_SHAPE, "[segment_linear] ends%s: need int32 ends[%lld], one per weight", cgi_shp(ends), (long long)e);
    return false;
}

cg_tensor *cg_segment_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *ends) {
    cg_tensor *in[3] = {x, w, ends};
    if (!cgi_inputs_ok(g, "segment_linear", 3, in) || !cgi_expect_real("segment_linear", x, "x") ||
        !cgi_expect_real("segment_linear", w, "w"))
        return NULL;
    if (x->ndim != 2 || w->ndim != 3 || x->shape[1] != w->shape[2] || ends->dtype != CG_INT32 || ends->ndim != 1 ||
        ends->shape[0] != w->shape[0]) {
        cgi_fail(CG_ERR_SHAPE, "[segment_linear] x%s, w%s, ends%s: need x[M, in], w[E, out, in] and int32 ends[E]",
                 cgi_shp(x), cgi_shp(w), cgi_shp(ends));
        return NULL;
    }
    in[0] = cg_contiguous(g, x);
    in[2] = cg_contiguous(g, ends);
    if (!in[0] || !in[2]) return NULL;
    return cgi_node(g, CGI_OP_SEGMENT_LINEAR, CG_REAL, 2, (int64_t[]){x->shape[0], w->shape[1]}, 3, in);
}

cg_tensor *cg_segment_linear_each(cg_graph *g, cg_tensor *x, int n, cg_tensor *const *w, cg_tensor *ends) {
    if (n < 1 || !w) {
        cgi_fail(CG_ERR_ARG, "[segment_linear] need n >= 1 weights, got %d", n);
        return NULL;
    }
    cg_tensor *in2[2] = {x, ends};
    if (!cgi_inputs_ok(g, "segment_linear", 2, in2) || !cgi_inputs_ok(g, "segment_linear", n, w) ||
        !cgi_expect_real("segment_linear", x, "x"))
        return NULL;
    bool all_params = true;
    for (int e = 0; e < n; e++) {
        if (!cgi_expect_real("segment_linear", w[e], "w")) return NULL;
        if (w[e]->ndim != 2 || x->ndim != 2 || w[e]->shape[1] != x->shape[1] || w[e]->shape[0] != w[0]->shape[0]) {
            cgi_fail(CG_ERR_SHAPE, "[segment_linear] x%s, w[%d]%s, w[0]%s: need x[M, in] and every w[out, in]", cgi_shp(x), e,
                     cgi_shp(w[e]), cgi_shp(w[0]));
            return NULL;
        }
        all_params = all_params && w[e]->root->op == CGI_OP_PARAM;
    }
    if (!ends_ok(ends, n)) return NULL;
    if (!all_params) { /* nodes of the graph: stacked, so that the plan keeps them for backward */
        cg_tensor **v = malloc((size_t)n * sizeof *v); /* build time only */
        if (!v) {
            cgi_fail(CG_ERR_NOMEM, "[segment_linear] out of memory");
            return NULL;
        }
        for (int e = 0; e < n; e++) v[e] = cg_reshape(g, w[e], 3, (int64_t[]){1, w[e]->shape[0], w[e]->shape[1]});
        cg_tensor *s = cg_concat(g, n, v, 0);
        free(v);
        return cg_segment_linear(g, x, s, ends);
    }
    cg_tensor **in = malloc((size_t)(n + 2) * sizeof *in);
    if (!in) {
        cgi_fail(CG_ERR_NOMEM, "[segment_linear] out of memory");
        return NULL;
    }
    in[0] = cg_contiguous(g, x);
    in[1] = cg_contiguous(g, ends);
    memcpy(in + 2, w, (size_t)n * sizeof *in);
    cg_tensor *t = in[0] && in[1] ? cgi_node(g, CGI_OP_SEGMENT_LINEAR, CG_REAL, 2, (int64_t[]){x->shape[0], w[0]->shape[0]},
                                             n + 2, in)
                                  : NULL;
    free(in);
    if (t) t->iarg[0] = 1;
    return t;
}

cg_status cgi_fwd_segment_linear(cg_tensor *t) {
    const cg_tensor *x = t->src[0], *ends = ends_of(t);
    const int32_t *E = ends->data;
    const int64_t m = x->shape[0], n = out_dim(t), k = x->shape[1], ne = nsegs(t);
    for (int64_t e = 0, prev = 0; e < ne; prev = E[e], e++)
        if (E[e] < prev || E[e] > m)
            return cgi_fail(CG_ERR_RANGE, "[segment_linear] ends[%lld] = %d: ends must rise from 0 to at most the %lld rows "
                            "of x%s (ends[%lld] = %lld)", (long long)e, E[e], (long long)m, cgi_shp(x),
                            (long long)(e - 1), (long long)prev);
    cg_real *y = t->data;
    const int nt = cgi_nthreads();
    for (int64_t e = 0, start = 0; e < ne; start = E[e], e++) /* y[rows] = x[rows] @ w[e]^T */
        if (E[e] > start) {
            const seg_weight w = weight_of(t, e);
            cgi_gemm(E[e] - start, n, k, (const cg_real *)x->data + start * k, k, 1, w.w, w.cs, w.rs, 1, 0, y + start * n, n, 1,
                     nt);
        }
    const int64_t used = ne ? E[ne - 1] : 0;
    for (int64_t i = used * n; i < m * n; i++) y[i] = 0;
    return CG_OK;
}

void cgi_bwd_segment_linear(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    const int32_t *E = ends_of(t)->data;
    const int64_t n = out_dim(t), k = x->shape[1], ne = nsegs(t);
    const cg_real *dy = t->grad;
    const int nt = cgi_nthreads();
    for (int64_t e = 0, start = 0; e < ne; start = E[e], e++) {
        const int64_t rows = E[e] - start;
        if (rows <= 0) continue;
        const seg_weight w = weight_of(t, e);
        if (x->requires_grad) /* dx[rows] += dy[rows] @ w[e] */
            cgi_gemm(rows, k, n, dy + start * n, n, 1, w.w, w.rs, w.cs, 1, 1, x->grad + start * k, k, 1, nt);
        if (w.grad) /* dw[e] += dy[rows]^T @ x[rows] */
            cgi_gemm(n, k, rows, dy + start * n, 1, n, (const cg_real *)x->data + start * k, k, 1, 1, 1, w.grad, w.rs, w.cs, nt);
    }
}
