/* SPDX-License-Identifier: MIT */
/* Byte-level BPE as GPT-2: the pre-tokenizer, encoding by merge rank, loading and saving
 * encoder.json + vocab.bpe, and training on a corpus.
 *
 * GPT-2 splits text with the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * which piece_end() follows by hand: \p{L} and \p{N} are the exact Unicode classes (tables in
 * io/tokenizer_unicode.c), \s is Unicode White_Space. Each piece's UTF-8 bytes become one token
 * per byte (every byte has a token, so any text encodes and decodes back exactly), then the
 * adjacent pair with the best merge rank is merged, everywhere in the piece, until none is left. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/tokenizer_internal.h"

/* Bytes GPT-2 shows as themselves; the other 68 are shown as U+0100 + their rank among them. */
static bool printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); }

static void byte_codepoints(uint32_t cp_of[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) cp_of[b] = printable_byte(b) ? (uint32_t)b : next++;
}

/* ---------------------------------------------------------------- pre-tokenizer */

enum { CL_OTHER, CL_LETTER, CL_NUMBER, CL_SPACE };

static uint8_t classify(uint32_t cp) {
    if (cp < 128) { /* the common case without a table search */
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CL_LETTER;
        if (cp >= '0' && cp <= '9') return CL_NUMBER;
        return cgi_uc_is_space(cp) ? CL_SPACE : CL_OTHER;
    }
    if (cgi_uc_is_space(cp)) return CL_SPACE;
    if (cgi_uc_is_letter(cp)) return CL_LETTER;
    return cgi_uc_is_number(cp) ? CL_NUMBER : CL_OTHER;
}

/* End (exclusive, in code points) of the piece of GPT-2's pattern that starts at i < n. */
static size_t piece_end(const uint32_t *cp, const uint8_t *cl, size_t n, size_t i) {
    if (cp[i] == '\'' && i + 1 < n) { /* 's 't 're 've 'm 'll 'd, lower case only as in GPT-2 */
        uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    size_t s = cp[i] == ' ' ? i + 1 : i; /* the optional leading space of " ?X+" */
    if (s < n && cl[s] != CL_SPACE) {
        uint8_t c = cl[s]; /* letters, numbers, or anything else that is not a space */
        size_t e = s + 1;
        while (e < n && cl[e] == c) e++;
        return e;
    }
    size_t e = i; /* \s+(?!\S): a space run, less its last space when a non-space follows */
    while (e < n && cl[e] == CL_SPACE) e++;
    return e == n || e - i == 1 ? e : e - 1;
}

/* Decodes valid UTF-8 into code points, their classes and byte offsets (pos[n] = len). */
static bool decode_text(const char *text, size_t len, uint32_t **cp, uint8_t **cl, size_t **pos,
                        size_t *n) {
    *cp = malloc((len + 1) * sizeof **cp);
    *cl = malloc(len + 1);
    *pos = malloc((len + 1) * sizeof **pos);
    if (!*cp || !*cl || !*pos) {
        free(*cp), free(*cl), free(*pos);
        *cp = NULL, *cl = NULL, *pos = NULL;
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %zu bytes of text", len);
        return false;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; k++) {
        (*pos)[k] = i;
        i += (size_t)cgi_utf8_next((const unsigned char *)text + i, &(*cp)[k]);
        (*cl)[k] = classify((*cp)[k]);
    }
    (*pos)[k] = len;
    *n = k;
    return true;
}

/* ---------------------------------------------------------------- encode and decode */

/* Merges the byte tokens of one piece by rank, in place; returns the token count. */
static size_t bpe_piece(const cg_tokenizer *t, const unsigned char *b, size_t nb, int32_t *sym) {
    size_t k = nb;
    for (size_t i = 0; i < nb; i++) sym[i] = t->byte_tok[b[i]];
    while (k > 1) {
        int64_t best = INT64_MAX; /* rank << 32 | merged id: the lowest rank wins */
        size_t at = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            const int64_t *v = cgi_pairmap_get(&t->ranks, sym[i], sym[i + 1]);
            if (v && *v < best) {
                best = *v;
                at = i;
            }
        }
        if (best == INT64_MAX) break;
        int32_t x = sym[at], y = sym[at + 1], merged = (int32_t)(best & 0xffffffff);
        size_t w = at;
        for (size_t i = at; i < k;) {
            if (i + 1 < k && sym[i] == x && sym[i + 1] == y) {
                sym[w++] = merged;
                i += 2;
            } else {
                sym[w++] = sym[i++];
            }
        }
        k = w;
    }
    return k;
}

