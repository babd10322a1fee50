/* SPDX-License-Identifier: MIT */
/* Fused scaled dot-product attention (the FlashAttention schedule on a CPU): per (batch, head),
 * query blocks of BQ rows visit key blocks of BK keys; scores, the running max and the running
 * sum live in a small per-thread scratch, and the products are BLIS calls on strided blocks.
 * Forward saves one log-sum-exp per query row; backward recomputes each block's probabilities
 * from it. Up to BK keys the probabilities are kept instead and the products run on BLIS's
 * micro-kernel over operands packed once per head (keeps_probs, packs_heads). Each (batch, head)
 * belongs to one thread, so gradient writes never collide and the result does not depend on the
 * thread count. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "graph/internal.h"
#include "ops/attention_internal.h"
#include "ops/bf16_internal.h"
#include "ops/ops.h"

cg_tensor *cg_sdpa(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, double scale, bool causal,
                   cg_tensor *key_padding) {
    const cg_sdpa_opts o = {.scale = scale, .causal = causal, .key_padding = key_padding};
    return cg_sdpa_ex(g, q, k, v, &o);
}

cg_tensor *cg_sdpa_ex(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, const cg_sdpa_opts *opts) {
    int64_t bias_st[4] = {0};
    if (!cgi_sdpa_opts_ok(g, q, k, v, opts, bias_st)) return NULL;
    cg_tensor *key_padding = opts->key_padding, *bias = opts->bias, *table = opts->rel_bias, *past = opts->past,
              *in[3] = {q, k, v};
    const int64_t B = q->shape[0], hq = q->shape[1], tq = q->shape[2], tk = k->shape[2];
    const int64_t want[4] = {B, hq, tq, tk}, max_distance = opts->rel_max_distance ? opts->rel_max_distance : 128;
    const int64_t nb = table ? table->shape[0] : 0;
    /* BLIS reads rows in place; only the feature axis must be dense, and no row repeated by a zero
     * stride (an expanded view), whose gradient rows several threads would write */
    for (int i = 0; i < 3; i++)
        if ((in[i]->stride[3] != 1 || cgi_broadcast_view(in[i])) && (in[i] = cg_contiguous(g, in[i])) == NULL)
            return NULL;
    /* the kernel adds bias rows as runs; the strides are read here, so an expanded bias is made dense
     * here too (size-1 axes broadcast without it) */
    if (bias && (bias_st[3] > 1 || cgi_broadcast_view(bias))) {
        if ((bias = cg_contiguous(g, bias)) == NULL) return NULL;
        cgi_sdpa_bias_strides(bias, want, bias_st);
    }
    const int64_t nrel = tq + tk - 1;
    sdpa_params *p = cgi_node_params(g, "sdpa", sizeof *p + (table ? (size_t)nrel * sizeof(int32_t) : 0));
    if (!p) return NULL;
    cg_tensor *src[7] = {in[0], in[1], in[2]};
    int nsrc = 3;
    if (key_padding) p->kp = nsrc, src[nsrc++] = key_padding;
    if (bias) p->bias = nsrc, src[nsrc++] = bias;
    if (table) p->table = nsrc, src[nsrc++] = table;
    if (past) p->past = nsrc, src[nsrc++] = past;
    cg_tensor *t = cgi_node(g, CGI_OP_ATTENTION, CG_REAL, 4, q->shape, nsrc, src);
    if (!t) return NULL;
    /* The output [B, H, Tq, D] is stored as [B, Tq, H, D], heads side by side in each row, so
     * cg_merge_heads is a view (no copy forward, none backward) and the next linear reads it as is. */
    const int64_t st[4] = {tq * hq * q->shape[3], q->shape[3], hq * q->shape[3], 1};
    memcpy(t->stride, st, sizeof st);
    t->params = p;
    p->scale = opts->scale;
    p->window = opts->window;
    p->causal = opts->causal;
    p->alibi = opts->alibi;
    p->dropout = g->mode == CG_TRAIN ? opts->dropout : 0; /* as cg_dropout: identity when evaluating */
    p->slots = cgi_nthreads();
    p->keeps_probs = !past && cgi_sdpa_keeps_probs(tk); /* no backward to keep them for */
    memcpy(p->bias_st, bias_st, sizeof bias_st);
    p->nrel = nrel;
    for (int64_t r = 0; table && r < nrel; r++) /* offset r is key - query position r - (Tk - 1) */
        p->bucket[r] = cgi_t5_bucket(r - (tk - 1), !opts->causal, nb, max_distance);
    cgi_sdpa_size_scratch(t);
    return t;
}

/* Scores far below their row's maximum (ALiBi's distant keys, a bias of -1e4) give weights near the
 * smallest normal number, whose products are subnormal, and x86 takes a slow assist on each: ALiBi
 * ran at 1.4x (T = 1024) and 1.7x (T = 2048) the time of plain attention. Each head's work flushes
 * them to zero (FTZ and DAZ) and puts the thread's mode back after; a flushed term is below 1e-38
 * (1e-308 in float64) and the result stays the same on any thread count. */
static unsigned flush_begin(void) {
#if defined(__SSE2__)
    const unsigned m = _mm_getcsr();
    _mm_setcsr(m | 0x8040);
    return m;
#else
    return 0;
#endif
}
static void flush_end(unsigned m) {
#if defined(__SSE2__)
    _mm_setcsr(m);
#else
    (void)m;
#endif
}

