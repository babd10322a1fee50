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

/* Inside a thread team the gathers and the scatter are shared as ranges (cgi_par_ranges): as
 * OpenMP loops they ran on thread 0 alone there (a team's run is one thread to OpenMP). */
typedef struct {
    const cg_real *W;
    cg_real *Y;
    const cg_tensor *ids;
    int64_t d, r0, c0;
} gather_args;

/* Rows [lo, hi) of the output: the ids' rows of the table. */
static void gather_rows(int64_t lo, int64_t hi, void *ctx) {
    const gather_args *a = ctx;
    const int32_t *id = a->ids->data;
    for (int64_t i = lo; i < hi; i++) {
        const cg_real *row = a->W + id[cgi_elem_offset(a->ids, i)] * a->r0;
        cg_real *y = a->Y + i * a->d;
        if (a->c0 == 1) memcpy(y, row, (size_t)a->d * sizeof *y);
        else for (int64_t j = 0; j < a->d; j++) y[j] = row[j * a->c0];
    }
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
    const gather_args a = {W, Y, ids, d, r0, c0};
    cgi_par_ranges(n, n * d, gather_rows, (void *)&a);
    return CG_OK;
}

typedef struct {
    cg_real *dw;
    const cg_real *dy;
    const cg_tensor *ids;
    int64_t n, v, d, r0, c0;
    bool assign;
} scatter_args;

/* Columns [lo, hi) of the table's gradient: zeroed first when assigned, then every id's row added
 * in order, so each element sees the same adds in the same order however the columns are cut. */
static void scatter_cols(int64_t lo, int64_t hi, void *ctx) {
    const scatter_args *a = ctx;
    const int32_t *id = a->ids->data;
    const int64_t r0 = a->r0, c0 = a->c0;
    if (a->assign)
        for (int64_t r = 0; r < a->v; r++) {
            cg_real *row = a->dw + r * r0;
            if (c0 == 1) memset(row + lo, 0, (size_t)(hi - lo) * sizeof *row);
            else for (int64_t j = lo; j < hi; j++) row[j * c0] = 0;
        }
    for (int64_t i = 0; i < a->n; i++) {
        cg_real *row = a->dw + id[cgi_elem_offset(a->ids, i)] * r0;
        const cg_real *dy = a->dy + i * a->d;
        for (int64_t j = lo; j < hi; j++) row[j * c0] += dy[j];
    }
}

/* The op claims the table (ops.def): as its first writer (a parameter after cg_params_zero_grad),
 * each thread zeroes its own columns of the table inside the scatter's region, which saves the
 * graph's separate zeroing region (a wake of a passively waiting thread, graph/threads.c) and gives
 * the same bits: every element is zeroed before its column's adds, in the same order. */
void cgi_bwd_embedding(cg_tensor *t) {
    cg_tensor *w = t->src[0], *ids = t->src[1];
    if (!w->requires_grad) return;
    const bool assign = cgi_grad_begin(w);
    const int64_t n = cgi_numel(ids->ndim, ids->shape), v = w->shape[0], d = w->shape[1];
    const int64_t r0 = w->stride[0], c0 = w->stride[1];
    const scatter_args a = {w->grad, t->grad, ids, n, v, d, r0, c0, assign};
    /* by columns: no two threads touch one element. Work: the scatter's, or the zeroing's alone
     * where cgi_zero would share it (from 4 of its 256 kB parts) */
    const int64_t zero = assign && v * d * (int64_t)sizeof(cg_real) > 3 * (1 << 18) ? CGI_PAR_MIN + 1 : 0,
                  work = n * d > zero ? n * d : zero;
    if (cgi_team_sharing()) { /* a team's ranges */
        cgi_par_ranges(d, work, scatter_cols, (void *)&a);
        return;
    }
    /* else a region of its own (test_regions tells it from cgi_zero's by its body) */
    const int nt = cgi_nthreads();
#pragma omp parallel num_threads(nt) if (work > CGI_PAR_MIN)
    {
        const int64_t me = omp_get_thread_num(), all = omp_get_num_threads();
        scatter_cols(d * me / all, d * (me + 1) / all, (void *)&a);
    }
}
