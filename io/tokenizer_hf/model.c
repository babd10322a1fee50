/* SPDX-License-Identifier: MIT */
/* The three models of tokenizer.json: BPE (merges by rank, lowest first, ties to the left, with
 * byte_fallback, fuse_unk, ignore_merges and the subword prefix/suffix), WordPiece (greedy longest
 * match) and Unigram (Viterbi over the pieces' log-probabilities). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_hf/internal.h"

/* Pushes id, fusing a run of unknown tokens into one when the model says so. */
static bool push_id(const cgi_hf *h, cgi_ids *out, int64_t start, int32_t id) {
    if (h->fuse_unk && id == h->unk && h->unk >= 0 && out->n > start && out->v[out->n - 1] == h->unk) return true;
    return cgi_ids_push(out, id);
}

/* The bytes of s as <0xXX> tokens when every one exists, else unk (nothing when there is no unk). */
static bool push_bytes(const cgi_hf *h, cgi_ids *out, int64_t start, const char *s, size_t len) {
    bool all = h->byte_fallback;
    for (size_t i = 0; all && i < len; i++) all = h->byte_id[(unsigned char)s[i]] >= 0;
    if (all) {
        for (size_t i = 0; i < len; i++)
            if (!cgi_ids_push(out, h->byte_id[(unsigned char)s[i]])) return false;
        return true;
    }
    return h->unk < 0 || push_id(h, out, start, h->unk);
}

/* ---------------------------------------------------------------- BPE */

typedef struct {
    int32_t *id, *prev, *next;
    size_t *at, *end; /* each symbol's bytes in the piece (for byte fallback) */
    uint64_t *heap;   /* rank << 32 | position of the left symbol */
    size_t nheap, cap;
    cgi_buf tmp;
} bpe_work;

static bool bpe_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap) return true;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(w->id, cap * sizeof *a);
    if (a) w->id = a;
    int32_t *b = realloc(w->prev, cap * sizeof *b);
    if (b) w->prev = b;
    int32_t *c = realloc(w->next, cap * sizeof *c);
    if (c) w->next = c;
    size_t *d = realloc(w->at, cap * sizeof *d);
    if (d) w->at = d;
    size_t *e = realloc(w->end, cap * sizeof *e);
    if (e) w->end = e;
    uint64_t *f = realloc(w->heap, 2 * cap * sizeof *f);
    if (f) w->heap = f;
    if (!a || !b || !c || !d || !e || !f) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for a piece of %zu characters", n);
        return false;
    }
    w->cap = cap;
    return true;
}

static void bpe_work_free(bpe_work *w) {
    free(w->id), free(w->prev), free(w->next), free(w->at), free(w->end), free(w->heap), free(w->tmp.s);
}

static void heap_push(bpe_work *w, uint64_t k) {
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p] <= k) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = k;
}

static uint64_t heap_pop(bpe_work *w) {
    uint64_t top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= last) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Queues the merge of symbol i with the one after it, if the pair has a rank. */
static void bpe_offer(const cg_tokenizer *t, bpe_work *w, int32_t i) {
    if (i < 0) return;
    int32_t j = w->next[i];
    if (j < 0 || w->id[i] < 0 || w->id[j] < 0) return;
    const int64_t *v = cgi_pairmap_get(&t->ranks, w->id[i], w->id[j]);
    if (v) heap_push(w, (uint64_t)(*v >> 32) << 32 | (uint32_t)i);
}