cg_status cgi_bpe_encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
    uint32_t *cp;
    uint8_t *cl;
    size_t *pos, ncp;
    if (!decode_text(text, len, &cp, &cl, &pos, &ncp)) return CG_ERR_NOMEM;
    int32_t *sym = malloc(len * sizeof *sym);
    cgi_ids out = {0};
    cg_status st = sym ? CG_OK : cgi_fail(CG_ERR_NOMEM, "[tokenizer] encode: out of memory");
    for (size_t i = 0; st == CG_OK && i < ncp;) {
        size_t e = piece_end(cp, cl, ncp, i);
        size_t k = bpe_piece(t, (const unsigned char *)text + pos[i], pos[e] - pos[i], sym);
        for (size_t j = 0; j < k && st == CG_OK; j++)
            if (!cgi_ids_push(&out, sym[j])) st = CG_ERR_NOMEM;
        i = e;
    }
    free(cp), free(cl), free(pos), free(sym);
    if (st != CG_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return CG_OK;
}

cg_status cgi_bpe_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += (size_t)(t->raw_off[ids[i] + 1] - t->raw_off[ids[i]]);
    char *s = malloc(total + 1);
    if (!s) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t m = (size_t)(t->raw_off[ids[i] + 1] - t->raw_off[ids[i]]);
        memcpy(s + k, t->raw + t->raw_off[ids[i]], m);
        k += m;
    }
    s[k] = 0;
    *text = s;
    if (len) *len = k;
    return CG_OK;
}

/* ---------------------------------------------------------------- building from files */

cg_status cgi_bpe_add_merge(cg_tokenizer *t, const char *s, size_t len, const char *src, const char *what,
                            int64_t where) {
    if (len && s[len - 1] == '\r') len--;
    const char *sp = memchr(s, ' ', len);
    if (!sp || sp == s || sp == s + len - 1 || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s %s %lld: expected two tokens separated by one space, "
                        "got \"%.*s\"", src, what, (long long)where, (int)(len > 80 ? 80 : len), s);
    size_t la = (size_t)(sp - s), lb = len - la - 1;
    int32_t a = cgi_tokmap_get(t, s, la), b = cgi_tokmap_get(t, sp + 1, lb);
    if (a < 0 || b < 0)
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s %s %lld: token \"%.*s\" is not in the vocabulary", src,
                        what, (long long)where, (int)(a < 0 ? la : lb), a < 0 ? s : sp + 1);
    if (t->nmerges == t->merge_cap) {
        int32_t cap = t->merge_cap ? 2 * t->merge_cap : 1024;
        int32_t *m = realloc(t->merge, 2 * (size_t)cap * sizeof *m);
        if (!m) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %d merges", (int)cap);
        t->merge = m;
        t->merge_cap = cap;
    }
    t->merge[2 * t->nmerges] = a;
    t->merge[2 * t->nmerges + 1] = b;
    t->nmerges++;
    return CG_OK;
}

