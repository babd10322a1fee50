/* SPDX-License-Identifier: MIT */
/* One (batch, head) of the fused attention (ops/attention.c) as its forward and backward see it:
 * the head's rows of q, k and v (widened from bf16 storage once per head), its relative bias, the
 * masks and biases added to a block of scores, and the dropout of a row of probabilities, drawn
 * again in backward from the same counter. */
#include <math.h>

#include "graph/internal.h"
#include "ops/attention_internal.h"
#include "ops/bf16_internal.h"

/* Head row pointer of x (q, k or v) at batch b, head hh, with its row stride in *rs. An input stored
 * in bf16 (a linear's value only attention reads, ops/bf16.c) is widened into dst, [rows, D]
 * contiguous, once for the head: every product and the packing then read floats. */
static const cg_real *head_rows(const cg_tensor *x, int64_t b, int64_t hh, cg_real *dst, int64_t *rs) {
    const int64_t at = b * x->stride[0] + hh * x->stride[1], rows = x->shape[2], d = x->shape[3];
    *rs = x->stride[2];
    if (!x->root->lp_value) return (const cg_real *)x->data + at;
    /* a view's element offset is the same in the bf16 storage; its float address is not */
    const cgi_bf16 *src = (const cgi_bf16 *)x->root->data + x->offset + at;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < d; e++) dst[r * d + e] = cgi_from_bf16(src[r * *rs + e * x->stride[3]]);
    *rs = d;
    return dst;
}

/* The head bh of t in scratch slot `slot`, whose rel part gets the head's relative bias, if any. */
void cgi_attn_head_at(const cg_tensor *t, int64_t bh, cg_real *slot, head *h) {
    const sdpa_params *p = prm(t);
    const cg_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    const int64_t b = bh / q->shape[1], hh = bh % q->shape[1], hk = hh / (q->shape[1] / k->shape[1]);
    cg_real *rel = cgi_sdpa_rel_at(t, slot), *in = cgi_sdpa_inputs_at(t, slot);
    const int64_t tq = q->shape[2], tk = k->shape[2], dq = q->shape[3];
    h->q = head_rows(q, b, hh, in, &h->qs);
    h->k = head_rows(k, b, hk, in + tq * dq, &h->ks);
    h->v = head_rows(v, b, hk, in + tq * dq + tk * dq, &h->vs);
    const cg_tensor *kp = p->kp ? t->src[p->kp] : NULL;
    h->keep = kp ? (const int32_t *)kp->data + b * kp->stride[0] : NULL;
    h->keep_s = kp ? kp->stride[1] : 0;
    h->bias = p->bias ? (const cg_real *)t->src[p->bias]->data + b * p->bias_st[0] + hh * p->bias_st[1] : NULL;
    h->bias_si = p->bias_st[2], h->bias_sj = p->bias_st[3];
    h->tq = q->shape[2], h->tk = k->shape[2], h->d = q->shape[3];
    h->os = t->stride[2];
    h->sc = cgi_sdpa_slot_cols(t);
    h->nk = cgi_sdpa_keys_present(t);
    h->shift = h->nk - h->tq;
    h->causal = p->causal;
    h->window = p->window;
    h->scale = (cg_real)p->scale;
    h->rel = NULL;
    if (has_rel(p)) { /* offset r is key - query position r - (Tk - 1) */
        const double slope = p->alibi ? cgi_alibi_slope(hh, q->shape[1]) : 0;
        const cg_tensor *tb = p->table ? t->src[p->table] : NULL;
        for (int64_t r = 0; r < p->nrel; r++) {
            const int64_t dist = r - (h->tk - 1);
            double x = -slope * (double)(dist < 0 ? -dist : dist);
            if (tb) x += ((const cg_real *)tb->data)[p->bucket[r] * tb->stride[0] + hh * tb->stride[1]];
            rel[r] = (cg_real)x;
        }
        h->rel = rel;
    }
    h->drop = p->dropout > 0;
    if (h->drop) {
        h->drop_key = cgi_dropout_key(t->graph->seed, t->id, p->step);
        h->drop_threshold = cgi_dropout_threshold(p->dropout);
        h->drop_scale = (cg_real)(1.0 / (1.0 - p->dropout));
        h->drop_row = (uint64_t)(bh * h->tq);
    }
}

