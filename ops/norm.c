/* SPDX-License-Identifier: MIT */
/* Fused layer norm and RMS norm over the last axis: one pass for the statistics, one for the
 * output; backward in one pass per row plus a blocked, thread-count-independent sum for gain and
 * bias. RMS norm is layer norm without centring (mean taken as 0, no bias), so both share the
 * kernels: y = (x - m) * rstd * gain + bias, with m = 0 for RMS norm. add_layernorm is layer norm
 * of a residual sum x + r (post-LN blocks): the same kernels, the sum formed row by row. */
#include <math.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/ops.h"

#define LN_BLOCKS 32

/* Sources: x, then (add_layernorm) the residual r, then gain and bias when given (iarg[0] / iarg[1] =
 * their index or 0; iarg[2] = 1 with a residual). aux holds mean[rows], rstd[rows], then LN_BLOCKS
 * partial rows for each of d(gain) and d(bias), then (with a residual) the sum x + r, which backward
 * reads instead of x and r. */
static cg_tensor *norm(cg_graph *g, int op, cg_tensor *x, cg_tensor *res, cg_tensor *gain, cg_tensor *bias,
                       double eps) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || (op == CGI_OP_ADD_LAYERNORM && !cgi_inputs_ok(g, nm, 1, &res)) ||
        (gain && !cgi_inputs_ok(g, nm, 1, &gain)) || (bias && !cgi_inputs_ok(g, nm, 1, &bias)))
        return NULL;
    if (!cgi_expect_real(nm, x, "x") || (res && !cgi_expect_real(nm, res, "r"))) return NULL;
    if (x->ndim < 1) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s needs at least one axis", nm, cgi_shp(x));
        return NULL;
    }
    if (res && (res->ndim != x->ndim || memcmp(res->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s + r%s: the residual must have x's shape (no broadcasting)", nm, cgi_shp(x),
                 cgi_shp(res));
        return NULL;
    }
    int64_t d = x->shape[x->ndim - 1];
    cg_tensor *pv[2] = {gain, bias};
    const char *role[2] = {"gain", "bias"};
    for (int i = 0; i < 2; i++)
        if (pv[i] && (pv[i]->ndim != 1 || pv[i]->shape[0] != d || pv[i]->dtype != CG_REAL)) {
            cgi_fail(CG_ERR_SHAPE, "[%s] %s%s must be real [%lld] for x%s", nm, role[i], cgi_shp(pv[i]),
                     (long long)d, cgi_shp(x));
            return NULL;
        }
    if (!(eps >= 0)) {
        cgi_fail(CG_ERR_ARG, "[%s] eps = %g must be >= 0", nm, eps);
        return NULL;
    }
    x = cg_contiguous(g, x);
    if (res) res = cg_contiguous(g, res);
    if (!x || (op == CGI_OP_ADD_LAYERNORM && !res)) return NULL;
    cg_tensor *src[4] = {x, NULL, NULL, NULL};
    int n = 1, gi = 0, bi = 0;
    if (res) src[n++] = res;
    if (gain) gi = n, src[n++] = gain;
    if (bias) bi = n, src[n++] = bias;
    cg_tensor *t = cgi_node(g, op, CG_REAL, x->ndim, x->shape, n, src);
    if (!t) return NULL;
    t->iarg[0] = gi;
    t->iarg[1] = bi;
    t->iarg[2] = res != NULL;
    t->farg[0] = eps;
    int64_t rows = d ? cgi_numel(x->ndim, x->shape) / d : 0;
    t->aux_bytes = (size_t)(2 * rows + 2 * LN_BLOCKS * d + (res ? rows * d : 0)) * sizeof(cg_real);
    return t;
}

cg_tensor *cg_layernorm(cg_graph *g, cg_tensor *x, cg_tensor *gain, cg_tensor *bias, double eps) {
    return norm(g, CGI_OP_LAYERNORM, x, NULL, gain, bias, eps);
}
cg_tensor *cg_rmsnorm(cg_graph *g, cg_tensor *x, cg_tensor *gain, double eps) {
    return norm(g, CGI_OP_RMSNORM, x, NULL, gain, NULL, eps);
}

