/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy: an LM head and its loss without the [rows, vocab] logits. */
#include <math.h>
#include <omp.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/loss_internal.h"
#include "ops/ops.h"

/* ---- linear + cross-entropy in row chunks: iarg[0] ignore_index, iarg[1] counted rows, iarg[2]
 * chunk capacity, iarg[3] rows per chunk at most. aux: lse[rows], row index[rows] (as cg_real-sized
 * slots), a chunk of gathered inputs [cap, D] and of logits [cap, V], then either the fused path's
 * scratch (lce_params) or, in a graph made bf16 after this op was built, the input gradients of a
 * chunk [cap, D] and colsum scratch. Chunks are balanced, since a thin last chunk runs BLIS at half
 * speed.
 *
 * Float graphs take the fused path: the products run on the micro-kernel (cgi_ukr) over column
 * slabs of the vocabulary, the gathered rows packed once per chunk, and everything else happens
 * to a slab while it is in cache. Forward adds the bias to each 12-row strip of logits right after
 * the kernel writes it and takes the strip's row max and sum of exponentials there (an online
 * softmax, merged per row in slab order), so the logits are written once and never re-read.
 * The gradients then turn a slab of logits into dlogits, sum its bias gradient, and feed it at once
 * to dW's rows of the slab (dlogits^T xs, the packed rows reused by every slab) and to dX's partial
 * sum of the slab's group (dlogits W); the groups' sums are added in order. Slabs and groups depend
 * on the shapes only, so the bits do not depend on the thread count.
 *
 * Gradients ahead: a chunk's logits are gone once the next chunk is computed, and backward used to
 * recompute all chunks but the last one, a third more work for each of them: gpt-small's head (1024
 * rows, 2 chunks) took 1.17x the CPU time of the unfused head. So in a training graph forward
 * computes each chunk's gradients for an upstream gradient of 1 right after its loss, while its
 * logits are in place: dX and the bias's gradient into aux, dW straight into the weight's gradient
 * when that is a parameter whose gradient cg_params_zero_grad left stale. The gradient stays marked
 * stale (anyone reading or writing it before this op's backward finds zeros, as before) and the
 * parameter records this node (grad_ahead); backward then claims it, scales the three by the
 * upstream gradient if that is not 1, and adds dX and the bias's gradient. If anything touched the
 * weight's gradient in between (cleared stale or grad_ahead), backward recomputes every chunk. A
 * gradient being accumulated (not stale) is not written ahead: its chunks but the last are recomputed
 * in backward.
 * With the optimizer inside backward (cg_optim_attach) the weight's gradient is a buffer of the plan,
 * which holds other values until that gradient's first writer: the plan then starts it at this op's
 * forward instead of its backward where that does not raise the peak (graph/plan.c), and forward
 * writes dW there (pgrad); backward finds it in w's gradient (swapped in, stale until claimed) and
 * claims it as above. ---- */

#define LCE_ROWS 512
#define LCE_CHUNK_BYTES ((int64_t)8 << 20)
#define LCE_CHEAP_D 512
enum {
    LCE_SLAB = 256,   /* columns per slab at most: the gradients' slab of dlogits and its two packs stay in L2 */
    LCE_GROUPS = 8    /* dX partial sums: work units two threads share without waiting */
};

/* The fused path's layout, fixed at construction (absent in a graph built bf16). Offsets are reals
 * from the start of the fused part of aux, 64-byte aligned. */
typedef struct {
    int slots;                 /* per-thread scratch: the thread count at construction */
    int64_t sw, ns;            /* slab width and count */
    int64_t groups;            /* dX partial sums */
    size_t xa, st, zt, pw, pw_one; /* xs packed as A, slab stats [cap][ns][2], target logits, W packs */
    size_t xb, dxp, slot, slot_one; /* xs packed as B, dX partials of groups 1.., per-slot scratch */
    size_t pa_n, pb_n, pt_n;   /* a slot's parts (lce_grads) */
    size_t dxu, dbu;           /* dX of every counted row [rows, D] and the bias's gradient [V] */
    size_t reals;
    bool ahead;                /* run state: the last forward computed the gradients (upstream 1) */
    int pgrad;                 /* the plan's buffer for w's gradient, live from this op's forward: its
                                * index in the graph's pgrad, or -1 (cgi_lce_set_planned_grad) */
} lce_params;

