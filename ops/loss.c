/* SPDX-License-Identifier: MIT */
/* Fused cross-entropy: log-softmax and negative log-likelihood in one pass, mean over the
 * targets that are not ignored, with optional label smoothing. Forward saves each row's
 * log-sum-exp for backward. Also cross-entropy against soft targets, and the elementwise losses
 * (mean squared error, binary cross-entropy with logits); the fused linear + cross-entropy (an LM
 * head with its loss) is ops/loss_head.c. */
#include <math.h>
#include <omp.h>

#include "graph/internal.h"
#include "ops/loss_internal.h"
#include "ops/ops.h"

/* iarg[0]: ignore_index; iarg[1]: counted targets of the last forward; farg[0]: label smoothing.
 * aux: lse[rows], loss[rows]. */
cg_tensor *cg_cross_entropy(cg_graph *g, cg_tensor *logits, cg_tensor *targets, int ignore_index) {
    return cg_cross_entropy_smooth(g, logits, targets, ignore_index, 0);
}

cg_tensor *cg_cross_entropy_smooth(cg_graph *g, cg_tensor *logits, cg_tensor *targets, int ignore_index,
                                   double smoothing) {
    cg_tensor *in[2] = {logits, targets};
    if (!cgi_inputs_ok(g, "cross_entropy", 2, in) || !cgi_expect_real("cross_entropy", logits, "logits"))
        return NULL;
    if (!(smoothing >= 0 && smoothing <= 1)) {
        cgi_fail(CG_ERR_ARG, "[cross_entropy] label smoothing %g must be in [0, 1]", smoothing);
        return NULL;
    }
    bool ok = logits->ndim >= 1 && targets->dtype == CG_INT32 && targets->ndim == logits->ndim - 1;
    for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == logits->shape[d];
    if (!ok) {
        cgi_fail(CG_ERR_SHAPE, "[cross_entropy] logits%s [..., C] need int32 targets of shape [...], got %s%s",
                 cgi_shp(logits), targets->dtype == CG_INT32 ? "" : "real ", cgi_shp(targets));
        return NULL;
    }
    in[0] = cg_contiguous(g, logits);
    if (!in[0]) return NULL;
    cg_tensor *t = cgi_node(g, CGI_OP_CROSS_ENTROPY, CG_REAL, 0, NULL, 2, in);
    if (!t) return NULL;
    t->iarg[0] = ignore_index;
    t->farg[0] = smoothing;
    t->aux_bytes = (size_t)(2 * cgi_numel(targets->ndim, targets->shape)) * sizeof(cg_real);
    return t;
}

/* cross_entropy's rows, for cgi_par_ranges: each row's loss and log-sum-exp (forward), or its
 * gradient (backward), alone, so the bits do not depend on how the rows are cut. */
typedef struct {
    cg_tensor *t;
    bool in_place;
    cg_real gscale;
} ce_rows_args;

CGI_WIDE static void ce_fwd_rows(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ((const ce_rows_args *)ctx)->t, *lg = t->src[0], *tg = t->src[1];
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(tg->ndim, tg->shape);
    const int32_t *T = tg->data, ignore = (int32_t)t->iarg[0];
    const cg_real *X = lg->data, eps = (cg_real)t->farg[0];
    cg_real *lse = t->aux, *loss = lse + rows;
    for (int64_t r = lo; r < hi; r++) {
        int32_t k = T[cgi_elem_offset(tg, r)];
        if (k == ignore) {
            loss[r] = 0;
            continue;
        }
        const cg_real *x = X + r * c;
        const cg_real mx = cgi_row_max(x, c);
        lse[r] = mx + (cg_real)log(cgi_sum_exp(x, c, mx, NULL));
        /* smoothing e spreads e / C of the target's mass over every class, as torch */
        loss[r] = lse[r] - (1 - eps) * x[k] - (eps ? eps / (cg_real)c * (cg_real)cgi_row_sum(x, c) : 0);
    }
}

