/* SPDX-License-Identifier: MIT */
/* Ops along one axis of a contiguous x read as [outer, n, inner] lanes: cumsum (forward or
 * reverse) and topk's indices. Each lane is one thread's, walked in index order, so results do
 * not depend on the thread count. iarg[0] axis, iarg[1] inner, iarg[2] cumsum's reverse flag or
 * topk's largest flag. */
#include "graph/internal.h"
#include "ops/ops.h"

static cg_tensor *lane_node(cg_graph *g, int op, cg_tensor *x, int axis, int64_t k, cg_dtype dt) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || !cgi_expect_real(nm, x, "x")) return NULL;
    const int a = cgi_axis(nm, x, axis);
    if (a < 0) return NULL;
    x = cg_contiguous(g, x);
    if (!x) return NULL;
    int64_t shape[CG_MAX_DIMS], inner = 1;
    for (int d = 0; d < x->ndim; d++) {
        shape[d] = d == a ? k : x->shape[d];
        if (d > a) inner *= x->shape[d];
    }
    cg_tensor *t = cgi_node(g, op, dt, x->ndim, shape, 1, &x);
    if (!t) return NULL;
    t->iarg[0] = a, t->iarg[1] = inner;
    return t;
}

/* ---- cumsum: y[j] = x[0] + ... + x[j] (reverse: x[j] + ... + x[n-1]), summed in double ---- */

cg_tensor *cg_cumsum(cg_graph *g, cg_tensor *x, int axis, bool reverse) {
    if (!cgi_inputs_ok(g, "cumsum", 1, &x)) return NULL;
    const int a = cgi_axis("cumsum", x, axis);
    if (a < 0) return NULL;
    cg_tensor *t = lane_node(g, CGI_OP_CUMSUM, x, a, x->shape[a], CG_REAL);
    if (t) t->iarg[2] = reverse;
    return t;
}

/* dst (+)= the running sum of src over each lane, from the lane's start or (reverse) its end. */
static void running_sums(const cg_tensor *t, const cg_real *src, cg_real *dst, bool reverse, bool accumulate) {
    const int64_t n = t->shape[t->iarg[0]], inner = t->iarg[1], lanes = cgi_numel(t->ndim, t->shape) / (n ? n : 1);
    CGI_PAR_FOR(lanes * n,
    for (int64_t l = 0; l < (n ? lanes : 0); l++) {
        const int64_t b0 = (l / inner) * n * inner + l % inner;
        double s = 0;
        for (int64_t q = 0; q < n; q++) {
            const int64_t j = reverse ? n - 1 - q : q, at = b0 + j * inner;
            s += (double)src[at];
            if (accumulate) dst[at] += (cg_real)s;
            else dst[at] = (cg_real)s;
        }
    });
}

cg_status cgi_fwd_cumsum(cg_tensor *t) {
    running_sums(t, t->src[0]->data, t->data, t->iarg[2], false);
    return CG_OK;
}

/* The gradient of a forward running sum is the reverse running sum of dy, and the other way. */
void cgi_bwd_cumsum(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) running_sums(t, t->grad, x->grad, !t->iarg[2], true);
}

/* ---- topk: int32 positions of the k largest (or smallest) per lane, best first ---- */

/* Whether element (va, ia) ranks before (vb, ib): NaN counts as larger than any number, as in
 * torch; equal values rank by lower index. */
static inline bool ranks_before(double va, int64_t ia, double vb, int64_t ib, bool largest) {
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return largest ? na : nb;
    if (!na && va != vb) return largest ? va > vb : va < vb;
    return ia < ib;
}

/* Sifts slot s of a heap of m indices (slot i at h[i * inner]) down; the root is the worst-ranked. */
static void sift_down(int32_t *h, int64_t inner, int64_t m, int64_t s, const cg_real *x, int64_t step, bool largest) {
    for (;;) {
        int64_t w = s;
        const int64_t l = 2 * s + 1, r = l + 1;
        if (l < m && ranks_before(x[h[w * inner] * step], h[w * inner], x[h[l * inner] * step], h[l * inner], largest)) w = l;
        if (r < m && ranks_before(x[h[w * inner] * step], h[w * inner], x[h[r * inner] * step], h[r * inner], largest)) w = r;
        if (w == s) return;
        const int32_t tmp = h[s * inner];
        h[s * inner] = h[w * inner], h[w * inner] = tmp;
        s = w;
    }
}

cg_status cg_topk(cg_graph *g, cg_tensor *x, int64_t k, int axis, bool largest, cg_tensor **values,
                  cg_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!cgi_inputs_ok(g, "topk", 1, &x) || !cgi_expect_real("topk", x, "x")) return cg_last_status();
    const int a = cgi_axis("topk", x, axis);
    if (a < 0) return CG_ERR_SHAPE;
    if (k < 0 || k > x->shape[a] || x->shape[a] > INT32_MAX)
        return cgi_fail(CG_ERR_SHAPE, "[topk] k = %lld for axis %d of x%s: need 0 <= k <= %lld", (long long)k, axis,
                        cgi_shp(x), (long long)x->shape[a]);
    cg_tensor *t = lane_node(g, CGI_OP_TOPK, x, a, k, CG_INT32);
    if (!t) return cg_last_status();
    t->iarg[2] = largest;
    t->requires_grad = false; /* positions carry no gradient; the values gather it */
    cg_tensor *v = values ? cg_gather(g, x, a, t) : NULL;
    if (values && !v) return cg_last_status();
    if (values) *values = v;
    if (indices) *indices = t;
    return CG_OK;
}

/* A heap of the k best seen so far kept in the output lane itself (root: the worst of them), then
 * heap-sorted in place: O(n log k) per lane and no scratch. */
cg_status cgi_fwd_topk(cg_tensor *t) {
    const cg_tensor *x = t->src[0];
    const int a = (int)t->iarg[0];
    const int64_t n = x->shape[a], k = t->shape[a], inner = t->iarg[1];
    const int64_t lanes = k ? cgi_numel(t->ndim, t->shape) / k : 0;
    const bool largest = t->iarg[2];
    const cg_real *X = x->data;
    int32_t *Y = t->data;
    CGI_PAR_FOR(lanes * n,
    for (int64_t l = 0; l < lanes; l++) {
        const cg_real *xl = X + (l / inner) * n * inner + l % inner;
        int32_t *h = Y + (l / inner) * k * inner + l % inner;
        for (int64_t j = 0; j < n; j++) {
            if (j < k) { /* grow the heap: put j at the end and sift it up */
                int64_t s = j;
                h[s * inner] = (int32_t)j;
                while (s > 0) {
                    const int64_t p = (s - 1) / 2;
                    if (!ranks_before(xl[h[p * inner] * inner], h[p * inner], xl[h[s * inner] * inner], h[s * inner], largest))
                        break;
                    const int32_t tmp = h[s * inner];
                    h[s * inner] = h[p * inner], h[p * inner] = tmp;
                    s = p;
                }
            } else if (ranks_before(xl[j * inner], j, xl[h[0] * inner], h[0], largest)) {
                h[0] = (int32_t)j;
                sift_down(h, inner, k, 0, xl, inner, largest);
            }
        }
        for (int64_t m = k - 1; m > 0; m--) { /* the worst goes last, so the best ends first */
            const int32_t tmp = h[0];
            h[0] = h[m * inner], h[m * inner] = tmp;
            sift_down(h, inner, m, 0, xl, inner, largest);
        }
    });
    return CG_OK;
}
void cgi_bwd_topk(cg_tensor *t) { (void)t; }