/* A bf16 graph gets add -> layernorm: there a layer norm's output read only by linears is written
 * in bf16 or shadowed in bf16 (ops/bf16.c), which this op's is not. */
cg_tensor *cg_add_layernorm(cg_graph *g, cg_tensor *x, cg_tensor *r, cg_tensor *gain, cg_tensor *bias, double eps) {
    if (g && cg_graph_precision(g) == CG_BF16) return cg_layernorm(g, cg_add(g, x, r), gain, bias, eps);
    return norm(g, CGI_OP_ADD_LAYERNORM, x, r, gain, bias, eps);
}

/* The rows the statistics read: x's, or the sum x + r formed into aux (after the partial rows). */
static cg_real *sum_rows(const cg_tensor *t, int64_t rows, int64_t d) {
    return t->iarg[2] ? (cg_real *)t->aux + 2 * rows + 2 * LN_BLOCKS * d : NULL;
}

/* What a norm's rows read and write, for norm_fwd_rows and norm_bwd_blocks. */
typedef struct {
    const cg_tensor *t;
    int64_t d, rows, gs;
    const cg_real *gain, *bias, *X, *R;
    cg_real *Y, *mean, *rstd, *S;
    int64_t bs;
    double eps;
    bool rms;
    bool remake; /* backward's remake: mean and rstd are forward's, read, not summed again */
} norm_fwd_args;

CGI_CLONES static void norm_fwd_rows(int64_t lo, int64_t hi, void *ctx) {
    const norm_fwd_args *a = ctx;
    const cg_tensor *t = a->t;
    const int64_t d = a->d, gs = a->gs, bs = a->bs;
    const cg_real *gain = a->gain, *bias = a->bias;
    const bool rms = a->rms;
    for (int64_t r = lo; r < hi; r++) {
        const cg_real *x = a->X + r * d;
        cg_real *y = a->Y + r * d;
        if (a->S) { /* the residual sum, as cg_add would form it, then read from cache */
            cg_real *s = a->S + r * d;
            const cg_real *rr = a->R + r * d;
            for (int64_t j = 0; j < d; j++) s[j] = x[j] + rr[j];
            x = s;
        }
        cg_real m, q;
        if (a->remake)
            m = a->mean[r], q = a->rstd[r];
        else {
            m = rms ? 0 : (cg_real)(cgi_row_sum(x, d) / (double)d);
            q = (cg_real)(1.0 / sqrt(cgi_row_sqdev(x, d, m) / (double)d + a->eps));
            a->mean[r] = m;
            a->rstd[r] = q;
        }
        if (t->lp_value) { /* bf16 graphs, read only by linears: stored in bf16 (ops/bf16.c) */
            enum { BLK = 64 };
            cgi_bf16 *yb = (cgi_bf16 *)t->data + r * d;
            for (int64_t j0 = 0; j0 < d; j0 += BLK) {
                const int64_t len = d - j0 < BLK ? d - j0 : BLK;
                cg_real h[BLK];
                for (int64_t j = 0; j < len; j++)
                    h[j] = (x[j0 + j] - m) * q * (gain ? gain[(j0 + j) * gs] : 1) + (bias ? bias[(j0 + j) * bs] : 0);
                cgi_lp_round(yb + j0, h, len, 1);
            }
        } else if (gain && bias && gs == 1 && bs == 1) /* the usual case, as one vector loop */
            for (int64_t j = 0; j < d; j++) y[j] = (x[j] - m) * q * gain[j] + bias[j];
        else if (rms && gain && gs == 1)
            for (int64_t j = 0; j < d; j++) y[j] = x[j] * q * gain[j];
        else
            for (int64_t j = 0; j < d; j++) {
                cg_real h = (x[j] - m) * q;
                y[j] = h * (gain ? gain[j * gs] : 1) + (bias ? bias[j * bs] : 0);
            }
    }
}

