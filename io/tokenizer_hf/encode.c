/* SPDX-License-Identifier: MIT */
/* The tokenizer.json pipeline: added tokens are cut out of the text first (longest match at each
 * position, as the reference's DictionarySplitter), every other section is normalized,
 * pre-tokenized and run through the model, and the post-processor's special tokens go around the
 * result. Decoding runs the decoders over the tokens' strings and joins what they give. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_hf/internal.h"

/* ---------------------------------------------------------------- added tokens */

/* The character before s[at] (0 at the start). */
static uint32_t cp_before(const char *s, size_t at) {
    if (!at) return 0;
    size_t j = at - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    cgi_utf8_next((const unsigned char *)s + j, &cp);
    return cp;
}

/* The added token starting at s[i] (the longest), or -1. */
static int added_at(const cgi_hf *h, const char *s, size_t len, size_t i) {
    unsigned char c = (unsigned char)s[i];
    for (int k = h->first_start[c]; k < h->first_start[c + 1]; k++) {
        const cgi_hf_added *a = &h->added[h->first_idx[k]];
        if (a->len > len - i || memcmp(s + i, a->content, a->len)) continue;
        if (a->single_word) {
            uint32_t after = 0;
            if (i + a->len < len) cgi_utf8_next((const unsigned char *)s + i + a->len, &after);
            if ((i && cgi_hf_is_word(cp_before(s, i))) || (after && cgi_hf_is_word(after))) continue;
        }
        return h->first_idx[k];
    }
    return -1;
}

/* Bytes of ECMAScript white space at the end of s[a..b), and at its start. */
static size_t trailing_space(const char *s, size_t a, size_t b) {
    size_t e = b;
    while (e > a) {
        size_t j = e - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        cgi_utf8_next((const unsigned char *)s + j, &cp);
        if (!cgi_hf_js_space(cp)) break;
        e = j;
    }
    return b - e;
}

static size_t leading_space(const char *s, size_t a, size_t b) {
    size_t i = a;
    while (i < b) {
        uint32_t cp;
        int k = cgi_utf8_next((const unsigned char *)s + i, &cp);
        if (!cgi_hf_js_space(cp)) break;
        i += (size_t)k;
    }
    return i - a;
}

/* One run of text between added tokens: normalize, pre-tokenize, model. */
static cg_status encode_text(const cg_tokenizer *t, pcre2_match_data *md, const char *s, size_t len, int32_t section,
                             cgi_buf *norm, cgi_hf_pieces *pa, cgi_hf_pieces *pb, cgi_ids *out) {
    const cgi_hf *h = t->hf;
    cg_status st = cgi_hf_normalize(h, md, s, len, norm);
    if (st || !norm->n) return st;
    cgi_hf_pieces_clear(pa);
    if (!cgi_hf_pieces_add(pa, norm->s, norm->n, section)) return CG_ERR_NOMEM;
    if ((st = cgi_hf_pretokenize(h, md, pa, pb))) return st;
    return cgi_hf_model_encode(t, pa, out);
}

cg_status cgi_hf_encode(const cg_tokenizer *t, const char *text, size_t len, bool add_special, cgi_ids *out) {
    const cgi_hf *h = t->hf;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    cgi_buf norm = {0};
    cgi_hf_pieces pa = {0}, pb = {0};
    cg_status st = CG_OK;
    if (add_special)
        for (int i = 0; i < h->n_pre_ids && !st; i++)
            if (!cgi_ids_push(out, h->pre_ids[i])) st = CG_ERR_NOMEM;
    /* sections: text runs and added tokens, numbered in order (Metaspace's "first" needs it) */
    size_t run = 0, i = 0;
    int32_t section = 0;
    size_t strip_next = 0; /* leading bytes of the next run an rstrip token removes */
    while (!st && i <= len) {
        int k = i < len ? added_at(h, text, len, i) : -1;
        if (k < 0 && i < len) {
            i++;
            continue;
        }
        /* the run [run, i) ends here */
        size_t a = run, b = i;
        a += strip_next < b - a ? strip_next : b - a;
        if (k >= 0 && h->added[k].lstrip) b -= trailing_space(text, a, b);
        if (b > a) st = encode_text(t, md, text + a, b - a, section, &norm, &pa, &pb, out);
        if (i > run) section++;
        if (k < 0) break;
        if (!st && !cgi_ids_push(out, h->added[k].id)) st = CG_ERR_NOMEM;
        section++;
        i += h->added[k].len;
        run = i;
        strip_next = h->added[k].rstrip ? leading_space(text, i, len) : 0;
    }
    if (add_special)
        for (int j = 0; j < h->n_post_ids && !st; j++)
            if (!cgi_ids_push(out, h->post_ids[j])) st = CG_ERR_NOMEM;
    pcre2_match_data_free(md);
    free(norm.s);
    cgi_hf_pieces_free(&pa);
    cgi_hf_pieces_free(&pb);
    return st;
}

/* ---------------------------------------------------------------- decoders */

static bool is_byte_token(const char *s, size_t len, int *byte) {
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v * 16 + d;
    }
    *byte = v;
    return true;
}

