/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy's kernels (ops/loss_head.c has the op and its plan): the
 * vocabulary in column slabs on the micro-kernel, each slab's logits, online softmax statistics and
 * gradients made while the slab is in cache, and the dX partial sums of the slabs' groups. */
#include <math.h>
#include <omp.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/loss_head.h"

/* Packs B[k, n] of W from element off (strides rs, cs) as cgi_ukr_pack_b: a half-precision W widened
 * as it is packed (read in place, no float copy) */
static void lce_pack_w(const lce *c, int64_t k, int64_t n, int64_t off, int64_t rs, int64_t cs, cg_real *dst) {
#ifndef CGRAD_DOUBLE
    if (c->wel != CGI_EL_F32) {
        cgi_ukr_pack_b_half(&c->u, k, n, (const uint16_t *)c->Wv + off, c->wel, rs, cs, dst);
        return;
    }
#endif
    cgi_ukr_pack_b(&c->u, k, n, c->W + off, rs, cs, dst);
}

/* The passes over a chunk's rows between its products (gathering, merging, scattering) ran on
 * thread 0 alone inside a team: 3.3 ms of a gpt-tiny two-thread step's ~230 (CGRAD_PROFILE's time
 * alone, 8 chunks of 512 rows each way). They run as row ranges a team shares (cgi_par_ranges);
 * each row is computed alone, so the bits do not depend on the cut. */
typedef struct {
    const lce *c;
    int64_t r0, m;
    cg_real scale;
} lce_rows_args;

/* Tiles [q0, q1) of the micro-kernel's rows: gathered into xs, and on the fused path packed as A
 * (a panel per tile, so packing tiles apart gives the bytes of packing them at once). */
static void lce_gather_tiles(int64_t q0, int64_t q1, void *ctx) {
    const lce_rows_args *a = ctx;
    const lce *c = a->c;
    const int64_t mr = c->p ? c->u.mr : 1, i0 = q0 * mr, i1 = q1 * mr < a->m ? q1 * mr : a->m;
    for (int64_t i = i0; i < i1; i++)
        memcpy(c->xs + i * c->d, c->X + (int64_t)c->index[a->r0 + i] * c->d, (size_t)c->d * sizeof(cg_real));
    if (c->p) cgi_ukr_pack_a(&c->u, i1 - i0, c->d, c->xs + i0 * c->d, c->d, 1, c->fused + c->p->xa + q0 * c->u.pmr * c->d);
}

/* Gathers rows [r0, r0+m) of the counted list into c->xs; the fused path also packs them as A. */
void cgi_lce_gather(const lce *c, int64_t r0, int64_t m) {
    const int64_t mr = c->p ? c->u.mr : 1;
    const lce_rows_args a = {c, r0, m, 1};
    cgi_par_ranges((m + mr - 1) / mr, m * c->d, lce_gather_tiles, (void *)&a);
}

/* The fused path keeps a chunk's logits slab after slab, each slab's rows w apart: the gradients
 * then stream a slab from memory, where m runs of w columns V apart stalled on every load (half of
 * backward's time in the first version). Slab s: its first column v0, its width w. */
static cg_real *lce_slab(const lce *c, int64_t s, int64_t *v0, int64_t *w) {
    *v0 = s * c->p->sw;
    *w = c->v - *v0 < c->p->sw ? c->v - *v0 : c->p->sw;
    return c->logits + s * c->t->iarg[2] * c->p->sw;
}

/* Slab s of the chunk's logits = xs W[v0:v0+w]^T + b for its m rows from r0, strip by strip. Each
 * row's max and sum of e^(z - max) over the slab go to st[(row * ns + s) * 2], its target's logit,
 * if in the slab, to zt[row], and the slab keeps e^(z - max) in place of z: the softmax's gradient
 * is then one product per element, e^(z - max) e^(max - lse), no exponential. pw: the slot's W pack. */
static void lce_slab_rows(const lce *c, int64_t r0, int64_t i0, int64_t i1, int64_t s, const cg_real *pw);