/* Block products run inside the per-head parallel loop, so BLIS gets one thread. */
static void gemm1(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa, const cg_real *b,
                  int64_t rsb, int64_t csb, cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc) {
    cgi_gemm(m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c, rsc, csc, 1);
}


/* O[nq, d] (row stride os) = beta O + P[nq, nk] V (P's rows ps apart, V's vs). */
static void probs_v(int64_t nq, int64_t d, int64_t nk, const cg_real *p, int64_t ps, const cg_real *v, int64_t vs,
                    cg_real beta, cg_real *o, int64_t os) {
    if (nq == 1) cgi_attn_row_pv(p, nk, v, vs, d, beta, o);
    else gemm1(nq, d, nk, p, ps, 1, v, vs, 1, 1, beta, o, os, 1);
}

/* Masked scores of a block, through BLIS or, for one query row, cgi_attn_row_scores (see mask). */
static bool scores(const head *h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, cg_real *s, int64_t ss) {
    if (nq == 1) cgi_attn_row_scores(h->q + i0 * h->qs, h->k + j0 * h->ks, h->ks, nk, h->d, h->scale, s);
    else gemm1(nq, nk, h->d, h->q + i0 * h->qs, h->qs, 1, h->k + j0 * h->ks, 1, h->ks, h->scale, 0, s, ss, 1);
    return cgi_attn_mask(h, i0, nq, j0, nk, s, ss);
}

/* One key block's probabilities P = softmax(scores) into pb (row stride ps), and each row's
 * log-sum-exp; with w, the scores' product runs on the micro-kernel over the head's K^T in w->kv1.
 * False when every key is hidden (P all zeros). Backward remaking P (remakes_probs) runs it again
 * with forward's arguments, so its P is forward's bit for bit. */
CGI_CLONES static bool block_probs(const head *h, int64_t i0, int64_t nq, int64_t kend, cg_real *pb, int64_t ps,
                                   cg_real *lse, const cgi_ukr *u, const packs *w) {
    bool any = kend > 0, normalised = false;
    if (any && w && w->direct) {
        cgi_attn_mm_panels(nq, kend, h->d, h->scale, h->q + i0 * h->qs, h->qs, 1, w->kv1, 0, pb, ps, diag(h, i0),
                           CGI_UKR_FULL, CGI_UKR_FULL);
        /* masks that hide a tail of each row or single keys go into the vector softmax */
        normalised = !h->rel && !h->bias && !h->window;
        if (normalised) any = cgi_attn_softmax(pb, ps, nq, kend, h->causal, i0 + h->shift + 1, h->keep, h->keep_s, lse);
        else any = cgi_attn_mask(h, i0, nq, 0, kend, pb, ps);
    } else if (any && w) {
        cgi_ukr_pack_a(u, nq, h->d, h->q + i0 * h->qs, h->qs, 1, w->a);
        cgi_ukr_gemm(u, nq, kend, h->d, h->scale, w->a, h->d, w->kv1, h->d, 0, pb, ps, 1, diag(h, i0), CGI_UKR_FULL);
        any = cgi_attn_mask(h, i0, nq, 0, kend, pb, ps);
    } else if (any) any = scores(h, i0, nq, 0, kend, pb, ps);
    if (!any) { /* every key hidden: zeros, and no gradient */
        for (int64_t r = 0; r < nq; r++) {
            memset(pb + r * ps, 0, (size_t)kend * sizeof *pb);
            lse[r] = INFINITY;
        }
        return false;
    }
    for (int64_t r = 0; !normalised && r < nq; r++) {
        cg_real *pr = pb + r * ps, mx = cgi_row_max(pr, kend);
        if (mx == -INFINITY) {
            memset(pr, 0, (size_t)kend * sizeof *pr);
            lse[r] = INFINITY;
            continue;
        }
        const double l = cgi_sum_exp(pr, kend, mx, pr);
        const cg_real inv = (cg_real)(1 / l);
        for (int64_t c = 0; c < kend; c++) pr[c] *= inv;
        lse[r] = mx + (cg_real)log(l);
    }
    return true;
}

/* One key block, probabilities kept: P = softmax(scores) normalised in place (block_probs), O = P V.
 * With w, the products run on the micro-kernel over the head's keys and values packed in w. With
 * dropout, O is made of the dropped weights, put in pt [nq, sc]; P stays whole for backward. lp:
 * P's rows rounded into a bf16 store too. */
CGI_CLONES static void fwd_kept(const head *h, int64_t i0, int64_t nq, int64_t kend, cg_real *pb, int64_t ps, cg_real *o,
                     cg_real *lse, const cgi_ukr *u, const packs *w, cg_real *pt, cgi_bf16 *lp) {
    const bool any = block_probs(h, i0, nq, kend, pb, ps, lse, u, w);
    for (int64_t r = 0; lp && r < nq; r++) cgi_lp_round(lp + r * h->tk, pb + r * ps, kend, 1); /* stored rows: Tk apart */
    if (!any) {
        for (int64_t r = 0; r < nq; r++) memset(o + r * h->os, 0, (size_t)h->d * sizeof *o);
        return;
    }
    if (h->drop) {
        for (int64_t r = 0; r < nq; r++) cgi_attn_drop_probs(h, i0 + r, 0, kend, pb + r * ps, pt + r * h->sc);
        pb = pt, ps = h->sc;
    }
    if (w && w->direct) /* V made dense once per head (fwd_head) */
        cgi_attn_mm(nq, h->d, kend, 1, pb, ps, 1, w->rows, h->d, 0, o, h->os, CGI_UKR_FULL, diag(h, i0), CGI_UKR_FULL);
    else if (w) {
        cgi_ukr_pack_a(u, nq, kend, pb, ps, 1, w->a);
        cgi_ukr_gemm(u, nq, h->d, kend, 1, w->a, kend, w->kv2, h->tk, 0, o, h->os, 1, CGI_UKR_FULL, diag(h, i0));
    } else probs_v(nq, h->d, kend, pb, ps, h->v, h->vs, 0, o, h->os);
}

