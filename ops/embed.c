/* SPDX-License-Identifier: MIT */
/* Embedding lookup. Forward checks every id against the vocabulary (ids are data, so this is
 * the one place the check can happen); backward scatter-adds rows, each thread owning a slice
 * of the columns so no two threads touch one element and the order never changes. */
#include <omp.h>

#include "graph/internal.h"
#include "ops/half.h"
#include "ops/ops.h"

cg_tensor *cg_embedding(cg_graph *g, cg_tensor *weight, cg_tensor *ids) {
    cg_tensor *in[2] = {weight, ids};
    if (!cgi_inputs_ok(g, "embedding", 2, in) || !cgi_expect_real("embedding", weight, "weight")) return NULL;
    if (weight->ndim != 2) {
        cgi_fail(CG_ERR_SHAPE, "[embedding] weight%s must be [V, D]", cgi_shp(weight));
        return NULL;
    }
    if (ids->dtype != CG_INT32 || ids->ndim >= CG_MAX_DIMS) {
        cgi_fail(CG_ERR_ARG, "[embedding] ids%s must be int32 with fewer than %d dims", cgi_shp(ids), CG_MAX_DIMS);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS];
    memcpy(s, ids->shape, (size_t)ids->ndim * sizeof *s);
    s[ids->ndim] = weight->shape[1];
    return cgi_node(g, CGI_OP_EMBEDDING, CG_REAL, ids->ndim + 1, s, 2, in);
}

cg_status cgi_fwd_embedding(cg_tensor *t) {
    cg_tensor *w = t->src[0], *ids = t->src[1];
    const int32_t *id = ids->data;
    const int64_t n = cgi_numel(ids->ndim, ids->shape), v = w->shape[0], d = w->shape[1];
    for (int64_t i = 0; i < n; i++) {
        int32_t k = id[cgi_elem_offset(ids, i)];
        if (k < 0 || k >= v)
            return cgi_fail(CG_ERR_RANGE, "[embedding] id %d at position %lld of ids%s is outside the vocabulary [0, %lld)",
                            k, (long long)i, cgi_shp(ids), (long long)v);
    }
    const cg_real *W = w->data;
    cg_real *Y = t->data;
    const int64_t r0 = w->stride[0], c0 = w->stride[1];
    int el;
    const uint16_t *H = cgi_half_operand(w, &el);
    if (H) { /* a frozen half-precision table read in place: the gathered rows widened, no float copy of it */
        CGI_PAR_FOR(n * d, for (int64_t i = 0; i < n; i++) {
            const uint16_t *row = H + id[cgi_elem_offset(ids, i)] * r0;
            cg_real *y = Y + i * d;
#ifndef CGRAD_DOUBLE
            if (c0 == 1 && el == CGI_EL_F16) cgi_widen_f16(y, row, d);
            else
#endif
                for (int64_t j = 0; j < d; j++) y[j] = (cg_real)cgi_half_at(row, j * c0, el);
        });
        return CG_OK;
    }
    CGI_PAR_FOR(n * d, for (int64_t i = 0; i < n; i++) {
        const cg_real *row = W + id[cgi_elem_offset(ids, i)] * r0;
        cg_real *y = Y + i * d;
        if (c0 == 1) memcpy(y, row, (size_t)d * sizeof *y);
        else for (int64_t j = 0; j < d; j++) y[j] = row[j * c0];
    });
    return CG_OK;
}

/* The op claims the table (ops.def): as its first writer (a parameter after cg_params_zero_grad),
 * each thread zeroes its own columns of the table inside the scatter's region, which saves the
 * graph's separate zeroing region (a wake of a passively waiting thread, graph/threads.c) and gives
 * the same bits: every element is zeroed before its column's adds, in the same order. */
void cgi_bwd_embedding(cg_tensor *t) {
    cg_tensor *w = t->src[0], *ids = t->src[1];
    if (!w->requires_grad) return;
    const bool assign = cgi_grad_begin(w);
    const int32_t *id = ids->data;
    const int64_t n = cgi_numel(ids->ndim, ids->shape), v = w->shape[0], d = w->shape[1];
    const int64_t r0 = w->stride[0], c0 = w->stride[1];
    const cg_real *DY = t->grad;
    cg_real *DW = w->grad;
    const int nt = cgi_nthreads();
    /* a second thread for the scatter's size, or for the zeroing's alone where cgi_zero would use one */
#pragma omp parallel num_threads(nt) if (n * d > CGI_PAR_MIN || (assign && v * d * (int64_t)sizeof(cg_real) > 3 * (1 << 18)))
    {
        int me = 0, all = 1;
#ifdef _OPENMP
        me = omp_get_thread_num();
        all = omp_get_num_threads();
#endif
        const int64_t lo = d * me / all, hi = d * (me + 1) / all;
        if (assign)
            for (int64_t r = 0; r < v; r++) {
                cg_real *row = DW + r * r0;
                if (c0 == 1) memset(row + lo, 0, (size_t)(hi - lo) * sizeof *row);
                else for (int64_t j = lo; j < hi; j++) row[j * c0] = 0;
            }
        for (int64_t i = 0; i < n; i++) {
            cg_real *row = DW + id[cgi_elem_offset(ids, i)] * r0;
            const cg_real *dy = DY + i * d;
            for (int64_t j = lo; j < hi; j++) row[j * c0] += dy[j];
        }
    }
}
