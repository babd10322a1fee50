/* SPDX-License-Identifier: MIT */
/* Softmax, log-softmax and the fused scaled, masked softmax of attention over the last axis of a
 * contiguous input (the constructors ask for contiguity); softmax and log-softmax also over any
 * other axis, reading it in place with its stride. */
#include <math.h>

#include "graph/internal.h"
#include "ops/ops.h"

/* iarg[0]: the softmax axis's stride in the contiguous input (1: the axis is the last one that is
 * not 1 wide, and rows are contiguous); iarg[1]: its length. */
static cg_tensor *rowwise(cg_graph *g, int op, cg_tensor *x, int axis) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || !cgi_expect_real(nm, x, "x")) return NULL;
    if (x->ndim < 1) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s needs at least one axis", nm, cgi_shp(x));
        return NULL;
    }
    const int a = cgi_axis(nm, x, axis);
    if (a < 0) return NULL;
    x = cg_contiguous(g, x);
    cg_tensor *t = x ? cgi_node(g, op, CG_REAL, x->ndim, x->shape, 1, &x) : NULL;
    if (t) t->iarg[0] = x->shape[a] > 1 ? x->stride[a] : 1, t->iarg[1] = x->shape[a];
    return t;
}

cg_tensor *cg_softmax(cg_graph *g, cg_tensor *x) { return rowwise(g, CGI_OP_SOFTMAX, x, -1); }
cg_tensor *cg_log_softmax(cg_graph *g, cg_tensor *x) { return rowwise(g, CGI_OP_LOG_SOFTMAX, x, -1); }
cg_tensor *cg_softmax_axis(cg_graph *g, cg_tensor *x, int axis) { return rowwise(g, CGI_OP_SOFTMAX, x, axis); }
cg_tensor *cg_log_softmax_axis(cg_graph *g, cg_tensor *x, int axis) { return rowwise(g, CGI_OP_LOG_SOFTMAX, x, axis); }

static void dims(const cg_tensor *t, int64_t *rows, int64_t *cols) {
    *cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    *rows = *cols ? cgi_numel(t->ndim, t->shape) / *cols : 0;
}

/* Softmax along an inner axis (stride s > 1): lane l covers elements base, base + s, ... */
CGI_CLONES static void strided_fwd(cg_tensor *t, bool log_form) {
    const int64_t s = t->iarg[0], n = t->iarg[1], total = cgi_numel(t->ndim, t->shape);
    const int64_t lanes = n ? total / n : 0;
    const cg_real *X = t->src[0]->data;
    cg_real *Y = t->data;
#pragma omp parallel for schedule(static) if (total > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t l = 0; l < lanes; l++) {
        const int64_t b = (l / s) * n * s + l % s;
        cg_real mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = X[b + j * s] > mx ? X[b + j * s] : mx;
        double sum = 0;
        for (int64_t j = 0; j < n; j++) sum += Y[b + j * s] = cgi_exp(X[b + j * s] - mx);
        const cg_real lse = mx + (cg_real)log(sum), inv = (cg_real)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) Y[b + j * s] = log_form ? X[b + j * s] - lse : Y[b + j * s] * inv;
    }
}

CGI_CLONES static void strided_bwd(cg_tensor *t, bool log_form) {
    const int64_t s = t->iarg[0], n = t->iarg[1], total = cgi_numel(t->ndim, t->shape);
    const int64_t lanes = n ? total / n : 0;
    const cg_real *Y = t->data, *DY = t->grad;
    cg_real *DX = t->src[0]->grad;
#pragma omp parallel for schedule(static) if (total > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t l = 0; l < lanes; l++) {
        const int64_t b = (l / s) * n * s + l % s;
        double sum = 0;
        for (int64_t j = 0; j < n; j++) sum += log_form ? DY[b + j * s] : (double)DY[b + j * s] * Y[b + j * s];
        for (int64_t j = 0; j < n; j++) {
            const int64_t k = b + j * s;
            DX[k] += log_form ? DY[k] - cgi_exp(Y[k]) * (cg_real)sum : Y[k] * (DY[k] - (cg_real)sum);
        }
    }
}

