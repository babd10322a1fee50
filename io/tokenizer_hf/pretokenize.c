/* SPDX-License-Identifier: MIT */
/* Pre-tokenizers: ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation and
 * BertPreTokenizer, each mapping every piece to the pieces it splits into (a Sequence is flattened
 * when loading). Splits keep or merge what they cut on as Hugging Face's SplitDelimiterBehavior. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_hf/internal.h"

/* A piece cut into segments, each either what the pattern matched or what lay between. */
typedef struct {
    size_t *a, *b;
    bool *m;
    size_t n, cap;
} segs;

static bool seg_add(segs *s, size_t a, size_t b, bool m) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        size_t *na = realloc(s->a, cap * sizeof *na);
        if (na) s->a = na;
        size_t *nb = realloc(s->b, cap * sizeof *nb);
        if (nb) s->b = nb;
        bool *nm = realloc(s->m, cap * sizeof *nm);
        if (nm) s->m = nm;
        if (!na || !nb || !nm) {
            cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %zu segments", cap);
            return false;
        }
        s->cap = cap;
    }
    s->a[s->n] = a, s->b[s->n] = b, s->m[s->n] = m;
    s->n++;
    return true;
}

static void segs_free(segs *s) {
    free(s->a), free(s->b), free(s->m);
}

/* Emits the segments of piece s into out as behaviour b says (after invert swapped the roles). */
static bool emit(const char *s, segs *g, cgi_hf_behavior b, bool invert, int32_t section, cgi_hf_pieces *out) {
    if (invert)
        for (size_t i = 0; i < g->n; i++) g->m[i] = !g->m[i];
    /* merge in place, as tokenizers' split does, then drop empty segments */
    size_t k = 0;
    bool prev = false;
    if (b == HF_MERGED_NEXT) {
        /* walk backwards: a match joins the segment after it */
        size_t w = g->n;
        for (size_t r = g->n; r-- > 0;) {
            bool m = g->m[r];
            if (m && !prev && w < g->n) g->a[w] = g->a[r];
            else {
                w--;
                g->a[w] = g->a[r], g->b[w] = g->b[r], g->m[w] = false;
            }
            prev = m;
        }
        for (size_t r = w; r < g->n; r++) g->a[k] = g->a[r], g->b[k] = g->b[r], g->m[k] = g->m[r], k++;
        g->n = k;
    } else if (b == HF_MERGED_PREV || b == HF_CONTIGUOUS) {
        for (size_t r = 0; r < g->n; r++) {
            bool m = g->m[r];
            bool join = b == HF_MERGED_PREV ? m && !prev : m == prev;
            if (join && k > 0) g->b[k - 1] = g->b[r];
            else g->a[k] = g->a[r], g->b[k] = g->b[r], g->m[k] = b == HF_CONTIGUOUS ? m : false, k++;
            prev = m;
        }
        g->n = k;
    }
    for (size_t i = 0; i < g->n; i++) {
        if (g->a[i] == g->b[i] || (b == HF_REMOVED && g->m[i])) continue;
        if (!cgi_hf_pieces_add(out, s + g->a[i], g->b[i] - g->a[i], section)) return false;
    }
    return true;
}

/* Segments of s by a pattern's matches (empty matches cut nothing). */
static cg_status split_pattern(const cgi_hf_pattern *p, pcre2_match_data *md, const char *s, size_t len, segs *g) {
    size_t pos = 0, last = 0, ms, me;
    int r;
    g->n = 0;
    while ((r = cgi_hf_pattern_next(p, md, s, len, &pos, &ms, &me)) > 0) {
        if (me == ms) continue;
        if ((ms > last && !seg_add(g, last, ms, false)) || !seg_add(g, ms, me, true)) return CG_ERR_NOMEM;
        last = me;
    }
    if (r < 0) return CG_ERR_RANGE;
    if (last < len && !seg_add(g, last, len, false)) return CG_ERR_NOMEM;
    return CG_OK;
}

typedef bool (*char_pred)(uint32_t cp);

/* Segments of s where every character that pred takes is a match of its own. */
static cg_status split_chars(char_pred pred, const char *s, size_t len, segs *g) {
    g->n = 0;
    size_t last = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        if (pred(cp)) {
            if ((i > last && !seg_add(g, last, i, false)) || !seg_add(g, i, i + k, true)) return CG_ERR_NOMEM;
            last = i + k;
        }
        i += k;
    }
    if (last < len && !seg_add(g, last, len, false)) return CG_ERR_NOMEM;
    return CG_OK;
}

static bool is_ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

static cg_status byte_level(const cgi_hf_pre *p, pcre2_match_data *md, const char *s, size_t len, int32_t section,
                            segs *g, cgi_hf_pieces *out) {
    cgi_buf pre = {0}, map = {0};
    cg_status st = CG_OK;
    if (p->add_prefix_space && (!len || s[0] != ' ')) {
        if (!cgi_buf_add(&pre, " ", 1) || !cgi_buf_add(&pre, s, len)) st = CG_ERR_NOMEM;
        s = pre.s, len = pre.n;
    }
    if (!st && p->use_regex) st = split_pattern(&p->pat, md, s, len, g);
    else if (!st) {
        g->n = 0;
        if (!seg_add(g, 0, len, false)) st = CG_ERR_NOMEM;
    }
    for (size_t i = 0; !st && i < g->n; i++) {
        if (g->a[i] == g->b[i]) continue;
        map.n = 0;
        for (size_t j = g->a[i]; j < g->b[i]; j++) {
            char u[4];
            if (!cgi_buf_add(&map, u, (size_t)cgi_utf8_put(cgi_hf_byte_cp((unsigned char)s[j]), u))) {
                st = CG_ERR_NOMEM;
                break;
            }
        }
        if (!st && !cgi_hf_pieces_add(out, map.s, map.n, section)) st = CG_ERR_NOMEM;
    }
    free(pre.s);
    free(map.s);
    return st;
}