/* Rows per chunk for n counted rows, at most iarg[3] (lce_rows_limit; half of LCE_ROWS in a graph
 * made bf16 before this op was built, where the float logits chunk is the largest buffer alive at
 * the peak and the products are not faster for thicker chunks). */
static int64_t lce_step(const cg_tensor *t, int64_t n) {
    const int64_t lim = t->iarg[3], chunks = (n + lim - 1) / lim;
    return chunks <= 1 ? n : (n + chunks - 1) / chunks;
}

/* Rows per chunk at most for d features and a vocabulary of v: LCE_ROWS, fewer where a chunk's float
 * logits would pass LCE_CHUNK_BYTES, not fewer than LCE_ROWS / 2 (a chunk recomputed in backward
 * costs more in thinner products); LCE_ROWS / 2 in a bf16 graph. A recomputed logit costs 2d flops,
 * so only heads of d <= LCE_CHEAP_D trade it for memory. Even with the gradients ahead, each chunk
 * packs all of W twice: gpt-small's head (1024 x 768 x 50304, one thread) took 0.99 of the unfused
 * head's CPU time in 512-row chunks, 1.03 in 256 and 1.09 in 128. The chunk's logits and dX
 * partials are the largest buffers alive at the loss: in 512 rows bert-small's head (30522 classes)
 * held 62.5 MB of logits, encdec-base's (8000) 16.4 MB of logits and 8.4 MB of partials. */
static int64_t lce_rows_limit(bool bf16, int64_t d, int64_t v) {
    if (bf16) return LCE_ROWS / 2;
    if (d > LCE_CHEAP_D) return LCE_ROWS;
    const int64_t fit = v > 0 ? LCE_CHUNK_BYTES / (v * (int64_t)sizeof(cg_real)) / 16 * 16 : LCE_ROWS;
    return fit > LCE_ROWS ? LCE_ROWS : fit < LCE_ROWS / 2 ? LCE_ROWS / 2 : fit;
}

/* Slabs of at most `most` columns over v: balanced, whole 32-column tiles. */
static void lce_slabs(int64_t v, int64_t most, int64_t *width, int64_t *count) {
    const int64_t n0 = (v + most - 1) / most, w = ((v + n0 - 1) / n0 + 31) / 32 * 32;
    *width = w;
    *count = (v + w - 1) / w;
}

/* Reals rounded up to whole 64-byte lines: the micro-kernel reads its packed operands aligned. */
static size_t line_up(size_t reals) { return (reals + 15) / 16 * 16; }

static void lce_layout(lce_params *p, int64_t rows, int64_t cap, int64_t d, int64_t v) {
    cgi_ukr u;
    cgi_ukr_init(&u);
    lce_slabs(v, LCE_SLAB, &p->sw, &p->ns);
    p->groups = p->ns < LCE_GROUPS ? p->ns : LCE_GROUPS;
    size_t at = 0;
    p->xa = at, at += line_up(cgi_ukr_packed_a(&u, cap, d));
    p->st = at, at += line_up((size_t)(cap * p->ns * 2));
    p->zt = at, at += line_up((size_t)cap);
    p->pw_one = line_up(cgi_ukr_packed_b(&u, d, p->sw));
    p->pw = at, at += (size_t)p->slots * p->pw_one;
    p->xb = at, at += line_up(cgi_ukr_packed_b(&u, cap, d));
    p->dxp = at, at += (size_t)((p->groups - 1) * cap * d); /* group 0 writes its rows of dxu */
    /* a slot: dlogits packed as dX's A, W's slab as its B, dlogits^T as dW's A, column sums */
    p->pa_n = line_up(cgi_ukr_packed_a(&u, cap, p->sw)), p->pb_n = line_up(cgi_ukr_packed_b(&u, p->sw, d));
    p->pt_n = line_up(cgi_ukr_packed_a(&u, p->sw, cap));
    p->slot_one = p->pa_n + p->pb_n + p->pt_n + line_up((size_t)p->sw);
    p->slot = line_up(at), at = p->slot + (size_t)p->slots * p->slot_one;
    p->dxu = at, at += line_up((size_t)(rows * d));
    p->dbu = at, at += line_up((size_t)v);
    p->reals = at;
    p->ahead = false;
}

