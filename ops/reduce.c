/* SPDX-License-Identifier: MIT */
/* Reductions: sum and mean over one axis or over all (backward broadcasts the gradient back);
 * max, min, argmax, logsumexp, var and the L2 norm over one axis. */
#include <math.h>

#include "graph/internal.h"
#include "ops/ops.h"

/* iarg[0]: reduced axis, or -1 for all axes. */
static cg_tensor *reduce(cg_graph *g, int op, cg_tensor *x, int axis, bool keepdim, bool all) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || !cgi_expect_real(nm, x, "x")) return NULL;
    int64_t shape[CG_MAX_DIMS];
    int nd = 0, a = -1;
    if (!all) {
        a = cgi_axis(nm, x, axis);
        if (a < 0) return NULL;
        for (int d = 0; d < x->ndim; d++) {
            if (d != a) shape[nd++] = x->shape[d];
            else if (keepdim) shape[nd++] = 1;
        }
    }
    cg_tensor *t = cgi_node(g, op, CG_REAL, nd, shape, 1, &x);
    if (t) t->iarg[0] = a;
    return t;
}

cg_tensor *cg_sum(cg_graph *g, cg_tensor *x, int axis, bool keepdim) { return reduce(g, CGI_OP_SUM, x, axis, keepdim, false); }
cg_tensor *cg_mean(cg_graph *g, cg_tensor *x, int axis, bool keepdim) { return reduce(g, CGI_OP_MEAN, x, axis, keepdim, false); }
cg_tensor *cg_sum_all(cg_graph *g, cg_tensor *x) { return reduce(g, CGI_OP_SUM, x, 0, false, true); }
cg_tensor *cg_mean_all(cg_graph *g, cg_tensor *x) { return reduce(g, CGI_OP_MEAN, x, 0, false, true); }

/* Output strides read over x's dims (0 on the reduced ones), the reduce mask and the count. */
static unsigned out_strides(const cg_tensor *t, int64_t *st, int64_t *count) {
    const cg_tensor *x = t->src[0];
    int a = (int)t->iarg[0], k = 0;
    bool keep = t->ndim == x->ndim;
    unsigned mask = 0;
    *count = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (a < 0 || d == a) {
            mask |= 1u << d;
            st[d] = 0;
            *count *= x->shape[d];
            if (keep) k++;
        } else {
            st[d] = t->stride[k++];
        }
    }
    return mask;
}

static void forward(cg_tensor *t, bool mean) {
    cg_tensor *x = t->src[0];
    int64_t st[CG_MAX_DIMS], count;
    unsigned mask = out_strides(t, st, &count);
    cgi_reduce(t->data, st, x->data, x->stride, x->ndim, x->shape, mask,
               mean ? 1.0 / (double)(count ? count : 1) : 1.0, false);
}

static void backward(cg_tensor *t, bool mean) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    int64_t st[CG_MAX_DIMS], count;
    out_strides(t, st, &count);
    cgi_copy(x->grad, x->stride, t->grad, st, x->ndim, x->shape, mean ? 1.0 / (double)(count ? count : 1) : 1.0, true);
}

cg_status cgi_fwd_sum(cg_tensor *t) { forward(t, false); return CG_OK; }
cg_status cgi_fwd_mean(cg_tensor *t) { forward(t, true); return CG_OK; }
void cgi_bwd_sum(cg_tensor *t) { backward(t, false); }
void cgi_bwd_mean(cg_tensor *t) { backward(t, true); }

/* ---- max, min, argmax, logsumexp, var, L2 norm over one axis of a contiguous x, read as
 * [outer, n, inner]: each of the outer * inner lanes is reduced by one thread, in index order, so
 * the result does not depend on the thread count. iarg[0] axis, iarg[1] inner; farg[0] the
 * correction of var. max and min keep each lane's winning index (int32) in aux for backward. ---- */