/* transformers' clean_up_tokenization: " ." -> "." and the like. */
static bool clean_up(const char *s, size_t len, cgi_buf *out) {
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", "'s", "'ve", "'re"};
    cgi_buf a = {0}, b = {0};
    bool ok = cgi_buf_add(&a, s, len);
    for (int r = 0; ok && r < 10; r++) {
        b.n = 0;
        ok = cgi_buf_add(&b, "", 0);
        size_t fl = strlen(from[r]);
        for (size_t i = 0; ok && i < a.n;) {
            if (a.n - i >= fl && !memcmp(a.s + i, from[r], fl)) ok = cgi_buf_add(&b, to[r], strlen(to[r])), i += fl;
            else ok = cgi_buf_add(&b, a.s + i, 1), i++;
        }
        cgi_buf sw = a;
        a = b;
        b = sw;
    }
    ok = ok && cgi_buf_add(out, a.s, a.n);
    free(a.s);
    free(b.s);
    return ok;
}

/* ByteLevel: every token's characters back to bytes (a token with a character outside the map,
 * as an added token, stands for its own UTF-8), all of it one string, ill-formed parts U+FFFD. */
static cg_status dec_byte_level(const cgi_hf_pieces *in, cgi_hf_pieces *out) {
    cgi_buf b = {0};
    cg_status st = CG_OK;
    for (size_t i = 0; i < in->n && !st; i++) {
        const char *s = cgi_hf_piece(in, i);
        size_t len = in->len[i], mark = b.n;
        bool mapped = true;
        for (size_t j = 0; j < len && mapped;) {
            uint32_t cp;
            j += (size_t)cgi_utf8_next((const unsigned char *)s + j, &cp);
            int byte = cgi_hf_char_byte(cp);
            if (byte < 0) mapped = false;
            else if (!cgi_buf_add(&b, &(char){(char)byte}, 1)) st = CG_ERR_NOMEM;
        }
        if (!mapped) {
            b.n = mark;
            if (!cgi_buf_add(&b, s, len)) st = CG_ERR_NOMEM;
        }
    }
    if (!st) {
        cgi_buf l = {0};
        if (!cgi_hf_add_lossy(&l, b.s ? b.s : "", b.n) || !cgi_hf_pieces_add(out, l.s ? l.s : "", l.n, 0)) st = CG_ERR_NOMEM;
        free(l.s);
    }
    free(b.s);
    return st;
}

/* ByteFallback: runs of <0xXX> tokens become their bytes when those are UTF-8, else one U+FFFD per
 * token (as tokenizers does). */
static cg_status dec_byte_fallback(const cgi_hf_pieces *in, cgi_hf_pieces *out) {
    cgi_buf b = {0};
    cg_status st = CG_OK;
    for (size_t i = 0; i < in->n && !st;) {
        int byte;
        if (!is_byte_token(cgi_hf_piece(in, i), in->len[i], &byte)) {
            if (!cgi_hf_pieces_add(out, cgi_hf_piece(in, i), in->len[i], 0)) st = CG_ERR_NOMEM;
            i++;
            continue;
        }
        b.n = 0;
        size_t j = i;
        while (!st && j < in->n && is_byte_token(cgi_hf_piece(in, j), in->len[j], &byte))
            if (!cgi_buf_add(&b, &(char){(char)byte}, 1)) st = CG_ERR_NOMEM;
            else j++;
        if (st) break;
        if (cgi_utf8_check(b.s, b.n) == b.n) {
            if (!cgi_hf_pieces_add(out, b.s, b.n, 0)) st = CG_ERR_NOMEM;
        } else
            for (size_t k = i; k < j && !st; k++) /* as tokenizers: one U+FFFD per byte token */
                if (!cgi_hf_pieces_add(out, "\xEF\xBF\xBD", 3, 0)) st = CG_ERR_NOMEM;
        i = j;
    }
    free(b.s);
    return st;
}