static cg_status metaspace(const cgi_hf_pre *p, const char *s, size_t len, int32_t section, bool first, segs *g,
                           cgi_hf_pieces *out) {
    cgi_buf b = {0};
    cg_status st = CG_OK;
    bool prepend = p->prepend == HF_PREPEND_ALWAYS || (p->prepend == HF_PREPEND_FIRST && first);
    if (prepend && !(len >= p->repl_len && !memcmp(s, p->repl, p->repl_len)) && !cgi_buf_add(&b, p->repl, p->repl_len))
        st = CG_ERR_NOMEM;
    for (size_t i = 0; !st && i < len; i++)
        if (!(s[i] == ' ' ? cgi_buf_add(&b, p->repl, p->repl_len) : cgi_buf_add(&b, s + i, 1))) st = CG_ERR_NOMEM;
    if (!st && !p->split && !cgi_hf_pieces_add(out, b.s ? b.s : "", b.n, section)) st = CG_ERR_NOMEM;
    if (!st && p->split) {
        /* split before every replacement character (MergedWithNext) */
        g->n = 0;
        size_t last = 0;
        const char *bs = b.s ? b.s : "";
        for (size_t i = 0; !st && i + p->repl_len <= b.n;) {
            if (!memcmp(bs + i, p->repl, p->repl_len)) {
                if ((i > last && !seg_add(g, last, i, false)) || !seg_add(g, i, i + p->repl_len, true))
                    st = CG_ERR_NOMEM;
                i += p->repl_len;
                last = i;
            } else i++;
        }
        if (!st && last < b.n && !seg_add(g, last, b.n, false)) st = CG_ERR_NOMEM;
        if (!st && !emit(bs, g, HF_MERGED_NEXT, false, section, out)) st = CG_ERR_NOMEM;
    }
    free(b.s);
    return st;
}

static cg_status pre_one(const cgi_hf_pre *p, pcre2_match_data *md, const char *s, size_t len, int32_t section,
                         bool first, segs *g, cgi_hf_pieces *out) {
    cg_status st;
    switch (p->type) {
    case HF_BYTE_LEVEL: return byte_level(p, md, s, len, section, g, out);
    case HF_METASPACE: return metaspace(p, s, len, section, first, g, out);
    case HF_SPLIT:
        if ((st = split_pattern(&p->pat, md, s, len, g))) return st;
        return emit(s, g, p->behavior, p->invert, section, out) ? CG_OK : CG_ERR_NOMEM;
    case HF_WHITESPACE:
        if ((st = split_pattern(&p->pat, md, s, len, g))) return st;
        return emit(s, g, HF_REMOVED, true, section, out) ? CG_OK : CG_ERR_NOMEM;
    case HF_WHITESPACE_SPLIT:
        if ((st = split_chars(cgi_hf_js_space, s, len, g))) return st;
        return emit(s, g, HF_REMOVED, false, section, out) ? CG_OK : CG_ERR_NOMEM;
    case HF_DIGITS:
        if ((st = split_chars(is_ascii_digit, s, len, g))) return st;
        return emit(s, g, p->individual_digits ? HF_ISOLATED : HF_CONTIGUOUS, false, section, out) ? CG_OK
                                                                                                   : CG_ERR_NOMEM;
    case HF_PUNCTUATION:
        if ((st = split_chars(cgi_hf_is_punct, s, len, g))) return st;
        return emit(s, g, p->behavior, false, section, out) ? CG_OK : CG_ERR_NOMEM;
    case HF_BERT_PRE: {
        /* white space removed, then each punctuation character isolated */
        cgi_hf_pieces words = {0};
        if ((st = split_chars(cgi_hf_js_space, s, len, g)) == CG_OK &&
            !emit(s, g, HF_REMOVED, false, section, &words))
            st = CG_ERR_NOMEM;
        for (size_t i = 0; !st && i < words.n; i++) {
            const char *w = cgi_hf_piece(&words, i);
            if ((st = split_chars(cgi_hf_is_punct, w, words.len[i], g)) == CG_OK &&
                !emit(w, g, HF_ISOLATED, false, section, out))
                st = CG_ERR_NOMEM;
        }
        cgi_hf_pieces_free(&words);
        return st;
    }
    }
    return CG_OK;
}

cg_status cgi_hf_pretokenize(const cgi_hf *h, pcre2_match_data *md, cgi_hf_pieces *in, cgi_hf_pieces *tmp) {
    segs g = {0};
    cg_status st = CG_OK;
    for (int k = 0; k < h->n_pre && !st; k++) {
        cgi_hf_pieces_clear(tmp);
        for (size_t i = 0; i < in->n && !st; i++) {
            bool first = in->section[i] == 0 && i == 0;
            st = pre_one(&h->pre[k], md, cgi_hf_piece(in, i), in->len[i], in->section[i], first, &g, tmp);
        }
        cgi_hf_pieces swap = *in;
        *in = *tmp;
        *tmp = swap;
    }
    segs_free(&g);
    return st;
}