static cg_tensor *lane_reduce(cg_graph *g, int op, cg_tensor *x, int axis, bool keepdim) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || !cgi_expect_real(nm, x, "x")) return NULL;
    const int a = cgi_axis(nm, x, axis);
    if (a < 0) return NULL;
    if (x->shape[a] == 0 && op != CGI_OP_LOGSUMEXP && op != CGI_OP_NORM) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s: axis %d is empty, so there is nothing to take", nm, cgi_shp(x), axis);
        return NULL;
    }
    x = cg_contiguous(g, x);
    if (!x) return NULL;
    int64_t shape[CG_MAX_DIMS], inner = 1;
    int nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d != a) shape[nd++] = x->shape[d];
        else if (keepdim) shape[nd++] = 1;
        if (d > a) inner *= x->shape[d];
    }
    cg_tensor *t = cgi_node(g, op, op == CGI_OP_ARGMAX ? CG_INT32 : CG_REAL, nd, shape, 1, &x);
    if (!t) return NULL;
    t->iarg[0] = a;
    t->iarg[1] = inner;
    if (op == CGI_OP_ARGMAX) t->requires_grad = false; /* indices carry no gradient */
    if ((op == CGI_OP_MAX || op == CGI_OP_MIN) && t->requires_grad)
        t->aux_bytes = (size_t)cgi_numel(nd, shape) * sizeof(int32_t);
    return t;
}

cg_tensor *cg_max(cg_graph *g, cg_tensor *x, int axis, bool keepdim) { return lane_reduce(g, CGI_OP_MAX, x, axis, keepdim); }
cg_tensor *cg_min(cg_graph *g, cg_tensor *x, int axis, bool keepdim) { return lane_reduce(g, CGI_OP_MIN, x, axis, keepdim); }
cg_tensor *cg_argmax(cg_graph *g, cg_tensor *x, int axis, bool keepdim) {
    return lane_reduce(g, CGI_OP_ARGMAX, x, axis, keepdim);
}
cg_tensor *cg_logsumexp(cg_graph *g, cg_tensor *x, int axis, bool keepdim) {
    return lane_reduce(g, CGI_OP_LOGSUMEXP, x, axis, keepdim);
}
cg_tensor *cg_norm(cg_graph *g, cg_tensor *x, int axis, bool keepdim) { return lane_reduce(g, CGI_OP_NORM, x, axis, keepdim); }
cg_tensor *cg_var(cg_graph *g, cg_tensor *x, int axis, bool keepdim, int correction) {
    if (x && g) {
        const int a = cgi_axis("var", x, axis);
        if (a < 0) return NULL;
        if (correction < 0 || x->shape[a] - correction <= 0) {
            cgi_fail(CG_ERR_SHAPE, "[var] x%s axis %d: %lld elements leave no degrees of freedom with correction %d",
                     cgi_shp(x), axis, (long long)x->shape[a], correction);
            return NULL;
        }
    }
    cg_tensor *t = lane_reduce(g, CGI_OP_VAR, x, axis, keepdim);
    if (t) t->farg[0] = correction;
    return t;
}

/* x read as lanes: lane l starts at base(l) and has n elements step apart. */
typedef struct {
    const cg_real *x;
    int64_t n, step, count;
} lanes;

static lanes lanes_of(const cg_tensor *t) {
    const cg_tensor *x = t->src[0];
    return (lanes){x->data, x->shape[t->iarg[0]], t->iarg[1], cgi_numel(t->ndim, t->shape)};
}
static inline int64_t base(const lanes *L, int64_t l) { return (l / L->step) * L->n * L->step + l % L->step; }

/* A loop over t's lanes (l), split over the threads; its body sees X (x's data), n and step (a
 * lane's length and stride) and L, and starts at lane l's first element b0 = base(&L, l). */
#define FOR_EACH_LANE(t)                                                                             \
    const lanes L = lanes_of(t);                                                                     \
    const cg_real *const X = L.x;                                                                    \
    const int64_t n = L.n, step = L.step;                                                            \
    (void)X, (void)n;                                                                                \
    _Pragma("omp parallel for schedule(static) if (L.count * L.n > CGI_PAR_MIN) num_threads(cgi_nthreads())") \
    for (int64_t l = 0; l < L.count; l++)