static cg_status dec_one(const cgi_hf_dec *d, pcre2_match_data *md, const cgi_hf_pieces *in, cgi_hf_pieces *out) {
    cgi_buf b = {0};
    cg_status st = CG_OK;
    switch (d->type) {
    case HF_DEC_BYTE_LEVEL: return dec_byte_level(in, out);
    case HF_DEC_BYTE_FALLBACK: return dec_byte_fallback(in, out);
    case HF_DEC_FUSE:
        for (size_t i = 0; i < in->n && !st; i++)
            if (!cgi_buf_add(&b, cgi_hf_piece(in, i), in->len[i])) st = CG_ERR_NOMEM;
        if (!st && !cgi_hf_pieces_add(out, b.s ? b.s : "", b.n, 0)) st = CG_ERR_NOMEM;
        break;
    case HF_DEC_STRIP:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = cgi_hf_piece(in, i);
            size_t a = 0, e = in->len[i];
            for (int k = 0; k < d->start && e - a >= d->a_len && !memcmp(s + a, d->a, d->a_len); k++) a += d->a_len;
            for (int k = 0; k < d->stop && e - a >= d->a_len && !memcmp(s + e - d->a_len, d->a, d->a_len); k++)
                e -= d->a_len;
            if (!cgi_hf_pieces_add(out, s + a, e - a, 0)) st = CG_ERR_NOMEM;
        }
        break;
    case HF_DEC_REPLACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            b.n = 0;
            if (!cgi_buf_add(&b, "", 0)) st = CG_ERR_NOMEM;
            else if (!(st = cgi_hf_pattern_replace(&d->pat, md, cgi_hf_piece(in, i), in->len[i], d->a, d->a_len, &b)) &&
                     !cgi_hf_pieces_add(out, b.s, b.n, 0))
                st = CG_ERR_NOMEM;
        }
        break;
    case HF_DEC_METASPACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = cgi_hf_piece(in, i);
            size_t len = in->len[i];
            b.n = 0;
            if (!cgi_buf_add(&b, "", 0)) st = CG_ERR_NOMEM;
            for (size_t j = 0; j < len && !st;) {
                if (len - j >= d->a_len && !memcmp(s + j, d->a, d->a_len)) {
                    if (!cgi_buf_add(&b, " ", 1)) st = CG_ERR_NOMEM;
                    j += d->a_len;
                } else if (!cgi_buf_add(&b, s + j, 1)) st = CG_ERR_NOMEM;
                else j++;
            }
            size_t cut = i == 0 && d->flag && b.n && b.s[0] == ' ';
            if (!st && !cgi_hf_pieces_add(out, b.s + cut, b.n - cut, 0)) st = CG_ERR_NOMEM;
        }
        break;
    case HF_DEC_WORDPIECE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = cgi_hf_piece(in, i);
            size_t len = in->len[i];
            b.n = 0;
            bool ok = cgi_buf_add(&b, "", 0);
            if (i && len >= d->a_len && !memcmp(s, d->a, d->a_len)) s += d->a_len, len -= d->a_len;
            else if (i) ok = ok && cgi_buf_add(&b, " ", 1);
            ok = ok && cgi_buf_add(&b, s, len);
            if (ok && d->flag) {
                cgi_buf c = {0};
                ok = clean_up(b.s, b.n, &c) && cgi_hf_pieces_add(out, c.s ? c.s : "", c.n, 0);
                free(c.s);
            } else ok = ok && cgi_hf_pieces_add(out, b.s, b.n, 0);
            if (!ok) st = CG_ERR_NOMEM;
        }
        break;
    case HF_DEC_BPE:
        for (size_t i = 0; i < in->n && !st; i++) {
            b.n = 0;
            cgi_hf_pattern lit = {.lit = d->a, .lit_len = d->a_len};
            if (!cgi_buf_add(&b, "", 0)) st = CG_ERR_NOMEM;
            else if (!(st = cgi_hf_pattern_replace(&lit, md, cgi_hf_piece(in, i), in->len[i], i + 1 == in->n ? "" : " ",
                                                   i + 1 == in->n ? 0 : 1, &b)) &&
                     !cgi_hf_pieces_add(out, b.s, b.n, 0))
                st = CG_ERR_NOMEM;
        }
        break;
    }
    free(b.s);
    return st;
}

cg_status cgi_hf_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    const cgi_hf *h = t->hf;
    cgi_hf_pieces a = {0}, b = {0};
    cgi_buf out = {0};
    cg_status st = CG_OK;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) st = cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    for (int64_t i = 0; i < n && !st; i++) {
        if (h->is_hole[ids[i]])
            st = cgi_fail(CG_ERR_RANGE, "[tokenizer] decode: id %d at position %lld is not a token of %s", (int)ids[i],
                          (long long)i, h->src);
        else if (!cgi_hf_pieces_add(&a, cgi_tok_str(t, ids[i]), (size_t)t->len[ids[i]], 0))
            st = CG_ERR_NOMEM;
    }
    for (int k = 0; k < h->n_dec && !st; k++) {
        cgi_hf_pieces_clear(&b);
        st = dec_one(&h->dec[k], md, &a, &b);
        cgi_hf_pieces swap = a;
        a = b;
        b = swap;
    }
    /* no decoder: tokens joined by spaces, as tokenizers does */
    for (size_t i = 0; i < a.n && !st; i++)
        if ((i && !h->n_dec && !cgi_buf_add(&out, " ", 1)) || !cgi_buf_add(&out, cgi_hf_piece(&a, i), a.len[i]))
            st = CG_ERR_NOMEM;
    if (!st && !out.s && !cgi_buf_add(&out, "", 0)) st = CG_ERR_NOMEM;
    if (!st && cgi_utf8_check(out.s, out.n) != out.n) { /* a vocabulary's odd bytes still come out as UTF-8 */
        cgi_buf l = {0};
        if (!cgi_hf_add_lossy(&l, out.s, out.n) || !cgi_buf_add(&l, "", 0)) st = CG_ERR_NOMEM;
        free(out.s);
        out = l;
    }
    if (md) pcre2_match_data_free(md);
    cgi_hf_pieces_free(&a);
    cgi_hf_pieces_free(&b);
    if (st) {
        free(out.s);
        return st;
    }
    *text = out.s;
    if (len) *len = out.n;
    return CG_OK;
}