static cg_status norm_fwd(cg_tensor *t) {
    const int64_t d = t->shape[t->ndim - 1], rows = d ? cgi_numel(t->ndim, t->shape) / d : 0;
    const cg_tensor *gt = t->iarg[0] ? t->src[t->iarg[0]] : NULL, *bt = t->iarg[1] ? t->src[t->iarg[1]] : NULL;
    norm_fwd_args a = {.t = t, .d = d, .rows = rows, .gain = gt ? gt->data : NULL, .bias = bt ? bt->data : NULL,
                       .gs = gt ? gt->stride[0] : 0, .bs = bt ? bt->stride[0] : 0, .X = t->src[0]->data,
                       .R = t->iarg[2] ? t->src[1]->data : NULL, .Y = t->data, .mean = t->aux,
                       .eps = t->farg[0], .rms = t->op == CGI_OP_RMSNORM};
    a.rstd = a.mean + rows;
    a.S = sum_rows(t, rows, d);
    cgi_par_ranges(rows, rows * d, norm_fwd_rows, &a);
    return CG_OK;
}

/* dst[j] (+)= q * (dh - a1 - h * a2) over a row, dh = dy * gain, h = (x - m) * q: layer norm's input
 * gradient (for add_layernorm, both summands'). */
static inline void norm_dx_row(cg_real *dst, const cg_real *xr, const cg_real *dy, const cg_real *gain, int64_t gs,
                               int64_t d, cg_real m, cg_real q, cg_real a1, cg_real a2, bool assign) {
    if (gain && gs == 1 && assign)
        for (int64_t j = 0; j < d; j++) dst[j] = q * (dy[j] * gain[j] - a1 - (xr[j] - m) * q * a2);
    else if (gain && gs == 1)
        for (int64_t j = 0; j < d; j++) dst[j] += q * (dy[j] * gain[j] - a1 - (xr[j] - m) * q * a2);
    else
        for (int64_t j = 0; j < d; j++) {
            cg_real h = (xr[j] - m) * q, dh = dy[j] * (gain ? gain[j * gs] : 1);
            dst[j] = (assign ? 0 : dst[j]) + q * (dh - a1 - h * a2);
        }
}

typedef struct {
    const cg_tensor *t, *x, *res;
    int64_t d, rows, gs, per;
    const cg_real *X, *DY, *mean, *rstd, *gain;
    cg_real *part_g, *part_b;
    bool dr, dg, db, dx_needed, ax, ar;
} norm_bwd_args;

/* Blocks [lo, hi) of LN_BLOCKS: each block's rows' input gradients, and its partial sums for gain
 * and bias, summed in block order afterwards (the same bits on any thread count). */
