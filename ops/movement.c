/* SPDX-License-Identifier: MIT */
/* Views (reshape, permute, slice, detach, squeeze, unsqueeze) and the ops that copy: contiguous,
 * concat (and stack through it), pad.
 * A view shares its root's value and gradient storage, so its backward is nothing: gradients
 * written through it land in the root's gradient directly. */
#include "graph/internal.h"
#include "ops/ops.h"

cg_tensor *cg_contiguous(cg_graph *g, cg_tensor *x) {
    if (!cgi_inputs_ok(g, "contiguous", 1, &x)) return NULL;
    if (cgi_contiguous(x)) return x;
    if (!cgi_expect_real("contiguous", x, "x")) return NULL;
    return cgi_node(g, CGI_OP_COPY, CG_REAL, x->ndim, x->shape, 1, &x);
}

cg_status cgi_fwd_copy(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->dtype == CG_REAL) {
        cgi_copy(t->data, t->stride, x->data, x->stride, t->ndim, t->shape, 1.0, false);
        return CG_OK;
    }
    /* int32: the graph's dense copy of an expanded mask or index (graph.c), small; read through its strides */
    const int64_t n = cgi_numel(t->ndim, t->shape);
    for (int64_t i = 0; i < n; i++) ((int32_t *)t->data)[i] = ((const int32_t *)x->data)[cgi_elem_offset(x, i)];
    return CG_OK;
}

void cgi_bwd_copy(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    /* an expanded view's gradient: summed over its zero-stride axes, each element by one thread */
    if (cgi_broadcast_view(x)) cgi_unbroadcast_add(x, t->grad, t->ndim, t->shape, 1.0);
    else cgi_copy(x->grad, x->stride, t->grad, t->stride, t->ndim, t->shape, 1.0, true);
}

cg_tensor *cg_reshape(cg_graph *g, cg_tensor *x, int ndim, const int64_t *shape) {
    if (!cgi_inputs_ok(g, "reshape", 1, &x)) return NULL;
    if (ndim < 0 || ndim > CG_MAX_DIMS || (ndim > 0 && !shape)) {
        cgi_fail(CG_ERR_ARG, "[reshape] x%s: bad target of %d dims", cgi_shp(x), ndim);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS], known = 1, n = cgi_numel(x->ndim, x->shape);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1 && infer < 0) infer = i;
        else if (s[i] < 0) {
            cgi_fail(CG_ERR_SHAPE, "[reshape] x%s to %s: bad size", cgi_shp(x), cgi_dims(ndim, shape));
            return NULL;
        } else known *= s[i];
    }
    if (infer >= 0) s[infer] = known ? n / known : 0;
    if (cgi_numel(ndim, s) != n) {
        cgi_fail(CG_ERR_SHAPE, "[reshape] x%s (%lld elements) to %s", cgi_shp(x), (long long)n,
                 cgi_dims(ndim, shape));
        return NULL;
    }
    if (!cgi_contiguous(x)) x = cg_contiguous(g, x);
    if (!x) return NULL;
    int64_t st[CG_MAX_DIMS];
    cgi_contig_strides(ndim, s, st);
    return cgi_view(g, CGI_OP_RESHAPE, x, ndim, s, st, x->offset);
}

cg_tensor *cg_permute(cg_graph *g, cg_tensor *x, const int *perm) {
    if (!cgi_inputs_ok(g, "permute", 1, &x)) return NULL;
    if (!perm) {
        cgi_fail(CG_ERR_ARG, "[permute] perm is NULL for x%s", cgi_shp(x));
        return NULL;
    }
    int64_t s[CG_MAX_DIMS], st[CG_MAX_DIMS];
    unsigned seen = 0;
    for (int i = 0; i < x->ndim; i++) {
        int p = perm[i] < 0 ? perm[i] + x->ndim : perm[i];
        if (p < 0 || p >= x->ndim || (seen & (1u << p))) {
            cgi_fail(CG_ERR_SHAPE, "[permute] x%s: perm[%d] = %d is not a fresh axis", cgi_shp(x), i, perm[i]);
            return NULL;
        }
        seen |= 1u << p;
        s[i] = x->shape[p];
        st[i] = x->stride[p];
    }
    return cgi_view(g, CGI_OP_PERMUTE, x, x->ndim, s, st, x->offset);
}