static void lce_slab_logits(const lce *c, int64_t r0, int64_t m, int64_t s, cg_real *pw) {
    int64_t v0, w;
    lce_slab(c, s, &v0, &w);
    lce_pack_w(c, c->d, w, v0 * c->wr, c->wc, c->wr, pw);
    lce_slab_rows(c, r0, 0, m, s, pw);
}

/* Rows [i0, i1) of the chunk (i0 a multiple of the micro-tile's rows) of lce_slab_logits, from slab
 * s's W packed in pw. Each tile of rows is computed alone, so any such cut gives the same bits. */
static void lce_slab_rows(const lce *c, int64_t r0, int64_t i0, int64_t i1, int64_t s, const cg_real *pw) {
    const cgi_ukr *u = &c->u;
    const cg_real *xa = c->fused + c->p->xa;
    int64_t v0, w;
    cg_real *zs = lce_slab(c, s, &v0, &w);
    for (int64_t i = i0; i < i1; i += u->mr) {
        const int64_t mi = i1 - i < u->mr ? i1 - i : u->mr;
        cg_real *z0 = zs + i * w;
        cgi_ukr_gemm(u, mi, w, c->d, 1, xa + i / u->mr * u->pmr * c->d, c->d, pw, c->d, 0, z0, w, 1, CGI_UKR_FULL,
                     CGI_UKR_FULL);
        for (int64_t r = 0; r < mi; r++) {
            cg_real *z = z0 + r * w;
            if (c->B) cgi_add_bias_row(z, c->B + v0 * c->bs, c->bs, w);
            const int64_t k = c->tg[cgi_elem_offset(c->t->src[2], (int64_t)c->index[r0 + i + r])] - v0;
            if (k >= 0 && k < w) c->fused[c->p->zt + i + r] = z[k];
            cg_real *o = c->fused + c->p->st + ((i + r) * c->p->ns + s) * 2;
            o[0] = cgi_row_max(z, w);
            if (o[0] == -INFINITY) memset(z, 0, (size_t)w * sizeof *z), o[1] = 0;
            else o[1] = (cg_real)cgi_sum_exp(z, w, o[0], z);
        }
    }
}

typedef struct {
    const lce *c;
    int64_t r0, m;
} lce_slabs_task;

static void lce_slab_piece(void *ctx, int s) {
    const lce_slabs_task *k = ctx;
    lce_slab_logits(k->c, k->r0, k->m, s, k->c->fused + k->c->p->pw + (size_t)omp_get_thread_num() * k->c->p->pw_one);
}

/* A vocabulary of one slab (at most LCE_SLAB classes: gpt-tiny's 256 bytes, nanoGPT's 65
 * characters) would be one piece, which thread 0 ran alone while the helpers waited: 4% of
 * gpt-tiny's two-thread step (CGRAD_PROFILE's time alone). Its passes are cut instead into
 * LCE_PARTS pieces of whole micro-tiles: the logits and dX by rows, dW and the bias's sums by the
 * slab's columns. Each output element is computed as in one piece, so the bits are the same. */
enum { LCE_PARTS = 4 };

/* Part q of LCE_PARTS of n rows (or columns), cut on multiples of the micro-tile's rows. */
static void lce_part(const lce *c, int64_t n, int q, int64_t *lo, int64_t *hi) {
    const int64_t mr = c->u.mr, tiles = (n + mr - 1) / mr;
    *lo = tiles * q / LCE_PARTS * mr;
    *hi = q == LCE_PARTS - 1 ? n : tiles * (q + 1) / LCE_PARTS * mr;
    if (*hi > n) *hi = n;
}

static void lce_rows_piece(void *ctx, int q) {
    const lce_slabs_task *k = ctx;
    int64_t i0, i1;
    lce_part(k->c, k->m, q, &i0, &i1);
    if (i1 > i0) lce_slab_rows(k->c, k->r0, i0, i1, 0, k->c->fused + k->c->p->pw);
}