cg_status cgi_bpe_finish(cg_tokenizer *t, const char *src) {
    uint32_t cp_of[256];
    int16_t byte_of[324]; /* inverse of cp_of; -1 where no byte maps */
    byte_codepoints(cp_of);
    memset(byte_of, 0xff, sizeof byte_of);
    for (int b = 0; b < 256; b++) byte_of[cp_of[b]] = (int16_t)b;
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = cgi_utf8_put(cp_of[b], u);
        t->byte_tok[b] = cgi_tokmap_get(t, u, (size_t)k);
        if (t->byte_tok[b] < 0)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: no token for byte 0x%02x (\"%.*s\"), which byte-level "
                            "BPE needs", src, b, k, u);
    }
    /* What each token stands for: its characters mapped back to bytes (characters outside the
     * byte alphabet, as in added special tokens, stand for their own UTF-8). */
    free(t->raw);
    free(t->raw_off);
    t->raw = malloc(t->pool_len + 1);
    t->raw_off = malloc(((size_t)t->n + 1) * sizeof *t->raw_off);
    if (!t->raw || !t->raw_off) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    int64_t k = 0;
    for (int32_t i = 0; i < t->n; i++) {
        const char *s = cgi_tok_str(t, i);
        size_t len = (size_t)t->len[i], bad = cgi_utf8_check(s, len);
        if (bad < len)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: token %d is not valid UTF-8 at its byte %zu", src,
                            (int)i, bad);
        t->raw_off[i] = k;
        for (size_t j = 0; j < len;) {
            uint32_t c;
            int m = cgi_utf8_next((const unsigned char *)s + j, &c);
            if (c < 324 && byte_of[c] >= 0) t->raw[k++] = (uint8_t)byte_of[c];
            else {
                memcpy(t->raw + k, s + j, (size_t)m);
                k += m;
            }
            j += (size_t)m;
        }
    }
    t->raw_off[t->n] = k;
    cgi_pairmap_free(&t->ranks);
    if (!cgi_pairmap_init(&t->ranks, (size_t)t->nmerges)) return CG_ERR_NOMEM;
    cgi_buf cat = {0};
    for (int32_t r = 0; r < t->nmerges; r++) {
        int32_t a = t->merge[2 * r], b = t->merge[2 * r + 1];
        cat.n = 0;
        if (!cgi_buf_add(&cat, cgi_tok_str(t, a), (size_t)t->len[a]) ||
            !cgi_buf_add(&cat, cgi_tok_str(t, b), (size_t)t->len[b])) {
            free(cat.s);
            return CG_ERR_NOMEM;
        }
        int32_t id = cgi_tokmap_get(t, cat.s, cat.n);
        if (id < 0) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merge %d (\"%s %s\") makes \"%s\", which is not in the "
                     "vocabulary", src, (int)r, cgi_tok_str(t, a), cgi_tok_str(t, b), cat.s);
            free(cat.s);
            return CG_ERR_FORMAT;
        }
        /* A pair listed twice keeps its last rank, as Python's dict(zip(merges, ranks)) does. */
        if (!cgi_pairmap_put(&t->ranks, a, b, (int64_t)r << 32 | id)) {
            free(cat.s);
            return CG_ERR_NOMEM;
        }
    }
    free(cat.s);
    return CG_OK;
}

