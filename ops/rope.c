/* SPDX-License-Identifier: MIT */
/* Rotary position embedding (RoPE, Su et al. 2021) over the last axis of x[..., T, D]: feature
 * pairs are rotated by angle (offset + t) * f_i, f_i = theta^(-2i / dims) as LLaMA's scaling
 * settings adjust it. Its table of cosines and sines (T x dims/2, in double precision) is made
 * once with the graph when the offset is fixed, shared by the nodes with the same one, else on each
 * forward into aux (with the unit-stride loop below, llama-tiny's rope forward went from 5.9 to 2.0
 * ms of CPU time a step, as fast as its backward); backward rotates
 * the gradient back by the same angles. x is read through its strides, so the q and k heads of a
 * packed QKV projection are rotated without a copy first; the output is contiguous.
 * iarg[0] rotated dims, iarg[1] interleaved, iarg[2] position offset, or src[1] (an int32) holds it at
 * run time (cg_rope_at: a replayed decode graph); params: rope_params. */
#include <math.h>
#include <string.h>

#include "graph/internal.h"
#include "ops/ops.h"

/* A rope node's settings: its table of cos and sin [T, dims/2] each when its offset is fixed (in
 * the graph's metadata, shared by the nodes with the same rows, frequencies and offset: a model's
 * q and k in every layer), else NULL and the table is made in aux on each forward; the frequencies. */
typedef struct {
    const cg_real *table;
    double f[];
} rope_params;

/* cos and sin of (off + p) f_i for p < T, i < half, in double precision, into C and C + T half. */
static void fill_table(cg_real *C, int64_t T, int64_t half, int64_t off, const double *f) {
    cg_real *S = C + T * half;
    for (int64_t p = 0; p < T; p++)
        for (int64_t i = 0; i < half; i++) {
            const double ang = (double)(off + p) * f[i];
            C[p * half + i] = (cg_real)cos(ang);
            S[p * half + i] = (cg_real)sin(ang);
        }
}

/* The table of an earlier rope node of g with the same rows, rotated dims, fixed offset and
 * frequencies as t, else NULL. */
static const cg_real *shared_table(const cg_graph *g, const cg_tensor *t) {
    const int nd = t->ndim;
    const rope_params *p = t->params;
    for (int i = g->n - 1; i >= 0; i--) {
        const cg_tensor *o = g->nodes[i];
        if (o == t || o->op != CGI_OP_ROPE || o->nsrc != 1 || o->iarg[0] != t->iarg[0] || o->iarg[2] != t->iarg[2] ||
            o->shape[o->ndim - 2] != t->shape[nd - 2])
            continue;
        const rope_params *q = o->params;
        if (q->table && !memcmp(q->f, p->f, (size_t)(t->iarg[0] / 2) * sizeof *p->f)) return q->table;
    }
    return NULL;
}

