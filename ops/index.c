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
static inline bool per_slice(const cg_tensor *t) { return t->op == CGI_OP_INDEX_SELECT || t->op == CGI_OP_INDEX_ADD; }
static inline int64_t pick(const cg_tensor *t, const int32_t *ix, int64_t o, int64_t j, int64_t i, int64_t k) {
    return per_slice(t) ? ix[j] : ix[(o * k + j) * t->iarg[1] + i];
}

/* Y[o, j, i] (+)= X[o, pick(o, j, i), i]: Y [outer, k, inner], X [outer, n, inner]; each Y row is
 * one thread's. */
static void gather_lanes(const cg_tensor *t, const cg_real *X, cg_real *Y, int64_t n, int64_t k, bool accumulate) {
    const int64_t inner = t->iarg[1], outer = t->iarg[2];
    const int32_t *ix = t->aux;
#pragma omp parallel for schedule(static) if (outer * k * inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t oj = 0; oj < outer * k; oj++) {
        const int64_t o = oj / k, j = oj % k;
        cg_real *y = Y + oj * inner;
        if (per_slice(t) && !accumulate) {
            memcpy(y, X + (o * n + ix[j]) * inner, (size_t)inner * sizeof *y);
            continue;
        }
        for (int64_t i = 0; i < inner; i++) {
            const cg_real v = X[(o * n + pick(t, ix, o, j, i, k)) * inner + i];
            if (accumulate) y[i] += v;
            else y[i] = v;
        }
    }
}

cg_status cgi_fwd_index_select(cg_tensor *t) {
    cg_status s = check_indices(t);
    if (s) return s;
    gather_lanes(t, t->src[0]->data, t->data, t->src[0]->shape[t->iarg[0]], t->shape[t->iarg[0]], false);
    return CG_OK;
}

/* DX[o, pick(o, j, i), i] += DY[o, j, i]. Lanes of DX are (o, i); within a lane the j loop runs in
 * order, so repeated indices add up in one order. Threads take blocks of consecutive i (a lane
 * block), which keeps the rows of an index_select's gradient contiguous. */
static void scatter_lanes(const cg_tensor *t, const cg_real *DY, cg_real *DX, int64_t n, int64_t k) {
    const int64_t inner = t->iarg[1], outer = t->iarg[2];
    const int32_t *ix = t->aux;
    enum { BLOCK = 256 };
    const int64_t blocks = (inner + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (outer * k * inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t ob = 0; ob < outer * blocks; ob++) {
        const int64_t o = ob / blocks, i0 = (ob % blocks) * BLOCK, i1 = i0 + BLOCK < inner ? i0 + BLOCK : inner;
        for (int64_t j = 0; j < k; j++) {
            const cg_real *dy = DY + (o * k + j) * inner;
            if (per_slice(t)) {
                cg_real *dx = DX + (o * n + ix[j]) * inner;
                for (int64_t i = i0; i < i1; i++) dx[i] += dy[i];
            } else
                for (int64_t i = i0; i < i1; i++) DX[(o * n + pick(t, ix, o, j, i, k)) * inner + i] += dy[i];
        }
    }
}

void cgi_bwd_index_select(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) scatter_lanes(t, t->grad, x->grad, x->shape[t->iarg[0]], t->shape[t->iarg[0]]);
}

cg_status cgi_fwd_gather(cg_tensor *t) { return cgi_fwd_index_select(t); }
void cgi_bwd_gather(cg_tensor *t) { cgi_bwd_index_select(t); }

/* ---- scatter_add and index_add, the adjoints of gather and index_select: out = x, then src's
 * slices (index_add) or elements (scatter_add) added at the indexed positions along axis. Forward
 * is the scatter above (each (outer, inner) lane of out one thread's, repeated indices added in
 * order), backward is x's gradient passed through and src's gathered. src[] = {x, index, src}. ---- */

static cg_tensor *scatter_node(cg_graph *g, int op, cg_tensor *x, int axis, cg_tensor *idx, cg_tensor *src) {
    const char *nm = cgi_ops[op].name;
    cg_tensor *in[3] = {x, idx, src};
    if (!cgi_inputs_ok(g, nm, 3, in) || !cgi_expect_real(nm, x, "x") || !cgi_expect_real(nm, src, "src")) return NULL;
    const int a = cgi_axis(nm, x, axis);
    if (a < 0) return NULL;
    bool ok = idx->dtype == CG_INT32 && src->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == a || src->shape[d] == x->shape[d];
    if (op == CGI_OP_INDEX_ADD) ok = ok && idx->ndim == 1 && idx->shape[0] == src->shape[a];
    else {
        ok = ok && idx->ndim == src->ndim;
        for (int d = 0; ok && d < src->ndim; d++) ok = idx->shape[d] == src->shape[d];
    }
    if (!ok) {
        cgi_fail(CG_ERR_SHAPE, op == CGI_OP_INDEX_ADD
                                   ? "[%s] x%s axis %d, index%s, src%s: need int32 index [K] and src shaped as x with K along the axis"
                                   : "[%s] x%s axis %d, index%s, src%s: need an int32 index shaped as src, and src shaped as x except along the axis",
                 nm, cgi_shp(x), axis, cgi_shp(idx), cgi_shp(src));
        return NULL;
    }
    in[2] = cg_contiguous(g, src);
    if (!in[2]) return NULL;
    int64_t inner = 1, outer = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d < a) outer *= x->shape[d];
        if (d > a) inner *= x->shape[d];
    }
    cg_tensor *t = cgi_node(g, op, CG_REAL, x->ndim, x->shape, 3, in);
    if (!t) return NULL;
    t->iarg[0] = a, t->iarg[1] = inner, t->iarg[2] = outer;
    t->aux_bytes = (size_t)cgi_numel(idx->ndim, idx->shape) * sizeof(int32_t);
    return t;
}

cg_tensor *cg_scatter_add(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index, cg_tensor *src) {
    return scatter_node(g, CGI_OP_SCATTER_ADD, x, axis, index, src);
}
cg_tensor *cg_index_add(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index, cg_tensor *src) {
    return scatter_node(g, CGI_OP_INDEX_ADD, x, axis, index, src);
}

cg_status cgi_fwd_scatter_add(cg_tensor *t) {
    cg_status s = check_indices(t);
    if (s) return s;
    const cg_tensor *x = t->src[0];
    cgi_copy(t->data, t->stride, x->data, x->stride, t->ndim, t->shape, 1.0, false);
    const int a = (int)t->iarg[0];
    scatter_lanes(t, t->src[2]->data, t->data, t->shape[a], t->src[2]->shape[a]);
    return CG_OK;
}

void cgi_bwd_scatter_add(cg_tensor *t) {
    cg_tensor *x = t->src[0], *src = t->src[2];
    if (x->requires_grad) cgi_copy(x->grad, x->stride, t->grad, t->stride, t->ndim, t->shape, 1.0, true);
    const int a = (int)t->iarg[0];
    if (src->requires_grad) gather_lanes(t, t->grad, src->grad, t->shape[a], src->shape[a], true);
}

cg_status cgi_fwd_index_add(cg_tensor *t) { return cgi_fwd_scatter_add(t); }
void cgi_bwd_index_add(cg_tensor *t) { cgi_bwd_scatter_add(t); }
