/* SPDX-License-Identifier: MIT */
/* Ops whose outputs carry no gradient: the comparisons eq, ne, lt, le, gt, ge (int32 masks of 0
 * and 1, NumPy broadcasting, as torch.eq ...), the cast of real values to int32 (cg_cast is the
 * other way) and one_hot. Their masks drive cg_where, cg_masked_fill and cg_cast inside a graph;
 * a gradient reaches the compared values only through those ops' other operands, as in torch,
 * where these outputs are not differentiable. */
#include "graph/internal.h"
#include "ops/ops.h"

/* ---- comparisons: both operands real or both int32; NaN compares false except under ne ---- */

static cg_tensor *compare(cg_graph *g, int op, cg_tensor *a, cg_tensor *b) {
    const char *nm = cgi_ops[op].name;
    cg_tensor *in[2] = {a, b};
    if (!cgi_inputs_ok(g, nm, 2, in)) return NULL;
    if (a->dtype != b->dtype) {
        cgi_fail(CG_ERR_ARG, "[%s] a%s is %s but b%s is %s: compare tensors of one dtype (cg_cast or cg_to_int first)",
                 nm, cgi_shp(a), a->dtype == CG_REAL ? "real" : "int32", cgi_shp(b),
                 b->dtype == CG_REAL ? "real" : "int32");
        return NULL;
    }
    cg_tensor *t = cgi_broadcast_node(g, op, CG_INT32, a, b);
    if (t) t->requires_grad = false; /* a mask carries no gradient */
    return t;
}

cg_tensor *cg_eq(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_EQ, a, b); }
cg_tensor *cg_ne(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_NE, a, b); }
cg_tensor *cg_lt(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_LT, a, b); }
cg_tensor *cg_le(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_LE, a, b); }
cg_tensor *cg_gt(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_GT, a, b); }
cg_tensor *cg_ge(cg_graph *g, cg_tensor *a, cg_tensor *b) { return compare(g, CGI_OP_GE, a, b); }

static inline int32_t compare_values(int op, double a, double b) {
    switch (op) {
    case CGI_OP_EQ: return a == b;
    case CGI_OP_NE: return a != b;
    case CGI_OP_LT: return a < b;
    case CGI_OP_LE: return a <= b;
    case CGI_OP_GT: return a > b;
    default: return a >= b;
    }
}

static cg_status compare_fwd(cg_tensor *t) {
    const cg_tensor *a = t->src[0], *b = t->src[1];
    int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS];
    cgi_broadcast_strides(a, t->ndim, t->shape, sa);
    cgi_broadcast_strides(b, t->ndim, t->shape, sb);
    const int64_t *st[3] = {t->stride, sa, sb};
    cgi_iter it;
    cgi_iter_init(&it, t->ndim, t->shape, 3, st);
    const int64_t s0 = it.st[0][it.ndim - 1], s1 = it.st[1][it.ndim - 1], s2 = it.st[2][it.ndim - 1];
    const int op = t->op;
    const bool real = a->dtype == CG_REAL;
    int32_t *Y = t->data;
    CGI_PAR_FOR(it.rows * it.inner,
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[3];
        cgi_iter_row(&it, r, off);
        for (int64_t j = 0; j < it.inner; j++) {
            const int64_t ia = off[1] + j * s1, ib = off[2] + j * s2;
            const double x = real ? (double)((const cg_real *)a->data)[ia] : (double)((const int32_t *)a->data)[ia];
            const double y = real ? (double)((const cg_real *)b->data)[ib] : (double)((const int32_t *)b->data)[ib];
            Y[off[0] + j * s0] = compare_values(op, x, y);
        }
    });
    return CG_OK;
}

cg_status cgi_fwd_eq(cg_tensor *t) { return compare_fwd(t); }
cg_status cgi_fwd_ne(cg_tensor *t) { return compare_fwd(t); }
cg_status cgi_fwd_lt(cg_tensor *t) { return compare_fwd(t); }
cg_status cgi_fwd_le(cg_tensor *t) { return compare_fwd(t); }
cg_status cgi_fwd_gt(cg_tensor *t) { return compare_fwd(t); }
cg_status cgi_fwd_ge(cg_tensor *t) { return compare_fwd(t); }
void cgi_bwd_eq(cg_tensor *t) { (void)t; }
void cgi_bwd_ne(cg_tensor *t) { (void)t; }
void cgi_bwd_lt(cg_tensor *t) { (void)t; }
void cgi_bwd_le(cg_tensor *t) { (void)t; }
void cgi_bwd_gt(cg_tensor *t) { (void)t; }
void cgi_bwd_ge(cg_tensor *t) { (void)t; }

