/* SPDX-License-Identifier: MIT */
/* segment_linear: one linear per contiguous segment of rows (torch._grouped_mm with offsets), the
 * product a mixture of experts needs when its rows are sorted by expert and each expert's count is
 * known only when the graph runs. Rows [ends[e-1], ends[e]) go through w[e]; rows from ends[E-1] on
 * give 0. The work is the rows' own: sum over e of (ends[e] - ends[e-1]) x out x in, whatever the
 * split. src[] = {x [M, in] contiguous, w [E, out, in], ends int32 [E]}. */
#include "graph/internal.h"
#include "ops/ops.h"

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

cg_status cgi_fwd_segment_linear(cg_tensor *t) {
    const cg_tensor *x = t->src[0], *w = t->src[1], *ends = t->src[2];
    const int32_t *E = ends->data;
    const int64_t m = x->shape[0], n = w->shape[1], k = w->shape[2], ne = w->shape[0];
    for (int64_t e = 0, prev = 0; e < ne; prev = E[e], e++)
        if (E[e] < prev || E[e] > m)
            return cgi_fail(CG_ERR_RANGE, "[segment_linear] ends[%lld] = %d: ends must rise from 0 to at most the %lld rows "
                            "of x%s (ends[%lld] = %lld)", (long long)e, E[e], (long long)m, cgi_shp(x),
                            (long long)(e - 1), (long long)prev);
    cg_real *y = t->data;
    const int nt = cgi_nthreads();
    for (int64_t e = 0, start = 0; e < ne; start = E[e], e++) /* y[rows] = x[rows] @ w[e]^T */
        if (E[e] > start)
            cgi_gemm(E[e] - start, n, k, (const cg_real *)x->data + start * k, k, 1,
                     (const cg_real *)w->data + e * w->stride[0], w->stride[2], w->stride[1], 1, 0, y + start * n, n, 1, nt);
    const int64_t used = ne ? E[ne - 1] : 0;
    for (int64_t i = used * n; i < m * n; i++) y[i] = 0;
    return CG_OK;
}

void cgi_bwd_segment_linear(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1];
    const int32_t *E = t->src[2]->data;
    const int64_t n = w->shape[1], k = w->shape[2], ne = w->shape[0];
    const cg_real *dy = t->grad;
    const int nt = cgi_nthreads();
    for (int64_t e = 0, start = 0; e < ne; start = E[e], e++) {
        const int64_t rows = E[e] - start;
        if (rows <= 0) continue;
        if (x->requires_grad) /* dx[rows] += dy[rows] @ w[e] */
            cgi_gemm(rows, k, n, dy + start * n, n, 1, (const cg_real *)w->data + e * w->stride[0], w->stride[1],
                     w->stride[2], 1, 1, x->grad + start * k, k, 1, nt);
        if (w->requires_grad) /* dw[e] += dy[rows]^T @ x[rows] */
            cgi_gemm(n, k, rows, dy + start * n, 1, n, (const cg_real *)x->data + start * k, k, 1, 1, 1,
                     w->grad + e * w->stride[0], w->stride[1], w->stride[2], nt);
    }
}