CGI_WIDE cg_status cgi_fwd_cross_entropy(cg_tensor *t) {
    cg_tensor *lg = t->src[0], *tg = t->src[1];
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(tg->ndim, tg->shape);
    int64_t count = 0;
    FOR_COUNTED_TARGETS("cross_entropy", tg, c, (int32_t)t->iarg[0], r, k, count++);
    const cg_real *loss = (cg_real *)t->aux + rows;
    ce_rows_args a = {t, false, 0};
    cgi_par_ranges(rows, rows * c, ce_fwd_rows, &a);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += loss[r];
    t->iarg[1] = count;
    *(cg_real *)t->data = (cg_real)(count ? total / (double)count : 0.0);
    return CG_OK;
}

CGI_WIDE static void ce_bwd_rows(int64_t lo, int64_t hi, void *ctx) {
    const ce_rows_args *a = ctx;
    const cg_tensor *t = a->t, *lg = t->src[0], *tg = t->src[1];
    const int64_t c = lg->shape[lg->ndim - 1];
    const int32_t *T = tg->data, ignore = (int32_t)t->iarg[0];
    const bool in_place = a->in_place;
    const cg_real gscale = a->gscale, *X = lg->data, *lse = t->aux;
    const cg_real eps = (cg_real)t->farg[0], spread = eps / (cg_real)c;
    cg_real *DX = lg->grad;
    for (int64_t r = lo; r < hi; r++) {
        int32_t k = T[cgi_elem_offset(tg, r)];
        const cg_real *x = X + r * c;
        cg_real *dx = DX + r * c;
        if (k == ignore) {
            if (in_place) memset(dx, 0, (size_t)c * sizeof *dx);
            continue;
        }
        if (in_place) for (int64_t j = 0; j < c; j++) dx[j] = gscale * (cgi_exp(x[j] - lse[r]) - spread);
        else for (int64_t j = 0; j < c; j++) dx[j] += gscale * (cgi_exp(x[j] - lse[r]) - spread);
        dx[k] -= gscale * (1 - eps);
    }
}

CGI_WIDE void cgi_bwd_cross_entropy(cg_tensor *t) {
    cg_tensor *lg = t->src[0], *tg = t->src[1];
    if (!lg->requires_grad) return;
    /* The planner may give the gradient the logits' own memory: then write, do not add. */
    const bool in_place = lg->grad == lg->data;
    if (t->iarg[1] == 0) {
        if (in_place) memset(lg->grad, 0, (size_t)cgi_numel(lg->ndim, lg->shape) * sizeof(cg_real));
        return;
    }
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(tg->ndim, tg->shape);
    ce_rows_args a = {t, in_place, t->grad[0] / (cg_real)t->iarg[1]};
    cgi_par_ranges(rows, rows * c, ce_bwd_rows, &a);
}

/* ---- elementwise losses, the mean over every element: mse (pred, target) and binary cross-entropy
 * with logits (logits, target probabilities). Sums run in fixed blocks of EW_BLOCK elements whose
 * partial sums (aux) are added in order, so the value does not depend on the thread count. ---- */

#define EW_BLOCK 4096

static cg_tensor *elementwise_loss(cg_graph *g, int op, cg_tensor *a, cg_tensor *b, const char *ra, const char *rb) {
    const char *nm = cgi_ops[op].name;
    cg_tensor *in[2] = {a, b};
    if (!cgi_inputs_ok(g, nm, 2, in) || !cgi_expect_real(nm, a, ra) || !cgi_expect_real(nm, b, rb)) return NULL;
    bool same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (!same) {
        cgi_fail(CG_ERR_SHAPE, "[%s] %s%s and %s%s must have the same shape", nm, ra, cgi_shp(a), rb, cgi_shp(b));
        return NULL;
    }
    in[0] = cg_contiguous(g, a);
    in[1] = cg_contiguous(g, b);
    if (!in[0] || !in[1]) return NULL;
    cg_tensor *t = cgi_node(g, op, CG_REAL, 0, NULL, 2, in);
    if (t) t->aux_bytes = (size_t)((cgi_numel(a->ndim, a->shape) + EW_BLOCK - 1) / EW_BLOCK + 1) * sizeof(double);
    return t;
}

