/* SPDX-License-Identifier: MIT */
/* Convolution over the last two axes of x[N, C, H, W]. One op does the work that depends on the
 * window: unfold (im2col), which lays every window out as a column, padded with a given value.
 * Convolution is then one matrix product of the weights with those columns (BLIS through matmul,
 * whose backward gives the weight's gradient, and the columns' gradient that unfold folds back:
 * col2im). conv1d is conv2d over a [N, C, 1, L] view. Pooling reads its windows in place
 * (ops/pool.c). Unfold's output is [N, C, kh, kw, OH, OW], the memory order of torch's
 * F.unfold, whose [N, C*kh*kw, OH*OW] is a reshape of it. */
#include <math.h>

#include "graph/internal.h"
#include "ops/custom.h"
#include "ops/ops.h"

typedef struct {
    int64_t k[2], stride[2], dil[2], pad_lo[2], pad_hi[2]; /* height, width */
    bool by_window; /* output [N, OH, OW, kh, kw, C] (a window a row: the convolution's), else torch's order */
} unfold_params;

/* The unfold node of x[N, C, H, W] (any strides) with the given window; NULL with a message
 * naming op (the public op the caller builds) if the window does not fit. */
static cg_tensor *unfold_node(cg_graph *g, const char *op, cg_tensor *x, const unfold_params *p) {
    if (!cgi_inputs_ok(g, op, 1, &x) || !cgi_expect_real(op, x, "x")) return NULL;
    if (x->ndim != 4) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s must be [N, C, H, W]", op, cgi_shp(x));
        return NULL;
    }
    int64_t shape[6] = {x->shape[0], x->shape[1], p->k[0], p->k[1], 0, 0}, out[2];
    for (int d = 0; d < 2; d++) {
        const int64_t span = p->dil[d] * (p->k[d] - 1) + 1, padded = x->shape[2 + d] + p->pad_lo[d] + p->pad_hi[d];
        if (p->k[d] < 1 || p->stride[d] < 1 || p->dil[d] < 1 || p->pad_lo[d] < 0 || p->pad_hi[d] < 0 || padded < span) {
            cgi_fail(CG_ERR_SHAPE, "[%s] x%s, %s window %lld (stride %lld, dilation %lld, padding %lld+%lld): need a "
                     "positive kernel, stride and dilation, padding >= 0, and a window no wider than the padded input",
                     op, cgi_shp(x), d ? "width" : "height", (long long)p->k[d], (long long)p->stride[d],
                     (long long)p->dil[d], (long long)p->pad_lo[d], (long long)p->pad_hi[d]);
            return NULL;
        }
        shape[4 + d] = out[d] = (padded - span) / p->stride[d] + 1;
    }
    if (p->by_window) {
        const int64_t c = shape[1];
        shape[1] = out[0], shape[2] = out[1], shape[3] = p->k[0], shape[4] = p->k[1], shape[5] = c;
    }
    unfold_params *kept = cgi_node_params(g, op, sizeof *kept);
    if (!kept) return NULL;
    *kept = *p;
    cg_tensor *t = cgi_node(g, CGI_OP_UNFOLD, CG_REAL, 6, shape, 1, &x);
    if (t) t->params = kept;
    return t;
}

/* For output row (n, c, i, j) and output column oh: the input row read, or -1 in the padding. */
static inline int64_t window_row(const unfold_params *p, int64_t i, int64_t oh, int64_t h) {
    const int64_t r = oh * p->stride[0] - p->pad_lo[0] + i * p->dil[0];
    return r >= 0 && r < h ? r : -1;
}

/* The output columns [*a, *b) of window column j that read inside x's width w (the rest read the
 * padding): col = ow * stride - pad + j * dil lies in [0, w). */
static inline void inside_cols(const unfold_params *p, int64_t j, int64_t ow_n, int64_t w, int64_t *a, int64_t *b) {
    const int64_t s = p->stride[1], first = j * p->dil[1] - p->pad_lo[1]; /* col of ow = 0 */
    int64_t lo = first >= 0 ? 0 : (-first + s - 1) / s, hi = first >= w ? 0 : (w - 1 - first) / s + 1;
    if (hi > ow_n) hi = ow_n;
    if (lo > hi) lo = hi;
    *a = lo, *b = hi;
}