/* aux's bytes: lse and row index [rows], a chunk of inputs [cap, D] and of logits [cap, V], then the
 * fused part (p) or the bf16 path's dX and colsum scratch, which take the same place. */
static size_t lce_aux_bytes(const lce_params *p, int64_t rows, int64_t cap, int64_t d, int64_t v) {
    const size_t lp_part = (size_t)(cap * d) + cgi_colsum_scratch(cap, v), fused_part = p ? p->reals + 16 : 0;
    return ((size_t)(2 * rows + cap * d + cap * v) + (lp_part > fused_part ? lp_part : fused_part)) * sizeof(cg_real);
}

cg_tensor *cg_linear_cross_entropy(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, cg_tensor *targets,
                                   int ignore_index) {
    cg_tensor *in[4] = {x, w, targets, bias};
    if (!cgi_inputs_ok(g, "linear_cross_entropy", bias ? 4 : 3, in)) return NULL;
    if (!cgi_expect_real("linear_cross_entropy", x, "x") || !cgi_expect_real("linear_cross_entropy", w, "w")) return NULL;
    const int64_t d = x->ndim ? x->shape[x->ndim - 1] : 0;
    bool ok = x->ndim >= 1 && w->ndim == 2 && w->shape[1] == d && targets->dtype == CG_INT32 &&
              targets->ndim == x->ndim - 1 && (!bias || (bias->ndim == 1 && bias->shape[0] == w->shape[0] &&
                                                          bias->dtype == CG_REAL));
    for (int i = 0; ok && i < targets->ndim; i++) ok = targets->shape[i] == x->shape[i];
    if (!ok) {
        cgi_fail(CG_ERR_SHAPE, "[linear_cross_entropy] x%s [..., D], w%s [V, D], bias%s [V], int32 targets%s [...]",
                 cgi_shp(x), cgi_shp(w), bias ? cgi_shp(bias) : "(none)", cgi_shp(targets));
        return NULL;
    }
    in[0] = cg_contiguous(g, x);
    if (!in[0]) return NULL;
    const int64_t rows = cgi_numel(targets->ndim, targets->shape), v = w->shape[0];
    const bool bf16 = g->precision == CG_BF16;
    /* the plan may size it again from the rows the targets count (cgi_lce_plan) */
    const int64_t lim = lce_rows_limit(bf16, d, v), cap = rows < lim ? rows : lim;
    lce_params *p = NULL;
    if (g->precision != CG_BF16 && d > 0 && v > 0 && cap > 0) {
        if (!(p = cgi_node_params(g, "linear_cross_entropy", sizeof *p))) return NULL;
        p->slots = cgi_nthreads();
        lce_layout(p, rows, cap, d, v);
        p->pgrad = -1;
    }
    cg_tensor *t = cgi_node(g, CGI_OP_LINEAR_CROSS_ENTROPY, CG_REAL, 0, NULL, bias ? 4 : 3, in);
    if (!t) return NULL;
    t->iarg[0] = ignore_index;
    t->iarg[2] = cap;
    t->iarg[3] = lim;
    t->params = p;
    t->aux_bytes = lce_aux_bytes(p, rows, cap, d, v);
    return t;
}

/* Chunks sized from the rows the targets count, when the plan is made (graph/plan.c, before it sizes
 * the buffers): a head whose targets ignore most rows (BERT's masked-LM labels, 15% of the tokens)
 * runs only its counted rows, so the op's limit, made for all the rows, may cut them into two
 * chunks where one would hold them: then each pass packs W again, and backward recomputes the first
 * chunk's logits. bert-small (~15% of 2048 rows labelled, 30522 classes, the op's 256-row limit):
 * its head took 92 ms of CPU time a step in two chunks of 154, 69 in one. So where the targets are
 * a graph input already filled and count at most half the rows, their count n, plus 4 sqrt(n) for
 * the next batches' spread (a random mask's count varies by at most sqrt(n) a standard deviation),
 * is the chunk when that stays within 3/2 of the op's limit: at most half a chunk of logits more
 * (bert-small's batch labels 298 rows: one chunk of 368, 15 MB more). More counted rows in a later
 * batch still run, in more chunks. Float graphs only: a bf16 graph keeps its half chunks. */
