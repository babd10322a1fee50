/* SPDX-License-Identifier: MIT */
/* Strided iteration and the few shared kernels every op family leans on: strided copy,
 * axis reduction, and undoing broadcasting in backward (tinygrad's rule: once, here). */
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

void cgi_iter_init(cgi_iter *it, int ndim, const int64_t *shape, int nops, const int64_t *const *strides) {
    it->nops = nops;
    int n = 0;
    /* Drop size-1 dims, then merge neighbours that are contiguous in every operand. */
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (n > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (it->st[k][n - 1] != strides[k][d] * shape[d]) merge = false;
            if (merge) {
                it->shape[n - 1] *= shape[d];
                for (int k = 0; k < nops; k++) it->st[k][n - 1] = strides[k][d];
                continue;
            }
        }
        it->shape[n] = shape[d];
        for (int k = 0; k < nops; k++) it->st[k][n] = strides[k][d];
        n++;
    }
    if (n == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->st[k][0] = 0;
        n = 1;
    }
    it->ndim = n;
    it->inner = it->shape[n - 1];
    it->rows = 1;
    for (int d = 0; d < n - 1; d++) it->rows *= it->shape[d];
}

typedef struct {
    cg_real *dst;
    const cg_real *src;
    const cgi_iter *it;
    int64_t sd, ss, nch;
    cg_real a;
    bool accumulate;
} copy_args;

/* Chunks [c0, c1) of the copy: CGI_CHUNK elements of a row each. */
static void copy_chunks(int64_t c0, int64_t c1, void *ctx) {
    const copy_args *k = ctx;
    const cgi_iter *it = k->it;
    const int64_t sd = k->sd, ss = k->ss, nch = k->nch;
    const cg_real a = k->a;
    for (int64_t c = c0; c < c1; c++) {
        const int64_t r = c / nch, lo = (c % nch) * CGI_CHUNK;
        const int64_t n = lo + CGI_CHUNK < it->inner ? CGI_CHUNK : it->inner - lo;
        int64_t off[2];
        cgi_iter_row(it, r, off);
        cg_real *d = k->dst + off[0] + lo * sd;
        const cg_real *s = k->src + off[1] + lo * ss;
        if (sd == 1 && ss == 1) {
            if (k->accumulate) for (int64_t j = 0; j < n; j++) d[j] += a * s[j];
            else if (a == 1) memcpy(d, s, (size_t)n * sizeof *d);
            else for (int64_t j = 0; j < n; j++) d[j] = a * s[j];
        } else {
            if (k->accumulate) for (int64_t j = 0; j < n; j++) d[j * sd] += a * s[j * ss];
            else for (int64_t j = 0; j < n; j++) d[j * sd] = a * s[j * ss];
        }
    }
}

void cgi_copy(cg_real *dst, const int64_t *dst_stride, const cg_real *src, const int64_t *src_stride,
              int ndim, const int64_t *shape, double scale, bool accumulate) {
    const int64_t *st[2] = {dst_stride, src_stride};
    cgi_iter it;
    cgi_iter_init(&it, ndim, shape, 2, st);
    const int64_t nch = cgi_chunks(it.inner);
    copy_args k = {dst, src, &it, it.st[0][it.ndim - 1], it.st[1][it.ndim - 1], nch, (cg_real)scale, accumulate};
    cgi_par_ranges(it.rows * nch, it.rows * it.inner, copy_chunks, &k);
}

typedef struct {
    cg_real *dst;
    const cg_real *src;
    const cgi_iter *kit, *rit;
    double scale;
    bool accumulate;
} reduce_args;

enum { REDUCE_RUN = 64 }; /* outputs summed side by side (a vector of doubles per 8 of them) */

/* Outputs [o, o + n) of one kept row, contiguous in src and dst: each is summed over the reduced
 * axes in the same order, from the same double 0, as reduce_outputs sums it alone, so the bits are
 * the same; side by side the loop runs over the outputs, a vector at a time. A position embedding's
 * gradient summed over the batch (bert-small: [16, 128, 256] to [128, 256]) read 16 rows with a
 * stride of 128 KB for each output, a scalar add at a time: 1.2 ms of a 300 ms step. */