/* Rows [lo, hi) of the chunk: the slabs' partial sums, merged in slab order into the log-sum-exp. */
static void lce_merge_lse(int64_t lo, int64_t hi, void *ctx) {
    const lce_rows_args *a = ctx;
    const lce *c = a->c;
    const lce_params *p = c->p;
    for (int64_t i = lo; i < hi; i++) {
        const cg_real *o = c->fused + p->st + i * p->ns * 2;
        cg_real mx = -INFINITY;
        for (int64_t s = 0; s < p->ns; s++) mx = o[2 * s] > mx ? o[2 * s] : mx;
        double sum = 0;
        for (int64_t s = 0; s < p->ns; s++)
            if (o[2 * s + 1] != 0) sum += (double)o[2 * s + 1] * exp((double)o[2 * s] - mx);
        c->lse[a->r0 + i] = mx + (cg_real)log(sum);
    }
}

/* Computes rows [r0, r0+m) of the counted list's logits into c->logits; fused: with each row's
 * log-sum-exp into c->lse */
void cgi_lce_logits(const lce *c, int64_t r0, int64_t m, bool bwd) {
    cgi_lce_gather(c, r0, m);
    if (c->p) {
        const lce_params *p = c->p;
        const lce_slabs_task k = {c, r0, m};
        if (p->ns == 1) { /* one slab: W packed once, its rows in parts */
            lce_pack_w(c, c->d, c->v, 0, c->wc, c->wr, c->fused + p->pw);
            cgi_slot_pieces(LCE_PARTS, p->slots, lce_rows_piece, (void *)&k);
        } else
            cgi_slot_pieces(p->ns, p->slots, lce_slab_piece, (void *)&k); /* each slab in its thread's slot */
        const lce_rows_args a = {c, r0, m, 1};
        cgi_par_ranges(m, m * p->ns * 8, lce_merge_lse, (void *)&a); /* an exp weighs some 8 elements' pass */
        return;
    }
    if (c->B) {
#pragma omp parallel for schedule(static) if (m * c->v > CGI_PAR_MIN) num_threads(cgi_nthreads())
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < c->v; j++) c->logits[i * c->v + j] = c->B[j * c->bs];
    }
    if (cgi_lp_on(c->t) && cgi_lp_gemm(c->t, bwd, m, c->v, c->d, c->xs, c->d, 1, NULL, c->W, c->wc, c->wr,
                                       c->t->src[1], 1, c->B ? 1 : 0, c->logits, c->v, 1))
        return;
    const cgi_gemm_job j = {.m = m, .n = c->v, .k = c->d, .a = c->xs, .rsa = c->d, .csa = 1, .b = c->Wv, .rsb = c->wc,
                            .csb = c->wr, .alpha = 1, .beta = c->B ? 1 : 0, .c = c->logits, .rsc = c->v, .csc = 1,
                            .tb = (uint8_t)c->wel};
    cgi_gemm_many(&j, 1, cgi_nthreads());
}

/* One chunk's gradient pass (lce_grads), for its groups of slabs. */
typedef struct {
    const lce *c;
    int64_t r0, m;
    bool recompute, w_assign, dx, dw, db;
    cg_real gscale;
    cg_real *bias_grad;
    int64_t bias_stride;
    cg_real *dxu;
} lce_grads_task;

/* Row i of the chunk's slab s (columns v0.., sw wide) in place: e^(z - max) -> d(loss)/d(logits),
 * for an upstream gradient of gscale per counted row. */
static void lce_dlogits_row(const lce *c, int64_t r0, int64_t i, int64_t s, int64_t v0, int64_t sw, cg_real gscale,
                            cg_real *z) {
    const cg_real l = c->lse[r0 + i], *o = c->fused + c->p->st + (i * c->p->ns + s) * 2;
    const cg_real f = gscale * (cg_real)exp((double)o[0] - l);
    for (int64_t j = 0; j < sw; j++) z[j] *= f;
    const int64_t kk = c->tg[cgi_elem_offset(c->t->src[2], (int64_t)c->index[r0 + i])] - v0;
    if (kk >= 0 && kk < sw) z[kk] -= gscale;
}

