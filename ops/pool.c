/* SPDX-License-Identifier: MIT */
/* Pooling over the last two axes of x[N, C, H, W]: max_pool2d and avg_pool2d, direct kernels that
 * read each window in place. (As an unfold of the windows and a reduction over them, pooling wrote
 * and read back a copy of x as large as x, and was 27% of a small CNN's training step.) Each
 * (n, c) plane is one piece of work, run on cgrad's threads through cg_parallel_for: its output
 * and its gradient are written by one thread in a fixed order, so any thread count gives the same
 * bits. Max pooling follows torch's rule: a window's first maximum in row-major order is picked
 * (a NaN is always picked, so it propagates); forward keeps its place in the window (int32, in
 * aux), and backward adds each output's gradient there. */
#include <math.h>
#include <string.h>

#include "graph/internal.h"
#include "ops/custom.h"
#include "ops/ops.h"

typedef struct {
    int64_t k[2], stride[2], pad[2]; /* height, width */
} pool_params;

static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

static cg_tensor *pool(cg_graph *g, const char *op, int opcode, cg_tensor *x, const int64_t *kernel,
                       const int64_t *stride, const int64_t *padding) {
    if (!cgi_inputs_ok(g, op, 1, &x) || !cgi_expect_real(op, x, "x")) return NULL;
    if (!kernel) {
        cgi_fail(CG_ERR_ARG, "[%s] x%s: kernel is NULL", op, cgi_shp(x));
        return NULL;
    }
    if (x->ndim != 4) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s must be [N, C, H, W]", op, cgi_shp(x));
        return NULL;
    }
    pool_params p;
    int64_t shape[4] = {x->shape[0], x->shape[1], 0, 0};
    for (int d = 0; d < 2; d++) {
        p.k[d] = kernel[d];
        p.stride[d] = stride && stride[d] ? stride[d] : kernel[d];
        p.pad[d] = padding ? padding[d] : 0;
        const int64_t padded = x->shape[2 + d] + 2 * p.pad[d];
        if (p.k[d] < 1 || p.stride[d] < 1 || p.pad[d] < 0 || padded < p.k[d]) {
            cgi_fail(CG_ERR_SHAPE, "[%s] x%s, %s window %lld (stride %lld, padding %lld): need a positive kernel and "
                     "stride, padding >= 0, and a window no wider than the padded input",
                     op, cgi_shp(x), d ? "width" : "height", (long long)p.k[d], (long long)p.stride[d], (long long)p.pad[d]);
            return NULL;
        }
        if (2 * p.pad[d] > p.k[d]) { /* else a window could hold only padding */
            cgi_fail(CG_ERR_ARG, "[%s] x%s: padding %lld is more than half the kernel %lld", op, cgi_shp(x),
                     (long long)p.pad[d], (long long)p.k[d]);
            return NULL;
        }
        shape[2 + d] = (padded - p.k[d]) / p.stride[d] + 1;
    }
    pool_params *kept = cgi_node_params(g, op, sizeof *kept);
    if (!kept) return NULL;
    *kept = p;
    cg_tensor *t = cgi_node(g, opcode, CG_REAL, 4, shape, 1, &x);
    if (!t) return NULL;
    t->params = kept;
    if (opcode == CGI_OP_MAX_POOL2D) t->aux_bytes = (size_t)cgi_numel(4, shape) * sizeof(int32_t);
    return t;
}

cg_tensor *cg_max_pool2d(cg_graph *g, cg_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding) {
    return pool(g, "max_pool2d", CGI_OP_MAX_POOL2D, x, kernel, stride, padding);
}
cg_tensor *cg_avg_pool2d(cg_graph *g, cg_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding) {
    return pool(g, "avg_pool2d", CGI_OP_AVG_POOL2D, x, kernel, stride, padding);
}

/* One pass over planes [lo, hi) of a pool node; dx is x's gradient (backward) or NULL (forward). */
typedef struct {
    const cg_tensor *t;
    bool assign; /* backward: this pass writes dx first (cgi_grad_begin), so each plane is zeroed here */
} pool_pass;