void cgi_lce_plan(cg_tensor *t) {
    lce_params *p = t->params;
    const cg_tensor *w = t->src[1], *tg = t->src[2];
    if (!p) return;
    p->pgrad = -1; /* plan_param_grads decides again */
    if (t->graph->precision == CG_BF16) return;
    const int64_t rows = cgi_numel(tg->ndim, tg->shape), v = w->shape[0], d = w->shape[1];
    const int64_t own = lce_rows_limit(false, d, v);
    int64_t lim = own;
    if (tg->op == CGI_OP_INPUT && tg->root == tg && tg->data) { /* a view's or a node's data is not there yet */
        const int32_t *T = tg->data, ignore = (int32_t)t->iarg[0];
        int64_t n = 0;
        for (int64_t r = 0; r < rows; r++) n += T[cgi_elem_offset(tg, r)] != ignore;
        const int64_t want = (n + (int64_t)ceil(4 * sqrt((double)n)) + 15) / 16 * 16;
        if (n > own && 2 * n <= rows && want <= own * 3 / 2) lim = want;
    }
    const int64_t cap = rows < lim ? rows : lim;
    if (cap == t->iarg[2] && lim == t->iarg[3]) return;
    lce_layout(p, rows, cap, d, v);
    t->iarg[2] = cap;
    t->iarg[3] = lim;
    t->aux_bytes = lce_aux_bytes(p, rows, cap, d, v);
}

/* The plan's choice when asked (graph/plan.c, CGRAD_HEAD_CHUNK), where the head's chunk is live at
 * its fullest moment: chunks of LCE_ROWS / 2 rows instead of LCE_ROWS, half the logits alive, for
 * thinner products and W packed once more per chunk (gpt-small: 61 MB off the peak, its step 1.06x
 * the CPU time). */
size_t cgi_lce_halve_chunks(cg_tensor *t, bool apply) {
    lce_params *p = t->params;
    const cg_tensor *w = t->src[1];
    const int64_t rows = cgi_numel(t->src[2]->ndim, t->src[2]->shape), v = w->shape[0], d = w->shape[1];
    const int64_t lim = LCE_ROWS / 2, cap = rows < lim ? rows : lim;
    /* Only with the optimizer inside backward. Elsewhere a pass may add into a gradient another
     * pass's forward wrote ahead (accumulation after a lazy zero_grad), and backward then recomputes
     * its chunks in reverse order: the same bits as the first pass in 2 chunks of 500 rows but not
     * in 4 of 250 (test_lce). Inside backward every pass starts its gradient from the plan's buffer
     * and takes the same path each step (ahead where the plan holds dW from forward, as it does for
     * the zoo's heads), so more chunks change no pass's bits against another's. */
    if (!p || !t->graph->param_grads_planned || t->iarg[3] <= lim || cap >= t->iarg[2]) return 0;
    const size_t before = t->aux_bytes;
    if (!apply) { /* the layout's size on a copy */
        lce_params q = *p;
        lce_layout(&q, rows, cap, d, v);
        const size_t after = lce_aux_bytes(&q, rows, cap, d, v);
        return before > after ? before - after : 0;
    }
    lce_layout(p, rows, cap, d, v);
    t->iarg[2] = cap;
    t->iarg[3] = lim;
    t->aux_bytes = lce_aux_bytes(p, rows, cap, d, v);
    return before > t->aux_bytes ? before - t->aux_bytes : 0;
}

typedef struct {
    cg_tensor *t;
    const cg_real *X, *W, *B;
    const void *Wv; /* what the products read for W: its floats, or a frozen half-precision W's elements in place */
    int wel;        /* Wv's element type (CGI_EL_*) */
    int64_t d, v, n, wr, wc, bs; /* n: counted rows */
    cg_real *lse, *xs, *logits, *dxs, *colsum;
    const int32_t *tg;
    const cg_real *index; /* row positions of the counted targets, stored as reals */
    const lce_params *p;  /* the fused path, NULL when the graph does not take it */
    cg_real *fused;       /* aux's fused part, 64-byte aligned */
    cg_real *wgrad;       /* where dW goes: w's gradient, or forward's ahead the plan's buffer for it */
    cgi_ukr u;
} lce;

static cg_real *align64(void *p) { return (cg_real *)(((uintptr_t)p + 63) / 64 * 64); }