/* Group g of the chunk's slabs, in slot `me`: dlogits in place, the bias's sums, the group's dX
 * partial and its slabs' dW rows. */
static void lce_group(const lce_grads_task *k, int64_t g, int me) {
    const lce *c = k->c;
    cg_tensor *w = c->t->src[1];
    const lce_params *p = c->p;
    const cgi_ukr *u = &c->u;
    const int64_t d = c->d, cap = c->t->iarg[2], r0 = k->r0, m = k->m;
    const cg_real gscale = k->gscale;
    cg_real *xb = c->fused + p->xb, *dxp = c->fused + p->dxp;
    cg_real *pa = c->fused + p->slot + (size_t)me * p->slot_one, *pb = pa + p->pa_n, *pt = pb + p->pb_n,
            *cs = pt + p->pt_n;
    cg_real *dxg = g ? dxp + (g - 1) * cap * d : k->dxu;
    const int64_t s0 = g * p->ns / p->groups, s1 = (g + 1) * p->ns / p->groups;
    for (int64_t s = s0; s < s1; s++) {
        int64_t v0, sw;
        cg_real *z0 = lce_slab(c, s, &v0, &sw);
        /* recomputed as forward computes them, bit for bit: whichever pass computes the gradients,
         * they come out the same (and the same as the composite's up to rounding) */
        if (k->recompute) lce_slab_logits(c, r0, m, s, c->fused + p->pw + (size_t)me * p->pw_one);
        if (k->db) memset(cs, 0, (size_t)sw * sizeof *cs);
        for (int64_t i = 0; i < m; i++) {
            cg_real *z = z0 + i * sw;
            lce_dlogits_row(c, r0, i, s, v0, sw, gscale, z);
            if (k->db)
                for (int64_t j = 0; j < sw; j++) cs[j] += z[j];
        }
        if (k->db)
            for (int64_t j = 0; j < sw; j++) k->bias_grad[(v0 + j) * k->bias_stride] += cs[j];
        if (k->dx) { /* the group's dX partial (+)= dlogits[:, slab] @ W[slab] */
            cgi_ukr_pack_a(u, m, sw, z0, sw, 1, pa);
            lce_pack_w(c, sw, d, v0 * c->wr, c->wr, c->wc, pb);
            cgi_ukr_gemm(u, m, d, sw, 1, pa, sw, pb, sw, s == s0 ? 0 : 1, dxg, d, 1, CGI_UKR_FULL, CGI_UKR_FULL);
        }
        if (k->dw) { /* dW[slab] (+)= dlogits[:, slab]^T @ xs */
            cgi_ukr_pack_a(u, sw, m, z0, 1, sw, pt);
            cgi_ukr_gemm(u, sw, d, m, 1, pt, m, xb, m, k->w_assign ? 0 : 1, c->wgrad + v0 * w->stride[0], w->stride[0],
                         w->stride[1], CGI_UKR_FULL, CGI_UKR_FULL);
        }
    }
}

static void lce_group_piece(void *ctx, int g) { lce_group(ctx, g, omp_get_thread_num()); }

/* One slab's gradients (lce_group's, in the same order per element), its rows' part q: the logits
 * recomputed, dlogits in place and dX's rows, from W's slab packed as B once in slot 0. */