cg_tensor *cg_transpose(cg_graph *g, cg_tensor *x, int a0, int a1) {
    if (!cgi_inputs_ok(g, "transpose", 1, &x)) return NULL;
    int p0 = cgi_axis("transpose", x, a0), p1 = p0 < 0 ? -1 : cgi_axis("transpose", x, a1);
    if (p0 < 0 || p1 < 0) return NULL;
    int perm[CG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[p0] = p1;
    perm[p1] = p0;
    return cg_permute(g, x, perm);
}

cg_tensor *cg_slice(cg_graph *g, cg_tensor *x, int axis, int64_t start, int64_t end) {
    if (!cgi_inputs_ok(g, "slice", 1, &x)) return NULL;
    int a = cgi_axis("slice", x, axis);
    if (a < 0) return NULL;
    int64_t n = x->shape[a], s0 = start < 0 ? start + n : start, s1 = end < 0 ? end + n : end;
    if (s0 < 0 || s1 > n || s0 > s1) {
        cgi_fail(CG_ERR_SHAPE, "[slice] x%s axis %d: [%lld, %lld) out of range", cgi_shp(x), axis,
                 (long long)start, (long long)end);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS];
    memcpy(s, x->shape, sizeof s);
    s[a] = s1 - s0;
    return cgi_view(g, CGI_OP_SLICE, x, x->ndim, s, x->stride, x->offset + s0 * x->stride[a]);
}

cg_status cg_split(cg_graph *g, cg_tensor *x, int axis, int n, const int64_t *sizes, cg_tensor **out) {
    if (!out || n <= 0) return cgi_fail(CG_ERR_ARG, "[split] need n > 0 outputs, got %d", n);
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (!cgi_inputs_ok(g, "split", 1, &x)) return CG_ERR_ARG;
    int a = cgi_axis("split", x, axis);
    if (a < 0) return CG_ERR_SHAPE;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += sizes ? sizes[i] : x->shape[a] / n;
    if (total != x->shape[a] || (!sizes && x->shape[a] % n))
        return cgi_fail(CG_ERR_SHAPE, "[split] x%s axis %d of %lld into %d parts that do not add up", cgi_shp(x),
                        axis, (long long)x->shape[a], n);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = sizes ? sizes[i] : x->shape[a] / n;
        out[i] = cg_slice(g, x, a, at, at + len);
        if (!out[i]) return CG_ERR_SHAPE;
        at += len;
    }
    return CG_OK;
}

cg_tensor *cg_detach(cg_graph *g, cg_tensor *x) {
    if (!cgi_inputs_ok(g, "detach", 1, &x)) return NULL;
    cg_tensor *t = cgi_view(g, CGI_OP_DETACH, x, x->ndim, x->shape, x->stride, x->offset);
    if (t) t->requires_grad = false;
    return t;
}

cg_tensor *cg_split_heads(cg_graph *g, cg_tensor *x, int heads) {
    if (!cgi_inputs_ok(g, "split_heads", 1, &x)) return NULL;
    if (x->ndim != 3 || heads <= 0 || x->shape[2] % heads) {
        cgi_fail(CG_ERR_SHAPE, "[split_heads] x%s must be [B, T, H*D] with H = %d dividing the last dim",
                 cgi_shp(x), heads);
        return NULL;
    }
    /* [B, T, H*D] -> [B, T, H, D] -> [B, H, T, D], both views when the last dim is dense. */
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2] / heads;
    if (x->stride[2] != 1) x = cg_contiguous(g, x);
    if (!x) return NULL;
    int64_t s[4] = {B, heads, T, D}, st[4] = {x->stride[0], D, x->stride[1], 1};
    return cgi_view(g, CGI_OP_PERMUTE, x, 4, s, st, x->offset);
}

cg_tensor *cg_merge_heads(cg_graph *g, cg_tensor *x) {
    if (!cgi_inputs_ok(g, "merge_heads", 1, &x)) return NULL;
    if (x->ndim != 4) {
        cgi_fail(CG_ERR_SHAPE, "[merge_heads] x%s must be [B, H, T, D]", cgi_shp(x));
        return NULL;
    }
    int perm[4] = {0, 2, 1, 3};
    cg_tensor *t = cg_contiguous(g, cg_permute(g, x, perm));
    int64_t s[3] = {x->shape[0], x->shape[2], x->shape[1] * x->shape[3]};
    return cg_reshape(g, t, 3, s);
}

/* ---- concat: iarg[0] = axis ---- */