/* ---- to_int: real -> int32, truncating toward zero as torch's x.to(torch.int32) ---- */

cg_tensor *cg_to_int(cg_graph *g, cg_tensor *x) {
    if (!cgi_inputs_ok(g, "to_int", 1, &x) || !cgi_expect_real("to_int", x, "x")) return NULL;
    cg_tensor *t = cgi_node(g, CGI_OP_TO_INT, CG_INT32, x->ndim, x->shape, 1, &x);
    if (t) t->requires_grad = false; /* integers carry no gradient */
    return t;
}

cg_tensor *cg_to_real(cg_graph *g, cg_tensor *x) { return cg_cast(g, x); }

/* Serial, so that the first bad element is the one named whatever the thread count. */
cg_status cgi_fwd_to_int(cg_tensor *t) {
    const cg_tensor *x = t->src[0];
    const cg_real *X = x->data;
    int32_t *Y = t->data;
    const int64_t n = cgi_numel(t->ndim, t->shape);
    for (int64_t i = 0; i < n; i++) {
        const double v = (double)X[cgi_elem_offset(x, i)];
        /* after truncation toward zero, exactly the values in (-2^31 - 1, 2^31) fit */
        if (!(v > -2147483649.0 && v < 2147483648.0))
            return cgi_fail(CG_ERR_RANGE, "[to_int] x%s: element %lld is %g, which does not fit int32 after truncation",
                            cgi_shp(x), (long long)i, v);
        Y[i] = (int32_t)v;
    }
    return CG_OK;
}
void cgi_bwd_to_int(cg_tensor *t) { (void)t; }

/* ---- one_hot: int32 ids[...] -> [..., num_classes], 1 at the id, 0 elsewhere ---- */

cg_tensor *cg_one_hot(cg_graph *g, cg_tensor *ids, int64_t num_classes, cg_dtype dtype) {
    if (!cgi_inputs_ok(g, "one_hot", 1, &ids)) return NULL;
    if (ids->dtype != CG_INT32) {
        cgi_fail(CG_ERR_ARG, "[one_hot] ids%s must be int32", cgi_shp(ids));
        return NULL;
    }
    if (num_classes <= 0 || num_classes > INT32_MAX || (dtype != CG_REAL && dtype != CG_INT32) ||
        ids->ndim >= CG_MAX_DIMS) {
        cgi_fail(CG_ERR_ARG, "[one_hot] ids%s, num_classes %lld, dtype %d: need 1 <= num_classes < 2^31, a real or "
                 "int32 dtype and fewer than %d dims", cgi_shp(ids), (long long)num_classes, (int)dtype, CG_MAX_DIMS);
        return NULL;
    }
    int64_t shape[CG_MAX_DIMS];
    memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
    shape[ids->ndim] = num_classes;
    cg_tensor *t = cgi_node(g, CGI_OP_ONE_HOT, dtype, ids->ndim + 1, shape, 1, &ids);
    if (t) t->requires_grad = false;
    return t;
}

cg_status cgi_fwd_one_hot(cg_tensor *t) {
    const cg_tensor *ids = t->src[0];
    const int64_t c = t->shape[t->ndim - 1], n = cgi_numel(ids->ndim, ids->shape);
    const int32_t *I = ids->data;
    const bool real = t->dtype == CG_REAL;
    if (real) memset(t->data, 0, (size_t)(n * c) * sizeof(cg_real));
    else memset(t->data, 0, (size_t)(n * c) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        const int32_t k = I[cgi_elem_offset(ids, i)];
        if (k < 0 || k >= c)
            return cgi_fail(CG_ERR_RANGE, "[one_hot] id %d at position %lld of ids%s is outside [0, %lld)", k,
                            (long long)i, cgi_shp(ids), (long long)c);
        if (real) ((cg_real *)t->data)[i * c + k] = 1;
        else ((int32_t *)t->data)[i * c + k] = 1;
    }
    return CG_OK;
}
void cgi_bwd_one_hot(cg_tensor *t) { (void)t; }