/* Rows [lo, hi) of the unfold (each row one (n, c, i, j)): whole output rows (oh) of the window's
 * reads, the padding filled and the inside copied, contiguous when x's width stride and the
 * stride are 1 (the usual 3 x 3 "same" convolution). */
static void unfold_rows(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *x = t->src[0];
    const unfold_params *p = t->params;
    const int64_t C = t->shape[1], KH = t->shape[2], KW = t->shape[3], OH = t->shape[4], OW = t->shape[5],
                  H = x->shape[2], W = x->shape[3], sw = p->stride[1];
    const int64_t *xs = x->stride;
    const cg_real *X = x->data;
    for (int64_t row = lo; row < hi; row++) {
        const int64_t j = row % KW, i = row / KW % KH, c = row / (KW * KH) % C, n = row / (KW * KH * C);
        const cg_real *xc = X + n * xs[0] + c * xs[1];
        cg_real *y = (cg_real *)t->data + row * OH * OW;
        int64_t a, b;
        inside_cols(p, j, OW, W, &a, &b);
        const int64_t col0 = j * p->dil[1] - p->pad_lo[1]; /* col of ow = 0 */
        for (int64_t oh = 0; oh < OH; oh++, y += OW) {
            const int64_t r = window_row(p, i, oh, H);
            if (r < 0) {
                for (int64_t ow = 0; ow < OW; ow++) y[ow] = 0;
                continue;
            }
            const cg_real *xr = xc + r * xs[2] + col0 * xs[3];
            for (int64_t ow = 0; ow < a; ow++) y[ow] = 0;
            if (sw * xs[3] == 1)
                for (int64_t ow = a; ow < b; ow++) y[ow] = xr[ow];
            else
                for (int64_t ow = a; ow < b; ow++) y[ow] = xr[ow * sw * xs[3]];
            for (int64_t ow = b; ow < OW; ow++) y[ow] = 0;
        }
    }
}

/* Rows per piece of work: at least ~16k elements, so a piece outweighs handing it to a thread. */
static int64_t grain_of(int64_t per_item) { return per_item >= 16384 ? 1 : 16384 / (per_item > 0 ? per_item : 1); }

/* The convolution's layout, a window a row: rows [lo, hi) of windows' output rows (n, oh), each
 * OW windows of kh * kw * C written in order. Channels last, so that from a channels-last x
 * (conv's) each window element is a contiguous run of C values. */
static void unfold_window_rows(int64_t lo, int64_t hi, void *ctx) {
    const cg_tensor *t = ctx, *x = t->src[0];
    const unfold_params *p = t->params;
    const int64_t OH = t->shape[1], OW = t->shape[2], KH = t->shape[3], KW = t->shape[4], C = t->shape[5],
                  H = x->shape[2], W = x->shape[3];
    const int64_t *xs = x->stride;
    for (int64_t row = lo; row < hi; row++) {
        const int64_t n = row / OH, oh = row % OH;
        const cg_real *xn = (const cg_real *)x->data + n * xs[0];
        cg_real *y = (cg_real *)t->data + row * OW * KH * KW * C;
        for (int64_t ow = 0; ow < OW; ow++)
            for (int64_t i = 0; i < KH; i++) {
                const int64_t r = oh * p->stride[0] - p->pad_lo[0] + i * p->dil[0];
                for (int64_t j = 0; j < KW; j++, y += C) {
                    const int64_t col = ow * p->stride[1] - p->pad_lo[1] + j * p->dil[1];
                    if (r < 0 || r >= H || col < 0 || col >= W) {
                        for (int64_t c = 0; c < C; c++) y[c] = 0;
                        continue;
                    }
                    const cg_real *xe = xn + r * xs[2] + col * xs[3];
                    if (xs[1] == 1)
                        for (int64_t c = 0; c < C; c++) y[c] = xe[c];
                    else
                        for (int64_t c = 0; c < C; c++) y[c] = xe[c * xs[1]];
                }
            }
    }
}