static cg_status bpe_piece(const cg_tokenizer *t, bpe_work *w, const char *s, size_t len, cgi_ids *out,
                           int64_t start) {
    const cgi_hf *h = t->hf;
    if (h->ignore_merges) {
        int32_t id = cgi_tokmap_get(t, s, len);
        if (id >= 0) return cgi_ids_push(out, id) ? CG_OK : CG_ERR_NOMEM;
    }
    /* one symbol per character (with the prefix after the first, the suffix on the last) */
    size_t n = 0;
    for (size_t i = 0; i < len; n++) i += (size_t)cgi_utf8_next((const unsigned char *)s + i, &(uint32_t){0});
    if (!bpe_reserve(w, n)) return CG_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < len; k++) {
        uint32_t cp;
        size_t cl = (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        int32_t id;
        if ((k == 0 || !h->prefix_len) && (k + 1 < n || !h->suffix_len)) id = cgi_tokmap_get(t, s + i, cl);
        else {
            w->tmp.n = 0;
            if ((k > 0 && !cgi_buf_add(&w->tmp, h->prefix, h->prefix_len)) || !cgi_buf_add(&w->tmp, s + i, cl) ||
                (k + 1 == n && !cgi_buf_add(&w->tmp, h->suffix, h->suffix_len)))
                return CG_ERR_NOMEM;
            id = cgi_tokmap_get(t, w->tmp.s, w->tmp.n);
        }
        w->id[k] = id;
        w->prev[k] = (int32_t)k - 1;
        w->next[k] = k + 1 < n ? (int32_t)k + 1 : -1;
        w->at[k] = i;
        w->end[k] = i + cl;
        i += cl;
    }
    w->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_offer(t, w, (int32_t)i);
    while (w->nheap) {
        uint64_t top = heap_pop(w);
        int32_t i = (int32_t)(uint32_t)top, j = w->next[i];
        /* stale entries: the left symbol merged away (id -2) or the pair changed */
        if (w->id[i] < 0 || j < 0) continue;
        const int64_t *v = cgi_pairmap_get(&t->ranks, w->id[i], w->id[j]);
        if (!v || (uint64_t)(*v >> 32) != top >> 32) continue;
        w->id[i] = (int32_t)(*v & 0xffffffff);
        w->end[i] = w->end[j];
        w->next[i] = w->next[j];
        if (w->next[i] >= 0) w->prev[w->next[i]] = i;
        w->id[j] = -2;
        bpe_offer(t, w, w->prev[i]);
        bpe_offer(t, w, i);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->next[i]) {
        bool ok = w->id[i] >= 0 ? push_id(h, out, start, w->id[i])
                                : push_bytes(h, out, start, s + w->at[i], w->end[i] - w->at[i]);
        if (!ok) return CG_ERR_NOMEM;
    }
    return CG_OK;
}

/* ---------------------------------------------------------------- WordPiece */

static cg_status wordpiece_piece(const cg_tokenizer *t, cgi_buf *tmp, const char *s, size_t len, cgi_ids *out,
                                 int64_t start) {
    const cgi_hf *h = t->hf;
    size_t nch = 0;
    for (size_t i = 0; i < len; nch++) i += (size_t)cgi_utf8_next((const unsigned char *)s + i, &(uint32_t){0});
    int64_t mark = out->n;
    if (nch > (size_t)h->max_chars) return push_id(h, out, start, h->unk) ? CG_OK : CG_ERR_NOMEM;
    for (size_t a = 0; a < len;) {
        size_t b = len;
        int32_t id = -1;
        while (b > a) {
            tmp->n = 0;
            if ((a > 0 && !cgi_buf_add(tmp, h->prefix, h->prefix_len)) || !cgi_buf_add(tmp, s + a, b - a))
                return CG_ERR_NOMEM;
            if ((id = cgi_tokmap_get(t, tmp->s, tmp->n)) >= 0) break;
            do b--; while (b > a && ((unsigned char)s[b] & 0xC0) == 0x80);
        }
        if (id < 0) { /* the word cannot be spelled: one unknown token for all of it */
            out->n = mark;
            return h->unk < 0 || push_id(h, out, start, h->unk) ? CG_OK : CG_ERR_NOMEM;
        }
        if (!cgi_ids_push(out, id)) return CG_ERR_NOMEM;
        a = b;
    }
    return CG_OK;
}

/* ---------------------------------------------------------------- Unigram */

typedef struct {
    double *best;
    int32_t *back_id;
    size_t *back_at;
    size_t cap;
} uni_work;