static void lce_one_slab_rows(void *ctx, int q) {
    const lce_grads_task *k = ctx;
    const lce *c = k->c;
    const lce_params *p = c->p;
    const cgi_ukr *u = &c->u;
    const int64_t d = c->d, r0 = k->r0;
    int64_t i0, i1, v0, sw;
    lce_part(c, k->m, q, &i0, &i1);
    if (i1 <= i0) return;
    cg_real *z0 = lce_slab(c, 0, &v0, &sw);
    cg_real *pa = c->fused + p->slot + (size_t)omp_get_thread_num() * p->slot_one, *pb = c->fused + p->slot + p->pa_n;
    if (k->recompute) lce_slab_rows(c, r0, i0, i1, 0, c->fused + p->pw);
    for (int64_t i = i0; i < i1; i++) lce_dlogits_row(c, r0, i, 0, v0, sw, k->gscale, z0 + i * sw);
    if (k->dx) {
        cgi_ukr_pack_a(u, i1 - i0, sw, z0 + i0 * sw, sw, 1, pa);
        cgi_ukr_gemm(u, i1 - i0, d, sw, 1, pa, sw, pb, sw, 0, k->dxu + i0 * d, d, 1, CGI_UKR_FULL, CGI_UKR_FULL);
    }
}

/* ... its columns' part q: the bias's sums over the rows in order, and dW's rows. */
static void lce_one_slab_cols(void *ctx, int q) {
    const lce_grads_task *k = ctx;
    const lce *c = k->c;
    const lce_params *p = c->p;
    cg_tensor *w = c->t->src[1];
    int64_t j0, j1, v0, sw;
    const cg_real *z0 = lce_slab(c, 0, &v0, &sw);
    lce_part(c, sw, q, &j0, &j1);
    if (j1 <= j0) return;
    cg_real *pa = c->fused + p->slot + (size_t)omp_get_thread_num() * p->slot_one, *pt = pa + p->pa_n + p->pb_n,
            *cs = pt + p->pt_n;
    if (k->db) {
        memset(cs, 0, (size_t)(j1 - j0) * sizeof *cs);
        for (int64_t i = 0; i < k->m; i++)
            for (int64_t j = j0; j < j1; j++) cs[j - j0] += z0[i * sw + j];
        for (int64_t j = j0; j < j1; j++) k->bias_grad[(v0 + j) * k->bias_stride] += cs[j - j0];
    }
    if (k->dw) {
        cgi_ukr_pack_a(&c->u, j1 - j0, k->m, z0 + j0, 1, sw, pt);
        cgi_ukr_gemm(&c->u, j1 - j0, c->d, k->m, 1, pt, k->m, c->fused + p->xb, k->m, k->w_assign ? 0 : 1,
                     c->wgrad + (v0 + j0) * w->stride[0], w->stride[0], w->stride[1], CGI_UKR_FULL, CGI_UKR_FULL);
    }
}

static void lce_merge_dx(int64_t lo, int64_t hi, void *ctx);

/* Panels [q0, q1) of the chunk's xs [m, d] packed as B (dW's operand): a panel per nr columns, so
 * packing panels apart gives the bytes of packing them at once. */
static void lce_pack_xs_panels(int64_t q0, int64_t q1, void *ctx) {
    const lce_rows_args *a = ctx;
    const lce *c = a->c;
    const int64_t nr = c->u.nr, j0 = q0 * nr, j1 = q1 * nr < c->d ? q1 * nr : c->d;
    cgi_ukr_pack_b(&c->u, a->m, j1 - j0, c->xs + j0, c->d, 1, c->fused + c->p->xb + q0 * c->u.pnr * a->m);
}

/* The fused path's gradients over one chunk of m rows from r0 (logits in place: forward's e^(z - max),
 * or recomputed), for an upstream gradient of gscale * (counted rows): dW (+)= into w's gradient
 * (w_assign: written, not added to); dX into dxu's rows of the chunk; the bias's gradient added to
 * dbu (ahead: forward, for backward to take) or to the bias's gradient. */