/* Adds the biases to the scores of query rows [i0, i0+nq) against keys [j0, j0+nk) in s[nq][ss]
 * and masks hidden ones to -inf; returns false when the whole block is hidden. A causal row hides
 * a tail of the block, padding hides single keys. */
bool cgi_attn_mask(const head *h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, cg_real *s, int64_t ss) {
    bool any = false;
    for (int64_t r = 0; r < nq; r++) {
        const int64_t vis = visible(h, i0 + r, j0, nk), first = first_visible(h, i0 + r, j0, nk);
        cg_real *sr = s + r * ss;
        if (h->rel) { /* the relative bias of keys j0 + c, offsets j0 + c - i + Tq - 1 */
            const cg_real *rr = h->rel + j0 - (i0 + r) + h->tq - 1;
            for (int64_t c = first; c < vis; c++) sr[c] += rr[c];
        }
        if (h->bias) {
            const cg_real *br = h->bias + (i0 + r) * h->bias_si + j0 * h->bias_sj;
            if (h->bias_sj) for (int64_t c = first; c < vis; c++) sr[c] += br[c];
            else for (int64_t c = first; c < vis; c++) sr[c] += br[0];
        }
        for (int64_t c = 0; c < first; c++) sr[c] = -INFINITY;
        for (int64_t c = vis; c < nk; c++) sr[c] = -INFINITY;
        if (h->keep) {
            for (int64_t c = first; c < vis; c++)
                if (h->keep[(j0 + c) * h->keep_s] == 0) sr[c] = -INFINITY;
                else any = true;
        } else any = any || vis > first;
    }
    return any;
}

/* Dropout on the probabilities p of query row i against keys [j0, j0 + n): each is kept, scaled by
 * 1 / (1 - dropout), or zeroed, into pt (which may be p). */
void cgi_attn_drop_probs(const head *h, int64_t i, int64_t j0, int64_t n, const cg_real *p, cg_real *pt) {
    const uint64_t at = (h->drop_row + (uint64_t)i) * (uint64_t)h->tk + (uint64_t)j0, key = h->drop_key,
                   thr = h->drop_threshold;
    const cg_real keep = h->drop_scale;
    for (int64_t c = 0; c < n; c++) pt[c] = cgi_dropout_keeps(key, at + (uint64_t)c, thr) ? p[c] * keep : 0;
}

/* Backward through the dropout of row i, keys [j0, j0 + n), with the mask M (0 or the keep scale)
 * drawn again: pt = M P (which may overwrite p), and when dp is given it holds dO V^T on entry and
 * dS = P (M dP - D) on exit. (D = rowsum(dO O) is unchanged: O is made of the dropped weights.) */
void cgi_attn_drop_grads(const head *h, int64_t i, int64_t j0, int64_t n, const cg_real *p, cg_real *pt, cg_real *dp,
                       cg_real di) {
    const uint64_t at = (h->drop_row + (uint64_t)i) * (uint64_t)h->tk + (uint64_t)j0, key = h->drop_key,
                   thr = h->drop_threshold;
    const cg_real keep = h->drop_scale;
    if (dp)
        for (int64_t c = 0; c < n; c++) {
            const cg_real m = cgi_dropout_keeps(key, at + (uint64_t)c, thr) ? keep : 0, pc = p[c];
            dp[c] = pc * (m * dp[c] - di);
            pt[c] = pc * m;
        }
    else cgi_attn_drop_probs(h, i, j0, n, p, pt);
}