/* Geometry of a pool node's planes, read once per piece. */
typedef struct {
    int64_t C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, xs[4];
} pool_geo;

static pool_geo geometry(const cg_tensor *t) {
    const pool_params *p = t->params;
    const cg_tensor *x = t->src[0];
    return (pool_geo){x->shape[1], x->shape[2], x->shape[3], t->shape[2], t->shape[3], p->k[0], p->k[1],
                      p->stride[0], p->stride[1], p->pad[0], p->pad[1],
                      {x->stride[0], x->stride[1], x->stride[2], x->stride[3]}};
}

/* Window (oh, ow)'s maximum, and its place i * kw + j in the window: torch's rule, the first maximum
 * in row-major order, except that a NaN replaces it; all -inf gives the first element. */
static inline cg_real window_max(const cg_real *xp, const pool_geo *q, int64_t oh, int64_t ow, int32_t *at) {
    const int64_t h0 = oh * q->sh - q->ph, w0 = ow * q->sw - q->pw;
    const int64_t hs = imax(h0, 0), he = imin(h0 + q->kh, q->H), ws = imax(w0, 0), we = imin(w0 + q->kw, q->W);
    cg_real best = xp[hs * q->xs[2] + ws * q->xs[3]]; /* as a start of -inf: taken unless it is -inf */
    int32_t best_at = (int32_t)((hs - h0) * q->kw + ws - w0);
    for (int64_t r = hs; r < he; r++)
        for (int64_t c = ws; c < we; c++) {
            const cg_real v = xp[r * q->xs[2] + c * q->xs[3]];
            if (v > best || v != v) best = v, best_at = (int32_t)((r - h0) * q->kw + c - w0);
        }
    *at = best_at;
    return best;
}

/* take ? v : old by masks: rows of a few outputs run as scalar code, where a conditional on
 * random data compiles to a branch that mispredicts half the time. */
