/* Sum and mean over one axis or over all; backward broadcasts the gradient back. */
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
