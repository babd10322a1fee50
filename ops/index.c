/* SPDX-License-Identifier: MIT */
/* Indexing by int32 data along one axis: index_select (the same indices for every lane) and
 * gather (torch.gather: an index per output element). x is read as [outer, n, inner] (contiguous),
 * the output as [outer, k, inner]. Indices are data, so forward checks them on every run and keeps
 * a checked, contiguous copy in aux. Backward scatter-adds: each (outer, inner) lane of x's
 * gradient is written by one thread, in index order, so repeated indices add up the same way on
 * every run and thread count. iarg[0] axis, iarg[1] inner, iarg[2] outer. */
#include "graph/internal.h"
#include "ops/ops.h"

static cg_tensor *index_node(cg_graph *g, int op, cg_tensor *x, int axis, cg_tensor *idx) {
    const char *nm = cgi_ops[op].name;
    cg_tensor *in[2] = {x, idx};
    if (!cgi_inputs_ok(g, nm, 2, in) || !cgi_expect_real(nm, x, "x")) return NULL;
    const int a = cgi_axis(nm, x, axis);
    if (a < 0) return NULL;
    bool ok = idx->dtype == CG_INT32;
    if (op == CGI_OP_INDEX_SELECT) ok = ok && idx->ndim == 1;
    else {
        ok = ok && idx->ndim == x->ndim;
        for (int d = 0; ok && d < x->ndim; d++) ok = d == a || idx->shape[d] == x->shape[d];
    }
    if (!ok) {
        cgi_fail(CG_ERR_SHAPE, op == CGI_OP_INDEX_SELECT ? "[%s] index%s must be int32 [K] for x%s"
                                                         : "[%s] index%s must be int32 shaped as x%s except along the axis",
                 nm, cgi_shp(idx), cgi_shp(x));
        return NULL;
    }
    in[0] = cg_contiguous(g, x);
    if (!in[0]) return NULL;
    int64_t s[CG_MAX_DIMS], inner = 1, outer = 1;
    for (int d = 0; d < x->ndim; d++) {
        s[d] = d == a ? (op == CGI_OP_INDEX_SELECT ? idx->shape[0] : idx->shape[a]) : x->shape[d];
        if (d < a) outer *= x->shape[d];
        if (d > a) inner *= x->shape[d];
    }
    cg_tensor *t = cgi_node(g, op, CG_REAL, x->ndim, s, 2, in);
    if (!t) return NULL;
    t->iarg[0] = a, t->iarg[1] = inner, t->iarg[2] = outer;
    t->aux_bytes = (size_t)cgi_numel(idx->ndim, idx->shape) * sizeof(int32_t);
    return t;
}

cg_tensor *cg_index_select(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index) {
    return index_node(g, CGI_OP_INDEX_SELECT, x, axis, index);
}
cg_tensor *cg_gather(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index) {
    return index_node(g, CGI_OP_GATHER, x, axis, index);
}

/* Copies the indices into aux in row-major order, checking each against [0, n). */
static cg_status check_indices(cg_tensor *t) {
    const cg_tensor *x = t->src[0], *idx = t->src[1];
    const int64_t n = x->shape[t->iarg[0]], count = cgi_numel(idx->ndim, idx->shape);
    const int32_t *I = idx->data;
    int32_t *dst = t->aux;
    for (int64_t i = 0; i < count; i++) {
        int64_t off = 0, r = i;
        for (int d = idx->ndim - 1; d >= 0; d--) {
            off += (r % idx->shape[d]) * idx->stride[d];
            r /= idx->shape[d];
        }
        const int32_t k = I[off];
        if (k < 0 || k >= n)
            return cgi_fail(CG_ERR_RANGE, "[%s] index %d at position %lld of index%s is outside [0, %lld) for axis %d of x%s",
                            cgi_ops[t->op].name, k, (long long)i, cgi_shp(idx), (long long)n, (int)t->iarg[0], cgi_shp(x));
        dst[i] = k;
    }
    return CG_OK;
}

/* The index of output element (o, j, i): one per j for index_select, one per element for gather. */
static inline int64_t pick(const cg_tensor *t, const int32_t *ix, int64_t o, int64_t j, int64_t i, int64_t k) {
    return t->op == CGI_OP_INDEX_SELECT ? ix[j] : ix[(o * k + j) * t->iarg[1] + i];
}

cg_status cgi_fwd_index_select(cg_tensor *t) {
    cg_status s = check_indices(t);
    if (s) return s;
    const cg_tensor *x = t->src[0];
    const int64_t inner = t->iarg[1], outer = t->iarg[2], n = x->shape[t->iarg[0]], k = t->shape[t->iarg[0]];
    const cg_real *X = x->data;
    const int32_t *ix = t->aux;
    cg_real *Y = t->data;
#pragma omp parallel for schedule(static) if (outer * k * inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t oj = 0; oj < outer * k; oj++) {
        const int64_t o = oj / k, j = oj % k;
        cg_real *y = Y + oj * inner;
        if (t->op == CGI_OP_INDEX_SELECT) {
            memcpy(y, X + (o * n + ix[j]) * inner, (size_t)inner * sizeof *y);
            continue;
        }
        for (int64_t i = 0; i < inner; i++) y[i] = X[(o * n + pick(t, ix, o, j, i, k)) * inner + i];
    }
    return CG_OK;
}

/* Lanes of x's gradient: (o, i); within a lane the j loop runs in order. Threads take blocks of
 * consecutive i (a lane block), which keeps the rows of an index_select's gradient contiguous. */
void cgi_bwd_index_select(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const int64_t inner = t->iarg[1], outer = t->iarg[2], n = x->shape[t->iarg[0]], k = t->shape[t->iarg[0]];
    const int32_t *ix = t->aux;
    const cg_real *DY = t->grad;
    cg_real *DX = x->grad;
    enum { BLOCK = 256 };
    const int64_t blocks = (inner + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (outer * k * inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t ob = 0; ob < outer * blocks; ob++) {
        const int64_t o = ob / blocks, i0 = (ob % blocks) * BLOCK, i1 = i0 + BLOCK < inner ? i0 + BLOCK : inner;
        for (int64_t j = 0; j < k; j++) {
            const cg_real *dy = DY + (o * k + j) * inner;
            if (t->op == CGI_OP_INDEX_SELECT) {
                cg_real *dx = DX + (o * n + ix[j]) * inner;
                for (int64_t i = i0; i < i1; i++) dx[i] += dy[i];
            } else
                for (int64_t i = i0; i < i1; i++) DX[(o * n + pick(t, ix, o, j, i, k)) * inner + i] += dy[i];
        }
    }
}

cg_status cgi_fwd_gather(cg_tensor *t) { return cgi_fwd_index_select(t); }
void cgi_bwd_gather(cg_tensor *t) { cgi_bwd_index_select(t); }