CGI_CLONES static void norm_bwd_blocks(int64_t lo, int64_t hi, void *ctx) {
    const norm_bwd_args *a = ctx;
    const cg_tensor *t = a->t, *x = a->x, *res = a->res;
    const int64_t d = a->d, rows = a->rows, gs = a->gs, per = a->per;
    const cg_real *gain = a->gain;
    const bool dg = a->dg, db = a->db;
    for (int64_t b = lo; b < hi; b++) {
        cg_real *restrict pg = a->part_g + b * d, *restrict pb = a->part_b + b * d;
        if (a->dg) memset(pg, 0, (size_t)d * sizeof *pg);
        if (a->db) memset(pb, 0, (size_t)d * sizeof *pb);
        for (int64_t r = b * per; r < rows && r < (b + 1) * per; r++) {
            const cg_real *xr = a->X + r * d, *dy = a->DY + r * d, m = a->mean[r], q = a->rstd[r];
            if (a->dx_needed) {
                /* dh = dy * gain; dx = q * (dh - mean(dh) - h * mean(dh * h)), sums in lanes */
                /* gain's and bias's row terms ride along (pg, pb: the same expressions, rows added
                 * in the same order), one pass over the row fewer for each */
                cg_real c1[CGI_LANES] = {0}, c2[CGI_LANES] = {0};
                int64_t j = 0;
                if (!gain || gs == 1)
                    for (; j + CGI_LANES <= d; j += CGI_LANES)
                        for (int l = 0; l < CGI_LANES; l++) {
                            const cg_real h = (xr[j + l] - m) * q, dh = dy[j + l] * (gain ? gain[j + l] : 1);
                            c1[l] += dh;
                            c2[l] += dh * h;
                            if (dg) pg[j + l] += dy[j + l] * (xr[j + l] - m) * q;
                            if (db) pb[j + l] += dy[j + l];
                        }
                double s1 = 0, s2 = 0;
                for (; j < d; j++) {
                    const cg_real h = (xr[j] - m) * q, dh = dy[j] * (gain ? gain[j * gs] : 1);
                    s1 += dh;
                    s2 += (double)dh * h;
                    if (dg) pg[j] += dy[j] * (xr[j] - m) * q;
                    if (db) pb[j] += dy[j];
                }
                for (int l = 0; l < CGI_LANES; l++) s1 += c1[l], s2 += c2[l];
                /* RMS norm has no centring, so no mean(dh) term */
                const cg_real a1 = t->op == CGI_OP_RMSNORM ? 0 : (cg_real)(s1 / (double)d), a2 = (cg_real)(s2 / (double)d);
                if (x->requires_grad) norm_dx_row(x->grad + r * d, xr, dy, gain, gs, d, m, q, a1, a2, a->ax);
                if (a->dr) norm_dx_row(res->grad + r * d, xr, dy, gain, gs, d, m, q, a1, a2, a->ar);
            }
            else {
                if (a->dg) for (int64_t j = 0; j < d; j++) pg[j] += dy[j] * (xr[j] - m) * q;
                if (a->db) for (int64_t j = 0; j < d; j++) pb[j] += dy[j];
            }
        }
    }
}

/* grad[j] += the LN_BLOCKS partial rows' column j, summed in block order from 0, as a column at a
 * time sums it (the same bits), but SUM_RUN columns side by side, a vector at a time: a column at a
 * time, the walk down the partial rows took encdec-base's (d = 512) 25 us of each 250 us backward, on
 * thread 0 alone after the shared blocks (CGRAD_PROFILE=2 on two threads). */
enum { SUM_RUN = 64 };
CGI_CLONES static void sum_parts(cg_real *grad, int64_t stride, const cg_real *part, int64_t d) {
    for (int64_t j0 = 0; j0 < d; j0 += SUM_RUN) {
        const int64_t n = d - j0 < SUM_RUN ? d - j0 : SUM_RUN;
        cg_real s[SUM_RUN] = {0};
        for (int b = 0; b < LN_BLOCKS; b++)
            for (int64_t j = 0; j < n; j++) s[j] += part[b * d + j0 + j];
        for (int64_t j = 0; j < n; j++) grad[(j0 + j) * stride] += s[j];
    }
}