cg_tensor *cg_concat(cg_graph *g, int n, cg_tensor *const *xs, int axis) {
    if (n <= 0 || !xs) {
        cgi_fail(CG_ERR_ARG, "[concat] need at least one input, got %d", n);
        return NULL;
    }
    if (!cgi_inputs_ok(g, "concat", n, xs)) return NULL;
    int a = cgi_axis("concat", xs[0], axis);
    if (a < 0) return NULL;
    int64_t s[CG_MAX_DIMS];
    memcpy(s, xs[0]->shape, sizeof s);
    s[a] = 0;
    for (int i = 0; i < n; i++) {
        if (!cgi_expect_real("concat", xs[i], "input")) return NULL;
        bool ok = xs[i]->ndim == xs[0]->ndim;
        for (int d = 0; ok && d < xs[0]->ndim; d++) ok = d == a || xs[i]->shape[d] == xs[0]->shape[d];
        if (!ok) {
            cgi_fail(CG_ERR_SHAPE, "[concat] axis %d: input %d%s does not match input 0%s", axis, i,
                     cgi_shp(xs[i]), cgi_shp(xs[0]));
            return NULL;
        }
        s[a] += xs[i]->shape[a];
    }
    cg_tensor *t = cgi_node(g, CGI_OP_CONCAT, CG_REAL, xs[0]->ndim, s, n, xs);
    if (t) t->iarg[0] = a;
    return t;
}

static void concat_walk(cg_tensor *t, bool backward) {
    int a = (int)t->iarg[0];
    int64_t at = 0;
    for (int i = 0; i < t->nsrc; i++) {
        cg_tensor *x = t->src[i];
        cg_real *part = (cg_real *)(backward ? (void *)t->grad : t->data) + at * t->stride[a];
        if (!backward) cgi_copy(part, t->stride, x->data, x->stride, x->ndim, x->shape, 1.0, false);
        else if (x->requires_grad) cgi_copy(x->grad, x->stride, part, t->stride, x->ndim, x->shape, 1.0, true);
        at += x->shape[a];
    }
}

cg_status cgi_fwd_concat(cg_tensor *t) {
    concat_walk(t, false);
    return CG_OK;
}
void cgi_bwd_concat(cg_tensor *t) { concat_walk(t, true); }

/* ---- append_into: iarg[0] = axis, iarg[1] = at, or src[2] holds it at run time ---- */

/* With a run-time offset (at_t) the result is all of buf: how much of it holds data is known only when
 * the graph runs, and the reader (attention's past) is told the same way. */
static cg_tensor *append_into(cg_graph *g, cg_tensor *buf, int64_t at, cg_tensor *at_t, cg_tensor *x, int axis) {
    cg_tensor *in[3] = {buf, x, at_t};
    if (!cgi_inputs_ok(g, "append_into", at_t ? 3 : 2, in)) return NULL;
    if (!cgi_expect_real("append_into", buf, "buf") || !cgi_expect_real("append_into", x, "x")) return NULL;
    if (buf->op != CGI_OP_INPUT) {
        cgi_fail(CG_ERR_ARG, "[append_into] buf%s must be an input leaf (cg_input or cg_wrap), not %s", cgi_shp(buf),
                 cgi_ops[buf->op].name);
        return NULL;
    }
    if (buf->requires_grad || x->requires_grad) {
        cgi_fail(CG_ERR_ARG, "[append_into] buf%s and x%s must not require a gradient: it writes in place",
                 cgi_shp(buf), cgi_shp(x));
        return NULL;
    }
    if (at_t && (at_t->dtype != CG_INT32 || cgi_numel(at_t->ndim, at_t->shape) != 1)) {
        cgi_fail(CG_ERR_ARG, "[append_into] at%s must be one int32", cgi_shp(at_t));
        return NULL;
    }
    int a = cgi_axis("append_into", buf, axis);
    if (a < 0) return NULL;
    bool ok = x->ndim == buf->ndim && at >= 0;
    for (int d = 0; ok && d < buf->ndim; d++) ok = d == a || x->shape[d] == buf->shape[d];
    if (!ok || at + x->shape[a] > buf->shape[a]) {
        cgi_fail(CG_ERR_SHAPE, "[append_into] x%s at %lld along axis %d does not fit buf%s", cgi_shp(x), (long long)at,
                 axis, cgi_shp(buf));
        return NULL;
    }
    int64_t s[CG_MAX_DIMS];
    memcpy(s, buf->shape, sizeof s);
    if (!at_t) s[a] = at + x->shape[a];
    cg_tensor *t = cgi_node(g, CGI_OP_APPEND_INTO, CG_REAL, buf->ndim, s, at_t ? 3 : 2, in);
    if (!t) return NULL;
    memcpy(t->stride, buf->stride, sizeof t->stride);
    t->data = buf->data; /* before any run, so views of it resolve like views of buf */
    t->iarg[0] = a;
    t->iarg[1] = at;
    return t;
}

