/* Fused cross-entropy: log-softmax and negative log-likelihood in one pass, mean over the
 * targets that are not ignored. Forward saves each row's log-sum-exp for backward. */
#include <math.h>

#include "graph/internal.h"
#include "ops/ops.h"

/* iarg[0]: ignore_index; iarg[1]: counted targets of the last forward. aux: lse[rows], loss[rows]. */
cg_tensor *cg_cross_entropy(cg_graph *g, cg_tensor *logits, cg_tensor *targets, int ignore_index) {
    cg_tensor *in[2] = {logits, targets};
    if (!cgi_inputs_ok(g, "cross_entropy", 2, in) || !cgi_expect_real("cross_entropy", logits, "logits"))
        return NULL;
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
    t->aux_bytes = (size_t)(2 * cgi_numel(targets->ndim, targets->shape)) * sizeof(cg_real);
    return t;
}

static int64_t target_offset(const cg_tensor *tg, int64_t i) {
    int64_t off = 0;
    for (int d = tg->ndim - 1; d >= 0; d--) {
        off += (i % tg->shape[d]) * tg->stride[d];
        i /= tg->shape[d];
    }
    return off;
}

cg_status cgi_fwd_cross_entropy(cg_tensor *t) {
    cg_tensor *lg = t->src[0], *tg = t->src[1];
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(tg->ndim, tg->shape);
    const int32_t *T = tg->data, ignore = (int32_t)t->iarg[0];
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        int32_t k = T[target_offset(tg, r)];
        if (k == ignore) continue;
        if (k < 0 || k >= c)
            return cgi_fail(CG_ERR_RANGE, "[cross_entropy] target %d at position %lld of targets%s is outside [0, %lld) "
                            "and is not ignore_index %d", k, (long long)r, cgi_shp(tg), (long long)c, ignore);
        count++;
    }
    const cg_real *X = lg->data;
    cg_real *lse = t->aux, *loss = lse + rows;
#pragma omp parallel for schedule(static) if (rows * c > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        int32_t k = T[target_offset(tg, r)];
        if (k == ignore) {
            loss[r] = 0;
            continue;
        }
        const cg_real *x = X + r * c;
        cg_real mx = -INFINITY;
        for (int64_t j = 0; j < c; j++) mx = x[j] > mx ? x[j] : mx;
        double s = 0;
        for (int64_t j = 0; j < c; j++) s += cgi_exp(x[j] - mx);
        lse[r] = mx + (cg_real)log(s);
        loss[r] = lse[r] - x[k];
    }
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += loss[r];
    t->iarg[1] = count;
    *(cg_real *)t->data = (cg_real)(count ? total / (double)count : 0.0);
    return CG_OK;
}

void cgi_bwd_cross_entropy(cg_tensor *t) {
    cg_tensor *lg = t->src[0], *tg = t->src[1];
    if (!lg->requires_grad) return;
    /* The planner may give the gradient the logits' own memory: then write, do not add. */
    const bool in_place = lg->grad == lg->data;
    if (t->iarg[1] == 0) {
        if (in_place) memset(lg->grad, 0, (size_t)cgi_numel(lg->ndim, lg->shape) * sizeof(cg_real));
        return;
    }
    const int64_t c = lg->shape[lg->ndim - 1], rows = cgi_numel(tg->ndim, tg->shape);
    const int32_t *T = tg->data, ignore = (int32_t)t->iarg[0];
    const cg_real gscale = t->grad[0] / (cg_real)t->iarg[1], *X = lg->data, *lse = t->aux;
    cg_real *DX = lg->grad;
#pragma omp parallel for schedule(static) if (rows * c > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t r = 0; r < rows; r++) {
        int32_t k = T[target_offset(tg, r)];
        const cg_real *x = X + r * c;
        cg_real *dx = DX + r * c;
        if (k == ignore) {
            if (in_place) memset(dx, 0, (size_t)c * sizeof *dx);
            continue;
        }
        if (in_place) for (int64_t j = 0; j < c; j++) dx[j] = gscale * cgi_exp(x[j] - lse[r]);
        else for (int64_t j = 0; j < c; j++) dx[j] += gscale * cgi_exp(x[j] - lse[r]);
        dx[k] -= gscale;
    }
}