cg_tokenizer *cg_tokenizer_bpe_from_memory(const char *js, size_t js_len, const char *bpe, size_t bpe_len,
                                           const char *encoder_json, const char *vocab_bpe) {
    if (!encoder_json) encoder_json = "encoder.json";
    if (!vocab_bpe) vocab_bpe = "vocab.bpe";
    if ((!js && js_len) || (!bpe && bpe_len)) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] bpe_from_memory: NULL bytes");
        return NULL;
    }
    cg_tokenizer *t = NULL;
    const char **by_id = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(js ? js : "", js_len, &end, false);
    if (!root) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: malformed JSON near byte %zu", encoder_json,
                 end ? (size_t)(end - js) : 0);
        goto fail;
    }
    for (const char *p = end; p < js + js_len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: bytes after the JSON object at byte %zu", encoder_json,
                     (size_t)(p - js));
            goto fail;
        }
    int n = cJSON_GetArraySize(root);
    if (!cJSON_IsObject(root) || n == 0) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: expected a non-empty JSON object of token: id", encoder_json);
        goto fail;
    }
    by_id = calloc((size_t)n, sizeof *by_id);
    t = cgi_tok_new(CG_TOK_BPE);
    if (!by_id || !t) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        goto fail;
    }
    for (const cJSON *e = root->child; e; e = e->next) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(d >= 0 && d < n && d == (double)(int)d)) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: token \"%s\" has id %s, expected an integer in [0, %d)",
                     encoder_json, e->string, cJSON_IsNumber(e) ? "out of range" : "that is not a number", n);
            goto fail;
        }
        if (by_id[(int)d]) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: id %d is given to both \"%s\" and \"%s\"", encoder_json,
                     (int)d, by_id[(int)d], e->string);
            goto fail;
        }
        by_id[(int)d] = e->string;
    }
    for (int i = 0; i < n; i++) /* n distinct ids in [0, n): every slot is filled */
        if (!cgi_tok_push(t, by_id[i], strlen(by_id[i]))) goto fail;
    if (!cgi_tok_index(t)) goto fail;

    int64_t line = 1;
    for (size_t i = 0; i < bpe_len; line++) {
        const char *nl = memchr(bpe + i, '\n', bpe_len - i);
        size_t e = nl ? (size_t)(nl - bpe) : bpe_len;
        bool header = line == 1 && e - i >= 8 && memcmp(bpe + i, "#version", 8) == 0;
        if (!header && cgi_bpe_add_merge(t, bpe + i, e - i, vocab_bpe, "line", line) != CG_OK) goto fail;
        i = e + 1;
    }
    if (cgi_bpe_finish(t, vocab_bpe) != CG_OK) goto fail;
    free(by_id);
    cJSON_Delete(root);
    return t;
fail:
    free(by_id);
    cJSON_Delete(root);
    cg_tokenizer_free(t);
    return NULL;
}

cg_tokenizer *cg_tokenizer_bpe_load(const char *encoder_json, const char *vocab_bpe) {
    if (!encoder_json || !vocab_bpe) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] bpe_load: NULL path");
        return NULL;
    }
    size_t jlen, blen;
    char *js = cgi_read_file(encoder_json, &jlen), *bpe = js ? cgi_read_file(vocab_bpe, &blen) : NULL;
    cg_tokenizer *t = bpe ? cg_tokenizer_bpe_from_memory(js, jlen, bpe, blen, encoder_json, vocab_bpe) : NULL;
    free(js);
    free(bpe);
    return t;
}

/* ---------------------------------------------------------------- saving */

/* Appends s as a JSON string the way Python's json.dumps writes it (ASCII only, \uXXXX). */
static bool json_string(cgi_buf *b, const char *s, size_t len) {
    bool ok = cgi_buf_add(b, "\"", 1);
    for (size_t i = 0; ok && i < len;) {
        unsigned char c = (unsigned char)s[i];
        char e[16];
        int k;
        if (c >= 0x80) {
            uint32_t cp;
            i += (size_t)cgi_utf8_next((const unsigned char *)s + i, &cp);
            if (cp >= 0x10000)
                k = snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                             0xDC00 + ((cp - 0x10000) & 0x3FF));
            else k = snprintf(e, sizeof e, "\\u%04x", cp);
            ok = cgi_buf_add(b, e, (size_t)k);
            continue;
        }
        i++;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc) ok = cgi_buf_add(b, esc, 2);
        else if (c < 0x20) {
            k = snprintf(e, sizeof e, "\\u%04x", c);
            ok = cgi_buf_add(b, e, (size_t)k);
        } else ok = cgi_buf_add(b, &c, 1);
    }
    return ok && cgi_buf_add(b, "\"", 1);
}