cg_status cgi_fwd_unfold(cg_tensor *t) {
    const unfold_params *p = t->params;
    if (p->by_window) {
        const int64_t rows = t->shape[0] * t->shape[1], per_row = t->shape[2] * t->shape[3] * t->shape[4] * t->shape[5];
        cg_parallel_for(rows, grain_of(per_row), unfold_window_rows, t);
        return CG_OK;
    }
    const int64_t rows = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    cg_parallel_for(rows, grain_of(t->shape[4] * t->shape[5]), unfold_rows, t);
    return CG_OK;
}

/* col2im of planes [lo, hi) of x's gradient (each (n, c)): a plane sums its windows in a fixed
 * order, so overlapping windows add up the same way on any thread count. */
typedef struct {
    const cg_tensor *t;
    bool assign; /* this pass writes x's gradient first (cgi_grad_begin): each plane is zeroed here, in cache */
} fold_pass;

static void fold_planes(int64_t lo, int64_t hi, void *ctx) {
    const fold_pass *fp = ctx;
    const cg_tensor *t = fp->t;
    cg_tensor *x = t->src[0];
    const unfold_params *p = t->params;
    const int64_t C = t->shape[1], KH = t->shape[2], KW = t->shape[3], OH = t->shape[4], OW = t->shape[5],
                  H = x->shape[2], W = x->shape[3], sw = p->stride[1];
    const int64_t *xs = x->stride;
    for (int64_t plane = lo; plane < hi; plane++) {
        cg_real *dx = x->grad + plane / C * xs[0] + plane % C * xs[1];
        if (fp->assign)
            for (int64_t r = 0; r < H; r++)
                for (int64_t c = 0; c < W; c++) dx[r * xs[2] + c * xs[3]] = 0;
        for (int64_t ij = 0; ij < KH * KW; ij++) {
            const int64_t i = ij / KW, j = ij % KW, col0 = j * p->dil[1] - p->pad_lo[1];
            const cg_real *dy = (const cg_real *)t->grad + (plane * KH * KW + ij) * OH * OW;
            int64_t a, b;
            inside_cols(p, j, OW, W, &a, &b);
            for (int64_t oh = 0; oh < OH; oh++) {
                const int64_t r = window_row(p, i, oh, H);
                if (r < 0) continue;
                cg_real *dr = dx + r * xs[2] + col0 * xs[3];
                const cg_real *d = dy + oh * OW;
                if (sw * xs[3] == 1)
                    for (int64_t ow = a; ow < b; ow++) dr[ow] += d[ow];
                else
                    for (int64_t ow = a; ow < b; ow++) dr[ow * sw * xs[3]] += d[ow];
            }
        }
    }
}

/* col2im of the window-a-row layout, images [lo, hi): an image's gradient is one piece's, summed
 * over its windows in a fixed order (windows in order, a window's elements in order). */
static void fold_window_images(int64_t lo, int64_t hi, void *ctx) {
    const fold_pass *fp = ctx;
    const cg_tensor *t = fp->t;
    cg_tensor *x = t->src[0];
    const unfold_params *p = t->params;
    const int64_t OH = t->shape[1], OW = t->shape[2], KH = t->shape[3], KW = t->shape[4], C = t->shape[5],
                  H = x->shape[2], W = x->shape[3];
    const int64_t *xs = x->stride;
    for (int64_t n = lo; n < hi; n++) {
        cg_real *dxn = x->grad + n * xs[0];
        if (fp->assign)
            for (int64_t r = 0; r < H; r++)
                for (int64_t q = 0; q < W; q++)
                    for (int64_t c = 0; c < C; c++) dxn[c * xs[1] + r * xs[2] + q * xs[3]] = 0;
        const cg_real *d = (const cg_real *)t->grad + n * OH * OW * KH * KW * C;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                for (int64_t i = 0; i < KH; i++) {
                    const int64_t r = oh * p->stride[0] - p->pad_lo[0] + i * p->dil[0];
                    for (int64_t j = 0; j < KW; j++, d += C) {
                        const int64_t col = ow * p->stride[1] - p->pad_lo[1] + j * p->dil[1];
                        if (r < 0 || r >= H || col < 0 || col >= W) continue;
                        cg_real *dxe = dxn + r * xs[2] + col * xs[3];
                        if (xs[1] == 1)
                            for (int64_t c = 0; c < C; c++) dxe[c] += d[c];
                        else
                            for (int64_t c = 0; c < C; c++) dxe[c * xs[1]] += d[c];
                    }
                }
    }
}