void cgi_lce_grads(const lce *c, int64_t r0, int64_t m, bool recompute, cg_real gscale, bool w_assign, bool ahead) {
    cg_tensor *x = c->t->src[0], *w = c->t->src[1], *b = c->t->nsrc > 3 ? c->t->src[3] : NULL;
    const lce_params *p = c->p;
    const int64_t d = c->d;
    const bool dx = x->requires_grad, dw = w->requires_grad, db = b && b->requires_grad;
    cg_real *dxu = c->fused + p->dxu + r0 * d;
    lce_grads_task k = {c, r0, m, recompute, w_assign, dx, dw, db, gscale,
                        ahead ? c->fused + p->dbu : db ? b->grad : NULL, ahead ? 1 : db ? b->stride[0] : 0, dxu};
    if (dw) { /* xs packed as B, by panels of its columns */
        const lce_rows_args a = {c, r0, m, 1};
        cgi_par_ranges((d + c->u.nr - 1) / c->u.nr, m * d, lce_pack_xs_panels, (void *)&a);
    }
    if (p->ns == 1) { /* one slab: its rows' parts, then its columns' */
        if (recompute) lce_pack_w(c, d, c->v, 0, c->wc, c->wr, c->fused + p->pw);
        if (dx) lce_pack_w(c, c->v, d, 0, c->wr, c->wc, c->fused + p->slot + p->pa_n);
        cgi_slot_pieces(LCE_PARTS, p->slots, lce_one_slab_rows, &k);
        if (db && dw && cgi_grads_alias(w, b)) { /* the bias's sums, then dW, on one thread, as one group did */
            lce_grads_task only_b = k, only_w = k;
            only_b.dw = false, only_w.db = false;
            for (int q = 0; q < LCE_PARTS; q++) lce_one_slab_cols(&only_b, q);
            for (int q = 0; q < LCE_PARTS; q++) lce_one_slab_cols(&only_w, q);
        } else if (dw || db)
            cgi_slot_pieces(LCE_PARTS, p->slots, lce_one_slab_cols, &k);
        return; /* one group: no partial sums to add */
    }
    cgi_slot_pieces(p->groups, p->slots, lce_group_piece, &k); /* each group in its thread's slot */
    if (dx) { /* the groups' partials in order */
        const lce_rows_args a = {c, r0, m, 1};
        cgi_par_ranges(m, m * d * p->groups, lce_merge_dx, (void *)&a);
    }
}

/* dX (dxu) of chunk rows [lo, hi) from the groups' partial sums, added in group order. */
static void lce_merge_dx(int64_t lo, int64_t hi, void *ctx) {
    const lce_rows_args *a = ctx;
    const lce *c = a->c;
    const lce_params *p = c->p;
    const int64_t d = c->d, cap = c->t->iarg[2];
    const cg_real *dxp = c->fused + p->dxp;
    cg_real *dxu = c->fused + p->dxu + a->r0 * d;
    for (int64_t i = lo; i < hi; i++)
        for (int64_t e = 0; e < d; e++) {
            cg_real sum = dxu[i * d + e];
            for (int64_t g = 1; g < p->groups; g++) sum += dxp[(g - 1) * cap * d + i * d + e];
            dxu[i * d + e] = sum;
        }
}

/* Rows [lo, hi) of lce_scatter_dx: the counted rows are distinct rows of x */
static void lce_scatter_rows(int64_t lo, int64_t hi, void *ctx) {
    const lce_rows_args *a = ctx;
    const lce *c = a->c;
    cg_tensor *x = c->t->src[0];
    const cg_real *dxu = c->fused + c->p->dxu + a->r0 * c->d, scale = a->scale;
    for (int64_t i = lo; i < hi; i++) {
        cg_real *dst = x->grad + (int64_t)c->index[a->r0 + i] * c->d;
        for (int64_t e = 0; e < c->d; e++) dst[e] += scale * dxu[i * c->d + e];
    }
}

/* dX of the chunk's m rows from r0 (dxu) times scale, added to their rows of x's gradient */
void cgi_lce_scatter_dx(const lce *c, int64_t r0, int64_t m, cg_real scale) {
    const lce_rows_args a = {c, r0, m, scale};
    cgi_par_ranges(m, m * c->d, lce_scatter_rows, (void *)&a);
}