static cg_tensor *rope(cg_graph *g, cg_tensor *x, int64_t pos_offset, cg_tensor *at, const cg_rope_config *cfg) {
    cg_tensor *in[2] = {x, at};
    if (!cgi_inputs_ok(g, "rope", at ? 2 : 1, in) || !cgi_expect_real("rope", x, "x")) return NULL;
    if (at && (at->dtype != CG_INT32 || cgi_numel(at->ndim, at->shape) != 1)) {
        cgi_fail(CG_ERR_ARG, "[rope] x%s: offset%s must be one int32", cgi_shp(x), cgi_shp(at));
        return NULL;
    }
    const cg_rope_config def = {.theta = 10000.0};
    const cg_rope_config *c = cfg ? cfg : &def;
    const int64_t d = x->ndim >= 2 ? x->shape[x->ndim - 1] : 0, dims = c->dims ? c->dims : d;
    if (x->ndim < 2 || dims <= 0 || dims % 2 || dims > d) {
        cgi_fail(CG_ERR_SHAPE, "[rope] x%s must be [..., T, D] with an even number of rotated dims %lld <= D",
                 cgi_shp(x), (long long)dims);
        return NULL;
    }
    const bool l3 = c->llama3_factor != 0;
    if (!(c->theta > 1) || !(c->linear_factor >= 0) || pos_offset < 0 ||
        (l3 && !(c->llama3_factor >= 1 && c->llama3_high_freq_factor > c->llama3_low_freq_factor &&
                 c->llama3_low_freq_factor > 0 && c->llama3_original_context > 0))) {
        cgi_fail(CG_ERR_ARG,
                 "[rope] x%s: theta %g must be > 1, linear_factor %g >= 0, offset %lld >= 0; LLaMA 3 scaling "
                 "(factor %g) needs factor >= 1, 0 < low %g < high %g and an original context (%lld)",
                 cgi_shp(x), c->theta, c->linear_factor, (long long)pos_offset, c->llama3_factor,
                 c->llama3_low_freq_factor, c->llama3_high_freq_factor, (long long)c->llama3_original_context);
        return NULL;
    }
    rope_params *rp = cgi_node_params(g, "rope", sizeof *rp + (size_t)(dims / 2) * sizeof *rp->f);
    if (!rp) return NULL;
    double *f = rp->f;
    for (int64_t i = 0; i < dims / 2; i++) {
        double fi = pow(c->theta, -2.0 * (double)i / (double)dims);
        if (l3) { /* HF's "llama3" rope_type: long wavelengths slow down by factor, short ones stay */
            const double wl = 6.283185307179586 / fi, ctx = (double)c->llama3_original_context;
            const double lo = c->llama3_low_freq_factor, hi = c->llama3_high_freq_factor;
            if (wl > ctx / lo) fi /= c->llama3_factor;
            else if (wl >= ctx / hi) {
                const double s = (ctx / wl - lo) / (hi - lo);
                fi = (1 - s) * fi / c->llama3_factor + s * fi;
            }
        }
        f[i] = c->linear_factor > 0 ? fi / c->linear_factor : fi; /* linear: position / factor */
    }
    cg_tensor *t = cgi_node(g, CGI_OP_ROPE, CG_REAL, x->ndim, x->shape, at ? 2 : 1, in);
    if (!t) return NULL;
    t->params = rp;
    t->iarg[0] = dims;
    t->iarg[1] = c->interleaved;
    t->iarg[2] = pos_offset;
    const int64_t T = x->shape[x->ndim - 2];
    if (at) {
        t->aux_bytes = (size_t)(T * dims) * sizeof(cg_real); /* cos, sin [T, dims/2], made each forward */
        return t;
    }
    rp->table = shared_table(g, t); /* a fixed offset: the table is made once, with the graph */
    if (!rp->table) {
        cg_real *tab = cgi_node_params(g, "rope", (size_t)(T * dims) * sizeof *tab);
        if (!tab) return NULL;
        fill_table(tab, T, dims / 2, pos_offset, f);
        rp->table = tab;
    }
    return t;
}

cg_tensor *cg_rope(cg_graph *g, cg_tensor *x, int64_t pos_offset, const cg_rope_config *cfg) {
    return rope(g, x, pos_offset, NULL, cfg);
}

cg_tensor *cg_rope_at(cg_graph *g, cg_tensor *x, cg_tensor *pos_offset, const cg_rope_config *cfg) {
    if (!cgi_inputs_ok(g, "rope", 1, &pos_offset)) return NULL; /* names a NULL offset */
    return rope(g, x, 0, pos_offset, cfg);
}

typedef struct {
    const cg_tensor *t;
    cg_real *dst;
    const int64_t *dst_stride;
    const cg_real *src;
    const int64_t *src_stride;
    int sign;
    bool accumulate;
} rotate_args;

/* One row's rotation of x = [x1 | x2] (halves of `half` features, unit strides) into y: the
 * expressions of rotate_rows' general loop, so the bits are the same. */
static inline void rotate_halves_as(cg_real *restrict y, const cg_real *restrict a, const cg_real *restrict c,
                                    const cg_real *restrict s, int64_t half, int sign, bool accumulate) {
    for (int64_t i = 0; i < half; i++) {
        const cg_real x1 = a[i], x2 = a[i + half], sn = sign * s[i];
        const cg_real y1 = x1 * c[i] - x2 * sn, y2 = x1 * sn + x2 * c[i];
        if (accumulate) y[i] += y1, y[i + half] += y2;
        else y[i] = y1, y[i + half] = y2;
    }
}

