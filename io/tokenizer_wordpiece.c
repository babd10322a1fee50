/* SPDX-License-Identifier: MIT */
/* WordPiece as bert-base-uncased, following google-research/bert tokenization.py:
 * BasicTokenizer: drop NUL, U+FFFD and control characters, turn whitespace into spaces, put
 * spaces around CJK ideographs, split on whitespace, lower-case and strip accents (NFD, drop Mn;
 * per code point, so Greek final sigma lower-cases to σ like any sigma), split off punctuation;
 * then WordpieceTokenizer: greedy longest-match-first with "##" continuation pieces, [UNK] for a
 * word over 100 code points or one that cannot be spelled. Special tokens written in the text
 * ("[MASK]") are split like any text, as in the original; callers insert their ids directly. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

#define MAX_WORD_CHARS 100 /* BERT's max_input_chars_per_word */

cg_status cgi_wordpiece_finish(cg_tokenizer *t, const char *src) {
    t->unk = cgi_tokmap_get(t, "[UNK]", 5);
    if (t->unk < 0) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: the vocabulary has no [UNK] token", src);
    return CG_OK;
}

static bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

cg_tokenizer *cg_tokenizer_wordpiece_from_memory(const char *s, size_t len, const char *path) {
    if (!path) path = "vocab.txt";
    if (!s && len) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] wordpiece_from_memory: NULL bytes");
        return NULL;
    }
    size_t bad = cgi_utf8_check(s, len);
    if (bad < len) {
        int64_t line = 1;
        for (size_t i = 0; i < bad; i++) line += s[i] == '\n';
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: not valid UTF-8 at byte %zu (line %lld)", path, bad,
                 (long long)line);
        return NULL;
    }
    if (len == 0) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: empty vocabulary", path);
        return NULL;
    }
    const char *nul = memchr(s, 0, len); /* saved one token a line, a NUL would split the token */
    if (nul) {
        int64_t line = 1;
        for (const char *p = s; p < nul; p++) line += *p == '\n';
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: line %lld holds a NUL byte (byte %zu): a token cannot hold one", path,
                 (long long)line, (size_t)(nul - s));
        return NULL;
    }
    cg_tokenizer *t = cgi_tok_new(CG_TOK_WORDPIECE);
    if (!t) return NULL;
    /* One token a line, id = line number, surrounding whitespace stripped as in BERT's load_vocab. */
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(s + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - s) : len, a = i, b = e;
        while (a < b && is_ascii_space(s[a])) a++;
        while (b > a && is_ascii_space(s[b - 1])) b--;
        if (!cgi_tok_push(t, s + a, b - a)) goto fail;
        i = e + 1;
    }
    if (!cgi_tok_index(t) || cgi_wordpiece_finish(t, path) != CG_OK) goto fail;
    return t;
fail:
    cg_tokenizer_free(t);
    return NULL;
}

cg_tokenizer *cg_tokenizer_wordpiece_load(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] wordpiece_load: NULL path");
        return NULL;
    }
    size_t len;
    char *s = cgi_read_file(path, &len);
    cg_tokenizer *t = s ? cg_tokenizer_wordpiece_from_memory(s, len, path) : NULL;
    free(s);
    return t;
}

/* BERT's _is_chinese_char: the CJK Unified Ideographs blocks, not Hiragana, Katakana or Hangul. */
static bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* BERT's _is_punctuation: all non-alphanumeric ASCII plus Unicode P*. */
static bool is_punct(uint32_t c) {
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
    return c >= 128 && cgi_uc_is_punct(c);
}

/* Greedy longest-match-first over one basic token (UTF-8 in w, code point starts in at[0..n],
 * at[n] = its length); appends the pieces, or [UNK] if some part cannot be matched. */