CGI_CLONES static void reduce_run(const reduce_args *a, int64_t o, int64_t n) {
    const cgi_iter *kit = a->kit, *rit = a->rit;
    const int64_t rinner_st = rit->st[0][rit->ndim - 1];
    int64_t koff[2];
    cgi_iter_row(kit, o / kit->inner, koff);
    const int64_t j0 = o % kit->inner;
    const cg_real *s = a->src + koff[1] + j0;
    double acc[REDUCE_RUN] = {0};
    for (int64_t r = 0; r < rit->rows; r++) {
        int64_t roff;
        cgi_iter_row(rit, r, &roff);
        for (int64_t q = 0; q < rit->inner; q++) {
            const cg_real *p = s + roff + q * rinner_st;
            for (int64_t j = 0; j < n; j++) acc[j] += p[j];
        }
    }
    cg_real *d = a->dst + koff[0] + j0;
    if (a->accumulate)
        for (int64_t j = 0; j < n; j++) d[j] += (cg_real)(a->scale * acc[j]);
    else
        for (int64_t j = 0; j < n; j++) d[j] = (cg_real)(a->scale * acc[j]);
}

/* Output elements [lo, hi) of cgi_reduce, each summed alone in the fixed order. */
static void reduce_outputs(int64_t lo, int64_t hi, void *ctx) {
    const reduce_args *a = ctx;
    const cgi_iter *kit = a->kit, *rit = a->rit;
    const int64_t rinner_st = rit->st[0][rit->ndim - 1];
    if (kit->st[0][kit->ndim - 1] == 1 && kit->st[1][kit->ndim - 1] == 1 && kit->inner > 1) {
        for (int64_t o = lo; o < hi;) { /* runs that end at the range's end or the kept row's */
            const int64_t row_end = (o / kit->inner + 1) * kit->inner, end = row_end < hi ? row_end : hi;
            const int64_t n = end - o < REDUCE_RUN ? end - o : REDUCE_RUN;
            reduce_run(a, o, n);
            o += n;
        }
        return;
    }
    for (int64_t o = lo; o < hi; o++) {
        int64_t koff[2];
        cgi_iter_row(kit, o / kit->inner, koff);
        int64_t j = o % kit->inner;
        const cg_real *s = a->src + koff[1] + j * kit->st[1][kit->ndim - 1];
        double acc = 0;
        for (int64_t r = 0; r < rit->rows; r++) {
            int64_t roff;
            cgi_iter_row(rit, r, &roff);
            const cg_real *p = s + roff;
            for (int64_t q = 0; q < rit->inner; q++) acc += p[q * rinner_st];
        }
        cg_real *d = a->dst + koff[0] + j * kit->st[0][kit->ndim - 1];
        if (a->accumulate) *d += (cg_real)(a->scale * acc);
        else *d = (cg_real)(a->scale * acc);
    }
}

void cgi_reduce(cg_real *dst, const int64_t *dst_stride, const cg_real *src, const int64_t *src_stride,
                int ndim, const int64_t *shape, unsigned reduce_mask, double scale, bool accumulate) {
    /* Kept axes index the output elements (shared as ranges, inside a thread team too: a position
     * embedding's gradient, summed over the batch, ran on thread 0 alone there); reduced axes are
     * summed in a fixed order per element, so the result does not depend on the thread count. */
    int64_t kshape[CG_MAX_DIMS] = {0}, kst_src[CG_MAX_DIMS] = {0}, kst_dst[CG_MAX_DIMS] = {0}; /* zero: no kept axis */
    int64_t rshape[CG_MAX_DIMS], rst[CG_MAX_DIMS];
    int nk = 0, nr = 0;
    for (int d = 0; d < ndim; d++) {
        if (reduce_mask & (1u << d)) {
            rshape[nr] = shape[d];
            rst[nr++] = src_stride[d];
        } else {
            kshape[nk] = shape[d];
            kst_src[nk] = src_stride[d];
            kst_dst[nk++] = dst_stride[d];
        }
    }
    const int64_t *kst[2] = {kst_dst, kst_src};
    cgi_iter kit;
    cgi_iter_init(&kit, nk, kshape, 2, kst);
    const int64_t *rsts[1] = {rst};
    cgi_iter rit;
    cgi_iter_init(&rit, nr, rshape, 1, rsts);
    const int64_t nout = kit.rows * kit.inner, nred = rit.rows * rit.inner;
    const reduce_args a = {dst, src, &kit, &rit, scale, accumulate};
    cgi_par_ranges(nout, nout * nred, reduce_outputs, (void *)&a);
}

static void unbroadcast(cg_tensor *t, const cg_real *g_out, int ndim, const int64_t *out_shape, double scale,
                        bool accumulate) {
    int64_t cs[CG_MAX_DIMS], dst[CG_MAX_DIMS];
    cgi_contig_strides(ndim, out_shape, cs);
    unsigned mask = 0;
    for (int d = 0; d < ndim; d++) {
        int it = t->ndim - ndim + d;
        if (it < 0 || (t->shape[it] == 1 && out_shape[d] != 1) || (t->shape[it] > 1 && t->stride[it] == 0)) {
            mask |= 1u << d;
            dst[d] = 0;
        } else {
            dst[d] = t->stride[it];
        }
    }
    if (mask == 0) cgi_copy(t->grad, dst, g_out, cs, ndim, out_shape, scale, accumulate);
    else cgi_reduce(t->grad, dst, g_out, cs, ndim, out_shape, mask, scale, accumulate);
}