cg_tensor *cg_append_into(cg_graph *g, cg_tensor *buf, int64_t at, cg_tensor *x, int axis) {
    return append_into(g, buf, at, NULL, x, axis);
}

cg_tensor *cg_append_into_at(cg_graph *g, cg_tensor *buf, cg_tensor *at, cg_tensor *x, int axis) {
    if (!cgi_inputs_ok(g, "append_into", 1, &at)) return NULL; /* names a NULL at */
    return append_into(g, buf, 0, at, x, axis);
}

cg_status cgi_fwd_append_into(cg_tensor *t) {
    cg_tensor *buf = t->src[0], *x = t->src[1];
    const int a = (int)t->iarg[0];
    const int64_t at = t->nsrc > 2 ? *(const int32_t *)t->src[2]->data : t->iarg[1];
    if (at < 0 || at + x->shape[a] > buf->shape[a])
        return cgi_fail(CG_ERR_RANGE, "[append_into] x%s at %lld along axis %d does not fit buf%s", cgi_shp(x),
                        (long long)at, a, cgi_shp(buf));
    cgi_copy((cg_real *)buf->data + at * buf->stride[a], buf->stride, x->data, x->stride, x->ndim, x->shape, 1.0,
             false);
    return CG_OK;
}

void cgi_bwd_append_into(cg_tensor *t) { (void)t; /* refused at build: nothing requires a gradient */ }

/* ---- squeeze, unsqueeze: views that drop or add an axis of size 1, any strides; stack ---- */

cg_tensor *cg_unsqueeze(cg_graph *g, cg_tensor *x, int axis) {
    if (!cgi_inputs_ok(g, "unsqueeze", 1, &x)) return NULL;
    const int a = axis < 0 ? axis + x->ndim + 1 : axis;
    if (a < 0 || a > x->ndim || x->ndim >= CG_MAX_DIMS) {
        cgi_fail(CG_ERR_SHAPE, "[unsqueeze] x%s: axis %d is not in [%d, %d] or the result has over %d dims",
                 cgi_shp(x), axis, -x->ndim - 1, x->ndim, CG_MAX_DIMS);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS], st[CG_MAX_DIMS];
    for (int d = 0, k = 0; d <= x->ndim; d++) {
        if (d == a) { /* any stride serves a size-1 axis: the next one's keeps it contiguous-looking */
            s[d] = 1;
            st[d] = a < x->ndim ? x->stride[a] * x->shape[a] : 1;
        } else s[d] = x->shape[k], st[d] = x->stride[k], k++;
    }
    return cgi_view(g, CGI_OP_RESHAPE, x, x->ndim + 1, s, st, x->offset);
}

cg_tensor *cg_squeeze(cg_graph *g, cg_tensor *x, int axis) {
    if (!cgi_inputs_ok(g, "squeeze", 1, &x)) return NULL;
    const int a = cgi_axis("squeeze", x, axis);
    if (a < 0) return NULL;
    if (x->shape[a] != 1) {
        cgi_fail(CG_ERR_SHAPE, "[squeeze] x%s: axis %d has size %lld, not 1", cgi_shp(x), axis, (long long)x->shape[a]);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS], st[CG_MAX_DIMS];
    for (int d = 0, k = 0; d < x->ndim; d++)
        if (d != a) s[k] = x->shape[d], st[k] = x->stride[d], k++;
    return cgi_view(g, CGI_OP_RESHAPE, x, x->ndim - 1, s, st, x->offset);
}