static void norm_bwd(cg_tensor *t) {
    cg_tensor *x = t->src[0], *gt = t->iarg[0] ? t->src[t->iarg[0]] : NULL, *bt = t->iarg[1] ? t->src[t->iarg[1]] : NULL;
    cg_tensor *res = t->iarg[2] ? t->src[1] : NULL;
    const int64_t d = t->shape[t->ndim - 1], rows = d ? cgi_numel(t->ndim, t->shape) / d : 0;
    const cg_real *S = sum_rows(t, rows, d);
    norm_bwd_args a = {.t = t, .x = x, .res = res, .d = d, .rows = rows, .gs = gt ? gt->stride[0] : 0,
                       .per = (rows + LN_BLOCKS - 1) / LN_BLOCKS, .X = S ? S : x->data, .DY = t->grad,
                       .mean = t->aux, .gain = gt ? gt->data : NULL};
    a.rstd = a.mean + rows;
    a.part_g = (cg_real *)t->aux + 2 * rows, a.part_b = a.part_g + LN_BLOCKS * d;
    a.dr = res && res->requires_grad, a.dg = gt && gt->requires_grad, a.db = bt && bt->requires_grad;
    a.dx_needed = x->requires_grad || a.dr;
    /* x's and r's gradients sharing storage at an offset: row r of one overlaps other rows of the
     * other, so the rows run on one thread (the same blocks: the same bits) */
    const bool serial = a.dr && x->requires_grad && cgi_grads_alias(x, res);
    /* The op claims every input (ops.def): a summand whose gradient it writes first gets its rows
     * assigned, not added into a buffer the sweep zeroed first (a post-LN block's add_layernorm is
     * both summands' first writer). Summands sharing gradient storage add, as before. */
    if (serial) cgi_grad_prepare(x), cgi_grad_prepare(res);
    else {
        if (x->requires_grad) a.ax = cgi_grad_begin(x);
        if (a.dr) a.ar = cgi_grad_begin(res);
    }
    /* r holds x's gradient buffer (graph/plan.c, where both start here): written once, through x */
    if (!serial && a.dr && x->requires_grad && res->grad == x->grad && a.ax && a.ar) a.dr = false;
    if (a.dg) cgi_grad_prepare(gt);
    if (a.db) cgi_grad_prepare(bt);
    if (serial) norm_bwd_blocks(0, LN_BLOCKS, &a);
    else cgi_par_ranges(LN_BLOCKS, rows * d, norm_bwd_blocks, &a);
    const cg_real *part[2] = {a.part_g, a.part_b};
    for (int k = 0; k < 2; k++) {
        cg_tensor *p = k ? bt : gt;
        if (p && p->requires_grad) sum_parts(p->grad, p->stride[0], part[k], d);
    }
}

cg_status cgi_fwd_layernorm(cg_tensor *t) { return norm_fwd(t); }
cg_status cgi_fwd_rmsnorm(cg_tensor *t) { return norm_fwd(t); }
cg_status cgi_fwd_add_layernorm(cg_tensor *t) { return norm_fwd(t); }

/* A layer norm's output again (graph/plan.c's regen), from the statistics its backward keeps in
 * aux: one pass over each row, (x - mean) * rstd * gain + bias with forward's mean and rstd, so the
 * bits are forward's; the two reductions over the row are not made again. add_layernorm reads the
 * residual sum it keeps, as forward's rows read it once formed, and neither x nor r. */
void cgi_norm_regen(cg_tensor *t) {
    const int64_t d = t->shape[t->ndim - 1], rows = d ? cgi_numel(t->ndim, t->shape) / d : 0;
    const cg_tensor *gt = t->iarg[0] ? t->src[t->iarg[0]] : NULL, *bt = t->iarg[1] ? t->src[t->iarg[1]] : NULL;
    norm_fwd_args a = {.t = t, .d = d, .rows = rows, .gain = gt ? gt->data : NULL, .bias = bt ? bt->data : NULL,
                       .gs = gt ? gt->stride[0] : 0, .bs = bt ? bt->stride[0] : 0,
                       .X = t->iarg[2] ? sum_rows(t, rows, d) : t->src[0]->data, .Y = t->data, .mean = t->aux,
                       .eps = t->farg[0], .rms = t->op == CGI_OP_RMSNORM, .remake = true};
    a.rstd = a.mean + rows;
    cgi_par_ranges(rows, rows * d, norm_fwd_rows, &a);
}
void cgi_bwd_layernorm(cg_tensor *t) { norm_bwd(t); }
void cgi_bwd_rmsnorm(cg_tensor *t) { norm_bwd(t); }
void cgi_bwd_add_layernorm(cg_tensor *t) { norm_bwd(t); }