void cgi_unbroadcast_add(cg_tensor *t, const cg_real *g_out, int ndim, const int64_t *out_shape, double scale) {
    unbroadcast(t, g_out, ndim, out_shape, scale, true);
}

/* A residual add's gradient is the output's, copied: as the input's first writer it is copied
 * (or summed) over the buffer, not added into a zeroed one, a pass and a read fewer. */
void cgi_unbroadcast_claim(cg_tensor *t, const cg_real *g_out, int ndim, const int64_t *out_shape, double scale) {
    unbroadcast(t, g_out, ndim, out_shape, scale, !cgi_grad_begin(t));
}

#define COLSUM_BLOCKS 32

size_t cgi_colsum_scratch(int64_t rows, int64_t cols) {
    (void)rows;
    return (size_t)COLSUM_BLOCKS * (size_t)cols;
}

/* Row block b of COLSUM_BLOCKS: its rows' column sums into scratch row b. */
static inline void colsum_block(int b, int64_t rows, int64_t cols, cg_real *scratch,
                                const cg_real *(*make)(void *ctx, int64_t r), void *ctx) {
    const int64_t per = (rows + COLSUM_BLOCKS - 1) / COLSUM_BLOCKS;
    cg_real *acc = scratch + (int64_t)b * cols;
    memset(acc, 0, (size_t)cols * sizeof *acc);
    for (int64_t r = b * per; r < rows && r < (b + 1) * per; r++) {
        const cg_real *row = make(ctx, r);
        for (int64_t c = 0; c < cols; c++) acc[c] += row[c];
    }
}

typedef struct {
    cg_real *dst, *scratch;
    int64_t rows, cols;
    const cg_real *(*make)(void *ctx, int64_t r);
    void *ctx;
} colsum_args;

/* dst[c0, c1) += the blocks' sums, block by block in order. */
static void colsum_finish_cols(int64_t c0, int64_t c1, void *ctx) {
    const colsum_args *k = ctx;
    for (int64_t c = c0; c < c1; c++) {
        cg_real s = 0;
        for (int b = 0; b < COLSUM_BLOCKS; b++) s += k->scratch[(int64_t)b * k->cols + c];
        k->dst[c] += s;
    }
}

static void colsum_finish(cg_real *dst, int64_t cols, const cg_real *scratch) {
    colsum_args k = {dst, (cg_real *)scratch, 0, cols, NULL, NULL};
    /* cols > 4096 shares the columns: the work of COLSUM_BLOCKS elements a column */
    cgi_par_ranges(cols, cols > 4096 ? COLSUM_BLOCKS * cols : 0, colsum_finish_cols, &k);
}

static void colsum_blocks(int64_t b0, int64_t b1, void *ctx) {
    const colsum_args *k = ctx;
    for (int64_t b = b0; b < b1; b++) colsum_block((int)b, k->rows, k->cols, k->scratch, k->make, k->ctx);
}

CGI_CLONES void cgi_colsum_add_made(cg_real *dst, int64_t rows, int64_t cols, cg_real *scratch,
                                    const cg_real *(*make)(void *ctx, int64_t r), void *ctx) {
    colsum_args k = {dst, scratch, rows, cols, make, ctx};
    cgi_par_ranges(COLSUM_BLOCKS, rows * cols, colsum_blocks, &k);
    colsum_finish(dst, cols, scratch);
}

typedef struct {
    const cg_real *m;
    int64_t ld;
} rows_of;

static const cg_real *row_at(void *ctx, int64_t r) {
    const rows_of *o = ctx;
    return o->m + r * o->ld;
}

void cgi_colsum_add(cg_real *dst, const cg_real *m, int64_t rows, int64_t cols, int64_t ld, cg_real *scratch) {
    rows_of o = {m, ld};
    cgi_colsum_add_made(dst, rows, cols, scratch, row_at, &o);
}

int cgi_colsum_tasks(void) { return COLSUM_BLOCKS; }

void cgi_colsum_task(void *ctx, int i) {
    cgi_colsum_ctx *c = ctx;
    rows_of o = {c->m, c->ld};
    colsum_block(i, c->rows, c->cols, c->scratch, row_at, &o);
}

void cgi_colsum_tasks_finish(const cgi_colsum_ctx *c) { colsum_finish(c->dst, c->cols, c->scratch); }