cg_status cgi_bpe_save(const cg_tokenizer *t, const char *dir, const char *vocab_name, const char *merges_name) {
    size_t dl = strlen(dir);
    char *path = malloc(dl + 16);
    cgi_buf b = {0};
    if (!path) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] save: out of memory");
    bool ok = cgi_buf_add(&b, "{", 1);
    for (int32_t i = 0; ok && i < t->n; i++) {
        char num[24];
        int k = snprintf(num, sizeof num, ": %d", (int)i);
        ok = (i == 0 || cgi_buf_add(&b, ", ", 2)) && json_string(&b, cgi_tok_str(t, i), (size_t)t->len[i]) &&
             cgi_buf_add(&b, num, (size_t)k);
    }
    ok = ok && cgi_buf_add(&b, "}", 1);
    cg_status st = ok ? CG_OK : CG_ERR_NOMEM;
    if (st == CG_OK) {
        snprintf(path, dl + 16, "%s/%s", dir, vocab_name);
        st = cgi_write_file(path, b.s, b.n);
    }
    b.n = 0;
    ok = st == CG_OK && cgi_buf_add(&b, "#version: 0.2\n", 14);
    for (int32_t r = 0; ok && r < t->nmerges; r++) {
        int32_t x = t->merge[2 * r], y = t->merge[2 * r + 1];
        ok = cgi_buf_add(&b, cgi_tok_str(t, x), (size_t)t->len[x]) && cgi_buf_add(&b, " ", 1) &&
             cgi_buf_add(&b, cgi_tok_str(t, y), (size_t)t->len[y]) && cgi_buf_add(&b, "\n", 1);
    }
    if (st == CG_OK && !ok) st = CG_ERR_NOMEM;
    if (st == CG_OK) {
        snprintf(path, dl + 16, "%s/%s", dir, merges_name);
        st = cgi_write_file(path, b.s, b.n);
    }
    free(b.s);
    free(path);
    return st;
}

/* ---------------------------------------------------------------- training */

/* Training keeps, for every adjacent pair of tokens in the distinct pre-tokenized words, its
 * count (weighted by word frequency) and the words it occurs in. Each step takes the most
 * frequent pair from a max-heap (entries go stale when a count changes and are skipped), merges
 * it in those words only, and updates the counts of the pairs around each merge. */
typedef struct {
    int32_t a, b;
    int64_t count, pushed; /* current count; count of its newest heap entry */
    int32_t *w;            /* words it may occur in (a superset: words are not removed) */
    int32_t nw, capw, last_w;
} pair_t;

typedef struct {
    int64_t count;
    int32_t p;
} heap_t;

typedef struct {
    pair_t *p;
    int32_t np, capp;
    cgi_pairmap idx; /* (a, b) -> index into p */
    heap_t *h;
    size_t nh, caph;
    int32_t *dirty;  /* pairs whose count changed during this merge */
    int32_t ndirty, capdirty;
    uint8_t *is_dirty;
} trainer_t;

/* True when heap entry x should pop before y: higher count, then lower ids. */
static bool heap_before(const trainer_t *tr, heap_t x, heap_t y) {
    if (x.count != y.count) return x.count > y.count;
    const pair_t *px = &tr->p[x.p], *py = &tr->p[y.p];
    return px->a != py->a ? px->a < py->a : px->b < py->b;
}

static bool heap_push(trainer_t *tr, int32_t p) {
    if (tr->nh == tr->caph) {
        size_t cap = tr->caph ? 2 * tr->caph : 4096;
        heap_t *h = realloc(tr->h, cap * sizeof *h);
        if (!h) return false;
        tr->h = h;
        tr->caph = cap;
    }
    heap_t x = {tr->p[p].count, p};
    size_t i = tr->nh++;
    while (i > 0 && heap_before(tr, x, tr->h[(i - 1) / 2])) {
        tr->h[i] = tr->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    tr->h[i] = x;
    tr->p[p].pushed = x.count;
    return true;
}

static heap_t heap_pop(trainer_t *tr) {
    heap_t top = tr->h[0], x = tr->h[--tr->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= tr->nh) break;
        if (c + 1 < tr->nh && heap_before(tr, tr->h[c + 1], tr->h[c])) c++;
        if (!heap_before(tr, tr->h[c], x)) break;
        tr->h[i] = tr->h[c];
        i = c;
    }
    if (tr->nh) tr->h[i] = x;
    return top;
}