void cgi_bwd_unfold(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (!x->requires_grad) return;
    const unfold_params *p = t->params;
    fold_pass fp = {t, cgi_grad_begin(x)};
    const int64_t per_plane = t->shape[2] * t->shape[3] * t->shape[4] * t->shape[5];
    if (p->by_window) /* per image: t->shape[1] * per_plane elements */
        cg_parallel_for(t->shape[0], grain_of(t->shape[1] * per_plane), fold_window_images, &fp);
    else
        cg_parallel_for(t->shape[0] * t->shape[1], grain_of(per_plane), fold_planes, &fp);
}

static inline int64_t or_default(int64_t v, int64_t d) { return v ? v : d; }

cg_tensor *cg_unfold(cg_graph *g, cg_tensor *x, int64_t kh, int64_t kw, const cg_conv_opts *opts) {
    const cg_conv_opts o = opts ? *opts : (cg_conv_opts){0};
    unfold_params p = {{kh, kw}, {or_default(o.stride[0], 1), or_default(o.stride[1], 1)},
                       {or_default(o.dilation[0], 1), or_default(o.dilation[1], 1)},
                       {o.padding[0], o.padding[1]}, {o.padding[0], o.padding[1]}, false};
    cg_tensor *t = unfold_node(g, "unfold", x, &p);
    if (!t) return NULL;
    const int64_t s[3] = {t->shape[0], t->shape[1] * kh * kw, t->shape[4] * t->shape[5]};
    return cg_reshape(g, t, 3, s);
}

/* y[N, O, OH, OW] = w[G, O/G, C/G*kh*kw] @ columns[N, G, C/G*kh*kw, OH*OW] + bias, for x[N, C, H, W]
 * and w[O, C/G, kh, kw]; messages show the caller's x0 and w0 (conv1d's, before their unsqueeze). */
static cg_tensor *conv(cg_graph *g, const char *op, cg_tensor *x, cg_tensor *w, cg_tensor *bias, unfold_params *p,
                       int64_t groups, bool relu, const cg_tensor *x0, const cg_tensor *w0) {
    const int64_t C = x->shape[1], O = w->shape[0];
    if (groups < 1 || C % groups || O % groups || w->shape[1] != C / groups ||
        (bias && (bias->ndim != 1 || bias->shape[0] != O))) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s, w%s, bias%s, groups %lld: need groups dividing C and O, w[O, C/groups, "
                 "kernel...] and bias[O]", op, cgi_shp(x0), cgi_shp(w0), bias ? cgi_shp(bias) : "(none)", (long long)groups);
        return NULL;
    }
    if (groups == 1) {
        /* windows as rows: y[N*OH*OW, O] = columns[N*OH*OW, C*kh*kw] @ w^T + bias, one product (and
         * one each for dx's columns and dw in backward, dw over the whole batch at once) with the
         * bias added inside it; y is then a [N, O, OH, OW] view of that NHWC result */
        p->by_window = true;
        const int nhwc[4] = {0, 2, 3, 1}, nchw[4] = {0, 3, 1, 2};
        cg_tensor *x_last = x->stride[1] == 1 || x->shape[1] == 1 ? x : cg_permute(g, cg_contiguous(g, cg_permute(g, x, nhwc)), nchw);
        cg_tensor *cols = unfold_node(g, op, x_last, p);
        if (!cols) return NULL;
        const int64_t N = x->shape[0], OH = cols->shape[1], OW = cols->shape[2], ck = C * p->k[0] * p->k[1];
        const int64_t cs[2] = {N * OH * OW, ck}, ws[2] = {O, ck}, ys[4] = {N, OH, OW, O};
        cg_tensor *w_last = cg_reshape(g, cg_contiguous(g, cg_permute(g, w, nhwc)), 2, ws); /* [O, kh, kw, C] */
        cg_tensor *y = cg_reshape(g, (relu ? cg_linear_relu : cg_linear)(g, cg_reshape(g, cols, 2, cs), w_last, bias), 4, ys);
        return y ? cg_permute(g, y, (const int[]){0, 3, 1, 2}) : NULL;
    }
    cg_tensor *cols = unfold_node(g, op, x, p);
    if (!cols) return NULL;
    const int64_t N = x->shape[0], OH = cols->shape[4], OW = cols->shape[5], ck = C / groups * p->k[0] * p->k[1];
    const int64_t cs[4] = {N, groups, ck, OH * OW}, ws[3] = {groups, O / groups, ck}, ys[4] = {N, O, OH, OW};
    cg_tensor *y = cg_reshape(g, cg_matmul(g, cg_reshape(g, w, 3, ws), cg_reshape(g, cols, 4, cs)), 4, ys);
    const int64_t bs[3] = {O, 1, 1};
    if (y && bias) y = cg_add(g, y, cg_reshape(g, bias, 3, bs));
    return y && relu ? cg_relu(g, y) : y;
}