CGI_CLONES static cg_status softmax_fwd(cg_tensor *t, bool log_form) {
    if (t->iarg[0] != 1) {
        strided_fwd(t, log_form);
        return CG_OK;
    }
    const int64_t n = t->iarg[1], rows = n ? cgi_numel(t->ndim, t->shape) / n : 0;
    const cg_real *X = t->src[0]->data;
    cg_real *Y = t->data;
#pragma omp parallel for schedule(static) if (rows * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        const cg_real *x = X + r * n;
        cg_real *y = Y + r * n;
        const cg_real mx = cgi_row_max(x, n);
        const double sum = cgi_sum_exp(x, n, mx, y);
        if (log_form) {
            cg_real lse = mx + (cg_real)log(sum);
            for (int64_t j = 0; j < n; j++) y[j] = x[j] - lse;
        } else {
            cg_real inv = (cg_real)(1.0 / sum);
            for (int64_t j = 0; j < n; j++) y[j] *= inv;
        }
    }
    return CG_OK;
}

CGI_CLONES static void softmax_bwd(cg_tensor *t, bool log_form) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    if (t->iarg[0] != 1) {
        strided_bwd(t, log_form);
        return;
    }
    const int64_t n = t->iarg[1], rows = n ? cgi_numel(t->ndim, t->shape) / n : 0;
    const cg_real *Y = t->data, *DY = t->grad;
    cg_real *DX = x->grad;
#pragma omp parallel for schedule(static) if (rows * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        const cg_real *y = Y + r * n, *dy = DY + r * n;
        cg_real *dx = DX + r * n;
        double s = 0;
        if (log_form) { /* dx = dy - softmax * sum(dy) */
            for (int64_t j = 0; j < n; j++) s += dy[j];
            for (int64_t j = 0; j < n; j++) dx[j] += dy[j] - cgi_exp(y[j]) * (cg_real)s;
        } else { /* dx = y * (dy - sum(dy * y)) */
            for (int64_t j = 0; j < n; j++) s += (double)dy[j] * y[j];
            for (int64_t j = 0; j < n; j++) dx[j] += y[j] * (dy[j] - (cg_real)s);
        }
    }
}

cg_status cgi_fwd_softmax(cg_tensor *t) { return softmax_fwd(t, false); }
cg_status cgi_fwd_log_softmax(cg_tensor *t) { return softmax_fwd(t, true); }
void cgi_bwd_softmax(cg_tensor *t) { softmax_bwd(t, false); }
void cgi_bwd_log_softmax(cg_tensor *t) { softmax_bwd(t, true); }

/* ---- masked softmax: farg[0] scale; iarg[0] causal, iarg[1] / iarg[2] source index of the
 * additive mask / key-padding mask (0 when absent) ---- */

cg_tensor *cg_masked_softmax(cg_graph *g, cg_tensor *x, double scale, cg_tensor *mask, bool causal,
                             cg_tensor *key_padding) {
    if (!cgi_inputs_ok(g, "masked_softmax", 1, &x) || (mask && !cgi_inputs_ok(g, "masked_softmax", 1, &mask)) ||
        (key_padding && !cgi_inputs_ok(g, "masked_softmax", 1, &key_padding)))
        return NULL;
    if (!cgi_expect_real("masked_softmax", x, "x")) return NULL;
    if (x->ndim < 2) {
        cgi_fail(CG_ERR_SHAPE, "[masked_softmax] x%s must be [..., Tq, Tk]", cgi_shp(x));
        return NULL;
    }
    int64_t tk = x->shape[x->ndim - 1];
    if (mask) {
        int nd;
        int64_t s[CG_MAX_DIMS];
        if (!cgi_expect_real("masked_softmax", mask, "mask")) return NULL;
        if (!cgi_broadcast_shape(x, mask, &nd, s) || nd != x->ndim ||
            cgi_numel(nd, s) != cgi_numel(x->ndim, x->shape)) {
            cgi_fail(CG_ERR_SHAPE, "[masked_softmax] mask%s does not broadcast to x%s", cgi_shp(mask), cgi_shp(x));
            return NULL;
        }
    }
    if (key_padding) {
        if (key_padding->dtype != CG_INT32 || key_padding->ndim != 2 || x->ndim < 3 ||
            key_padding->shape[0] != x->shape[0] || key_padding->shape[1] != tk) {
            cgi_fail(CG_ERR_SHAPE,
                     "[masked_softmax] key_padding%s must be int32 [B, Tk] = [%lld, %lld] for x%s [B, ..., Tq, Tk]",
                     cgi_shp(key_padding), (long long)(x->ndim >= 3 ? x->shape[0] : -1), (long long)tk,
                     cgi_shp(x));
            return NULL;
        }
    }
    x = cg_contiguous(g, x);
    if (!x) return NULL;
    cg_tensor *src[3] = {x, NULL, NULL};
    int n = 1, mi = 0, ki = 0;
    if (mask) mi = n, src[n++] = mask;
    if (key_padding) ki = n, src[n++] = key_padding;
    cg_tensor *t = cgi_node(g, CGI_OP_MASKED_SOFTMAX, CG_REAL, x->ndim, x->shape, n, src);
    if (!t) return NULL;
    t->farg[0] = scale;
    t->iarg[0] = causal;
    t->iarg[1] = mi;
    t->iarg[2] = ki;
    if (mask && mask->requires_grad) t->aux_bytes = (size_t)cgi_numel(x->ndim, x->shape) * sizeof(cg_real);
    return t;
}