static void lce_setup(cg_tensor *t, lce *c) {
    cg_tensor *x = t->src[0], *w = t->src[1], *tg = t->src[2], *b = t->nsrc > 3 ? t->src[3] : NULL;
    const int64_t rows = cgi_numel(tg->ndim, tg->shape);
    c->t = t;
    c->X = x->data, c->W = w->data, c->B = b ? b->data : NULL;
    c->Wv = cgi_operand_elems(w, &c->wel);
    c->d = w->shape[1], c->v = w->shape[0], c->wr = w->stride[0], c->wc = w->stride[1], c->bs = b ? b->stride[0] : 0;
    c->lse = t->aux;
    c->index = c->lse + rows;
    c->xs = (cg_real *)c->index + rows;
    c->logits = c->xs + t->iarg[2] * c->d;
    c->dxs = c->logits + t->iarg[2] * c->v;
    c->colsum = c->dxs + t->iarg[2] * c->d;
    c->tg = tg->data;
    c->n = t->iarg[1];
    c->p = cgi_lp_on(t) ? NULL : t->params; /* a graph made bf16 after this op: the bf16 path */
    c->fused = c->p ? align64(c->dxs) : NULL;
    c->wgrad = w->grad;
    if (c->p) cgi_ukr_init(&c->u);
}

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
static void lce_gather(const lce *c, int64_t r0, int64_t m) {
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
static void lce_logits(const lce *c, int64_t r0, int64_t m, bool bwd) {
    lce_gather(c, r0, m);
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
static void lce_grads(const lce *c, int64_t r0, int64_t m, bool recompute, cg_real gscale, bool w_assign, bool ahead) {
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
static void lce_scatter_dx(const lce *c, int64_t r0, int64_t m, cg_real scale) {
    const lce_rows_args a = {c, r0, m, scale};
    cgi_par_ranges(m, m * c->d, lce_scatter_rows, (void *)&a);
}

/* Whether this forward computes the gradients ahead (see above): the fused path in a graph that
 * takes gradients, and a weight that takes none or is a parameter whose gradient is stale, or, with
 * an attached optimizer's plan (param_grads_planned), whose plan buffer is live from this forward
 * (else that memory belongs to other values during forward). Sets where dW goes. */
static bool lce_ahead(lce *c) {
    const cg_tensor *t = c->t, *w = t->src[1];
    const cg_graph *g = t->graph;
    if (!c->p || !t->requires_grad || c->n == 0 || g->mode != CG_TRAIN) return false;
    if (!w->requires_grad) return true;
    if (g->param_grads_planned) {
        const int j = c->p->pgrad;
        if (j < 0 || j >= g->npgrad || g->pgrad[j].p != w || !g->pgrad[j].grad) return false;
        c->wgrad = g->pgrad[j].grad; /* w->grad is the set's own until backward swaps this one in */
        return true;
    }
    return w->root == w && w->op == CGI_OP_PARAM && w->grad_stale && w->grad;
}

bool cgi_lce_ahead_plannable(const cg_tensor *t) {
    const lce_params *p = t->params;
    const cg_tensor *w = t->src[1];
    return p && t->graph->precision != CG_BF16 && t->graph->mode == CG_TRAIN && t->requires_grad && !t->recompute &&
           w->requires_grad && w->root == w && w->op == CGI_OP_PARAM;
}

void cgi_lce_set_planned_grad(cg_tensor *t, int j) {
    lce_params *p = t->params;
    if (p) p->pgrad = j;
}

cg_status cgi_fwd_linear_cross_entropy(cg_tensor *t) {
    cg_tensor *tgt = t->src[2], *w = t->src[1], *b = t->nsrc > 3 ? t->src[3] : NULL;
    const int64_t rows = cgi_numel(tgt->ndim, tgt->shape), v = w->shape[0];
    const int32_t *T = tgt->data, ignore = (int32_t)t->iarg[0];
    cg_real *index = (cg_real *)t->aux + rows;
    int64_t n = 0;
    FOR_COUNTED_TARGETS("linear_cross_entropy", tgt, v, ignore, r, k, index[n++] = (cg_real)r); /* exact below 2^24 rows */
    t->iarg[1] = n;
    lce c;
    lce_setup(t, &c);
    const bool ahead = lce_ahead(&c);
    if (c.p) ((lce_params *)t->params)->ahead = ahead;
    if (w->root->grad_ahead == t) w->root->grad_ahead = NULL;
    if (ahead && b && b->requires_grad) memset(c.fused + c.p->dbu, 0, (size_t)v * sizeof(cg_real));
    double total = 0;
    const int64_t step = lce_step(t, n);
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t m = n - r0 < step ? n - r0 : step;
        lce_logits(&c, r0, m, false);
        double part[LCE_ROWS];
#pragma omp parallel for schedule(static) if (!c.p && m * c.v > CGI_PAR_MIN) num_threads(cgi_nthreads())
        for (int64_t i = 0; i < m; i++) {
            const int32_t k = T[cgi_elem_offset(tgt, (int64_t)c.index[r0 + i])];
            if (c.p) { /* the fused path has the log-sum-exp and the target's logit already */
                part[i] = c.lse[r0 + i] - c.fused[c.p->zt + i];
                continue;
            }
            const cg_real *z = c.logits + i * c.v;
            const cg_real mx = cgi_row_max(z, c.v);
            c.lse[r0 + i] = mx + (cg_real)log(cgi_sum_exp(z, c.v, mx, NULL));
            part[i] = c.lse[r0 + i] - z[k];
        }
        for (int64_t i = 0; i < m; i++) total += part[i];
        if (ahead) lce_grads(&c, r0, m, false, (cg_real)1 / (cg_real)n, r0 == 0, true);
    }
    if (ahead && w->requires_grad) w->grad_ahead = t;
    *(cg_real *)t->data = (cg_real)(n ? total / (double)n : 0.0);
    return CG_OK;
}

/* dBias += the column sums of the chunk's dlogits [m, v] */
static void lce_bias_grad(const lce *c, cg_tensor *b, int64_t m) {
    if (b->stride[0] == 1) cgi_colsum_add(b->grad, c->logits, m, c->v, c->v, c->colsum);
    else {
        int64_t cs[2] = {c->v, 1}, ds[2] = {0, b->stride[0]}, sh[2] = {m, c->v};
        cgi_reduce(b->grad, ds, c->logits, cs, 2, sh, 1u, 1.0, true);
    }
}

typedef struct {
    cg_real *x, by;
} scale_args;

static void scale_range(int64_t lo, int64_t hi, void *ctx) {
    const scale_args *a = ctx;
    for (int64_t i = lo; i < hi; i++) a->x[i] *= a->by;
}

/* Backward of a forward that computed the gradients ahead: w's gradient is claimed and scaled by the
 * upstream gradient g, and dX and the bias's gradient, times g, added. */
static void lce_bwd_ahead(const lce *c, cg_real g) {
    cg_tensor *x = c->t->src[0], *w = c->t->src[1], *b = c->t->nsrc > 3 ? c->t->src[3] : NULL;
    if (w->requires_grad) {
        w->grad_stale = false, w->grad_ahead = NULL; /* it holds this op's term only: the first writer's */
        if (g != 1) {
            const scale_args a = {w->grad, g};
            cgi_par_ranges(c->v * c->d, c->v * c->d, scale_range, (void *)&a);
        }
    }
    if (x->requires_grad) {
        cgi_grad_prepare(x);
        lce_scatter_dx(c, 0, c->n, g);
    }
    if (b && b->requires_grad) {
        cgi_grad_prepare(b);
        const cg_real *dbu = c->fused + c->p->dbu;
        for (int64_t j = 0; j < c->v; j++) b->grad[j * b->stride[0]] += g * dbu[j];
    }
}

void cgi_bwd_linear_cross_entropy(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1], *tgt = t->src[2], *b = t->nsrc > 3 ? t->src[3] : NULL;
    lce c;
    lce_setup(t, &c);
    const bool ahead = c.p && c.p->ahead;
    if (ahead && (!w->requires_grad || (w->grad_ahead == t && w->grad_stale))) {
        lce_bwd_ahead(&c, t->grad[0]);
        return;
    }
    /* the op claims every input (CGI_GRAD_CLAIMS_ALL): dW's first writer since zero_grad takes beta 0
     * on its first chunk; bf16's products add, so they get it zeroed */
    bool w_assign = w->requires_grad && cgi_grad_claim(w, !cgi_lp_on(t));
    if (x->requires_grad) cgi_grad_prepare(x);
    if (b && b->requires_grad) cgi_grad_prepare(b);
    if (c.n == 0) { /* nothing to add: a claimed dW still has to read as zero */
        if (w_assign) cgi_zero(w->grad, (size_t)cgi_numel(w->ndim, w->shape) * sizeof(cg_real));
        return;
    }
    const cg_real gscale = t->grad[0] / (cg_real)c.n;
    const int nt = cgi_nthreads();
    const int64_t step = lce_step(t, c.n);
    /* The last chunk first: forward left its logits in place, so one chunk fewer is recomputed (with
     * one chunk, none is), unless forward turned them into gradients (ahead) and something touched
     * w's gradient since. In float that saved encdec-base's head a [512, 512] x [512, 8000] product
     * per step, some 60 ms of 1255 on one thread; the chunks' dW and bias sums are added in the
     * reverse order, which changed those gradients' last bits (test_lce holds them to the composite). */
    const int64_t nch = (c.n + step - 1) / step;
    for (int64_t q = 0; q < nch; q++) {
        const int64_t r0 = (nch - 1 - q) * step, m = c.n - r0 < step ? c.n - r0 : step;
        if (c.p) {
            if (q > 0 || ahead) lce_gather(&c, r0, m);
            lce_grads(&c, r0, m, q > 0 || ahead, gscale, w_assign, false);
            if (x->requires_grad) lce_scatter_dx(&c, r0, m, 1); /* after dW: x's and w's gradients may alias */
            w_assign = false;
            continue;
        }
        if (q > 0) lce_logits(&c, r0, m, true);
#pragma omp parallel for schedule(static) if (m * c.v > CGI_PAR_MIN) num_threads(nt)
        for (int64_t i = 0; i < m; i++) { /* logits -> d(loss)/d(logits) in place */
            cg_real *z = c.logits + i * c.v;
            const cg_real l = c.lse[r0 + i];
            for (int64_t j = 0; j < c.v; j++) z[j] = gscale * cgi_exp(z[j] - l);
            z[c.tg[cgi_elem_offset(tgt, (int64_t)c.index[r0 + i])]] -= gscale;
        }
        /* as in a linear's backward, dX and dW side by side as one list of pieces: BLIS split these
         * shapes (307 x 256 over 30522, and its transpose) poorly over two threads; side by side,
         * bert-small's head backward went from 96-101 to 80-82 ms (medians, interleaved). In bf16
         * each product runs on every thread in turn (oneDNN threads it). */
        /* bf16: the bias first, as the products turn dlogits into bf16 in place; then both products */
        const bool lp = cgi_lp_on(t) && t->lp_tmp[1], bias_first = lp && b && b->requires_grad;
        if (bias_first) lce_bias_grad(&c, b, m);
        const bool done = lp && cgi_lp_lce_bwd(t, m, c.v, c.d, c.logits, c.xs, c.dxs, x->requires_grad, w->requires_grad);
        cgi_gemm_job jobs[2];
        int nj = 0;
        /* dX lands in scratch and is scattered after both, so the two never share output, even
         * when x's and w's gradients alias */
        if (x->requires_grad && !done) /* dx rows = dlogits @ W, gathered; scattered back below */
            jobs[nj++] = (cgi_gemm_job){.m = m, .n = c.d, .k = c.v, .a = c.logits, .rsa = c.v, .csa = 1, .b = c.Wv,
                                        .rsb = c.wr, .csb = c.wc, .alpha = 1, .beta = 0, .c = c.dxs, .rsc = c.d,
                                        .csc = 1, .tb = (uint8_t)c.wel};
        if (w->requires_grad && !done) /* dW += dlogits^T @ xs */
            jobs[nj++] = (cgi_gemm_job){.m = c.v, .n = c.d, .k = m, .a = c.logits, .rsa = 1, .csa = c.v, .b = c.xs,
                                        .rsb = c.d, .csb = 1, .alpha = 1, .beta = w_assign ? 0 : 1, .c = w->grad,
                                        .rsc = w->stride[0], .csc = w->stride[1]};
        cgi_gemm_many(jobs, nj, nt);
        w_assign = false;
        if (x->requires_grad)
            for (int64_t i = 0; i < m; i++) {
                cg_real *dst = x->grad + (int64_t)c.index[r0 + i] * c.d;
                for (int64_t e = 0; e < c.d; e++) dst[e] += c.dxs[i * c.d + e];
            }
        if (b && b->requires_grad && !bias_first) lce_bias_grad(&c, b, m);
    }
}