static cg_status unigram_piece(const cg_tokenizer *t, uni_work *w, const char *s, size_t len, cgi_ids *out,
                               int64_t start) {
    const cgi_hf *h = t->hf;
    if (len + 1 > w->cap) {
        size_t cap = len + 1;
        double *a = realloc(w->best, cap * sizeof *a);
        if (a) w->best = a;
        int32_t *b = realloc(w->back_id, cap * sizeof *b);
        if (b) w->back_id = b;
        size_t *c = realloc(w->back_at, cap * sizeof *c);
        if (c) w->back_at = c;
        if (!a || !b || !c) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for a piece of %zu bytes", len);
        w->cap = cap;
    }
    for (size_t i = 0; i <= len; i++) w->best[i] = -INFINITY;
    w->best[0] = 0;
    for (size_t a = 0; a < len;) {
        uint32_t cp;
        size_t first = (size_t)cgi_utf8_next((const unsigned char *)s + a, &cp);
        bool single = false;
        if (w->best[a] > -INFINITY) {
            for (size_t b = a + first; b <= len && b - a <= (size_t)h->max_piece_bytes;) {
                int32_t id = cgi_tokmap_get(t, s + a, b - a);
                if (id >= 0 && h->is_piece[id]) {
                    double c = w->best[a] + (id == h->unk ? h->unk_score : h->score[id]);
                    if (c > w->best[b]) w->best[b] = c, w->back_id[b] = id, w->back_at[b] = a;
                    if (b == a + first) single = true;
                }
                if (b == len) break;
                b += (size_t)cgi_utf8_next((const unsigned char *)s + b, &cp);
            }
            if (!single) {
                double c = w->best[a] + h->unk_score;
                if (c > w->best[a + first]) w->best[a + first] = c, w->back_id[a + first] = -1, w->back_at[a + first] = a;
            }
        }
        a += first;
    }
    /* walk back from the end, then emit in order */
    size_t nseg = 0;
    for (size_t b = len; b > 0; b = w->back_at[b]) nseg++;
    int64_t base = out->n;
    for (size_t i = 0; i < nseg; i++)
        if (!cgi_ids_push(out, 0)) return CG_ERR_NOMEM;
    size_t k = nseg;
    for (size_t b = len; b > 0; b = w->back_at[b]) out->v[base + (int64_t)--k] = (int32_t)b;
    /* out now holds segment ends; turn them into ids (unknown segments may become several bytes) */
    int32_t *ends = malloc(nseg * sizeof *ends + 1);
    if (!ends) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    memcpy(ends, out->v + base, nseg * sizeof *ends);
    out->n = base;
    cg_status st = CG_OK;
    for (size_t i = 0; i < nseg && !st; i++) {
        size_t b = (size_t)ends[i], a = w->back_at[b];
        int32_t id = w->back_id[b];
        bool ok = id >= 0 && id != h->unk ? cgi_ids_push(out, id) : push_bytes(h, out, start, s + a, b - a);
        if (!ok) st = CG_ERR_NOMEM;
    }
    free(ends);
    return st;
}

/* ---------------------------------------------------------------- dispatch */

cg_status cgi_hf_model_encode(const cg_tokenizer *t, const cgi_hf_pieces *p, cgi_ids *out) {
    const cgi_hf *h = t->hf;
    int64_t start = out->n;
    cg_status st = CG_OK;
    bpe_work bw = {0};
    uni_work uw = {0};
    cgi_buf tmp = {0};
    for (size_t i = 0; i < p->n && !st; i++) {
        const char *s = cgi_hf_piece(p, i);
        size_t len = p->len[i];
        if (!len) continue;
        switch (h->model) {
        case HF_MODEL_BPE: st = bpe_piece(t, &bw, s, len, out, start); break;
        case HF_MODEL_WORDPIECE: st = wordpiece_piece(t, &tmp, s, len, out, start); break;
        case HF_MODEL_UNIGRAM: st = unigram_piece(t, &uw, s, len, out, start); break;
        }
    }
    bpe_work_free(&bw);
    free(uw.best), free(uw.back_id), free(uw.back_at);
    free(tmp.s);
    return st;
}

cg_status cgi_hf_model_finish(cg_tokenizer *t) {
    cgi_hf *h = t->hf;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        h->byte_id[b] = cgi_tokmap_get(t, name, 6);
    }
    if (h->model != HF_MODEL_BPE) return CG_OK;
    if (!cgi_pairmap_init(&t->ranks, (size_t)t->nmerges)) return CG_ERR_NOMEM;
    cgi_buf cat = {0};
    cg_status st = CG_OK;
    for (int32_t r = 0; r < t->nmerges && !st; r++) {
        int32_t a = t->merge[2 * r], b = t->merge[2 * r + 1];
        cat.n = 0;
        if (!cgi_buf_add(&cat, cgi_tok_str(t, a), (size_t)t->len[a]) || !cgi_buf_add(&cat, cgi_tok_str(t, b), (size_t)t->len[b])) {
            st = CG_ERR_NOMEM;
            break;
        }
        int32_t m = cgi_tokmap_get(t, cat.s, cat.n);
        if (m < 0)
            st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merges[%d] (\"%s\" + \"%s\") makes a token not in the vocab",
                          h->src, (int)r, cgi_tok_str(t, a), cgi_tok_str(t, b));
        /* a repeated merge takes its last rank, as the reference's Map does */
        else if (!cgi_pairmap_put(&t->ranks, a, b, (int64_t)r << 32 | (uint32_t)m)) st = CG_ERR_NOMEM;
    }
    free(cat.s);
    return st;
}