/* Offset of row r's first element in a tensor read with broadcast strides st over t's dims. */
static int64_t row_offset(const cg_tensor *t, const int64_t *st, int64_t r) {
    int64_t off = 0;
    for (int d = t->ndim - 2; d >= 0; d--) {
        off += (r % t->shape[d]) * st[d];
        r /= t->shape[d];
    }
    return off;
}

cg_status cgi_fwd_masked_softmax(cg_tensor *t) {
    int64_t rows, n;
    dims(t, &rows, &n);
    const int64_t tq = t->shape[t->ndim - 2], shift = n - tq;
    const cg_tensor *mask = t->iarg[1] ? t->src[t->iarg[1]] : NULL, *kp = t->iarg[2] ? t->src[t->iarg[2]] : NULL;
    int64_t ms[CG_MAX_DIMS];
    if (mask) cgi_broadcast_strides(mask, t->ndim, t->shape, ms);
    const int64_t rows_per_batch = rows / (t->shape[0] ? t->shape[0] : 1);
    const bool causal = t->iarg[0];
    const cg_real scale = (cg_real)t->farg[0], *X = t->src[0]->data;
    cg_real *Y = t->data;
#pragma omp parallel for schedule(static) if (rows * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        const cg_real *x = X + r * n;
        const cg_real *m = mask ? (const cg_real *)mask->data + row_offset(t, ms, r) : NULL;
        const int64_t mstep = mask ? ms[t->ndim - 1] : 0;
        const int32_t *keep = kp ? (const int32_t *)kp->data + (r / rows_per_batch) * kp->stride[0] : NULL;
        const int64_t limit = causal ? (r % tq) + shift + 1 : n; /* keys [0, limit) are visible */
        cg_real *y = Y + r * n;
        cg_real mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            bool hidden = j >= limit || (keep && keep[j * kp->stride[1]] == 0);
            y[j] = hidden ? -INFINITY : scale * x[j] + (m ? m[j * mstep] : 0);
            if (y[j] > mx) mx = y[j];
        }
        if (mx == -INFINITY) { /* every key hidden: a zero row, not NaN */
            for (int64_t j = 0; j < n; j++) y[j] = 0;
            continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            y[j] = y[j] == -INFINITY ? 0 : cgi_exp(y[j] - mx);
            sum += y[j];
        }
        cg_real inv = (cg_real)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) y[j] *= inv;
    }
    return CG_OK;
}

void cgi_bwd_masked_softmax(cg_tensor *t) {
    cg_tensor *x = t->src[0], *mask = t->iarg[1] ? t->src[t->iarg[1]] : NULL;
    bool gx = x->requires_grad, gm = mask && mask->requires_grad;
    int64_t rows, n;
    dims(t, &rows, &n);
    const cg_real scale = (cg_real)t->farg[0], *Y = t->data, *DY = t->grad;
    cg_real *DZ = t->aux;
#pragma omp parallel for schedule(static) if (rows * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        const cg_real *y = Y + r * n, *dy = DY + r * n;
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += (double)dy[j] * y[j];
        for (int64_t j = 0; j < n; j++) {
            cg_real dz = y[j] * (dy[j] - (cg_real)s);
            if (gx) ((cg_real *)x->grad)[r * n + j] += scale * dz;
            if (gm) DZ[r * n + j] = dz;
        }
    }
    if (gm) cgi_unbroadcast_add(mask, DZ, t->ndim, t->shape, 1.0);
}