cg_tensor *cg_stack(cg_graph *g, int n, cg_tensor *const *xs, int axis) {
    if (n <= 0 || !xs || n > 4096) {
        cgi_fail(CG_ERR_ARG, "[stack] need 1 to 4096 inputs, got %d", n);
        return NULL;
    }
    if (!cgi_inputs_ok(g, "stack", n, xs)) return NULL;
    for (int i = 1; i < n; i++) {
        bool same = xs[i]->ndim == xs[0]->ndim;
        for (int d = 0; same && d < xs[0]->ndim; d++) same = xs[i]->shape[d] == xs[0]->shape[d];
        if (!same) {
            cgi_fail(CG_ERR_SHAPE, "[stack] input %d%s differs from input 0%s", i, cgi_shp(xs[i]), cgi_shp(xs[0]));
            return NULL;
        }
    }
    cg_tensor *u[4096];
    for (int i = 0; i < n; i++)
        if (!(u[i] = cg_unsqueeze(g, xs[i], axis))) return NULL;
    return cg_concat(g, n, u, axis < 0 ? axis + xs[0]->ndim + 1 : axis);
}

/* ---- pad: a constant border; iarg[0] = where x's first element lands in the output ---- */

cg_tensor *cg_pad(cg_graph *g, cg_tensor *x, const int64_t *before, const int64_t *after, double value) {
    if (!cgi_inputs_ok(g, "pad", 1, &x) || !cgi_expect_real("pad", x, "x")) return NULL;
    int64_t s[CG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) {
        const int64_t lo = before ? before[d] : 0, hi = after ? after[d] : 0;
        if (lo < 0 || hi < 0) {
            cgi_fail(CG_ERR_SHAPE, "[pad] x%s axis %d: pads %lld and %lld must be >= 0 (slice to crop)", cgi_shp(x), d,
                     (long long)lo, (long long)hi);
            return NULL;
        }
        s[d] = x->shape[d] + lo + hi;
    }
    cg_tensor *t = cgi_node(g, CGI_OP_PAD, CG_REAL, x->ndim, s, 1, &x);
    if (!t) return NULL;
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += (before ? before[d] : 0) * t->stride[d];
    t->iarg[0] = off;
    t->farg[0] = value;
    return t;
}

cg_status cgi_fwd_pad(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    cg_real *y = t->data;
    const cg_real v = (cg_real)t->farg[0];
    const int64_t n = cgi_numel(t->ndim, t->shape);
    for (int64_t i = 0; i < n; i++) y[i] = v;
    cgi_copy(y + t->iarg[0], t->stride, x->data, x->stride, x->ndim, x->shape, 1.0, false);
    return CG_OK;
}

void cgi_bwd_pad(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) cgi_copy(x->grad, x->stride, t->grad + t->iarg[0], t->stride, x->ndim, x->shape, 1.0, true);
}

/* ---- expand (torch's expand / broadcast_to): a view of x with stride 0 on every repeated axis and on
 * the new leading ones, so nothing is copied and no memory is spent on the repeats. Its gradient is
 * its root's, read through the same zero strides: the ops that take such a view in place
 * (cgi_op_reads_broadcast: the binary elementwise ops and the copy) sum the gradient over those axes
 * in one deterministic reduction, and every other op is handed a contiguous copy by the graph
 * (graph.c), whose backward does the same. ---- */

cg_tensor *cg_expand(cg_graph *g, cg_tensor *x, int ndim, const int64_t *shape) {
    if (!cgi_inputs_ok(g, "expand", 1, &x)) return NULL;
    if (ndim < x->ndim || ndim > CG_MAX_DIMS || (ndim > 0 && !shape)) {
        cgi_fail(CG_ERR_SHAPE, "[expand] x%s to %d dims: need between %d and %d", cgi_shp(x), ndim, x->ndim, CG_MAX_DIMS);
        return NULL;
    }
    int64_t s[CG_MAX_DIMS], st[CG_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        const int xd = d - (ndim - x->ndim);
        const int64_t have = xd >= 0 ? x->shape[xd] : 1;
        s[d] = shape[d] == -1 && xd >= 0 ? have : shape[d];
        if (s[d] < 0 || (have != 1 && have != s[d])) {
            cgi_fail(CG_ERR_SHAPE, "[expand] x%s to %s: axis %d of size %lld cannot become %lld (only size-1 axes repeat; "
                     "-1 keeps an existing axis)", cgi_shp(x), cgi_dims(ndim, shape), d, (long long)have, (long long)shape[d]);
            return NULL;
        }
        st[d] = xd < 0 || (have == 1 && s[d] != 1) ? 0 : x->stride[xd];
    }
    return cgi_view(g, CGI_OP_EXPAND, x, ndim, s, st, x->offset);
}