/* Adds delta to pair (a, b) seen in word w, creating it; -1 when out of memory. */
static int32_t pair_add(trainer_t *tr, int32_t a, int32_t b, int64_t delta, int32_t w) {
    int64_t *v = cgi_pairmap_get(&tr->idx, a, b);
    int32_t p;
    if (v) p = (int32_t)*v;
    else {
        if (tr->np == tr->capp) {
            int32_t cap = tr->capp ? 2 * tr->capp : 4096;
            pair_t *np = realloc(tr->p, (size_t)cap * sizeof *np);
            uint8_t *nd = realloc(tr->is_dirty, (size_t)cap);
            if (np) tr->p = np;
            if (nd) tr->is_dirty = nd;
            if (!np || !nd) return -1;
            tr->capp = cap;
        }
        p = tr->np++;
        tr->p[p] = (pair_t){.a = a, .b = b, .last_w = -1};
        tr->is_dirty[p] = 0;
        if (!cgi_pairmap_put(&tr->idx, a, b, p)) return -1;
    }
    pair_t *q = &tr->p[p];
    q->count += delta;
    if (delta > 0 && q->last_w != w) {
        if (q->nw == q->capw) {
            int32_t cap = q->capw ? 2 * q->capw : 4;
            int32_t *nw = realloc(q->w, (size_t)cap * sizeof *nw);
            if (!nw) return -1;
            q->w = nw;
            q->capw = cap;
        }
        q->w[q->nw++] = w;
        q->last_w = w;
    }
    if (!tr->is_dirty[p]) {
        if (tr->ndirty == tr->capdirty) {
            int32_t cap = tr->capdirty ? 2 * tr->capdirty : 1024;
            int32_t *d = realloc(tr->dirty, (size_t)cap * sizeof *d);
            if (!d) return -1;
            tr->dirty = d;
            tr->capdirty = cap;
        }
        tr->dirty[tr->ndirty++] = p;
        tr->is_dirty[p] = 1;
    }
    return p;
}

/* Pushes a fresh heap entry for every pair whose count changed. */
static bool flush_dirty(trainer_t *tr) {
    for (int32_t i = 0; i < tr->ndirty; i++) {
        int32_t p = tr->dirty[i];
        tr->is_dirty[p] = 0;
        if (tr->p[p].count > 0 && tr->p[p].count != tr->p[p].pushed && !heap_push(tr, p)) return false;
    }
    tr->ndirty = 0;
    return true;
}

static void trainer_free(trainer_t *tr) {
    for (int32_t i = 0; i < tr->np; i++) free(tr->p[i].w);
    free(tr->p);
    free(tr->h);
    free(tr->dirty);
    free(tr->is_dirty);
    cgi_pairmap_free(&tr->idx);
}

/* Distinct pieces of the text: byte ranges into it and how often each occurs. */
typedef struct {
    size_t *off;
    int32_t *len;
    int64_t *count;
    int32_t n, cap;
    int32_t *slot;
    size_t mask;
} words_t;

