/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy: an LM head and its loss without the [rows, vocab] logits. */
#include <math.h>
#include <omp.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/loss_head.h"
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
        cgi_lce_logits(&c, r0, m, false);
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
        if (ahead) cgi_lce_grads(&c, r0, m, false, (cg_real)1 / (cg_real)n, r0 == 0, true);
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
        cgi_lce_scatter_dx(c, 0, c->n, g);
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
            if (q > 0 || ahead) cgi_lce_gather(&c, r0, m);
            cgi_lce_grads(&c, r0, m, q > 0 || ahead, gscale, w_assign, false);
            if (x->requires_grad) cgi_lce_scatter_dx(&c, r0, m, 1); /* after dW: x's and w's gradients may alias */
            w_assign = false;
            continue;
        }
        if (q > 0) cgi_lce_logits(&c, r0, m, true);
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