/* What every head of one forward shares. */
typedef struct {
    cg_tensor *t;
    cg_real *lse, *out, *probs;
    cgi_ukr u;
    bool packed, direct;
    size_t stride;
    cg_real *slot0; /* thread 0's slot */
} fwd_run;

/* Head bh of the forward, in scratch slot me. */
static void fwd_head(const fwd_run *f, int64_t bh, int me) {
    cg_tensor *t = f->t;
    const sdpa_params *p = prm(t);
    const int64_t tq = t->shape[2], d = t->shape[3], tk = t->src[1]->shape[2];
    cg_real *lse = f->lse, *out = f->out, *probs = f->probs;
    const cgi_ukr *u = &f->u;
    const bool packed = f->packed;
    const size_t stride = f->stride;
    const unsigned csr = flush_begin();
    const int64_t rq = cgi_sdpa_slot_rows(t);
    cg_real *s = f->slot0 + (size_t)me * stride, *acc = s + 2 * rq * cgi_sdpa_slot_cols(t), *m = acc + rq * d, *l = m + rq;
    head h;
    cgi_attn_head_at(t, bh, s, &h);
    cg_real *o = out + bh / t->shape[1] * t->stride[0] + bh % t->shape[1] * t->stride[1];
    packs w = {0};
    if (packed) { /* K^T and V for every query block of the head */
        w = cgi_sdpa_packs_at(t, s, u, false);
        w.direct = f->direct;
        if (w.direct) {
            cgi_attn_transpose_panels(tk, d, h.k, h.ks, w.kv1);
            int64_t vs = h.vs;
            w.rows = cgi_attn_dense_rows(h.v, &vs, tk, d, w.kv2);
        } else {
            cgi_ukr_pack_b(u, d, tk, h.k, 1, h.ks, w.kv1);
            cgi_ukr_pack_b(u, tk, d, h.v, h.vs, 1, w.kv2);
        }
    }
    const int64_t bq = h.causal ? BQ / 2 : BQ;
    for (int64_t i0 = 0; i0 < tq; i0 += bq) {
        const int64_t nq = tq - i0 < bq ? tq - i0 : bq, kend = key_end(&h, i0, nq);
        if (p->past && h.nk <= BK) { /* as a graph built for these nk keys computes it (keeps_probs), in the slot */
            fwd_kept(&h, i0, nq, kend, s + rq * h.sc, h.sc, o + i0 * h.os, lse + bh * tq + i0, u, NULL, s, NULL);
            continue;
        }
        /* a float block in the slot (dP's place in backward), rounded into the store, or not kept */
        if ((probs && p->lp_probs) || p->remakes_probs) {
            fwd_kept(&h, i0, nq, kend, s + rq * h.sc, h.sc, o + i0 * h.os, lse + bh * tq + i0, u, packed ? &w : NULL, s,
                     probs ? (cgi_bf16 *)probs + (bh * tq + i0) * tk : NULL);
            continue;
        }
        if (probs) {
            fwd_kept(&h, i0, nq, kend, probs + (bh * tq + i0) * tk, tk, o + i0 * h.os, lse + bh * tq + i0, u,
                     packed ? &w : NULL, s, NULL);
            continue;
        }
        for (int64_t r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
        memset(acc, 0, (size_t)(nq * d) * sizeof *acc);
        for (int64_t j0 = key_start(&h, i0); j0 < kend; j0 += BK) {
            const int64_t nk = kend - j0 < BK ? kend - j0 : BK;
            if (!scores(&h, i0, nq, j0, nk, s, h.sc)) continue;
            for (int64_t r = 0; r < nq; r++) { /* online softmax: rescale what came before */
                cg_real *sr = s + r * h.sc, mx = cgi_row_max(sr, nk);
                mx = m[r] > mx ? m[r] : mx;
                if (mx == -INFINITY) {
                    for (int64_t c = 0; c < nk; c++) sr[c] = 0;
                    continue;
                }
                const cg_real corr = m[r] == -INFINITY ? 0 : cgi_exp(m[r] - mx);
                l[r] = l[r] * corr + (cg_real)cgi_sum_exp(sr, nk, mx, sr);
                m[r] = mx;
                if (h.drop) cgi_attn_drop_probs(&h, i0 + r, j0, nk, sr, sr); /* the sum keeps every weight */
                if (corr != 1) for (int64_t e = 0; e < d; e++) acc[r * d + e] *= corr;
            }
            probs_v(nq, d, nk, s, h.sc, h.v + j0 * h.vs, h.vs, 1, acc, d);
        }
        for (int64_t r = 0; r < nq; r++) {
            cg_real *orow = o + (i0 + r) * h.os;
            if (l[r] == 0) { /* every key hidden: zeros, and no gradient */
                memset(orow, 0, (size_t)d * sizeof *orow);
                lse[bh * tq + i0 + r] = INFINITY;
                continue;
            }
            const cg_real inv = 1 / l[r];
            for (int64_t e = 0; e < d; e++) orow[e] = acc[r * d + e] * inv;
            lse[bh * tq + i0 + r] = m[r] + (cg_real)log(l[r]);
        }
    }
    flush_end(csr);
}

static void fwd_piece(void *ctx, int bh) { fwd_head(ctx, bh, omp_get_thread_num()); }

cg_status cgi_fwd_attention(cg_tensor *t) {
    const int64_t bhn = t->shape[0] * t->shape[1];
    sdpa_params *p = t->params;
    if (p->past && (cgi_sdpa_keys_present(t) < t->shape[2] || cgi_sdpa_keys_present(t) > t->src[1]->shape[2]))
        return cgi_fail(CG_ERR_RANGE, "[sdpa] past %lld + q%s's %lld rows outside k%s's %lld keys",
                        (long long)(cgi_sdpa_keys_present(t) - t->shape[2]), cgi_shp(t->src[0]), (long long)t->shape[2],
                        cgi_shp(t->src[1]), (long long)t->src[1]->shape[2]);
    p->step = t->graph->step; /* backward draws this pass's dropout mask again */
    fwd_run f = {.t = t, .lse = t->aux, .out = t->data, .slot0 = t->fwd_aux};
    f.probs = p->keeps_probs && !p->remakes_probs ? f.lse + cgi_sdpa_probs_offset(t) : NULL;
    cgi_ukr_init(&f.u);
    f.packed = cgi_sdpa_packs_heads(t);
    f.direct = f.packed && cgi_attn_direct();
    f.stride = cgi_sdpa_slot_stride(t, &f.u, false);
    cgi_slot_pieces(bhn, p->slots, fwd_piece, &f); /* each head whole in its thread's slot */
    return CG_OK;
}

/* A head's gradients and their row and feature strides; bias is this head's slice of the bias
 * tensor's gradient (row and key strides), rel its T5 offsets' (by j - i + Tq - 1). */
typedef struct {
    cg_real *q, *k, *v, *bias, *rel;
    int64_t qr, qc, kr, kc, vr, vc, bias_si, bias_sj;
    cg_real bq, bk, bv; /* beta of dQ's, dK's and dV's products: 0 where this op writes them first (claim_qkv) */
} grads;

/* Adds dS [nq, nk] (row stride h->sc) of query rows i0.. against keys j0.. into the bias gradients:
 * the bias tensor's elementwise, T5's by relative offset. */
static void bias_grads(const head *h, const grads *g, int64_t i0, int64_t nq, int64_t j0, int64_t nk, const cg_real *ds) {
    for (int64_t r = 0; r < nq; r++) {
        const cg_real *dr = ds + r * h->sc;
        if (g->rel) {
            cg_real *rr = g->rel + j0 - (i0 + r) + h->tq - 1;
            for (int64_t c = 0; c < nk; c++) rr[c] += dr[c];
        }
        if (g->bias) {
            cg_real *br = g->bias + (i0 + r) * g->bias_si + j0 * g->bias_sj;
            if (g->bias_sj) for (int64_t c = 0; c < nk; c++) br[c] += dr[c];
            else br[0] += (cg_real)cgi_row_sum(dr, nk);
        }
    }
}

/* Backward of one query block with kept probabilities p [nq, kend] (row stride Tk) on the micro-
 * kernel: w holds the head's V^T and K. dp is scratch [nq, sc] for dP, then dS; pt [nq, sc] gets
 * the dropped weights with dropout. */
CGI_CLONES static void bwd_packed(const head *h, const cgi_ukr *u, const packs *w, int64_t i0, int64_t nq, int64_t kend,
                       const cg_real *p, int64_t ps, const cg_real *dO, const cg_real *di, cg_real *dp, cg_real *pt,
                       const grads *g) {
    const int64_t d = h->d, tk = h->tk;
    if (kend == 0) return;
    const bool ds = g->q || g->k || g->bias || g->rel;
    /* with w->direct: keys j see queries from j - (i0 + shift) on (first), rows past it of dS and P are 0 */
    const int64_t first = h->causal ? -(i0 + h->shift) : CGI_UKR_FULL;
    /* every row sees every key: dS = P * (dP - D) made in dP's tiles, no pass of its own */
    const bool fused = ds && w->direct && !h->causal && !h->window && !h->drop;
    if (fused) cgi_attn_ds_panels(nq, kend, d, dO, h->os, w->kv1, dp, h->sc, p, ps, di);
    else if (ds && w->direct)
        cgi_attn_mm_panels(nq, kend, d, 1, dO, h->os, 1, w->kv1, 0, dp, h->sc, diag(h, i0), CGI_UKR_FULL, CGI_UKR_FULL);
    else if (ds) { /* dP = dO V^T, skipping the tiles the causal mask hides */
        cgi_ukr_pack_a(u, nq, d, dO, h->os, 1, w->a);
        cgi_ukr_gemm(u, nq, kend, d, 1, w->a, d, w->kv1, d, 0, dp, h->sc, 1, diag(h, i0), CGI_UKR_FULL);
    }
    for (int64_t r = 0; !fused && (ds || h->drop) && r < nq; r++) { /* dS = P * (dP - D), zero where hidden */
        const int64_t vis = visible(h, i0 + r, 0, kend);
        cg_real *dr = dp + r * h->sc;
        const cg_real *pr = p + r * ps, dr_i = di[r];
        if (h->drop) {
            cgi_attn_drop_grads(h, i0 + r, 0, vis, pr, pt + r * h->sc, ds ? dr : NULL, dr_i);
            for (int64_t c = vis; c < kend; c++) pt[r * h->sc + c] = 0;
        } else
            for (int64_t c = 0; c < vis; c++) dr[c] = pr[c] * (dr[c] - dr_i);
        if (ds) for (int64_t c = vis; c < kend; c++) dr[c] = 0;
    }
    if (g->v && w->direct) cgi_attn_mm(kend, d, nq, 1, h->drop ? pt : p, 1, h->drop ? h->sc : ps, dO, h->os, g->bv, g->v,
                                       g->vr, CGI_UKR_FULL, CGI_UKR_FULL, first);
    else if (g->v) { /* dV += P^T dO, of the dropped weights */
        if (h->drop) cgi_ukr_pack_a(u, kend, nq, pt, 1, h->sc, w->a);
        else cgi_ukr_pack_a(u, kend, nq, p, 1, ps, w->a);
        cgi_ukr_pack_b(u, nq, d, dO, h->os, 1, w->b);
        cgi_ukr_gemm(u, kend, d, nq, 1, w->a, nq, w->b, nq, g->bv, g->v, g->vr, g->vc, CGI_UKR_FULL, CGI_UKR_FULL);
    }
    if (g->bias || g->rel) bias_grads(h, g, i0, nq, 0, kend, dp);
    if (g->q && w->direct)
        cgi_attn_mm(nq, d, kend, h->scale, dp, h->sc, 1, w->rows, d, g->bq, g->q + i0 * g->qr, g->qr, CGI_UKR_FULL,
                    diag(h, i0), CGI_UKR_FULL);
    else if (g->q) { /* dQ += scale * dS K */
        cgi_ukr_pack_a(u, nq, kend, dp, h->sc, 1, w->a);
        cgi_ukr_gemm(u, nq, d, kend, h->scale, w->a, kend, w->kv2, tk, g->bq, g->q + i0 * g->qr, g->qr, g->qc,
                     CGI_UKR_FULL, diag(h, i0));
    }
    if (g->k && w->direct)
        cgi_attn_mm(kend, d, nq, h->scale, dp, 1, h->sc, h->q + i0 * h->qs, h->qs, g->bk, g->k, g->kr, CGI_UKR_FULL,
                    CGI_UKR_FULL, first);
    else if (g->k) { /* dK += scale * dS^T Q */
        cgi_ukr_pack_a(u, kend, nq, dp, 1, h->sc, w->a);
        cgi_ukr_pack_b(u, nq, d, h->q + i0 * h->qs, h->qs, 1, w->b);
        cgi_ukr_gemm(u, kend, d, nq, h->scale, w->a, nq, w->b, nq, g->bk, g->k, g->kr, g->kc, CGI_UKR_FULL, CGI_UKR_FULL);
    }
}

/* Backward of one query block on BLIS, key block by key block: P from the kept probabilities pk
 * (row stride pks) or recomputed from the scores and the lse rows L; dp is scratch for dP, then dS;
 * slot gets the scores (and the dropped weights with dropout). */
static void bwd_blocked(const head *h, const grads *gr, const cg_real *probs, const cg_real *pk, int64_t pks, int64_t i0,
                        int64_t nq, int64_t kend, const cg_real *L, const cg_real *dO, int64_t os, int64_t d,
                        const cg_real *di, cg_real *dp, cg_real *slot, bool ds, bool gq, bool gk, bool gv) {
    for (int64_t j0 = probs ? 0 : key_start(h, i0); j0 < kend; j0 += BK) {
        const int64_t nk = kend - j0 < BK ? kend - j0 : BK;
        cg_real *pb = probs ? (cg_real *)pk : slot;
        const int64_t ps = probs ? pks : h->sc; /* P's row stride */
        if (!probs) {
            if (!scores(h, i0, nq, j0, nk, pb, h->sc)) continue;
            for (int64_t r = 0; r < nq; r++) {
                cg_real *pr = pb + r * h->sc;
                const cg_real lr = L[i0 + r];
                for (int64_t c = 0; c < nk; c++) pr[c] = cgi_exp(pr[c] - lr);
            }
        }
        if (ds) /* dP = dO[i] V[j]^T */
            gemm1(nq, nk, d, dO + i0 * os, os, 1, h->v + j0 * h->vs, 1, h->vs, 1, 0, dp, h->sc, 1);
        const cg_real *pv = pb; /* the weights O was made of */
        int64_t pvs = ps;
        if (h->drop) { /* dS = P * (M dP - D), and M P into the slot (over P when it is there) */
            for (int64_t r = 0; r < nq; r++)
                cgi_attn_drop_grads(h, i0 + r, j0, nk, pb + r * ps, slot + r * h->sc, ds ? dp + r * h->sc : NULL, di[r]);
            pv = slot, pvs = h->sc;
        } else if (ds) /* dS = P * (dP - D) */
            for (int64_t r = 0; r < nq; r++) {
                cg_real *dr = dp + r * h->sc;
                const cg_real *pr = pb + r * ps, dr_i = di[r];
                for (int64_t c = 0; c < nk; c++) dr[c] = pr[c] * (dr[c] - dr_i);
            }
        if (gv) /* dV[j] += P^T dO[i] */
            gemm1(nk, d, nq, pv, 1, pvs, dO + i0 * os, os, 1, 1, 1, gr->v + j0 * gr->vr, gr->vr, gr->vc);
        if (!ds) continue;
        if (gr->bias || gr->rel) bias_grads(h, gr, i0, nq, j0, nk, dp);
        if (gq) /* dQ[i] += scale * dS K[j] */
            gemm1(nq, d, nk, dp, h->sc, 1, h->k + j0 * h->ks, h->ks, 1, h->scale, 1, gr->q + i0 * gr->qr, gr->qr, gr->qc);
        if (gk) /* dK[j] += scale * dS^T Q[i] */
            gemm1(nk, d, nq, dp, 1, h->sc, h->q + i0 * h->qs, h->qs, 1, h->scale, 1, gr->k + j0 * gr->kr, gr->kr, gr->kc);
    }
}

/* sum of x[e] y[e] in CGI_LANES partial sums, as the softmax's row reductions (graph/internal.h): a
 * single running sum is a chain of dependent adds, 3 us of a 64 x 64 head's backward. */
static cg_real row_dot(const cg_real *x, const cg_real *y, int64_t n) {
    cg_real acc[CGI_LANES] = {0};
    int64_t e = 0;
    for (; e + CGI_LANES <= n; e += CGI_LANES)
        for (int l = 0; l < CGI_LANES; l++) acc[l] += x[e + l] * y[e + l];
    cg_real s = 0;
    for (; e < n; e++) s += x[e] * y[e];
    for (int l = 0; l < CGI_LANES; l++) s += acc[l];
    return s;
}

/* Whether input j of t needs a gradient and is a view of root. */
static bool grad_of(const cg_tensor *t, int j, const cg_tensor *root) {
    return t->src[j]->requires_grad && t->src[j]->root == root;
}

/* With one query block a head (and one query head a key head), each head's dQ, dK and dV rows come
 * from one product each, written in full (rows that see no key get zeros). Where q, k and v that
 * share a node (self-attention's split projection; cross-attention's q alone and its split k and v)
 * hold all of its gradient and nothing has written it this pass, those products assign (beta 0)
 * instead of adding into a gradient zeroed first: encdec-base zeroed 63 MB a step for them. With
 * several query blocks a head (gpt-tiny's 256 causal queries: four), the blocks add into dK and dV,
 * so each head zeroes the rows a block is the first to write just before its products (zero_rows),
 * while they are about to be read anyway, instead of the whole node up front (gpt-tiny: 12.6 MB a
 * layer, a pass over memory of its own); the sums are the same. With grouped-query heads the
 * first query head of a group zeroes its key head's dK and dV rows, and the others add to them (a
 * unit runs them in order). Others are zeroed as before (cgi_grad_prepare). */

static void claim_qkv(cg_tensor *t, bool one_write, bool assign[3]) {
    for (int i = 0; i < 3; i++) {
        cg_tensor *root = t->src[i]->root, *views[3];
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= grad_of(t, j, root);
        if (!t->src[i]->requires_grad || seen) continue; /* done with the first input of its node */
        int n = 0;
        for (int j = i; j < 3; j++)
            if (grad_of(t, j, root)) views[n++] = t->src[j];
        const bool first = one_write && cgi_grad_begin_views(views, n);
        for (int j = i; j < 3; j++)
            if (grad_of(t, j, root)) {
                assign[j] = first;
                if (!first) cgi_grad_prepare(t->src[j]);
            }
    }
}

/* Rows [from, to) of a head's gradient g (rows rs apart, d contiguous features) set to 0; g NULL: none. */
static void zero_grad_rows(cg_real *g, int64_t rs, int64_t from, int64_t to, int64_t d) {
    for (int64_t r = from; g && r < to; r++) memset(g + r * rs, 0, (size_t)d * sizeof *g);
}

/* What the backward's units share (cgi_bwd_attention), for bwd_unit. */
typedef struct {
    const cg_tensor *t;
    const sdpa_params *p;
    cg_tensor *q, *k, *v, *bias;
    bool gq, gk, gv, gb, packed, direct, all_b, all_h;
    bool assign[3];    /* the products write dQ, dK, dV first: beta 0 */
    bool zero_rows[3]; /* or the head zeroes their rows block by block, and they add (claim_qkv) */
    int64_t B, hq, tq, d, tk, group, hunits;
    const cg_real *lse, *out, *dout, *probs;
    cg_real *drel;
    size_t stride;
    cgi_ukr u;
    cg_real *slot0; /* thread 0's slot */
} bwd_run;

/* Unit un of the backward (a batch and key head, or wider, see cgi_bwd_attention) in slot me. */
static void bwd_unit(const bwd_run *r, int64_t un, int me) {
    const cg_tensor *t = r->t;
    const sdpa_params *p = r->p;
    cg_tensor *q = r->q, *k = r->k, *v = r->v, *bias = r->bias;
    const bool gq = r->gq, gk = r->gk, gv = r->gv, gb = r->gb, packed = r->packed, direct = r->direct;
    const bool all_b = r->all_b, all_h = r->all_h;
    const bool *assign = r->assign;
    const int64_t B = r->B, hq = r->hq, tq = r->tq, d = r->d, tk = r->tk, group = r->group, hunits = r->hunits;
    const cg_real *lse = r->lse, *out = r->out, *dout = r->dout, *probs = r->probs;
    cg_real *drel = r->drel;
    const size_t stride = r->stride;
    const cgi_ukr u = r->u;
    for (int64_t b = all_b ? 0 : un / hunits; b < (all_b ? B : un / hunits + 1); b++)
    for (int64_t hh = all_h ? 0 : (un % hunits) * group; hh < (all_h ? hq : (un % hunits + 1) * group); hh++) {
        const int64_t bh = b * hq + hh, kh = hh / group;
        const unsigned csr = flush_begin();
        const int64_t rq = cgi_sdpa_slot_rows(t);
        cg_real *slot = r->slot0 + (size_t)me * stride, *dp = slot + rq * cgi_sdpa_slot_cols(t), *di = dp + rq * cgi_sdpa_slot_cols(t) + rq * d;
        head h;
        cgi_attn_head_at(t, bh, slot, &h);
        packs w = {0};
        if (packed) { /* V^T and K for every query block of the head */
            w = cgi_sdpa_packs_at(t, slot, &u, true);
            w.direct = direct;
            if (direct) {
                cgi_attn_transpose_panels(tk, d, h.v, h.vs, w.kv1);
                int64_t ks = h.ks;
                w.rows = cgi_attn_dense_rows(h.k, &ks, tk, d, w.kv2);
            } else {
                cgi_ukr_pack_b(&u, d, tk, h.v, 1, h.vs, w.kv1);
                cgi_ukr_pack_b(&u, tk, d, h.k, h.ks, 1, w.kv2);
            }
            if (w.kt && direct) cgi_attn_transpose_panels(tk, d, h.k, h.ks, w.kt); /* forward's K^T, to remake P */
            else if (w.kt) cgi_ukr_pack_b(&u, d, tk, h.k, 1, h.ks, w.kt);
        }
        const grads gr = {
            gq ? q->grad + b * q->stride[0] + hh * q->stride[1] : NULL,
            gk ? k->grad + b * k->stride[0] + kh * k->stride[1] : NULL,
            gv ? v->grad + b * v->stride[0] + kh * v->stride[1] : NULL,
            gb ? bias->grad + b * p->bias_st[0] + hh * p->bias_st[1] : NULL,
            drel ? drel + bh * p->nrel : NULL,
            q->stride[2], q->stride[3], k->stride[2], k->stride[3], v->stride[2], v->stride[3], p->bias_st[2], p->bias_st[3],
            assign[0] ? 0 : 1, assign[1] ? 0 : 1, assign[2] ? 0 : 1};
        /* dK's and dV's rows below this are zeroed (zero_rows); by the first query head of their group */
        int64_t kzero = hh % group == 0 ? 0 : tk;
        const bool ds = gq || gk || gb || drel;
        const int64_t os = h.os, at = b * t->stride[0] + hh * t->stride[1];
        const cg_real *o = out + at, *dO = dout + at, *L = lse + bh * tq;
        const int64_t bq = h.causal ? BQ / 2 : BQ;
        for (int64_t i0 = 0; i0 < tq; i0 += bq) {
            const int64_t nq = tq - i0 < bq ? tq - i0 : bq, kend = key_end(&h, i0, nq);
            for (int64_t r = 0; r < nq; r++) { /* D_i = rowsum(dO * O) */
                /* rows lie os apart (heads side by side): fetch a few rows ahead, which the
                 * hardware's stream prefetch does not across the gaps */
                for (int64_t e = 0; r + 4 < nq && e < d; e += 64 / (int64_t)sizeof(cg_real)) {
                    __builtin_prefetch(dO + (i0 + r + 4) * os + e);
                    __builtin_prefetch(o + (i0 + r + 4) * os + e);
                }
                di[r] = row_dot(dO + (i0 + r) * os, o + (i0 + r) * os, d);
            }
            const cg_real *pk = probs ? probs + (bh * tq + i0) * tk : NULL; /* this block's kept P */
            int64_t pks = tk;
            if (probs && p->lp_probs) { /* widen the stored bf16 rows into the slot (dropout's M P goes over them) */
                const cgi_bf16 *src = (const cgi_bf16 *)probs + (bh * tq + i0) * tk;
                for (int64_t r = 0; r < nq; r++)
                    for (int64_t c = 0; c < kend; c++) slot[r * h.sc + c] = cgi_from_bf16(src[r * tk + c]);
                pk = slot, pks = h.sc;
            }
            if (packed && p->remakes_probs) { /* P again, as forward made it (its lse goes to spare rows) */
                packs wf = w;
                wf.kv1 = w.kt;
                block_probs(&h, i0, nq, kend, slot, h.sc, di + rq, &u, &wf);
                for (int64_t r = 0; p->lp_probs && r < nq; r++) /* as a bf16 store would have kept them */
                    for (int64_t c = 0; c < kend; c++) slot[r * h.sc + c] = cgi_from_bf16(cgi_to_bf16(slot[r * h.sc + c]));
                pk = slot, pks = h.sc;
            }
            if (packed) {
                zero_grad_rows(r->zero_rows[0] ? gr.q : NULL, gr.qr, i0, i0 + nq, d);
                zero_grad_rows(r->zero_rows[1] ? gr.k : NULL, gr.kr, kzero, kend, d);
                zero_grad_rows(r->zero_rows[2] ? gr.v : NULL, gr.vr, kzero, kend, d);
                kzero = kend > kzero ? kend : kzero;
                bwd_packed(&h, &u, &w, i0, nq, kend, pk, pks, dO + i0 * os, di, dp, slot, &gr);
                continue;
            }
            bwd_blocked(&h, &gr, probs, pk, pks, i0, nq, kend, L, dO, os, d, di, dp, slot, ds, gq, gk, gv);
        }
        zero_grad_rows(r->zero_rows[1] ? gr.k : NULL, gr.kr, kzero, tk, d); /* keys no query block sees */
        zero_grad_rows(r->zero_rows[2] ? gr.v : NULL, gr.vr, kzero, tk, d);
        flush_end(csr);
    }
}

static void bwd_piece(void *ctx, int un) { bwd_unit(ctx, un, omp_get_thread_num()); }

void cgi_bwd_attention(cg_tensor *t) {
    const sdpa_params *p = prm(t);
    cg_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2], *bias = p->bias ? t->src[p->bias] : NULL,
              *table = p->table ? t->src[p->table] : NULL;
    const bool gq = q->requires_grad, gk = k->requires_grad, gv = v->requires_grad, gb = bias && bias->requires_grad,
               gt = table && table->requires_grad && cgi_sdpa_drel_reals(t);
    const int64_t B = t->shape[0], hq = t->shape[1], tq = t->shape[2], d = t->shape[3], tk = k->shape[2];
    const cg_real *lse = t->aux, *out = t->data, *dout = t->grad, *probs =
        p->keeps_probs && !p->remakes_probs ? lse + cgi_sdpa_probs_offset(t) : NULL;
    cg_real *drel = gt ? t->bwd_aux : NULL;
    if (drel) memset(drel, 0, cgi_sdpa_drel_reals(t) * sizeof(cg_real));
    const int slots = p->slots < cgi_nthreads() ? p->slots : cgi_nthreads(); /* a run may use fewer */
    cgi_ukr u;
    cgi_ukr_init(&u);
    /* the direct products write gradients along contiguous features (inputs are made so: cg_sdpa_ex) */
    const bool packed = cgi_sdpa_packs_heads(t), direct = packed && cgi_attn_direct() && q->stride[3] == 1 && k->stride[3] == 1 &&
                                                 v->stride[3] == 1;
    const size_t stride = cgi_sdpa_slot_stride(t, &u, true);
    /* Heads run in parallel, each writing its own rows of dQ, dK and dV. When two of those are one
     * storage seen differently (keys = queries shifted by a head), one head's dK is another's dQ:
     * the heads then run in order. The same view (q = k = v) keeps each head on one thread. */
    bool serial = false;
    for (int i = 0; i < t->nsrc; i++)
        for (int j = i + 1; j < t->nsrc; j++)
            serial |= t->src[i]->dtype == CG_REAL && t->src[j]->dtype == CG_REAL && cgi_grads_alias(t->src[i], t->src[j]) &&
                      !cgi_same_view(t->src[i], t->src[j]);
    /* With grouped-query heads several query heads write one head's dK and dV: a thread takes a
     * unit of (batch, key head) and runs its query heads in order, so no two threads share a
     * gradient row and the sums do not depend on the thread count. A bias that gets a gradient
     * and is broadcast over batches (or heads) widens the unit to every batch (or head) sharing a
     * slice of it. */
    const int64_t hkv = k->shape[1], group = hq / hkv;
    /* The gradients' first writes (the op claims every input, ops.def): see claim_qkv */
    bool assign[3] = {false, false, false};
    claim_qkv(t, packed && !p->past && !serial, assign);
    /* several query blocks a head, or several query heads a key head (grouped-query): zero_rows */
    const bool blocks = tq > (p->causal ? BQ / 2 : BQ) || group > 1;
    const bool zero_rows[3] = {assign[0] && blocks, assign[1] && blocks, assign[2] && blocks};
    for (int i = 0; i < 3; i++) assign[i] = assign[i] && !blocks;
    if (gb) cgi_grad_prepare(bias);
    if (table && table->requires_grad) cgi_grad_prepare(table);
    const bool all_b = gb && p->bias_st[0] == 0 && B > 1, all_h = gb && p->bias_st[1] == 0 && hq > 1;
    const int64_t bunits = all_b ? 1 : B, hunits = all_h ? 1 : hkv, units = bunits * hunits;
    const bwd_run r = {t, p, q, k, v, bias, gq, gk, gv, gb, packed, direct, all_b, all_h, {assign[0], assign[1], assign[2]},
                       {zero_rows[0], zero_rows[1], zero_rows[2]}, B, hq, tq, d, tk, group, hunits, lse, out, dout, probs,
                       drel, stride, u, (cg_real *)t->bwd_aux + cgi_sdpa_drel_reals(t)};
    if (serial)
        for (int64_t un = 0; un < units; un++) bwd_unit(&r, un, 0);
    else cgi_slot_pieces(units, p->slots, bwd_piece, (void *)&r); /* as the forward's heads */
    if (!drel) return;
    /* T5's table: each head's column gets its (batch, offset) sums in a fixed order */
    const int64_t nrel = p->nrel;
#pragma omp parallel for schedule(static) num_threads(slots) if (hq > 1 && slots > 1)
    for (int64_t hh = 0; hh < hq; hh++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t r = 0; r < nrel; r++)
                table->grad[p->bucket[r] * table->stride[0] + hh * table->stride[1]] += drel[(b * hq + hh) * nrel + r];
}