static bool words_add(words_t *ws, const char *text, size_t off, size_t len) {
    size_t s = cgi_hash_bytes(text + off, len) & ws->mask;
    for (; ws->slot[s] >= 0; s = (s + 1) & ws->mask) {
        int32_t j = ws->slot[s];
        if ((size_t)ws->len[j] == len && memcmp(text + ws->off[j], text + off, len) == 0) {
            ws->count[j]++;
            return true;
        }
    }
    if (ws->n == ws->cap) {
        int32_t cap = ws->cap ? 2 * ws->cap : 4096;
        size_t *o = realloc(ws->off, (size_t)cap * sizeof *o);
        if (o) ws->off = o;
        int32_t *l = realloc(ws->len, (size_t)cap * sizeof *l);
        if (l) ws->len = l;
        int64_t *c = realloc(ws->count, (size_t)cap * sizeof *c);
        if (c) ws->count = c;
        if (!o || !l || !c) return false;
        ws->cap = cap;
    }
    ws->off[ws->n] = off;
    ws->len[ws->n] = (int32_t)len;
    ws->count[ws->n] = 1;
    ws->slot[s] = ws->n++;
    if (2 * (size_t)ws->n > ws->mask) { /* rehash at half load */
        size_t cap = 2 * (ws->mask + 1);
        int32_t *slot = malloc(cap * sizeof *slot);
        if (!slot) return false;
        memset(slot, 0xff, cap * sizeof *slot);
        for (int32_t j = 0; j < ws->n; j++) {
            size_t q = cgi_hash_bytes(text + ws->off[j], (size_t)ws->len[j]) & (cap - 1);
            while (slot[q] >= 0) q = (q + 1) & (cap - 1);
            slot[q] = j;
        }
        free(ws->slot);
        ws->slot = slot;
        ws->mask = cap - 1;
    }
    return true;
}