static bool real_inputs(cg_graph *g, const char *op, cg_tensor *x, cg_tensor *w, cg_tensor *bias, int ndim) {
    cg_tensor *in[3] = {x, w, bias};
    if (!cgi_inputs_ok(g, op, bias ? 3 : 2, in) || !cgi_expect_real(op, x, "x") || !cgi_expect_real(op, w, "w") ||
        (bias && !cgi_expect_real(op, bias, "bias")))
        return false;
    if (x->ndim != ndim || w->ndim != ndim) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s and w%s must both have %d dims", op, cgi_shp(x), cgi_shp(w), ndim);
        return false;
    }
    return true;
}

cg_tensor *cg_conv2d(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, const cg_conv_opts *opts) {
    if (!real_inputs(g, "conv2d", x, w, bias, 4)) return NULL;
    const cg_conv_opts o = opts ? *opts : (cg_conv_opts){0};
    if (o.causal) {
        cgi_fail(CG_ERR_ARG, "[conv2d] x%s: causal padding is conv1d's", cgi_shp(x));
        return NULL;
    }
    unfold_params p = {{w->shape[2], w->shape[3]}, {or_default(o.stride[0], 1), or_default(o.stride[1], 1)},
                       {or_default(o.dilation[0], 1), or_default(o.dilation[1], 1)},
                       {o.padding[0], o.padding[1]}, {o.padding[0], o.padding[1]}, false};
    return conv(g, "conv2d", x, w, bias, &p, or_default(o.groups, 1), o.relu, x, w);
}

cg_tensor *cg_conv1d(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, const cg_conv_opts *opts) {
    if (!real_inputs(g, "conv1d", x, w, bias, 3)) return NULL;
    const cg_conv_opts o = opts ? *opts : (cg_conv_opts){0};
    const int64_t k = w->shape[2], dil = or_default(o.dilation[0], 1);
    if (o.causal && o.padding[0]) {
        cgi_fail(CG_ERR_ARG, "[conv1d] x%s: causal sets the padding itself, padding %lld given", cgi_shp(x),
                 (long long)o.padding[0]);
        return NULL;
    }
    const int64_t lo = o.causal ? dil * (k - 1) : o.padding[0], hi = o.causal ? 0 : o.padding[0];
    unfold_params p = {{1, k}, {1, or_default(o.stride[0], 1)}, {1, dil}, {0, lo}, {0, hi}, false};
    const int64_t ws[4] = {w->shape[0], w->shape[1], 1, k};
    cg_tensor *x4 = cg_unsqueeze(g, x, 2), *w4 = cg_reshape(g, w, 4, ws);
    if (!x4 || !w4) return NULL;
    cg_tensor *y = conv(g, "conv1d", x4, w4, bias, &p, or_default(o.groups, 1), o.relu, x, w);
    return y ? cg_squeeze(g, y, 2) : NULL;
}