cg_tensor *cg_mse_loss(cg_graph *g, cg_tensor *pred, cg_tensor *target) {
    return elementwise_loss(g, CGI_OP_MSE_LOSS, pred, target, "pred", "target");
}
cg_tensor *cg_bce_with_logits(cg_graph *g, cg_tensor *logits, cg_tensor *target) {
    return elementwise_loss(g, CGI_OP_BCE_WITH_LOGITS, logits, target, "logits", "target");
}

/* max(x, 0) - x t + log(1 + e^-|x|): log-sigmoid without overflow for any x */
static inline double bce_term(double x, double t) { return (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x))); }

/* Blocks [lo, hi) of EW_BLOCK elements, each block's partial sum, for cgi_par_ranges. */
static void elementwise_loss_blocks(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *a = t->src[0];
    const cg_real *A = a->data, *B = t->src[1]->data;
    const int64_t n = cgi_numel(a->ndim, a->shape);
    const bool mse = t->op == CGI_OP_MSE_LOSS;
    double *part = t->aux;
    for (int64_t k = lo; k < hi; k++) {
        double s = 0;
        for (int64_t i = k * EW_BLOCK; i < n && i < (k + 1) * EW_BLOCK; i++)
            s += mse ? ((double)A[i] - B[i]) * ((double)A[i] - B[i]) : bce_term(A[i], B[i]);
        part[k] = s;
    }
}

static cg_status elementwise_loss_fwd(cg_tensor *t) {
    const cg_tensor *a = t->src[0];
    const int64_t n = cgi_numel(a->ndim, a->shape), blocks = (n + EW_BLOCK - 1) / EW_BLOCK;
    const double *part = t->aux;
    cgi_par_ranges(blocks, n, elementwise_loss_blocks, t);
    double total = 0;
    for (int64_t k = 0; k < blocks; k++) total += part[k];
    *(cg_real *)t->data = (cg_real)(n ? total / (double)n : 0.0);
    return CG_OK;
}

/* mse: d/dpred = 2 (pred - target) / n, d/dtarget its negative; bce: d/dx = (sigmoid(x) - t) / n,
 * d/dt = -x / n */
static void elementwise_loss_grads(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *a = t->src[0], *b = t->src[1];
    const int64_t n = cgi_numel(a->ndim, a->shape);
    const cg_real *A = a->data, *B = b->data, k = t->grad[0] / (cg_real)n;
    const bool mse = t->op == CGI_OP_MSE_LOSS;
    cg_real *DA = a->requires_grad ? a->grad : NULL, *DB = b->requires_grad ? b->grad : NULL;
    for (int64_t i = lo; i < hi; i++) {
        if (mse) {
            const cg_real d = 2 * k * (A[i] - B[i]);
            if (DA) DA[i] += d;
            if (DB) DB[i] -= d;
        } else {
            if (DA) DA[i] += k * (1 / (1 + cgi_exp(-A[i])) - B[i]);
            if (DB) DB[i] -= k * A[i];
        }
    }
}

static void elementwise_loss_bwd(cg_tensor *t) {
    const int64_t n = cgi_numel(t->src[0]->ndim, t->src[0]->shape);
    if (n) cgi_par_ranges(n, n, elementwise_loss_grads, t);
}

cg_status cgi_fwd_mse_loss(cg_tensor *t) { return elementwise_loss_fwd(t); }
cg_status cgi_fwd_bce_with_logits(cg_tensor *t) { return elementwise_loss_fwd(t); }
void cgi_bwd_mse_loss(cg_tensor *t) { elementwise_loss_bwd(t); }
void cgi_bwd_bce_with_logits(cg_tensor *t) { elementwise_loss_bwd(t); }

/* ---- cross-entropy against soft targets: mean over rows of -sum_c p_c log_softmax(x)_c
 * = sum_c p_c (lse - x_c). aux: lse[rows]. ---- */