/* max (sign 1) or min (sign -1) with the first winning index; NaN wins, as in torch */
static void extreme_fwd(cg_tensor *t, cg_real sign) {
    cg_real *Y = t->data;
    int32_t *at = t->aux_bytes ? t->aux : NULL;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        int64_t best = 0;
        cg_real bv = X[b0] * sign;
        for (int64_t j = 1; j < n && bv == bv; j++) {
            const cg_real v = X[b0 + j * step] * sign;
            if (v > bv || v != v) best = j, bv = v;
        }
        if (t->op == CGI_OP_ARGMAX) ((int32_t *)t->data)[l] = (int32_t)best;
        else Y[l] = X[b0 + best * step];
        if (at) at[l] = (int32_t)best;
    }
}

static void extreme_bwd(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const int32_t *at = t->aux;
    const cg_real *DY = t->grad;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        x->grad[b0 + at[l] * step] += DY[l];
    }
}

cg_status cgi_fwd_max(cg_tensor *t) { extreme_fwd(t, 1); return CG_OK; }
cg_status cgi_fwd_min(cg_tensor *t) { extreme_fwd(t, -1); return CG_OK; }
cg_status cgi_fwd_argmax(cg_tensor *t) { extreme_fwd(t, 1); return CG_OK; }
void cgi_bwd_max(cg_tensor *t) { extreme_bwd(t); }
void cgi_bwd_min(cg_tensor *t) { extreme_bwd(t); }
void cgi_bwd_argmax(cg_tensor *t) { (void)t; }

cg_status cgi_fwd_logsumexp(cg_tensor *t) {
    cg_real *Y = t->data;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        cg_real m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = X[b0 + j * step] > m ? X[b0 + j * step] : m;
        double s = 0;
        if (m != -INFINITY && isfinite(m))
            for (int64_t j = 0; j < n; j++) s += exp((double)(X[b0 + j * step] - m));
        Y[l] = m == -INFINITY || !isfinite(m) ? m : m + (cg_real)log(s); /* all -inf: -inf; an inf or NaN wins */
    }
    return CG_OK;
}

/* d lse / dx_j = e^(x_j - lse): the softmax along the lane */
void cgi_bwd_logsumexp(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const cg_real *Y = t->data, *DY = t->grad;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        if (!isfinite(Y[l])) continue;
        for (int64_t j = 0; j < n; j++) x->grad[b0 + j * step] += DY[l] * (cg_real)exp((double)(X[b0 + j * step] - Y[l]));
    }
}

static double lane_mean(const cg_real *x, int64_t n, int64_t step) {
    double s = 0;
    for (int64_t j = 0; j < n; j++) s += x[j * step];
    return s / (double)n;
}

cg_status cgi_fwd_var(cg_tensor *t) {
    cg_real *Y = t->data;
    const double dof = (double)(t->src[0]->shape[t->iarg[0]] - (int64_t)t->farg[0]);
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        const double mu = lane_mean(X + b0, n, step);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += (X[b0 + j * step] - mu) * (X[b0 + j * step] - mu);
        Y[l] = (cg_real)(s / dof);
    }
    return CG_OK;
}

/* d var / dx_j = 2 (x_j - mean) / (n - correction) */
void cgi_bwd_var(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const cg_real *DY = t->grad;
    const double dof = (double)(x->shape[t->iarg[0]] - (int64_t)t->farg[0]);
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        const double mu = lane_mean(X + b0, n, step);
        const cg_real k = (cg_real)(2 * DY[l] / dof);
        for (int64_t j = 0; j < n; j++) x->grad[b0 + j * step] += k * (cg_real)(X[b0 + j * step] - mu);
    }
}

cg_status cgi_fwd_norm(cg_tensor *t) {
    cg_real *Y = t->data;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += (double)X[b0 + j * step] * X[b0 + j * step];
        Y[l] = (cg_real)sqrt(s);
    }
    return CG_OK;
}

/* d |x| / dx_j = x_j / |x|; at |x| = 0 the subgradient 0, as torch */
void cgi_bwd_norm(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const cg_real *Y = t->data, *DY = t->grad;
    FOR_EACH_LANE(t) {
        const int64_t b0 = base(&L, l);
        if (Y[l] == 0) continue;
        const cg_real k = DY[l] / Y[l];
        for (int64_t j = 0; j < n; j++) x->grad[b0 + j * step] += k * X[b0 + j * step];
    }
}