#ifdef CGRAD_DOUBLE
typedef uint64_t real_bits;
#else
typedef uint32_t real_bits;
#endif
static inline cg_real select_real(bool take, cg_real v, cg_real old) {
    real_bits vb, ob;
    memcpy(&vb, &v, sizeof vb);
    memcpy(&ob, &old, sizeof ob);
    const real_bits mask = (real_bits)0 - (real_bits)take, r = (vb & mask) | (ob & ~mask);
    cg_real out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* Outputs [a, b) of row oh whose windows lie inside the row's width: the running maximum kept in y
 * and its place in at, one window element at a time across the row, as selects over contiguous
 * outputs (vectorised; branches on random data mispredict half the time). xstep is sw * xs[3],
 * a constant 2 in the common 2 x 2 pooling of a contiguous x. */
static inline void row_max(const cg_real *xp, const pool_geo *q, int64_t oh, int64_t a, int64_t b, int64_t xstep,
                           cg_real *restrict y, int32_t *restrict at) {
    const int64_t h0 = oh * q->sh - q->ph, hs = imax(h0, 0), he = imin(h0 + q->kh, q->H), n = b - a;
    const int64_t w0 = a * q->sw - q->pw; /* the first window's first column */
    for (int64_t r = hs; r < he; r++)
        for (int64_t j = 0; j < q->kw; j++) {
            const cg_real *x = xp + r * q->xs[2] + (w0 + j) * q->xs[3];
            const int32_t place = (int32_t)((r - h0) * q->kw + j);
            if (r == hs && j == 0) {
                for (int64_t k = 0; k < n; k++) y[k] = x[k * xstep], at[k] = place;
                continue;
            }
            for (int64_t k = 0; k < n; k++) {
                const cg_real v = x[k * xstep];
                const bool take = (v > y[k]) | (v != v);
                y[k] = select_real(take, v, y[k]);
                at[k] = (int32_t)(take ? place : at[k]);
            }
        }
}

/* x's plane for flat plane index nc, and its offset inside x (data and gradient share strides). */
static inline int64_t plane_offset(const pool_geo *q, int64_t nc) { return nc / q->C * q->xs[0] + nc % q->C * q->xs[1]; }

/* Zeroes the plane at dx (strided), for a pass that assigns the gradient. */
static void zero_plane(cg_real *dx, const pool_geo *q) {
    for (int64_t r = 0; r < q->H; r++)
        for (int64_t c = 0; c < q->W; c++) dx[r * q->xs[2] + c * q->xs[3]] = 0;
}

/* The common 2 x 2, stride 2 pooling of rows with unit stride, for outputs [a, b) of a row: the
 * window's four elements folded in order (first maximum, or the last NaN) by selects. */
static inline void row_max_2x2(const cg_real *restrict x0, const cg_real *restrict x1, int64_t n,
                               cg_real *restrict y, int32_t *restrict at) {
    for (int64_t k = 0; k < n; k++) {
        /* (a, b) and (c, d) first, then the two: folding by "a later one wins if greater or NaN"
         * groups either way, and the halves do not wait for each other */
        const cg_real a = x0[2 * k], b = x0[2 * k + 1], c = x1[2 * k], d = x1[2 * k + 1];
        const bool tb = (b > a) | (b != b), td = (d > c) | (d != d);
        const cg_real ab = select_real(tb, b, a), cd = select_real(td, d, c);
        const bool tcd = (cd > ab) | (cd != cd);
        y[k] = select_real(tcd, cd, ab);
        at[k] = tcd ? 2 + td : tb;
    }
}

static void max_fwd_planes(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ((const pool_pass *)ctx)->t;
    const pool_geo q = geometry(t);
    const cg_real *X = t->src[0]->data;
    /* outputs [a, b) of a row have whole windows in width */
    const int64_t a = imin((q.pw + q.sw - 1) / q.sw, q.OW), b = imax(a, imin(q.OW, (q.W + q.pw - q.kw) / q.sw + 1));
    const int64_t xstep = q.sw * q.xs[3];
    for (int64_t nc = lo; nc < hi; nc++) {
        const cg_real *xp = X + plane_offset(&q, nc);
        for (int64_t oh = 0; oh < q.OH; oh++) {
            cg_real *y = (cg_real *)t->data + (nc * q.OH + oh) * q.OW;
            int32_t *at = (int32_t *)t->aux + (nc * q.OH + oh) * q.OW;
            for (int64_t ow = 0; ow < a; ow++) y[ow] = window_max(xp, &q, oh, ow, &at[ow]);
            const int64_t h0 = oh * q.sh - q.ph;
            if (xstep == 2 && q.kh == 2 && q.kw == 2 && h0 >= 0 && h0 + 1 < q.H)
                row_max_2x2(xp + h0 * q.xs[2] + (a * 2 - q.pw), xp + (h0 + 1) * q.xs[2] + (a * 2 - q.pw), b - a, y + a,
                            at + a);
            else if (xstep == 2)
                row_max(xp, &q, oh, a, b, 2, y + a, at + a);
            else
                row_max(xp, &q, oh, a, b, xstep, y + a, at + a);
            for (int64_t ow = b; ow < q.OW; ow++) y[ow] = window_max(xp, &q, oh, ow, &at[ow]);
        }
    }
}

static void max_bwd_planes(int64_t lo, int64_t hi, void *ctx) {
    const pool_pass *pp = ctx;
    const cg_tensor *t = pp->t;
    const pool_geo q = geometry(t);
    const cg_real *DY = t->grad;
    const int32_t *AT = t->aux;
    for (int64_t nc = lo; nc < hi; nc++) {
        cg_real *dx = t->src[0]->grad + plane_offset(&q, nc);
        const cg_real *dy = DY + nc * q.OH * q.OW;
        const int32_t *at = AT + nc * q.OH * q.OW;
        if (pp->assign) zero_plane(dx, &q);
        for (int64_t oh = 0; oh < q.OH; oh++)
            for (int64_t ow = 0; ow < q.OW; ow++) {
                const int64_t o = oh * q.OW + ow, i = at[o] / q.kw, j = at[o] % q.kw;
                dx[(oh * q.sh - q.ph + i) * q.xs[2] + (ow * q.sw - q.pw + j) * q.xs[3]] += dy[o];
            }
    }
}

/* The mean counts padding as zeros (count_include_pad): every window divides by kh * kw. */
static void avg_fwd_planes(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ((const pool_pass *)ctx)->t;
    const pool_geo q = geometry(t);
    const cg_real *X = t->src[0]->data, inv = (cg_real)(1.0 / (double)(q.kh * q.kw));
    for (int64_t nc = lo; nc < hi; nc++) {
        const cg_real *xp = X + plane_offset(&q, nc);
        cg_real *y = (cg_real *)t->data + nc * q.OH * q.OW;
        for (int64_t oh = 0; oh < q.OH; oh++) {
            const int64_t h0 = oh * q.sh - q.ph, hs = imax(h0, 0), he = imin(h0 + q.kh, q.H);
            for (int64_t ow = 0; ow < q.OW; ow++) {
                const int64_t w0 = ow * q.sw - q.pw, ws = imax(w0, 0), we = imin(w0 + q.kw, q.W);
                cg_real s = 0;
                for (int64_t r = hs; r < he; r++)
                    for (int64_t c = ws; c < we; c++) s += xp[r * q.xs[2] + c * q.xs[3]];
                y[oh * q.OW + ow] = s * inv;
            }
        }
    }
}

static void avg_bwd_planes(int64_t lo, int64_t hi, void *ctx) {
    const pool_pass *pp = ctx;
    const cg_tensor *t = pp->t;
    const pool_geo q = geometry(t);
    const cg_real *DY = t->grad, inv = (cg_real)(1.0 / (double)(q.kh * q.kw));
    for (int64_t nc = lo; nc < hi; nc++) {
        const int64_t off = plane_offset(&q, nc);
        const cg_real *dy = DY + nc * q.OH * q.OW;
        cg_real *dx = t->src[0]->grad + off;
        if (pp->assign) zero_plane(dx, &q);
        for (int64_t oh = 0; oh < q.OH; oh++) {
            const int64_t h0 = oh * q.sh - q.ph, hs = imax(h0, 0), he = imin(h0 + q.kh, q.H);
            for (int64_t ow = 0; ow < q.OW; ow++) {
                const int64_t w0 = ow * q.sw - q.pw, ws = imax(w0, 0), we = imin(w0 + q.kw, q.W);
                const cg_real g = dy[oh * q.OW + ow] * inv;
                for (int64_t r = hs; r < he; r++)
                    for (int64_t c = ws; c < we; c++) dx[r * q.xs[2] + c * q.xs[3]] += g;
            }
        }
    }
}

/* Planes per piece: at least ~16k elements of x, so a piece outweighs handing it to a thread. */
static int64_t plane_grain(const cg_tensor *x) {
    const int64_t plane = x->shape[2] * x->shape[3];
    return plane >= 16384 ? 1 : 16384 / (plane > 0 ? plane : 1);
}

static void run_planes(cg_tensor *t, bool backward, void (*body)(int64_t, int64_t, void *)) {
    cg_tensor *x = t->src[0];
    pool_pass pp = {t, backward && cgi_grad_begin(x)};
    cg_parallel_for(x->shape[0] * x->shape[1], plane_grain(x), body, &pp);
}

/* ---- max pooling of a channels-last x (stride 1 along C: a convolution's NHWC product seen as
 * NCHW), a window at a time across all channels, an image a piece ---- */

enum { LAST_MAX_C = 1024 }; /* channels kept on the stack; more go plane by plane */

/* 1 when v replaces the running maximum m (greater, or NaN): a sum, since GCC vectorises selects
 * on it but not on (v > m) | (v != v). */
#define TAKES(v, m) ((int32_t)((v) > (m)) + (int32_t)((v) != (v)))

static bool channels_last(const cg_tensor *x) { return x->stride[1] == 1 && x->shape[1] > 1 && x->shape[1] <= LAST_MAX_C; }

static void max_fwd_images_last(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ((const pool_pass *)ctx)->t;
    const pool_geo q = geometry(t);
    const int64_t C = q.C, P = q.OH * q.OW;
    cg_real best[LAST_MAX_C];
    int32_t place[LAST_MAX_C];
    for (int64_t n = lo; n < hi; n++) {
        const cg_real *xn = (const cg_real *)t->src[0]->data + n * q.xs[0];
        for (int64_t oh = 0; oh < q.OH; oh++)
            for (int64_t ow = 0; ow < q.OW; ow++) {
                const int64_t h0 = oh * q.sh - q.ph, w0 = ow * q.sw - q.pw;
                const int64_t hs = imax(h0, 0), he = imin(h0 + q.kh, q.H), ws = imax(w0, 0), we = imin(w0 + q.kw, q.W);
                for (int64_t r = hs; r < he; r++)
                    for (int64_t col = ws; col < we; col++) {
                        const cg_real *v = xn + r * q.xs[2] + col * q.xs[3];
                        const int32_t at = (int32_t)((r - h0) * q.kw + col - w0);
                        if (r == hs && col == ws) {
                            for (int64_t c = 0; c < C; c++) best[c] = v[c], place[c] = at;
                            continue;
                        }
                        for (int64_t c = 0; c < C; c++) {
                            const int32_t take = TAKES(v[c], best[c]);
                            best[c] = take ? v[c] : best[c];
                            place[c] = take ? at : place[c];
                        }
                    }
                cg_real *y = (cg_real *)t->data + n * C * P + oh * q.OW + ow;
                int32_t *a = (int32_t *)t->aux + n * C * P + oh * q.OW + ow;
                for (int64_t c = 0; c < C; c++) y[c * P] = best[c], a[c * P] = place[c];
            }
    }
}

static void max_bwd_images_last(int64_t lo, int64_t hi, void *ctx) {
    const pool_pass *pp = ctx;
    const cg_tensor *t = pp->t;
    const pool_geo q = geometry(t);
    const int64_t C = q.C, P = q.OH * q.OW;
    for (int64_t n = lo; n < hi; n++) {
        cg_real *dxn = t->src[0]->grad + n * q.xs[0];
        if (pp->assign)
            for (int64_t c = 0; c < C; c++) zero_plane(dxn + c, &q);
        const cg_real *dy = (const cg_real *)t->grad + n * C * P;
        const int32_t *at = (const int32_t *)t->aux + n * C * P;
        for (int64_t o = 0; o < P; o++) {
            const int64_t h0 = o / q.OW * q.sh - q.ph, w0 = o % q.OW * q.sw - q.pw;
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = at[c * P + o] / q.kw, j = at[c * P + o] % q.kw;
                dxn[c + (h0 + i) * q.xs[2] + (w0 + j) * q.xs[3]] += dy[c * P + o];
            }
        }
    }
}

static void run_images(cg_tensor *t, bool backward, void (*body)(int64_t, int64_t, void *)) {
    cg_tensor *x = t->src[0];
    pool_pass pp = {t, backward && cgi_grad_begin(x)};
    const int64_t image = x->shape[1] * x->shape[2] * x->shape[3];
    cg_parallel_for(x->shape[0], image >= 16384 ? 1 : 16384 / (image > 0 ? image : 1), body, &pp);
}

cg_status cgi_fwd_max_pool2d(cg_tensor *t) {
    if (channels_last(t->src[0])) run_images(t, false, max_fwd_images_last);
    else run_planes(t, false, max_fwd_planes);
    return CG_OK;
}

void cgi_bwd_max_pool2d(cg_tensor *t) {
    if (!t->src[0]->requires_grad) return;
    if (channels_last(t->src[0])) run_images(t, true, max_bwd_images_last);
    else run_planes(t, true, max_bwd_planes);
}

cg_status cgi_fwd_avg_pool2d(cg_tensor *t) {
    run_planes(t, false, avg_fwd_planes);
    return CG_OK;
}

void cgi_bwd_avg_pool2d(cg_tensor *t) {
    if (t->src[0]->requires_grad) run_planes(t, true, avg_bwd_planes);
}