static bool wordpiece(const cg_tokenizer *t, const char *w, const size_t *at, size_t n, cgi_buf *key,
                      cgi_ids *out) {
    if (n > MAX_WORD_CHARS) return cgi_ids_push(out, t->unk);
    int64_t mark = out->n;
    for (size_t s = 0; s < n;) {
        int32_t id = -1;
        size_t e = n;
        for (; e > s; e--) {
            key->n = 0;
            if ((s > 0 && !cgi_buf_add(key, "##", 2)) || !cgi_buf_add(key, w + at[s], at[e] - at[s])) return false;
            id = cgi_tokmap_get(t, key->s, key->n);
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = mark;
            return cgi_ids_push(out, t->unk);
        }
        if (!cgi_ids_push(out, id)) return false;
        s = e;
    }
    return true;
}

cg_status cgi_wordpiece_encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
    cgi_ids out = {0};
    cgi_buf w = {0}, key = {0};
    size_t *at = NULL, nat = 0, capat = 0; /* code point starts of the current word in w */
    bool ok = true;
    /* Walks the text once; w collects the folded current word between separators, and each
     * punctuation character or CJK ideograph ends the word and is a word of its own. */
    size_t i = 0;
    while (ok) {
        uint32_t c = 0;
        bool end = i >= len;
        if (!end) i += (size_t)cgi_utf8_next((const unsigned char *)text + i, &c);
        if (!end && (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && cgi_uc_is_control(c))))
            continue; /* _clean_text drops these */
        bool space = end || cgi_uc_is_space(c) || cgi_uc_is_zs(c);
        uint32_t f[3];
        int nf = space ? 0 : cgi_uc_fold(c, f); /* CJK compatibility ideographs fold too */
        bool alone = nf == 1 && (is_cjk(c) || is_punct(f[0])); /* a token by itself */
        if (space || alone) { /* the word so far is complete */
            if (nat) {
                at[nat] = w.n;
                ok = wordpiece(t, w.s, at, nat, &key, &out);
            }
            w.n = 0;
            nat = 0;
        }
        if (end) break;
        for (int k = 0; ok && k < nf; k++) {
            char u[4];
            if (!alone && is_punct(f[k])) { /* punctuation from a multi-code-point fold */
                if (nat) {
                    at[nat] = w.n;
                    ok = wordpiece(t, w.s, at, nat, &key, &out);
                }
                w.n = 0;
                nat = 0;
                size_t one[2] = {0, (size_t)cgi_utf8_put(f[k], u)};
                ok = ok && wordpiece(t, u, one, 1, &key, &out);
                continue;
            }
            if (nat + 2 > capat) {
                size_t cap = capat ? 2 * capat : 64;
                size_t *na = realloc(at, cap * sizeof *na);
                if (!na) {
                    ok = false;
                    cgi_fail(CG_ERR_NOMEM, "[tokenizer] encode: out of memory");
                    break;
                }
                at = na;
                capat = cap;
            }
            at[nat++] = w.n;
            ok = cgi_buf_add(&w, u, (size_t)cgi_utf8_put(f[k], u));
        }
        if (ok && alone) {
            at[nat] = w.n;
            ok = wordpiece(t, w.s, at, nat, &key, &out);
            w.n = 0;
            nat = 0;
        }
    }
    free(at);
    free(w.s);
    free(key.s);
    if (!ok) {
        free(out.v);
        return CG_ERR_NOMEM;
    }
    *ids = out.v;
    *n = out.n;
    return CG_OK;
}

cg_status cgi_wordpiece_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    cgi_buf b = {0};
    bool ok = cgi_buf_add(&b, "", 0);
    for (int64_t i = 0; ok && i < n; i++) {
        const char *s = cgi_tok_str(t, ids[i]);
        size_t l = (size_t)t->len[ids[i]];
        if (i > 0 && l >= 2 && s[0] == '#' && s[1] == '#') ok = cgi_buf_add(&b, s + 2, l - 2);
        else ok = (i == 0 || cgi_buf_add(&b, " ", 1)) && cgi_buf_add(&b, s, l);
    }
    if (!ok) {
        free(b.s);
        return CG_ERR_NOMEM;
    }
    *text = b.s;
    if (len) *len = b.n;
    return CG_OK;
}