cg_tensor *cg_cross_entropy_soft(cg_graph *g, cg_tensor *logits, cg_tensor *probs) {
    cg_tensor *in[2] = {logits, probs};
    if (!cgi_inputs_ok(g, "cross_entropy_soft", 2, in) || !cgi_expect_real("cross_entropy_soft", logits, "logits") ||
        !cgi_expect_real("cross_entropy_soft", probs, "probs"))
        return NULL;
    bool same = logits->ndim >= 1 && logits->ndim == probs->ndim;
    for (int d = 0; same && d < logits->ndim; d++) same = logits->shape[d] == probs->shape[d];
    if (!same) {
        cgi_fail(CG_ERR_SHAPE, "[cross_entropy_soft] logits%s [..., C] and probs%s must have the same shape",
                 cgi_shp(logits), cgi_shp(probs));
        return NULL;
    }
    in[0] = cg_contiguous(g, logits);
    in[1] = cg_contiguous(g, probs);
    if (!in[0] || !in[1]) return NULL;
    cg_tensor *t = cgi_node(g, CGI_OP_CROSS_ENTROPY_SOFT, CG_REAL, 0, NULL, 2, in);
    const int64_t c = logits->shape[logits->ndim - 1];
    if (t) t->aux_bytes = (size_t)(2 * (c ? cgi_numel(logits->ndim, logits->shape) / c : 0)) * sizeof(cg_real);
    return t;
}

static void soft_ce_rows(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *lg = t->src[0];
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(lg->ndim, lg->shape) / c;
    const cg_real *X = lg->data, *P = t->src[1]->data;
    cg_real *lse = t->aux, *loss = lse + rows;
    for (int64_t r = lo; r < hi; r++) {
        const cg_real *x = X + r * c, *p = P + r * c;
        const cg_real mx = cgi_row_max(x, c);
        lse[r] = mx + (cg_real)log(cgi_sum_exp(x, c, mx, NULL));
        double s = 0;
        for (int64_t j = 0; j < c; j++)
            if (p[j] != 0) s += (double)p[j] * (lse[r] - x[j]); /* a zero target never meets an -inf logit */
        loss[r] = (cg_real)s;
    }
}

cg_status cgi_fwd_cross_entropy_soft(cg_tensor *t) {
    const cg_tensor *lg = t->src[0];
    const int64_t c = lg->shape[lg->ndim - 1], rows = c ? cgi_numel(lg->ndim, lg->shape) / c : 0;
    const cg_real *loss = (cg_real *)t->aux + rows;
    if (rows) cgi_par_ranges(rows, rows * c, soft_ce_rows, t);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += loss[r];
    *(cg_real *)t->data = (cg_real)(rows ? total / (double)rows : 0.0);
    return CG_OK;
}

/* d/dx_c = softmax_c * sum(p) - p_c; d/dp_c = lse - x_c; both over rows */
static void soft_ce_grad_rows(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *lg = t->src[0], *pt = t->src[1];
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(lg->ndim, lg->shape) / c;
    const cg_real *X = lg->data, *P = pt->data, *lse = t->aux, k = t->grad[0] / (cg_real)rows;
    for (int64_t r = lo; r < hi; r++) {
        const cg_real *x = X + r * c, *p = P + r * c;
        if (lg->requires_grad) {
            double sp = 0;
            for (int64_t j = 0; j < c; j++) sp += p[j];
            cg_real *dx = lg->grad + r * c;
            for (int64_t j = 0; j < c; j++) dx[j] += k * (cgi_exp(x[j] - lse[r]) * (cg_real)sp - p[j]);
        }
        if (pt->requires_grad) {
            cg_real *dp = pt->grad + r * c;
            for (int64_t j = 0; j < c; j++) dp[j] += k * (lse[r] - x[j]);
        }
    }
}

void cgi_bwd_cross_entropy_soft(cg_tensor *t) {
    const cg_tensor *lg = t->src[0];
    const int64_t c = lg->shape[lg->ndim - 1], rows = c ? cgi_numel(lg->ndim, lg->shape) / c : 0;
    if (rows) cgi_par_ranges(rows, rows * c, soft_ce_grad_rows, t);
}
