/* SPDX-License-Identifier: MIT */
/* Normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase (full mapping, as String.toLowerCase),
 * Strip, StripAccents, Replace, Prepend and BertNormalizer, applied in order (a Sequence is
 * flattened when loading). */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "io/tokenizer_hf/internal.h"

static bool put_cp(cgi_buf *out, uint32_t cp) {
    char u[4];
    return cgi_buf_add(out, u, (size_t)cgi_utf8_put(cp, u));
}

static cg_status unicode_form(const char *s, size_t len, int options, cgi_buf *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = len ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                            (utf8proc_option_t)(options | UTF8PROC_STABLE))
                             : 0;
    if (n < 0) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] normalize: %s", utf8proc_errmsg(n));
    bool ok = cgi_buf_add(out, dst, (size_t)n);
    free(dst);
    return ok ? CG_OK : CG_ERR_NOMEM;
}

static bool is_cased(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
}

static bool is_case_ignorable(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == '.' || cp == ':' ||
           cp == '^' || cp == '`' || cp == 0xB7 || cp == 0x2018 || cp == 0x2019 || cp == 0x2024 || cp == 0x2027;
}

/* Whether the capital sigma at s[at] ends a word (Unicode's Final_Sigma condition). */
static bool final_sigma(const char *s, size_t len, size_t at) {
    bool before = false;
    for (size_t i = at; i > 0;) {
        size_t j = i - 1;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        cgi_utf8_next((const unsigned char *)s + j, &cp);
        if (is_case_ignorable(cp)) { i = j; continue; }
        before = is_cased(cp);
        break;
    }
    if (!before) return false;
    for (size_t i = at + 2; i < len;) {
        uint32_t cp;
        i += (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        if (is_case_ignorable(cp)) continue;
        return !is_cased(cp);
    }
    return true;
}

static cg_status lowercase(const char *s, size_t len, cgi_buf *out) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        bool ok;
        if (cp == 0x130) ok = cgi_buf_add(out, "i\xCC\x87", 3); /* the one unconditional 1 -> 2 mapping */
        else if (cp == 0x3A3) ok = put_cp(out, final_sigma(s, len, i) ? 0x3C2 : 0x3C3);
        else ok = put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        if (!ok) return CG_ERR_NOMEM;
        i += k;
    }
    return CG_OK;
}

static cg_status strip(const char *s, size_t len, bool left, bool right, cgi_buf *out) {
    size_t a = 0, b = len;
    uint32_t cp;
    while (left && a < b) {
        int k = cgi_utf8_next((const unsigned char *)s + a, &cp);
        if (!cgi_hf_js_space(cp)) break;
        a += (size_t)k;
    }
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        cgi_utf8_next((const unsigned char *)s + j, &cp);
        if (!cgi_hf_js_space(cp)) break;
        b = j;
    }
    return cgi_buf_add(out, s + a, b - a) ? CG_OK : CG_ERR_NOMEM;
}

/* Drops every mark (\p{M}), as the reference's remove_accents. */
static cg_status strip_accents(const char *s, size_t len, cgi_buf *out) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME &&
            !cgi_buf_add(out, s + i, k))
            return CG_ERR_NOMEM;
        i += k;
    }
    return CG_OK;
}

static bool is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* BertNormalizer: clean_text (drop NUL, U+FFFD and control characters, white space to ' '),
 * handle_chinese_chars (spaces around CJK ideographs), then lowercase and/or strip accents. */
static cg_status bert_norm(const cgi_hf_norm *n, const char *s, size_t len, cgi_buf *out) {
    cgi_buf a = {0}, b = {0};
    cg_status st = CG_OK;
    for (size_t i = 0; i < len && !st;) {
        uint32_t cp;
        size_t k = (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
        i += k;
        if (n->left) {
            utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
            bool control = cp != '\t' && cp != '\n' && cp != '\r' &&
                           (c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO ||
                            c == UTF8PROC_CATEGORY_CS);
            if (cp == 0 || cp == 0xFFFD || control) continue;
            if (cgi_hf_js_space(cp)) cp = ' ';
        }
        bool ok = true;
        if (n->right && is_cjk(cp)) ok = cgi_buf_add(&a, " ", 1) && put_cp(&a, cp) && cgi_buf_add(&a, " ", 1);
        else ok = put_cp(&a, cp);
        if (!ok) st = CG_ERR_NOMEM;
    }
    const char *cur = a.s ? a.s : "";
    size_t cur_len = a.n;
    if (!st && n->lower) {
        st = lowercase(cur, cur_len, &b);
        cur = b.s ? b.s : "", cur_len = b.n;
    }
    if (!st && n->strip_accents) {
        cgi_buf c = {0};
        st = unicode_form(cur, cur_len, UTF8PROC_DECOMPOSE, &c);
        if (!st) {
            /* the reference's BertNormalizer drops \p{Mn} only */
            for (size_t i = 0; i < c.n && !st;) {
                uint32_t cp;
                size_t k = (size_t)cgi_utf8_next((const unsigned char *)c.s + i, &cp);
                if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN && !cgi_buf_add(out, c.s + i, k))
                    st = CG_ERR_NOMEM;
                i += k;
            }
        }
        free(c.s);
    } else if (!st && !cgi_buf_add(out, cur, cur_len)) st = CG_ERR_NOMEM;
    free(a.s);
    free(b.s);
    return st;
}

static cg_status norm_one(const cgi_hf_norm *n, pcre2_match_data *md, const char *s, size_t len, cgi_buf *out) {
    switch (n->type) {
    case HF_NFC: return unicode_form(s, len, UTF8PROC_COMPOSE, out);
    case HF_NFD: return unicode_form(s, len, UTF8PROC_DECOMPOSE, out);
    case HF_NFKC: return unicode_form(s, len, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case HF_NFKD: return unicode_form(s, len, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case HF_LOWERCASE: return lowercase(s, len, out);
    case HF_STRIP: return strip(s, len, n->left, n->right, out);
    case HF_STRIP_ACCENTS: return strip_accents(s, len, out);
    case HF_REPLACE: return cgi_hf_pattern_replace(&n->pat, md, s, len, n->str, n->str_len, out);
    case HF_PREPEND:
        return !len || (cgi_buf_add(out, n->str, n->str_len) && cgi_buf_add(out, s, len)) ? CG_OK : CG_ERR_NOMEM;
    case HF_BERT_NORM: return bert_norm(n, s, len, out);
    }
    return CG_OK;
}

cg_status cgi_hf_normalize(const cgi_hf *h, pcre2_match_data *md, const char *s, size_t len, cgi_buf *out) {
    out->n = 0;
    if (!cgi_buf_add(out, s, len)) return CG_ERR_NOMEM;
    cgi_buf tmp = {0};
    cg_status st = CG_OK;
    for (int i = 0; i < h->n_norm && !st; i++) {
        tmp.n = 0;
        if (!cgi_buf_add(&tmp, "", 0)) st = CG_ERR_NOMEM;
        else st = norm_one(&h->norm[i], md, out->s, out->n, &tmp);
        cgi_buf swap = *out;
        *out = tmp;
        tmp = swap;
    }
    free(tmp.s);
    return st;
}