static void rotate_halves(cg_real *y, const cg_real *a, const cg_real *c, const cg_real *s, int64_t half, int sign,
                          bool accumulate) {
    if (accumulate) rotate_halves_as(y, a, c, s, half, sign, true);
    else rotate_halves_as(y, a, c, s, half, sign, false);
}

/* Rows [r0, r1) of a rotation (see rotate). */
static void rotate_rows(int64_t r0, int64_t r1, void *ctx) {
    const rotate_args *k = ctx;
    const cg_tensor *t = k->t;
    const int64_t *dst_stride = k->dst_stride, *src_stride = k->src_stride;
    const int nd = t->ndim, sign = k->sign;
    const int64_t T = t->shape[nd - 2], D = t->shape[nd - 1], half = t->iarg[0] / 2;
    const bool inter = t->iarg[1], accumulate = k->accumulate;
    const cg_real *C = ((const rope_params *)t->params)->table, *S;
    if (!C) C = t->aux;
    S = C + T * half;
    const int64_t ds = dst_stride[nd - 1], ss = src_stride[nd - 1];
    for (int64_t r = r0; r < r1; r++) {
        int64_t so = 0, dof = 0, q = r;
        for (int kk = nd - 2; kk >= 0; kk--) {
            so += (q % t->shape[kk]) * src_stride[kk];
            dof += (q % t->shape[kk]) * dst_stride[kk];
            q /= t->shape[kk];
        }
        const cg_real *a = k->src + so, *c = C + (r % T) * half, *s = S + (r % T) * half;
        cg_real *y = k->dst + dof;
        if (!inter && ss == 1 && ds == 1) { /* halves side by side, unit strides: a loop that vectorises */
            rotate_halves(y, a, c, s, half, sign, accumulate);
            for (int64_t j = 2 * half; j < D; j++) y[j] = accumulate ? y[j] + a[j] : a[j];
            continue;
        }
        for (int64_t i = 0; i < half; i++) {
            const int64_t i1 = inter ? 2 * i : i, i2 = inter ? 2 * i + 1 : i + half;
            const cg_real x1 = a[i1 * ss], x2 = a[i2 * ss], sn = sign * s[i];
            const cg_real y1 = x1 * c[i] - x2 * sn, y2 = x1 * sn + x2 * c[i];
            if (accumulate) y[i1 * ds] += y1, y[i2 * ds] += y2;
            else y[i1 * ds] = y1, y[i2 * ds] = y2;
        }
        for (int64_t j = 2 * half; j < D; j++) {
            if (accumulate) y[j * ds] += a[j * ss];
            else y[j * ds] = a[j * ss];
        }
    }
}

/* Rotates rows of src (strided, feature stride ss) into dst (feature stride 1 or the grad's),
 * by +angle (forward) or -angle (backward); features past dims are copied. Rows are independent:
 * a thread team shares them (cgi_par_ranges). */
static void rotate(const cg_tensor *t, cg_real *dst, const int64_t *dst_stride, const cg_real *src,
                   const int64_t *src_stride, int sign, bool accumulate) {
    const int nd = t->ndim;
    const int64_t D = t->shape[nd - 1], rows = cgi_numel(nd - 1, t->shape);
    const rotate_args k = {t, dst, dst_stride, src, src_stride, sign, accumulate};
    cgi_par_ranges(rows, rows * D, rotate_rows, (void *)&k);
}

cg_status cgi_fwd_rope(cg_tensor *t) {
    const rope_params *rp = t->params;
    if (!rp->table) {
        const int64_t off = *(const int32_t *)t->src[1]->data;
        if (off < 0) return cgi_fail(CG_ERR_RANGE, "[rope] x%s: position offset %lld < 0", cgi_shp(t), (long long)off);
        fill_table(t->aux, t->shape[t->ndim - 2], t->iarg[0] / 2, off, rp->f);
    }
    cg_tensor *x = t->src[0];
    rotate(t, t->data, t->stride, x->data, x->stride, 1, false);
    return CG_OK;
}

void cgi_bwd_rope(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) rotate(t, x->grad, x->stride, t->grad, t->stride, -1, true);
}