cg_tokenizer *cg_tokenizer_bpe_train(const char *text, size_t len, int32_t vocab_size) {
    if (!text && len) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] bpe_train: NULL text");
        return NULL;
    }
    if (vocab_size < 257) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] bpe_train: vocab_size %d < 257 (256 bytes + <|endoftext|>)",
                 (int)vocab_size);
        return NULL;
    }
    size_t bad = cgi_utf8_check(text, len);
    if (bad < len) {
        cgi_utf8_fail("bpe_train", text, len, bad);
        return NULL;
    }
    cg_tokenizer *t = cgi_tok_new(CG_TOK_BPE);
    uint32_t *cp = NULL;
    uint8_t *cl = NULL;
    size_t *pos = NULL, ncp = 0;
    words_t ws = {0};
    trainer_t tr = {0};
    int32_t *sym = NULL, *start = NULL, *wlen = NULL, *seen = NULL;
    cgi_buf cat = {0};
    if (!t || !decode_text(text ? text : "", len, &cp, &cl, &pos, &ncp)) goto fail;

    ws.mask = 4095;
    ws.slot = malloc((ws.mask + 1) * sizeof *ws.slot);
    if (!ws.slot) goto nomem;
    memset(ws.slot, 0xff, (ws.mask + 1) * sizeof *ws.slot);
    for (size_t i = 0; i < ncp;) {
        size_t e = piece_end(cp, cl, ncp, i);
        if (!words_add(&ws, text, pos[i], pos[e] - pos[i])) goto nomem;
        i = e;
    }

    /* Ids 0-255: the bytes in GPT-2's order, so a trained vocabulary starts like GPT-2's. */
    uint32_t cp_of[256];
    int32_t byte_id[256];
    byte_codepoints(cp_of);
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            if (printable_byte(b) != (pass == 0)) continue;
            char u[4];
            byte_id[b] = t->n;
            if (!cgi_tok_push(t, u, (size_t)cgi_utf8_put(cp_of[b], u))) goto fail;
        }
    /* The index is sized for the whole vocabulary up front; merged tokens are added to it. */
    int32_t want = vocab_size - 1;
    if (!cgi_tok_reserve(t, (size_t)want)) goto fail;
    for (int32_t i = 0; i < t->n; i++) cgi_tokmap_put(t, i);

    size_t total = 0;
    for (int32_t w = 0; w < ws.n; w++) total += (size_t)ws.len[w];
    sym = malloc((total + 1) * sizeof *sym);
    start = malloc(((size_t)ws.n + 1) * sizeof *start);
    wlen = malloc(((size_t)ws.n + 1) * sizeof *wlen);
    seen = malloc(((size_t)ws.n + 1) * sizeof *seen);
    if (!sym || !start || !wlen || !seen || !cgi_pairmap_init(&tr.idx, total / 4 + 16)) goto nomem;
    size_t at = 0;
    for (int32_t w = 0; w < ws.n; w++) {
        start[w] = (int32_t)at;
        wlen[w] = ws.len[w];
        seen[w] = -1;
        for (int32_t i = 0; i < ws.len[w]; i++) sym[at + (size_t)i] = byte_id[(unsigned char)text[ws.off[w] + (size_t)i]];
        for (int32_t i = 0; i + 1 < ws.len[w]; i++)
            if (pair_add(&tr, sym[at + (size_t)i], sym[at + (size_t)i + 1], ws.count[w], w) < 0) goto nomem;
        at += (size_t)ws.len[w];
    }
    if (!flush_dirty(&tr)) goto nomem;

    for (int32_t step = 0; t->n < want && tr.nh > 0; step++) {
        heap_t top = heap_pop(&tr);
        pair_t *q = &tr.p[top.p];
        if (top.count != q->count || q->count <= 0) continue; /* stale entry */
        int32_t a = q->a, b = q->b;
        cat.n = 0;
        if (!cgi_buf_add(&cat, cgi_tok_str(t, a), (size_t)t->len[a]) ||
            !cgi_buf_add(&cat, cgi_tok_str(t, b), (size_t)t->len[b]))
            goto fail;
        int32_t c = cgi_tokmap_get(t, cat.s, cat.n); /* two merges can spell the same token */
        if (c < 0) {
            c = t->n;
            if (!cgi_tok_push(t, cat.s, cat.n)) goto fail;
            cgi_tokmap_put(t, c);
        }
        if (t->nmerges == t->merge_cap) {
            int32_t cap = t->merge_cap ? 2 * t->merge_cap : 1024;
            int32_t *m = realloc(t->merge, 2 * (size_t)cap * sizeof *m);
            if (!m) goto nomem;
            t->merge = m;
            t->merge_cap = cap;
        }
        t->merge[2 * t->nmerges] = a;
        t->merge[2 * t->nmerges + 1] = b;
        t->nmerges++;
        int32_t p = top.p;
        for (int32_t k = 0; k < tr.p[p].nw; k++) { /* tr.p may move as pairs are added */
            int32_t w = tr.p[p].w[k];
            if (seen[w] == step) continue;
            seen[w] = step;
            int32_t *s = sym + start[w], L = wlen[w];
            bool has = false;
            for (int32_t i = 0; i + 1 < L && !has; i++) has = s[i] == a && s[i + 1] == b;
            if (!has) continue;
            int64_t f = ws.count[w];
            for (int32_t i = 0; i + 1 < L; i++)
                if (pair_add(&tr, s[i], s[i + 1], -f, w) < 0) goto nomem;
            int32_t o = 0;
            for (int32_t i = 0; i < L;) {
                if (i + 1 < L && s[i] == a && s[i + 1] == b) {
                    s[o++] = c;
                    i += 2;
                } else {
                    s[o++] = s[i++];
                }
            }
            wlen[w] = L = o;
            for (int32_t i = 0; i + 1 < L; i++)
                if (pair_add(&tr, s[i], s[i + 1], f, w) < 0) goto nomem;
        }
        if (!flush_dirty(&tr)) goto nomem;
    }
    if (!cgi_tok_push(t, "<|endoftext|>", 13) || !cgi_tok_index(t) || cgi_bpe_finish(t, "bpe_train") != CG_OK)
        goto fail;
    free(cp), free(cl), free(pos), free(sym), free(start), free(wlen), free(seen), free(cat.s);
    free(ws.off), free(ws.len), free(ws.count), free(ws.slot);
    trainer_free(&tr);
    return t;
nomem:
    cgi_fail(CG_ERR_NOMEM, "[tokenizer] bpe_train: out of memory");
fail:
    free(cp), free(cl), free(pos), free(sym), free(start), free(wlen), free(seen), free(cat.s);
    free(ws.off), free(ws.len), free(ws.count), free(ws.slot);
    trainer_free(&tr);
    cg_tokenizer_free(t);
    return NULL;
}
